// The CUDA backend's kernels for convolutional networks: im2col (fp32 or bf16 columns) and its
// gather-form adjoint col2im, max/avg pooling and their gather-form backward, elementwise
// activations, the batched NHWC <-> NCHW transpose of flatten, dropout (the hash of dropout.hpp)
// and augmentation. No GEMM here: convolutions are im2col + the backend's cuBLASLt GEMMs.
// Kernels first, launchers after.
//
// Every backward pass is a gather (each output element summed by one thread, in a fixed order),
// never atomics: the results are deterministic, and the order is the CPU backend's scatter order
// (increasing output pixel), so col2im and pool_backward agree with the CPU bit for bit.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "act.cuh"
#include "conv_kernels.cuh"
#include "device_util.cuh"
#include "dpt/cuda_check.hpp"
#include "dpt/dropout.hpp"

namespace dpt::cuda {
namespace {

constexpr int kThreads = 256;
// Elements per launch: every index inside a kernel fits a non-negative int, so the index
// arithmetic is 32-bit (64-bit division is emulated on the GPU, ~10x the cost).
// (Headroom below 2^31 for the grid-stride loop's last increment.)
constexpr int64_t kMaxChunk = (int64_t(1) << 31) - (int64_t(1) << 24);

// ============================== kernels ==============================

// Eight values (pooling's 8-channel path: 16-byte bf16 loads and stores).
struct Float8 {
  float v[8];
};

template <int V> struct VecF;
template <> struct VecF<1> { using T = float; };
template <> struct VecF<4> { using T = float4; };
template <> struct VecF<8> { using T = Float8; };
__device__ __forceinline__ float& lane(Float8& x, int k) { return x.v[k]; }
__device__ __forceinline__ float lane(const Float8& x, int k) { return x.v[k]; }

__device__ __forceinline__ float& lane(float& v, int) { return v; }
__device__ __forceinline__ float& lane(float4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}
__device__ __forceinline__ float lane(const float& v, int) { return v; }
__device__ __forceinline__ float lane(const float4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

struct alignas(8) Bf16x4 { __nv_bfloat162 lo, hi; };
__device__ __forceinline__ void put(float* p, const float& v) { *p = v; }
__device__ __forceinline__ void put(float4* p, const float4& v) { *p = v; }
__device__ __forceinline__ void put(__nv_bfloat16* p, const float& v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void put(Bf16x4* p, const float4& v) {
  Bf16x4 h;
  h.lo = __floats2bfloat162_rn(v.x, v.y);  // .x at the lower address
  h.hi = __floats2bfloat162_rn(v.z, v.w);
  *p = h;
}

// V consecutive values (V = 1 or 4) of float or bf16 storage, at index i in units of V, as
// float or float4; stored back rounded to the type (bf16: to nearest even).
__device__ __forceinline__ float ldv(const float* p, size_t i, float*) { return p[i]; }
__device__ __forceinline__ float ldv(const __nv_bfloat16* p, size_t i, float*) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float4 ldv(const float* p, size_t i, float4*) { return ld4(p, i); }
__device__ __forceinline__ float4 ldv(const __nv_bfloat16* p, size_t i, float4*) { return ld4(p, i); }
__device__ __forceinline__ Float8 ldv(const float* p, size_t i, Float8*) {
  Float8 r;
  ld8(p, i * 8, r.v);
  return r;
}
__device__ __forceinline__ Float8 ldv(const __nv_bfloat16* p, size_t i, Float8*) {
  Float8 r;
  ld8(p, i * 8, r.v);
  return r;
}
template <class F, class T> __device__ __forceinline__ F ldv(const T* p, size_t i) {
  return ldv(p, i, static_cast<F*>(nullptr));
}
__device__ __forceinline__ void stv(float* p, size_t i, const float& v) { p[i] = v; }
__device__ __forceinline__ void stv(__nv_bfloat16* p, size_t i, const float& v) { p[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void stv(float* p, size_t i, const float4& v) { reinterpret_cast<float4*>(p)[i] = v; }
__device__ __forceinline__ void stv(__nv_bfloat16* p, size_t i, const float4& v) {
  Bf16x4 h;
  h.lo = __floats2bfloat162_rn(v.x, v.y);
  h.hi = __floats2bfloat162_rn(v.z, v.w);
  reinterpret_cast<Bf16x4*>(p)[i] = h;
}

__device__ __forceinline__ void stv(float* p, size_t i, const Float8& v) { st8(p, i * 8, v.v); }
__device__ __forceinline__ void stv(__nv_bfloat16* p, size_t i, const Float8& v) { st8(p, i * 8, v.v); }

template <int V, bool BF16> struct ColT;
template <> struct ColT<1, false> { using T = float; };
template <> struct ColT<4, false> { using T = float4; };
template <> struct ColT<1, true> { using T = __nv_bfloat16; };
template <> struct ColT<4, true> { using T = Bf16x4; };

// One thread per (row, kh, kw, V channels) of rows [row0, row0 + total / (k·k·c/V)): reads of
// consecutive threads are consecutive channels of one input pixel and writes consecutive columns
// of one row, both coalesced. V = 4 needs c % 4 == 0 and 16-byte aligned x (8-byte aligned bf16
// cols, 16-byte fp32 cols).
template <int V, bool BF16>
__global__ void im2col_kernel(const float* __restrict__ x, typename ColT<V, BF16>::T* cols,
                              ConvGeom g, Div cv, Div taps, Div k_n, Div ow_n, Div oh_n, int row0, int total) {
  using F = typename VecF<V>::T;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    int c, j, ow, oh;
    const int t = cv.divmod(i, c);
    const int row = row0 + taps.divmod(t, j);
    const int n = oh_n.divmod(ow_n.divmod(row, ow), oh);
    int kw;
    const int kh = k_n.divmod(j, kw);
    const int ih = oh * g.stride - g.pad + kh, iw = ow * g.stride - g.pad + kw;
    F v{};
    if (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w)
      v = reinterpret_cast<const F*>(x)[((size_t(n) * g.h + ih) * g.w + iw) * size_t(cv.d) + size_t(c)];
    put(cols + (size_t(row0) * size_t(taps.d) * size_t(cv.d) + size_t(i)), v);
  }
}

// A narrow convolution's columns (its c·k·k columns few: a first layer's 1 or 3 channels),
// rows [row0, row0 + total / groups.d) of im2col's matrix into cols (which holds those rows
// alone): each row's c·k·k values in the weight's (kh, kw, c) order, then zeros up to
// groups.d·8 columns, in bf16 (x's floats rounded to nearest even). One thread per 8 columns
// of a row: one 16-byte store, and consecutive threads store consecutive bytes.
template <class TX>
__global__ void narrow_cols_kernel(const TX* __restrict__ x, uint4* __restrict__ cols, ConvGeom g, Div groups,
                                   Div kc, Div cn, Div ow_n, Div oh_n, int width, int row0, int total) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    int grp, ow, oh;
    const int row = row0 + groups.divmod(i, grp);
    const int n = oh_n.divmod(ow_n.divmod(row, ow), oh);
    const int ih0 = oh * g.stride - g.pad, iw0 = ow * g.stride - g.pad;
    // Column j0 = grp·8's (kh, kw, ci), then stepped along: no division per value.
    const int j0 = grp * 8;
    int rem, ci;
    int kh = kc.divmod(j0, rem), kw = cn.divmod(rem, ci);
    __align__(16) __nv_bfloat16 v[8];
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      float f = 0.f;
      const int ih = ih0 + kh, iw = iw0 + kw;
      if (j0 + t < width && ih >= 0 && ih < g.h && iw >= 0 && iw < g.w)
        f = ld(x, ((size_t(n) * g.h + ih) * g.w + iw) * g.c + ci);
      v[t] = __float2bfloat16_rn(f);
      if (++ci == g.c) {
        ci = 0;
        if (++kw == g.k) kw = 0, ++kh;
      }
    }
    cols[i] = *reinterpret_cast<const uint4*>(v);
  }
}

// One thread per (n, ih, iw, V channels) of pixels [pix0, ...): the sum over the (kh, kw) whose
// window covers the element, kh and kw descending so that oh and ow ascend (the CPU's scatter
// order).
template <int V>
__global__ void col2im_kernel(const float* __restrict__ dcols, float* dx, ConvGeom g, Div cv, Div w_n,
                              Div h_n, Div st, int oh_n, int ow_n, int pix0, int total) {
  using F = typename VecF<V>::T;
  const size_t rowlen = size_t(g.k) * g.k * size_t(cv.d);  // a dcols row in F units
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    int c, iw, ih;
    const int pix = pix0 + cv.divmod(i, c);
    const int n = h_n.divmod(w_n.divmod(pix, iw), ih);
    F s{};
    for (int kh = g.k - 1; kh >= 0; --kh) {
      const int yh = ih + g.pad - kh;
      if (yh < 0) continue;
      int rh;
      const int oh = st.divmod(yh, rh);
      if (rh || oh >= oh_n) continue;
      for (int kw = g.k - 1; kw >= 0; --kw) {
        const int yw = iw + g.pad - kw;
        if (yw < 0) continue;
        int rw;
        const int ow = st.divmod(yw, rw);
        if (rw || ow >= ow_n) continue;
        const size_t row = (size_t(n) * oh_n + oh) * ow_n + ow;
        F v = reinterpret_cast<const F*>(dcols)[row * rowlen + size_t(kh * g.k + kw) * size_t(cv.d) + size_t(c)];
#pragma unroll
        for (int q = 0; q < V; ++q) lane(s, q) += lane(v, q);
      }
    }
    reinterpret_cast<F*>(dx)[size_t(pix) * size_t(cv.d) + size_t(c)] = s;
  }
}

// One thread per (n, oh, ow, V channels), window in row-major order. Max keeps the first
// maximum, and a NaN replaces it (PyTorch's `val > maxval || isnan(val)`; a bit test, immune
// to fast math). Avg sums in row-major order, then divides by k² (PyTorch's order), with
// __fdiv_rn: --use_fast_math would otherwise make the division approximate.
__device__ __forceinline__ bool is_nan(float v) {
  return (__float_as_uint(v) & 0x7fffffffu) > 0x7f800000u;
}

// x and y are float or bf16 (under bf16, a convolution's ReLU output kept in bf16 only, and a
// pooled output that only a convolution reads): values are widened on load, so max pooling of
// bf16 values selects among them, the first of equal bf16 values winning.
// PRE (note_relu_pool): x is a convolution's bf16 output before its bias and ReLU; each value is
// made the activation the convolution's epilogue would have stored, bf16(relu(x + bias)), as it
// is read.
template <bool PRE, class F>
__device__ __forceinline__ void pre_act(F& v, const float* bias, int c) {
  if constexpr (PRE) {
    constexpr int V = sizeof(F) / sizeof(float);
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const float e = act_fwd(lane(v, q) + (bias ? bias[c * V + q] : 0.f), Act::relu);
      lane(v, q) = __bfloat162float(__float2bfloat16_rn(e));
    }
  }
}

