// The layer-wise optimizers (LARS, LAMB) for backends whose memory the host reads directly
// (cpu): Backend's default layer_sums / layer_apply. Sums of squares in double, eight lanes
// added in a fixed order (vectorisable, and the same bits every time).
#include <algorithm>
#include <cmath>

#include "dpt/backend.hpp"
#include "dpt/check.hpp"
#include "dpt/layerwise.hpp"

// As in cpu.cpp: each loop compiled for AVX-512, AVX2 and baseline x86-64, picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DPT_SIMD __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DPT_SIMD
#endif

namespace dpt {
namespace {

constexpr int kLanes = 8;

double lanes_total(const double (&acc)[kLanes]) {
  double t = 0;
  for (double a : acc) t += a;
  return t;
}

DPT_SIMD double sum_squares(const float* __restrict x, size_t n) {
  double acc[kLanes] = {};
  size_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += double(x[j + k]) * x[j + k];
  for (; j < n; ++j) acc[0] += double(x[j]) * x[j];
  return lanes_total(acc);
}

// LAMB's moments over n elements, then Σ u² of its update direction.
DPT_SIMD double lamb_moments(const float* __restrict p, const float* __restrict g, float* __restrict m,
                             float* __restrict v, size_t n, float b1, float b2, float omb1, float omb2,
                             float bc1, float bc2_sqrt, float eps, float wd) {
  for (size_t j = 0; j < n; ++j) {
    m[j] = b1 * m[j] + omb1 * g[j];
    v[j] = b2 * v[j] + omb2 * g[j] * g[j];
  }
  double acc[kLanes] = {};
  size_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const float u = layerwise::lamb_dir(m[j + k], v[j + k], p[j + k], bc1, bc2_sqrt, eps, wd);
      acc[k] += double(u) * u;
    }
  for (; j < n; ++j) {
    const float u = layerwise::lamb_dir(m[j], v[j], p[j], bc1, bc2_sqrt, eps, wd);
    acc[0] += double(u) * u;
  }
  return lanes_total(acc);
}

DPT_SIMD void lars_apply(float* __restrict p, const float* __restrict g, float* __restrict m, size_t n,
                         float lr, float mom, float r, float wd) {
  for (size_t j = 0; j < n; ++j) {
    m[j] = mom * m[j] + r * (g[j] + wd * p[j]);  // torch.optim.SGD on the scaled gradient
    p[j] -= lr * m[j];
  }
}

DPT_SIMD void lamb_apply(float* __restrict p, const float* __restrict m, const float* __restrict v, size_t n,
                         float step, float bc1, float bc2_sqrt, float eps, float wd) {
  for (size_t j = 0; j < n; ++j) p[j] -= step * layerwise::lamb_dir(m[j], v[j], p[j], bc1, bc2_sqrt, eps, wd);
}

// The step's lr and t: from h, or read from the step control (the training loop's path).
OptimStep resolve(const OptimStep& h, const float* lr_table, const StepCtl* ctl) {
  OptimStep at = h;
  if (ctl) {
    at.lr = lr_table[ctl->step];
    at.t = ctl->updates + 1;
  }
  return at;
}

struct Bias {
  float bc1, bc2_sqrt;  // 1 − β1^t and √(1 − β2^t), formed in double, rounded once
};
Bias lamb_bias(const OptimStep& h) {
  return {float(1.0 - std::pow(h.beta1, double(h.t))), float(std::sqrt(1.0 - std::pow(h.beta2, double(h.t))))};
}

// Segment i's part inside the range [lo, lo + n), as offsets from lo; empty when b >= e.
void clip_to(const TensorSeg& s, size_t lo, size_t n, size_t& b, size_t& e) {
  b = std::max(s.begin, lo) - lo;
  e = std::max(std::min(s.end, lo + n), lo) - lo;
}

}  // namespace

void Backend::layer_sums(const float* p, const float* g, float* s1, float* s2, size_t lo, size_t n,
                         const std::vector<TensorSeg>& segs, const OptimStep& h,
                         const float* lr_table, const StepCtl* ctl, float* sums) {
  if (!host_addressable()) throw Error(name() + " backend: layer_sums not implemented");
  if (ctl && ctl->bad) return;
  const OptimStep at = resolve(h, lr_table, ctl);
  const bool lamb = at.kind == OptKind::lamb;
  const Bias bias = lamb_bias(at);
  const float b1 = float(at.beta1), b2 = float(at.beta2);
  const AdamScalars as = adam_scalars(at.lr, at.beta1, at.beta2, at.t);
  for (size_t i = 0; i < segs.size(); ++i) {
    size_t b = 0, e = 0;
    clip_to(segs[i], lo, n, b, e);
    const float wd = segs[i].adapt ? at.weight_decay : 0.f;
    const size_t len = e > b ? e - b : 0;
    const double w2 = sum_squares(p + b, len);
    const double d2 = lamb ? lamb_moments(p + b, g + b, s1 + b, s2 + b, len, b1, b2, as.one_minus_b1, as.one_minus_b2,
                                          bias.bc1, bias.bc2_sqrt, at.eps, wd)
                           : sum_squares(g + b, len);
    if (len == 0) continue;
    sums[2 * i] += float(w2);
    sums[2 * i + 1] += float(d2);
  }
}

void Backend::layer_apply(float* p, const float* g, float* s1, float* s2, size_t lo, size_t n,
                          const std::vector<TensorSeg>& segs, const float* sums,
                          const OptimStep& h, const float* lr_table, const StepCtl* ctl) {
  if (!host_addressable()) throw Error(name() + " backend: layer_apply not implemented");
  if (ctl && ctl->bad) return;
  const OptimStep at = resolve(h, lr_table, ctl);
  const bool lars = at.kind == OptKind::lars;
  const Bias bias = lamb_bias(at);
  for (size_t i = 0; i < segs.size(); ++i) {
    size_t b = 0, e = 0;
    clip_to(segs[i], lo, n, b, e);
    if (b >= e) continue;
    const float wd = segs[i].adapt ? at.weight_decay : 0.f;
    const float r = segs[i].adapt ? layerwise::trust_ratio(sums[2 * i], sums[2 * i + 1], wd, at.trust_coefficient,
                                                           at.trust_clip, lars)
                                  : 1.f;
    if (lars)
      lars_apply(p + b, g + b, s1 + b, e - b, at.lr, at.momentum, r, wd);
    else
      lamb_apply(p + b, s1 + b, s2 + b, e - b, at.lr * r, bias.bc1, bias.bc2_sqrt, at.eps, wd);
  }
}

}  // namespace dpt
