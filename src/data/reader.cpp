// Reading a checked dataset file: all of it (load_dataset, probe_dataset), given rows in any
// order (load_rows), or one rank's evaluation rows (load_eval_shard); labels and features are
// checked as they are read.
#include "internal.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "dpt/check.hpp"
#include "jpeg_codec.hpp"

namespace dpt {
using namespace data_internal;
namespace {

// Labels read as int64 (no clamping by HDF5's conversion), checked against num_classes; the
// first bad one is reported as file row file_row(i).
template <class Row>
std::vector<int32_t> checked_labels(const std::string& path, const std::vector<int64_t>& raw,
                                    int num_classes, Row file_row) {
  std::vector<int32_t> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] < 0 || raw[i] >= num_classes)
      label_out_of_range("dataset file '" + path + "': /labels", "row " + std::to_string(file_row(i)), raw[i],
                         num_classes);
    out[i] = int32_t(raw[i]);
  }
  return out;
}

// A NaN or Inf feature would poison training many steps later; name its file row now.
template <class Row>
void check_finite_features(const std::string& path, const std::vector<float>& f32, int64_t dim,
                           Row file_row) {
  for (size_t i = 0; i < f32.size(); ++i)
    if (!std::isfinite(f32[i]))
      non_finite_feature("dataset file '" + path + "': /features", "row " + std::to_string(file_row(i / size_t(dim))));
}

int64_t same_row(size_t i) { return int64_t(i); }

// ---- jpeg files: /jpeg's byte ranges read through HDF5, rows decoded on several threads ----

// /jpeg bytes [a, b) into dst.
void read_jpeg_bytes(const std::string& path, const Opened& o, hid_t fspace, uint64_t a, uint64_t b, uint8_t* dst) {
  if (b <= a) return;
  const hsize_t start = a, count = b - a;
  Hid mem(H5Screate_simple(1, &count, nullptr), H5Sclose);
  if (!mem.ok() || H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &count, nullptr) < 0)
    bad(path, "/jpeg: cannot select bytes: " + hdf5_error_string());
  if (H5Dread(o.jpeg.get(), H5T_NATIVE_UINT8, mem.get(), fspace, H5P_DEFAULT, dst) < 0)
    bad(path, "/jpeg: cannot read data (corrupt or truncated?): " + hdf5_error_string());
}

// Rows i of `bytes` (bytes[start[i], start[i + 1])) decoded into out; the first that does not
// decode is reported as file row file_row(i).
template <class Row>
void decode_rows(const std::string& path, const Opened& o, const uint8_t* bytes, const std::vector<uint64_t>& start,
                 uint8_t* out, Row file_row) {
  const std::vector<int64_t>& sh = o.info.sample_shape;
  std::string why;
  const int64_t i = image::decode_jpeg_rows(bytes, start, int(sh[0]), int(sh[1]), int(sh[2]), out, why);
  if (i >= 0) bad(path, "/jpeg row " + std::to_string(file_row(size_t(i))) + ": " + why);
}

void read_jpeg_all(const std::string& path, const Opened& o, Dataset& ds) {
  const std::vector<int64_t>& off = o.jpeg_offsets;
  std::vector<uint8_t> bytes(size_t(off.back()));
  Hid fspace(H5Dget_space(o.jpeg.get()), H5Sclose);
  if (!fspace.ok()) bad(path, "/jpeg: unreadable dataspace: " + hdf5_error_string());
  read_jpeg_bytes(path, o, fspace.get(), 0, uint64_t(off.back()), bytes.data());
  std::vector<uint64_t> start(off.begin(), off.end());
  ds.u8.resize(size_t(o.info.n) * size_t(o.info.dim));
  decode_rows(path, o, bytes.data(), start, ds.u8.data(), same_row);
}