// The ReLU's backward over the pooling's gradient s at input element e (PRE's backward), as
// relu_bgrad_bf16_kernel runs it: s rounded to bf16 (dx16), times 0 where the activation,
// bf16(relu(z + bias)) from the pre-activation z16, is not > 0.
template <class F>
__device__ __forceinline__ void pre_act_mask(F& s, const __nv_bfloat16* z16, size_t e, const float* bias, int c) {
  constexpr int V = sizeof(F) / sizeof(float);
  F a = ldv<F>(z16, e);
  pre_act<true>(a, bias, c);
#pragma unroll
  for (int q = 0; q < V; ++q) {
    float r = __bfloat162float(__float2bfloat16_rn(lane(s, q)));
    if (!(lane(a, q) > 0.f)) r *= 0.f;
    lane(s, q) = r;
  }
}

// K > 0: the window's size known at compile time (2: the 2x2 pooling of VGG-style networks), so
// the taps' loads are issued together; with g.k read at run time each waited for the one before
// (the compute-bound CNN's 2x2 pooling ran at half the memory bandwidth). The same arithmetic.
template <int V, bool MAX, class TX, class TY, bool PRE = false, int K = 0>
__global__ void pool_fwd_kernel(const TX* __restrict__ x, TY* y, uint8_t* argmax, PoolGeom g, Div cv,
                                Div ow_n, Div oh_n, int pix0, int total, const float* __restrict__ bias = nullptr) {
  using F = typename VecF<V>::T;
  const int k = K > 0 ? K : g.k;
  const float area = float(k * k);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    int c, ow, oh;
    const int pix = pix0 + cv.divmod(i, c);
    const int n = oh_n.divmod(ow_n.divmod(pix, ow), oh);
    F best{};
    int idx[V];
#pragma unroll(K > 0 ? K * K : 1)
    for (int j = 0; j < k * k; ++j) {
      const int kh = j / k, ih = oh * g.stride + kh, iw = ow * g.stride + j - kh * k;  // once per tap
      F v = ldv<F>(x, ((size_t(n) * g.h + ih) * g.w + iw) * size_t(cv.d) + size_t(c));
      pre_act<PRE>(v, bias, c);
#pragma unroll
      for (int q = 0; q < V; ++q) {
        const float e = lane(v, q);
        if (j == 0) {
          lane(best, q) = e;
          idx[q] = 0;
        } else if (MAX) {
          if (e > lane(best, q) || is_nan(e)) {
            lane(best, q) = e;
            idx[q] = j;
          }
        } else {
          lane(best, q) += e;
        }
      }
    }
    if (!MAX) {
#pragma unroll
      for (int q = 0; q < V; ++q) lane(best, q) = __fdiv_rn(lane(best, q), area);
    }
    const size_t o = size_t(pix) * size_t(cv.d) + size_t(c);
    stv(y, o, best);
    if (MAX) store_args<V>(argmax, o * V, idx);
  }
}

