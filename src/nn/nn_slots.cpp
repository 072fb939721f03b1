// Activation memory that ops of the model take turns in (Model::share_slots), and the outputs
// the backward pass makes again (Model::remake_output, device.recompute).
#include <algorithm>
#include <vector>

#include "nn_ops.hpp"

namespace dpt {

// Activation memory that ops take turns in, as a step's live tensors allow (each op's own buffer
// otherwise):
// - With recompute_ (Recompute), a batch norm's ReLU output that only the next op reads, a
//   convolution (forward, and its weight gradient) or a pooling (forward; its backward reads the
//   argmax): it is dead between that read and the backward pass, so every such output shares one
//   slot, and is made again from the batch norm's input and the sums its forward pass kept
//   (remake_output) before the next op's backward pass: the same bits (bn_forward from the same
//   sums), one affine pass more. Two slots where the backend's hint (bf16_read_outputs) holds for
//   some and not for others, so each slot is kept in one form.
// - A projection shortcut's input gradient, kept while the body's backward pass runs: one block's
//   at a time, unless blocks nest. It costs nothing.
void Model::share_slots() {
  const size_t B = size_t(max_batch_);
  const std::vector<bool> bf16_out = bf16_read_outputs();
  std::vector<size_t> remade;
  size_t total = 0;
  for (size_t i = 0; i + 1 < ops_.size(); ++i) {
    const Op& op = *ops_[i];
    const OpKind next = ops_[i + 1]->kind;
    if (op.kind != OpKind::bn || op.act != Act::relu || (next != OpKind::conv && next != OpKind::pool)) continue;
    remade.push_back(i);
    total += B * size_t(op.out.size());
  }
  const bool recompute = recompute_ == Recompute::on || (recompute_ == Recompute::automatic && total >= (size_t(1) << 29));
  size_t need[2] = {0, 0};
  if (recompute)
    for (size_t i : remade) {
      Op& op = *ops_[i];
      op.slot = bf16_out[i] ? 1 : 0;
      need[op.slot] = std::max(need[op.slot], B * size_t(op.out.size()));
    }
  for (int k = 0; k < 2; ++k)
    if (need[k]) relu_slot_[k] = Buffer<float>(be_, need[k], Buffer<float>::Lazy{});
  for (auto& op : ops_)
    if (op->slot >= 0) op->a = Buffer<float>::alias(relu_slot_[op->slot]);
  int depth = 0;
  bool nested = false;
  size_t keep = 0;
  for (auto& op : ops_) {
    if (op->kind == OpKind::res_begin) nested |= ++depth > 1;
    if (op->kind == OpKind::res_end) --depth;
    if (op->kind == OpKind::res_shortcut) keep = std::max(keep, B * size_t(op->out.size()));
  }
  if (nested || keep == 0) return;
  keep_slot_ = Buffer<float>(be_, keep, Buffer<float>::Lazy{});
  for (auto& op : ops_)
    if (op->kind == OpKind::res_shortcut) op->a = Buffer<float>::alias(keep_slot_);
}

int Model::remade_ops() const {
  int n = 0;
  for (const auto& op : ops_) n += op->slot >= 0;
  return n;
}

size_t Model::remade_values() const {
  size_t n = 0;
  for (const auto& op : ops_)
    if (op->slot >= 0) n += size_t(max_batch_) * size_t(op->out.size());
  return n;
}

// Op j's output made again where it shares a slot that another op has written since
// (share_slots): the forward pass's bits, from its input (x: the model's) and kept sums.
void Model::remake_output(size_t j, const float* x, int batch) {
  Op& op = *ops_[j];
  if (op.slot < 0 || slot_holds_[op.slot] == int(j)) return;
  const LayerSlice& s = slices_[size_t(op.param)];
  const int64_t rows = int64_t(batch) * op.in.h * op.in.w;
  be_.bn_forward(j == 0 ? x : ops_[j - 1]->y, op.a.data(), rows, int(op.in.c), op.sums.data(),
                 params_.data() + s.w_off, params_.data() + s.b_off, kBnEps, kBnMomentum, op.mean.data(),
                 op.invstd.data(), nullptr, nullptr, true);
  slot_holds_[op.slot] = int(j);
}

}  // namespace dpt
