// Datasets: validated HDF5 reading, atomic writing, generators, idx import, data order, gather.
// Every way a file can break the layout of DESIGN.md ends in InputError naming the file, the
// dataset or attribute and the problem; sizes are checked against the file's storage and the
// machine's memory before anything large is allocated.
#include "dpt/data.hpp"
#include "dpt/h5.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <utility>

#include "dpt/check.hpp"

namespace dpt {
namespace {

// ---------------------------------------------------------------- HDF5 handles and errors

using Hid = H5Id;

// Users see our messages, not HDF5's stack dumps; the stack is still walked for the detail.
void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw InputError("dataset file '" + path + "': " + what);
}

// a × b in uint64; false when it overflows (hostile dimensions are chosen to wrap).
bool mul_ok(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

// The most bytes a dataset may ask for: 64 GiB or 3/4 of physical memory, whichever is less,
// so a hostile header cannot make us allocate ourselves into the OOM killer.
uint64_t memory_cap() {
  uint64_t cap = uint64_t(64) << 30;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) cap = std::min(cap, uint64_t(pages) * uint64_t(page) / 4 * 3);
  return cap;
}

std::string type_name(hid_t t) {
  const H5T_class_t c = H5Tget_class(t);
  const size_t bits = H5Tget_size(t) * 8;
  switch (c) {
    case H5T_INTEGER:
      return (H5Tget_sign(t) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    case H5T_FLOAT: {
      const bool ieee = H5Tequal(t, H5T_IEEE_F32LE) > 0 || H5Tequal(t, H5T_IEEE_F32BE) > 0 ||
                        H5Tequal(t, H5T_IEEE_F64LE) > 0 || H5Tequal(t, H5T_IEEE_F64BE) > 0;
      return "float" + std::to_string(bits) + (ieee ? "" : " (non-IEEE layout)");
    }
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    default: return "HDF5 type class " + std::to_string(int(c));
  }
}

bool is_u8(hid_t t) {
  return H5Tget_class(t) == H5T_INTEGER && H5Tget_size(t) == 1 && H5Tget_sign(t) == H5T_SGN_NONE;
}
bool is_f32(hid_t t) {
  return H5Tget_class(t) == H5T_FLOAT && H5Tget_size(t) == 4 &&
         (H5Tequal(t, H5T_IEEE_F32LE) > 0 || H5Tequal(t, H5T_IEEE_F32BE) > 0);
}
// int8 to int64 and uint8 to uint32 (numpy and torchvision often write uint8 or int16): each
// converts to int64 exactly on reading, and the range check against num_classes follows. uint64
// does not (HDF5 would clamp values above INT64_MAX), and no class index needs it.
bool is_label_int(hid_t t) {
  const size_t s = H5Tget_size(t);
  const bool sign = H5Tget_sign(t) == H5T_SGN_2;
  return H5Tget_class(t) == H5T_INTEGER && (s == 1 || s == 2 || s == 4 || (s == 8 && sign));
}

// ---------------------------------------------------------------- reading

// An open, checked file: handles stay open so the loader can read what the probe checked.
struct Opened {
  Hid file, features, labels;
  DatasetInfo info;
};

// sparse: the caller reads scattered rows (data.read = shard). HDF5 reads a contiguous dataset
// through a 64 KiB sieve buffer by default, which pulls in the rows around each one asked for
// (2 ranks of Fashion-MNIST: each read the whole file); without it only the rows asked for are read.
Hid open_file(const std::string& path, bool sparse = false) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) bad(path, std::string("cannot open: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) bad(path, "not a regular file");
  quiet_hdf5();
  if (H5Fis_hdf5(path.c_str()) <= 0) bad(path, "not an HDF5 file");
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!fapl.ok() || (sparse && H5Pset_sieve_buf_size(fapl.get(), 0) < 0))
    bad(path, "cannot set up file access: " + hdf5_error_string());
  Hid f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (!f.ok()) bad(path, "cannot open as HDF5 (truncated or corrupt?): " + hdf5_error_string());
  return f;
}

Hid open_dataset(const std::string& path, hid_t file, const char* name) {
  const std::string n = std::string("/") + name;
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0) bad(path, n + ": missing (required dataset)");
  Hid d(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
  if (!d.ok()) bad(path, n + ": not a readable dataset: " + hdf5_error_string());
  return d;
}

std::vector<hsize_t> dims_of(const std::string& path, hid_t dset, const std::string& name) {
  Hid space(H5Dget_space(dset), H5Sclose);
  if (!space.ok() || H5Sget_simple_extent_type(space.get()) != H5S_SIMPLE)
    bad(path, name + ": has no simple dataspace (scalar or null)");
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) bad(path, name + ": unreadable dataspace");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0 && H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0)
    bad(path, name + ": unreadable dataspace");
  return dims;
}

std::string shape_str(const std::vector<hsize_t>& d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + ")";
}

