// The CUDA backend's batch-norm kernels: per-channel sums (forward: x; backward: dy and
// dy·(x − mean)), the training and evaluation affine passes, the parameter gradients and the
// input gradient. Kernels first, launchers after. Channel tiles: channel_tiles.cuh.
//
// Operands. x and dy are read as float or as bf16 (under bf16 precision, a convolution's bf16
// output or input gradient kept as it is: Backend::note_bn_input, Backend::note_grad_use); the
// input gradient is written as float or bf16 (read only by the convolution below). Each value
// is widened to float on load, so a bf16 operand gives the bits its widened float copy gives.
//
// Vector kernels. Where c is a multiple of 8 and every operand is 16-byte aligned (all of
// ResNet's layers), a thread reads and writes eight consecutive channels at once (16 or 32
// bytes): the scalar kernels' two-to-four-byte accesses left the passes at a quarter to a half
// of HBM's bandwidth. Each kernel is one template on that width (W = 1 or 8), so both widths do
// the same arithmetic per value. The passes' per-channel coefficients come from the kernel that
// totals the sums (bn_train, bn_train_backward) or, where a sync_bn sum over ranks comes
// between, from a small kernel of one thread per channel: never from every thread of a pass.
//
// Determinism. A reduction is per-thread sums in a fixed row order, a fixed tree over the
// block's row lanes, per-block partials in scratch, then a second kernel that sums each
// channel's partials in block order the same way. The block count depends on the shape only,
// not on the device.
//
// Launches. Every kernel here waits for the kernel before it in its first statement and lets the
// next one be scheduled in its second (early_launch.cuh), and is launched with launch_early():
// a batch norm is three kernels forward and three backward, each a few microseconds at
// resnet18(stem=small)'s sizes, and their boundaries cost as much again (the step at batch 256:
// 3.22-3.24 ms launched plainly, DPT_PDL=0; 3.17-3.20 launched early, 2026-12-03).
//
// Fast math. The build compiles CUDA with --use_fast_math: single-precision division, sqrt, exp
// and log become approximate, denormals flush to zero, and nvcc contracts a·b + c into an FMA.
// Double precision is untouched, so per-channel statistics are computed in double and rounded
// to float once, as the CPU backend does; the elementwise passes use __fmul_rn / __fadd_rn /
// __fsub_rn (never contracted, IEEE-rounded) in the CPU's operation order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "channel_tiles.cuh"
#include "device_util.cuh"
#include "dpt/cuda_check.hpp"
#include "early_launch.cuh"
#include "norm_kernels.cuh"

