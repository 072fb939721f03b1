// What the standalone CUDA benchmarks (bench-lt-epilogues, bench-cudnn-fusion) share: a check
// that exits on a CUDA error, device buffers, and copies of host floats as bf16 or fp32 operands
// (bf16 rounded to nearest even by the project's bf16_bits).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "dpt/backend.hpp"

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

namespace bench {

struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t b) : bytes(std::max<size_t>(b, 256)) { CK(cudaMalloc(&p, bytes)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void poison() { CK(cudaMemset(p, 0xff, bytes)); }  // every bf16 and fp32 element a NaN
};

// Operands of the precision's type (bf16 or fp32), from host floats.
inline void upload(Dev& d, const std::vector<float>& v, bool bf16) {
  if (bf16) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = dpt::bf16_bits(v[i]);
    CK(cudaMemcpy(d.p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  } else {
    CK(cudaMemcpy(d.p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  }
}
inline std::vector<float> download(const Dev& d, size_t n, bool bf16) {
  std::vector<float> v(n);
  if (bf16) {
    std::vector<uint16_t> h(n);
    CK(cudaMemcpy(h.data(), d.p, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) v[i] = dpt::bf16_value(h[i]);
  } else {
    CK(cudaMemcpy(v.data(), d.p, n * 4, cudaMemcpyDeviceToHost));
  }
  return v;
}

}  // namespace bench
