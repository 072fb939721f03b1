// The few element-wise passes around cuDNN's convolutions (cudnn_conv.cpp) that the other kernel
// files do not have.
#include <cuda_bf16.h>

#include <algorithm>

#include "act.cuh"
#include "dpt/cuda_check.hpp"

namespace dpt::cuda {
namespace {

__global__ void widen_bf16_kernel(const __nv_bfloat16* src, float* dst, size_t n, bool accumulate) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = __bfloat162float(src[i]);
    dst[i] = accumulate ? dst[i] + v : v;
  }
}

// z = float(y16) + b[channel], a = act(z); a may be z. NHWC: the channel is the index mod c.
__global__ void conv_epilogue_bf16_kernel(const __nv_bfloat16* y16, const float* b, float* z, float* a, size_t n,
                                          unsigned c, Act act) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = __bfloat162float(y16[i]) + (b ? b[i % c] : 0.f);
    if (a != z) z[i] = v;
    a[i] = act_fwd(v, act);
  }
}

__global__ void act_forward_twin_kernel(const float* z, float* a, __nv_bfloat16* a16, size_t n, Act act) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = act_fwd(z[i], act);
    a[i] = v;
    a16[i] = __float2bfloat16_rn(v);
  }
}

unsigned grid_for(size_t n) { return unsigned(std::min<size_t>((n + 255) / 256, size_t(65535) * 8)); }

}  // namespace

void conv_epilogue_bf16(const void* y16, const float* b, float* z, float* a, size_t rows, int c, Act act,
                        cudaStream_t s) {
  const size_t n = rows * size_t(c);
  if (n == 0) return;
  conv_epilogue_bf16_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<const __nv_bfloat16*>(y16), b, z, a, n,
                                                         unsigned(c), act);
  DPT_CHECK_LAUNCH("conv_epilogue_bf16");
}

void act_forward_twin(const float* z, float* a, void* a16, size_t n, Act act, cudaStream_t s) {
  if (n == 0) return;
  act_forward_twin_kernel<<<grid_for(n), 256, 0, s>>>(z, a, static_cast<__nv_bfloat16*>(a16), n, act);
  DPT_CHECK_LAUNCH("act_forward_twin");
}

void widen_bf16(const void* src, float* dst, size_t n, bool accumulate, cudaStream_t s) {
  if (n == 0) return;
  const unsigned blocks = unsigned(std::min<size_t>((n + 255) / 256, size_t(65535) * 8));
  widen_bf16_kernel<<<blocks, 256, 0, s>>>(static_cast<const __nv_bfloat16*>(src), dst, n, accumulate);
  DPT_CHECK_LAUNCH("widen_bf16");
}

}  // namespace dpt::cuda