namespace dpt::cuda {
namespace {

// ============================== kernels ==============================

// A ReLU's backward folded into batch norm's (Backend::bn_backward_sums' relu_out): dy where the
// forward output is > 0. The output is read as float, or as its bf16 copy (2 bytes instead of
// 4): a positive float is a positive bf16 (flushed denormals aside, which the fast-math kernels
// that wrote it never produce), so both give the same mask.
enum class Mask { none, f32, bf16 };

// The vector kernels' channels per thread (device_util.cuh's ld8 / st8).
constexpr int kVec = 8;

// W consecutive values from element i: one (W = 1) or eight (W = kVec, 16-byte aligned), widened
// to float on load and rounded to the type on store.
template <int W, class T> __device__ __forceinline__ void ldw(const T* p, size_t i, float (&v)[W]) {
  if constexpr (W == kVec) ld8(p, i, v);
  else v[0] = ld(p, i);
}
template <int W, class T> __device__ __forceinline__ void stw(T* p, size_t i, const float (&v)[W]) {
  if constexpr (W == kVec) st8(p, i, v);
  else st(p, i, v[0]);
}

// d = dy where relu_out > 0, else 0, for the W values from element i.
template <Mask M, int W> __device__ __forceinline__ void mask_w(const void* relu_out, size_t i, float (&d)[W]) {
  if constexpr (M != Mask::none) {
    float m[W];
    if constexpr (M == Mask::f32) ldw<W>(static_cast<const float*>(relu_out), i, m);
    else ldw<W>(static_cast<const __nv_bfloat16*>(relu_out), i, m);
    for (int k = 0; k < W; ++k) d[k] = m[k] > 0.f ? d[k] : 0.f;
  }
}

// Partial sums. Block (x, y) takes the W·tc channels of tile blockIdx.y (W per thread: channel()
// is a group of W) and rows [chunk·chunk_rows, +chunk_rows), chunk = blockIdx.x; its sums
// [Σa (c), Σa·b (c)], with b = a = x (forward) or a = dy (masked), b = x − mean (backward), in
// double as the CPU's, go to partial column-major: partial[col·chunks + chunk] (the totals
// then read each column's partials contiguously). The forward pass reads x only. A thread adds
// its rows in ascending order, a load at a time: loading two or four rows ahead (more
// registers, fewer blocks per SM) measured slower on the H200 (2026-12-02). Four blocks per SM
// at most 64 registers a thread: the backward kernels took 72-80, three blocks per SM, and the
// 512 blocks of kReduceBlocks ran in two waves on the H200's 132 SMs (396 resident, then 116);
// capped, they spill 8-104 bytes a thread and run in one (resnet18(stem=small)'s bf16 step at
// batch 256 3.29-3.31 -> 3.22-3.24 ms, 2026-12-03).
template <int W, bool BWD, Mask M, class TX, class TD>
__global__ void __launch_bounds__(kThreads, 4)
    bn_partial_kernel(const TD* __restrict__ a, const TX* __restrict__ x, const float* __restrict__ mean,
                      const void* __restrict__ relu_out, int64_t rows, int c, int64_t chunk_rows, int64_t chunks,
                      double* __restrict__ partial) {
  wait_for_prior_kernel();
  allow_next_kernel();
  const int j0 = channel() * W;
  const int64_t r0 = int64_t(blockIdx.x) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  double v[2 * W] = {};
  if (j0 < c) {
    double m[W] = {};
    if constexpr (BWD)
      for (int k = 0; k < W; ++k) m[k] = mean[j0 + k];
    for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
      const size_t i = size_t(r) * size_t(c) + size_t(j0);
      float xv[W];
      ldw<W>(x, i, xv);
      if constexpr (BWD) {
        float d[W];
        ldw<W>(a, i, d);
        mask_w<M, W>(relu_out, i, d);
        for (int k = 0; k < W; ++k) {
          v[k] += double(d[k]);
          v[W + k] += double(d[k]) * (double(xv[k]) - m[k]);
        }
      } else {
        for (int k = 0; k < W; ++k) {
          const double e = xv[k];
          v[k] += e;
          v[W + k] += e * e;
        }
      }
    }
  }
  lane_sums(v);
  if (threadIdx.y == 0 && j0 < c)
    for (int k = 0; k < W; ++k) {
      partial[size_t(j0 + k) * size_t(chunks) + blockIdx.x] = v[k];
      partial[size_t(c + j0 + k) * size_t(chunks) + blockIdx.x] = v[W + k];
    }
}

struct BnStats {
  double mean, var, invstd;
};

// The CPU's formulas in double, from a channel's sums s0 = Σx, s1 = Σx² over n rows. The
// variance's product is kept unfused (__dmul_rn): E[x²] − mean² cancels, and the CPU rounds
// mean² before subtracting.
__device__ BnStats bn_stats(double s0, double s1, double n, float eps) {
  const double mean = s0 / n;
  const double var = fmax(0.0, s1 / n - __dmul_rn(mean, mean));
  return {mean, var, 1.0 / sqrt(var + double(eps))};
}

// What the training pass needs beyond the sums: parameters, the statistics it saves and moves,
// and where its per-channel coefficients go (coef = [scale (c), shift (c)]).
struct TrainArgs {
  const float* w;
  const float* b;
  float eps, momentum;
  float* save_mean;
  float* save_invstd;
  float* running_mean;  // or nullptr (then running_var too)
  float* running_var;
  float* coef;
};

// Channel j's training statistics from its sums: the saved mean and invstd, the running stats
// moved, and the affine pass's scale and shift.
__device__ void train_channel(double s0, double s1, double n, int c, int j, const TrainArgs& t) {
  const BnStats st = bn_stats(s0, s1, n, t.eps);
  t.save_mean[j] = float(st.mean);
  t.save_invstd[j] = float(st.invstd);
  const double mom = t.momentum;
  const double unbiased = n > 1 ? st.var * n / (n - 1) : st.var;
  if (t.running_mean) t.running_mean[j] = float(mom * st.mean + (1.0 - mom) * t.running_mean[j]);
  if (t.running_var) t.running_var[j] = float(mom * unbiased + (1.0 - mom) * t.running_var[j]);
  t.coef[j] = float(st.invstd * t.w[j]);
  t.coef[c + j] = float(t.b[j] - st.mean * st.invstd * t.w[j]);
}

// What the backward pass needs beyond the sums: the saved statistics and weight for the input
// gradient's coefficients (coef = [k (c), m (c), off (c), mean (c)], nullptr: no input gradient),
// and the parameter gradients (dw, db: nullptr where not made here).
struct BackwardArgs {
  const float* mean;
  const float* invstd;
  const float* w;
  float* coef;
  float* dw;
  float* db;
  bool accumulate;
};

// dx = k·dy − off − m·(x − mean) with the CPU's per-channel k, m, off (double, rounded to float)
// and its operation order, from the sums s0 = Σdy, s1 = Σdy·(x − mean) over n rows.
__device__ void backward_channel(double s0, double s1, double n, int c, int j, const BackwardArgs& p) {
  if (p.dw) {
    const float gw = float(s1 * p.invstd[j]), gb = float(s0);
    p.dw[j] = p.accumulate ? p.dw[j] + gw : gw;
    p.db[j] = p.accumulate ? p.db[j] + gb : gb;
  }
  if (p.coef) {
    const double kj = double(p.w[j]) * p.invstd[j];
    p.coef[j] = float(kj);
    p.coef[c + j] = float(kj * double(p.invstd[j]) * p.invstd[j] * s1 / n);
    p.coef[2 * c + j] = float(kj * s0 / n);
    p.coef[3 * c + j] = p.mean[j];
  }
}

// What a reduction's totals feed: nothing (the sums alone, which a caller may add over ranks
// first), the training pass's statistics, or the backward pass's gradients and coefficients.
enum class Finish { sums, train, backward };

// The totals: sums[j] and sums[c + j] = Σ over the chunks of their partials, chunk ascending
// per thread, then a fixed tree over the block's threads; sums[2c] = count. A channel per block
// (grid-stride over the channels): each thread adds at most kReduceBlocks / kThreads partials,
// contiguous across the warp. Then channel j's train_channel or backward_channel from those
// totals (not from sums, whose count another block writes) in the same kernel.
template <Finish F>
__global__ void bn_totals_kernel(const double* __restrict__ partial, int64_t chunks, int c, double count,
                                 double* __restrict__ sums, TrainArgs t, BackwardArgs bw) {
  wait_for_prior_kernel();
  allow_next_kernel();
  __shared__ double sh[2][kThreads];
  for (int j = blockIdx.x; j < c; j += gridDim.x) {
    const double* p0 = partial + size_t(j) * size_t(chunks);
    const double* p1 = partial + size_t(c + j) * size_t(chunks);
    double v0 = 0.0, v1 = 0.0;
#pragma unroll 4
    for (int64_t k = threadIdx.x; k < chunks; k += blockDim.x) {
      v0 += p0[k];
      v1 += p1[k];
    }
    sh[0][threadIdx.x] = v0;
    sh[1][threadIdx.x] = v1;
    for (int h = blockDim.x / 2; h > 0; h /= 2) {
      __syncthreads();
      if (int(threadIdx.x) < h) {
        sh[0][threadIdx.x] += sh[0][threadIdx.x + h];
        sh[1][threadIdx.x] += sh[1][threadIdx.x + h];
      }
    }
    if (threadIdx.x == 0) {
      const double s0 = sh[0][0], s1 = sh[1][0];
      sums[j] = s0;
      sums[c + j] = s1;
      if constexpr (F == Finish::train) train_channel(s0, s1, count, c, j, t);
      if constexpr (F == Finish::backward) backward_channel(s0, s1, count, c, j, bw);
    }
    __syncthreads();
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) sums[2 * c] = count;
}

// The same per-channel work from sums already totalled (and maybe added over ranks): one thread
// per channel.
__global__ void bn_train_coef_kernel(const double* __restrict__ sums, int c, TrainArgs t) {
  wait_for_prior_kernel();
  allow_next_kernel();
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x)
    train_channel(sums[j], sums[c + j], sums[2 * c], c, j, t);
}

