// Checkpoints in HDF5 (C API): layout checks shared by writer and reader, the atomic writer
// (temporary file, fsync, rename, folder fsync) and the validating reader. The folder they live
// in (listing, ownership, pruning) is ckpt_folder.cpp's.
#include "dpt/ckpt.hpp"
#include "dpt/h5.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include "dpt/check.hpp"
#include "dpt/layer_spec.hpp"
#include "dpt/log.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the checksum feeds host-order bytes and is defined as little-endian");

namespace dpt {
namespace {
namespace fs = std::filesystem;

constexpr size_t kMaxLayers = 4096;       // a layers attribute longer than this is damage
constexpr int64_t kMaxWidth = 1 << 26;    // widest layer accepted
constexpr int kMaxRank = 8;               // tensors are 0-d to 2-d today; leave room
constexpr size_t kMaxTensors = 1 << 16;
constexpr int64_t kMaxChunkedBytes = int64_t(1) << 36;  // compressed data can outgrow the file

// Writer side: a failed call is a runtime failure (dpt::Error naming the call).
H5Id checked(hid_t id, H5Id::Closer closer, const char* call, int line) {
  if (id < 0) throw_call_error("HDF5", call, hdf5_error_string(), __FILE__, line);
  return H5Id(id, closer);
}
#define DPT_H5_OPEN(call, closer) checked((call), (closer), #call, __LINE__)

// Reader side: every problem is the user's file, so it is an InputError naming the file.
struct Reader {
  std::string path;
  [[noreturn]] void fail(const std::string& what) const {
    throw InputError("checkpoint " + path + ": " + what);
  }
  H5Id open(hid_t id, H5Id::Closer closer, const std::string& what) const {
    if (id < 0) fail(what + " (" + hdf5_error_string() + ")");
    return H5Id(id, closer);
  }
  void ok(herr_t rc, const std::string& what) const {
    if (rc < 0) fail(what + " (" + hdf5_error_string() + ")");
  }
};

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + ")";
}

std::vector<std::string> split(const std::string& name) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    size_t slash = name.find('/', start);
    parts.push_back(name.substr(start, slash - start));
    if (slash == std::string::npos) return parts;
    start = slash + 1;
  }
}

// "fc12", "conv3", "bn0": a layer's name (a prefix and digits); anything else is not one.
bool is_layer_name(const std::string& s) {
  for (const char* prefix : {"fc", "conv", "bn"}) {
    const size_t n = std::char_traits<char>::length(prefix);
    if (s.size() <= n || s.size() > n + 9 || s.compare(0, n, prefix) != 0) continue;
    bool digits = true;
    for (size_t k = n; k < s.size(); ++k) digits = digits && s[k] >= '0' && s[k] <= '9';
    if (digits) return true;
  }
  return false;
}

std::string name_problem(const std::string& name) {
  auto parts = split(name);
  if (parts.size() < 2 || (parts[0] != "model" && parts[0] != "optimizer"))
    return "tensor name '" + name + "' must start with model/ or optimizer/";
  for (const auto& p : parts)
    if (p.empty() || p == "." || p == "..")
      return "tensor name '" + name + "' has an empty or relative component";
  return "";
}

std::string layers_problem(const std::vector<int>& layers) {
  if (layers.size() < 2 || layers.size() > kMaxLayers)
    return "layers has " + std::to_string(layers.size()) + " entries (need 2.." +
           std::to_string(kMaxLayers) + ")";
  for (int w : layers)
    if (w < 1 || w > kMaxWidth) return "layer width " + std::to_string(w) + " is out of range";
  return "";
}

// The model tensors a checkpoint must hold, by name under model/: shape, whether the optimizer
// holds state for it (a parameter), and whether it is int64.
struct Expect {
  std::vector<int64_t> shape;
  bool param = true;
  bool int64 = false;
};
using Expected = std::map<std::string, Expect>;

