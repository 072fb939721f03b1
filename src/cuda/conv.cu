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

#include "act.cuh"
#include "conv_kernels.cuh"
#include "dpt/cuda_check.hpp"
#include "dpt/dropout.hpp"

namespace dpt::cuda {
namespace {

constexpr int kThreads = 256;

// ============================== kernels ==============================

template <int V> struct VecF;
template <> struct VecF<1> { using T = float; };
template <> struct VecF<4> { using T = float4; };

__device__ __forceinline__ float& lane(float& v, int) { return v; }
__device__ __forceinline__ float& lane(float4& v, int k) {
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

template <int V, bool BF16> struct ColT;
template <> struct ColT<1, false> { using T = float; };
template <> struct ColT<4, false> { using T = float4; };
template <> struct ColT<1, true> { using T = __nv_bfloat16; };
template <> struct ColT<4, true> { using T = Bf16x4; };

// One thread per (row, kh, kw, V channels): reads of consecutive threads are consecutive channels
// of one input pixel and writes consecutive columns of one row, both coalesced. V = 4 needs
// c % 4 == 0 and 16-byte aligned x (8-byte aligned bf16 cols, 16-byte fp32 cols).
template <int V, bool BF16>
__global__ void im2col_kernel(const float* __restrict__ x, typename ColT<V, BF16>::T* cols,
                              ConvGeom g, int oh_n, int ow_n, size_t total) {
  using F = typename VecF<V>::T;
  const int cv = g.c / V, kk = g.k * g.k;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const int c = int(i % cv);
    const size_t t = i / cv;
    const int j = int(t % kk);
    const size_t row = t / kk;
    const int ow = int(row % ow_n);
    const size_t r2 = row / ow_n;
    const int oh = int(r2 % oh_n);
    const int n = int(r2 / oh_n);
    const int ih = oh * g.stride - g.pad + j / g.k, iw = ow * g.stride - g.pad + j % g.k;
    F v{};
    if (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w)
      v = reinterpret_cast<const F*>(x)[((size_t(n) * g.h + ih) * g.w + iw) * cv + c];
    put(cols + i, v);
  }
}

// One thread per (n, ih, iw, V channels): the sum over the (kh, kw) whose window covers the
// element, kh and kw descending so that oh and ow ascend (the CPU's scatter order).
template <int V>
__global__ void col2im_kernel(const float* __restrict__ dcols, float* dx, ConvGeom g, int oh_n,
                              int ow_n, size_t total) {
  using F = typename VecF<V>::T;
  const int cv = g.c / V;
  const size_t rowlen = size_t(g.k) * g.k * cv;  // a dcols row in F units
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const int c = int(i % cv);
    const size_t t = i / cv;
    const int iw = int(t % g.w);
    const size_t t2 = t / g.w;
    const int ih = int(t2 % g.h);
    const int n = int(t2 / g.h);
    F s{};
    for (int kh = g.k - 1; kh >= 0; --kh) {
      const int yh = ih + g.pad - kh;
      if (yh < 0 || yh % g.stride) continue;
      const int oh = yh / g.stride;
      if (oh >= oh_n) continue;
      for (int kw = g.k - 1; kw >= 0; --kw) {
        const int yw = iw + g.pad - kw;
        if (yw < 0 || yw % g.stride) continue;
        const int ow = yw / g.stride;
        if (ow >= ow_n) continue;
        const size_t row = (size_t(n) * oh_n + oh) * ow_n + ow;
        F v = reinterpret_cast<const F*>(dcols)[row * rowlen + size_t(kh * g.k + kw) * cv + c];
#pragma unroll
        for (int q = 0; q < V; ++q) lane(s, q) += lane(v, q);
      }
    }
    reinterpret_cast<F*>(dx)[i] = s;
  }
}

// One thread per (n, oh, ow, V channels), window in row-major order. Max keeps the first
// maximum, and a NaN replaces it (PyTorch's `val > maxval || isnan(val)`; a bit test, immune
// to fast math). Avg sums in row-major order, then divides by k² (PyTorch's order), with
// __fdiv_rn: --use_fast_math would otherwise make the division approximate.
__device__ __forceinline__ bool is_nan(float v) {
  return (__float_as_uint(v) & 0x7fffffffu) > 0x7f800000u;
}

template <int V, bool MAX>
__global__ void pool_fwd_kernel(const float* __restrict__ x, float* y, int32_t* argmax, PoolGeom g,
                                int oh_n, int ow_n, size_t total) {
  using F = typename VecF<V>::T;
  const int cv = g.c / V;
  const float area = float(g.k * g.k);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const int c = int(i % cv);
    const size_t t = i / cv;
    const int ow = int(t % ow_n);
    const size_t t2 = t / ow_n;
    const int oh = int(t2 % oh_n);
    const int n = int(t2 / oh_n);
    F best{};
    int idx[V];
    for (int j = 0; j < g.k * g.k; ++j) {
      const int ih = oh * g.stride + j / g.k, iw = ow * g.stride + j % g.k;
      F v = reinterpret_cast<const F*>(x)[((size_t(n) * g.h + ih) * g.w + iw) * cv + c];
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
    reinterpret_cast<F*>(y)[i] = best;
    if (MAX) {
#pragma unroll
      for (int q = 0; q < V; ++q) argmax[i * V + q] = idx[q];
    }
  }
}

// One thread per input element: the windows that hold it, oh then ow ascending (the CPU's
// scatter order). Max: dy where the window's argmax is this element; avg: dy / k².
template <bool MAX>
__global__ void pool_bwd_kernel(const float* __restrict__ dy, const int32_t* __restrict__ argmax,
                                float* dx, PoolGeom g, int oh_n, int ow_n, size_t total) {
  const float area = float(g.k * g.k);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const int c = int(i % g.c);
    const size_t t = i / g.c;
    const int iw = int(t % g.w);
    const size_t t2 = t / g.w;
    const int ih = int(t2 % g.h);
    const int n = int(t2 / g.h);
    // Windows oh with oh·s <= ih < oh·s + k.
    const int oh0 = ih < g.k ? 0 : (ih - g.k) / g.stride + 1, oh1 = min(oh_n - 1, ih / g.stride);
    const int ow0 = iw < g.k ? 0 : (iw - g.k) / g.stride + 1, ow1 = min(ow_n - 1, iw / g.stride);
    float s = 0.f;
    for (int oh = oh0; oh <= oh1; ++oh)
      for (int ow = ow0; ow <= ow1; ++ow) {
        const size_t o = ((size_t(n) * oh_n + oh) * ow_n + ow) * g.c + c;
        if (MAX) {
          if (argmax[o] == (ih - oh * g.stride) * g.k + (iw - ow * g.stride)) s += dy[o];
        } else {
          s += __fdiv_rn(dy[o], area);
        }
      }
    dx[i] = s;
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

// Per sample (blockIdx.z, grid-strided), dst (cols, rows) = src (rows, cols)ᵀ in 32×32 tiles
// through shared memory (one padding column against bank conflicts): both sides coalesced.
__global__ void batched_transpose_kernel(const float* __restrict__ src, float* __restrict__ dst,
                                         int batch, int rows, int cols) {
  __shared__ float tile[32][33];
  const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  const size_t per = size_t(rows) * cols;
  for (int b = blockIdx.z; b < batch; b += gridDim.z) {
    const float* s = src + b * per;
    float* d = dst + b * per;
    for (int j = threadIdx.y; j < 32; j += 8) {
      const int r = r0 + j, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[j][threadIdx.x] = s[size_t(r) * cols + c];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += 8) {
      const int c = c0 + j, r = r0 + threadIdx.x;
      if (r < rows && c < cols) d[size_t(c) * rows + r] = tile[threadIdx.x][j];
    }
    __syncthreads();
  }
}

// One thread per element in memory order (NHWC); the mask's element index is the NCHW one.
__global__ void dropout_kernel(const float* x, float* y, int batch, DropoutArgs d, uint32_t thr,
                               float scale, const StepCtl* ctl) {
  const int64_t step = ctl ? ctl->step : 0;
  const int hw = d.h * d.w;
  const size_t per = size_t(d.c) * hw, total = per * size_t(batch);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t n = i / per, m = i % per;
    const int ch = int(m % d.c), p = int(m / d.c);
    const uint64_t key = dropout_key(d.seed, d.layer, step, d.first + int64_t(n));
    y[i] = x[i] * (dropout_keep(key, int64_t(ch) * hw + p, thr) ? scale : 0.f);
  }
}

// One thread per output element (n, c, y, x) of NCHW images: the draw's crop window, flipped.
__global__ void augment_kernel(const float* __restrict__ x, float* __restrict__ out, int batch,
                               int c, int h, int w, int pad, const int32_t* draws,
                               const StepCtl* ctl, int64_t offset) {
  const int64_t first = (ctl ? ctl->cursor : 0) + offset;
  const size_t per = size_t(c) * h * w, total = per * size_t(batch);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t n = i / per, m = i % per;
    const int xx = int(m % w), yy = int(m / w % h), ch = int(m / (size_t(w) * h));
    const int32_t dr = draws[first + int64_t(n)];
    const bool flip = (dr & 1) != 0;
    const int sy = yy + ((dr >> 1) & 0xFF) - pad, sx = (flip ? w - 1 - xx : xx) + ((dr >> 9) & 0xFF) - pad;
    out[i] = sy >= 0 && sy < h && sx >= 0 && sx < w ? x[n * per + (size_t(ch) * h + sy) * w + sx] : 0.f;
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

}  // namespace

void im2col(const float* x, const ConvGeom& g, void* cols, bool bf16_out, cudaStream_t s) {
  const int oh = g.oh(), ow = g.ow();
  const size_t elems = size_t(g.rows()) * size_t(g.cols());
  if (elems == 0) return;
  const bool v4 = g.c % 4 == 0 && aligned(x, 16) && aligned(cols, bf16_out ? 8 : 16);
  const size_t total = elems / (v4 ? 4 : 1);
  const unsigned grid = grid_for(total);
  if (bf16_out) {
    if (v4) im2col_kernel<4, true><<<grid, kThreads, 0, s>>>(x, static_cast<Bf16x4*>(cols), g, oh, ow, total);
    else im2col_kernel<1, true><<<grid, kThreads, 0, s>>>(x, static_cast<__nv_bfloat16*>(cols), g, oh, ow, total);
  } else {
    if (v4) im2col_kernel<4, false><<<grid, kThreads, 0, s>>>(x, static_cast<float4*>(cols), g, oh, ow, total);
    else im2col_kernel<1, false><<<grid, kThreads, 0, s>>>(x, static_cast<float*>(cols), g, oh, ow, total);
  }
  DPT_CHECK_LAUNCH("im2col_kernel");
}

void col2im(const float* dcols, const ConvGeom& g, float* dx, cudaStream_t s) {
  const size_t elems = size_t(g.batch) * g.h * g.w * g.c;
  if (elems == 0) return;
  const bool v4 = g.c % 4 == 0 && aligned(dcols, 16) && aligned(dx, 16);
  const size_t total = elems / (v4 ? 4 : 1);
  if (v4) col2im_kernel<4><<<grid_for(total), kThreads, 0, s>>>(dcols, dx, g, g.oh(), g.ow(), total);
  else col2im_kernel<1><<<grid_for(total), kThreads, 0, s>>>(dcols, dx, g, g.oh(), g.ow(), total);
  DPT_CHECK_LAUNCH("col2im_kernel");
}

void pool_forward(const float* x, float* y, int32_t* argmax, const PoolGeom& g, bool max, cudaStream_t s) {
  const size_t elems = size_t(g.batch) * g.oh() * g.ow() * g.c;
  if (elems == 0) return;
  const bool v4 = g.c % 4 == 0 && aligned(x, 16) && aligned(y, 16);
  const size_t total = elems / (v4 ? 4 : 1);
  const unsigned grid = grid_for(total);
  if (max && v4) pool_fwd_kernel<4, true><<<grid, kThreads, 0, s>>>(x, y, argmax, g, g.oh(), g.ow(), total);
  else if (max) pool_fwd_kernel<1, true><<<grid, kThreads, 0, s>>>(x, y, argmax, g, g.oh(), g.ow(), total);
  else if (v4) pool_fwd_kernel<4, false><<<grid, kThreads, 0, s>>>(x, y, nullptr, g, g.oh(), g.ow(), total);
  else pool_fwd_kernel<1, false><<<grid, kThreads, 0, s>>>(x, y, nullptr, g, g.oh(), g.ow(), total);
  DPT_CHECK_LAUNCH("pool_fwd_kernel");
}

void pool_backward(const float* dy, const int32_t* argmax, float* dx, const PoolGeom& g, bool max,
                   cudaStream_t s) {
  const size_t total = size_t(g.batch) * g.h * g.w * g.c;
  if (total == 0) return;
  if (max) pool_bwd_kernel<true><<<grid_for(total), kThreads, 0, s>>>(dy, argmax, dx, g, g.oh(), g.ow(), total);
  else pool_bwd_kernel<false><<<grid_for(total), kThreads, 0, s>>>(dy, nullptr, dx, g, g.oh(), g.ow(), total);
  DPT_CHECK_LAUNCH("pool_bwd_kernel");
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

void batched_transpose(const float* src, float* dst, int batch, int rows, int cols, cudaStream_t s) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return;
  const dim3 grid(unsigned((cols + 31) / 32), unsigned((rows + 31) / 32), unsigned(std::min(batch, 65535)));
  batched_transpose_kernel<<<grid, dim3(32, 8), 0, s>>>(src, dst, batch, rows, cols);
  DPT_CHECK_LAUNCH("batched_transpose_kernel");
}

void dropout(const float* x, float* y, int batch, const DropoutArgs& d, const StepCtl* ctl, cudaStream_t s) {
  const size_t total = size_t(batch) * d.c * d.h * d.w;
  if (total == 0) return;
  dropout_kernel<<<grid_for(total), kThreads, 0, s>>>(x, y, batch, d, dropout_threshold(d.p),
                                                      float(1.0 / (1.0 - d.p)), ctl);
  DPT_CHECK_LAUNCH("dropout_kernel");
}

void augment(const float* x, float* y, int batch, int c, int h, int w, int pad,
             const int32_t* draws, const StepCtl* ctl, int64_t offset, cudaStream_t s) {
  const size_t total = size_t(batch) * c * h * w;
  if (total == 0) return;
  augment_kernel<<<grid_for(total), kThreads, 0, s>>>(x, y, batch, c, h, w, pad, draws, ctl, offset);
  DPT_CHECK_LAUNCH("augment_kernel");
}

}  // namespace dpt::cuda