// backward_channel's work: the parameter gradients (bn_param_grads), or the input gradient's
// coefficients (bn_backward).
__global__ void bn_backward_channels_kernel(const double* __restrict__ sums, int c, BackwardArgs bw) {
  wait_for_prior_kernel();
  allow_next_kernel();
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x)
    backward_channel(sums[j], sums[c + j], sums[2 * c], c, j, bw);
}

// y = x·scale + shift, rounded as the CPU's multiply then add; then max(y, 0) with relu
// (act_fwd's expression).
__device__ __forceinline__ float affine(float x, float scale, float shift, bool relu) {
  const float v = __fadd_rn(__fmul_rn(x, scale), shift);
  return relu ? (v > 0.f ? v : 0.f) : v;
}

// The affine pass with coef = [scale (c), shift (c)]: y unless nullptr, and its bf16 copy into
// y16 unless nullptr. W channels per thread.
template <int W, class TX>
__global__ void bn_train_pass(const TX* x, float* y, __nv_bfloat16* y16, bool relu, int64_t rows, int c,
                              const float* __restrict__ coef) {
  wait_for_prior_kernel();
  allow_next_kernel();
  const int j0 = channel() * W;
  if (j0 >= c) return;
  float scale[W], shift[W];
  ldw<W>(coef, size_t(j0), scale);
  ldw<W>(coef, size_t(c) + size_t(j0), shift);
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const size_t i = size_t(r) * size_t(c) + size_t(j0);
    float v[W];
    ldw<W>(x, i, v);
    for (int k = 0; k < W; ++k) v[k] = affine(v[k], scale[k], shift[k], relu);
    if (y) stw<W>(y, i, v);
    if (y16) stw<W>(y16, i, v);
  }
}