// Chunk shapes come from the file, and HDF5 1.10 sizes its buffers from them while trusting
// what the filter returns: a chunk larger than the dataset (a flipped bit) or a chunk that
// inflates to fewer bytes than the chunk holds makes H5Dread read past a heap buffer.
uint64_t check_chunk_shape(const std::string& path, hid_t dset, hid_t dcpl,
                           const std::string& name, const std::vector<hsize_t>& dims, size_t elem) {
  const int rank = int(dims.size());
  std::vector<hsize_t> chunk(dims.size()), maxdims(dims.size());
  Hid space(H5Dget_space(dset), H5Sclose);
  if (H5Pget_chunk(dcpl, rank, chunk.data()) != rank || !space.ok() ||
      H5Sget_simple_extent_dims(space.get(), nullptr, maxdims.data()) != rank)
    bad(path, name + ": chunk rank differs from the dataset rank (corrupt file)");
  uint64_t bytes = elem, grid = 1;
  for (int i = 0; i < rank; ++i) {
    if (chunk[size_t(i)] > 0) grid *= (dims[size_t(i)] + chunk[size_t(i)] - 1) / chunk[size_t(i)];
    if (grid > (uint64_t(1) << 24))
      bad(path, name + ": chunk shape " + shape_str(chunk) + " splits dataset shape " +
                    shape_str(dims) + " into more than 16M chunks");
    const bool fixed = maxdims[size_t(i)] != H5S_UNLIMITED;
    if (chunk[size_t(i)] == 0 || (fixed && chunk[size_t(i)] > std::max<hsize_t>(maxdims[size_t(i)], 1)) ||
        !mul_ok(bytes, chunk[size_t(i)], bytes) || bytes > (uint64_t(1) << 32))
      bad(path, name + ": chunk shape " + shape_str(chunk) + " does not fit dataset shape " +
                    shape_str(dims) + " (corrupt file)");
  }
  return bytes;
}

// True when the filter pipeline is deflate, optionally with shuffle (what h5py's gzip writes):
// the pipelines whose output size we can check ourselves.
bool deflate_pipeline(hid_t dcpl, unsigned* deflate_bit) {
  const int n = H5Pget_nfilters(dcpl);
  bool deflate = false;
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0;
    size_t nelmts = 0;
    const H5Z_filter_t id = H5Pget_filter2(dcpl, unsigned(i), &flags, &nelmts, nullptr, 0,
                                           nullptr, nullptr);
    if (id == H5Z_FILTER_DEFLATE) { deflate = true; *deflate_bit = 1u << i; }
    else if (id != H5Z_FILTER_SHUFFLE) return false;
  }
  return deflate;
}

// Bytes a zlib stream inflates to; -1 when it is not a complete, checksummed stream.
int64_t inflated_size(const std::vector<uint8_t>& in) {
  z_stream z{};
  if (inflateInit(&z) != Z_OK) return -1;
  z.next_in = const_cast<Bytef*>(in.data());
  z.avail_in = uInt(in.size());
  unsigned char out[1 << 16];
  int rc = Z_OK;
  while (rc == Z_OK) {
    z.next_out = out;
    z.avail_out = sizeof out;
    rc = inflate(&z, Z_NO_FLUSH);
  }
  const int64_t total = int64_t(z.total_out);
  inflateEnd(&z);
  return rc == Z_STREAM_END ? total : -1;
}

// Inflates every stored chunk once and checks it fills its chunk: the guard against the
// over-read above. Costs one extra decompression at load, which is small next to training.
void check_deflate_chunks(const std::string& path, hid_t dset, hid_t dcpl, const std::string& name,
                          const std::vector<hsize_t>& dims, uint64_t chunk_bytes) {
  unsigned deflate_bit = 0;
  if (!deflate_pipeline(dcpl, &deflate_bit)) return;  // HDF5 alone vouches for other filters
  std::vector<hsize_t> chunk(dims.size()), at(dims.size(), 0);
  H5Pget_chunk(dcpl, int(dims.size()), chunk.data());
  std::vector<uint8_t> raw;
  for (;;) {  // odometer over the chunk grid
    unsigned mask = 0;
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0;
    if (H5Dget_chunk_info_by_coord(dset, at.data(), &mask, &addr, &size) < 0)
      bad(path, name + ": unreadable chunk index at " + shape_str(at) + " (corrupt file)");
    if (addr != HADDR_UNDEF) {
      raw.resize(size_t(size));
      uint32_t filters = 0;
      if (H5Dread_chunk(dset, H5P_DEFAULT, at.data(), &filters, raw.data()) < 0)
        bad(path, name + ": unreadable chunk at " + shape_str(at) + ": " + hdf5_error_string());
      const int64_t got = (filters & deflate_bit) ? int64_t(size) : inflated_size(raw);
      if (got < 0)
        bad(path, name + ": chunk at " + shape_str(at) + " is corrupt (not a valid gzip stream)");
      if (got < int64_t(chunk_bytes))
        bad(path, name + ": chunk at " + shape_str(at) + " is corrupt (inflates to " +
                      std::to_string(got) + " of " + std::to_string(chunk_bytes) + " bytes)");
    }
    size_t i = dims.size();
    while (i > 0 && (at[i - 1] += chunk[i - 1]) >= dims[i - 1]) at[--i] = 0;
    if (i == 0) return;
  }
}

