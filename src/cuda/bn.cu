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
// of HBM's bandwidth. Their per-channel coefficients come from a small kernel run first (one
// thread per channel), not from every thread of the pass for its eight channels. The arithmetic
// per value is the scalar kernels', so both give the same bits for the passes; the sums differ
// only in their order.
//
// Determinism. A reduction is per-thread sums in a fixed row order, a fixed tree over the
// block's row lanes, per-block partials in scratch, then a second kernel that sums the partials
// in block order the same way. The block count depends on the shape only, not on the device.
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
#include "norm_kernels.cuh"

namespace dpt::cuda {
namespace {

// ============================== kernels ==============================

// A ReLU's backward folded into batch norm's (Backend::bn_backward_sums' relu_out): dy where the
// forward output is > 0. The output is read as float, or as its bf16 copy (2 bytes instead of
// 4): a positive float is a positive bf16 (flushed denormals aside, which the fast-math kernels
// that wrote it never produce), so both give the same mask.
enum class Mask { none, f32, bf16 };

template <Mask M, class TD> __device__ __forceinline__ float masked(const TD* dy, const void* relu_out, size_t i) {
  if constexpr (M == Mask::f32) return static_cast<const float*>(relu_out)[i] > 0.f ? ld(dy, i) : 0.f;
  else if constexpr (M == Mask::bf16)
    return __bfloat162float(static_cast<const __nv_bfloat16*>(relu_out)[i]) > 0.f ? ld(dy, i) : 0.f;
  else return ld(dy, i);
}

// The vector kernels' channels per thread (device_util.cuh's ld8 / st8).
constexpr int kVec = 8;

// d = dy where relu_out > 0, else 0 (masked's expression), for eight values.
template <Mask M> __device__ __forceinline__ void mask8(const void* relu_out, size_t i, float (&d)[kVec]) {
  if constexpr (M != Mask::none) {
    float m[kVec];
    if constexpr (M == Mask::f32) ld8(static_cast<const float*>(relu_out), i, m);
    else ld8(static_cast<const __nv_bfloat16*>(relu_out), i, m);
    for (int k = 0; k < kVec; ++k) d[k] = m[k] > 0.f ? d[k] : 0.f;
  }
}

// partial (chunks, 2c): chunk blockIdx.x's (rows [chunk·chunk_rows, +chunk_rows)) sums for the
// channels of tile blockIdx.y, [Σa (c), Σa·b (c)] with b = a = x (forward) or a = dy (masked),
// b = x − mean (backward), in double as the CPU's. The forward pass reads x only.
template <bool BWD, Mask M, class TX, class TD>
__global__ void bn_partial_kernel(const TD* __restrict__ a, const TX* __restrict__ x,
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

// The same with eight channels per thread (channel() is the group of eight).
template <bool BWD, Mask M, class TX, class TD>
__global__ void bn_partial8_kernel(const TD* __restrict__ a, const TX* __restrict__ x,
                                   const float* __restrict__ mean, const void* __restrict__ relu_out,
                                   int64_t rows, int c, int64_t chunk_rows, double* __restrict__ partial) {
  const int j0 = channel() * kVec;
  const int64_t r0 = int64_t(blockIdx.x) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  double v[2 * kVec] = {};
  if (j0 < c) {
    double m[kVec] = {};
    if constexpr (BWD)
      for (int k = 0; k < kVec; ++k) m[k] = mean[j0 + k];
    for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
      const size_t i = size_t(r) * size_t(c) + size_t(j0);
      float xv[kVec];
      ld8(x, i, xv);
      if constexpr (BWD) {
        float d[kVec];
        ld8(a, i, d);
        mask8<M>(relu_out, i, d);
        for (int k = 0; k < kVec; ++k) {
          v[k] += double(d[k]);
          v[kVec + k] += double(d[k]) * (double(xv[k]) - m[k]);
        }
      } else {
        for (int k = 0; k < kVec; ++k) {
          const double d = xv[k];
          v[k] += d;
          v[kVec + k] += d * d;
        }
      }
    }
  }
  lane_sums(v);
  if (threadIdx.y == 0 && j0 < c) {
    double* p = partial + size_t(blockIdx.x) * 2 * size_t(c);
    for (int k = 0; k < kVec; ++k) {
      p[j0 + k] = v[k];
      p[c + j0 + k] = v[kVec + k];
    }
  }
}

// out[j] = Σ over the chunks of partial[chunk][j] (cols columns), chunk ascending per thread,
// then a fixed tree over the block's threads; out[cols] = count. A column per block (grid-stride
// over the columns): each thread sums at most kReduceBlocks / kThreads chunks, so the chain of
// dependent double adds is short. With a tile of 32 columns per block a thread had summed 128,
// one L2 load after the other: about 50 µs for each of resnet18's reductions on the H200.
__global__ void column_total_kernel(const double* __restrict__ partial, int64_t chunks, int cols,
                                    double count, double* __restrict__ out) {
  __shared__ double sh[kThreads];
  for (int j = blockIdx.x; j < cols; j += gridDim.x) {
    double v = 0.0;
#pragma unroll 4
    for (int64_t k = threadIdx.x; k < chunks; k += blockDim.x) v += partial[size_t(k) * size_t(cols) + size_t(j)];
    sh[threadIdx.x] = v;
    for (int h = blockDim.x / 2; h > 0; h /= 2) {
      __syncthreads();
      if (int(threadIdx.x) < h) sh[threadIdx.x] += sh[threadIdx.x + h];
    }
    if (threadIdx.x == 0) out[j] = sh[0];
    __syncthreads();
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) out[cols] = count;
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

// Channel j's training statistics: scale and shift of the affine pass; the thread in row lane 0
// of block column 0 also writes the channel's saved mean and invstd and moves its running stats
// (once per channel).
__device__ void train_channel(const double* sums, const float* w, const float* b, int c, int j, float eps,
                              float momentum, float* save_mean, float* save_invstd, float* running_mean,
                              float* running_var, float& scale, float& shift, bool write_stats) {
  const BnStats st = bn_stats(sums, c, j, eps);
  if (write_stats) {
    save_mean[j] = float(st.mean);
    save_invstd[j] = float(st.invstd);
    const double n = sums[2 * c], mom = momentum;
    const double unbiased = n > 1 ? st.var * n / (n - 1) : st.var;
    if (running_mean) running_mean[j] = float(mom * st.mean + (1.0 - mom) * running_mean[j]);
    if (running_var) running_var[j] = float(mom * unbiased + (1.0 - mom) * running_var[j]);
  }
  scale = float(st.invstd * w[j]);
  shift = float(b[j] - st.mean * st.invstd * w[j]);
}

// y = x·scale + shift, rounded as the CPU's multiply then add; then max(y, 0) with relu
// (act_fwd's expression).
__device__ __forceinline__ float affine(float x, float scale, float shift, bool relu) {
  const float v = __fadd_rn(__fmul_rn(x, scale), shift);
  return relu ? (v > 0.f ? v : 0.f) : v;
}

// Down this thread's channel j: y unless nullptr, and its bf16 copy into y16 unless nullptr.
template <class TX>
__device__ void affine_rows(const TX* x, float* y, __nv_bfloat16* y16, int64_t rows, int c, int j,
                            float scale, float shift, bool relu) {
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const size_t i = size_t(r) * size_t(c) + size_t(j);
    const float v = affine(ld(x, i), scale, shift, relu);
    if (y) y[i] = v;
    if (y16) y16[i] = __float2bfloat16_rn(v);
  }
}

template <class TX>
__global__ void bn_train_kernel(const TX* x, float* y, __nv_bfloat16* y16, bool relu, int64_t rows, int c,
                                const double* __restrict__ sums, const float* __restrict__ w,
                                const float* __restrict__ b, float eps, float momentum,
                                float* __restrict__ save_mean, float* __restrict__ save_invstd,
                                float* __restrict__ running_mean, float* __restrict__ running_var) {
  const int j = channel();
  if (j >= c) return;
  float scale, shift;
  train_channel(sums, w, b, c, j, eps, momentum, save_mean, save_invstd, running_mean, running_var, scale, shift,
                blockIdx.x == 0 && threadIdx.y == 0);
  affine_rows(x, y, y16, rows, c, j, scale, shift, relu);
}

// The vector kernels' per-channel coefficients, computed once per channel (not by every thread
// of the pass for its eight channels: double divisions and square roots, eight times over):
// training — coef = [scale (c), shift (c)], the saved mean and invstd and the running stats
// written; backward — coef = [k (c), m (c), off (c), mean (c)].
__global__ void bn_train_coef_kernel(const double* __restrict__ sums, const float* __restrict__ w,
                                     const float* __restrict__ b, int c, float eps, float momentum,
                                     float* __restrict__ save_mean, float* __restrict__ save_invstd,
                                     float* __restrict__ running_mean, float* __restrict__ running_var,
                                     float* __restrict__ coef) {
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x)
    train_channel(sums, w, b, c, j, eps, momentum, save_mean, save_invstd, running_mean, running_var, coef[j],
                  coef[c + j], true);
}

template <class TX>
__global__ void bn_train8_kernel(const TX* x, float* y, __nv_bfloat16* y16, bool relu, int64_t rows, int c,
                                 const float* __restrict__ coef) {
  const int j0 = channel() * kVec;
  if (j0 >= c) return;
  float scale[kVec], shift[kVec];
  ld8(coef, size_t(j0), scale);
  ld8(coef, size_t(c) + size_t(j0), shift);
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const size_t i = size_t(r) * size_t(c) + size_t(j0);
    float v[kVec];
    ld8(x, i, v);
    for (int k = 0; k < kVec; ++k) v[k] = affine(v[k], scale[k], shift[k], relu);
    if (y) st8(y, i, v);
    if (y16) st8(y16, i, v);
  }
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
// and its operation order, dy masked by relu_out (M).
struct BwdChannel {
  float k, m, off, mu;
};

__device__ BwdChannel bwd_channel(const double* sums, const float* mean, const float* invstd, const float* w, int c,
                                  int j) {
  const double n = sums[2 * c];
  const double kj = double(w[j]) * invstd[j];
  return {float(kj), float(kj * double(invstd[j]) * invstd[j] * sums[c + j] / n), float(kj * sums[j] / n), mean[j]};
}

__device__ __forceinline__ float bwd_value(const BwdChannel& p, float d, float x) {
  return __fsub_rn(__fsub_rn(__fmul_rn(p.k, d), p.off), __fmul_rn(p.m, __fsub_rn(x, p.mu)));
}

// dx may be dy (the same buffer, or dy's bf16 tensor with dx's): each element is read before it
// is written, by the same thread.
template <Mask M, class TX, class TD, class TO>
__global__ void bn_backward_kernel(const TD* dy, const TX* x, const void* relu_out, TO* dx, int64_t rows, int c,
                                   const double* __restrict__ sums, const float* __restrict__ mean,
                                   const float* __restrict__ invstd, const float* __restrict__ w) {
  const int j = channel();
  if (j >= c) return;
  const BwdChannel p = bwd_channel(sums, mean, invstd, w, c, j);
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const size_t i = size_t(r) * size_t(c) + size_t(j);
    st(dx, i, bwd_value(p, masked<M>(dy, relu_out, i), ld(x, i)));
  }
}