// residual_sum with a batch norm's affine pass deferred into it (BnTerm): a term with coef is
// affine() of its x without ReLU, rounded to bf16 where its output would have been kept so; then
// the sum and the block's ReLU as residual_sum's kernel (norm.cu) computes them. Channel tiles as
// the affine pass, so each thread keeps its channels' coefficients in registers.
template <int W, class TA, class TB>
__global__ void residual_sum_bn_pass(const TA* a, BnTerm ta, const TB* b, BnTerm tb, float* y, __nv_bfloat16* y16,
                                     int64_t rows, int c, bool relu) {
  wait_for_prior_kernel();
  allow_next_kernel();
  const int j0 = channel() * W;
  if (j0 >= c) return;
  float sa[W] = {}, ha[W] = {}, sb[W] = {}, hb[W] = {};
  if (ta.coef) {
    ldw<W>(ta.coef, size_t(j0), sa);
    ldw<W>(ta.coef, size_t(c) + size_t(j0), ha);
  }
  if (tb.coef) {
    ldw<W>(tb.coef, size_t(j0), sb);
    ldw<W>(tb.coef, size_t(c) + size_t(j0), hb);
  }
  auto term = [](float x, float scale, float shift, bool round16) {
    const float v = affine(x, scale, shift, false);
    return round16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
  };
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const size_t i = size_t(r) * size_t(c) + size_t(j0);
    float p[W], q[W];
    ldw<W>(a, i, p);
    ldw<W>(b, i, q);
    for (int k = 0; k < W; ++k) {
      if (ta.coef) p[k] = term(p[k], sa[k], ha[k], ta.round16);
      if (tb.coef) q[k] = term(q[k], sb[k], hb[k], tb.round16);
      const float v = p[k] + q[k];
      p[k] = relu ? (v > 0.f ? v : 0.f) : v;
    }
    if (y) stw<W>(y, i, p);
    if (y16) stw<W>(y16, i, p);
  }
}

