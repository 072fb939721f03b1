// The CUDA backend's kernels for residual networks: batch norm (per-channel sums, the training
// and evaluation affine passes, parameter gradients, the input gradient), the residual sum,
// global average pooling, padded max/avg pooling and its gather-form backward, and the
// label-smoothed softmax cross-entropy. Kernels first, launchers after.
//
// Channel tiles. Most kernels run over a (rows, c) row-major matrix: an NHWC activation's pixels
// by its channels. A block is tc × lanes = 256 threads: threadIdx.x is a channel of a tile of tc
// (the smallest power of two covering c, at most 32), threadIdx.y one of lanes = 256 / tc rows,
// and blockIdx.y picks the tile. A warp reads consecutive channels of consecutive rows (coalesced
// for any c), and a thread keeps one channel throughout: no division by c.
//
// Determinism. A reduction is per-thread sums in a fixed row order, a fixed tree over the
// block's row lanes, per-block partials in scratch, then a second kernel that sums the partials
// in block order the same way. The block count depends on the shape only, not on the device.
// Backward passes of pooling are gathers (one thread per input element), never atomics.
//
// Fast math. The build compiles CUDA with --use_fast_math: single-precision division, sqrt, exp
// and log become approximate, denormals flush to zero, and nvcc contracts a·b + c into an FMA.
// Double precision is untouched, so per-channel statistics are computed in double and rounded
// to float once, as the CPU backend does; the elementwise passes use __fmul_rn / __fadd_rn /
// __fsub_rn / __fdiv_rn (never contracted, IEEE-rounded) in the CPU's operation order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "device_util.cuh"
#include "dpt/cuda_check.hpp"
#include "norm_kernels.cuh"

namespace dpt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTileMax = 32;             // channels per tile at most: one warp's width
constexpr int kMaxTiles = 65535;         // gridDim.y
constexpr int64_t kReduceBlocks = 1024;  // a reduction's blocks, about 8 per SM of an H200
constexpr int64_t kPassBlocks = 4096;    // an elementwise pass's blocks at most (grid-stride)
// Pooling indexes pixels in 32 bits (Div): they and the grid-stride loop's last step fit in 2^31.
constexpr int64_t kMaxPoolPixels = (int64_t(1) << 31) - kPassBlocks * kThreads;

// ============================== kernels ==============================

// Sums each of the N values over the block's row lanes (threadIdx.y), per channel lane
// (threadIdx.x), in a fixed tree order; the totals are valid in row lane 0. Every thread of the
// block calls it (it synchronises), once per kernel; blockDim.y is a power of two.
template <int N> __device__ void lane_sums(double (&v)[N]) {
  __shared__ double sh[N][kThreads];
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  for (int k = 0; k < N; ++k) sh[k][t] = v[k];
  for (int h = blockDim.y / 2; h > 0; h /= 2) {
    __syncthreads();
    if (threadIdx.y < h)
      for (int k = 0; k < N; ++k) sh[k][t] += sh[k][t + h * blockDim.x];
  }
  for (int k = 0; k < N; ++k) v[k] = sh[k][t];
}

// The first row of this thread in a pass over rows, and the step to its next one.
__device__ __forceinline__ int64_t first_row() { return int64_t(blockIdx.x) * blockDim.y + threadIdx.y; }
__device__ __forceinline__ int64_t row_step() { return int64_t(gridDim.x) * blockDim.y; }
__device__ __forceinline__ int channel() { return blockIdx.y * blockDim.x + threadIdx.x; }

// A ReLU's backward folded into batch norm's (Backend::bn_backward_sums' relu_out): dy where the
// forward output is > 0. The output is read as float, or as its bf16 copy (2 bytes instead of
// 4): a positive float is a positive bf16 (flushed denormals aside, which the fast-math kernels
// that wrote it never produce), so both give the same mask.
enum class Mask { none, f32, bf16 };

// A batch-norm input: float, or bf16 where the float tensor was never written (a convolution's
// bf16 output kept as it is: Backend::note_bn_input).
__device__ __forceinline__ float ld(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16* p, size_t i) { return __bfloat162float(p[i]); }

template <Mask M> __device__ __forceinline__ float masked(const float* dy, const void* relu_out, size_t i) {
  if constexpr (M == Mask::f32) return static_cast<const float*>(relu_out)[i] > 0.f ? dy[i] : 0.f;
  else if constexpr (M == Mask::bf16)
    return __bfloat162float(static_cast<const __nv_bfloat16*>(relu_out)[i]) > 0.f ? dy[i] : 0.f;
  else return dy[i];
}