// One thread per input element (V consecutive channels of one pixel): the windows that hold it,
// oh then ow ascending (the CPU's scatter order). Max: dy where the window's argmax is this
// element; avg: dy / k². V = 4: 16-byte loads of dy, 4-byte ones of argmax and 16-byte stores
// of dx, the same sums.
// dy and dx are float or bf16 (a convolution's bf16 input gradient kept as it is; an input
// gradient that only a convolution's ReLU backward reads), widened on load and rounded on store.
// PRE (note_relu_pool): then the convolution's ReLU backward as its bf16 path runs it
// (relu_bgrad_bf16_kernel), in the same pass: the gradient rounded to bf16 (dx16), and masked
// (times 0) where the activation, bf16(relu(z + bias)) from the pre-activation z, is not > 0.
template <int V, bool MAX, class TD, class TO, bool PRE = false>
__global__ void pool_bwd_kernel(const TD* __restrict__ dy, const uint8_t* __restrict__ argmax,
                                TO* dx, PoolGeom g, Div c_n, Div w_n, Div h_n, Div st, int oh_n, int ow_n,
                                int pix0, int total, const __nv_bfloat16* __restrict__ z16 = nullptr,
                                const float* __restrict__ bias = nullptr) {
  using F = typename VecF<V>::T;
  const float area = float(g.k * g.k);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    int c, iw, ih;
    const int pix = pix0 + c_n.divmod(i, c);  // c: the group of V channels
    const int n = h_n.divmod(w_n.divmod(pix, iw), ih);
    // Windows oh with oh·s <= ih < oh·s + k.
    const int oh0 = ih < g.k ? 0 : st.div(ih - g.k) + 1, oh1 = min(oh_n - 1, st.div(ih));
    const int ow0 = iw < g.k ? 0 : st.div(iw - g.k) + 1, ow1 = min(ow_n - 1, st.div(iw));
    F s{};
    for (int oh = oh0; oh <= oh1; ++oh)
      for (int ow = ow0; ow <= ow1; ++ow) {
        const size_t o = ((size_t(n) * oh_n + oh) * ow_n + ow) * size_t(c_n.d) + size_t(c);  // in units of V
        const F d = ldv<F>(dy, o);
        if (MAX) {
          int am[V];
          load_args<V>(argmax, o * V, am);
          const int tap = (ih - oh * g.stride) * g.k + (iw - ow * g.stride);
#pragma unroll
          for (int q = 0; q < V; ++q)
            if (am[q] == tap) lane(s, q) += lane(d, q);
        } else {
#pragma unroll
          for (int q = 0; q < V; ++q) lane(s, q) += __fdiv_rn(lane(d, q), area);
        }
      }
    const size_t o = size_t(pix) * size_t(c_n.d) + size_t(c);
    if constexpr (PRE) pre_act_mask(s, z16, o, bias, c);
    stv(dx, o, s);
  }
}

