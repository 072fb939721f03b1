// The CUDA backend's own kernels: elementwise (fill, scale, bias + activation and its
// derivative, bf16 conversion), reductions (bias gradient, softmax cross-entropy, finiteness),
// the fused optimizer update and the dataset row gather. Kernels first, launchers after.
//
// The build compiles CUDA with --use_fast_math. Where that would cost accuracy against the CPU
// backend we avoid the affected intrinsic: tanhf becomes tanh.approx (relative error ~5e-4), so
// tanh is computed from expm1f; the gather uses __fmul_rn/__fadd_rn so that it rounds exactly
// like the host's raw × scale + offset.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "act.cuh"
#include "device_util.cuh"
#include "dpt/cuda_check.hpp"
#include "kernels.cuh"

namespace dpt::cuda {
namespace {

constexpr int kThreads = 256;

// ============================== kernels ==============================

// Elementwise kernels take a float4 path (16-byte accesses) when the pointer is 16-byte aligned;
// the launcher runs the n % 4 tail (or a misaligned pointer) through the scalar loop.
__global__ void fill_kernel(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

__global__ void fill4_kernel(float4* p, size_t n4, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = make_float4(v, v, v, v);
}

__global__ void scale_kernel(float* p, size_t n, float a) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] *= a;
}

__global__ void scale4_kernel(float4* p, size_t n4, float a) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4;
       i += size_t(gridDim.x) * blockDim.x) {
    float4 v = p[i];
    v.x *= a; v.y *= a; v.z *= a; v.w *= a;
    p[i] = v;
  }
}

// Forward epilogue over z (batch,out) row-major: z += b; a = act(z); a16 = bf16(a) when a16 is
// set (the next GEMMs' operand, so that they need no conversion pass). Block (tx, ty): tx threads
// over the row's V-vectors, ty rows; rows grid-strided over gridDim.y. V = 4 needs out % 4 == 0
// and z, a 16-byte aligned, a16 8-byte aligned (the launcher checks). No integer division.
template <int V> struct Vec;
template <> struct Vec<1> { using F = float; using H = __nv_bfloat16; };
template <> struct Vec<4> { using F = float4; struct alignas(8) H { __nv_bfloat162 lo, hi; }; };

__device__ __forceinline__ float& at(float& v, int) { return v; }
__device__ __forceinline__ float& at(float4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}
__device__ __forceinline__ void store_bf16(__nv_bfloat16* p, const float& v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_bf16(Vec<4>::H* p, const float4& v) {
  Vec<4>::H h;
  h.lo = __floats2bfloat162_rn(v.x, v.y);  // .x is the lower address
  h.hi = __floats2bfloat162_rn(v.z, v.w);
  *p = h;
}

template <int V, Act A>
__global__ void bias_act_kernel(float* z, float* a, const float* __restrict__ b, void* a16,
                                int batch, int out) {
  using F = typename Vec<V>::F;
  using H = typename Vec<V>::H;
  const int vcols = out / V;
  const int vc = blockIdx.x * blockDim.x + threadIdx.x;
  if (vc >= vcols) return;
  F bias;
#pragma unroll
  for (int k = 0; k < V; ++k) at(bias, k) = b ? b[vc * V + k] : 0.f;
  for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < batch; r += gridDim.y * blockDim.y) {
    const size_t i = size_t(r) * vcols + vc;
    F v = reinterpret_cast<const F*>(z)[i];
    F o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      at(v, k) += at(bias, k);
      at(o, k) = act_fwd(at(v, k), A);
    }
    if (b) reinterpret_cast<F*>(z)[i] = v;
    if (A != Act::none || a != z) reinterpret_cast<F*>(a)[i] = o;
    if (a16) store_bf16(static_cast<H*>(a16) + i, o);
  }
}

// The end of a column-sum block (32, 8) over 32·V columns: each thread's V row-group sums s go
// through shared memory `part`, and the 8 row groups are added in a fixed order into
// partial[blockIdx.y][column]. 256 threads finish (32·V)/256 columns each (V = 4: t < 128).
template <int V>
__device__ __forceinline__ void column_partials(const float (&s)[V], float (*part)[32 * V + 1],
                                                float* partial, int out) {
#pragma unroll
  for (int k = 0; k < V; ++k) part[threadIdx.y][threadIdx.x * V + k] = s[k];
  __syncthreads();
  for (int c = threadIdx.y * 32 + threadIdx.x; c < 32 * V; c += 256) {
    const int col = blockIdx.x * 32 * V + c;
    if (col >= out) continue;
    float t = 0.f;
#pragma unroll
    for (int y = 0; y < 8; ++y) t += part[y][c];
    partial[size_t(blockIdx.y) * out + col] = t;
  }
}