void read_features(const std::string& path, const Opened& o, Dataset& ds) {
  if (o.info.encoding == "jpeg") return read_jpeg_all(path, o, ds);
  const size_t count = size_t(o.info.n) * size_t(o.info.dim);
  herr_t rc;
  if (ds.is_u8) {
    ds.u8.resize(count);
    rc = H5Dread(o.features.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, ds.u8.data());
  } else {
    ds.f32.resize(count);
    rc = H5Dread(o.features.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, ds.f32.data());
  }
  if (rc < 0) bad(path, "/features: cannot read data (corrupt or truncated?): " + hdf5_error_string());
  check_finite_features(path, ds.f32, o.info.dim, same_row);
}

}  // namespace

std::vector<int32_t> data_internal::read_labels(const std::string& path, const Opened& o) {
  std::vector<int64_t> raw(size_t(o.info.n));
  if (H5Dread(o.labels.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()) < 0)
    bad(path, "/labels: cannot read data (corrupt or truncated?): " + hdf5_error_string());
  return checked_labels(path, raw, o.info.num_classes, same_row);
}

void data_internal::reuse_arrays(Dataset& d, const std::string& path, const DatasetInfo& info) {
  Dataset shape = empty_like(path, info);
  shape.u8.swap(d.u8);
  shape.f32.swap(d.f32);
  shape.labels.swap(d.labels);
  d = std::move(shape);
}

DatasetInfo probe_dataset(const std::string& path) {
  Opened o = open_checked(path);
  read_labels(path, o);  // small next to the features, and the range check belongs to validation
  return o.info;
}

namespace data_internal {

Dataset empty_like(const std::string& path, const DatasetInfo& info) {
  Dataset ds;
  ds.path = path;
  ds.dim = info.dim;
  ds.sample_shape = info.sample_shape;
  ds.num_classes = info.num_classes;
  ds.class_names = info.class_names;
  ds.is_u8 = info.feature_type == "uint8";
  ds.scale = info.scale;
  ds.offset = info.offset;
  ds.file_rows = info.n;
  return ds;
}

}  // namespace data_internal