// The same where the windows tile the input exactly (k = stride, h and w multiples of k, no
// padding): one thread per output element (V channels of one pixel) reads dy and argmax once and
// writes its window's k² input elements, each the sum the gather form makes of its one window
// (0 + dy where the argmax is this element, else 0; avg: 0 + dy / k²), and PRE's mask the same
// way. The gather form read each window's dy and argmax once per input element it holds.
template <int V, bool MAX, class TD, class TO, bool PRE>
__global__ void pool_bwd_disjoint_kernel(const TD* __restrict__ dy, const uint8_t* __restrict__ argmax, TO* dx,
                                         PoolGeom g, Div cv, Div ow_n, Div oh_n, int pix0, int total,
                                         const __nv_bfloat16* __restrict__ z16, const float* __restrict__ bias) {
  using F = typename VecF<V>::T;
  const float area = float(g.k * g.k);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    int c, ow, oh;
    const int pix = pix0 + cv.divmod(i, c);
    const int n = oh_n.divmod(ow_n.divmod(pix, ow), oh);
    const size_t o = size_t(pix) * size_t(cv.d) + size_t(c);
    const F d = ldv<F>(dy, o);
    int am[V];
    if constexpr (MAX) load_args<V>(argmax, o * V, am);
    for (int j = 0; j < g.k * g.k; ++j) {
      const int kh = j / g.k, ih = oh * g.stride + kh, iw = ow * g.stride + j - kh * g.k;
      const size_t e = ((size_t(n) * g.h + ih) * g.w + iw) * size_t(cv.d) + size_t(c);
      F s{};
#pragma unroll
      for (int q = 0; q < V; ++q) {
        if (MAX) lane(s, q) = am[q] == j ? 0.f + lane(d, q) : 0.f;
        else lane(s, q) = 0.f + __fdiv_rn(lane(d, q), area);
      }
      if constexpr (PRE) pre_act_mask(s, z16, e, bias, c);
      stv(dx, e, s);
    }
  }
}

__global__ void act_fwd_kernel(const float* z, float* a, size_t n, Act act) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    a[i] = act_fwd(z[i], act);
}

__global__ void act_bwd_kernel(float* da, const float* z, const float* a, size_t n, Act act) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    da[i] *= act_grad(z ? z[i] : 0.f, a ? a[i] : 0.f, act);
}

// A transpose's store: as it is, or a float rounded to bf16 (to_bf16's rounding).
template <class TO, class T> __device__ __forceinline__ TO stored(T v) {
  if constexpr (std::is_same_v<TO, __nv_bfloat16> && std::is_same_v<T, float>) return __float2bfloat16_rn(v);
  else return v;
}