// Rejects layouts that read outside the file (external raw data, virtual datasets) and
// dimensions the stored bytes cannot back: unfiltered data must have storage for every byte;
// filtered (compressed) data gets deflate's ~1000:1 worst case with headroom.
void check_storage(const std::string& path, hid_t file, hid_t dset, const std::string& name,
                   const std::vector<hsize_t>& dims, size_t elem, uint64_t bytes) {
  Hid dcpl(H5Dget_create_plist(dset), H5Pclose);
  if (!dcpl.ok()) bad(path, name + ": unreadable creation properties");
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED && layout != H5D_COMPACT)
    bad(path, name + ": unsupported storage layout (virtual or unknown)");
  if (H5Pget_external_count(dcpl.get()) != 0)
    bad(path, name + ": stored in external files, which are not supported");
  const int nfilters = H5Pget_nfilters(dcpl.get());
  const uint64_t storage = H5Dget_storage_size(dset);
  hsize_t file_size = 0;
  if (H5Fget_filesize(file, &file_size) < 0 || storage > file_size)
    bad(path, name + ": claims " + std::to_string(storage) + " bytes of storage in a file of " +
                  std::to_string(file_size) + " (truncated or corrupt)");
  const uint64_t ratio = nfilters > 0 ? 4096 : 1;
  uint64_t backed = 0;
  if (!mul_ok(storage, ratio, backed)) backed = UINT64_MAX;
  if (backed < bytes)
    bad(path, name + ": dimensions need " + std::to_string(bytes) + " bytes but the file stores " +
                  std::to_string(storage) + (nfilters > 0 ? " compressed" : "") +
                  " (absurd dimensions or truncated data)");
  if (layout != H5D_CHUNKED) return;
  const uint64_t chunk_bytes = check_chunk_shape(path, dset, dcpl.get(), name, dims, elem);
  if (nfilters > 0) check_deflate_chunks(path, dset, dcpl.get(), name, dims, chunk_bytes);
}

double read_number_attr(const std::string& path, hid_t obj, const std::string& where,
                        const char* name, bool* present) {
  *present = H5Aexists(obj, name) > 0;
  if (!*present) return 0;
  const std::string n = where + " attribute '" + name + "'";
  Hid a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!a.ok()) bad(path, n + ": unreadable");
  Hid t(H5Aget_type(a.get()), H5Tclose);
  Hid s(H5Aget_space(a.get()), H5Sclose);
  if (!t.ok() || !s.ok()) bad(path, n + ": unreadable");
  const H5T_class_t c = H5Tget_class(t.get());
  if (c != H5T_INTEGER && c != H5T_FLOAT) bad(path, n + ": is " + type_name(t.get()) + ", not a number");
  if (H5Sget_simple_extent_npoints(s.get()) != 1) bad(path, n + ": must hold exactly one value");
  // HDF5 1.10's conversion of odd-sized or odd-precision numbers (a damaged type message) smashes
  // its own stack or reads out of bounds (found by fuzz/fuzz_dataset): only plain types reach it.
  const size_t bytes = H5Tget_size(t.get());
  const size_t bits = H5Tget_precision(t.get());
  const bool plain = c == H5T_INTEGER ? (bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8)
                                      : (bytes == 4 || bytes == 8);
  if (!plain || bits != bytes * 8 || H5Tget_offset(t.get()) != 0)
    bad(path, n + ": is a " + std::to_string(bytes) + "-byte number with " + std::to_string(bits) +
                  " significant bits; expected a plain 1-8 byte integer or 4/8-byte float");
  double v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v) < 0) bad(path, n + ": unreadable value");
  if (!std::isfinite(v)) bad(path, n + ": is not finite");
  return v;
}

int read_num_classes(const std::string& path, hid_t file) {
  bool present = false;
  Hid root(H5Oopen(file, "/", H5P_DEFAULT), H5Oclose);
  if (!root.ok()) bad(path, "unreadable root group");
  if (H5Aexists(root.get(), "num_classes") > 0) {
    Hid a(H5Aopen(root.get(), "num_classes", H5P_DEFAULT), H5Aclose);
    Hid t(a.ok() ? H5Aget_type(a.get()) : H5I_INVALID_HID, H5Tclose);
    if (t.ok() && H5Tget_class(t.get()) != H5T_INTEGER)
      bad(path, "root attribute 'num_classes': is " + type_name(t.get()) + ", not an integer");
  }
  const double v = read_number_attr(path, root.get(), "root", "num_classes", &present);
  if (!present) bad(path, "root attribute 'num_classes': missing");
  if (!(v >= 1 && v <= 1e6)) {  // NaN fails too; the value is printed as read (casting 5e58 is UB)
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    bad(path, std::string("root attribute 'num_classes': ") + buf + " is outside [1, 1000000]");
  }
  return int(v);
}

// An N x H x W x C image file (channels last, as numpy, TensorFlow and PIL lay images out) would
// load as H channels of W x C images and fail deep in a pooling layer, or worse, train on garbage.
// Refused when the last dimension is 1, 3 or 4 (grey, RGB, RGBA) and the second is not, so a real
// N x C x H x W file (C of 1, 3 or 4, or a W that is not) still loads.
void check_channels_first(const std::string& path, const std::vector<hsize_t>& d) {
  auto channels = [](hsize_t x) { return x == 1 || x == 3 || x == 4; };
  if (d.size() != 4 || !channels(d[3]) || channels(d[1])) return;
  const std::string nchw = shape_str({d[0], d[3], d[1], d[2]});
  bad(path, "/features: shape " + shape_str(d) + " looks like N x H x W x C (channels last, NHWC); dptrain "
            "expects N x C x H x W (channels first), here " + nchw + ". Transpose it, e.g. with h5py and "
            "numpy: x = f[\"features\"][...].transpose(0, 3, 1, 2), then write x as /features of a new file "
            "(with /labels, num_classes and any scale/offset attributes). Refused because the last dimension "
            "is 1, 3 or 4 and the second is not");
}

