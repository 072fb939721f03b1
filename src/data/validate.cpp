// Opening a dataset file and checking it against the layout of DESIGN.md: every way a file can
// break it ends in InputError naming the file, the dataset or attribute and the problem; sizes are
// checked against the file's storage and the machine's memory before anything large is allocated.
#include "internal.hpp"

#include <hdf5.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "dpt/check.hpp"

namespace dpt {
using namespace data_internal;
namespace {

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

// ---------------------------------------------------------------- opening and checking

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
  return check_num_classes("dataset file '" + path + "': root attribute 'num_classes'", v);
}

// The optional root attribute class_names: a 1-D array of strings (variable-length as h5py
// writes a list of str, or fixed-length as it writes numpy bytes), at most num_classes of them.
std::vector<std::string> read_class_names(const std::string& path, hid_t file, int num_classes) {
  std::vector<std::string> names;
  if (H5Aexists(file, "class_names") <= 0) return names;
  const std::string n = "root attribute 'class_names'";
  Hid a(H5Aopen(file, "class_names", H5P_DEFAULT), H5Aclose);
  Hid t(a.ok() ? H5Aget_type(a.get()) : H5I_INVALID_HID, H5Tclose);
  Hid s(a.ok() ? H5Aget_space(a.get()) : H5I_INVALID_HID, H5Sclose);
  if (!t.ok() || !s.ok()) bad(path, n + ": unreadable");
  if (H5Tget_class(t.get()) != H5T_STRING) bad(path, n + ": is " + type_name(t.get()) + ", not strings");
  if (H5Sget_simple_extent_ndims(s.get()) != 1) bad(path, n + ": must be a 1-D list of names");
  const hssize_t count = H5Sget_simple_extent_npoints(s.get());
  if (count < 0 || count > num_classes)
    bad(path, n + ": holds " + std::to_string(count) + " names for " + std::to_string(num_classes) + " classes");
  const htri_t vlen = H5Tis_variable_str(t.get());
  Hid mem(H5Tcopy(H5T_C_S1), H5Tclose);
  if (vlen < 0 || !mem.ok() || H5Tset_cset(mem.get(), H5Tget_cset(t.get())) < 0) bad(path, n + ": unreadable type");
  if (vlen) {
    std::vector<char*> ptrs(size_t(count), nullptr);
    if (H5Tset_size(mem.get(), H5T_VARIABLE) < 0 || H5Aread(a.get(), mem.get(), ptrs.data()) < 0)
      bad(path, n + ": unreadable: " + hdf5_error_string());
    for (char* p : ptrs) names.emplace_back(p ? p : "");
    Hid space(H5Screate_simple(1, std::vector<hsize_t>{hsize_t(count)}.data(), nullptr), H5Sclose);
    H5Dvlen_reclaim(mem.get(), space.get(), H5P_DEFAULT, ptrs.data());
    return names;
  }
  const size_t size = H5Tget_size(t.get());
  if (size == 0 || size > 4096) bad(path, n + ": names of " + std::to_string(size) + " bytes");
  std::vector<char> buf(size_t(count) * size);
  if (H5Tset_size(mem.get(), size) < 0 || H5Tset_strpad(mem.get(), H5T_STR_NULLPAD) < 0 || H5Aread(a.get(), mem.get(), buf.data()) < 0)
    bad(path, n + ": unreadable: " + hdf5_error_string());
  for (hssize_t i = 0; i < count; ++i) {
    const char* p = &buf[size_t(i) * size];
    names.emplace_back(p, strnlen(p, size));
  }
  return names;
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
  else if (H5Tget_class(t.get()) == H5T_FLOAT)  // numpy's default float64, most often
    bad(path, n + ": has type " + type_name(t.get()) + "; expected uint8 or float32. Write it as "
              "float32, e.g. with h5py and numpy: f.create_dataset(\"features\", "
              "data=x.astype(np.float32)) (numpy's floats are float64 unless asked otherwise), or as "
              "uint8 with a scale attribute (docs/formats.md)");
  else bad(path, n + ": has type " + type_name(t.get()) + "; expected uint8 or float32");
  const auto dims = dims_of(path, dset, n);
  if (dims.size() < 2)
    bad(path, n + ": has rank " + std::to_string(dims.size()) + " " + shape_str(dims) +
                  "; expected N x D or N x C x H x W (rank >= 2)");
  if (dims[0] == 0) bad(path, n + ": has no rows (N = 0)");
  check_channels_first("dataset file '" + path + "': " + n, dims,
                       "Transpose it, e.g. with h5py and numpy: x = f[\"features\"][...].transpose(0, 3, 1, 2), then "
                       "write x as /features of a new file (with /labels, num_classes and any scale/offset attributes)");
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

// The shape attribute of /jpeg: three integers C, H, W (C 1 or 3; H and W what a JPEG can hold).
std::vector<int64_t> read_jpeg_shape(const std::string& path, hid_t dset) {
  const std::string n = "/jpeg attribute 'shape'";
  if (H5Aexists(dset, "shape") <= 0) bad(path, n + ": missing (the decoded row's [C, H, W])");
  Hid a(H5Aopen(dset, "shape", H5P_DEFAULT), H5Aclose);
  Hid t(a.ok() ? H5Aget_type(a.get()) : H5I_INVALID_HID, H5Tclose);
  Hid s(a.ok() ? H5Aget_space(a.get()) : H5I_INVALID_HID, H5Sclose);
  if (!t.ok() || !s.ok()) bad(path, n + ": unreadable");
  const size_t bytes = H5Tget_size(t.get());
  if (H5Tget_class(t.get()) != H5T_INTEGER || !(bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8) ||
      H5Tget_precision(t.get()) != bytes * 8 || H5Tget_offset(t.get()) != 0)
    bad(path, n + ": is " + type_name(t.get()) + "; expected int64 [C, H, W]");
  if (H5Sget_simple_extent_ndims(s.get()) != 1 || H5Sget_simple_extent_npoints(s.get()) != 3)
    bad(path, n + ": must hold three values [C, H, W]");
  std::vector<int64_t> v(3);
  if (H5Aread(a.get(), H5T_NATIVE_INT64, v.data()) < 0) bad(path, n + ": unreadable value");
  if (v[0] != 1 && v[0] != 3)
    bad(path, n + ": C = " + std::to_string(v[0]) + "; a JPEG row holds 1 (gray) or 3 (RGB) channels");
  for (int i = 1; i < 3; ++i)
    if (v[size_t(i)] < 1 || v[size_t(i)] > 65500)
      bad(path, n + ": " + (i == 1 ? "H" : "W") + " = " + std::to_string(v[size_t(i)]) +
                    " is outside [1, 65500] (a JPEG's limit)");
  return v;
}

// Checks a jpeg file's /jpeg and /jpeg_offsets (docs/formats.md) and fills the feature half of
// `info` as if /features held the decoded N x C x H x W uint8 pixels; the offsets go to o.
void check_jpeg(const std::string& path, hid_t file, Opened& o, bool whole) {
  DatasetInfo& info = o.info;
  const hid_t dset = o.jpeg.get();
  Hid t(H5Dget_type(dset), H5Tclose);
  if (!t.ok()) bad(path, "/jpeg: unreadable type");
  if (!is_u8(t.get())) bad(path, "/jpeg: has type " + type_name(t.get()) + "; expected uint8 (JPEG bytes)");
  const auto dims = dims_of(path, dset, "/jpeg");
  if (dims.size() != 1)
    bad(path, "/jpeg: has rank " + std::to_string(dims.size()) + " " + shape_str(dims) + "; expected rank 1 (bytes)");
  check_storage(path, file, dset, "/jpeg", dims, 1, dims[0]);
  const std::vector<int64_t> shape = read_jpeg_shape(path, dset);
  Hid od = open_dataset(path, file, "jpeg_offsets");
  Hid ot(H5Dget_type(od.get()), H5Tclose);
  if (!ot.ok()) bad(path, "/jpeg_offsets: unreadable type");
  if (H5Tget_class(ot.get()) != H5T_INTEGER || H5Tget_size(ot.get()) != 8 || H5Tget_sign(ot.get()) != H5T_SGN_2)
    bad(path, "/jpeg_offsets: has type " + type_name(ot.get()) + "; expected int64");
  const auto odims = dims_of(path, od.get(), "/jpeg_offsets");
  if (odims.size() != 1)
    bad(path, "/jpeg_offsets: has rank " + std::to_string(odims.size()) + " " + shape_str(odims) +
                  "; expected rank 1 (N + 1 entries)");
  if (odims[0] < 2) bad(path, "/jpeg_offsets: has " + std::to_string(odims[0]) + " entries; expected N + 1 with N >= 1 rows");
  const auto ldims = dims_of(path, o.labels.get(), "/labels");
  if (ldims.size() == 1 && ldims[0] + 1 != odims[0])
    bad(path, "/jpeg_offsets: has " + std::to_string(odims[0]) + " entries but /labels has " + std::to_string(ldims[0]) +
                  " rows; expected " + std::to_string(ldims[0] + 1) + " (N + 1)");
  uint64_t obytes = 0;
  if (!mul_ok(odims[0], 8, obytes) || obytes > memory_cap())
    bad(path, "/jpeg_offsets: " + std::to_string(odims[0]) + " entries exceed the memory limit");
  check_storage(path, file, od.get(), "/jpeg_offsets", odims, 8, obytes);
  o.jpeg_offsets.resize(size_t(odims[0]));
  if (H5Dread(od.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, o.jpeg_offsets.data()) < 0)
    bad(path, "/jpeg_offsets: cannot read data (corrupt or truncated?): " + hdf5_error_string());
  const std::vector<int64_t>& off = o.jpeg_offsets;
  if (off[0] != 0) bad(path, "/jpeg_offsets: entry 0 is " + std::to_string(off[0]) + "; expected 0");
  for (size_t r = 1; r < off.size(); ++r)
    if (off[r] < off[r - 1])
      bad(path, "/jpeg_offsets: entry " + std::to_string(r) + " (" + std::to_string(off[r]) + ") is less than entry " +
                    std::to_string(r - 1) + " (" + std::to_string(off[r - 1]) + "): offsets must not decrease");
  if (uint64_t(off.back()) != dims[0])
    bad(path, "/jpeg_offsets: the last entry is " + std::to_string(off.back()) + " but /jpeg holds " +
                  std::to_string(dims[0]) + " bytes");
  info.encoding = "jpeg";
  info.stored_bytes = int64_t(dims[0]);
  info.feature_type = "uint8";
  info.n = int64_t(off.size()) - 1;
  info.sample_shape = shape;
  info.dim = shape[0] * shape[1] * shape[2];
  uint64_t bytes = 0;
  if (!mul_ok(uint64_t(info.dim), uint64_t(info.n), bytes) || (whole && (bytes > memory_cap() || dims[0] > memory_cap())))
    bad(path, "/jpeg: " + std::to_string(info.n) + " rows decode to " + std::to_string(shape[0]) + " x " +
                  std::to_string(shape[1]) + " x " + std::to_string(shape[2]) + " uint8 each, over the memory limit of " +
                  std::to_string(memory_cap() >> 20) + " MiB");
  bool present = false;
  double s = read_number_attr(path, dset, "/jpeg", "scale", &present);
  info.scale = present ? float(s) : 1.f;
  double v = read_number_attr(path, dset, "/jpeg", "offset", &present);
  info.offset = present ? float(v) : 0.f;
  const double q = read_number_attr(path, dset, "/jpeg", "quality", &present);
  info.jpeg_quality = present && q >= 1 && q <= 100 ? int(q) : 0;
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
    bad(path, n + ": has " + std::to_string(dims[0]) + " rows but " +
                  (info.encoding == "jpeg" ? "/jpeg_offsets has " + std::to_string(info.n + 1) + " entries (" +
                                                 std::to_string(info.n) + " rows)"
                                           : "/features has " + std::to_string(info.n)));
  check_storage(path, file, dset, n, dims, H5Tget_size(t.get()),
                uint64_t(info.n) * H5Tget_size(t.get()));
}

}  // namespace

namespace data_internal {

// ---------------------------------------------------------------- checks the importers share

void check_class_names(const std::string& where, const std::vector<std::string>& names) {
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    if (n.find_first_of("\r\n") == std::string::npos) continue;
    std::string shown;
    for (char c : n) shown += c == '\n' ? "\\n" : c == '\r' ? "\\r" : std::string(1, c);
    throw InputError(where + ": class name '" + shown + "' (class " + std::to_string(i) +
                     ") holds a line break; checkpoints carry class names one per line, so it would come back "
                     "as two names: rename it");
  }
}

int check_num_classes(const std::string& where, double v) {
  if (!(v >= 1 && v <= 1e6)) {  // NaN fails too; the value is printed as read (casting 5e58 is UB)
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    throw InputError(where + ": " + buf + " is outside [1, 1000000]");
  }
  return int(v);
}

[[noreturn]] void label_out_of_range(const std::string& where, const std::string& row, int64_t label,
                                     int num_classes) {
  throw InputError(where + ": " + row + " has label " + std::to_string(label) + ", outside [0, num_classes = " +
                   std::to_string(num_classes) + ")");
}

[[noreturn]] void non_finite_feature(const std::string& where, const std::string& row) {
  throw InputError(where + ": " + row + " holds a non-finite value");
}

// An N x H x W x C image file (channels last, as numpy, TensorFlow and PIL lay images out) would
// load as H channels of W x C images and fail deep in a pooling layer, or worse, train on garbage.
// Refused when the last dimension is 1, 3 or 4 (grey, RGB, RGBA) and the second is not, so a real
// N x C x H x W file (C of 1, 3 or 4, or a W that is not) still loads.
void check_channels_first(const std::string& where, const std::vector<hsize_t>& d, const std::string& fix) {
  auto channels = [](hsize_t x) { return x == 1 || x == 3 || x == 4; };
  if (d.size() != 4 || !channels(d[3]) || channels(d[1])) return;
  const std::string nchw = shape_str({d[0], d[3], d[1], d[2]});
  throw InputError(where + ": shape " + shape_str(d) + " looks like N x H x W x C (channels last, NHWC); dptrain "
                   "expects N x C x H x W (channels first), here " + nchw + ". " + fix + ". Refused because the "
                   "last dimension is 1, 3 or 4 and the second is not");
}

Opened open_checked(const std::string& path, bool whole) {
  Opened o;
  o.file = open_file(path, /*sparse=*/!whole);
  // Pixels in /features, or JPEGs in /jpeg (dpdata images --store jpeg): one or the other.
  const bool jpeg = H5Lexists(o.file.get(), "jpeg", H5P_DEFAULT) > 0;
  if (jpeg && H5Lexists(o.file.get(), "features", H5P_DEFAULT) > 0)
    bad(path, "holds both /features and /jpeg; a dataset file stores its rows one way");
  if (jpeg) o.jpeg = open_dataset(path, o.file.get(), "jpeg");
  else o.features = open_dataset(path, o.file.get(), "features");
  o.labels = open_dataset(path, o.file.get(), "labels");
  if (jpeg) check_jpeg(path, o.file.get(), o, whole);
  else check_features(path, o.file.get(), o.features.get(), o.info, whole);
  check_labels(path, o.file.get(), o.labels.get(), o.info);
  o.info.num_classes = read_num_classes(path, o.file.get());
  o.info.class_names = read_class_names(path, o.file.get(), o.info.num_classes);
  check_class_names("dataset file '" + path + "': root attribute 'class_names'", o.info.class_names);
  return o;
}

}  // namespace data_internal
}  // namespace dpt
