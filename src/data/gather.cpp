// Dataset::gather, the training hot path on the host: rows converted from their stored type to
// float (value = raw × scale + offset) into a batch.
#include <cstring>
#include <string>

#include "dpt/check.hpp"
#include "dpt/data.hpp"

namespace dpt {

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