// Per sample (blockIdx.z, grid-strided), dst (cols, rows) = src (rows, cols)ᵀ in 32×32 tiles
// through shared memory (one padding column against bank conflicts): both sides coalesced.
template <class T, class TO = T>
__global__ void batched_transpose_kernel(const T* __restrict__ src, TO* __restrict__ dst, int batch, int rows,
                                         int cols) {
  __shared__ T tile[32][33];
  const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  const size_t per = size_t(rows) * cols;
  for (int b = blockIdx.z; b < batch; b += gridDim.z) {
    const T* s = src + b * per;
    TO* d = dst + b * per;
    for (int j = threadIdx.y; j < 32; j += 8) {
      const int r = r0 + j, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[j][threadIdx.x] = s[size_t(r) * cols + c];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += 8) {
      const int c = c0 + j, r = r0 + threadIdx.x;
      if (r < rows && c < cols) d[size_t(c) * rows + r] = stored<TO>(tile[threadIdx.x][j]);
    }
    __syncthreads();
  }
}

// The same for at most kSmallRows rows (an image's few channels to NHWC, or a flatten after the
// global pool): one thread per column, reading each row's value (coalesced across the warp) and
// writing its rows contiguously. The tiled kernel would leave most of each 32×32 tile empty.
constexpr int kSmallRows = 4;
template <class TO>
__global__ void small_rows_transpose_kernel(const float* __restrict__ src, TO* __restrict__ dst, int rows,
                                            int64_t cols, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / cols, c = i - b * cols;
    const float* s = src + size_t(b) * size_t(rows) * size_t(cols) + size_t(c);
    TO* d = dst + size_t(i) * size_t(rows);
    for (int r = 0; r < rows; ++r) d[r] = stored<TO>(s[size_t(r) * size_t(cols)]);
  }
}

// One thread per element in memory order (NHWC) of samples [n0, ...); the mask's element index
// is the NCHW one.
__global__ void dropout_kernel(const float* x, float* y, DropoutArgs d, Div per, Div c_n, uint32_t thr,
                               float scale, const StepCtl* ctl, int n0, int total) {
  const int64_t step = ctl ? ctl->step : 0;
  const int hw = d.h * d.w;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    int m, ch;
    const int n = n0 + per.divmod(i, m);
    const int p = c_n.divmod(m, ch);
    const uint64_t key = dropout_key(d.seed, d.layer, step, d.first + int64_t(n));
    const size_t at = size_t(n) * size_t(per.d) + size_t(m);
    y[at] = x[at] * (dropout_keep(key, int64_t(ch) * hw + p, thr) ? scale : 0.f);
  }
}

// One thread per output element (n, c, y, x) of NCHW images [n0, ...): the draw's crop window,
// flipped.
__global__ void augment_kernel(const float* __restrict__ x, float* __restrict__ out, Div per, Div w_n,
                               Div h_n, int pad, const int32_t* draws, const StepCtl* ctl, int64_t offset,
                               int n0, int total) {
  const int64_t first = (ctl ? ctl->cursor : 0) + offset;
  const int h = h_n.d, w = w_n.d;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    int m, xx, yy;
    const int n = n0 + per.divmod(i, m);
    const int ch = h_n.divmod(w_n.divmod(m, xx), yy);
    const int32_t dr = draws[first + int64_t(n)];
    const bool flip = (dr & 1) != 0;
    const int sy = yy + ((dr >> 1) & 0xFF) - pad, sx = (flip ? w - 1 - xx : xx) + ((dr >> 9) & 0xFF) - pad;
    const size_t base = size_t(n) * size_t(per.d);
    out[base + size_t(m)] =
        sy >= 0 && sy < h && sx >= 0 && sx < w ? x[base + (size_t(ch) * h + sy) * w + sx] : 0.f;
  }
}

// ============================== launchers ==============================

unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(std::max<size_t>(1, std::min<size_t>(blocks, 132 * 32)));
}

bool aligned(const void* q, size_t bytes) {
  return q == nullptr || reinterpret_cast<uintptr_t>(q) % bytes == 0;
}

// Calls launch(first, count, elements) for consecutive groups of `units` units (rows, pixels,
// samples) of `per` elements each, every group under kMaxChunk elements.
template <class F> void in_chunks(int64_t units, int64_t per, F launch) {
  if (units <= 0 || per <= 0) return;
  if (per > kMaxChunk) throw Error("conv kernels: " + std::to_string(per) + " elements per unit exceed 2^31 - 1");
  const int64_t step = std::max<int64_t>(1, kMaxChunk / per);
  for (int64_t u = 0; u < units; u += step) {
    const int64_t count = std::min(step, units - u);
    launch(int(u), int(count * per));
  }
}

}  // namespace