// From `layers` (fc<i>: (out, in) and (out)), or from the layer list in `model` planned for
// `input_shape`. Sets *problem when the model attributes are unusable.
Expected expected_tensors(const Checkpoint& ck, std::string* problem) {
  Expected s;
  if (ck.model.empty()) {
    *problem = layers_problem(ck.layers);
    if (!problem->empty()) return s;
    for (size_t i = 0; i + 1 < ck.layers.size(); ++i) {
      const std::string n = "fc" + std::to_string(i);
      s[n + "/weight"] = {{ck.layers[i + 1], ck.layers[i]}};
      s[n + "/bias"] = {{ck.layers[i + 1]}};
    }
    return s;
  }
  if (!ck.layers.empty()) {
    *problem = "has both a layers and a model attribute";
    return s;
  }
  const std::vector<int>& in = ck.input_shape;
  if (in.size() != 1 && in.size() != 3) {
    *problem = "input_shape has " + std::to_string(in.size()) + " entries (need 1 or 3)";
    return s;
  }
  for (int v : in)
    if (v < 1 || v > kMaxWidth) {
      *problem = "input_shape entry " + std::to_string(v) + " is out of range";
      return s;
    }
  try {
    const TensorShape shape = in.size() == 3 ? TensorShape::image(in[0], in[1], in[2]) : TensorShape::features(in[0]);
    const ModelPlan plan = plan_model(parse_layer_list(ck.model), shape, 0);
    const std::string sep = plan.preset ? "." : "/";  // torchvision's keys, or our groups
    for (const PlannedLayer& p : plan.layers) {
      if (p.name.empty()) continue;
      const std::string n = p.name + sep;
      if (p.spec.kind == LayerKind::bn) {
        s[n + "weight"] = {{p.in.c}};
        s[n + "bias"] = {{p.in.c}};
        s[n + "running_mean"] = {{p.in.c}, false};
        s[n + "running_var"] = {{p.in.c}, false};
        s[n + "num_batches_tracked"] = {{}, false, true};
        continue;
      }
      const int64_t out = p.spec.out;
      s[n + "weight"] = {p.spec.kind == LayerKind::conv ? std::vector<int64_t>{out, p.in.c, p.spec.k, p.spec.k}
                                                        : std::vector<int64_t>{out, p.weights / out}};
      if (p.biases) s[n + "bias"] = {{out}};
    }
  } catch (const InputError& e) {
    *problem = "model attribute: " + std::string(e.what());
  }
  return s;
}

// who: what the shapes come from, for the message ("layers require", "the model requires").
std::string tensor_problem(const Expected& want, const char* who, const Tensor& t) {
  std::string p = name_problem(t.name);
  if (!p.empty()) return p;
  uint64_t n = 1;
  for (int64_t d : t.shape) {
    if (d < 0) return "tensor " + t.name + " has a negative dimension";
    n *= uint64_t(d);
  }
  if (n != t.count())
    return "tensor " + t.name + " has shape " + shape_str(t.shape) + " but " + std::to_string(t.count()) + " values";
  const auto parts = split(t.name);
  const bool model = parts[0] == "model";
  // The name under model/, or under optimizer/<state>/.
  std::string key;
  for (size_t i = model ? 1 : 2; i < parts.size(); ++i) key += (key.empty() ? "" : "/") + parts[i];
  const auto it = want.find(key);
  if (it == want.end() || (!model && !it->second.param)) {
    const std::string& leaf = parts.back();
    const bool layer_form = parts.size() >= 3 && (leaf == "weight" || leaf == "bias") &&
                            is_layer_name(parts[parts.size() - 2]);
    if (layer_form)
      return "tensor " + t.name + " names layer " + parts[parts.size() - 2] + ", which the model does not have";
    if (model) return "unexpected model tensor " + t.name;
    return "";  // free-form optimizer state (e.g. a scalar) is allowed
  }
  if (t.int64 != it->second.int64)
    return "tensor " + t.name + " is " + (t.int64 ? "int64" : "float") + " but should be " +
           (it->second.int64 ? "int64" : "float32");
  if (t.shape != it->second.shape)
    return "tensor " + t.name + " has shape " + shape_str(t.shape) + " but " + who + " " + shape_str(it->second.shape);
  return "";
}

// Everything the writer promises and the reader demands about names and shapes.
std::string layout_problem(const Checkpoint& ck) {
  std::string p;
  const Expected want = expected_tensors(ck, &p);
  if (!p.empty()) return p;
  if (ck.tensors.size() > kMaxTensors) return "too many tensors";
  std::set<std::string> names;
  for (const Tensor& t : ck.tensors) {
    p = tensor_problem(want, ck.model.empty() ? "layers require" : "the model requires", t);
    if (!p.empty()) return p;
    if (!names.insert(t.name).second) return "tensor " + t.name + " appears twice";
  }
  for (const auto& w : want)
    if (!names.count("model/" + w.first)) return "tensor model/" + w.first + " is missing";
  return "";
}

}  // namespace

