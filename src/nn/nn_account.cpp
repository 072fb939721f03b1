// Model::op_costs: what each op of the model computes and moves at a batch, for an account of a
// training step's time (bench-step --account sets it beside each op's measured time).
#include <cstdio>
#include <string>

#include "nn_ops.hpp"

namespace dpt {
namespace {

std::string geom_text(const ConvGeom& g) {
  char b[96];
  std::snprintf(b, sizeof b, "%dx%d/%d %d->%d, %dx%d out", g.k, g.k, g.stride, g.c, g.out, g.oh(), g.ow());
  return b;
}

const char* kind_name(OpKind k) {
  switch (k) {
    case OpKind::to_nhwc: return "layout";
    case OpKind::conv: return "conv";
    case OpKind::pool: return "pool";
    case OpKind::act: return "act";
    case OpKind::flatten: return "layout";
    case OpKind::linear_run: return "linear";
    case OpKind::dropout: return "dropout";
    case OpKind::bn: return "bn";
    case OpKind::gap: return "avgpool";
    case OpKind::res_begin:
    case OpKind::res_shortcut:
    case OpKind::res_end: return "residual";
  }
  return "?";
}

}  // namespace

std::vector<OpCost> Model::op_costs(int batch) const {
  // A residual block's name: its first layer's without the last part ("layer1.0.conv1" ->
  // "layer1.0"), else "block@" and its position in the list.
  auto block = [this](int begin) {
    for (size_t j = size_t(begin) + 1; j < ops_.size(); ++j) {
      const Op& o = *ops_[j];
      if (o.kind != OpKind::conv && o.kind != OpKind::bn) continue;
      const std::string& n = slices_[size_t(o.param)].name;
      const size_t dot = n.rfind('.');
      if (dot != std::string::npos) return n.substr(0, dot);
      break;
    }
    return "block@" + std::to_string(ops_[size_t(begin)]->layer);
  };
  // The backward pass ends at the first op with parameters, which computes no input gradient.
  const size_t lowest = lowest_backward_op();
  std::vector<OpCost> out;
  const double B = batch;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = *ops_[i];
    const bool dx = i > lowest;
    const double nin = B * double(op.in.size()), nout = B * double(op.out.size());
    OpCost c;
    c.kind = kind_name(op.kind);
    c.name = c.kind + "@" + std::to_string(op.layer);
    c.has_bwd = i >= lowest;
    switch (op.kind) {
      case OpKind::to_nhwc:
        c.shape = "NCHW->NHWC " + op.in.str();
        c.fwd_values = nin + nout;
        c.has_bwd = false;
        break;
      case OpKind::conv: {
        ConvGeom g = op.cg;
        g.batch = batch;
        const LayerSlice& s = slices_[size_t(op.param)];
        c.name = s.name;
        c.shape = geom_text(g) + (op.act == Act::relu ? " +relu" : "");
        const double macs = double(g.rows()) * double(g.out) * double(g.cols());
        c.fwd_flops = 2 * macs;
        c.bwd_flops = 2 * macs * (dx ? 2 : 1);  // the weight's gradient, and the input's
        c.fwd_values = nin + nout;
        c.bwd_values = nout + nin + (dx ? nin : 0);  // dy and x read, dx written
        c.param_values = double(s.weights()) + (s.has_bias ? s.out : 0);
        break;
      }
      case OpKind::linear_run: {
        c.name = slices_[size_t(op.run_params.front())].name;
        if (op.run_params.size() > 1) c.name += ".." + slices_[size_t(op.run_params.back())].name;
        double values = nin;
        for (size_t k = 0; k < op.run.size(); ++k) {
          const LinearArgs& l = op.run[k];
          const double macs = B * l.in * l.out;
          c.fwd_flops += 2 * macs;
          c.bwd_flops += 2 * macs * (k > 0 || dx ? 2 : 1);
          values += B * l.out;
          c.param_values += double(l.in) * l.out + l.out;
          c.shape += (k ? "->" : std::to_string(l.in) + "->") + std::to_string(l.out);
        }
        c.fwd_values = values;
        c.bwd_values = values + (dx ? nin : 0);  // each output's gradient and the input read, dx written
        break;
      }
      case OpKind::bn:
        c.name = slices_[size_t(op.param)].name;
        c.shape = std::to_string(op.in.c) + " ch, " + std::to_string(op.in.h) + "x" + std::to_string(op.in.w) +
                  (op.act == Act::relu ? " +relu" : "");
        c.fwd_values = nin + nout;
        c.bwd_values = nout + nin + (dx ? nin : 0);
        c.param_values = 2.0 * double(op.in.c);
        break;
      case OpKind::pool:
        c.kind = op.max ? "maxpool" : "avgpool";
        c.name = c.kind + "@" + std::to_string(op.layer);
        c.shape = std::to_string(op.pg.k) + "x" + std::to_string(op.pg.k) + "/" + std::to_string(op.pg.stride) + " " +
                  op.in.str() + "->" + op.out.str();
        c.fwd_values = nin + nout;
        c.bwd_values = nout + nin;
        break;
      case OpKind::gap:
        c.shape = op.in.str() + "->" + op.out.str();
        c.fwd_values = nin + nout;
        c.bwd_values = nout + nin;
        break;
      case OpKind::act:
        c.shape = op.in.str();
        c.fwd_values = nin + nout;
        c.bwd_values = 3 * nout;  // dy and the activation read, dx written
        break;
      case OpKind::flatten:
        c.shape = op.alias ? "none (read in place)" : "NHWC->NCHW " + op.in.str();
        c.fwd_values = op.alias ? 0 : nin + nout;
        c.bwd_values = op.alias ? 0 : nin + nout;
        c.has_fwd = !op.alias;
        c.has_bwd = c.has_bwd && !op.alias;
        break;
      case OpKind::dropout:
        c.shape = "p=" + std::to_string(op.p);
        c.fwd_values = op.p > 0 ? nin + nout : 0;
        c.bwd_values = op.p > 0 ? 2 * nout : 0;
        c.has_fwd = c.has_bwd = op.p > 0;
        break;
      case OpKind::res_begin:
        // Forward: the block's input is kept (nothing moves). Backward: the two branches'
        // gradients added.
        c.name = block(int(i)) + " join";
        c.shape = "gradients added, " + op.out.str();
        c.has_fwd = false;
        c.bwd_values = 3 * nout;
        break;
      case OpKind::res_shortcut:
        // Nothing to compute either way: the backward's copies (a projection shortcut's) are
        // moves an implementation can avoid.
        c.name = block(op.begin) + " shortcut";
        c.shape = "branch switch, " + op.out.str();
        c.has_fwd = false;
        break;
      case OpKind::res_end:
        c.name = block(op.begin) + " add";
        c.shape = op.out.str() + (op.act == Act::relu ? " +relu" : "");
        c.fwd_values = 3 * nout;  // both branches read, the sum written
        c.bwd_values = 3 * nout;  // dy and the output (the ReLU's mask) read, dx written
        break;
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace dpt