void im2col(const float* x, const ConvGeom& g, void* cols, bool bf16_out, cudaStream_t s) {
  const bool v4 = g.c % 4 == 0 && aligned(x, 16) && aligned(cols, bf16_out ? 8 : 16);
  const int V = v4 ? 4 : 1;
  const Div cv(g.c / V), taps(g.k * g.k), k_n(g.k), ow_n(g.ow()), oh_n(g.oh());
  in_chunks(g.rows(), int64_t(g.k) * g.k * (g.c / V), [&](int row0, int total) {
    const unsigned grid = grid_for(size_t(total));
    if (bf16_out) {
      if (v4) im2col_kernel<4, true><<<grid, kThreads, 0, s>>>(x, static_cast<Bf16x4*>(cols), g, cv, taps, k_n, ow_n, oh_n, row0, total);
      else im2col_kernel<1, true><<<grid, kThreads, 0, s>>>(x, static_cast<__nv_bfloat16*>(cols), g, cv, taps, k_n, ow_n, oh_n, row0, total);
    } else {
      if (v4) im2col_kernel<4, false><<<grid, kThreads, 0, s>>>(x, static_cast<float4*>(cols), g, cv, taps, k_n, ow_n, oh_n, row0, total);
      else im2col_kernel<1, false><<<grid, kThreads, 0, s>>>(x, static_cast<float*>(cols), g, cv, taps, k_n, ow_n, oh_n, row0, total);
    }
    DPT_CHECK_LAUNCH("im2col_kernel");
  });
}

void narrow_cols(const void* x, bool x_bf16, const ConvGeom& g, int row0, int rows, int width_padded, void* cols,
                 cudaStream_t s) {
  const int groups = width_padded / 8;
  if (rows <= 0) return;
  if (width_padded % 8 || width_padded < g.cols() || !aligned(cols, 16))
    throw Error("narrow_cols: columns padded to " + std::to_string(width_padded) + " for " + std::to_string(g.cols()) +
                " (a multiple of 8 at least as many, 16-byte aligned)");
  const Div gd(groups), kc(g.k * g.c), cn(g.c), ow_n(g.ow()), oh_n(g.oh());
  in_chunks(rows, groups, [&](int r0, int total) {
    auto* out = static_cast<uint4*>(cols) + size_t(r0) * size_t(groups);
    if (x_bf16)
      narrow_cols_kernel<<<grid_for(size_t(total)), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(x), out, g,
                                                                        gd, kc, cn, ow_n, oh_n, g.cols(), row0 + r0, total);
    else
      narrow_cols_kernel<<<grid_for(size_t(total)), kThreads, 0, s>>>(static_cast<const float*>(x), out, g, gd, kc,
                                                                        cn, ow_n, oh_n, g.cols(), row0 + r0, total);
    DPT_CHECK_LAUNCH("narrow_cols_kernel");
  });
}

void col2im(const float* dcols, const ConvGeom& g, float* dx, cudaStream_t s) {
  const bool v4 = g.c % 4 == 0 && aligned(dcols, 16) && aligned(dx, 16);
  const int V = v4 ? 4 : 1;
  const Div cv(g.c / V), w_n(g.w), h_n(g.h), st(g.stride);
  in_chunks(int64_t(g.batch) * g.h * g.w, g.c / V, [&](int pix0, int total) {
    if (v4) col2im_kernel<4><<<grid_for(size_t(total)), kThreads, 0, s>>>(dcols, dx, g, cv, w_n, h_n, st, g.oh(), g.ow(), pix0, total);
    else col2im_kernel<1><<<grid_for(size_t(total)), kThreads, 0, s>>>(dcols, dx, g, cv, w_n, h_n, st, g.oh(), g.ow(), pix0, total);
    DPT_CHECK_LAUNCH("col2im_kernel");
  });
}