template <class TX>
__global__ void bn_infer_kernel(const TX* x, float* y, bool relu, int64_t rows, int c,
                                const float* __restrict__ running_mean, const float* __restrict__ running_var,
                                const float* __restrict__ w, const float* __restrict__ b, float eps) {
  wait_for_prior_kernel();
  allow_next_kernel();
  const int j = channel();
  if (j >= c) return;
  const double invstd = 1.0 / sqrt(double(running_var[j]) + double(eps));
  const float scale = float(invstd * w[j]), shift = float(b[j] - running_mean[j] * invstd * w[j]);
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const size_t i = size_t(r) * size_t(c) + size_t(j);
    y[i] = affine(ld(x, i), scale, shift, relu);
  }
}

// The input gradient with coef = [k, m, off, mean] (backward_channel's), dy masked by relu_out
// (M). dx may be dy (the same buffer, or dy's bf16 tensor with dx's): each element is read
// before it is written, by the same thread.
template <int W, Mask M, class TX, class TD, class TO>
__global__ void bn_backward_pass(const TD* dy, const TX* x, const void* relu_out, TO* dx, int64_t rows, int c,
                                 const float* __restrict__ coef) {
  wait_for_prior_kernel();
  allow_next_kernel();
  const int j0 = channel() * W;
  if (j0 >= c) return;
  float k[W], m[W], off[W], mu[W];
  ldw<W>(coef, size_t(j0), k);
  ldw<W>(coef, size_t(c) + size_t(j0), m);
  ldw<W>(coef, 2 * size_t(c) + size_t(j0), off);
  ldw<W>(coef, 3 * size_t(c) + size_t(j0), mu);
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const size_t i = size_t(r) * size_t(c) + size_t(j0);
    float d[W], v[W];
    ldw<W>(dy, i, d);
    mask_w<M, W>(relu_out, i, d);
    ldw<W>(x, i, v);
    for (int q = 0; q < W; ++q)
      d[q] = __fsub_rn(__fsub_rn(__fmul_rn(k[q], d[q]), off[q]), __fmul_rn(m[q], __fsub_rn(v[q], mu[q])));
    stw<W>(dx, i, d);
  }
}

// ============================== launchers ==============================

// The vector kernels' condition: whole groups of eight channels, every operand 16-byte aligned
// (then every group is: a row is c values).
bool vec8(int c, std::initializer_list<const void*> ps) {
  if (c % kVec != 0) return false;
  for (const void* p : ps)
    if (p && !aligned16(p)) return false;
  return true;
}

// The tiling of the columns a kernel's threads take: channels, or groups of eight.
Tiles bn_tiles(int c, bool vec, const char* op) { return tiles_for(vec ? c / kVec : c, op); }

