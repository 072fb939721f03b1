// A training file's identity: what it holds and a checksum of rows spread over it, so that a
// checkpoint knows what it was trained on wherever the file was copied to (a path alone does not:
// staging to node-local disk moves it, and a new file can take an old one's name). And whether
// two class lists give each label the same meaning.
#include <zlib.h>

#include <algorithm>
#include <cstdio>

#include "dpt/check.hpp"
#include "dpt/data.hpp"

namespace dpt {

namespace {
constexpr int64_t kSampledRows = 64;

template <class T> uLong crc_of(uLong crc, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const Bytef*>(v.data());
  size_t left = v.size() * sizeof(T);
  while (left > 0) {  // crc32 takes a uInt length
    const uInt n = uInt(std::min<size_t>(left, 1u << 30));
    crc = crc32(crc, p, n);
    p += n;
    left -= n;
  }
  return crc;
}
}  // namespace

std::string data_identity(const std::string& path) {
  const DatasetInfo info = probe_dataset(path);
  // The first and last rows and 62 between them, evenly spaced (every row of a smaller file).
  std::vector<int64_t> rows;
  const int64_t k = std::min(kSampledRows, info.n);
  for (int64_t i = 0; i < k; ++i) rows.push_back(k > 1 ? i * (info.n - 1) / (k - 1) : 0);
  const Dataset d = load_rows(path, rows);
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc_of(crc, d.labels);
  crc = d.is_u8 ? crc_of(crc, d.u8) : crc_of(crc, d.f32);
  std::string shape;
  for (size_t i = 0; i < info.sample_shape.size(); ++i) shape += (i ? "x" : "") + std::to_string(info.sample_shape[i]);
  char buf[256];
  std::snprintf(buf, sizeof buf, "%lld rows of %s %s, %d classes, scale %g offset %g, crc32 %08lx of %lld rows",
                static_cast<long long>(info.n), shape.c_str(), info.feature_type.c_str(), info.num_classes,
                double(info.scale), double(info.offset), static_cast<unsigned long>(crc),
                static_cast<long long>(k));
  return buf;
}

void check_same_classes(const std::string& a_name, const std::vector<std::string>& a, const std::string& b_name,
                        const std::vector<std::string>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] == b[i]) continue;
    throw InputError(b_name + " names class " + std::to_string(i) + " '" + b[i] + "', " + a_name + " names it '" +
                     a[i] + "': the two number their classes differently, so a label means one class in one and "
                     "another in the other. Import both from one class list (dpdata images --val-folder DIR or "
                     "--val-fraction F keeps the training folder's classes)");
  }
}

}  // namespace dpt