// partial (chunks, 2c): chunk blockIdx.x's (rows [chunk·chunk_rows, +chunk_rows)) sums for the
// channels of tile blockIdx.y, [Σa (c), Σa·b (c)] with b = a = x (forward) or a = dy (masked),
// b = x − mean (backward), in double as the CPU's. The forward pass reads x only.
template <bool BWD, Mask M, class TX>
__global__ void bn_partial_kernel(const float* __restrict__ a, const TX* __restrict__ x,
                                  const float* __restrict__ mean, const void* __restrict__ relu_out,
                                  int64_t rows, int c, int64_t chunk_rows, double* __restrict__ partial) {
  const int j = channel();
  const int64_t r0 = int64_t(blockIdx.x) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  double v[2] = {0.0, 0.0};
  if (j < c) {
    double m = 0.0;
    if constexpr (BWD) m = mean[j];
    for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
      const size_t i = size_t(r) * size_t(c) + size_t(j);
      const double d = BWD ? masked<M>(a, relu_out, i) : ld(x, i);
      v[0] += d;
      if constexpr (BWD) v[1] += d * (double(ld(x, i)) - m);
      else v[1] += d * d;
    }
  }
  lane_sums(v);
  if (threadIdx.y == 0 && j < c) {
    double* p = partial + size_t(blockIdx.x) * 2 * size_t(c);
    p[j] = v[0];
    p[c + j] = v[1];
  }
}

// out[j] = Σ over the chunks of partial[chunk][j] (cols columns), chunk ascending per row lane,
// then the lane tree; out[cols] = count.
__global__ void column_total_kernel(const double* __restrict__ partial, int64_t chunks, int cols,
                                    double count, double* __restrict__ out) {
  const int j = channel();
  double v[1] = {0.0};
  if (j < cols)
    for (int64_t k = threadIdx.y; k < chunks; k += blockDim.y) v[0] += partial[size_t(k) * size_t(cols) + size_t(j)];
  lane_sums(v);
  if (threadIdx.y == 0 && j < cols) out[j] = v[0];
  if (blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) out[cols] = count;
}

struct BnStats {
  double mean, var, invstd;
};

// The CPU's formulas in double. The variance's product is kept unfused (__dmul_rn): E[x²] − mean²
// cancels, and the CPU rounds mean² before subtracting.
__device__ BnStats bn_stats(const double* sums, int c, int j, float eps) {
  const double n = sums[2 * c];
  const double mean = sums[j] / n;
  const double var = fmax(0.0, sums[c + j] / n - __dmul_rn(mean, mean));
  return {mean, var, 1.0 / sqrt(var + double(eps))};
}

// y = x·scale + shift down this thread's channel j, rounded as the CPU's multiply then add; then
// max(y, 0) with relu (act_fwd's expression), and its bf16 copy into y16 unless nullptr.
template <class TX>
__device__ void affine_rows(const TX* x, float* y, __nv_bfloat16* y16, int64_t rows, int c, int j,
                            float scale, float shift, bool relu) {
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const size_t i = size_t(r) * size_t(c) + size_t(j);
    float v = __fadd_rn(__fmul_rn(ld(x, i), scale), shift);
    if (relu) v = v > 0.f ? v : 0.f;
    y[i] = v;
    if (y16) y16[i] = __float2bfloat16_rn(v);
  }
}

// Training: every thread derives its channel's scale and shift from the sums; the one in row
// lane 0 of block column 0 also writes the channel's saved mean and invstd and moves its running
// stats (once per channel).
template <class TX>
__global__ void bn_train_kernel(const TX* x, float* y, __nv_bfloat16* y16, bool relu, int64_t rows, int c,
                                const double* __restrict__ sums, const float* __restrict__ w,
                                const float* __restrict__ b, float eps, float momentum,
                                float* __restrict__ save_mean, float* __restrict__ save_invstd,
                                float* __restrict__ running_mean, float* __restrict__ running_var) {
  const int j = channel();
  if (j >= c) return;
  const BnStats st = bn_stats(sums, c, j, eps);
  if (blockIdx.x == 0 && threadIdx.y == 0) {
    save_mean[j] = float(st.mean);
    save_invstd[j] = float(st.invstd);
    const double n = sums[2 * c], mom = momentum;
    const double unbiased = n > 1 ? st.var * n / (n - 1) : st.var;
    if (running_mean) running_mean[j] = float(mom * st.mean + (1.0 - mom) * running_mean[j]);
    if (running_var) running_var[j] = float(mom * unbiased + (1.0 - mom) * running_var[j]);
  }
  affine_rows(x, y, y16, rows, c, j, float(st.invstd * w[j]), float(b[j] - st.mean * st.invstd * w[j]), relu);
}

