// Device helpers shared by the CUDA backend's kernel files (conv.cu, norm.cu, bn.cu, kernels.cu,
// cudnn_kernels.cu).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dpt::cuda {

// Division by a divisor fixed for the launch, as a multiply-high and a shift (Granlund and
// Montgomery; the form CUTLASS's FastDivmod uses): exact for 0 <= n < 2^31, d >= 1. Splitting an
// element index into coordinates with it costs less than a hardware-emulated integer division,
// which would cost more than the memory-bound kernels' loads.
struct Div {
  int d = 1;
  unsigned mul = 0, shr = 0;
  Div() = default;
  explicit Div(int divisor) : d(divisor) {
    if (d == 1) return;
    int l = 0;  // ceil(log2 d)
    while ((1ll << l) < d) ++l;
    const unsigned p = 31u + unsigned(l);
    mul = unsigned(((1ull << p) + unsigned(d) - 1) / unsigned(d));
    shr = p - 32u;
  }
  __device__ __forceinline__ int div(int n) const { return d == 1 ? n : int(__umulhi(unsigned(n), mul) >> shr); }
  // n = q·d + r: q returned, r out.
  __device__ __forceinline__ int divmod(int n, int& r) const {
    const int q = div(n);
    r = n - q * d;
    return q;
  }
};

// Element i of float or bf16 storage, as a float; a float stored to it (bf16: rounded to nearest
// even).
__device__ __forceinline__ float ld(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16* p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float* p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16* p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// Four consecutive values, index i of the float4 view (16 bytes of floats, 8 of bf16 aligned).
__device__ __forceinline__ float4 ld4(const float* p, size_t i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ __forceinline__ float4 ld4(const __nv_bfloat16* p, size_t i) {
  const uint2 u = reinterpret_cast<const uint2*>(p)[i];
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return {a.x, a.y, b.x, b.y};
}

// Eight consecutive values from element i (16-byte aligned), widened to float on load and
// rounded to the type on store.
__device__ __forceinline__ void ld8(const float* p, size_t i, float (&v)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p + i), b = *reinterpret_cast<const float4*>(p + i + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void ld8(const __nv_bfloat16* p, size_t i, float (&v)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p + i);
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&u);
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(h[k]);
    v[2 * k] = f.x, v[2 * k + 1] = f.y;
  }
}
__device__ __forceinline__ void st8(float* p, size_t i, const float (&v)[8]) {
  *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4*>(p + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void st8(__nv_bfloat16* p, size_t i, const float (&v)[8]) {
  uint4 u;
  auto* h = reinterpret_cast<__nv_bfloat162*>(&u);
  for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
  *reinterpret_cast<uint4*>(p + i) = u;
}

// The losses' totals, one block of THREADS threads: stats[0] += Σ row_loss, stats[1] += Σ row_ok,
// strided per-thread sums then a tree in shared memory, the same order every call. T is the
// per-row loss's type (float for the plain loss, double for the label-smoothed one).
template <class T, int THREADS>
__global__ void loss_totals(const T* __restrict__ row_loss, const int* __restrict__ row_ok, int batch,
                            float* __restrict__ stats) {
  __shared__ T sl[THREADS];
  __shared__ int sc[THREADS];
  T l = 0;
  int c = 0;
  for (int i = threadIdx.x; i < batch; i += THREADS) { l += row_loss[i]; c += row_ok[i]; }
  sl[threadIdx.x] = l;
  sc[threadIdx.x] = c;
  __syncthreads();
  for (int h = THREADS / 2; h > 0; h /= 2) {
    if (threadIdx.x < h) { sl[threadIdx.x] += sl[threadIdx.x + h]; sc[threadIdx.x] += sc[threadIdx.x + h]; }
    __syncthreads();
  }
  if (threadIdx.x == 0) { stats[0] += float(sl[0]); stats[1] += float(sc[0]); }
}

// A max pooling's argmax, a byte per value (the window's tap kh·k + kw; k ≤ 15, so 255 is no
// tap and stands for none): V consecutive ones from element i, a multiple of V, in one access
// where V is 4 or 8 (i·1 byte aligned to V).
template <int V> __device__ __forceinline__ void load_args(const uint8_t* p, size_t i, int (&v)[V]) {
  if constexpr (V == 8) {
    const uint2 u = *reinterpret_cast<const uint2*>(p + i);
    for (int k = 0; k < 4; ++k) v[k] = int((u.x >> (8 * k)) & 0xffu), v[k + 4] = int((u.y >> (8 * k)) & 0xffu);
  } else if constexpr (V == 4) {
    const uint32_t u = *reinterpret_cast<const uint32_t*>(p + i);
    for (int k = 0; k < 4; ++k) v[k] = int((u >> (8 * k)) & 0xffu);
  } else {
    for (int k = 0; k < V; ++k) v[k] = p[i + k];
  }
}
template <int V> __device__ __forceinline__ void store_args(uint8_t* p, size_t i, const int (&v)[V]) {
  auto byte = [](int x) { return uint32_t(x) & 0xffu; };
  if constexpr (V == 8) {
    uint2 u{0u, 0u};
    for (int k = 0; k < 4; ++k) u.x |= byte(v[k]) << (8 * k), u.y |= byte(v[k + 4]) << (8 * k);
    *reinterpret_cast<uint2*>(p + i) = u;
  } else if constexpr (V == 4) {
    uint32_t u = 0;
    for (int k = 0; k < 4; ++k) u |= byte(v[k]) << (8 * k);
    *reinterpret_cast<uint32_t*>(p + i) = u;
  } else {
    for (int k = 0; k < V; ++k) p[i + k] = uint8_t(byte(v[k]));
  }
}

}  // namespace dpt::cuda