namespace {
// Channels per thread of a pooling pass: 8 where c allows and every operand is aligned for 16-byte
// bf16 (32-byte float) accesses, else 4 (8- or 16-byte), else 1.
int pool_width(int c, std::initializer_list<std::pair<const void*, size_t>> operands) {
  for (int v : {8, 4}) {
    if (c % v != 0) continue;
    bool ok = true;
    for (const auto& [p, elem] : operands) ok = ok && aligned(p, size_t(v) * elem);
    if (ok) return v;
  }
  return 1;
}

// f(std::integral_constant<int, V>) for a pool_width result.
template <class F> void with_width(int V, F&& f) {
  if (V == 8) f(std::integral_constant<int, 8>{});
  else if (V == 4) f(std::integral_constant<int, 4>{});
  else f(std::integral_constant<int, 1>{});
}

template <bool PRE, class TX, class TY>
void pool_fwd_launch(const TX* x, TY* y, uint8_t* argmax, const PoolGeom& g, bool max, int V, const float* bias,
                     cudaStream_t s) {
  const Div cv(g.c / V), ow_n(g.ow()), oh_n(g.oh());
  auto go = [&](auto w) {
    constexpr int W = decltype(w)::value;
    in_chunks(int64_t(g.batch) * g.oh() * g.ow(), g.c / W, [&](int pix0, int total) {
      const unsigned grid = grid_for(size_t(total));
      if (max && g.k == 2) pool_fwd_kernel<W, true, TX, TY, PRE, 2><<<grid, kThreads, 0, s>>>(x, y, argmax, g, cv, ow_n, oh_n, pix0, total, bias);
      else if (max) pool_fwd_kernel<W, true, TX, TY, PRE><<<grid, kThreads, 0, s>>>(x, y, argmax, g, cv, ow_n, oh_n, pix0, total, bias);
      else pool_fwd_kernel<W, false, TX, TY, PRE><<<grid, kThreads, 0, s>>>(x, y, nullptr, g, cv, ow_n, oh_n, pix0, total, bias);
      DPT_CHECK_LAUNCH("pool_fwd_kernel");
    });
  };
  with_width(V, go);
}

// Windows that tile the input exactly: pool_bwd_disjoint_kernel.
bool disjoint(const PoolGeom& g) { return g.pad == 0 && g.k == g.stride && g.h % g.k == 0 && g.w % g.k == 0; }

template <bool PRE, class TD, class TO>
void pool_bwd_launch(const TD* dy, const uint8_t* argmax, TO* dx, const PoolGeom& g, bool max, int Vw,
                     const __nv_bfloat16* z16, const float* bias, cudaStream_t s) {
  if (disjoint(g)) {
    const Div cv(g.c / Vw), ow_n(g.ow()), oh_n(g.oh());
    auto go = [&](auto w) {
      constexpr int W = decltype(w)::value;
      in_chunks(int64_t(g.batch) * g.oh() * g.ow(), g.c / W, [&](int pix0, int total) {
        const unsigned grid = grid_for(size_t(total));
        if (max) pool_bwd_disjoint_kernel<W, true, TD, TO, PRE><<<grid, kThreads, 0, s>>>(dy, argmax, dx, g, cv, ow_n, oh_n, pix0, total, z16, bias);
        else pool_bwd_disjoint_kernel<W, false, TD, TO, PRE><<<grid, kThreads, 0, s>>>(dy, argmax, dx, g, cv, ow_n, oh_n, pix0, total, z16, bias);
        DPT_CHECK_LAUNCH("pool_bwd_disjoint_kernel");
      });
    };
    with_width(Vw, go);
    return;
  }
  const bool v4 = Vw >= 4;
  const int V = v4 ? 4 : 1;
  const Div c_n(g.c / V), w_n(g.w), h_n(g.h), st(g.stride);
  in_chunks(int64_t(g.batch) * g.h * g.w, g.c / V, [&](int pix0, int total) {
    const unsigned grid = grid_for(size_t(total));
    const int oh = g.oh(), ow = g.ow();
    if (max && v4) pool_bwd_kernel<4, true, TD, TO, PRE><<<grid, kThreads, 0, s>>>(dy, argmax, dx, g, c_n, w_n, h_n, st, oh, ow, pix0, total, z16, bias);
    else if (max) pool_bwd_kernel<1, true, TD, TO, PRE><<<grid, kThreads, 0, s>>>(dy, argmax, dx, g, c_n, w_n, h_n, st, oh, ow, pix0, total, z16, bias);
    else if (v4) pool_bwd_kernel<4, false, TD, TO, PRE><<<grid, kThreads, 0, s>>>(dy, nullptr, dx, g, c_n, w_n, h_n, st, oh, ow, pix0, total, z16, bias);
    else pool_bwd_kernel<1, false, TD, TO, PRE><<<grid, kThreads, 0, s>>>(dy, nullptr, dx, g, c_n, w_n, h_n, st, oh, ow, pix0, total, z16, bias);
    DPT_CHECK_LAUNCH("pool_bwd_kernel");
  });
}

// f(typed pointer) for a float or bf16 operand.
template <class P, class F> void typed_ptr(P p, bool bf16, F&& f) {
  using B = std::conditional_t<std::is_const_v<std::remove_pointer_t<P>>, const __nv_bfloat16*, __nv_bfloat16*>;
  using Fl = std::conditional_t<std::is_const_v<std::remove_pointer_t<P>>, const float*, float*>;
  if (bf16) f(static_cast<B>(p));
  else f(static_cast<Fl>(p));
}
}  // namespace

void pool_forward(const void* x, bool x_bf16, void* y, bool y_bf16, uint8_t* argmax, const PoolGeom& g, bool max,
                  cudaStream_t s) {
  const int V = pool_width(g.c, {{x, x_bf16 ? 2 : 4}, {y, y_bf16 ? 2 : 4}, {argmax, 1}});
  typed_ptr(x, x_bf16, [&](auto xp) {
    typed_ptr(y, y_bf16, [&](auto yp) { pool_fwd_launch<false>(xp, yp, argmax, g, max, V, nullptr, s); });
  });
}

void pool_forward_relu(const void* z16, const float* bias, void* y, bool y_bf16, uint8_t* argmax, const PoolGeom& g,
                       cudaStream_t s) {
  const int V = pool_width(g.c, {{z16, 2}, {y, y_bf16 ? 2 : 4}, {argmax, 1}, {bias, 4}});
  const auto* zp = static_cast<const __nv_bfloat16*>(z16);
  typed_ptr(y, y_bf16, [&](auto yp) { pool_fwd_launch<true>(zp, yp, argmax, g, true, V, bias, s); });
}