template <class TX>
__global__ void bn_infer_kernel(const TX* x, float* y, bool relu, int64_t rows, int c,
                                const float* __restrict__ running_mean, const float* __restrict__ running_var,
                                const float* __restrict__ w, const float* __restrict__ b, float eps) {
  const int j = channel();
  if (j >= c) return;
  const double invstd = 1.0 / sqrt(double(running_var[j]) + double(eps));
  affine_rows(x, y, nullptr, rows, c, j, float(invstd * w[j]), float(b[j] - running_mean[j] * invstd * w[j]), relu);
}

// dx = k·dy − off − m·(x − mean) with the CPU's per-channel k, m, off (double, rounded to float)
// and its operation order, dy masked by relu_out (M). dx may equal dy: each element is read
// before it is written, by the same thread.
template <Mask M, class TX>
__global__ void bn_backward_kernel(const float* dy, const TX* x, const void* relu_out, float* dx, int64_t rows,
                                   int c, const double* __restrict__ sums, const float* __restrict__ mean,
                                   const float* __restrict__ invstd, const float* __restrict__ w) {
  const int j = channel();
  if (j >= c) return;
  const double n = sums[2 * c];
  const double kj = double(w[j]) * invstd[j];
  const float k = float(kj);
  const float m = float(kj * double(invstd[j]) * invstd[j] * sums[c + j] / n);
  const float off = float(kj * sums[j] / n);
  const float mu = mean[j];
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const size_t i = size_t(r) * size_t(c) + size_t(j);
    const float d = masked<M>(dy, relu_out, i), v = ld(x, i);
    dx[i] = __fsub_rn(__fsub_rn(__fmul_rn(k, d), off), __fmul_rn(m, __fsub_rn(v, mu)));
  }
}

__global__ void bn_param_grads_kernel(const double* __restrict__ sums, const float* __restrict__ invstd,
                                      int c, float* __restrict__ dw, float* __restrict__ db, bool accumulate) {
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x) {
    const float gw = float(sums[c + j] * invstd[j]), gb = float(sums[j]);
    dw[j] = accumulate ? dw[j] + gw : gw;
    db[j] = accumulate ? db[j] + gb : gb;
  }
}

__global__ void add_kernel(const float* x, float* y, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void add4_kernel(const float4* x, float4* y, size_t n4) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    const float4 a = x[i];
    float4 v = y[i];
    v.x += a.x; v.y += a.y; v.z += a.z; v.w += a.w;
    y[i] = v;
  }
}

// y = body + shortcut, max(y, 0) with relu, and y's bf16 copy into y16 unless nullptr.
__device__ __forceinline__ float sum_act(float a, float b, bool relu) {
  const float v = a + b;
  return relu ? (v > 0.f ? v : 0.f) : v;
}

__global__ void residual_sum_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y,
                                    __nv_bfloat16* __restrict__ y16, size_t n, bool relu) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = sum_act(a[i], b[i], relu);
    y[i] = v;
    if (y16) y16[i] = __float2bfloat16_rn(v);
  }
}

__global__ void residual_sum4_kernel(const float4* __restrict__ a, const float4* __restrict__ b,
                                     float4* __restrict__ y, __nv_bfloat162* __restrict__ y16, size_t n4,
                                     bool relu) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    const float4 p = a[i], q = b[i];
    const float4 v = {sum_act(p.x, q.x, relu), sum_act(p.y, q.y, relu), sum_act(p.z, q.z, relu),
                      sum_act(p.w, q.w, relu)};
    y[i] = v;
    if (y16) {
      y16[2 * i] = __floats2bfloat162_rn(v.x, v.y);
      y16[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
    }
  }
}

// y[n][j] = float(Σ_p x[n][p][j] / hw), one thread per (sample, channel), summed in double in p
// order: the CPU's sums, bit for bit.
__global__ void gap_fwd_kernel(const float* __restrict__ x, float* __restrict__ y, int batch, int hw, int c) {
  const int j = channel();
  if (j >= c) return;
  for (int64_t n = first_row(); n < batch; n += row_step()) {
    const float* xn = x + size_t(n) * size_t(hw) * size_t(c) + size_t(j);
    double acc = 0.0;
    for (int p = 0; p < hw; ++p) acc += xn[size_t(p) * size_t(c)];
    y[size_t(n) * size_t(c) + size_t(j)] = float(acc / hw);
  }
}