std::string join_class_names(const std::vector<std::string>& names) {
  std::string joined;
  for (size_t i = 0; i < names.size(); ++i) joined += (i ? "\n" : "") + names[i];
  return joined;
}

std::vector<std::string> split_class_names(const std::string& joined) {
  std::vector<std::string> names;
  for (size_t at = 0; !joined.empty() && at <= joined.size();) {
    const size_t nl = std::min(joined.find('\n', at), joined.size());
    names.push_back(joined.substr(at, nl - at));
    at = nl + 1;
  }
  return names;
}

uint32_t tensor_checksum(const std::vector<Tensor>& tensors) {
  std::vector<const Tensor*> order;
  for (const Tensor& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const Tensor* a, const Tensor* b) { return a->name < b->name; });
  uLong crc = crc32(0L, Z_NULL, 0);
  auto feed = [&crc](const void* p, size_t n) {
    const auto* b = static_cast<const Bytef*>(p);
    for (size_t off = 0; off < n;) {  // crc32 takes a uInt length
      uInt len = uInt(std::min<size_t>(n - off, size_t(1) << 30));
      crc = crc32(crc, b + off, len);
      off += len;
    }
  };
  for (const Tensor* t : order) {
    feed(t->name.c_str(), t->name.size() + 1);  // the NUL keeps "ab"+"c" apart from "a"+"bc"
    int64_t rank = int64_t(t->shape.size());
    feed(&rank, sizeof rank);
    feed(t->shape.data(), t->shape.size() * sizeof(int64_t));
    if (t->int64) feed(t->ints.data(), t->ints.size() * sizeof(int64_t));
    else feed(t->data.data(), t->data.size() * sizeof(float));
  }
  return uint32_t(crc);
}