void pool_backward(const void* dy, bool dy_bf16, const uint8_t* argmax, void* dx, bool dx_bf16, const PoolGeom& g,
                   bool max, cudaStream_t s) {
  const int V = pool_width(g.c, {{dy, dy_bf16 ? 2 : 4}, {dx, dx_bf16 ? 2 : 4}, {argmax, 1}});
  typed_ptr(dy, dy_bf16, [&](auto dp) {
    typed_ptr(dx, dx_bf16, [&](auto op) { pool_bwd_launch<false>(dp, argmax, op, g, max, V, nullptr, nullptr, s); });
  });
}

void pool_backward_relu(const void* dy, bool dy_bf16, const uint8_t* argmax, const void* z16, const float* bias,
                        void* dx16, const PoolGeom& g, cudaStream_t s) {
  const int V = pool_width(g.c, {{dy, dy_bf16 ? 2 : 4}, {dx16, 2}, {z16, 2}, {argmax, 1}, {bias, 4}});
  const auto* zp = static_cast<const __nv_bfloat16*>(z16);
  auto* op = static_cast<__nv_bfloat16*>(dx16);
  typed_ptr(dy, dy_bf16, [&](auto dp) { pool_bwd_launch<true>(dp, argmax, op, g, true, V, zp, bias, s); });
}

void act_forward(const float* z, float* a, size_t n, Act act, cudaStream_t s) {
  if (n == 0 || (act == Act::none && a == z)) return;
  act_fwd_kernel<<<grid_for(n), kThreads, 0, s>>>(z, a, n, act);
  DPT_CHECK_LAUNCH("act_fwd_kernel");
}

void act_backward(float* da, const float* z, const float* a, size_t n, Act act, cudaStream_t s) {
  if (n == 0 || act == Act::none) return;
  act_bwd_kernel<<<grid_for(n), kThreads, 0, s>>>(da, z, a, n, act);
  DPT_CHECK_LAUNCH("act_bwd_kernel");
}

namespace {
// batched_transpose_kernel over the whole (rows, cols) of every sample.
template <class T, class TO>
void tiled_transpose(const T* src, TO* dst, int batch, int rows, int cols, cudaStream_t s) {
  const dim3 grid(unsigned((cols + 31) / 32), unsigned((rows + 31) / 32), unsigned(std::min(batch, 65535)));
  batched_transpose_kernel<T, TO><<<grid, dim3(32, 8), 0, s>>>(src, dst, batch, rows, cols);
  DPT_CHECK_LAUNCH("batched_transpose_kernel");
}

template <class TO>
void float_transpose(const float* src, TO* dst, int batch, int rows, int cols, cudaStream_t s) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return;
  if (rows <= kSmallRows) {
    const int64_t total = int64_t(batch) * cols;
    small_rows_transpose_kernel<TO><<<grid_for(size_t(total)), kThreads, 0, s>>>(src, dst, rows, cols, total);
    DPT_CHECK_LAUNCH("small_rows_transpose_kernel");
    return;
  }
  tiled_transpose(src, dst, batch, rows, cols, s);
}
}  // namespace

void batched_transpose(const float* src, float* dst, int batch, int rows, int cols, cudaStream_t s) {
  float_transpose(src, dst, batch, rows, cols, s);
}

void batched_transpose_to_bf16(const float* src, void* dst, int batch, int rows, int cols, cudaStream_t s) {
  float_transpose(src, static_cast<__nv_bfloat16*>(dst), batch, rows, cols, s);
}

void batched_transpose_bf16(const void* src, void* dst, int batch, int rows, int cols, cudaStream_t s) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return;
  tiled_transpose(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), batch, rows, cols, s);
}

void dropout(const float* x, float* y, int batch, const DropoutArgs& d, const StepCtl* ctl, cudaStream_t s) {
  const int64_t per = int64_t(d.c) * d.h * d.w;
  const Div per_n{int(per)}, c_n{d.c};
  const uint32_t thr = dropout_threshold(d.p);
  const float scale = float(1.0 / (1.0 - d.p));
  in_chunks(batch, per, [&](int n0, int total) {
    dropout_kernel<<<grid_for(size_t(total)), kThreads, 0, s>>>(x, y, d, per_n, c_n, thr, scale, ctl, n0, total);
    DPT_CHECK_LAUNCH("dropout_kernel");
  });
}

void augment(const float* x, float* y, int batch, int c, int h, int w, int pad,
             const int32_t* draws, const StepCtl* ctl, int64_t offset, cudaStream_t s) {
  const int64_t per = int64_t(c) * h * w;
  const Div per_n{int(per)}, w_n{w}, h_n{h};
  in_chunks(batch, per, [&](int n0, int total) {
    augment_kernel<<<grid_for(size_t(total)), kThreads, 0, s>>>(x, y, per_n, w_n, h_n, pad, draws, ctl, offset, n0, total);
    DPT_CHECK_LAUNCH("augment_kernel");
  });
}

}  // namespace dpt::cuda