// Backward epilogue, one pass: dz = da·act'(z) written over da (not rewritten for Act::none,
// where dz = da), dz16 = bf16(dz) when set, and per-chunk column sums of dz into
// partial (chunks, out): block (32, 8) covers 32·V columns of rows [chunk·rpc, (chunk+1)·rpc),
// the 8 row groups combined in a fixed order. bias_grad_finish then adds the chunks in order:
// deterministic, and the sums are of the fp32 dz (as the CPU backend's).
template <int V, Act A>
__global__ void act_bgrad_kernel(float* da, const float* __restrict__ z,
                                 const float* __restrict__ a, void* dz16, float* partial,
                                 int batch, int out, int rpc, bool write_dz) {
  using F = typename Vec<V>::F;
  using H = typename Vec<V>::H;
  __shared__ float part[8][32 * V + 1];
  const int vcols = out / V;
  const int vc = blockIdx.x * 32 + threadIdx.x;
  const int r0 = blockIdx.y * rpc, r1 = min(batch, r0 + rpc);
  float s[V];
#pragma unroll
  for (int k = 0; k < V; ++k) s[k] = 0.f;
  if (vc < vcols) {
#pragma unroll 4
    for (int r = r0 + threadIdx.y; r < r1; r += 8) {
      const size_t i = size_t(r) * vcols + vc;
      F d = reinterpret_cast<const F*>(da)[i];
      if (A != Act::none) {
        // relu and gelu read z only, tanh and sigmoid a only: do not touch the other.
        F zz{}, aa{};
        if (A == Act::relu || A == Act::gelu) zz = reinterpret_cast<const F*>(z)[i];
        if (A == Act::tanh || A == Act::sigmoid) aa = reinterpret_cast<const F*>(a)[i];
#pragma unroll
        for (int k = 0; k < V; ++k) at(d, k) *= act_grad(at(zz, k), at(aa, k), A);
        if (write_dz) reinterpret_cast<F*>(da)[i] = d;
      }
      if (dz16) store_bf16(static_cast<H*>(dz16) + i, d);
#pragma unroll
      for (int k = 0; k < V; ++k) s[k] += at(d, k);
    }
  }
  column_partials<V>(s, part, partial, out);
}

// db[col] = Σ over the chunks of partial[chunk][col]: a warp per column, each lane adding the
// chunks lane, lane + 32, ... in order, then a fixed shuffle tree. (A thread per column, adding
// every chunk one after the other, took 45 µs for a convolution's 2,112 chunks of 128 columns
// on the H200: 128 threads in all, a load at a time each.)
__global__ void bias_grad_finish(const float* partial, int chunks, int out, float* db,
                                 bool accumulate) {
  const int col = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (col >= out) return;  // the warp's lanes leave together
  float t = 0.f;
#pragma unroll 4
  for (int c = lane; c < chunks; c += 32) t += partial[size_t(c) * out + col];
  for (int o = 16; o > 0; o /= 2) t += __shfl_down_sync(0xffffffffu, t, o);
  if (lane == 0) db[col] = accumulate ? db[col] + t : t;
}

// The bf16 path's ReLU backward, one pass over bf16 data: d16 holds bf16(da) (the input-gradient
// GEMM's bf16 output) and becomes dz = da·relu'(z), with relu'(z) = [a > 0] read from the bf16
// activation a16 (a = relu(z) > 0 exactly where z > 0); masked elements become da·0 (±0, or NaN
// from a non-finite da, as in act_bgrad_kernel). Column sums of dz into partial as act_bgrad's,
// fixed order; V = 8: 16-byte loads of 8 columns. Without MASK (a16 unused): the mask already
// applied (note_relu_pool's pooling backward), the column sums of d16 alone, nothing written.
template <int V, bool MASK>
__global__ void relu_bgrad_bf16_kernel(__nv_bfloat16* d16, const __nv_bfloat16* __restrict__ a16,
                                       float* partial, int batch, int out, int rpc) {
  __shared__ float part[8][32 * V + 1];
  const int vcols = out / V;
  const int vc = blockIdx.x * 32 + threadIdx.x;
  const int r0 = blockIdx.y * rpc, r1 = min(batch, r0 + rpc);
  float s[V];
#pragma unroll
  for (int k = 0; k < V; ++k) s[k] = 0.f;
  if (vc < vcols) {
#pragma unroll 4
    for (int r = r0 + threadIdx.y; r < r1; r += 8) {
      const size_t i = size_t(r) * size_t(out) + size_t(vc) * V;
      if constexpr (V == 8) {
        uint4 d = *reinterpret_cast<const uint4*>(d16 + i);
        uint4 av{};
        if constexpr (MASK) av = *reinterpret_cast<const uint4*>(a16 + i);
        auto* dh = reinterpret_cast<__nv_bfloat16*>(&d);
        const auto* ah = reinterpret_cast<const __nv_bfloat16*>(&av);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          float v = __bfloat162float(dh[k]);
          if (MASK && !(__bfloat162float(ah[k]) > 0.f)) {
            v *= 0.f;
            dh[k] = __float2bfloat16_rn(v);
          }
          s[k] += v;
        }
        if constexpr (MASK) *reinterpret_cast<uint4*>(d16 + i) = d;
      } else {
        float v = __bfloat162float(d16[i]);
        if (MASK && !(__bfloat162float(a16[i]) > 0.f)) {
          v *= 0.f;
          d16[i] = __float2bfloat16_rn(v);
        }
        s[0] += v;
      }
    }
  }
  column_partials<V>(s, part, partial, out);
}