// dx[n][p][j] = dy[n][j]·inv, inv = 1/hw rounded on the host as the CPU's.
__global__ void gap_bwd_kernel(const float* __restrict__ dy, float* __restrict__ dx, int batch, int hw, int c,
                               float inv) {
  const int j = channel();
  if (j >= c) return;
  for (int64_t n = first_row(); n < batch; n += row_step()) {
    const float v = dy[size_t(n) * size_t(c) + size_t(j)] * inv;
    float* dn = dx + size_t(n) * size_t(hw) * size_t(c) + size_t(j);
    for (int p = 0; p < hw; ++p) dn[size_t(p) * size_t(c)] = v;
  }
}

// A bit test, immune to fast math's assumption that NaNs do not occur.
__device__ __forceinline__ bool is_nan(float v) { return (__float_as_uint(v) & 0x7fffffffu) > 0x7f800000u; }

// The pooling kernels take one thread per pixel and channel, pixels indexed in 32 bits.
//
// Forward: one output pixel (n, oh, ow). The window's taps inside the input, in row-major order
// (padding skipped: PyTorch's clipped window, the same as padding with −inf for max). Max: the
// first maximum, a NaN replaces it, argmax = the tap kh·k + kw. Avg: summed from the first valid
// tap, divided by k² (the padding's zeros counted, count_include_pad). A window with no valid tap
// (pad >= k, which PyTorch refuses) gives max −inf, argmax −1; avg 0.
template <bool MAX>
__global__ void padded_pool_fwd_kernel(const float* __restrict__ x, float* __restrict__ y,
                                       int32_t* __restrict__ argmax, PoolGeom g, Div plane, Div ow_n,
                                       int pixels) {
  const int j = channel();
  if (j >= g.c) return;
  const float area = float(g.k * g.k);
  for (int p = int(first_row()); p < pixels; p += int(row_step())) {
    int q, ow;
    const int n = plane.divmod(p, q);
    const int oh = ow_n.divmod(q, ow);
    const int h0 = oh * g.stride - g.pad, w0 = ow * g.stride - g.pad;
    float best = 0.f;
    int idx = -1;
    for (int kh = 0; kh < g.k; ++kh) {
      const int ih = h0 + kh;
      if (ih < 0 || ih >= g.h) continue;
      for (int kw = 0; kw < g.k; ++kw) {
        const int iw = w0 + kw;
        if (iw < 0 || iw >= g.w) continue;
        const float v = x[((size_t(n) * size_t(g.h) + size_t(ih)) * size_t(g.w) + size_t(iw)) * size_t(g.c) + size_t(j)];
        const int tap = kh * g.k + kw;
        if (idx < 0) {
          best = v;
          idx = tap;
        } else if (MAX) {
          if (v > best || is_nan(v)) {
            best = v;
            idx = tap;
          }
        } else {
          best += v;
        }
      }
    }
    const size_t o = size_t(p) * size_t(g.c) + size_t(j);
    if (MAX) {
      y[o] = idx < 0 ? -INFINITY : best;
      argmax[o] = idx;
    } else {
      y[o] = __fdiv_rn(best, area);
    }
  }
}

// Backward: one input pixel (n, ih, iw), the sum over the windows holding it, oh then ow
// ascending (the CPU's scatter order, so the same sums bit for bit). Max: dy where the window's
// argmax is this element's tap; avg: dy / k².
template <bool MAX>
__global__ void padded_pool_bwd_kernel(const float* __restrict__ dy, const int32_t* __restrict__ argmax,
                                       float* __restrict__ dx, PoolGeom g, Div plane, Div w_n, Div st,
                                       int oh_n, int ow_n, int pixels) {
  const int j = channel();
  if (j >= g.c) return;
  const float area = float(g.k * g.k);
  for (int p = int(first_row()); p < pixels; p += int(row_step())) {
    int q, iw;
    const int n = plane.divmod(p, q);
    const int ih = w_n.divmod(q, iw);
    // Window oh holds row ih when its tap kh = yh − oh·s lies in [0, k): yh − k < oh·s <= yh.
    const int yh = ih + g.pad, yw = iw + g.pad;
    const int oh0 = yh < g.k ? 0 : st.div(yh - g.k) + 1, oh1 = min(oh_n - 1, st.div(yh));
    const int ow0 = yw < g.k ? 0 : st.div(yw - g.k) + 1, ow1 = min(ow_n - 1, st.div(yw));
    float s = 0.f;
    for (int oh = oh0; oh <= oh1; ++oh)
      for (int ow = ow0; ow <= ow1; ++ow) {
        const size_t o = ((size_t(n) * size_t(oh_n) + size_t(oh)) * size_t(ow_n) + size_t(ow)) * size_t(g.c) + size_t(j);
        if (MAX) {
          if (argmax[o] == (yh - oh * g.stride) * g.k + (yw - ow * g.stride)) s += dy[o];
        } else {
          s += __fdiv_rn(dy[o], area);
        }
      }
    dx[size_t(p) * size_t(g.c) + size_t(j)] = s;
  }
}