namespace {

// read_sorted_rows for a jpeg file: labels as for /features (up to 128 runs per read), the
// JPEG bytes one read per run of consecutive rows, then every row decoded.
void read_sorted_jpeg(const std::string& path, const Opened& o, const std::vector<int64_t>& sorted, Dataset& ds) {
  const std::vector<int64_t>& off = o.jpeg_offsets;
  std::vector<uint64_t> start(sorted.size() + 1, 0);
  for (size_t i = 0; i < sorted.size(); ++i)
    start[i + 1] = start[i] + uint64_t(off[size_t(sorted[i]) + 1] - off[size_t(sorted[i])]);
  if (start.back() > memory_cap())
    bad(path, "/jpeg: " + std::to_string(sorted.size()) + " rows of " + std::to_string(start.back()) +
                  " JPEG bytes exceed the memory limit of " + std::to_string(memory_cap() >> 20) + " MiB");
  Hid fspace(H5Dget_space(o.jpeg.get()), H5Sclose), lspace(H5Dget_space(o.labels.get()), H5Sclose);
  if (!fspace.ok() || !lspace.ok()) bad(path, "unreadable dataspace: " + hdf5_error_string());
  std::vector<int64_t> raw(sorted.size());
  std::vector<uint8_t> bytes(size_t(start.back()));
  for (size_t first = 0; first < sorted.size();) {
    H5Sselect_none(lspace.get());
    size_t i = first;
    for (int runs = 0; runs < 128 && i < sorted.size(); ++runs) {
      size_t j = i + 1;
      while (j < sorted.size() && sorted[j] == sorted[j - 1] + 1) ++j;
      const hsize_t at = hsize_t(sorted[i]), count = hsize_t(j - i);
      if (H5Sselect_hyperslab(lspace.get(), H5S_SELECT_OR, &at, nullptr, &count, nullptr) < 0)
        bad(path, "cannot select rows: " + hdf5_error_string());
      read_jpeg_bytes(path, o, fspace.get(), uint64_t(off[size_t(sorted[i])]), uint64_t(off[size_t(sorted[j - 1]) + 1]),
                      bytes.data() + start[i]);
      i = j;
    }
    const hsize_t nl = hsize_t(i - first);
    Hid ml(H5Screate_simple(1, &nl, nullptr), H5Sclose);
    if (H5Dread(o.labels.get(), H5T_NATIVE_INT64, ml.get(), lspace.get(), H5P_DEFAULT, &raw[first]) < 0)
      bad(path, "/labels: cannot read data (corrupt or truncated?): " + hdf5_error_string());
    first = i;
  }
  const auto file_row = [&](size_t i) { return sorted[i]; };
  ds.labels = checked_labels(path, raw, o.info.num_classes, file_row);
  decode_rows(path, o, bytes.data(), start, ds.u8.data(), file_row);
}

// Reads the distinct, increasing file rows `sorted` into ds (ds.n rows, row i = sorted[i]):
// one HDF5 read per dataset whose file selection is the union of the runs of consecutive rows,
// so only those rows are requested from the file. Labels and features are checked as in
// load_dataset.
void read_sorted_rows(const std::string& path, const Opened& o, const std::vector<int64_t>& sorted,
                      Dataset& ds) {
  const int64_t dim = o.info.dim;
  uint64_t bytes = 0;
  if (!mul_ok(uint64_t(sorted.size()), uint64_t(dim), bytes) ||
      !mul_ok(bytes, ds.is_u8 ? 1 : 4, bytes) || bytes > memory_cap())
    bad(path, std::string(o.info.encoding == "jpeg" ? "/jpeg" : "/features") + ": " + std::to_string(sorted.size()) +
                  " rows of " + std::to_string(dim) + " values exceed the memory limit of " + std::to_string(memory_cap() >> 20) + " MiB");
  ds.n = int64_t(sorted.size());
  if (o.info.encoding == "jpeg") {
    ds.u8.resize(sorted.size() * size_t(dim));
    return read_sorted_jpeg(path, o, sorted, ds);
  }
  const size_t rank = o.info.sample_shape.size() + 1;
  Hid fspace(H5Dget_space(o.features.get()), H5Sclose), lspace(H5Dget_space(o.labels.get()), H5Sclose);
  if (!fspace.ok() || !lspace.ok()) bad(path, "unreadable dataspace: " + hdf5_error_string());
  std::vector<int64_t> raw(sorted.size());
  if (ds.is_u8) ds.u8.resize(sorted.size() * size_t(dim));
  else ds.f32.resize(sorted.size() * size_t(dim));
  std::vector<hsize_t> start(rank, 0), count(rank);
  for (size_t i = 1; i < rank; ++i) count[i] = hsize_t(o.info.sample_shape[i - 1]);
  // HDF5 1.10 merges each added block into the selection at a cost that grows with the
  // selection, so a shard is read in groups of at most kRuns runs (30,000 scattered rows: 5 s
  // as one selection, 0.02 s in groups of 128). A chunked /features (dpdata images: a chunk per
  // image) is read a run at a time: HDF5 maps a selection onto chunks by walking every chunk in
  // its bounding box, so a group of scattered rows would visit most of the file's chunks (a
  // streamed micro-batch of 256 rows of 50,000 images: seconds; one read per run: milliseconds).
  Hid dcpl(H5Dget_create_plist(o.features.get()), H5Pclose);
  const bool chunked = dcpl.ok() && H5Pget_layout(dcpl.get()) == H5D_CHUNKED;
  const int kRuns = chunked ? 1 : 128;
  for (size_t first = 0; first < sorted.size();) {
    H5Sselect_none(fspace.get());
    H5Sselect_none(lspace.get());
    size_t i = first;
    for (int runs = 0; runs < kRuns && i < sorted.size(); ++runs) {
      size_t j = i + 1;
      while (j < sorted.size() && sorted[j] == sorted[j - 1] + 1) ++j;
      start[0] = hsize_t(sorted[i]);
      count[0] = hsize_t(j - i);
      if (H5Sselect_hyperslab(fspace.get(), H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr) < 0 ||
          H5Sselect_hyperslab(lspace.get(), H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr) < 0)
        bad(path, "cannot select rows: " + hdf5_error_string());
      i = j;
    }
    const hsize_t nl = hsize_t(i - first), nf = nl * hsize_t(dim);
    // A chunked read's memory space has the run's own shape: with any other shape HDF5 maps the
    // selection onto chunks element by element (400 us a 12 KiB row against 12 us).
    std::vector<hsize_t> mdims(count);
    mdims[0] = nl;
    Hid mf(chunked ? H5Screate_simple(int(rank), mdims.data(), nullptr) : H5Screate_simple(1, &nf, nullptr), H5Sclose),
        ml(H5Screate_simple(1, &nl, nullptr), H5Sclose);
    if (H5Dread(o.labels.get(), H5T_NATIVE_INT64, ml.get(), lspace.get(), H5P_DEFAULT, &raw[first]) < 0)
      bad(path, "/labels: cannot read data (corrupt or truncated?): " + hdf5_error_string());
    const size_t at = first * size_t(dim);
    const herr_t rc = ds.is_u8
        ? H5Dread(o.features.get(), H5T_NATIVE_UINT8, mf.get(), fspace.get(), H5P_DEFAULT, &ds.u8[at])
        : H5Dread(o.features.get(), H5T_NATIVE_FLOAT, mf.get(), fspace.get(), H5P_DEFAULT, &ds.f32[at]);
    if (rc < 0) bad(path, "/features: cannot read data (corrupt or truncated?): " + hdf5_error_string());
    first = i;
  }
  const auto file_row = [&](size_t i) { return sorted[i]; };
  ds.labels = checked_labels(path, raw, o.info.num_classes, file_row);
  check_finite_features(path, ds.f32, dim, file_row);
}

}  // namespace