__global__ void to_bf16_kernel(const float* src, __nv_bfloat16* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16_rn(src[i]);
}

// Bit test rather than isfinite(): immune to any fast-math assumption that NaNs do not occur.
__device__ __forceinline__ bool nonfinite(float v) {
  return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
}

// dst = float(src) exactly; *flag = 1 when flag and any value is NaN/Inf. 8 values per thread
// (src 16-, dst 16-byte aligned), the tail by the scalar kernel.
__global__ void from_bf16_x8_kernel(const uint4* src, float4* dst, size_t n8, int* flag) {
  bool bad = false;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n8;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint4 u = src[i];
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    float f[8];
    for (int k = 0; k < 4; ++k) {
      f[2 * k] = __uint_as_float(w[k] << 16);
      f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
    for (int k = 0; k < 8; ++k) bad |= nonfinite(f[k]);
    dst[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
    dst[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
  }
  if (flag && __syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

__global__ void from_bf16_kernel(const uint16_t* src, float* dst, size_t n, int* flag) {
  bool bad = false;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = __uint_as_float(uint32_t(src[i]) << 16);
    bad |= nonfinite(dst[i]);
  }
  if (flag && __syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

// 8 values per thread: two 16-byte loads, one 16-byte store (src 16-, dst 16-byte aligned).
__global__ void to_bf16_x8_kernel(const float4* src, uint4* dst, size_t n8) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n8;
       i += size_t(gridDim.x) * blockDim.x) {
    const float4 u = src[2 * i], v = src[2 * i + 1];
    __nv_bfloat162 h[4] = {__floats2bfloat162_rn(u.x, u.y), __floats2bfloat162_rn(u.z, u.w),
                           __floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w)};
    dst[i] = *reinterpret_cast<const uint4*>(h);
  }
}

// One warp per row. Ties in the argmax go to the lowest index, as in the CPU backend.
__global__ void softmax_xent_rows(const float* logits, const int32_t* labels, int batch,
                                  int classes, float grad_scale, float* dlogits, float* row_loss,
                                  int* row_ok) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= batch) return;  // whole warps leave together: the shuffles below stay full-warp
  const float* l = logits + size_t(warp) * classes;
  float m = -INFINITY;
  int arg = classes;
  for (int j = lane; j < classes; j += 32)
    if (l[j] > m || arg == classes) { m = l[j]; arg = j; }
  for (int off = 16; off > 0; off /= 2) {
    const float om = __shfl_xor_sync(0xffffffffu, m, off);
    const int oa = __shfl_xor_sync(0xffffffffu, arg, off);
    if (oa < classes && (arg == classes || om > m || (om == m && oa < arg))) { m = om; arg = oa; }
  }
  float sum = 0.f;
  for (int j = lane; j < classes; j += 32) sum += expf(l[j] - m);
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const int y = labels[warp];
  const bool valid = y >= 0 && y < classes;
  if (lane == 0) {
    row_loss[warp] = valid ? logf(sum) - (l[y] - m) : NAN;
    row_ok[warp] = valid && arg == y;
  }
  if (dlogits) {
    float* d = dlogits + size_t(warp) * classes;
    const float inv = 1.f / sum;
    for (int j = lane; j < classes; j += 32)
      d[j] = expf(l[j] - m) * inv * grad_scale - (j == y ? grad_scale : 0.f);
  }
}

struct OptArgs {
  float lr, momentum, wd, b1, b2, eps;
  float omb1, omb2;  // 1 − β1, 1 − β2, formed in double
  double b1d, b2d;   // β1, β2 for the bias corrections of a device-side step
  float step_size;  // lr / (1 − β1^t)
  float bc2_sqrt;   // sqrt(1 − β2^t)
  float shrink;     // 1 − lr·wd (adamw)
  // When ctl is set, lr and t come from the device (lr_table[ctl->step], ctl->updates + 1) and
  // the update is skipped when ctl->bad: the same step can then be replayed from a graph.
  const float* lr_table;
  const StepCtl* ctl;
  // The non-finite check folded into the update: *flag = 1 when any gradient read is NaN/Inf.
  int* flag;
};