// Row chunks of a reduction over (rows, c): about kReduceBlocks blocks in all, at least a row
// per row lane. A function of the shape only (the scratch is sized by it before the operands
// are known): the vector kernels' tiling where c allows them, which the scalar kernel also
// takes when an operand is misaligned.
int64_t bn_chunks(int64_t rows, int c) {
  const Tiles t = bn_tiles(c, c % kVec == 0, "bn sums");
  const int64_t want = std::max<int64_t>(1, kReduceBlocks / t.count);
  const int64_t fill = std::max<int64_t>(1, (rows + t.lanes - 1) / t.lanes);
  return std::min(want, fill);
}


// The partial sums of (rows, c) into `partial`, then bn_totals_kernel<F>: the totals into sums
// and F's per-channel work.
template <Finish F, bool BWD, Mask M, class TX, class TD>
void reduce(const TD* a, const TX* x, const float* mean, const void* relu_out, int64_t rows, int c, double* sums,
            double* partial, const TrainArgs& t, const BackwardArgs& bw, cudaStream_t s) {
  if (c < 0 || rows < 0) throw Error("bn sums: negative shape");
  const int64_t chunks = c > 0 ? bn_chunks(rows, c) : 0;
  if (chunks > 0) {
    const bool vec = vec8(c, {a, x, relu_out});
    const Tiles tl = bn_tiles(c, vec, "bn sums");
    const int64_t chunk_rows = (rows + chunks - 1) / chunks;
    const dim3 grid(unsigned(chunks), unsigned(tl.count)), block = block_of(tl);
    launch_early("bn_partial_kernel", vec ? bn_partial_kernel<kVec, BWD, M, TX, TD> : bn_partial_kernel<1, BWD, M, TX, TD>,
                 grid, block, s, a, x, mean, relu_out, rows, c, chunk_rows, chunks, partial);
  }
  const unsigned blocks = unsigned(std::clamp<int64_t>(c, 1, 65535));
  launch_early("bn_totals_kernel", bn_totals_kernel<F>, dim3(blocks), dim3(kThreads), s, partial, chunks, c, double(rows),
               sums, t, bw);
}

// f(p) with p the operand's typed pointer.
template <class F> void typed(BnIn t, F&& f) {
  if (t.bf16) f(static_cast<const __nv_bfloat16*>(t.p));
  else f(static_cast<const float*>(t.p));
}
template <class F> void typed(BnOut t, F&& f) {
  if (t.bf16) f(static_cast<__nv_bfloat16*>(t.p));
  else f(static_cast<float*>(t.p));
}

// f(std::integral_constant<Mask, M>) for relu_out's mask kind.
template <class F> void masked(const void* relu_out, bool relu_out_bf16, F&& f) {
  if (!relu_out) f(std::integral_constant<Mask, Mask::none>{});
  else if (relu_out_bf16) f(std::integral_constant<Mask, Mask::bf16>{});
  else f(std::integral_constant<Mask, Mask::f32>{});
}

template <Finish F>
void backward_reduce(BnIn dy, BnIn x, const float* mean, const void* relu_out, bool relu_out_bf16, int64_t rows,
                     int c, double* sums, double* partial, const BackwardArgs& bw, cudaStream_t s) {
  typed(dy, [&](auto d) {
    typed(x, [&](auto xp) {
      masked(relu_out, relu_out_bf16, [&](auto mask) {
        reduce<F, true, decltype(mask)::value>(d, xp, mean, relu_out, rows, c, sums, partial, TrainArgs{}, bw, s);
      });
    });
  });
}

// The affine pass over coef (train_channel's, already in place).
void train_pass(BnIn x, float* y, void* y16, bool relu, int64_t rows, int c, const float* coef, cudaStream_t s) {
  auto* o16 = static_cast<__nv_bfloat16*>(y16);
  const bool vec = vec8(c, {x.p, y, y16, coef});
  const Tiles t = bn_tiles(c, vec, "bn_forward");
  const dim3 grid = pass_grid(t, rows), block = block_of(t);
  typed(x, [&](auto xp) {
    using TX = std::remove_const_t<std::remove_pointer_t<decltype(xp)>>;
    launch_early("bn_train_pass", vec ? bn_train_pass<kVec, TX> : bn_train_pass<1, TX>, grid, block, s, xp, y, o16, relu,
                 rows, c, coef);
  });
}

