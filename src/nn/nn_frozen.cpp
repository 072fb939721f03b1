// What a frozen model leaves out of its backward pass (train.freeze, finetune.hpp): the floor
// below which no op needs a gradient, and the layers under it whose gradients stay zero.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "nn_ops.hpp"

namespace dpt {

// Below the first op with parameters there are only the data and what was done to it (layout,
// dropout, ...): nothing needs a gradient there. Below the first with a trainable one (set_frozen)
// nothing does either.
size_t Model::lowest_backward_op() const {
  size_t i = 0;
  while (i < ops_.size() && ops_[i]->kind != OpKind::conv && ops_[i]->kind != OpKind::linear_run &&
         ops_[i]->kind != OpKind::bn)
    ++i;
  return std::max(i, grad_floor_);
}

int Model::set_frozen(const std::vector<char>& frozen) {
  grad_floor_ = 0;
  skipped_.clear();
  const char* env = std::getenv("DPT_FROZEN_BACKWARD");
  if (frozen.empty() || (env && std::string(env) == "full")) return 0;
  // The slices an op holds: a conv's or bn's own, a linear run's every layer's.
  auto slices_of = [this](const Op& op) {
    std::vector<size_t> out;
    if (op.kind == OpKind::conv || op.kind == OpKind::bn) out.push_back(size_t(op.param));
    if (op.kind == OpKind::linear_run)
      for (const LinearArgs& la : op.run)
        for (size_t s = 0; s < slices_.size(); ++s)
          if (slices_[s].w_off == la.w_at && !slices_[s].bn && !slices_[s].conv) out.push_back(s);
    return out;
  };
  auto trainable = [&](const Op& op) {
    for (size_t s : slices_of(op))
      if (s >= frozen.size() || !frozen[s]) return true;
    return false;
  };
  size_t i = 0;
  while (i < ops_.size() && !trainable(*ops_[i])) ++i;
  if (i == ops_.size()) return 0;  // nothing trains: keep the passes (the run is an evaluation)
  grad_floor_ = i;
  int layers = 0;
  for (size_t j = 0; j < i; ++j)
    for (size_t s : slices_of(*ops_[j])) {
      const LayerSlice& l = slices_[s];
      skipped_.push_back({l.w_off, l.w_off + l.weights()});
      skipped_.push_back({l.b_off, l.b_off + size_t(l.out)});
      be_.fill(grads_.data() + l.w_off, l.weights(), 0.f);
      be_.fill(grads_.data() + l.b_off, size_t(l.out), 0.f);
      ++layers;
    }
  return layers;
}

}  // namespace dpt