__global__ void bn_backward_coef_kernel(const double* __restrict__ sums, const float* __restrict__ mean,
                                        const float* __restrict__ invstd, const float* __restrict__ w, int c,
                                        float* __restrict__ coef) {
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x) {
    const BwdChannel p = bwd_channel(sums, mean, invstd, w, c, j);
    coef[j] = p.k;
    coef[c + j] = p.m;
    coef[2 * c + j] = p.off;
    coef[3 * c + j] = p.mu;
  }
}

template <Mask M, class TX, class TD, class TO>
__global__ void bn_backward8_kernel(const TD* dy, const TX* x, const void* relu_out, TO* dx, int64_t rows, int c,
                                    const float* __restrict__ coef) {
  const int j0 = channel() * kVec;
  if (j0 >= c) return;
  float k[kVec], m[kVec], off[kVec], mu[kVec];
  ld8(coef, size_t(j0), k);
  ld8(coef, size_t(c) + size_t(j0), m);
  ld8(coef, 2 * size_t(c) + size_t(j0), off);
  ld8(coef, 3 * size_t(c) + size_t(j0), mu);
  for (int64_t r = first_row(); r < rows; r += row_step()) {
    const size_t i = size_t(r) * size_t(c) + size_t(j0);
    float d[kVec], v[kVec];
    ld8(dy, i, d);
    mask8<M>(relu_out, i, d);
    ld8(x, i, v);
    for (int q = 0; q < kVec; ++q) d[q] = bwd_value({k[q], m[q], off[q], mu[q]}, d[q], v[q]);
    st8(dx, i, d);
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

template <bool BWD, Mask M, class TX, class TD>
void column_sums(const TD* a, const TX* x, const float* mean, const void* relu_out, int64_t rows, int c,
                 double* sums, double* partial, cudaStream_t s) {
  if (c < 0 || rows < 0) throw Error("bn sums: negative shape");
  const int64_t chunks = c > 0 ? bn_chunks(rows, c) : 0;
  if (chunks > 0) {
    const bool vec = vec8(c, {a, x, relu_out});
    const Tiles t = bn_tiles(c, vec, "bn sums");
    const int64_t chunk_rows = (rows + chunks - 1) / chunks;
    const dim3 grid(unsigned(chunks), unsigned(t.count));
    if (vec) bn_partial8_kernel<BWD, M><<<grid, block_of(t), 0, s>>>(a, x, mean, relu_out, rows, c, chunk_rows, partial);
    else bn_partial_kernel<BWD, M><<<grid, block_of(t), 0, s>>>(a, x, mean, relu_out, rows, c, chunk_rows, partial);
    DPT_CHECK_LAUNCH("bn_partial_kernel");
  }
  const unsigned blocks = unsigned(std::clamp<int64_t>(2 * int64_t(c), 1, 65535));
  column_total_kernel<<<blocks, kThreads, 0, s>>>(partial, chunks, 2 * c, double(rows), sums);
  DPT_CHECK_LAUNCH("column_total_kernel");
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

}  // namespace

size_t bn_partial_doubles(int64_t rows, int c) {
  return c > 0 ? size_t(bn_chunks(rows, c)) * 2 * size_t(c) : 0;
}

void bn_sums(BnIn x, int64_t rows, int c, double* sums, double* partial, cudaStream_t s) {
  typed(x, [&](auto xp) {
    column_sums<false, Mask::none>(static_cast<const float*>(nullptr), xp, nullptr, nullptr, rows, c, sums, partial, s);
  });
}

void bn_backward_sums(BnIn dy, BnIn x, int64_t rows, int c, const float* mean, const void* relu_out,
                      bool relu_out_bf16, double* sums, double* partial, cudaStream_t s) {
  typed(dy, [&](auto d) {
    typed(x, [&](auto xp) {
      if (!relu_out) column_sums<true, Mask::none>(d, xp, mean, nullptr, rows, c, sums, partial, s);
      else if (relu_out_bf16) column_sums<true, Mask::bf16>(d, xp, mean, relu_out, rows, c, sums, partial, s);
      else column_sums<true, Mask::f32>(d, xp, mean, relu_out, rows, c, sums, partial, s);
    });
  });
}

void bn_forward(BnIn x, float* y, void* y16, bool relu, int64_t rows, int c, const double* sums,
                const float* w, const float* b, float eps, float momentum, float* save_mean, float* save_invstd,
                float* running_mean, float* running_var, float* coef, cudaStream_t s) {
  if (c <= 0) return;
  auto* o16 = static_cast<__nv_bfloat16*>(y16);
  const bool vec = vec8(c, {x.p, y, y16, coef});
  if (vec) {
    bn_train_coef_kernel<<<grid_for(size_t(c)), kThreads, 0, s>>>(sums, w, b, c, eps, momentum, save_mean,
                                                                  save_invstd, running_mean, running_var, coef);
    DPT_CHECK_LAUNCH("bn_train_coef_kernel");
  }
  const Tiles t = bn_tiles(c, vec, "bn_forward");
  const dim3 grid = pass_grid(t, rows), block = block_of(t);
  typed(x, [&](auto xp) {
    if (vec)
      bn_train8_kernel<<<grid, block, 0, s>>>(xp, y, o16, relu, rows, c, coef);
    else
      bn_train_kernel<<<grid, block, 0, s>>>(xp, y, o16, relu, rows, c, sums, w, b, eps, momentum, save_mean,
                                             save_invstd, running_mean, running_var);
  });
  DPT_CHECK_LAUNCH("bn_train_kernel");
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
  bn_param_grads_kernel<<<grid_for(size_t(c)), kThreads, 0, s>>>(sums, invstd, c, dw, db, accumulate);
  DPT_CHECK_LAUNCH("bn_param_grads_kernel");
}

void bn_backward(BnIn dy, BnIn x, const void* relu_out, bool relu_out_bf16, BnOut dx, int64_t rows, int c,
                 const double* sums, const float* mean, const float* invstd, const float* w, float* coef,
                 cudaStream_t s) {
  if (c <= 0 || rows <= 0) return;
  const bool vec = vec8(c, {dy.p, x.p, relu_out, dx.p, coef});
  if (vec) {
    bn_backward_coef_kernel<<<grid_for(size_t(c)), kThreads, 0, s>>>(sums, mean, invstd, w, c, coef);
    DPT_CHECK_LAUNCH("bn_backward_coef_kernel");
  }
  const Tiles t = bn_tiles(c, vec, "bn_backward");
  const dim3 grid = pass_grid(t, rows), block = block_of(t);
  typed(dy, [&](auto d) {
    typed(x, [&](auto xp) {
      typed(dx, [&](auto o) {
        auto run = [&](auto mask) {
          constexpr Mask M = decltype(mask)::value;
          if (vec) bn_backward8_kernel<M><<<grid, block, 0, s>>>(d, xp, relu_out, o, rows, c, coef);
          else bn_backward_kernel<M><<<grid, block, 0, s>>>(d, xp, relu_out, o, rows, c, sums, mean, invstd, w);
        };
        if (!relu_out) run(std::integral_constant<Mask, Mask::none>{});
        else if (relu_out_bf16) run(std::integral_constant<Mask, Mask::bf16>{});
        else run(std::integral_constant<Mask, Mask::f32>{});
      });
    });
  });
  DPT_CHECK_LAUNCH("bn_backward_kernel");
}

}  // namespace dpt::cuda