// The step's hyper-parameters as read on the device; false when the step is to be skipped.
// Adam's bias corrections in double, then rounded to float (adam_scalars on the host).
template <bool kAdam> __device__ __forceinline__ bool resolve(OptArgs& h) {
  if (!h.ctl) return true;
  if (h.ctl->bad) return false;
  h.lr = h.lr_table[h.ctl->step];
  if constexpr (kAdam) {
    const double t = double(h.ctl->updates + 1);
    h.step_size = float(double(h.lr) / (1.0 - pow(h.b1d, t)));
    h.bc2_sqrt = float(sqrt(1.0 - pow(h.b2d, t)));
  }
  h.shrink = 1.f - h.lr * h.wd;
  return true;
}

// torch.optim update of one element; m is momentum_buffer / exp_avg, v is exp_avg_sq.
template <OptKind K>
__device__ __forceinline__ void opt_one(float& p, float g, float& m, float& v, const OptArgs& h) {
  if constexpr (K == OptKind::sgd) {
    p -= h.lr * (g + h.wd * p);
  } else if constexpr (K == OptKind::momentum || K == OptKind::nesterov) {
    g += h.wd * p;
    m = h.momentum * m + g;  // dampening 0; the buffer starts at zero, so step 1 gives m = g
    p -= h.lr * (K == OptKind::nesterov ? g + h.momentum * m : m);
  } else {
    if constexpr (K == OptKind::adamw) p *= h.shrink;
    else g += h.wd * p;
    m = h.b1 * m + h.omb1 * g;
    v = h.b2 * v + h.omb2 * g * g;
    p -= h.step_size * m / (sqrtf(v) / h.bc2_sqrt + h.eps);
  }
}

template <OptKind K> __host__ __device__ constexpr bool uses_m() { return K != OptKind::sgd; }
template <OptKind K> __host__ __device__ constexpr bool uses_v() { return K == OptKind::adam || K == OptKind::adamw; }

// Vector part: 16-byte accesses over n4 float4s (only launched when every pointer is 16-byte
// aligned, and p16 8-byte aligned); the caller handles the n % 4 tail with the scalar kernel.
// p16, when set, is the bf16 shadow of p (the bf16 GEMMs' weight operand): written with the
// updated p in the same pass, and left alone, like p, when the step is skipped.
template <OptKind K>
__global__ void optimizer_vec4(float4* p, const float4* g, float4* s1, float4* s2,
                               Vec<4>::H* p16, size_t n4, OptArgs h) {
  if (!resolve<uses_v<K>()>(h)) return;
  bool bad = false;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4;
       i += size_t(gridDim.x) * blockDim.x) {
    float4 P = p[i];
    const float4 G = g[i];
    if (h.flag) bad |= nonfinite(G.x) | nonfinite(G.y) | nonfinite(G.z) | nonfinite(G.w);
    float4 M = uses_m<K>() ? s1[i] : float4{};
    float4 V = uses_v<K>() ? s2[i] : float4{};
    opt_one<K>(P.x, G.x, M.x, V.x, h);
    opt_one<K>(P.y, G.y, M.y, V.y, h);
    opt_one<K>(P.z, G.z, M.z, V.z, h);
    opt_one<K>(P.w, G.w, M.w, V.w, h);
    p[i] = P;
    if (uses_m<K>()) s1[i] = M;
    if (uses_v<K>()) s2[i] = V;
    if (p16) store_bf16(p16 + i, P);
  }
  if (h.flag && __syncthreads_or(bad) && threadIdx.x == 0) *h.flag = 1;
}

template <OptKind K>
__global__ void optimizer_scalar(float* p, const float* g, float* s1, float* s2,
                                 __nv_bfloat16* p16, size_t n, OptArgs h) {
  if (!resolve<uses_v<K>()>(h)) return;
  bool bad = false;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    if (h.flag) bad |= nonfinite(g[i]);
    float m = uses_m<K>() ? s1[i] : 0.f, v = uses_v<K>() ? s2[i] : 0.f;
    opt_one<K>(p[i], g[i], m, v, h);
    if (uses_m<K>()) s1[i] = m;
    if (uses_v<K>()) s2[i] = v;
    if (p16) p16[i] = __float2bfloat16_rn(p[i]);
  }
  if (h.flag && __syncthreads_or(bad) && threadIdx.x == 0) *h.flag = 1;
}