// The input-gradient pass over coef (backward_channel's, already in place).
void backward_pass(BnIn dy, BnIn x, const void* relu_out, bool relu_out_bf16, BnOut dx, int64_t rows, int c,
                   const float* coef, cudaStream_t s) {
  const bool vec = vec8(c, {dy.p, x.p, relu_out, dx.p, coef});
  const Tiles t = bn_tiles(c, vec, "bn_backward");
  const dim3 grid = pass_grid(t, rows), block = block_of(t);
  typed(dy, [&](auto d) {
    typed(x, [&](auto xp) {
      typed(dx, [&](auto o) {
        masked(relu_out, relu_out_bf16, [&](auto mask) {
          constexpr Mask M = decltype(mask)::value;
          using TD = std::remove_const_t<std::remove_pointer_t<decltype(d)>>;
          using TX = std::remove_const_t<std::remove_pointer_t<decltype(xp)>>;
          using TO = std::remove_pointer_t<decltype(o)>;
          launch_early("bn_backward_pass", vec ? bn_backward_pass<kVec, M, TX, TD, TO> : bn_backward_pass<1, M, TX, TD, TO>,
                       grid, block, s, d, xp, relu_out, o, rows, c, coef);
        });
      });
    });
  });
}

}  // namespace

size_t bn_partial_doubles(int64_t rows, int c) {
  return c > 0 ? size_t(bn_chunks(rows, c)) * 2 * size_t(c) : 0;
}

void bn_sums(BnIn x, int64_t rows, int c, double* sums, double* partial, cudaStream_t s) {
  typed(x, [&](auto xp) {
    reduce<Finish::sums, false, Mask::none>(static_cast<const float*>(nullptr), xp, nullptr, nullptr, rows, c, sums,
                                            partial, TrainArgs{}, BackwardArgs{}, s);
  });
}

void bn_backward_sums(BnIn dy, BnIn x, int64_t rows, int c, const float* mean, const void* relu_out,
                      bool relu_out_bf16, double* sums, double* partial, cudaStream_t s) {
  backward_reduce<Finish::sums>(dy, x, mean, relu_out, relu_out_bf16, rows, c, sums, partial, BackwardArgs{}, s);
}

void bn_forward(BnIn x, float* y, void* y16, bool relu, int64_t rows, int c, const double* sums,
                const float* w, const float* b, float eps, float momentum, float* save_mean, float* save_invstd,
                float* running_mean, float* running_var, float* coef, cudaStream_t s) {
  if (c <= 0) return;
  const TrainArgs t{w, b, eps, momentum, save_mean, save_invstd, running_mean, running_var, coef};
  launch_early("bn_train_coef_kernel", bn_train_coef_kernel, dim3(grid_for(size_t(c))), dim3(kThreads), s, sums, c, t);
  train_pass(x, y, y16, relu, rows, c, coef, s);
}

void bn_train(BnIn x, float* y, void* y16, bool relu, int64_t rows, int c, double* sums, double* partial,
              const float* w, const float* b, float eps, float momentum, float* save_mean, float* save_invstd,
              float* running_mean, float* running_var, float* coef, cudaStream_t s) {
  const TrainArgs t{w, b, eps, momentum, save_mean, save_invstd, running_mean, running_var, coef};
  typed(x, [&](auto xp) {
    reduce<Finish::train, false, Mask::none>(static_cast<const float*>(nullptr), xp, nullptr, nullptr, rows, c, sums,
                                             partial, t, BackwardArgs{}, s);
  });
  if (c > 0 && (y || y16)) train_pass(x, y, y16, relu, rows, c, coef, s);
}

