// The few element-wise passes around cuDNN's convolutions (cudnn_conv.cpp) that the other kernel
// files do not have.
#include <cuda_bf16.h>

#include <algorithm>

#include "dpt/cuda_check.hpp"

namespace dpt::cuda {
namespace {

__global__ void widen_bf16_kernel(const __nv_bfloat16* src, float* dst, size_t n, bool accumulate) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = __bfloat162float(src[i]);
    dst[i] = accumulate ? dst[i] + v : v;
  }
}

}  // namespace

void widen_bf16(const void* src, float* dst, size_t n, bool accumulate, cudaStream_t s) {
  if (n == 0) return;
  const unsigned blocks = unsigned(std::min<size_t>((n + 255) / 256, size_t(65535) * 8));
  widen_bf16_kernel<<<blocks, 256, 0, s>>>(static_cast<const __nv_bfloat16*>(src), dst, n, accumulate);
  DPT_CHECK_LAUNCH("widen_bf16");
}

}  // namespace dpt::cuda