// One warp per row, softmax_xent_rows's structure (kernels.cu). The maximum and its first index
// as the CPU's (ties to the lowest index). exp, the sums and the loss in double, as the CPU sums;
// double is exact IEEE under fast math. The warp's sums are reduced by a fixed butterfly, then
// lane 0's are broadcast so that every lane uses the same values. dlogits: float(exp(double)),
// the correctly rounded expf of the CPU but for rare ties, then the CPU's float operations in its
// order, unfused.
__global__ void xent_smoothed_rows(const float* __restrict__ logits, const int32_t* __restrict__ labels,
                                   int batch, int classes, float grad_scale, float eps,
                                   float* __restrict__ dlogits, double* __restrict__ row_loss,
                                   int* __restrict__ row_ok) {
  const int warp = int((blockIdx.x * size_t(blockDim.x) + threadIdx.x) / 32);
  const int lane = threadIdx.x % 32;
  if (warp >= batch) return;  // whole warps leave together: the shuffles below stay full-warp
  const float* l = logits + size_t(warp) * size_t(classes);
  float m = -INFINITY;
  int arg = classes;
  for (int j = lane; j < classes; j += 32)
    if (l[j] > m || arg == classes) { m = l[j]; arg = j; }
  for (int off = 16; off > 0; off /= 2) {
    const float om = __shfl_xor_sync(0xffffffffu, m, off);
    const int oa = __shfl_xor_sync(0xffffffffu, arg, off);
    if (oa < classes && (arg == classes || om > m || (om == m && oa < arg))) { m = om; arg = oa; }
  }
  double sum = 0.0, all = 0.0;
  for (int j = lane; j < classes; j += 32) {
    const double z = double(l[j] - m);
    sum += exp(z);
    all += z;
  }
  for (int off = 16; off > 0; off /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, off);
    all += __shfl_xor_sync(0xffffffffu, all, off);
  }
  sum = __shfl_sync(0xffffffffu, sum, 0);
  all = __shfl_sync(0xffffffffu, all, 0);
  const int y = labels[warp];
  const bool valid = y >= 0 && y < classes;
  if (lane == 0) {
    const double lse = log(sum);
    row_loss[warp] = valid ? (1.0 - eps) * (lse - double(l[y] - m)) + eps * (lse - all / classes) : double(NAN);
    row_ok[warp] = valid && arg == y;
  }
  if (dlogits) {
    float* d = dlogits + size_t(warp) * size_t(classes);
    const float inv = float(1.0 / sum);
    const float off = __fmul_rn(float(double(eps) / classes), grad_scale);
    const float hit = __fmul_rn(1.f - eps, grad_scale);
    for (int j = lane; j < classes; j += 32) {
      const float e = float(exp(double(l[j] - m)));
      float v = __fsub_rn(__fmul_rn(__fmul_rn(e, inv), grad_scale), off);
      if (j == y) v = __fsub_rn(v, hit);
      d[j] = v;
    }
  }
}

// ============================== launchers ==============================

// The channel tiling of `cols` columns (see the top of the file).
struct Tiles {
  int tc = 1;             // channels per tile
  int lanes = kThreads;   // rows per block
  int count = 1;          // tiles
};

Tiles tiles_for(int64_t cols, const char* op) {
  Tiles t;
  while (t.tc < cols && t.tc < kTileMax) t.tc *= 2;
  t.lanes = kThreads / t.tc;
  const int64_t count = std::max<int64_t>(1, (cols + t.tc - 1) / t.tc);
  if (count > kMaxTiles)
    throw Error(std::string(op) + ": " + std::to_string(cols) + " channels exceed the grid's " +
                std::to_string(int64_t(kMaxTiles) * kTileMax));
  t.count = int(count);
  return t;
}

dim3 block_of(const Tiles& t) { return dim3(unsigned(t.tc), unsigned(t.lanes)); }

// A pass over `rows` rows: blockIdx.x grid-strides over the rows, blockIdx.y over the tiles.
dim3 pass_grid(const Tiles& t, int64_t rows) {
  const int64_t need = (rows + t.lanes - 1) / t.lanes;
  const int64_t most = std::max<int64_t>(1, kPassBlocks / t.count);
  return dim3(unsigned(std::clamp<int64_t>(need, 1, most)), unsigned(t.count));
}

