// The few element-wise passes around cuDNN's convolutions (cudnn_conv.cpp) that the other kernel
// files do not have.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "act.cuh"
#include "device_util.cuh"
#include "dpt/cuda_check.hpp"

namespace dpt::cuda {
namespace {

__global__ void widen_bf16_kernel(const __nv_bfloat16* src, float* dst, size_t n, bool accumulate) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = __bfloat162float(src[i]);
    dst[i] = accumulate ? dst[i] + v : v;
  }
}

// The same, eight values per thread (16-byte loads and stores): the scalar kernel ran the
// weight gradients' widening at under 1 TB/s on the H200.
__global__ void widen_bf16_x8_kernel(const __nv_bfloat16* src, float* dst, size_t groups, bool accumulate) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < groups; i += size_t(gridDim.x) * blockDim.x) {
    float v[8];
    ld8(src, i * 8, v);
    if (accumulate) {
      float d[8];
      ld8(dst, i * 8, d);
      for (int k = 0; k < 8; ++k) v[k] = d[k] + v[k];
    }
    st8(dst, i * 8, v);
  }
}

// V values from element e (device_util.cuh's ld8 / st8 for eight, ld / st for one).
template <class T, int V> __device__ __forceinline__ void load(const T* p, size_t e, float (&v)[V]) {
  if constexpr (V == 8) ld8(p, e, v);
  else v[0] = ld(p, e);
}
template <class T, int V> __device__ __forceinline__ void store(T* p, size_t e, const float (&v)[V]) {
  if constexpr (V == 8) st8(p, e, v);
  else st(p, e, v[0]);
}

// v = float(y16) + b[channel]: z = v, a = act(v), a16 = bf16(a), each unless nullptr. NHWC: the
// channel is the index mod c. V values per thread: V = 8 where c % 8 == 0 and the operands are
// 16-byte aligned (one 16-byte load of y16, the bias's eight channels), else 1.
template <int V>
__global__ void conv_epilogue_bf16_kernel(const __nv_bfloat16* y16, const float* b, float* z, float* a,
                                          __nv_bfloat16* a16, size_t groups, unsigned cg, Act act) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < groups; i += size_t(gridDim.x) * blockDim.x) {
    const size_t e = i * V;
    const unsigned c0 = unsigned(i % cg) * V;
    float v[V];
    load(y16, e, v);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] += b ? b[c0 + k] : 0.f;
    if (z) store(z, e, v);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = act_fwd(v[k], act);
    if (a) store(a, e, v);
    if (a16) store(a16, e, v);
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

void conv_epilogue_bf16(const void* y16, const float* b, float* z, float* a, void* a16, size_t rows, int c,
                        Act act, cudaStream_t s) {
  const size_t n = rows * size_t(c);
  if (n == 0) return;
  auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const auto* y = static_cast<const __nv_bfloat16*>(y16);
  auto* o16 = static_cast<__nv_bfloat16*>(a16);
  if (c % 8 == 0 && al(y16) && al(z) && al(a) && al(a16))
    conv_epilogue_bf16_kernel<8><<<grid_for(n / 8), 256, 0, s>>>(y, b, z, a, o16, n / 8, unsigned(c / 8), act);
  else
    conv_epilogue_bf16_kernel<1><<<grid_for(n), 256, 0, s>>>(y, b, z, a, o16, n, unsigned(c), act);
  DPT_CHECK_LAUNCH("conv_epilogue_bf16");
}

void act_forward_twin(const float* z, float* a, void* a16, size_t n, Act act, cudaStream_t s) {
  if (n == 0) return;
  act_forward_twin_kernel<<<grid_for(n), 256, 0, s>>>(z, a, static_cast<__nv_bfloat16*>(a16), n, act);
  DPT_CHECK_LAUNCH("act_forward_twin");
}

void widen_bf16(const void* src, float* dst, size_t n, bool accumulate, cudaStream_t s) {
  if (n == 0) return;
  const auto* p = static_cast<const __nv_bfloat16*>(src);
  size_t done = 0;
  if (reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0 && n >= 8) {
    widen_bf16_x8_kernel<<<grid_for(n / 8), 256, 0, s>>>(p, dst, n / 8, accumulate);
    DPT_CHECK_LAUNCH("widen_bf16_x8");
    done = n / 8 * 8;
  }
  if (done < n) {
    widen_bf16_kernel<<<grid_for(n - done), 256, 0, s>>>(p + done, dst + done, n - done, accumulate);
    DPT_CHECK_LAUNCH("widen_bf16");
  }
}

namespace {

// dst (rows, cp) bf16: src's (rows, c) values (bf16, or floats rounded to nearest even) in the
// first c columns, zeros in the rest. One thread per output value.
template <class T>
__global__ void pad_channels_kernel(const T* src, __nv_bfloat16* dst, size_t rows, int c, int cp) {
  const size_t n = rows * size_t(cp);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t r = i / size_t(cp);
    const int j = int(i - r * size_t(cp));
    __nv_bfloat16 v = __float2bfloat16_rn(0.f);
    if (j < c) {
      if constexpr (std::is_same_v<T, float>) v = __float2bfloat16_rn(src[r * size_t(c) + size_t(j)]);
      else v = src[r * size_t(c) + size_t(j)];
    }
    dst[i] = v;
  }
}

// dst (rows, c) fp32 = (accumulate ? dst : 0) + the first c columns of src (rows, cp) bf16.
__global__ void unpad_widen_kernel(const __nv_bfloat16* src, float* dst, size_t rows, int c, int cp,
                                   bool accumulate) {
  const size_t n = rows * size_t(c);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t r = i / size_t(c);
    const int j = int(i - r * size_t(c));
    const float v = __bfloat162float(src[r * size_t(cp) + size_t(j)]);
    dst[i] = accumulate ? dst[i] + v : v;
  }
}

}  // namespace

void pad_channels_bf16(const void* src, bool src_bf16, void* dst, size_t rows, int c, int cp, cudaStream_t s) {
  const size_t n = rows * size_t(cp);
  if (n == 0) return;
  auto* d = static_cast<__nv_bfloat16*>(dst);
  if (src_bf16)
    pad_channels_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<const __nv_bfloat16*>(src), d, rows, c, cp);
  else
    pad_channels_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<const float*>(src), d, rows, c, cp);
  DPT_CHECK_LAUNCH("pad_channels");
}

void unpad_widen_bf16(const void* src, float* dst, size_t rows, int c, int cp, bool accumulate, cudaStream_t s) {
  const size_t n = rows * size_t(c);
  if (n == 0) return;
  unpad_widen_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<const __nv_bfloat16*>(src), dst, rows, c, cp,
                                                 accumulate);
  DPT_CHECK_LAUNCH("unpad_widen");
}

}  // namespace dpt::cuda
