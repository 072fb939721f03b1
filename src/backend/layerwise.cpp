// The layer-wise optimizers (LARS, LAMB) for backends whose memory the host reads directly
// (cpu): Backend's default layer_sums / layer_apply. Sums in double, in arena order.
#include <algorithm>
#include <cmath>

#include "dpt/backend.hpp"
#include "dpt/check.hpp"
#include "dpt/layerwise.hpp"

namespace dpt {
namespace {

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
    double w2 = 0, d2 = 0;
    for (size_t j = b; j < e; ++j) {
      w2 += double(p[j]) * p[j];
      if (!lamb) {
        d2 += double(g[j]) * g[j];
        continue;
      }
      s1[j] = b1 * s1[j] + as.one_minus_b1 * g[j];
      s2[j] = b2 * s2[j] + as.one_minus_b2 * g[j] * g[j];
      const float u = layerwise::lamb_dir(s1[j], s2[j], p[j], bias.bc1, bias.bc2_sqrt, at.eps, wd);
      d2 += double(u) * u;
    }
    sums[2 * i] = float(w2);
    sums[2 * i + 1] = float(d2);
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
    if (lars) {
      for (size_t j = b; j < e; ++j) {
        s1[j] = at.momentum * s1[j] + r * (g[j] + wd * p[j]);  // torch.optim.SGD on the scaled gradient
        p[j] -= at.lr * s1[j];
      }
    } else {
      const float step = at.lr * r;
      for (size_t j = b; j < e; ++j)
        p[j] -= step * layerwise::lamb_dir(s1[j], s2[j], p[j], bias.bc1, bias.bc2_sqrt, at.eps, wd);
    }
  }
}

}  // namespace dpt