Dataset load_rows(const std::string& path, const std::vector<int64_t>& rows) {
  Opened o = open_checked(path, /*whole=*/false);
  return read_rows(path, o, rows);
}

Dataset data_internal::read_rows(const std::string& path, const Opened& o, const std::vector<int64_t>& rows) {
  for (int64_t r : rows)
    if (r < 0 || r >= o.info.n)
      throw Error("load_rows: row " + std::to_string(r) + " outside [0, " + std::to_string(o.info.n) +
                  ") of " + path);
  std::vector<int64_t> sorted(rows);
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  Dataset in_file = empty_like(path, o.info);
  read_sorted_rows(path, o, sorted, in_file);
  if (sorted == rows) return in_file;  // already in file order
  // Row i of the result is file row rows[i]: move each from its place in file order.
  Dataset ds = empty_like(path, o.info);
  ds.n = int64_t(rows.size());
  const size_t dim = size_t(o.info.dim);
  ds.labels.resize(rows.size());
  if (ds.is_u8) ds.u8.resize(rows.size() * dim);
  else ds.f32.resize(rows.size() * dim);
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t k = size_t(std::lower_bound(sorted.begin(), sorted.end(), rows[i]) - sorted.begin());
    ds.labels[i] = in_file.labels[k];
    if (ds.is_u8) std::memcpy(&ds.u8[i * dim], &in_file.u8[k * dim], dim);
    else std::memcpy(&ds.f32[i * dim], &in_file.f32[k * dim], dim * sizeof(float));
  }
  return ds;
}

Dataset load_eval_shard(const std::string& path, int rank, int world) {
  Opened o = open_checked(path, /*whole=*/false);
  int64_t begin = 0, end = 0;
  eval_shard(o.info.n, rank, world, begin, end);
  std::vector<int64_t> rows(size_t(end - begin));
  std::iota(rows.begin(), rows.end(), begin);
  Dataset ds = empty_like(path, o.info);
  read_sorted_rows(path, o, rows, ds);
  ds.first_row = begin;
  return ds;
}

Dataset load_dataset(const std::string& path) {
  Opened o = open_checked(path);
  Dataset ds = empty_like(path, o.info);
  ds.n = o.info.n;
  ds.labels = read_labels(path, o);
  read_features(path, o, ds);
  return ds;
}

}  // namespace dpt
