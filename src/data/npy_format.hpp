// A NumPy .npy file opened and its header parsed (npy_format.cpp); what its array may hold for
// dptrain is npy_import.cpp's business. Private to src/data/.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace dpt::data_internal {

// The header's 'descr' string, e.g. '<f4': byte order ('<' little, '>' big, '|' not applicable,
// '=' native), kind ('f' float, 'i' int, 'u' uint, 'b' bool, 'O' object, ...) and item size.
struct NpyType {
  std::string descr;
  char order = '|', kind = '?';
  int size = 0;
  std::string name() const;  // numpy's name: "float32", "uint8", "object", ...
};

struct NpyHeader {
  std::string version;  // "1.0", "2.0" or "3.0"
  NpyType type;
  bool fortran = false;
  std::vector<uint64_t> shape;
  uint64_t data_offset = 0;  // where the array's bytes begin
  uint64_t file_size = 0;
};

// Opens path and parses its header; `where` ("features file 'x.npy'") starts every message.
// Leaves the file positioned at the array's bytes.
class NpyFile {
 public:
  NpyFile(const std::string& path, const std::string& where);
  const NpyHeader& header() const { return header_; }
  // Reads exactly len bytes or throws (truncated file, read error).
  void read(void* buf, uint64_t len);

 private:
  struct Close {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Close> f_;
  std::string where_;
  NpyHeader header_;
};

}  // namespace dpt::data_internal
