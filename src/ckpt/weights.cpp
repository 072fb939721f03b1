// model.init's sources (weights.hpp): the kind is told by the first bytes, not the name.
#include "dpt/weights.hpp"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "dpt/check.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

namespace dpt {
namespace {

constexpr uint64_t kMaxHeader = uint64_t(100) << 20;  // the format's own limit (100 MB)
constexpr size_t kMaxRank = 8;
constexpr size_t kSealBytes = 512;  // a dptrain checkpoint's header before its HDF5 body
const unsigned char kHdf5Sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while (!(mant & 0x400));
    bits = sign | uint32_t(112 - e) << 23 | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The element size of a dtype this reader takes; 0 for one it does not.
size_t dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64") return 8;
  if (d == "F32" || d == "I32") return 4;
  if (d == "F16" || d == "BF16") return 2;
  return 0;
}

void convert(const std::string& dtype, const unsigned char* p, size_t n, Tensor& t) {
  if (dtype[0] == 'I') {
    t.int64 = true;
    t.ints.resize(n);
    for (size_t i = 0; i < n; ++i) {
      if (dtype == "I64") std::memcpy(&t.ints[i], p + 8 * i, 8);
      else {
        int32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        t.ints[i] = v;
      }
    }
    return;
  }
  t.data.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == "F32") {
      std::memcpy(&t.data[i], p + 4 * i, 4);
    } else if (dtype == "F64") {
      double v;
      std::memcpy(&v, p + 8 * i, 8);
      t.data[i] = float(v);
    } else {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      if (dtype == "F16") {
        t.data[i] = half_to_float(h);
      } else {
        const uint32_t bits = uint32_t(h) << 16;
        std::memcpy(&t.data[i], &bits, 4);
      }
    }
  }
}

// One entry of the header: its dtype, shape and place in the data, checked against the data's size.
Tensor read_entry(const std::string& name, const nlohmann::json& v, const std::string& data, size_t at,
                  const std::string& what) {
  auto fail = [&](const std::string& why) -> void {
    throw InputError(what + ": tensor '" + name + "': " + why);
  };
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
    fail("its header entry needs dtype, shape and data_offsets");
  const auto& dt = v["dtype"];
  const auto& shape = v["shape"];
  const auto& off = v["data_offsets"];
  if (!dt.is_string()) fail("dtype is not a string");
  const std::string dtype = dt.get<std::string>();
  const size_t es = dtype_size(dtype);
  if (es == 0) fail("dtype " + dtype + " is not one dptrain reads (F32, F64, F16, BF16, I64, I32)");
  if (!shape.is_array() || shape.size() > kMaxRank) fail("shape is not a list of at most 8 sizes");
  Tensor t;
  t.name = name;
  uint64_t n = 1;
  for (const auto& d : shape) {
    if (!d.is_number_unsigned()) fail("shape holds something other than a size");
    const uint64_t k = d.get<uint64_t>();
    if (k && n > std::numeric_limits<uint64_t>::max() / k / es) fail("shape is absurd");
    n *= k;
    t.shape.push_back(int64_t(k));
  }
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    fail("data_offsets is not [begin, end]");
  const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
  const uint64_t avail = data.size() - at;
  if (b > e || e > avail)
    fail("data_offsets [" + std::to_string(b) + ", " + std::to_string(e) + "] lie outside the file's " +
         std::to_string(avail) + " bytes of data (truncated?)");
  if (e - b != n * es)
    fail("data_offsets span " + std::to_string(e - b) + " bytes, its shape and dtype " + std::to_string(n * es));
  convert(dtype, reinterpret_cast<const unsigned char*>(data.data() + at + b), size_t(n), t);
  return t;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("model.init " + path + ": cannot open: " + std::strerror(errno));
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw InputError("model.init " + path + ": read error");
  return s;
}

// "model/layer1.0.bn1.weight" -> "layer1.0.bn1.weight"; "model/fc0/weight" -> "fc0.weight".
std::vector<Tensor> as_state_dict(std::vector<Tensor> tensors) {
  for (Tensor& t : tensors) {
    std::string k = t.name.substr(t.name.find('/') + 1);
    for (char& c : k)
      if (c == '/') c = '.';
    t.name = k;
  }
  return tensors;
}

}  // namespace

std::vector<Tensor> parse_safetensors(const std::string& bytes, const std::string& what) {
  if (bytes.size() < 8) throw InputError(what + ": truncated (" + std::to_string(bytes.size()) + " bytes)");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxHeader || n > bytes.size() - 8)
    throw InputError(what + ": its header claims " + std::to_string(n) + " bytes, more than " +
                     (n > kMaxHeader ? "the format allows (100 MB)" : "the file holds (truncated?)"));
  const nlohmann::json h = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + long(n), nullptr, false);
  if (h.is_discarded() || !h.is_object())
    throw InputError(what + ": its header is not a JSON object (damaged, or not a safetensors file)");
  std::vector<Tensor> out;
  for (const auto& [name, v] : h.items()) {
    if (name == "__metadata__") continue;
    out.push_back(read_entry(name, v, bytes, size_t(8 + n), what));
  }
  return out;
}

std::string weights_kind(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError("model.init " + path + ": not found");
  if (!fs::is_regular_file(path, ec)) throw InputError("model.init " + path + ": not a regular file");
  unsigned char head[kSealBytes + 8] = {0};
  size_t got = 0;
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    got = std::fread(head, 1, sizeof head, f);
    std::fclose(f);
  } else {
    throw InputError("model.init " + path + ": cannot open: " + std::strerror(errno));
  }
  if (got >= 8 && std::memcmp(head, kHdf5Sig, 8) == 0) {
    if (!has_model_group(path))
      throw InputError("model.init " + path +
                       ": an HDF5 file with no /model group, so no weights (a dataset? the weights "
                       "file format: docs/formats.md, \"Weights from elsewhere\")");
    return "HDF5 /model group";
  }
  if (got == sizeof head && std::memcmp(head + kSealBytes, kHdf5Sig, 8) == 0) return "dptrain checkpoint";
  if (got > 8 && head[8] == '{') return "safetensors";
  throw InputError("model.init " + path +
                   ": neither a dptrain checkpoint, an HDF5 file nor a .safetensors file (a PyTorch "
                   ".pth/.pt converts with scripts/torch_to_h5.py)");
}

Weights read_weights(const std::string& path) {
  Weights w;
  w.kind = weights_kind(path);
  if (w.kind == "HDF5 /model group") {
    w.tensors = as_state_dict(read_model_group(path));
  } else if (w.kind == "dptrain checkpoint") {
    Checkpoint ck = read_checkpoint(path);
    std::vector<Tensor> model;
    for (Tensor& t : ck.tensors)
      if (t.name.rfind("model/", 0) == 0) model.push_back(std::move(t));
    w.tensors = as_state_dict(std::move(model));
    w.layers = std::move(ck.layers);
    w.model = std::move(ck.model);
    w.input_shape = std::move(ck.input_shape);
  } else {
    w.tensors = parse_safetensors(slurp(path), "model.init " + path);
  }
  if (w.tensors.empty()) throw InputError("model.init " + path + " (" + w.kind + "): holds no tensors");
  return w;
}

}  // namespace dpt