// Row chunks of a reduction over (rows, c): about kReduceBlocks blocks in all, at least a row
// per row lane. A function of the shape only.
int64_t bn_chunks(int64_t rows, int c) {
  const Tiles t = tiles_for(c, "bn sums");
  const int64_t want = std::max<int64_t>(1, kReduceBlocks / t.count);
  const int64_t fill = std::max<int64_t>(1, (rows + t.lanes - 1) / t.lanes);
  return std::min(want, fill);
}

template <bool BWD, Mask M, class TX>
void column_sums(const float* a, const TX* x, const float* mean, const void* relu_out, int64_t rows, int c,
                 double* sums, double* partial, cudaStream_t s) {
  if (c < 0 || rows < 0) throw Error("bn sums: negative shape");
  const int64_t chunks = c > 0 ? bn_chunks(rows, c) : 0;
  if (chunks > 0) {
    const Tiles t = tiles_for(c, "bn sums");
    const int64_t chunk_rows = (rows + chunks - 1) / chunks;
    bn_partial_kernel<BWD, M, TX><<<dim3(unsigned(chunks), unsigned(t.count)), block_of(t), 0, s>>>(
        a, x, mean, relu_out, rows, c, chunk_rows, partial);
    DPT_CHECK_LAUNCH("bn_partial_kernel");
  }
  const Tiles tt = tiles_for(2 * int64_t(c), "bn sums");
  column_total_kernel<<<dim3(1, unsigned(tt.count)), block_of(tt), 0, s>>>(partial, chunks, 2 * c,
                                                                          double(rows), sums);
  DPT_CHECK_LAUNCH("column_total_kernel");
}

unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(std::max<size_t>(1, std::min<size_t>(blocks, 132 * 32)));
}

bool aligned16(const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; }

}  // namespace

size_t bn_partial_doubles(int64_t rows, int c) {
  return c > 0 ? size_t(bn_chunks(rows, c)) * 2 * size_t(c) : 0;
}

const __nv_bfloat16* as16(const void* p) { return static_cast<const __nv_bfloat16*>(p); }

void bn_sums(BnIn x, int64_t rows, int c, double* sums, double* partial, cudaStream_t s) {
  if (x.bf16) column_sums<false, Mask::none>(nullptr, as16(x.p), nullptr, nullptr, rows, c, sums, partial, s);
  else column_sums<false, Mask::none>(nullptr, static_cast<const float*>(x.p), nullptr, nullptr, rows, c, sums, partial, s);
}

template <class TX>
void backward_sums(const float* dy, const TX* x, int64_t rows, int c, const float* mean, const void* relu_out,
                   bool relu_out_bf16, double* sums, double* partial, cudaStream_t s) {
  if (!relu_out) column_sums<true, Mask::none>(dy, x, mean, nullptr, rows, c, sums, partial, s);
  else if (relu_out_bf16) column_sums<true, Mask::bf16>(dy, x, mean, relu_out, rows, c, sums, partial, s);
  else column_sums<true, Mask::f32>(dy, x, mean, relu_out, rows, c, sums, partial, s);
}

void bn_backward_sums(const float* dy, BnIn x, int64_t rows, int c, const float* mean,
                      const void* relu_out, bool relu_out_bf16, double* sums, double* partial, cudaStream_t s) {
  if (x.bf16) backward_sums(dy, as16(x.p), rows, c, mean, relu_out, relu_out_bf16, sums, partial, s);
  else backward_sums(dy, static_cast<const float*>(x.p), rows, c, mean, relu_out, relu_out_bf16, sums, partial, s);
}

void bn_forward(BnIn x, float* y, void* y16, bool relu, int64_t rows, int c, const double* sums,
                const float* w, const float* b, float eps, float momentum, float* save_mean, float* save_invstd,
                float* running_mean, float* running_var, cudaStream_t s) {
  if (c <= 0) return;
  const Tiles t = tiles_for(c, "bn_forward");
  const dim3 grid = pass_grid(t, rows), block = block_of(t);
  auto* o16 = static_cast<__nv_bfloat16*>(y16);
  if (x.bf16)
    bn_train_kernel<<<grid, block, 0, s>>>(as16(x.p), y, o16, relu, rows, c, sums, w, b, eps, momentum, save_mean,
                                           save_invstd, running_mean, running_var);
  else
    bn_train_kernel<<<grid, block, 0, s>>>(static_cast<const float*>(x.p), y, o16, relu, rows, c, sums, w, b, eps,
                                           momentum, save_mean, save_invstd, running_mean, running_var);
  DPT_CHECK_LAUNCH("bn_train_kernel");
}

