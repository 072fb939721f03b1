// Import of a NumPy .npy pair (dpdata npy): features N x D or N x C x H x W of uint8, float32 or
// float64 (narrowed to float32), labels N integers. The file format is npy_format.cpp's; what an
// array may hold, and the messages when it does not, are the HDF5 reader's (import.cpp).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "dpt/check.hpp"
#include "import.hpp"
#include "npy_format.hpp"

namespace dpt {
using namespace data_internal;
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "npy data is read in place as little-endian");

std::string py_shape(const std::vector<uint64_t>& s) {  // as Python prints a tuple: (5,) or (5, 3)
  std::string t = "(";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + (s.size() == 1 ? ",)" : ")");
}

std::string row_name(size_t i) { return "row " + std::to_string(i); }

// Little-endian, or one-byte items (whose order numpy writes as '|'); a big-endian array gets the
// astype that fixes it.
void check_order(const std::string& where, const NpyType& t, const char* var) {
  if (t.size == 1 || t.order == '<') return;
  if (t.order == '>')
    throw InputError(where + ": holds big-endian " + t.name() + " (descr '" + t.descr + "'); save it little-endian: " +
                     var + ".astype('<" + t.descr.substr(1) + "')");
  throw InputError(where + ": descr '" + t.descr + "' does not say little-endian ('<')");
}

void refuse_objects(const std::string& where, const NpyType& t, const char* fix) {
  if (t.kind == 'O')
    throw InputError(where + ": holds Python objects (descr '" + t.descr + "', pickled data), which dpdata does not "
                             "unpickle; save a numeric array: " + fix);
}

enum class Feat { u8, f32, f64 };

Feat feature_kind(const std::string& where, const NpyType& t) {
  refuse_objects(where, t, "np.asarray(x, dtype=np.float32)");
  if (t.kind == 'u' && t.size == 1) return Feat::u8;
  if (t.kind == 'f' && (t.size == 4 || t.size == 8)) {
    check_order(where, t, "x");
    return t.size == 4 ? Feat::f32 : Feat::f64;
  }
  throw InputError(where + ": has dtype " + t.name() + " (descr '" + t.descr + "'); features must be uint8, float32 "
                           "or float64: save x.astype(np.float32)");
}

// int8 to int64 and uint8 to uint32, as the HDF5 reader takes them.
void check_label_type(const std::string& where, const NpyType& t) {
  refuse_objects(where, t, "np.asarray(y, dtype=np.int64)");
  const bool ok = (t.kind == 'i' && (t.size == 1 || t.size == 2 || t.size == 4 || t.size == 8)) ||
                  (t.kind == 'u' && (t.size == 1 || t.size == 2 || t.size == 4));
  if (!ok)
    throw InputError(where + ": has dtype " + t.name() + " (descr '" + t.descr + "'); labels must be integers (int8 "
                             "to int64, uint8 to uint32): save y.astype(np.int64)");
  check_order(where, t, "y");
}

// The array's bytes: C order and exactly what the shape needs. More bytes than that means more
// than one array in the file (np.save called twice on one open file writes that).
uint64_t checked_bytes(const std::string& where, const NpyHeader& h, const char* var) {
  if (h.fortran && h.shape.size() >= 2)
    throw InputError(where + ": is stored in Fortran (column-major) order (fortran_order: True); save it in C order: "
                             "np.ascontiguousarray(" + var + ")");
  uint64_t bytes = uint64_t(h.type.size);
  for (uint64_t d : h.shape)
    if (!mul_ok(bytes, d, bytes))
      throw InputError(where + ": shape " + py_shape(h.shape) + " overflows 64 bits");
  if (bytes > memory_cap())
    throw InputError(where + ": shape " + py_shape(h.shape) + " of " + h.type.name() + " exceeds the memory limit of " +
                     std::to_string(memory_cap() >> 20) + " MiB");
  const uint64_t held = h.file_size - h.data_offset;
  const std::string needs = "shape " + py_shape(h.shape) + " of " + h.type.name() + " needs " +
                            std::to_string(bytes) + " bytes";
  if (held < bytes)
    throw InputError(where + ": holds " + std::to_string(held) + " bytes of data but " + needs + " (truncated?)");
  if (held > bytes)
    throw InputError(where + ": holds " + std::to_string(held - bytes) + " bytes after its array (" + needs + "); "
                             "one array per file: np.save each array to a file of its own");
  return bytes;
}

// Rank 2 or more, no dimension 0, at most HDF5's 32 dimensions.
void check_feature_shape(const std::string& where, const std::vector<uint64_t>& s) {
  if (s.size() < 2)
    throw InputError(where + ": has shape " + py_shape(s) + "; features must be N x D or N x C x H x W (rank 2 or "
                             "more)" + (s.size() == 1 ? ": one feature per row? save x.reshape(-1, 1)" : ""));
  if (s.size() > 32) throw InputError(where + ": has " + std::to_string(s.size()) + " dimensions; HDF5 holds 32");
  if (s[0] == 0) throw InputError(where + ": has no rows (N = 0)");
  for (uint64_t d : s)
    if (d == 0) throw InputError(where + ": per-sample shape of " + py_shape(s) + " is empty");
}