// Checks /features: type, rank >= 2, sizes, storage; fills the feature half of `info`. The
// memory limit applies to the whole dataset only when all of it is to be read (`whole`).
void check_features(const std::string& path, hid_t file, hid_t dset, DatasetInfo& info,
                    bool whole) {
  const std::string n = "/features";
  Hid t(H5Dget_type(dset), H5Tclose);
  if (!t.ok()) bad(path, n + ": unreadable type");
  if (is_u8(t.get())) info.feature_type = "uint8";
  else if (is_f32(t.get())) info.feature_type = "float32";
  else bad(path, n + ": has type " + type_name(t.get()) + "; expected uint8 or float32");
  const auto dims = dims_of(path, dset, n);
  if (dims.size() < 2)
    bad(path, n + ": has rank " + std::to_string(dims.size()) + " " + shape_str(dims) +
                  "; expected N x D or N x C x H x W (rank >= 2)");
  if (dims[0] == 0) bad(path, n + ": has no rows (N = 0)");
  check_channels_first(path, dims);
  uint64_t dim = 1, bytes = 0;
  for (size_t i = 1; i < dims.size(); ++i)
    if (!mul_ok(dim, dims[i], dim)) bad(path, n + ": dimensions " + shape_str(dims) + " overflow");
  if (dim == 0) bad(path, n + ": per-sample shape " + shape_str(dims) + " is empty");
  if (!mul_ok(dim, dims[0], bytes) || !mul_ok(bytes, H5Tget_size(t.get()), bytes) ||
      (whole && bytes > memory_cap()))
    bad(path, n + ": dimensions " + shape_str(dims) + " exceed the memory limit of " +
                  std::to_string(memory_cap() >> 20) + " MiB");
  check_storage(path, file, dset, n, dims, H5Tget_size(t.get()), bytes);
  info.n = int64_t(dims[0]);
  info.dim = int64_t(dim);
  info.sample_shape.assign(dims.begin() + 1, dims.end());
  bool present = false;
  double s = read_number_attr(path, dset, n, "scale", &present);
  info.scale = present ? float(s) : 1.f;
  double o = read_number_attr(path, dset, n, "offset", &present);
  info.offset = present ? float(o) : 0.f;
}

void check_labels(const std::string& path, hid_t file, hid_t dset, DatasetInfo& info) {
  const std::string n = "/labels";
  Hid t(H5Dget_type(dset), H5Tclose);
  if (!t.ok()) bad(path, n + ": unreadable type");
  if (!is_label_int(t.get()))
    bad(path, n + ": has type " + type_name(t.get()) + "; expected an integer type (int8 to int64, uint8 to uint32)");
  info.label_type = type_name(t.get());
  const auto dims = dims_of(path, dset, n);
  if (dims.size() != 1)
    bad(path, n + ": has rank " + std::to_string(dims.size()) + " " + shape_str(dims) +
                  "; expected rank 1 (N)");
  if (int64_t(dims[0]) != info.n)
    bad(path, n + ": has " + std::to_string(dims[0]) + " rows but /features has " +
                  std::to_string(info.n));
  check_storage(path, file, dset, n, dims, H5Tget_size(t.get()),
                uint64_t(info.n) * H5Tget_size(t.get()));
}

Opened open_checked(const std::string& path, bool whole = true) {
  Opened o;
  o.file = open_file(path, /*sparse=*/!whole);
  o.features = open_dataset(path, o.file.get(), "features");
  o.labels = open_dataset(path, o.file.get(), "labels");
  check_features(path, o.file.get(), o.features.get(), o.info, whole);
  check_labels(path, o.file.get(), o.labels.get(), o.info);
  o.info.num_classes = read_num_classes(path, o.file.get());
  return o;
}

// Labels read as int64 (no clamping by HDF5's conversion), checked against num_classes; the
// first bad one is reported as file row file_row(i).
template <class Row>
std::vector<int32_t> checked_labels(const std::string& path, const std::vector<int64_t>& raw,
                                    int num_classes, Row file_row) {
  std::vector<int32_t> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] < 0 || raw[i] >= num_classes)
      bad(path, "/labels: row " + std::to_string(file_row(i)) + " has label " + std::to_string(raw[i]) +
                    ", outside [0, num_classes = " + std::to_string(num_classes) + ")");
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
      bad(path, "/features: row " + std::to_string(file_row(i / size_t(dim))) + " holds a non-finite value");
}

int64_t same_row(size_t i) { return int64_t(i); }

std::vector<int32_t> read_labels(const std::string& path, const Opened& o) {
  std::vector<int64_t> raw(size_t(o.info.n));
  if (H5Dread(o.labels.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()) < 0)
    bad(path, "/labels: cannot read data (corrupt or truncated?): " + hdf5_error_string());
  return checked_labels(path, raw, o.info.num_classes, same_row);
}

