// Optimizers (SGD, momentum, Nesterov, Adam, AdamW with torch.optim's formulas and defaults) as
// one fused update over the flat parameter arena; LARS and LAMB as two passes over it (per-tensor
// sums, then the update with each tensor's trust ratio); and the learning-rate rules: scaling
// with the global batch, warm-up, schedules. Knows nothing of layers: the tensors come as
// arena segments.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/config.hpp"

namespace dpt {

class Optimizer {
 public:
  // n: elements of state per array (the arena's size, or a rank's shard of it). tensors: the
  // model's parameter tensors in arena order (LARS and LAMB take a trust ratio per tensor);
  // empty means one adapting tensor over the whole arena.
  Optimizer(Backend& be, const Config& cfg, size_t n, std::vector<TensorSeg> tensors = {});

  // One update of all n params with grads at learning rate lr; counts the step.
  void step(float* params, const float* grads, double lr);
  // The training loop's update of count parameters at params (gradients grads) whose state
  // starts at element state_at of the state arrays: lr from lr_table[ctl->step], Adam's t from
  // ctl->updates, skipped when ctl->bad; all read on the device (see StepCtl). flag: the
  // non-finite check folded in (Backend::optimizer_step_at). arena_at: the range's offset in the
  // arena (SIZE_MAX: state_at, the state mirroring the arena), where the tensors are: with
  // train.decay_bn_and_bias = false the 1-D tensors (biases, batch norm) take no weight decay.
  void step_at(float* params, const float* grads, size_t state_at, size_t count,
               const float* lr_table, StepCtl* ctl, bool flag = false, size_t arena_at = SIZE_MAX);

  // LARS and LAMB, for a caller that updates the arena by ranges (gradient buckets, shards), in
  // two calls per range: layer_sums_at fills layer_sums() (2 floats per tensor, on the backend)
  // from arena elements [lo, lo + count); a sharded caller adds them over its ranks; then
  // layer_apply_at updates the range. params and grads point at the range's first element (as
  // for step_at), lo is its offset in the arena (where the tensors are), state_at the offset of
  // its state. Nothing happens when ctl->bad, so the non-finite verdict must be in ctl before
  // layer_sums_at (LAMB advances its moments there).
  bool layerwise() const { return h_.kind == OptKind::lars || h_.kind == OptKind::lamb; }
  const std::vector<TensorSeg>& tensors() const { return segs_; }
  float* layer_sums() { return sums_.data(); }
  // Zeroes layer_sums() before the sums passes of one update (they add into it).
  void clear_layer_sums();
  void layer_sums_at(const float* params, const float* grads, size_t lo, size_t state_at, size_t count,
                     const float* lr_table, const StepCtl* ctl);
  void layer_apply_at(float* params, const float* grads, size_t lo, size_t state_at, size_t count,
                      const float* lr_table, const StepCtl* ctl);

  // Fine-tuning groups, marked on the tensors given at construction (TensorSeg::frozen, body):
  // while set_frozen(true), the frozen ones get no update at all (no weight decay, no state
  // change: bitwise unchanged); body ones read their learning rate from body_lr_table (same
  // indexing as step_at's lr_table) where it is given. Honoured by step_at, not by LARS or LAMB
  // (config refuses the combination).
  void set_frozen(bool on) { frozen_ = on; }
  bool frozen() const { return frozen_; }
  void set_body_lr(const float* body_lr_table) { body_lr_ = body_lr_table; }

  OptKind kind() const { return h_.kind; }
  int64_t steps_taken() const { return h_.t - 1; }
  void set_steps_taken(int64_t t) { h_.t = t + 1; }

  // State arrays (flat, same layout as the parameters) with their torch.optim names:
  // "momentum_buffer" (momentum, nesterov, lars), "exp_avg" and "exp_avg_sq" (adam, adamw, lamb).
  struct State { std::string name; float* data; };
  std::vector<State> state();
  size_t size() const { return n_; }
  int state_arrays() const { return (s1_.data() ? 1 : 0) + (s2_.data() ? 1 : 0); }

 private:
  Backend& be_;
  size_t n_;
  OptimStep h_;
  Buffer<float> s1_, s2_;
  std::vector<TensorSeg> segs_;
  bool decay_1d_ = true;  // weight decay on 1-D tensors too (train.decay_bn_and_bias)
  bool grouped_ = false;  // some tensor is frozen or in a body with a rate of its own
  bool frozen_ = false;
  const float* body_lr_ = nullptr;
  Buffer<float> sums_;  // (2 × tensors) LARS/LAMB: Σ w², Σ d² per tensor
};

// The trust coefficient a config asks for: train.trust_coefficient, or where it is 0 the
// optimizer's own default (LARS 0.001 as in You et al. 2017; LAMB 1).
double trust_coefficient(const Config& cfg);

// Learning rate at each step. Global batch G = batch_per_rank × world × accumulate;
// lr_scaling multiplies lr by G/base_batch (linear) or its square root (sqrt). Warm-up ramps
// linearly over warmup_steps from the unscaled lr (from 0 when the scale is 1) to the scaled
// lr; then the schedule applies (constant, step decay, cosine to min_lr over the run).
class LrSchedule {
 public:
  LrSchedule(const Config& cfg, int world, int64_t steps_per_epoch, int64_t total_steps);
  double at(int64_t step) const;  // step = 1-based index of the update
  double peak() const { return peak_; }
  double scale() const { return scale_; }

 private:
  const Config& cfg_;
  double scale_, peak_, start_;
  int64_t steps_per_epoch_, total_;
};

}  // namespace dpt