std::vector<int64_t> read_labels(const std::string& path) {
  const std::string where = "labels file '" + path + "'";
  NpyFile f(path, where);
  const NpyHeader& h = f.header();
  check_label_type(where, h.type);
  const std::vector<uint64_t>& s = h.shape;
  if (s.size() != 1) {
    const bool column = s.size() == 2 && s[1] == 1, onehot = s.size() == 2 && s[1] > 1;
    throw InputError(where + ": has shape " + py_shape(s) + "; labels must be one integer per row, shape (N,)" +
                     (column ? ": save y.reshape(-1)" : onehot ? ": one-hot rows? save y.argmax(axis=1)" : ""));
  }
  std::vector<unsigned char> bytes(size_t(checked_bytes(where, h, "y")));
  f.read(bytes.data(), bytes.size());
  std::vector<int64_t> raw(static_cast<size_t>(s[0]));
  const unsigned char* b = bytes.data();
  for (size_t i = 0; i < raw.size(); ++i, b += h.type.size) {
    const bool u = h.type.kind == 'u';
    switch (h.type.size) {
      case 1: raw[i] = u ? int64_t(*b) : int64_t(int8_t(*b)); break;
      case 2: { uint16_t v; std::memcpy(&v, b, 2); raw[i] = u ? int64_t(v) : int64_t(int16_t(v)); break; }
      case 4: { uint32_t v; std::memcpy(&v, b, 4); raw[i] = u ? int64_t(v) : int64_t(int32_t(v)); break; }
      default: std::memcpy(&raw[i], b, 8);
    }
  }
  return raw;
}

void read_f64(NpyFile& f, const std::string& where, Dataset& ds) {
  std::vector<double> buf(size_t(1) << 16);
  for (size_t at = 0; at < ds.f32.size();) {
    const size_t piece = std::min(buf.size(), ds.f32.size() - at);
    f.read(buf.data(), piece * sizeof(double));
    for (size_t j = 0; j < piece; ++j) {
      const double v = buf[j];
      if (std::isfinite(v) && std::fabs(v) > double(FLT_MAX)) {
        char num[32];
        std::snprintf(num, sizeof num, "%g", v);
        throw InputError(where + ": " + row_name((at + j) / size_t(ds.dim)) + " holds " + num +
                         ", beyond float32's range (3.4e38)");
      }
      ds.f32[at + j] = float(v);
    }
    at += piece;
  }
}

// N x H x W x C to N x C x H x W, one sample at a time (one sample of extra memory).
template <class T>
void to_channels_first(std::vector<T>& x, const std::vector<int64_t>& hwc) {
  const int64_t h = hwc[0], w = hwc[1], c = hwc[2];
  std::vector<T> sample(size_t(h * w * c));
  for (size_t at = 0; at < x.size(); at += sample.size()) {
    std::copy(x.begin() + long(at), x.begin() + long(at + sample.size()), sample.begin());
    for (int64_t y = 0; y < h; ++y)
      for (int64_t z = 0; z < w; ++z)
        for (int64_t ch = 0; ch < c; ++ch) x[at + size_t((ch * h + y) * w + z)] = sample[size_t((y * w + z) * c + ch)];
  }
}

// The feature shape's layout: checked channels first, or (--channels-last) 4-D to be transposed.
void check_layout(const std::string& where, const std::vector<uint64_t>& s, bool channels_last) {
  if (channels_last && s.size() != 4)
    throw InputError(where + ": --channels-last needs 4-D features (N x H x W x C), not shape " + py_shape(s));
  if (!channels_last)
    check_channels_first(where, std::vector<hsize_t>(s.begin(), s.end()),
                         "Give --channels-last to transpose it on import, or save "
                         "np.ascontiguousarray(x.transpose(0, 3, 1, 2))");
}

Dataset read_features(const std::string& path, const ImportOptions& o) {
  const std::string where = "features file '" + path + "'";
  NpyFile f(path, where);
  const NpyHeader& h = f.header();
  const Feat kind = feature_kind(where, h.type);
  check_feature_shape(where, h.shape);
  checked_bytes(where, h, "x");
  check_layout(where, h.shape, o.channels_last);
  Dataset ds;
  ds.path = path;
  ds.n = int64_t(h.shape[0]);
  ds.sample_shape.assign(h.shape.begin() + 1, h.shape.end());
  ds.dim = 1;
  for (int64_t d : ds.sample_shape) ds.dim *= d;
  ds.is_u8 = kind == Feat::u8;
  const size_t count = size_t(ds.n) * size_t(ds.dim);
  if (ds.is_u8) ds.u8.resize(count);
  else ds.f32.resize(count);
  if (kind == Feat::u8) {
    f.read(ds.u8.data(), count);
    ds.scale = 1.f / 255.f;
    note(o, path + ": uint8 features stored as they are, read as value / 255 (scale attribute 1/255)");
  } else if (kind == Feat::f32) {
    f.read(ds.f32.data(), count * sizeof(float));
  } else {
    read_f64(f, where, ds);
    note(o, path + ": float64 features narrowed to float32");
  }
  if (o.channels_last) {
    if (ds.is_u8) to_channels_first(ds.u8, ds.sample_shape);
    else to_channels_first(ds.f32, ds.sample_shape);
    ds.sample_shape = {ds.sample_shape[2], ds.sample_shape[0], ds.sample_shape[1]};
    note(o, path + ": transposed from N x H x W x C " + py_shape(h.shape) + " to N x C x H x W");
  }
  return ds;
}

}  // namespace

Dataset import_npy(const std::string& features, const std::string& labels, const ImportOptions& o) {
  const std::vector<int64_t> raw = read_labels(labels);
  Dataset ds = read_features(features, o);
  if (int64_t(raw.size()) != ds.n)
    throw InputError("features file '" + features + "' has " + std::to_string(ds.n) + " rows but labels file '" +
                     labels + "' has " + std::to_string(raw.size()) + " labels");
  set_labels(ds, raw, "labels file '" + labels + "'", row_name, o);
  if (!ds.is_u8) check_finite(ds, "features file '" + features + "'", row_name);
  return ds;
}

}  // namespace dpt