void bn_infer(BnIn x, float* y, bool relu, int64_t rows, int c, const float* running_mean,
              const float* running_var, const float* w, const float* b, float eps, cudaStream_t s) {
  if (c <= 0 || rows <= 0) return;
  const Tiles t = tiles_for(c, "bn_infer");
  const dim3 grid = pass_grid(t, rows), block = block_of(t);
  if (x.bf16)
    bn_infer_kernel<<<grid, block, 0, s>>>(as16(x.p), y, relu, rows, c, running_mean, running_var, w, b, eps);
  else
    bn_infer_kernel<<<grid, block, 0, s>>>(static_cast<const float*>(x.p), y, relu, rows, c, running_mean,
                                           running_var, w, b, eps);
  DPT_CHECK_LAUNCH("bn_infer_kernel");
}

void bn_param_grads(const double* sums, const float* invstd, int c, float* dw, float* db,
                    bool accumulate, cudaStream_t s) {
  if (c <= 0) return;
  bn_param_grads_kernel<<<grid_for(size_t(c)), kThreads, 0, s>>>(sums, invstd, c, dw, db, accumulate);
  DPT_CHECK_LAUNCH("bn_param_grads_kernel");
}

template <class TX>
void backward_pass(const float* dy, const TX* x, const void* relu_out, bool relu_out_bf16, float* dx, int64_t rows,
                   int c, const double* sums, const float* mean, const float* invstd, const float* w, cudaStream_t s) {
  const Tiles t = tiles_for(c, "bn_backward");
  const dim3 grid = pass_grid(t, rows), block = block_of(t);
  if (!relu_out)
    bn_backward_kernel<Mask::none><<<grid, block, 0, s>>>(dy, x, nullptr, dx, rows, c, sums, mean, invstd, w);
  else if (relu_out_bf16)
    bn_backward_kernel<Mask::bf16><<<grid, block, 0, s>>>(dy, x, relu_out, dx, rows, c, sums, mean, invstd, w);
  else
    bn_backward_kernel<Mask::f32><<<grid, block, 0, s>>>(dy, x, relu_out, dx, rows, c, sums, mean, invstd, w);
  DPT_CHECK_LAUNCH("bn_backward_kernel");
}

void bn_backward(const float* dy, BnIn x, const void* relu_out, bool relu_out_bf16, float* dx, int64_t rows, int c,
                 const double* sums, const float* mean, const float* invstd, const float* w, cudaStream_t s) {
  if (c <= 0 || rows <= 0) return;
  if (x.bf16) backward_pass(dy, as16(x.p), relu_out, relu_out_bf16, dx, rows, c, sums, mean, invstd, w, s);
  else backward_pass(dy, static_cast<const float*>(x.p), relu_out, relu_out_bf16, dx, rows, c, sums, mean, invstd, w, s);
}

// float4 over the first n / 4 · 4 values when both are 16-byte aligned, the rest one by one.
void add(const float* x, float* y, size_t n, cudaStream_t s) {
  size_t done = 0;
  if (aligned16(x) && aligned16(y) && n >= 4) {
    add4_kernel<<<grid_for(n / 4), kThreads, 0, s>>>(reinterpret_cast<const float4*>(x),
                                                     reinterpret_cast<float4*>(y), n / 4);
    DPT_CHECK_LAUNCH("add4_kernel");
    done = n / 4 * 4;
  }
  if (done < n) {
    add_kernel<<<grid_for(n - done), kThreads, 0, s>>>(x + done, y + done, n - done);
    DPT_CHECK_LAUNCH("add_kernel");
  }
}

// As add: float4 where every pointer allows (the bf16 copy's 8 bytes per four), the rest one by one.
void residual_sum(const float* body, const float* shortcut, float* y, void* y16, size_t n, bool relu, cudaStream_t s) {
  auto* o16 = static_cast<__nv_bfloat16*>(y16);
  size_t done = 0;
  if (aligned16(body) && aligned16(shortcut) && aligned16(y) && reinterpret_cast<uintptr_t>(y16) % 8 == 0 && n >= 4) {
    residual_sum4_kernel<<<grid_for(n / 4), kThreads, 0, s>>>(
        reinterpret_cast<const float4*>(body), reinterpret_cast<const float4*>(shortcut), reinterpret_cast<float4*>(y),
        reinterpret_cast<__nv_bfloat162*>(o16), n / 4, relu);
    DPT_CHECK_LAUNCH("residual_sum4_kernel");
    done = n / 4 * 4;
  }
  if (done < n) {
    residual_sum_kernel<<<grid_for(n - done), kThreads, 0, s>>>(body + done, shortcut + done, y + done,
                                                                o16 ? o16 + done : nullptr, n - done, relu);
    DPT_CHECK_LAUNCH("residual_sum_kernel");
  }
}

