// What the model tells its backend about its ops as it is built, so that the backend may keep
// tensors in another form (the CUDA backend under bf16: bf16 only) where every reader takes
// that form: outputs that only batch norm reads (note_bn_input), outputs whose every reader
// takes a bf16 operand (note_bf16_readers), a ReLU output only a max pooling reads
// (note_relu_pool), and who reads each op's input gradient (note_grad_use, from Op::grad_use).
#include "nn_ops.hpp"

namespace dpt {

// Whether every reader of op i's output takes a bf16 operand (note_bf16_readers): the backend
// may keep it in another form. A batch norm's output read by the convolution above (without
// columns: it takes its input as a GEMM operand), or by a residual block's sum (the body's or the
// shortcut's last op); a block's sum that the next block's first ops read (a convolution or a
// batch norm, the identity shortcut's sum); a convolution's ReLU output that a convolution or a
// pooling without padding reads, and such a pooling's output that a convolution or a linear run
// reads (flattened, reordered: reorder_flatten_reads); the input made NHWC for a convolution.
std::vector<bool> Model::bf16_read_outputs() const {
  auto unpadded_pool = [](const Op& r) { return r.kind == OpKind::pool && r.pg.pad == 0; };
  auto bf16_reader = [&](size_t k) {
    const Op& r = *ops_[k];
    return (r.kind == OpKind::conv && !r.cols.data()) || r.kind == OpKind::bn || unpadded_pool(r);
  };
  // A block's input (ops_[k] its res_begin): its readers are the body's first op, and the
  // projection's first op or (identity) the block's sum.
  auto block_reads_bf16 = [&](size_t k) {
    const Op& nb = *ops_[k];
    const size_t mid = size_t(nb.mid), end = size_t(nb.end);
    return k + 1 < mid && bf16_reader(k + 1) && (end == mid + 1 || bf16_reader(mid + 1));
  };
  std::vector<bool> out(ops_.size(), false);
  for (size_t i = 0; i + 1 < ops_.size(); ++i) {
    const Op& op = *ops_[i];
    const OpKind next = ops_[i + 1]->kind;
    bool hint = false;
    if (op.kind == OpKind::bn)  // a padded pooling reads bf16 too (ResNet's stem)
      hint = (op.act == Act::relu && bf16_reader(i + 1) && next == OpKind::conv) || next == OpKind::pool ||
             next == OpKind::res_shortcut || next == OpKind::res_end;
    else if (op.kind == OpKind::conv)
      hint = op.act == Act::relu && !op.cols.data() && bf16_reader(i + 1) &&
             (next == OpKind::conv || unpadded_pool(*ops_[i + 1]));
    else if (unpadded_pool(op))
      hint = (next == OpKind::conv && bf16_reader(i + 1)) || ops_[i + 1]->reordered ||
             (next == OpKind::res_begin && block_reads_bf16(i + 1));
    else if (op.kind == OpKind::pool)  // padded: ResNet's stem pool, read by the first block
      hint = (next == OpKind::conv && bf16_reader(i + 1)) || (next == OpKind::res_begin && block_reads_bf16(i + 1));
    else if (op.kind == OpKind::res_end && next == OpKind::res_begin)
      hint = block_reads_bf16(i + 1);
    else if (op.kind == OpKind::to_nhwc)  // the model's input, made NHWC for the first convolution
      hint = next == OpKind::conv && bf16_reader(i + 1);
    out[i] = hint;
  }
  return out;
}

void Model::give_hints() {
  // A conv without activation whose output only batch norm reads: the backend may keep that
  // output in another form (note_bn_input).
  auto bn_input = [&](const Op& conv, const Op& next) {
    return conv.kind == OpKind::conv && conv.act == Act::none && !conv.a.data() && next.kind == OpKind::bn;
  };
  for (size_t i = 0; i + 1 < ops_.size(); ++i)
    if (bn_input(*ops_[i], *ops_[i + 1])) be_.note_bn_input(ops_[i]->z.data());
  auto unpadded_pool = [](const Op& r) { return r.kind == OpKind::pool && r.pg.pad == 0; };
  const std::vector<bool> bf16_out = bf16_read_outputs();
  for (size_t i = 0; i + 1 < ops_.size(); ++i) {
    if (!bf16_out[i]) continue;
    const Op& op = *ops_[i];
    const float* y = op.a.data() ? op.a.data() : op.z.data();  // a conv's ReLU overwrites z
    be_.note_bf16_readers(y);
    // That output when a max pooling without padding is its only reader (note_relu_pool).
    if (op.kind == OpKind::conv && unpadded_pool(*ops_[i + 1]) && ops_[i + 1]->max)
      be_.note_relu_pool(y, ops_[i + 1]->argmax.data());
  }
  // Who reads each op's input gradient (grad_use), from the op below it.
  using GradUse = Backend::GradUse;
  for (size_t i = 1; i < ops_.size(); ++i) {
    Op& op = *ops_[i];
    const Op& below = *ops_[i - 1];
    if (op.kind == OpKind::conv) {
      if (below.kind == OpKind::bn) op.grad_use = GradUse::bn;
      else if (below.kind == OpKind::res_begin) op.grad_use = GradUse::sum;  // the body's first op
      // A projection shortcut's first op: the switch to the body copies its input gradient aside
      // (a bf16-only one as it is) for the block's add.
      else if (below.kind == OpKind::res_shortcut) op.grad_use = GradUse::sum;
      else if (below.kind == OpKind::conv && below.act == Act::relu && !below.cols.data())
        op.grad_use = GradUse::act;
      else if (below.kind == OpKind::pool)  // padded or not: both read a bf16 dy
        op.grad_use = GradUse::pool;
    } else if (unpadded_pool(op) && below.kind == OpKind::conv && below.act == Act::relu && !below.cols.data()) {
      op.grad_use = GradUse::act;
    } else if (op.kind == OpKind::pool && below.kind == OpKind::bn) {
      op.grad_use = GradUse::bn;  // ResNet's stem pool: its input gradient to bn1's backward
    } else if (op.kind == OpKind::res_begin && below.kind == OpKind::pool) {
      op.grad_use = GradUse::pool;  // the first block's input gradient, read by the stem's pool
    } else if (op.kind == OpKind::res_end && below.kind == OpKind::bn) {
      op.grad_use = GradUse::bn;
    } else if (op.kind == OpKind::res_begin && below.kind == OpKind::res_end && below.act == Act::relu) {
      op.grad_use = GradUse::res;  // the block's input gradient, read by the previous block's add
    } else if (bn_input(below, op) && !slices_[size_t(below.param)].has_bias) {
      op.grad_use = GradUse::conv;
    }
  }
}

}  // namespace dpt
