// The layer-wise optimizers (LARS, LAMB) on the GPU: per-tensor sums of squares over a range of
// the arena in a fixed order, then the update with each tensor's trust ratio. lr, t and the
// skip come from the step control on the device, so both passes replay inside the step graph.
// The per-element formulas are dpt/layerwise.hpp's, shared with the CPU backend.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "dpt/cuda_check.hpp"
#include "dpt/layerwise.hpp"
#include "layerwise.cuh"

namespace dpt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPieces = 64;          // tensors per launch (kernel parameter space)
constexpr int64_t kSliceFloats = 16384; // elements per block of the sums pass, at least
constexpr int kMaxChunks = 128;         // blocks per tensor in the sums pass, at most

// A segment cut to the range: offsets from the range's first element.
struct Piece {
  int64_t off, len;
  int32_t seg;    // index in the caller's segment list (and in sums)
  int32_t adapt;  // takes the trust ratio and weight decay
};
struct Pieces {
  Piece p[kMaxPieces];
  int count;
};

struct LwArgs {
  float lr, momentum, wd, omb1, omb2, b1, b2, eps, coeff, clip;
  float bc1, bc2_sqrt;  // 1 − β1^t, √(1 − β2^t)
  double b1d, b2d;
  const float* lr_table;
  const StepCtl* ctl;
};

// lr and the bias corrections as read on the device; false when the step is skipped.
__device__ __forceinline__ bool resolve(LwArgs& a) {
  if (!a.ctl) return true;
  if (a.ctl->bad) return false;
  a.lr = a.lr_table[a.ctl->step];
  const double t = double(a.ctl->updates + 1);
  a.bc1 = float(1.0 - pow(a.b1d, t));
  a.bc2_sqrt = float(sqrt(1.0 - pow(a.b2d, t)));
  return true;
}

// ============================== kernels ==============================

// Block (x, y): slice x of piece y, a fixed range of elements, reduced through shared memory in
// a fixed tree: the same inputs give the same bits.
template <bool kLamb>
__global__ void layer_sums_kernel(const float* p, const float* g, float* s1, float* s2, Pieces t,
                                  int chunks, LwArgs a, float* partial) {
  if (!resolve(a)) return;
  const Piece pc = t.p[blockIdx.y];
  const int64_t per = (pc.len + chunks - 1) / chunks;
  const int64_t b = pc.off + int64_t(blockIdx.x) * per, e = min(pc.off + pc.len, b + per);
  const float wd = pc.adapt ? a.wd : 0.f;
  float w2 = 0.f, d2 = 0.f;
  for (int64_t j = b + threadIdx.x; j < e; j += blockDim.x) {
    const float w = p[j], gj = g[j];
    w2 += w * w;
    if constexpr (kLamb) {
      const float m = a.b1 * s1[j] + a.omb1 * gj;
      const float v = a.b2 * s2[j] + a.omb2 * gj * gj;
      s1[j] = m;
      s2[j] = v;
      const float u = layerwise::lamb_dir(m, v, w, a.bc1, a.bc2_sqrt, a.eps, wd);
      d2 += u * u;
    } else {
      d2 += gj * gj;
    }
  }
  __shared__ float sw[kThreads], sd[kThreads];
  sw[threadIdx.x] = w2;
  sd[threadIdx.x] = d2;
  __syncthreads();
  for (int h = kThreads / 2; h > 0; h /= 2) {
    if (int(threadIdx.x) < h) {
      sw[threadIdx.x] += sw[threadIdx.x + h];
      sd[threadIdx.x] += sd[threadIdx.x + h];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const size_t k = 2 * (size_t(blockIdx.y) * chunks + blockIdx.x);
    partial[k] = sw[0];
    partial[k + 1] = sd[0];
  }
}

// One thread per piece adds its slices in order.
__global__ void layer_sums_finish(const float* partial, int chunks, Pieces t, LwArgs a, float* sums) {
  if (a.ctl && a.ctl->bad) return;
  for (int i = threadIdx.x; i < t.count; i += blockDim.x) {
    float w2 = 0.f, d2 = 0.f;
    for (int c = 0; c < chunks; ++c) {
      w2 += partial[2 * (size_t(i) * chunks + c)];
      d2 += partial[2 * (size_t(i) * chunks + c) + 1];
    }
    sums[2 * t.p[i].seg] += w2;  // the caller zeroed them: ranges add up
    sums[2 * t.p[i].seg + 1] += d2;
  }
}

template <bool kLamb>
__global__ void layer_apply_kernel(float* p, const float* g, float* s1, const float* s2, Pieces t,
                                   const float* sums, LwArgs a, __nv_bfloat16* p16) {
  if (!resolve(a)) return;
  const Piece pc = t.p[blockIdx.y];
  const float wd = pc.adapt ? a.wd : 0.f;
  const float r = pc.adapt ? layerwise::trust_ratio(sums[2 * pc.seg], sums[2 * pc.seg + 1], wd,
                                                    a.coeff, a.clip, !kLamb)
                           : 1.f;
  const float step = a.lr * r;
  for (int64_t j = pc.off + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < pc.off + pc.len;
       j += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (kLamb) {
      p[j] -= step * layerwise::lamb_dir(s1[j], s2[j], p[j], a.bc1, a.bc2_sqrt, a.eps, wd);
    } else {
      const float m = a.momentum * s1[j] + r * (g[j] + wd * p[j]);
      s1[j] = m;
      p[j] -= a.lr * m;
    }
    if (p16) p16[j] = __float2bfloat16_rn(p[j]);
  }
}

// ============================== launchers ==============================

// The segments cut to [lo, lo + n), in groups of at most kMaxPieces.
std::vector<Pieces> pieces_of(const std::vector<TensorSeg>& segs, size_t lo, size_t n) {
  std::vector<Pieces> out;
  for (size_t i = 0; i < segs.size(); ++i) {
    const size_t b = std::max(segs[i].begin, lo), e = std::min(segs[i].end, lo + n);
    if (b >= e) continue;
    if (out.empty() || out.back().count == kMaxPieces) out.push_back(Pieces{{}, 0});
    Pieces& t = out.back();
    t.p[t.count++] = Piece{int64_t(b - lo), int64_t(e - b), int32_t(i), segs[i].adapt ? 1 : 0};
  }
  return out;
}

int64_t longest(const Pieces& t) {
  int64_t m = 1;
  for (int i = 0; i < t.count; ++i) m = std::max(m, t.p[i].len);
  return m;
}

int chunks_for(const std::vector<Pieces>& groups) {
  int64_t m = 1;
  for (const Pieces& t : groups) m = std::max(m, longest(t));
  return int(std::min<int64_t>(kMaxChunks, (m + kSliceFloats - 1) / kSliceFloats));
}

LwArgs args_of(const OptimStep& h, const float* lr_table, const StepCtl* ctl) {
  LwArgs a{};
  a.lr = h.lr;
  a.momentum = h.momentum;
  a.wd = h.weight_decay;
  const AdamScalars as = adam_scalars(h.lr, h.beta1, h.beta2, h.t);
  a.omb1 = as.one_minus_b1;
  a.omb2 = as.one_minus_b2;
  a.b1 = float(h.beta1);
  a.b2 = float(h.beta2);
  a.b1d = h.beta1;
  a.b2d = h.beta2;
  a.eps = h.eps;
  a.coeff = h.trust_coefficient;
  a.clip = h.trust_clip;
  a.bc1 = float(1.0 - std::pow(h.beta1, double(h.t)));
  a.bc2_sqrt = as.bc2_sqrt;
  a.lr_table = lr_table;
  a.ctl = ctl;
  return a;
}

void check_kind(const OptimStep& h) {
  if (h.kind != OptKind::lars && h.kind != OptKind::lamb)
    throw Error("layer_sums / layer_apply: only LARS and LAMB are layer-wise optimizers");
}

}  // namespace