void global_avgpool_forward(const float* x, float* y, int batch, int hw, int c, cudaStream_t s) {
  if (batch <= 0 || c <= 0) return;
  const Tiles t = tiles_for(c, "global_avgpool_forward");
  gap_fwd_kernel<<<pass_grid(t, batch), block_of(t), 0, s>>>(x, y, batch, hw, c);
  DPT_CHECK_LAUNCH("gap_fwd_kernel");
}

void global_avgpool_backward(const float* dy, float* dx, int batch, int hw, int c, cudaStream_t s) {
  if (batch <= 0 || c <= 0 || hw <= 0) return;
  const Tiles t = tiles_for(c, "global_avgpool_backward");
  gap_bwd_kernel<<<pass_grid(t, batch), block_of(t), 0, s>>>(dy, dx, batch, hw, c, 1.f / float(hw));
  DPT_CHECK_LAUNCH("gap_bwd_kernel");
}

void padded_pool_forward(const float* x, float* y, int32_t* argmax, const PoolGeom& g, bool max,
                         cudaStream_t s) {
  if (g.batch <= 0 || g.c <= 0 || g.oh() <= 0 || g.ow() <= 0) return;
  const Tiles t = tiles_for(g.c, "padded_pool_forward");
  const int64_t pixels = int64_t(g.batch) * g.oh() * g.ow();
  if (pixels >= kMaxPoolPixels) throw Error("padded_pool_forward: " + std::to_string(pixels) + " output pixels exceed 2^31");
  const dim3 grid = pass_grid(t, pixels), block = block_of(t);
  const Div plane(g.oh() * g.ow()), ow_n(g.ow());
  if (max) padded_pool_fwd_kernel<true><<<grid, block, 0, s>>>(x, y, argmax, g, plane, ow_n, int(pixels));
  else padded_pool_fwd_kernel<false><<<grid, block, 0, s>>>(x, y, nullptr, g, plane, ow_n, int(pixels));
  DPT_CHECK_LAUNCH("padded_pool_fwd_kernel");
}

void padded_pool_backward(const float* dy, const int32_t* argmax, float* dx, const PoolGeom& g, bool max,
                          cudaStream_t s) {
  if (g.batch <= 0 || g.c <= 0 || g.h <= 0 || g.w <= 0) return;
  const Tiles t = tiles_for(g.c, "padded_pool_backward");
  const int64_t pixels = int64_t(g.batch) * g.h * g.w;
  if (pixels >= kMaxPoolPixels) throw Error("padded_pool_backward: " + std::to_string(pixels) + " input pixels exceed 2^31");
  const dim3 grid = pass_grid(t, pixels), block = block_of(t);
  const Div plane(g.h * g.w), w_n(g.w), st(g.stride);
  if (max) padded_pool_bwd_kernel<true><<<grid, block, 0, s>>>(dy, argmax, dx, g, plane, w_n, st, g.oh(), g.ow(), int(pixels));
  else padded_pool_bwd_kernel<false><<<grid, block, 0, s>>>(dy, nullptr, dx, g, plane, w_n, st, g.oh(), g.ow(), int(pixels));
  DPT_CHECK_LAUNCH("padded_pool_bwd_kernel");
}

void softmax_xent_smoothed(const float* logits, const int32_t* labels, int batch, int classes,
                           float grad_scale, float eps, float* dlogits, double* row_loss,
                           int* row_ok, float* stats, cudaStream_t s) {
  if (batch <= 0) return;
  const int rows_per_block = kThreads / 32;
  xent_smoothed_rows<<<unsigned((batch + rows_per_block - 1) / rows_per_block), kThreads, 0, s>>>(
      logits, labels, batch, classes, grad_scale, eps, dlogits, row_loss, row_ok);
  DPT_CHECK_LAUNCH("xent_smoothed_rows");
  if (stats) {
    loss_totals<double, kThreads><<<1, kThreads, 0, s>>>(row_loss, row_ok, batch, stats);
    DPT_CHECK_LAUNCH("loss_totals");
  }
}

}  // namespace dpt::cuda
