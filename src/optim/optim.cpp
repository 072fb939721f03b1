#include "dpt/optim.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "dpt/check.hpp"

namespace dpt {

double trust_coefficient(const Config& cfg) {
  if (cfg.trust_coefficient > 0) return cfg.trust_coefficient;
  return cfg.optimizer == "lamb" ? 1.0 : 0.001;
}

Optimizer::Optimizer(Backend& be, const Config& cfg, size_t n, std::vector<TensorSeg> tensors)
    : be_(be), n_(n), segs_(std::move(tensors)) {
  h_.kind = parse_optimizer(cfg.optimizer);
  h_.trust_coefficient = float(trust_coefficient(cfg));
  h_.trust_clip = float(cfg.trust_clip);
  h_.momentum = float(cfg.momentum);
  h_.weight_decay = float(cfg.weight_decay);
  h_.beta1 = cfg.beta1;
  h_.beta2 = cfg.beta2;
  h_.eps = float(cfg.eps);
  h_.t = 1;
  decay_1d_ = cfg.decay_bn_and_bias || cfg.weight_decay == 0 || segs_.empty();
  for (const TensorSeg& t : segs_) grouped_ = grouped_ || t.frozen || t.body;
  const bool sgd_family = h_.kind == OptKind::momentum || h_.kind == OptKind::nesterov || h_.kind == OptKind::lars;
  const bool adam_family = h_.kind == OptKind::adam || h_.kind == OptKind::adamw || h_.kind == OptKind::lamb;
  if (layerwise()) {
    if (segs_.empty()) segs_.push_back({0, n, true});
    sums_ = Buffer<float>(be, 2 * segs_.size());
    be.fill(sums_.data(), sums_.size(), 0.f);
  }
  if (sgd_family || adam_family) {
    s1_ = Buffer<float>(be, n);
    be.fill(s1_.data(), n, 0.f);
  }
  if (adam_family) {
    s2_ = Buffer<float>(be, n);
    be.fill(s2_.data(), n, 0.f);
  }
}

void Optimizer::step(float* params, const float* grads, double lr) {
  h_.lr = float(lr);
  if (layerwise()) {
    clear_layer_sums();
    layer_sums_at(params, grads, 0, 0, n_, nullptr, nullptr);
    layer_apply_at(params, grads, 0, 0, n_, nullptr, nullptr);
  } else {
    be_.optimizer_step(params, grads, s1_.data(), s2_.data(), n_, h_);
  }
  ++h_.t;
}

void Optimizer::step_at(float* params, const float* grads, size_t state_at, size_t count,
                        const float* lr_table, StepCtl* ctl, bool flag, size_t arena_at) {
  if (count == 0) return;
  if (state_at + count > n_)
    throw Error("optimizer: state [" + std::to_string(state_at) + ", " + std::to_string(state_at + count) +
                ") outside its " + std::to_string(n_) + " elements");
  if (layerwise()) {
    // The layer-wise optimizers here only where the state mirrors the arena (unsharded): the
    // range's arena offset is its state offset. A sharded caller uses layer_sums_at and
    // layer_apply_at with a sum of the tensors' partial sums over its ranks in between.
    if (flag) throw Error("optimizer: the non-finite check cannot be folded into LARS or LAMB");
    clear_layer_sums();
    layer_sums_at(params, grads, state_at, state_at, count, lr_table, ctl);
    layer_apply_at(params, grads, state_at, state_at, count, lr_table, ctl);
    return;
  }
  float* s1 = s1_.data() ? s1_.data() + state_at : nullptr;
  float* s2 = s2_.data() ? s2_.data() + state_at : nullptr;
  const bool body_rate = body_lr_ && lr_table;
  if (decay_1d_ && !(grouped_ && (frozen_ || body_rate))) {
    be_.optimizer_step_at(params, grads, s1, s2, count, h_, lr_table, ctl, flag);
    return;
  }
  // Tensor by tensor inside the range: 1-D ones without weight decay (decay_bn_and_bias =
  // false), frozen ones left alone, the body's at its own rate; the padding between tensors
  // holds zeros that no update needs to visit.
  const size_t lo = arena_at == SIZE_MAX ? state_at : arena_at, hi = lo + count;
  OptimStep plain = h_;
  plain.weight_decay = 0.f;
  for (const TensorSeg& t : segs_) {
    const size_t a = std::max(lo, t.begin), b = std::min(hi, t.end);
    if (a >= b) continue;
    const size_t at = a - lo;
    if (frozen_ && t.frozen) {  // the check still sees every gradient (train.on_nonfinite = stop)
      if (flag) be_.check_finite(grads + at, b - a, ctl);
      continue;
    }
    be_.optimizer_step_at(params + at, grads + at, s1 ? s1 + at : nullptr, s2 ? s2 + at : nullptr, b - a,
                          t.adapt || decay_1d_ ? h_ : plain, t.body && body_rate ? body_lr_ : lr_table, ctl, flag);
  }
}

void Optimizer::clear_layer_sums() {
  if (sums_.data()) be_.fill(sums_.data(), sums_.size(), 0.f);
}

void Optimizer::layer_sums_at(const float* params, const float* grads, size_t lo, size_t state_at, size_t count,
                              const float* lr_table, const StepCtl* ctl) {
  if (state_at + count > n_) throw Error("optimizer: state range outside its " + std::to_string(n_) + " elements");
  float* s2 = s2_.data() ? s2_.data() + state_at : nullptr;
  be_.layer_sums(params, grads, s1_.data() + state_at, s2, lo, count, segs_, h_, lr_table, ctl, sums_.data());
}

void Optimizer::layer_apply_at(float* params, const float* grads, size_t lo, size_t state_at, size_t count,
                               const float* lr_table, const StepCtl* ctl) {
  if (state_at + count > n_) throw Error("optimizer: state range outside its " + std::to_string(n_) + " elements");
  float* s2 = s2_.data() ? s2_.data() + state_at : nullptr;
  be_.layer_apply(params, grads, s1_.data() + state_at, s2, lo, count, segs_, sums_.data(), h_, lr_table, ctl);
}

std::vector<Optimizer::State> Optimizer::state() {
  switch (h_.kind) {
    case OptKind::momentum:
    case OptKind::nesterov:
    case OptKind::lars: return {{"momentum_buffer", s1_.data()}};
    case OptKind::adam:
    case OptKind::adamw:
    case OptKind::lamb: return {{"exp_avg", s1_.data()}, {"exp_avg_sq", s2_.data()}};
    default: return {};
  }
}

LrSchedule::LrSchedule(const Config& cfg, int world, int64_t steps_per_epoch, int64_t total_steps)
    : cfg_(cfg), steps_per_epoch_(std::max<int64_t>(1, steps_per_epoch)), total_(total_steps) {
  const double global = double(cfg.batch_per_rank) * world * cfg.accumulate;
  const double base = cfg.base_batch > 0 ? cfg.base_batch : cfg.batch_per_rank;
  const double ratio = global / base;
  scale_ = cfg.lr_scaling == "linear" ? ratio : cfg.lr_scaling == "sqrt" ? std::sqrt(ratio) : 1.0;
  peak_ = cfg.lr * scale_;
  start_ = scale_ > 1.0 ? cfg.lr : 0.0;
}

double LrSchedule::at(int64_t step) const {
  const int64_t w = cfg_.warmup_steps;
  if (w > 0 && step <= w) return start_ + (peak_ - start_) * double(step) / double(w);
  if (cfg_.schedule == "step") {
    const int64_t every = cfg_.step_every > 0 ? cfg_.step_every : steps_per_epoch_;
    return peak_ * std::pow(cfg_.step_gamma, double((step - 1) / every));
  }
  if (cfg_.schedule == "cosine") {
    const double span = double(std::max<int64_t>(1, total_ - w - 1));  // the last step reaches min_lr
    const double t = std::min(1.0, double(step - w - 1) / span);
    return cfg_.min_lr + (peak_ - cfg_.min_lr) * 0.5 * (1.0 + std::cos(M_PI * t));
  }
  return peak_;
}

}  // namespace dpt
