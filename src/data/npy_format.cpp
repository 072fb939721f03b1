// The NumPy .npy format (numpy.lib.format), read without numpy: the magic "\x93NUMPY", a major
// and a minor version byte, the header's length (2 bytes little-endian in version 1.0, 4 bytes in
// 2.0 and 3.0), the header itself — a Python dict literal such as
// {'descr': '<f4', 'fortran_order': False, 'shape': (60000, 784), } padded with spaces and ended
// by '\n' (latin-1 text; UTF-8 in 3.0) — then the array's bytes. Every way a file can break it
// ends in InputError naming the file and what is wrong.
#include "npy_format.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "dpt/check.hpp"

namespace dpt::data_internal {
namespace {

// ---------------------------------------------------------------- the header's dict literal

struct PyValue {
  enum Kind { kStr, kBool, kInt, kSeq, kNone } kind = kNone;
  std::string str;
  bool flag = false;
  uint64_t num = 0;
  bool list = false;  // kSeq: [...] rather than (...)
  std::vector<PyValue> items;
};

// The literals numpy writes in a header (strings, True/False/None, non-negative integers with
// Python 2's optional 'L', tuples and lists), read as ast.literal_eval would read them.
class Literal {
 public:
  Literal(const std::string& text, const std::string& where) : s_(text), where_(where) {}

  std::vector<std::pair<std::string, PyValue>> dict() {
    std::vector<std::pair<std::string, PyValue>> out;
    expect('{');
    for (;;) {
      if (peek() == '}') break;
      PyValue key = value(0);
      if (key.kind != PyValue::kStr) fail("a key that is not a string");
      expect(':');
      out.emplace_back(key.str, value(0));
      if (peek() == ',') ++i_;
      else if (peek() != '}') fail("no ',' or '}' after a value");
    }
    ++i_;
    if (peek() != '\0') fail("text after the closing '}'");
    return out;
  }

 private:
  const std::string& s_;
  std::string where_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    std::string shown = s_.substr(0, 200);
    for (char& c : shown)
      if (static_cast<unsigned char>(c) < 32 || static_cast<unsigned char>(c) > 126) c = '?';
    throw InputError(where_ + ": the header is not a dict as numpy writes it (" + what + " at character " +
                     std::to_string(i_) + "): " + shown + (s_.size() > 200 ? "..." : ""));
  }
  char peek() {  // the next character that is not white space, or '\0' at the end
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
    return i_ < s_.size() ? s_[i_] : '\0';
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }

  PyValue value(int depth) {
    if (depth > 8) fail("nesting deeper than 8");
    const char c = peek();
    if (c == '\'' || c == '"') return string(c);
    if (c >= '0' && c <= '9') return number();
    if (c == '(' || c == '[') return sequence(c == '(' ? ')' : ']', depth);
    if (c == '-') fail("a negative number");
    return word();
  }
  PyValue string(char quote) {
    PyValue v;
    v.kind = PyValue::kStr;
    for (++i_; i_ < s_.size() && s_[i_] != quote; ++i_) {
      if (s_[i_] == '\\' && i_ + 1 < s_.size()) ++i_;
      v.str += s_[i_];
    }
    if (i_ >= s_.size()) fail("an unterminated string");
    ++i_;
    return v;
  }
  PyValue number() {
    PyValue v;
    v.kind = PyValue::kInt;
    for (; i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9'; ++i_)
      if (__builtin_mul_overflow(v.num, uint64_t(10), &v.num) ||
          __builtin_add_overflow(v.num, uint64_t(s_[i_] - '0'), &v.num))
        fail("a number beyond 64 bits");
    if (i_ < s_.size() && s_[i_] == 'L') ++i_;
    return v;
  }
  PyValue sequence(char close, int depth) {
    PyValue v;
    v.kind = PyValue::kSeq;
    v.list = close == ']';
    for (++i_; peek() != close;) {
      v.items.push_back(value(depth + 1));
      if (peek() == ',') ++i_;
      else if (peek() != close) fail(std::string("no ',' or '") + close + "' in a sequence");
    }
    ++i_;
    return v;
  }
  PyValue word() {
    const size_t start = i_;
    while (i_ < s_.size() && std::isalpha(static_cast<unsigned char>(s_[i_]))) ++i_;
    const std::string w = s_.substr(start, i_ - start);
    PyValue v;
    if (w == "True" || w == "False") v.kind = PyValue::kBool, v.flag = w == "True";
    else if (w == "None") v.kind = PyValue::kNone;
    else i_ = start, fail("an unexpected character");
    return v;
  }
};

// ---------------------------------------------------------------- the header's meaning

NpyType parse_descr(const std::string& d) {
  NpyType t;
  t.descr = d;
  size_t i = 0;
  if (i < d.size() && std::strchr("<>|=", d[i])) t.order = d[i++];
  if (i < d.size()) t.kind = d[i++];
  while (i < d.size() && d[i] >= '0' && d[i] <= '9' && t.size < (1 << 20)) t.size = t.size * 10 + (d[i++] - '0');
  return t;
}

void interpret(const std::vector<std::pair<std::string, PyValue>>& dict, const std::string& where, NpyHeader& h) {
  bool descr = false, fortran = false, shape = false;
  for (const auto& [key, v] : dict) {
    if (key == "descr") {
      if (v.kind == PyValue::kSeq)
        throw InputError(where + ": holds a structured (record) array, whose 'descr' is a list of fields; save each "
                                 "field as a plain numeric array of its own");
      if (v.kind != PyValue::kStr) throw InputError(where + ": the header's 'descr' is not a string");
      h.type = parse_descr(v.str), descr = true;
    } else if (key == "fortran_order") {
      if (v.kind != PyValue::kBool) throw InputError(where + ": the header's 'fortran_order' is not True or False");
      h.fortran = v.flag, fortran = true;
    } else if (key == "shape") {
      if (v.kind != PyValue::kSeq) throw InputError(where + ": the header's 'shape' is not a tuple");
      h.shape.clear();
      for (const PyValue& d : v.items) {
        if (d.kind != PyValue::kInt) throw InputError(where + ": the header's 'shape' holds something not an integer");
        h.shape.push_back(d.num);
      }
      shape = true;
    } else {
      throw InputError(where + ": the header has the key '" + key + "'; numpy writes only 'descr', 'fortran_order' "
                               "and 'shape'");
    }
  }
  for (auto [have, name] : {std::pair{descr, "descr"}, {fortran, "fortran_order"}, {shape, "shape"}})
    if (!have) throw InputError(where + ": the header has no '" + std::string(name) + "' key");
}

// What the first bytes say when they are not a .npy file's.
[[noreturn]] void not_npy(const std::string& where, const unsigned char* b, size_t n) {
  if (n >= 4 && std::memcmp(b, "PK\x03\x04", 4) == 0)
    throw InputError(where + ": is a .npz archive (np.savez), not a .npy file: save one array of it with "
                             "np.save(\"x.npy\", np.load(\"file.npz\")[\"name\"])");
  if (n >= 8 && std::memcmp(b, "\x89HDF\r\n\x1a\n", 8) == 0)
    throw InputError(where + ": is an HDF5 file, not a .npy file (an HDF5 dataset file trains as it is: "
                             "dpdata validate checks it)");
  throw InputError(where + ": is not a .npy file (it does not begin with \"\\x93NUMPY\"; write it with np.save)");
}

}  // namespace

void NpyFile::read(void* buf, uint64_t len) {
  auto* p = static_cast<unsigned char*>(buf);
  while (len > 0) {
    const size_t piece = size_t(std::min<uint64_t>(len, uint64_t(1) << 26));
    const size_t got = std::fread(p, 1, piece, f_.get());
    if (got != piece)
      throw InputError(where_ + ": " + (std::ferror(f_.get()) ? "read error: " + std::string(std::strerror(errno))
                                                              : std::string("ends early (truncated?)")));
    p += got;
    len -= got;
  }
}

NpyFile::NpyFile(const std::string& path, const std::string& where) : where_(where) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) throw InputError(where + ": cannot open: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw InputError(where + ": not a regular file");
  f_.reset(std::fopen(path.c_str(), "rb"));
  if (!f_) throw InputError(where + ": cannot open: " + std::strerror(errno));
  const uint64_t size = uint64_t(st.st_size);
  unsigned char b[12] = {};
  const size_t n = size_t(std::min<uint64_t>(size, sizeof b));
  read(b, n);
  if (n < 6 || std::memcmp(b, "\x93NUMPY", 6) != 0) not_npy(where, b, n);
  if (n < 10) throw InputError(where + ": ends inside the header (truncated)");
  const int major = b[6], minor = b[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    throw InputError(where + ": .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                     " is not one dpdata reads (1.0, 2.0, 3.0)");
  const uint64_t prefix = major == 1 ? 10 : 12;
  if (size < prefix) throw InputError(where + ": ends inside the header (truncated)");
  const uint64_t hlen = major == 1 ? uint64_t(b[8]) | uint64_t(b[9]) << 8
                                   : uint64_t(b[8]) | uint64_t(b[9]) << 8 | uint64_t(b[10]) << 16 | uint64_t(b[11]) << 24;
  if (prefix + hlen > size)
    throw InputError(where + ": the header claims " + std::to_string(hlen) + " bytes but the file holds " +
                     std::to_string(size - prefix) + " after the prefix (truncated?)");
  if (hlen > (uint64_t(1) << 20))
    throw InputError(where + ": a header of " + std::to_string(hlen) + " bytes is beyond any plain array's");
  std::string text(size_t(hlen), '\0');
  if (std::fseek(f_.get(), long(prefix), SEEK_SET) != 0) throw InputError(where + ": cannot seek");
  read(text.data(), hlen);
  interpret(Literal(text, where).dict(), where, header_);
  header_.version = std::to_string(major) + ".0";
  header_.data_offset = prefix + hlen;
  header_.file_size = size;
}

std::string NpyType::name() const {
  const std::string bits = std::to_string(size * 8);
  switch (kind) {
    case 'f': return "float" + bits;
    case 'i': return "int" + bits;
    case 'u': return "uint" + bits;
    case 'c': return "complex" + bits;
    case 'b': return "bool";
    case 'U': return "str";
    case 'S': return "bytes";
    case 'O': return "object";
    case 'M': return "datetime64";
    case 'm': return "timedelta64";
    default: return "raw bytes";
  }
}

}  // namespace dpt::data_internal