void read_features(const std::string& path, const Opened& o, Dataset& ds) {
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

DatasetInfo probe_dataset(const std::string& path) {
  Opened o = open_checked(path);
  read_labels(path, o);  // small next to the features, and the range check belongs to validation
  return o.info;
}

namespace {

Dataset empty_like(const std::string& path, const DatasetInfo& info) {
  Dataset ds;
  ds.path = path;
  ds.dim = info.dim;
  ds.sample_shape = info.sample_shape;
  ds.num_classes = info.num_classes;
  ds.is_u8 = info.feature_type == "uint8";
  ds.scale = info.scale;
  ds.offset = info.offset;
  ds.file_rows = info.n;
  return ds;
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
    bad(path, "/features: " + std::to_string(sorted.size()) + " rows of " + std::to_string(dim) +
                  " values exceed the memory limit of " + std::to_string(memory_cap() >> 20) + " MiB");
  ds.n = int64_t(sorted.size());
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
  // as one selection, 0.02 s in groups of 128).
  constexpr int kRuns = 128;
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
    Hid mf(H5Screate_simple(1, &nf, nullptr), H5Sclose), ml(H5Screate_simple(1, &nl, nullptr), H5Sclose);
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

// ---------------------------------------------------------------- writing

namespace {

Hid created(hid_t id, Hid::Closer close, const std::string& path, const char* what) {
  if (id < 0) throw Error("writing '" + path + "': " + what + ": " + hdf5_error_string());
  return Hid(id, close);
}

void write_scalar_attr(const std::string& path, hid_t obj, const char* name, hid_t file_type,
                       hid_t mem_type, const void* value) {
  Hid space = created(H5Screate(H5S_SCALAR), H5Sclose, path, name);
  Hid a = created(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                  H5Aclose, path, name);
  if (H5Awrite(a.get(), mem_type, value) < 0)
    throw Error("writing '" + path + "': attribute " + name + ": " + hdf5_error_string());
}

// Features are written contiguous and uncompressed: every rank reads the whole file at start-up,
// and a plain read is many times faster than inflating (Fashion-MNIST: 47 MB read in tens of
// milliseconds, against about half a second per rank to inflate it). Files written by h5py with
// gzip still load.
Hid features_dcpl(const std::string& path, const Dataset&, const std::vector<hsize_t>&) {
  return created(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, path, "properties");
}

void check_writable(const std::string& path, const Dataset& ds) {
  int64_t shape_dim = 1;
  for (int64_t s : ds.sample_shape) shape_dim *= s;
  const size_t count = size_t(ds.n) * size_t(ds.dim);
  if (ds.n < 1 || ds.dim < 1 || (!ds.sample_shape.empty() && shape_dim != ds.dim) ||
      (ds.is_u8 ? ds.u8.size() : ds.f32.size()) != count || ds.labels.size() != size_t(ds.n) ||
      ds.num_classes < 1)
    throw Error("writing '" + path + "': inconsistent dataset (n, dim, shape or sizes disagree)");
  for (size_t i = 0; i < ds.labels.size(); ++i)
    if (ds.labels[i] < 0 || ds.labels[i] >= ds.num_classes)
      throw Error("writing '" + path + "': label " + std::to_string(ds.labels[i]) + " of row " +
                  std::to_string(i) + " is outside [0, num_classes)");
}

void write_contents(const std::string& path, hid_t file, const Dataset& ds) {
  std::vector<hsize_t> dims{hsize_t(ds.n)};
  if (ds.sample_shape.empty()) dims.push_back(hsize_t(ds.dim));
  for (int64_t s : ds.sample_shape) dims.push_back(hsize_t(s));
  Hid fspace = created(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose, path,
                       "features space");
  Hid dcpl = features_dcpl(path, ds, dims);
  Hid feat = created(H5Dcreate2(file, "features", ds.is_u8 ? H5T_STD_U8LE : H5T_IEEE_F32LE,
                                fspace.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                     H5Dclose, path, "/features");
  const herr_t rc = ds.is_u8 ? H5Dwrite(feat.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL,
                                        H5P_DEFAULT, ds.u8.data())
                             : H5Dwrite(feat.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                                        H5P_DEFAULT, ds.f32.data());
  if (rc < 0) throw Error("writing '" + path + "': /features: " + hdf5_error_string());
  write_scalar_attr(path, feat.get(), "scale", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, &ds.scale);
  write_scalar_attr(path, feat.get(), "offset", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, &ds.offset);

  const hsize_t n = hsize_t(ds.n);
  Hid lspace = created(H5Screate_simple(1, &n, nullptr), H5Sclose, path, "labels space");
  Hid lab = created(H5Dcreate2(file, "labels", H5T_STD_I32LE, lspace.get(), H5P_DEFAULT,
                               H5P_DEFAULT, H5P_DEFAULT),
                    H5Dclose, path, "/labels");
  if (H5Dwrite(lab.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, ds.labels.data()) < 0)
    throw Error("writing '" + path + "': /labels: " + hdf5_error_string());
  const int32_t nc = ds.num_classes;
  write_scalar_attr(path, file, "num_classes", H5T_STD_I32LE, H5T_NATIVE_INT32, &nc);
}

void fsync_path(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error("writing '" + path + "': cannot reopen for fsync: " + std::strerror(errno));
  const int rc = fsync(fd);
  close(fd);
  if (rc != 0) throw Error("writing '" + path + "': fsync: " + std::strerror(errno));
}

}  // namespace

void write_dataset(const std::string& path, const Dataset& ds) {
  check_writable(path, ds);
  quiet_hdf5();
  // Same directory, so the rename is atomic: readers see the old file or the whole new one.
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  try {
    {
      Hid file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
      if (!file.ok())
        throw InputError("cannot create '" + tmp + "' (does the directory exist and is it "
                         "writable?): " + hdf5_error_string());
      write_contents(path, file.get(), ds);
      if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0)
        throw Error("writing '" + path + "': flush: " + hdf5_error_string());
    }
    fsync_path(tmp);
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error("writing '" + path + "': rename from " + tmp + ": " + std::strerror(errno));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

// ---------------------------------------------------------------- generators

namespace {
void require_size(int64_t n, int64_t dim, size_t elem, const char* who) {
  uint64_t bytes = 0;
  if (n < 1 || dim < 1 || !mul_ok(uint64_t(n), uint64_t(dim), bytes) ||
      !mul_ok(bytes, elem, bytes) || bytes > memory_cap())
    throw InputError(std::string(who) + ": n = " + std::to_string(n) + " and dim = " +
                     std::to_string(dim) + " must be >= 1 and fit in memory");
}
}  // namespace

// Label = parity of the number of ones (XOR of the bits), the Torch tutorial's "odd or even"
// read as a count; unlike the last bit of the encoded integer it needs every input and a hidden
// layer to learn.
Dataset synth_odd_even(int64_t n, int bits, uint64_t seed) {
  require_size(n, bits, sizeof(float), "synth odd-even");
  if (bits > 4096) throw InputError("synth odd-even: bits = " + std::to_string(bits) + " > 4096");
  Dataset ds;
  ds.path = "synth:odd-even";
  ds.n = n;
  ds.dim = bits;
  ds.sample_shape = {bits};
  ds.num_classes = 2;
  ds.is_u8 = false;
  ds.f32.resize(size_t(n) * size_t(bits));
  ds.labels.resize(size_t(n));
  SplitMix64 rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    int ones = 0;
    uint64_t word = 0;
    for (int j = 0; j < bits; ++j) {
      if (j % 64 == 0) word = rng.next();
      const int bit = int((word >> (j % 64)) & 1);
      ds.f32[size_t(i) * size_t(bits) + size_t(j)] = float(bit);
      ones += bit;
    }
    ds.labels[size_t(i)] = ones & 1;
  }
  return ds;
}

namespace {
// Box–Muller from SplitMix64: deterministic given libm's log/sqrt/cos (glibc is consistent).
struct Gauss {
  SplitMix64 rng;
  bool have = false;
  double spare = 0;
  double next() {
    if (have) { have = false; return spare; }
    const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();  // u1 in (0, 1]: log is finite
    const double r = std::sqrt(-2.0 * std::log(u1)), th = 6.283185307179586 * u2;
    spare = r * std::sin(th);
    have = true;
    return r * std::cos(th);
  }
};
}  // namespace

// Class centres uniform in [-1, 1]^dim, points = centre + spread·N(0, 1), classes drawn
// uniformly per row. With spread ~0.5 and dim >= 10 the task is learnable but not trivial.
Dataset synth_blobs(int64_t n, int dim, int classes, float spread, uint64_t seed) {
  require_size(n, dim, sizeof(float), "synth blobs");
  if (classes < 1 || classes > 1000000)
    throw InputError("synth blobs: classes = " + std::to_string(classes) + " outside [1, 1000000]");
  if (!(spread >= 0) || !std::isfinite(spread))
    throw InputError("synth blobs: spread must be finite and >= 0");
  Dataset ds;
  ds.path = "synth:blobs";
  ds.n = n;
  ds.dim = dim;
  ds.sample_shape = {dim};
  ds.num_classes = classes;
  ds.is_u8 = false;
  Gauss g{SplitMix64(seed)};
  std::vector<float> centres(size_t(classes) * size_t(dim));
  for (float& c : centres) c = float(2.0 * g.rng.uniform() - 1.0);
  ds.f32.resize(size_t(n) * size_t(dim));
  ds.labels.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const int c = int(g.rng.below(uint64_t(classes)));
    ds.labels[size_t(i)] = c;
    const float* centre = &centres[size_t(c) * size_t(dim)];
    float* row = &ds.f32[size_t(i) * size_t(dim)];
    for (int j = 0; j < dim; ++j) row[j] = centre[j] + spread * float(g.next());
  }
  return ds;
}

// ---------------------------------------------------------------- idx import

namespace {

// A gzip (or, transparently, plain) file read whole or in exact pieces.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path), f_(gzopen(path.c_str(), "rb")) {
    if (!f_) throw InputError("idx file '" + path + "': cannot open: " + std::strerror(errno));
  }
  ~GzFile() { if (f_) gzclose(f_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads exactly `len` bytes or throws naming what was being read.
  void read(void* buf, uint64_t len, const char* what) {
    auto* p = static_cast<unsigned char*>(buf);
    while (len > 0) {
      const unsigned piece = unsigned(std::min<uint64_t>(len, uint64_t(1) << 30));
      const int got = gzread(f_, p, piece);
      if (got < 0) {
        int errnum = 0;
        throw InputError("idx file '" + path_ + "': " + what + ": " + gzerror(f_, &errnum));
      }
      if (got == 0) throw InputError("idx file '" + path_ + "': " + what + ": truncated");
      p += got;
      len -= uint64_t(got);
    }
  }
  bool at_end() {
    unsigned char c;
    return gzread(f_, &c, 1) == 0;
  }
  uint32_t be32(const char* what) {
    unsigned char b[4];
    read(b, 4, what);
    return uint32_t(b[0]) << 24 | uint32_t(b[1]) << 16 | uint32_t(b[2]) << 8 | uint32_t(b[3]);
  }

 private:
  std::string path_;
  gzFile f_;
};

// idx magic: two zero bytes, type code 0x08 (unsigned byte), number of dimensions.
void read_idx(const std::string& path, uint32_t want_ndims, std::vector<uint32_t>& dims,
              std::vector<uint8_t>& data) {
  GzFile f(path);
  const uint32_t magic = f.be32("header");
  if (magic != (0x0800u | want_ndims))
    throw InputError("idx file '" + path + "': bad magic 0x" + [&] {
      char b[16];
      std::snprintf(b, sizeof b, "%08x", magic);
      return std::string(b);
    }() + ", expected 0x" + (want_ndims == 3 ? "00000803 (images)" : "00000801 (labels)"));
  dims.resize(want_ndims);
  uint64_t bytes = 1;
  for (auto& d : dims) {
    d = f.be32("header");
    if (d == 0 || !mul_ok(bytes, d, bytes) || bytes > memory_cap())
      throw InputError("idx file '" + path + "': absurd dimension " + std::to_string(d));
  }
  // Grow as bytes arrive, so a header that lies about its size cannot make us allocate (and
  // zero) gigabytes before the data runs out.
  data.clear();
  for (uint64_t have = 0; have < bytes;) {
    const uint64_t piece = std::min<uint64_t>(bytes - have, uint64_t(64) << 20);
    data.resize(size_t(have + piece));
    f.read(data.data() + have, piece, "data");
    have += piece;
  }
  if (!f.at_end()) throw InputError("idx file '" + path + "': trailing bytes after the data");
}

}  // namespace

// Per-sample shape {1, rows, cols}: channel-first images, so a conv model can use the file as is;
// an MLP sees dim = rows·cols = 784.
Dataset import_idx(const std::string& images, const std::string& labels) {
  std::vector<uint32_t> idims, ldims;
  Dataset ds;
  read_idx(images, 3, idims, ds.u8);
  std::vector<uint8_t> lab;
  read_idx(labels, 1, ldims, lab);
  if (ldims[0] != idims[0])
    throw InputError("idx files '" + images + "' and '" + labels + "': " +
                     std::to_string(idims[0]) + " images but " + std::to_string(ldims[0]) +
                     " labels");
  ds.path = images;
  ds.n = idims[0];
  ds.dim = int64_t(idims[1]) * idims[2];
  ds.sample_shape = {1, idims[1], idims[2]};
  ds.num_classes = 10;
  ds.is_u8 = true;
  ds.scale = 1.f / 255.f;
  ds.offset = 0.f;
  ds.labels.assign(lab.begin(), lab.end());
  for (size_t i = 0; i < lab.size(); ++i)
    if (lab[i] >= 10)
      throw InputError("idx file '" + labels + "': row " + std::to_string(i) + " has label " +
                       std::to_string(lab[i]) + ", outside [0, 10)");
  return ds;
}

// ---------------------------------------------------------------- data order

uint64_t SplitMix64::next() {
  uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Lemire's multiply-and-reject: unbiased, and almost never draws twice.
uint64_t SplitMix64::below(uint64_t n) {
  if (n == 0) return 0;
  unsigned __int128 m = (unsigned __int128)next() * n;
  uint64_t low = uint64_t(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = (unsigned __int128)next() * n;
      low = uint64_t(m);
    }
  }
  return uint64_t(m >> 64);
}

double SplitMix64::uniform() { return double(next() >> 11) * 0x1.0p-53; }

namespace {
uint64_t mix64(uint64_t z) { return SplitMix64(z).next(); }
}  // namespace

// The generator is seeded with mix64(seed ^ mix64(epoch)), so neighbouring seeds and epochs
// give unrelated streams; Fisher–Yates from the top: for i = n-1..1, swap(p[i], p[below(i+1)]).
std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(size_t(std::max<int64_t>(n, 0)));
  for (size_t i = 0; i < p.size(); ++i) p[i] = int64_t(i);
  if (!shuffle) return p;
  SplitMix64 rng(mix64(seed ^ mix64(uint64_t(epoch))));
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[size_t(i)], p[size_t(rng.below(uint64_t(i) + 1))]);
  return p;
}

std::vector<int64_t> rank_positions(int64_t n, const RankOrder& o) {
  const int64_t G = o.global_batch(), steps = G > 0 ? n / G : 0;
  std::vector<int64_t> pos;
  pos.reserve(size_t(steps * o.accumulate * o.batch));
  for (int64_t k = 0; k < steps; ++k)
    for (int a = 0; a < o.accumulate; ++a) {
      const int64_t p0 = batch_offset(k, a, o.rank, o.batch, o.world, o.accumulate);
      for (int j = 0; j < o.batch; ++j) pos.push_back(p0 + j);
    }
  return pos;
}

// ---------------------------------------------------------------- TrainRows

namespace {
uint64_t next_version() {
  static std::atomic<uint64_t> v{0};
  return ++v;
}
}  // namespace

struct TrainRows::Pending {
  int64_t epoch = -1;
  Dataset data;
  std::exception_ptr error;
  std::thread thread;
  ~Pending() {
    if (thread.joinable()) thread.join();
  }
};

TrainRows::TrainRows(const Dataset& whole, const RankOrder& o) : whole_(&whole), path_(whole.path), order_(o) {
  info_.n = whole.n;
  info_.dim = whole.dim;
  info_.sample_shape = whole.sample_shape;
  info_.num_classes = whole.num_classes;
  info_.feature_type = whole.is_u8 ? "uint8" : "float32";
  info_.scale = whole.scale;
  info_.offset = whole.offset;
}

TrainRows::TrainRows(const std::string& path, const RankOrder& o) : path_(path), order_(o) {
  info_ = open_checked(path, /*whole=*/false).info;  // the header only; rows are read per epoch
  // The rows themselves need not fit, but every epoch's order and index (8 bytes a row each) do.
  uint64_t order_bytes = 0;
  if (!mul_ok(uint64_t(info_.n), 16, order_bytes) || order_bytes > memory_cap())
    bad(path, "/features: " + std::to_string(info_.n) + " rows: the epoch order alone needs " +
                  std::to_string(order_bytes >> 20) + " MiB, over the memory limit of " +
                  std::to_string(memory_cap() >> 20) + " MiB");
  cur_ = empty_like(path, info_);
}

TrainRows::~TrainRows() = default;

// Epoch e's rows for this rank, in the order it uses them.
Dataset TrainRows::read_epoch(int64_t e) const {
  const std::vector<int64_t> order = epoch_order(info_.n, order_.shuffle, order_.seed, e);
  std::vector<int64_t> rows = rank_positions(info_.n, order_);
  for (int64_t& p : rows) p = order[size_t(p)];
  return load_rows(path_, rows);
}

void TrainRows::prefetch(int64_t e) {
  next_ = std::make_unique<Pending>();
  Pending* p = next_.get();
  p->epoch = e;
  p->thread = std::thread([this, p] {
    try {
      p->data = read_epoch(p->epoch);
    } catch (...) {
      p->error = std::current_exception();
    }
  });
}

std::vector<int64_t> TrainRows::start_epoch(int64_t e, bool read_next) {
  if (whole_) return epoch_order(info_.n, order_.shuffle, order_.seed, e);
  // Without shuffling every epoch uses the same rows: the first read serves them all.
  if (cur_epoch_ < 0 || (order_.shuffle && cur_epoch_ != e)) {
    Dataset d;
    std::unique_ptr<Pending> ahead = std::move(next_);  // joined when it goes out of scope
    if (ahead && ahead->epoch == e) {
      ahead->thread.join();
      if (ahead->error) std::rethrow_exception(ahead->error);
      d = std::move(ahead->data);
    } else {
      ahead.reset();  // read ahead for another epoch (a resume): read this one now
      d = read_epoch(e);
    }
    rows_read_ += d.n;
    d.first_row = 0;
    d.file_rows = 0;  // rows of this rank's epoch, not a slice of the file
    d.version = next_version();
    cur_ = std::move(d);
    cur_epoch_ = e;
    if (order_.shuffle && read_next) prefetch(e + 1);
  }
  std::vector<int64_t> index(size_t(info_.n), 0);
  const std::vector<int64_t> pos = rank_positions(info_.n, order_);
  for (size_t i = 0; i < pos.size(); ++i) index[size_t(pos[i])] = int64_t(i);
  return index;
}

// ---------------------------------------------------------------- gather (training hot path)

namespace {
// Blocks of 16 with a fixed trip count vectorise even at -O2's cheap cost model.
void convert_row(const uint8_t* __restrict src, int64_t dim, float scale, float offset,
                 float* __restrict dst) {
  int64_t j = 0;
  for (; j + 16 <= dim; j += 16)
    for (int k = 0; k < 16; ++k) dst[j + k] = float(src[j + k]) * scale + offset;
  for (; j < dim; ++j) dst[j] = float(src[j]) * scale + offset;
}

void scale_row(const float* __restrict src, int64_t dim, float scale, float offset,
               float* __restrict dst) {
  int64_t j = 0;
  for (; j + 16 <= dim; j += 16)
    for (int k = 0; k < 16; ++k) dst[j + k] = src[j + k] * scale + offset;
  for (; j < dim; ++j) dst[j] = src[j] * scale + offset;
}
}  // namespace

void Dataset::gather(const int64_t* rows, int count, float* x, int32_t* y) const {
  const bool identity = scale == 1.f && offset == 0.f;
  for (int i = 0; i < count; ++i) {
    const int64_t r = rows[i];
    if (r < 0 || r >= n)
      throw Error("gather: row " + std::to_string(r) + " outside [0, " + std::to_string(n) + ")");
    float* dst = x + int64_t(i) * dim;
    if (is_u8)
      convert_row(&u8[size_t(r * dim)], dim, scale, offset, dst);
    else if (identity)
      std::memcpy(dst, &f32[size_t(r * dim)], size_t(dim) * sizeof(float));
    else
      scale_row(&f32[size_t(r * dim)], dim, scale, offset, dst);
    y[i] = labels[size_t(r)];
  }
}

}  // namespace dpt