void residual_sum_bn(Operand body, BnTerm tb, Operand shortcut, BnTerm ts, float* y, void* y16, size_t n, int c,
                     bool relu, cudaStream_t s) {
  if (n == 0) return;
  if (c <= 0 || n % size_t(c) != 0) throw Error("residual_sum_bn: " + std::to_string(n) + " values of " +
                                                std::to_string(c) + " channels");
  const int64_t rows = int64_t(n / size_t(c));
  auto* o16 = static_cast<__nv_bfloat16*>(y16);
  const bool vec = vec8(c, {body.p, shortcut.p, y, y16, tb.coef, ts.coef});
  const Tiles t = bn_tiles(c, vec, "residual_sum_bn");
  const dim3 grid = pass_grid(t, rows), block = block_of(t);
  typed(body, [&](auto pa) {
    typed(shortcut, [&](auto pb) {
      using TA = std::remove_const_t<std::remove_pointer_t<decltype(pa)>>;
      using TB = std::remove_const_t<std::remove_pointer_t<decltype(pb)>>;
      launch_early("residual_sum_bn_pass", vec ? residual_sum_bn_pass<kVec, TA, TB> : residual_sum_bn_pass<1, TA, TB>,
                   grid, block, s, pa, tb, pb, ts, y, o16, rows, c, relu);
    });
  });
}

void bn_infer(BnIn x, float* y, bool relu, int64_t rows, int c, const float* running_mean,
              const float* running_var, const float* w, const float* b, float eps, cudaStream_t s) {
  if (c <= 0 || rows <= 0) return;
  const Tiles t = tiles_for(c, "bn_infer");
  const dim3 grid = pass_grid(t, rows), block = block_of(t);
  typed(x, [&](auto xp) {
    bn_infer_kernel<<<grid, block, 0, s>>>(xp, y, relu, rows, c, running_mean, running_var, w, b, eps);
  });
  DPT_CHECK_LAUNCH("bn_infer_kernel");
}

void bn_param_grads(const double* sums, const float* invstd, int c, float* dw, float* db,
                    bool accumulate, cudaStream_t s) {
  if (c <= 0) return;
  const BackwardArgs bw{nullptr, invstd, nullptr, nullptr, dw, db, accumulate};
  launch_early("bn_backward_channels_kernel", bn_backward_channels_kernel, dim3(grid_for(size_t(c))), dim3(kThreads), s,
               sums, c, bw);
}

void bn_backward(BnIn dy, BnIn x, const void* relu_out, bool relu_out_bf16, BnOut dx, int64_t rows, int c,
                 const double* sums, const float* mean, const float* invstd, const float* w, float* coef,
                 cudaStream_t s) {
  if (c <= 0 || rows <= 0) return;
  const BackwardArgs bw{mean, invstd, w, coef, nullptr, nullptr, false};
  launch_early("bn_backward_channels_kernel", bn_backward_channels_kernel, dim3(grid_for(size_t(c))), dim3(kThreads), s,
               sums, c, bw);
  backward_pass(dy, x, relu_out, relu_out_bf16, dx, rows, c, coef, s);
}

void bn_train_backward(BnIn dy, BnIn x, const void* relu_out, bool relu_out_bf16, BnOut dx, int64_t rows, int c,
                       double* sums, double* partial, const float* mean, const float* invstd, const float* w,
                       float* dw, float* db, bool accumulate, float* coef, cudaStream_t s) {
  const BackwardArgs bw{mean, invstd, w, dx.p ? coef : nullptr, dw, db, accumulate};
  backward_reduce<Finish::backward>(dy, x, mean, relu_out, relu_out_bf16, rows, c, sums, partial, bw, s);
  if (dx.p && c > 0 && rows > 0) backward_pass(dy, x, relu_out, relu_out_bf16, dx, rows, c, coef, s);
}

}  // namespace dpt::cuda