__global__ void nonfinite_kernel(const float* p, size_t n, int* flag) {
  bool bad = false;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    bad |= nonfinite(p[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

__global__ void nonfinite4_kernel(const float4* p, size_t n4, int* flag) {
  bool bad = false;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4;
       i += size_t(gridDim.x) * blockDim.x) {
    const float4 v = p[i];
    bad |= nonfinite(v.x) | nonfinite(v.y) | nonfinite(v.z) | nonfinite(v.w);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

// One block per output row (grid-stride over rows), threads over the row's dim values.
// Rows are rows[base + i], base = ctl->cursor + first when ctl is set (the replayable step),
// else first.
template <class T>
__global__ void gather_kernel(const T* feat, const int32_t* labels, const int64_t* rows,
                              const StepCtl* ctl, int64_t first, int count, int64_t dim,
                              float scale, float offset, float* x, int32_t* y) {
  const int64_t base = (ctl ? ctl->cursor : 0) + first;
  for (int i = blockIdx.x; i < count; i += gridDim.x) {
    const int64_t r = rows[base + i];
    const T* src = feat + r * dim;
    float* dst = x + int64_t(i) * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
      dst[j] = __fadd_rn(__fmul_rn(float(src[j]), scale), offset);  // no FMA: as on the host
    if (threadIdx.x == 0) y[i] = labels[r];
  }
}

__global__ void end_step_kernel(StepCtl* c, int64_t global_batch, bool sticky) {
  ++c->step;
  if (c->bad) {
    ++c->skipped;
    if (c->first_bad < 0) c->first_bad = c->step;
    if (!sticky) c->bad = 0;
  } else {
    ++c->updates;
  }
  c->cursor += global_batch;
}

// ============================== launchers ==============================

// Grid for a grid-stride loop over n elements: enough blocks to fill the GPU several times.
unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(std::min<size_t>(blocks, 132 * 32));
}

bool aligned(const void* q, size_t bytes) {
  return q == nullptr || reinterpret_cast<uintptr_t>(q) % bytes == 0;
}

template <OptKind K>
void optimizer_launch(float* p, const float* g, float* s1, float* s2, void* p16, size_t n,
                      const OptArgs& a, cudaStream_t s) {
  size_t done = 0;
  auto* h16 = static_cast<__nv_bfloat16*>(p16);
  if (aligned(p, 16) && aligned(g, 16) && aligned(s1, 16) && aligned(s2, 16) && aligned(p16, 8) &&
      n >= 4) {
    const size_t n4 = n / 4;
    optimizer_vec4<K><<<grid_for(n4), kThreads, 0, s>>>(
        reinterpret_cast<float4*>(p), reinterpret_cast<const float4*>(g),
        reinterpret_cast<float4*>(s1), reinterpret_cast<float4*>(s2),
        static_cast<Vec<4>::H*>(p16), n4, a);
    DPT_CHECK_LAUNCH("optimizer_vec4");
    done = n4 * 4;
  }
  if (done < n) {
    optimizer_scalar<K><<<grid_for(n - done), kThreads, 0, s>>>(
        p + done, g + done, s1 ? s1 + done : nullptr, s2 ? s2 + done : nullptr,
        h16 ? h16 + done : nullptr, n - done, a);
    DPT_CHECK_LAUNCH("optimizer_scalar");
  }
}

// Block shape for a (rows, vcols) elementwise pass: threads over the columns first, the rest of
// the 256 over rows; about 4 waves of blocks on the GPU, rows grid-strided beyond that.
void rows_cols_launch(int rows, int vcols, dim3& grid, dim3& block) {
  const int tx = std::min(kThreads, (vcols + 31) / 32 * 32);
  const int ty = kThreads / tx;
  block = dim3(unsigned(tx), unsigned(ty));
  const int gx = (vcols + tx - 1) / tx;
  const int want = std::max(1, 132 * 8 * 4 / gx);  // blocks along y for ~4 waves
  const int gy = std::min({want, (rows + ty - 1) / ty, 65535});
  grid = dim3(unsigned(gx), unsigned(std::max(gy, 1)));
}

template <int V>
void bias_act_launch(float* z, float* a, const float* b, void* a16, int batch, int out, Act act,
                     cudaStream_t s) {
  dim3 grid, block;
  rows_cols_launch(batch, out / V, grid, block);
  switch (act) {
    case Act::none: bias_act_kernel<V, Act::none><<<grid, block, 0, s>>>(z, a, b, a16, batch, out); break;
    case Act::relu: bias_act_kernel<V, Act::relu><<<grid, block, 0, s>>>(z, a, b, a16, batch, out); break;
    case Act::tanh: bias_act_kernel<V, Act::tanh><<<grid, block, 0, s>>>(z, a, b, a16, batch, out); break;
    case Act::sigmoid: bias_act_kernel<V, Act::sigmoid><<<grid, block, 0, s>>>(z, a, b, a16, batch, out); break;
    case Act::gelu: bias_act_kernel<V, Act::gelu><<<grid, block, 0, s>>>(z, a, b, a16, batch, out); break;
  }
  DPT_CHECK_LAUNCH("bias_act_kernel");
}

template <int V>
void act_bgrad_launch(float* da, const float* z, const float* a, void* dz16, float* partial,
                      int batch, int out, int chunks, int rpc, Act act, bool w, cudaStream_t s) {
  const dim3 grid(unsigned((out / V + 31) / 32), unsigned(chunks)), block(32, 8);
  switch (act) {
    case Act::none: act_bgrad_kernel<V, Act::none><<<grid, block, 0, s>>>(da, z, a, dz16, partial, batch, out, rpc, w); break;
    case Act::relu: act_bgrad_kernel<V, Act::relu><<<grid, block, 0, s>>>(da, z, a, dz16, partial, batch, out, rpc, w); break;
    case Act::tanh: act_bgrad_kernel<V, Act::tanh><<<grid, block, 0, s>>>(da, z, a, dz16, partial, batch, out, rpc, w); break;
    case Act::sigmoid: act_bgrad_kernel<V, Act::sigmoid><<<grid, block, 0, s>>>(da, z, a, dz16, partial, batch, out, rpc, w); break;
    case Act::gelu: act_bgrad_kernel<V, Act::gelu><<<grid, block, 0, s>>>(da, z, a, dz16, partial, batch, out, rpc, w); break;
  }
  DPT_CHECK_LAUNCH("act_bgrad_kernel");
}

// Rows per chunk of act_bgrad: a multiple of 8 (the block's row groups), enough chunks for
// about 8 waves of blocks with the (out / (32·V)) column blocks.
int bgrad_rpc(int batch, int out) {
  const int col_blocks = std::max(1, (out / 4 + 31) / 32);
  const int want_chunks = std::max(1, 132 * 8 * 2 / col_blocks);
  int rpc = (batch + want_chunks - 1) / want_chunks;
  rpc = std::max(8, (rpc + 7) / 8 * 8);
  return rpc;
}

}  // namespace

void fill(float* p, size_t n, float v, cudaStream_t s) {
  if (n == 0) return;
  size_t done = 0;
  if (aligned(p, 16) && n >= 4) {
    fill4_kernel<<<grid_for(n / 4), kThreads, 0, s>>>(reinterpret_cast<float4*>(p), n / 4, v);
    DPT_CHECK_LAUNCH("fill4_kernel");
    done = n / 4 * 4;
  }
  if (done < n) {
    fill_kernel<<<grid_for(n - done), kThreads, 0, s>>>(p + done, n - done, v);
    DPT_CHECK_LAUNCH("fill_kernel");
  }
}

void scale(float* p, size_t n, float a, cudaStream_t s) {
  if (n == 0) return;
  size_t done = 0;
  if (aligned(p, 16) && n >= 4) {
    scale4_kernel<<<grid_for(n / 4), kThreads, 0, s>>>(reinterpret_cast<float4*>(p), n / 4, a);
    DPT_CHECK_LAUNCH("scale4_kernel");
    done = n / 4 * 4;
  }
  if (done < n) {
    scale_kernel<<<grid_for(n - done), kThreads, 0, s>>>(p + done, n - done, a);
    DPT_CHECK_LAUNCH("scale_kernel");
  }
}

void bias_act_forward(float* z, float* a, const float* b, int batch, int out, Act act,
                      cudaStream_t s, void* a16) {
  if (size_t(batch) * size_t(out) == 0) return;
  if (!b && act == Act::none && a == z && !a16) return;
  if (out % 4 == 0 && aligned(z, 16) && aligned(a, 16) && aligned(a16, 8))
    bias_act_launch<4>(z, a, b, a16, batch, out, act, s);
  else
    bias_act_launch<1>(z, a, b, a16, batch, out, act, s);
}

size_t act_bgrad_partial_floats(int batch, int out) {
  const int rpc = bgrad_rpc(batch, out);
  return size_t((batch + rpc - 1) / rpc) * size_t(out);
}

namespace {
// The frame both backward passes share: db = Σ_rows dz for a (batch, out) pass that writes
// per-chunk column sums into `partial` — launch(rpc, chunks) enqueues it — then
// bias_grad_finish adds the chunks in order. No rows: db is 0 (or left as it is).
template <class Launch>
void bgrad_pass(int batch, int out, float* db, bool accumulate, float* partial, cudaStream_t s,
                Launch launch) {
  if (out == 0) return;
  if (batch == 0) {  // Σ over no rows
    if (!accumulate) fill(db, size_t(out), 0.f, s);
    return;
  }
  const int rpc = bgrad_rpc(batch, out);
  const int chunks = (batch + rpc - 1) / rpc;
  launch(rpc, chunks);
  bias_grad_finish<<<unsigned((out + kThreads / 32 - 1) / (kThreads / 32)), kThreads, 0, s>>>(
      partial, chunks, out, db, accumulate);
  DPT_CHECK_LAUNCH("bias_grad_finish");
}
}  // namespace

void act_backward_bgrad(float* da, const float* z, const float* a, int batch, int out, Act act,
                        float* db, bool accumulate, float* partial, void* dz16, cudaStream_t s, bool write_dz) {
  const bool w = write_dz || !dz16;
  bgrad_pass(batch, out, db, accumulate, partial, s, [&](int rpc, int chunks) {
    if (out % 4 == 0 && aligned(da, 16) && aligned(z, 16) && aligned(a, 16) && aligned(dz16, 8))
      act_bgrad_launch<4>(da, z, a, dz16, partial, batch, out, chunks, rpc, act, w, s);
    else
      act_bgrad_launch<1>(da, z, a, dz16, partial, batch, out, chunks, rpc, act, w, s);
  });
}

void relu_backward_bgrad_bf16(void* d16, const void* a16, int batch, int out, float* db,
                              bool accumulate, float* partial, cudaStream_t s) {
  bgrad_pass(batch, out, db, accumulate, partial, s, [&](int rpc, int chunks) {
    auto* d = static_cast<__nv_bfloat16*>(d16);
    const auto* a = static_cast<const __nv_bfloat16*>(a16);
    if (out % 8 == 0 && aligned(d16, 16) && aligned(a16, 16)) {
      const dim3 grid(unsigned((out / 8 + 31) / 32), unsigned(chunks)), block(32, 8);
      if (a) relu_bgrad_bf16_kernel<8, true><<<grid, block, 0, s>>>(d, a, partial, batch, out, rpc);
      else relu_bgrad_bf16_kernel<8, false><<<grid, block, 0, s>>>(d, a, partial, batch, out, rpc);
    } else {
      const dim3 grid(unsigned((out + 31) / 32), unsigned(chunks)), block(32, 8);
      if (a) relu_bgrad_bf16_kernel<1, true><<<grid, block, 0, s>>>(d, a, partial, batch, out, rpc);
      else relu_bgrad_bf16_kernel<1, false><<<grid, block, 0, s>>>(d, a, partial, batch, out, rpc);
    }
    DPT_CHECK_LAUNCH("relu_bgrad_bf16_kernel");
  });
}

void to_bf16(const float* src, void* dst, size_t n, cudaStream_t s) {
  if (n == 0) return;
  size_t done = 0;
  if (aligned(src, 16) && aligned(dst, 16) && n >= 8) {
    to_bf16_x8_kernel<<<grid_for(n / 8), kThreads, 0, s>>>(reinterpret_cast<const float4*>(src),
                                                           static_cast<uint4*>(dst), n / 8);
    DPT_CHECK_LAUNCH("to_bf16_x8_kernel");
    done = n / 8 * 8;
  }
  if (done < n) {
    to_bf16_kernel<<<grid_for(n - done), kThreads, 0, s>>>(
        src + done, static_cast<__nv_bfloat16*>(dst) + done, n - done);
    DPT_CHECK_LAUNCH("to_bf16_kernel");
  }
}

void from_bf16(const void* src, float* dst, size_t n, int* flag, cudaStream_t s) {
  if (n == 0) return;
  size_t done = 0;
  if (aligned(src, 16) && aligned(dst, 16) && n >= 8) {
    from_bf16_x8_kernel<<<grid_for(n / 8), kThreads, 0, s>>>(static_cast<const uint4*>(src),
                                                             reinterpret_cast<float4*>(dst), n / 8, flag);
    DPT_CHECK_LAUNCH("from_bf16_x8_kernel");
    done = n / 8 * 8;
  }
  if (done < n) {
    from_bf16_kernel<<<grid_for(n - done), kThreads, 0, s>>>(static_cast<const uint16_t*>(src) + done,
                                                             dst + done, n - done, flag);
    DPT_CHECK_LAUNCH("from_bf16_kernel");
  }
}

void softmax_xent(const float* logits, const int32_t* labels, int batch, int classes,
                  float grad_scale, float* dlogits, float* row_loss, int* row_ok, float* stats,
                  cudaStream_t s) {
  if (batch == 0) return;
  const int rows_per_block = kThreads / 32;
  softmax_xent_rows<<<unsigned((batch + rows_per_block - 1) / rows_per_block), kThreads, 0, s>>>(
      logits, labels, batch, classes, grad_scale, dlogits, row_loss, row_ok);
  DPT_CHECK_LAUNCH("softmax_xent_rows");
  if (stats) {
    loss_totals<float, kThreads><<<1, kThreads, 0, s>>>(row_loss, row_ok, batch, stats);
    DPT_CHECK_LAUNCH("loss_totals");
  }
}

void optimizer_step(float* p, const float* g, float* s1, float* s2, size_t n, const OptimStep& h,
                    cudaStream_t s, const float* lr_table, const StepCtl* ctl, void* p16,
                    int* flag) {
  if (n == 0) return;
  OptArgs a{};
  a.lr_table = lr_table;
  a.ctl = ctl;
  a.flag = flag;
  a.lr = h.lr;
  a.momentum = h.momentum;
  a.wd = h.weight_decay;
  a.b1 = float(h.beta1);
  a.b2 = float(h.beta2);
  a.b1d = h.beta1;
  a.b2d = h.beta2;
  a.eps = h.eps;
  // The same scalars as the CPU backend (and torch.optim): formed in double, rounded once.
  const AdamScalars as = adam_scalars(h.lr, h.beta1, h.beta2, h.t);
  a.omb1 = as.one_minus_b1;
  a.omb2 = as.one_minus_b2;
  a.step_size = as.step_size;
  a.bc2_sqrt = as.bc2_sqrt;
  a.shrink = 1.f - h.lr * h.weight_decay;
  switch (h.kind) {
    case OptKind::sgd: optimizer_launch<OptKind::sgd>(p, g, nullptr, nullptr, p16, n, a, s); return;
    case OptKind::momentum: optimizer_launch<OptKind::momentum>(p, g, s1, nullptr, p16, n, a, s); return;
    case OptKind::nesterov: optimizer_launch<OptKind::nesterov>(p, g, s1, nullptr, p16, n, a, s); return;
    case OptKind::adam: optimizer_launch<OptKind::adam>(p, g, s1, s2, p16, n, a, s); return;
    case OptKind::adamw: optimizer_launch<OptKind::adamw>(p, g, s1, s2, p16, n, a, s); return;
    case OptKind::lars:
    case OptKind::lamb: throw Error("optimizer_step: LARS and LAMB run through layer_sums / layer_apply");
  }
}

void flag_nonfinite(const float* p, size_t n, int* flag, cudaStream_t s) {
  if (n == 0) return;
  size_t done = 0;
  if (aligned(p, 16) && n >= 4) {
    nonfinite4_kernel<<<grid_for(n / 4), kThreads, 0, s>>>(reinterpret_cast<const float4*>(p),
                                                           n / 4, flag);
    DPT_CHECK_LAUNCH("nonfinite4_kernel");
    done = n / 4 * 4;
  }
  if (done < n) {
    nonfinite_kernel<<<grid_for(n - done), kThreads, 0, s>>>(p + done, n - done, flag);
    DPT_CHECK_LAUNCH("nonfinite_kernel");
  }
}

// 32×32 tiles through shared memory (one padding column against bank conflicts): reads and
// writes both coalesced.
__global__ void transpose_kernel(const float* __restrict__ src, int rows, int cols,
                                 float* __restrict__ dst) {
  __shared__ float tile[32][33];
  const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  for (int j = threadIdx.y; j < 32; j += 8) {
    const int r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[j][threadIdx.x] = src[size_t(r) * size_t(cols) + size_t(c)];
  }
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += 8) {
    const int c = c0 + j, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[size_t(c) * size_t(rows) + size_t(r)] = tile[threadIdx.x][j];
  }
}

void transpose(const float* src, int rows, int cols, float* dst, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid(unsigned((cols + 31) / 32), unsigned((rows + 31) / 32)), block(32, 8);
  transpose_kernel<<<grid, block, 0, s>>>(src, rows, cols, dst);
  DPT_CHECK_LAUNCH("transpose_kernel");
}

void gather_rows(const void* feat, bool is_u8, const int32_t* labels, const int64_t* rows,
                 int count, int64_t dim, float scale, float offset, float* x, int32_t* y,
                 cudaStream_t s, const StepCtl* ctl, int64_t first) {
  if (count == 0) return;
  const unsigned grid = unsigned(std::min(count, 65535));
  if (is_u8)
    gather_kernel<uint8_t><<<grid, kThreads, 0, s>>>(static_cast<const uint8_t*>(feat), labels,
                                                     rows, ctl, first, count, dim, scale, offset, x, y);
  else
    gather_kernel<float><<<grid, kThreads, 0, s>>>(static_cast<const float*>(feat), labels, rows,
                                                   ctl, first, count, dim, scale, offset, x, y);
  DPT_CHECK_LAUNCH("gather_kernel");
}

void end_step(StepCtl* ctl, int64_t global_batch, bool sticky, cudaStream_t s) {
  end_step_kernel<<<1, 1, 0, s>>>(ctl, global_batch, sticky);
  DPT_CHECK_LAUNCH("end_step_kernel");
}

}  // namespace dpt::cuda
