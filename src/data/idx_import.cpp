// Import of Fashion-MNIST / MNIST idx files (gzip or plain): headers checked, data grown as it
// arrives, labels checked against the ten classes.
#include "internal.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "dpt/check.hpp"

namespace dpt {
using namespace data_internal;

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

}  // namespace dpt
