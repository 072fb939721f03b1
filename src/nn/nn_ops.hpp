// The model's ops (Model::Op), shared by nn.cpp (building, forward, backward) and nn_hints.cpp
// (what the model tells its backend about them).
#pragma once

#include <optional>
#include <vector>

#include "dpt/nn.hpp"

namespace dpt {

// ---- the ops a forward pass runs, in order ----
// A conv or linear layer takes the activation that follows it (computed in its epilogue);
// consecutive linear layers form one run (Backend::mlp_forward/mlp_backward); an image input
// with several channels is made NHWC first, unless the model starts flat.
// A residual block runs as res_begin (its input is kept), the body's ops, res_shortcut (the
// body's output kept, the block's input taken up again), the shortcut's ops, res_end (the sum).
enum class OpKind { to_nhwc, conv, pool, act, flatten, linear_run, dropout, bn, gap, res_begin, res_shortcut,
                    res_end };

struct Model::Op {
  OpKind kind = OpKind::act;
  int layer = 0;        // its (first) layer's position in the list
  TensorShape in, out;  // per sample
  int param = -1;       // conv: its LayerSlice
  ConvGeom cg;          // conv (batch set per pass)
  PoolGeom pg;          // pool
  bool max = true;      // pool
  Act act = Act::none;  // conv's epilogue, the act op's, or a ReLU fused into bn / res_end
  double p = 0;         // dropout
  bool alias = false;   // flatten with nothing to move (one channel, or already flat; or reordered)
  bool reordered = false;  // flatten: the linear run above reads the NHWC image (nhwc_c below)
  std::vector<LinearArgs> run;  // linear_run
  std::vector<int> run_params;  // its LayerSlices
  std::vector<Buffer<float>> zs;  // linear_run: each layer's z and (with an activation) a
  // linear_run on a flattened image it reads in NHWC order (nhwc_c channels, nhwc_hw pixels):
  // its first layer's weight reordered to match (wp), and that weight's gradient (dwp), which
  // goes back to the arena (at the layer's w_at) in the checkpoint's NCHW order.
  int nhwc_c = 0, nhwc_hw = 0;
  Buffer<float> wp, dwp;
  Buffer<float> z, a, cols;
  Buffer<uint8_t> argmax;  // a max pooling's window indices (Backend::pool_forward)
  const float* y = nullptr;  // output of the last forward
  // bn: the running statistics, this pass's mean and 1/std, partial sums (2c + 1)
  Buffer<float> rmean, rvar, mean, invstd;
  Buffer<double> sums;
  int64_t tracked = 0;
  // res_*: the block's other markers (ops_ indices); res_shortcut keeps the body's output
  // (body_y) and, backward, the shortcut's input gradient (a); res_end keeps its output
  // gradient (a) for the body.
  int begin = -1, mid = -1, end = -1;
  const float* body_y = nullptr;
  // res_end: the first op of each branch's backward is a batch norm, so both can read the kept
  // output gradient (a) themselves (Model::dy_from_): the add's backward then writes that one
  // tensor, not the current gradient buffer too (Backend::residual_backward_keep). kept_only:
  // the last backward did so (the backend may decline).
  bool keep_feeds = false, kept_only = false;
  // bn: a residual block's last (of the body or a projection shortcut, without ReLU), whose
  // output only the block's sum reads: its training pass may leave the affine pass to that sum
  // (Backend::bn_train_deferred).
  bool defer = false;
  // bn with a ReLU that only the next op (a convolution or a pooling) reads: the relu slot its
  // output takes turns in (Model::share_slots), or -1 (its own buffer).
  int slot = -1;
  // Backward, the one op that reads this op's input gradient, where it is one the backend can
  // hand a bf16 operand (note_grad_use): bn — the convolution below, one without bias or
  // activation (GradUse::conv); conv — the batch norm below (GradUse::bn), a residual block's add
  // or a projection shortcut's switch to the body (GradUse::sum), a convolution with a fused ReLU
  // (GradUse::act), a pooling (GradUse::pool); pool — a convolution with a fused ReLU (without
  // padding: GradUse::act), a batch norm (GradUse::bn);
  // res_end — the batch norm below, the last op of the shortcut or the body (GradUse::bn);
  // res_begin — the previous block's add with a ReLU (GradUse::res), a pooling (the stem's:
  // GradUse::pool).
  std::optional<Backend::GradUse> grad_use;
};

}  // namespace dpt