size_t layer_partial_floats(const std::vector<TensorSeg>& segs, size_t lo, size_t n) {
  const auto groups = pieces_of(segs, lo, n);
  return 2 * size_t(kMaxPieces) * size_t(chunks_for(groups));
}

void layer_sums(const float* p, const float* g, float* s1, float* s2, size_t lo, size_t n,
                const std::vector<TensorSeg>& segs, const OptimStep& h, const float* lr_table,
                const StepCtl* ctl, float* sums, float* partial, cudaStream_t s) {
  check_kind(h);
  if (segs.empty()) return;
  const auto groups = pieces_of(segs, lo, n);
  const int chunks = chunks_for(groups);
  const LwArgs a = args_of(h, lr_table, ctl);
  for (const Pieces& t : groups) {
    const dim3 grid(unsigned(chunks), unsigned(t.count));
    if (h.kind == OptKind::lamb)
      layer_sums_kernel<true><<<grid, kThreads, 0, s>>>(p, g, s1, s2, t, chunks, a, partial);
    else
      layer_sums_kernel<false><<<grid, kThreads, 0, s>>>(p, g, s1, s2, t, chunks, a, partial);
    DPT_CHECK_LAUNCH("layer_sums_kernel");
    layer_sums_finish<<<1, kMaxPieces, 0, s>>>(partial, chunks, t, a, sums);
    DPT_CHECK_LAUNCH("layer_sums_finish");
  }
}

void layer_apply(float* p, const float* g, float* s1, float* s2, size_t lo, size_t n,
                 const std::vector<TensorSeg>& segs, const float* sums, const OptimStep& h,
                 const float* lr_table, const StepCtl* ctl, void* p16, cudaStream_t s) {
  check_kind(h);
  const LwArgs a = args_of(h, lr_table, ctl);
  auto* h16 = static_cast<__nv_bfloat16*>(p16);
  for (const Pieces& t : pieces_of(segs, lo, n)) {
    // About 4 waves of blocks over the longest tensor; the others stride less.
    const int64_t blocks = std::min<int64_t>((longest(t) + kThreads - 1) / kThreads, 132 * 8);
    const dim3 grid(unsigned(std::max<int64_t>(1, blocks)), unsigned(t.count));
    if (h.kind == OptKind::lamb)
      layer_apply_kernel<true><<<grid, kThreads, 0, s>>>(p, g, s1, s2, t, sums, a, h16);
    else
      layer_apply_kernel<false><<<grid, kThreads, 0, s>>>(p, g, s1, s2, t, sums, a, h16);
    DPT_CHECK_LAUNCH("layer_apply_kernel");
  }
}

}  // namespace dpt::cuda
