// Optimizers (SGD, momentum, Nesterov, Adam, AdamW with torch.optim's formulas and defaults) as
// one fused update over the flat parameter arena, and the learning-rate rules: scaling with the
// global batch, warm-up, schedules. Knows nothing of layers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/config.hpp"

namespace dpt {

class Optimizer {
 public:
  // n: elements of state per array (the arena's size, or a rank's shard of it).
  Optimizer(Backend& be, const Config& cfg, size_t n);

  // One update of all n params with grads at learning rate lr; counts the step.
  void step(float* params, const float* grads, double lr);
  // The training loop's update of count parameters at params (gradients grads) whose state
  // starts at element state_at of the state arrays: lr from lr_table[ctl->step], Adam's t from
  // ctl->updates, skipped when ctl->bad; all read on the device (see StepCtl). flag: the
  // non-finite check folded in (Backend::optimizer_step_at).
  void step_at(float* params, const float* grads, size_t state_at, size_t count,
               const float* lr_table, StepCtl* ctl, bool flag = false);

  OptKind kind() const { return h_.kind; }
  int64_t steps_taken() const { return h_.t - 1; }
  void set_steps_taken(int64_t t) { h_.t = t + 1; }

  // State arrays (flat, same layout as the parameters) with their torch.optim names:
  // "momentum_buffer" (momentum, nesterov), "exp_avg" and "exp_avg_sq" (adam, adamw).
  struct State { std::string name; float* data; };
  std::vector<State> state();
  size_t size() const { return n_; }
  int state_arrays() const { return (s1_.data() ? 1 : 0) + (s2_.data() ? 1 : 0); }

 private:
  Backend& be_;
  size_t n_;
  OptimStep h_;
  Buffer<float> s1_, s2_;
};

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