const Tensor* Checkpoint::find(const std::string& name) const {
  for (const Tensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

// =================================== writer ===================================
namespace {

H5Id file_access_plist() {
  H5Id fapl = DPT_H5_OPEN(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  // Strong close: H5Fclose really closes (and flushes) even if a handle leaked somewhere.
  DPT_CHECK_H5(H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG));
  // Lock where the file system can; Lustre/NFS without flock must not make checkpoints fail.
  DPT_CHECK_H5(H5Pset_file_locking(fapl.get(), true, true));
  return fapl;
}

void write_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* v) {
  H5Id space = DPT_H5_OPEN(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id attr = DPT_H5_OPEN(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                          H5Aclose);
  DPT_CHECK_H5(H5Awrite(attr.get(), mem_type, v));
}

// Variable-length UTF-8: reads as str in h5py and prints as text in h5dump.
void write_string_attr(hid_t obj, const char* name, const std::string& s) {
  H5Id type = DPT_H5_OPEN(H5Tcopy(H5T_C_S1), H5Tclose);
  DPT_CHECK_H5(H5Tset_size(type.get(), H5T_VARIABLE));
  DPT_CHECK_H5(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  const char* p = s.c_str();
  write_attr(obj, name, type.get(), type.get(), &p);
}

void write_ints_attr(hid_t obj, const char* name, const std::vector<int>& v) {
  hsize_t n = v.size();
  H5Id space = DPT_H5_OPEN(H5Screate_simple(1, &n, nullptr), H5Sclose);
  H5Id attr = DPT_H5_OPEN(
      H5Acreate2(obj, name, H5T_STD_I32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  DPT_CHECK_H5(H5Awrite(attr.get(), H5T_NATIVE_INT, v.data()));
}

void write_root_attrs(hid_t file, const Checkpoint& ck) {
  write_string_attr(file, "format", Checkpoint::kFormat);
  write_attr(file, "version", H5T_STD_I32LE, H5T_NATIVE_INT, &ck.version);
  write_attr(file, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, &ck.step);
  write_attr(file, "epoch", H5T_STD_I64LE, H5T_NATIVE_INT64, &ck.epoch);
  write_attr(file, "step_in_epoch", H5T_STD_I64LE, H5T_NATIVE_INT64, &ck.step_in_epoch);
  write_attr(file, "samples_seen", H5T_STD_I64LE, H5T_NATIVE_INT64, &ck.samples_seen);
  write_attr(file, "global_batch", H5T_STD_I64LE, H5T_NATIVE_INT64, &ck.global_batch);
  write_attr(file, "optimizer_updates", H5T_STD_I64LE, H5T_NATIVE_INT64, &ck.optimizer_updates);
  write_attr(file, "world_size", H5T_STD_I32LE, H5T_NATIVE_INT, &ck.world_size);
  write_attr(file, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, &ck.seed);
  write_string_attr(file, "optimizer", ck.optimizer);
  write_string_attr(file, "config", ck.config);
  if (!ck.run_id.empty()) write_string_attr(file, "run_id", ck.run_id);
  if (!ck.data_train.empty()) write_string_attr(file, "data_train", ck.data_train);
  if (ck.schedule_steps > 0)
    write_attr(file, "schedule_steps", H5T_STD_I64LE, H5T_NATIVE_INT64, &ck.schedule_steps);
  if (!ck.class_names.empty()) write_string_attr(file, "class_names", join_class_names(ck.class_names));
  if (ck.model.empty()) {
    write_ints_attr(file, "layers", ck.layers);
  } else {
    write_string_attr(file, "model", ck.model);
    write_ints_attr(file, "input_shape", ck.input_shape);
  }
  uint32_t crc = tensor_checksum(ck.tensors);
  write_attr(file, "checksum_crc32", H5T_STD_U32LE, H5T_NATIVE_UINT32, &crc);
}

void write_tensor(hid_t file, hid_t lcpl, const Tensor& t) {
  std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
  H5Id space = t.shape.empty()
                   ? DPT_H5_OPEN(H5Screate(H5S_SCALAR), H5Sclose)
                   : DPT_H5_OPEN(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
  H5Id dset = DPT_H5_OPEN(H5Dcreate2(file, t.name.c_str(), t.int64 ? H5T_STD_I64LE : H5T_IEEE_F32LE, space.get(),
                                     lcpl, H5P_DEFAULT, H5P_DEFAULT),
                          H5Dclose);
  if (t.int64 && !t.ints.empty())
    DPT_CHECK_H5(H5Dwrite(dset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.ints.data()));
  else if (!t.data.empty())
    DPT_CHECK_H5(H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                          t.data.data()));
}

[[noreturn]] void throw_errno(const std::string& what) {
  throw Error(what + ": " + std::strerror(errno));
}

// ---- the whole-file seal ----
// The file opens with a 512-byte HDF5 user block (HDF5 tools and h5py skip it) that holds a
// CRC32 of everything after it. The reader checks it before HDF5 parses a single byte: a
// truncated or bit-flipped checkpoint is rejected by us, never handed to libhdf5, whose parser
// can crash or hang on damaged metadata (seen under fuzzing with HDF5 1.10.8).
constexpr size_t kSealBytes = 512;
constexpr char kSealMagic[16] = "dptrain-seal-v1";  // 15 characters and a NUL

struct Seal {
  char magic[16];
  uint64_t body_bytes;  // little-endian on every machine we build for
  uint32_t crc32;
};

// CRC32 of [offset, EOF) of an open file; false on a read error.
bool file_crc(std::FILE* f, uint64_t offset, uint64_t& bytes, uint32_t& crc) {
  if (std::fseek(f, long(offset), SEEK_SET) != 0) return false;
  std::vector<unsigned char> buf(size_t(1) << 20);
  uLong c = crc32(0L, Z_NULL, 0);
  bytes = 0;
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    c = crc32(c, buf.data(), uInt(n));
    bytes += n;
  }
  crc = uint32_t(c);
  return !std::ferror(f);
}

void write_seal(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  if (!f) throw_errno("open " + path + " to seal it");
  Seal seal{};
  std::memcpy(seal.magic, kSealMagic, sizeof seal.magic);
  bool ok = file_crc(f, kSealBytes, seal.body_bytes, seal.crc32);
  ok = ok && std::fseek(f, 0, SEEK_SET) == 0 && std::fwrite(&seal, sizeof seal, 1, f) == 1;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) throw_errno("seal " + path);
}

void write_hdf5(const std::string& path, const Checkpoint& ck) {
  H5Id fapl = file_access_plist();
  H5Id fcpl = DPT_H5_OPEN(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  DPT_CHECK_H5(H5Pset_userblock(fcpl.get(), kSealBytes));
  H5Id lcpl = DPT_H5_OPEN(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  DPT_CHECK_H5(H5Pset_create_intermediate_group(lcpl.get(), 1));
  H5Id file = DPT_H5_OPEN(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()),
                          H5Fclose);
  write_root_attrs(file.get(), ck);
  for (const Tensor& t : ck.tensors) write_tensor(file.get(), lcpl.get(), t);
  DPT_CHECK_H5(file.close());
  write_seal(path);
}

// Data and metadata on stable storage before the rename publishes the file.
void fsync_path(const std::string& path, bool is_dir) {
  int fd = ::open(path.c_str(), (is_dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw_errno("open " + path + " for fsync");
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a folder (EINVAL); the rename itself is still atomic there.
  if (rc != 0 && !(is_dir && err == EINVAL)) {
    errno = err;
    throw_errno("fsync " + path);
  }
}

}  // namespace

void write_checkpoint(const std::string& path, const Checkpoint& ck) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string fail = "cannot write checkpoint " + path + ": ";
  std::string problem = layout_problem(ck);
  if (!problem.empty()) throw Error(fail + problem);

  fs::path final_path(path);
  std::string dir = final_path.has_parent_path() ? final_path.parent_path().string() : ".";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fail + "cannot create folder " + dir + ": " + ec.message());

  // Same folder as the final name, so rename(2) is atomic; the leading dot and the suffix keep
  // list_checkpoints from ever seeing it.
  std::string tmp = (fs::path(dir) / ("." + final_path.filename().string() + ".tmp." +
                                         std::to_string(::getpid()))).string();
  try {
    write_hdf5(tmp, ck);
    fsync_path(tmp, false);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) throw_errno("rename " + tmp);
  } catch (const std::exception& e) {
    ::unlink(tmp.c_str());
    throw Error(fail + e.what());
  }
  try {
    fsync_path(dir, true);  // makes the rename itself durable
  } catch (const std::exception& e) {
    throw Error(fail + "written, but " + e.what());
  }
}

// =================================== reader ===================================
namespace {

H5Id open_attr(const Reader& r, hid_t obj, const char* name) {
  htri_t exists = H5Aexists(obj, name);
  if (exists < 0) r.ok(-1, std::string("cannot look up attribute '") + name + "'");
  if (exists == 0) r.fail(std::string("missing attribute '") + name + "'");
  return r.open(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose,
                std::string("cannot open attribute '") + name + "'");
}

// Number of elements of an attribute, checking its type class first.
hssize_t attr_points(const Reader& r, hid_t attr, const char* name, H5T_class_t want) {
  H5Id type = r.open(H5Aget_type(attr), H5Tclose, std::string("attribute '") + name + "'");
  if (H5Tget_class(type.get()) != want)
    r.fail(std::string("attribute '") + name + "' has the wrong type");
  H5Id space = r.open(H5Aget_space(attr), H5Sclose, std::string("attribute '") + name + "'");
  hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 0) r.fail(std::string("attribute '") + name + "' has a damaged dataspace");
  return n;
}

template <class T>
T read_scalar(const Reader& r, hid_t obj, const char* name, hid_t mem_type) {
  H5Id attr = open_attr(r, obj, name);
  if (attr_points(r, attr.get(), name, H5T_INTEGER) != 1)
    r.fail(std::string("attribute '") + name + "' is not a scalar");
  T v{};
  r.ok(H5Aread(attr.get(), mem_type, &v), std::string("cannot read attribute '") + name + "'");
  return v;
}

int64_t read_count(const Reader& r, hid_t obj, const char* name, int64_t lo, int64_t hi) {
  int64_t v = read_scalar<int64_t>(r, obj, name, H5T_NATIVE_INT64);
  if (v < lo || v > hi)
    r.fail(std::string("attribute '") + name + "' = " + std::to_string(v) + " is out of range");
  return v;
}

// Variable-length (what we write) or fixed-length (what other tools may write) strings.
std::string read_string(const Reader& r, hid_t obj, const char* name) {
  H5Id attr = open_attr(r, obj, name);
  if (attr_points(r, attr.get(), name, H5T_STRING) != 1)
    r.fail(std::string("attribute '") + name + "' is not a single string");
  H5Id ftype = r.open(H5Aget_type(attr.get()), H5Tclose, std::string("attribute '") + name + "'");
  H5Id mtype = r.open(H5Tcopy(H5T_C_S1), H5Tclose, "string type");
  const std::string what = std::string("cannot read attribute '") + name + "'";
  // HDF5 does not convert between character sets, so read in the file's own.
  r.ok(H5Tset_cset(mtype.get(), H5Tget_cset(ftype.get())), what);
  if (H5Tis_variable_str(ftype.get()) > 0) {
    r.ok(H5Tset_size(mtype.get(), H5T_VARIABLE), what);
    char* p = nullptr;
    r.ok(H5Aread(attr.get(), mtype.get(), &p), what);
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  size_t size = H5Tget_size(ftype.get());
  if (size == 0 || size > (size_t(1) << 26)) r.fail(std::string("attribute '") + name + "' size");
  r.ok(H5Tset_size(mtype.get(), size), what);
  std::string buf(size, '\0');
  r.ok(H5Aread(attr.get(), mtype.get(), &buf[0]), what);
  return buf.substr(0, buf.find('\0'));
}

std::vector<int> read_ints(const Reader& r, hid_t obj, const char* name) {
  H5Id attr = open_attr(r, obj, name);
  hssize_t n = attr_points(r, attr.get(), name, H5T_INTEGER);
  if (n < 1 || size_t(n) > kMaxLayers)
    r.fail(std::string("attribute '") + name + "' has " + std::to_string(n) + " entries");
  std::vector<int> v(size_t(n), 0);
  r.ok(H5Aread(attr.get(), H5T_NATIVE_INT, v.data()),
       std::string("cannot read attribute '") + name + "'");
  return v;
}

// Format and version first, so a foreign or future file gets that message, not "missing step".
uint32_t read_header(const Reader& r, hid_t file, Checkpoint& ck) {
  if (H5Aexists(file, "format") <= 0)
    r.fail("not a dptrain checkpoint (no 'format' attribute)");
  std::string format = read_string(r, file, "format");
  if (format != Checkpoint::kFormat)
    r.fail("not a dptrain checkpoint (format = \"" + format + "\", expected \"" +
           Checkpoint::kFormat + "\")");
  ck.version = int(read_count(r, file, "version", INT32_MIN, INT32_MAX));
  if (ck.version < 1 || ck.version > Checkpoint::kVersion)
    r.fail("version " + std::to_string(ck.version) + " is not supported (this build reads 1.." +
           std::to_string(Checkpoint::kVersion) + ")");
  const int64_t big = INT64_MAX;
  ck.step = read_count(r, file, "step", 0, big);
  ck.epoch = read_count(r, file, "epoch", 0, big);
  ck.step_in_epoch = read_count(r, file, "step_in_epoch", 0, big);
  ck.samples_seen = read_count(r, file, "samples_seen", 0, big);
  ck.global_batch = read_count(r, file, "global_batch", 0, big);
  // Updates applied (differs from step only when non-finite steps were skipped).
  ck.optimizer_updates = H5Aexists(file, "optimizer_updates") > 0
                             ? read_count(r, file, "optimizer_updates", 0, big)
                             : ck.step;
  ck.world_size = int(read_count(r, file, "world_size", 1, INT32_MAX));
  ck.seed = read_scalar<uint64_t>(r, file, "seed", H5T_NATIVE_UINT64);
  ck.optimizer = read_string(r, file, "optimizer");
  ck.config = read_string(r, file, "config");
  if (H5Aexists(file, "run_id") > 0) ck.run_id = read_string(r, file, "run_id");
  if (H5Aexists(file, "data_train") > 0) ck.data_train = read_string(r, file, "data_train");
  if (H5Aexists(file, "schedule_steps") > 0) ck.schedule_steps = read_count(r, file, "schedule_steps", 1, big);
  if (H5Aexists(file, "class_names") > 0) ck.class_names = split_class_names(read_string(r, file, "class_names"));
  // The MLP widths form, or a layer list with its input shape (checked with the tensors).
  const htri_t list = H5Aexists(file, "model");
  if (list < 0) r.ok(-1, "cannot look up attribute 'model'");
  if (list > 0) {
    ck.model = read_string(r, file, "model");
    if (ck.model.size() > kMaxLayerListChars) r.fail("attribute 'model' is too long");
    ck.input_shape = read_ints(r, file, "input_shape");
  } else {
    ck.layers = read_ints(r, file, "layers");
    std::string p = layers_problem(ck.layers);
    if (!p.empty()) r.fail(p);
  }
  return read_scalar<uint32_t>(r, file, "checksum_crc32", H5T_NATIVE_UINT32);
}

struct Visit {
  std::string prefix;
  std::vector<std::string> datasets;
  std::vector<std::string> bad;  // links we refuse to follow
};

// C callback: must not throw, so it only records what it sees.
herr_t visit_cb(hid_t group, const char* name, const H5L_info_t* info, void* data) {
  auto* v = static_cast<Visit*>(data);
  std::string full = v->prefix + "/" + name;
  if (info->type != H5L_TYPE_HARD) {
    v->bad.push_back(full);
    return 0;
  }
  hid_t obj = H5Oopen(group, name, H5P_DEFAULT);
  if (obj < 0) {
    v->bad.push_back(full);
    return 0;
  }
  if (H5Iget_type(obj) == H5I_DATASET) v->datasets.push_back(full);
  H5Oclose(obj);
  return v->datasets.size() > kMaxTensors ? 1 : 0;  // stop early on absurd files
}

std::vector<std::string> dataset_names(const Reader& r, hid_t file) {
  Visit v;
  for (const char* top : {"model", "optimizer"}) {
    htri_t exists = H5Lexists(file, top, H5P_DEFAULT);
    if (exists < 0) r.ok(-1, std::string("cannot look up /") + top);
    if (exists == 0) {
      if (std::string(top) == "model") r.fail("no /model group");
      continue;
    }
    H5Id g = r.open(H5Gopen2(file, top, H5P_DEFAULT), H5Gclose,
                    std::string("cannot open group /") + top);
    v.prefix = top;
    r.ok(H5Lvisit(g.get(), H5_INDEX_NAME, H5_ITER_INC, visit_cb, &v),
         std::string("cannot walk /") + top);
  }
  if (!v.bad.empty()) r.fail("cannot follow link /" + v.bad.front());
  if (v.datasets.size() > kMaxTensors) r.fail("too many datasets");
  return v.datasets;
}

// Shape and type checks come before the allocation, so a damaged header cannot ask for 1 EiB.
Tensor read_tensor(const Reader& r, hid_t file, const std::string& name, uint64_t file_size) {
  const std::string what = "dataset /" + name;
  H5Id dset = r.open(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose, "cannot open " + what);
  H5Id type = r.open(H5Dget_type(dset.get()), H5Tclose, "cannot read the type of " + what);
  const H5T_class_t cls = H5Tget_class(type.get());
  // Float tensors, and int64 counters (batch norm's num_batches_tracked).
  if (cls != H5T_FLOAT && !(cls == H5T_INTEGER && H5Tget_size(type.get()) == 8))
    r.fail(what + " is not floating point or int64");
  H5Id space = r.open(H5Dget_space(dset.get()), H5Sclose, "cannot read the shape of " + what);
  int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0 || rank > kMaxRank) r.fail(what + " has a damaged or absurd rank");
  hsize_t dims[kMaxRank] = {0};
  r.ok(H5Sget_simple_extent_dims(space.get(), dims, nullptr), "cannot read the shape of " + what);
  Tensor t;
  t.name = name;
  uint64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    if (dims[i] > uint64_t(kMaxWidth) * kMaxWidth || (dims[i] && n > UINT64_MAX / dims[i]))
      r.fail(what + " has an absurd shape");
    n *= dims[i];
    t.shape.push_back(int64_t(dims[i]));
  }
  H5Id dcpl = r.open(H5Dget_create_plist(dset.get()), H5Pclose, "cannot read " + what);
  bool contiguous = H5Pget_layout(dcpl.get()) == H5D_CONTIGUOUS;
  uint64_t limit = contiguous ? file_size : uint64_t(kMaxChunkedBytes);
  if (n > limit / sizeof(float))
    r.fail(what + " claims " + shape_str(t.shape) + " values, more than the file can hold");
  t.int64 = cls == H5T_INTEGER;
  if (t.int64) t.ints.resize(size_t(n));
  else t.data.resize(size_t(n));
  if (n)
    r.ok(H5Dread(dset.get(), t.int64 ? H5T_NATIVE_INT64 : H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                 t.int64 ? static_cast<void*>(t.ints.data()) : static_cast<void*>(t.data.data())),
         "cannot read " + what + " (truncated or damaged)");
  return t;
}

// A file of ours (HDF5 signature after the user block) must carry an intact seal; a file with
// the HDF5 signature at byte 0 is someone else's and is refused.
void check_seal(const Reader& r, uint64_t size) {
  std::FILE* f = std::fopen(r.path.c_str(), "rb");
  if (!f) r.fail("cannot open: " + std::string(std::strerror(errno)));
  unsigned char head[kSealBytes + 8] = {0};
  const size_t got = std::fread(head, 1, sizeof head, f);
  static const unsigned char kHdf5Sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  const bool foreign = got >= 8 && std::memcmp(head, kHdf5Sig, 8) == 0;
  const bool ours = got == sizeof head && std::memcmp(head + kSealBytes, kHdf5Sig, 8) == 0;
  Seal seal{};
  std::memcpy(&seal, head, sizeof seal);
  uint64_t bytes = 0;
  uint32_t crc = 0;
  const bool read_ok = !foreign && file_crc(f, kSealBytes, bytes, crc);
  std::fclose(f);
  // HDF5 from byte 0 and no seal: not written by dptrain. Refused before libhdf5 parses it, so
  // that no file without a verified checksum ever reaches the library's parser.
  if (foreign)
    r.fail("not a dptrain checkpoint (an HDF5 file without the dptrain-checkpoint seal header; "
           "its format attribute is not read)");
  if (std::memcmp(seal.magic, kSealMagic, sizeof seal.magic) != 0) {
    if (ours) r.fail("the checksum header is damaged");
    if (got < sizeof head) r.fail("truncated (" + std::to_string(size) + " bytes)");
    r.fail("not an HDF5 file (no HDF5 signature; damaged or some other format)");
  }
  if (!read_ok) r.fail("read error while checking the file's checksum");
  if (bytes != seal.body_bytes)
    r.fail("truncated or extended: " + std::to_string(bytes + kSealBytes) + " bytes, written as " +
           std::to_string(seal.body_bytes + kSealBytes));
  if (crc != seal.crc32) r.fail("file checksum mismatch: the file is damaged");
}

// The file's checks before HDF5 opens it (with `sealed`, the seal's too); returns its size.
uint64_t check_file(const Reader& r, bool sealed) {
  std::error_code ec;
  auto st = fs::status(r.path, ec);
  if (!fs::exists(st)) r.fail("not found");
  if (!fs::is_regular_file(st)) r.fail("not a regular file");
  uint64_t size = fs::file_size(r.path, ec);
  if (ec) r.fail("cannot stat: " + ec.message());
  if (size == 0) r.fail("empty file (not HDF5)");
  if (sealed) check_seal(r, size);
  htri_t is_h5 = H5Fis_hdf5(r.path.c_str());
  if (is_h5 < 0) r.fail("unreadable (" + hdf5_error_string() + ")");
  if (is_h5 == 0) r.fail("not an HDF5 file (no HDF5 signature; damaged or some other format)");
  return size;
}

H5Id open_read_only(const Reader& r) {
  H5Id fapl;
  try {
    fapl = file_access_plist();
  } catch (const Error& e) {
    r.fail(e.what());
  }
  return r.open(H5Fopen(r.path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose,
                "cannot open as HDF5: truncated or damaged");
}

}  // namespace

void seal_checkpoint(const std::string& path) { write_seal(path); }

Checkpoint read_checkpoint(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Reader r{path};
  const uint64_t size = check_file(r, true);
  H5Id file = open_read_only(r);
  Checkpoint ck;
  uint32_t stored_crc = read_header(r, file.get(), ck);
  std::vector<std::string> names = dataset_names(r, file.get());
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) ck.tensors.push_back(read_tensor(r, file.get(), n, size));
  std::string problem = layout_problem(ck);
  if (!problem.empty()) r.fail(problem);
  uint32_t crc = tensor_checksum(ck.tensors);
  if (crc != stored_crc)
    r.fail("checksum mismatch (stored " + std::to_string(stored_crc) + ", computed " +
           std::to_string(crc) + "): tensor data is damaged");
  return ck;
}

std::vector<Tensor> read_model_group(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Reader r{path};
  const uint64_t size = check_file(r, false);
  H5Id file = open_read_only(r);
  std::vector<std::string> names = dataset_names(r, file.get());
  std::sort(names.begin(), names.end());
  std::vector<Tensor> out;
  for (const std::string& n : names)
    if (n.rfind("model/", 0) == 0) out.push_back(read_tensor(r, file.get(), n, size));
  return out;
}

bool has_model_group(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Reader r{path};
  check_file(r, false);
  H5Id file = open_read_only(r);
  return H5Lexists(file.get(), "model", H5P_DEFAULT) > 0;
}

std::string read_checkpoint_run_id(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Reader r{path};
  try {
    H5Id fapl = file_access_plist();
    H5Id file = r.open(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose, "cannot open");
    if (H5Aexists(file.get(), "run_id") <= 0) return "";
    return read_string(r, file.get(), "run_id");
  } catch (const Error&) {
    return "";  // unreadable: nobody's, so never this run's to delete or overwrite
  }
}

}  // namespace dpt
