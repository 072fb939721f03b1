#include "dpt/nn.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <sstream>

#include "dpt/check.hpp"
#include "dpt/data.hpp"
#include "nn_ops.hpp"

namespace dpt {

std::vector<int> parse_layers(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string tok;
  while (std::getline(in, tok, ',')) {
    size_t pos = 0;
    long v = 0;
    try {
      v = std::stol(tok, &pos);
    } catch (...) {
      pos = 0;
    }
    while (pos < tok.size() && std::isspace(static_cast<unsigned char>(tok[pos]))) ++pos;
    if (pos == 0 || pos != tok.size() || v < 1 || v > (1 << 20))
      throw InputError("layer width '" + tok + "' is not an integer in [1, 1048576]");
    out.push_back(int(v));
  }
  if (out.size() < 2) throw InputError("need at least an input and an output width, e.g. 784,10");
  return out;
}

Recompute parse_recompute(const std::string& s) {
  if (s == "off") return Recompute::off;
  if (s == "on") return Recompute::on;
  if (s == "auto") return Recompute::automatic;
  throw InputError("unknown recompute setting '" + s + "' (auto | on | off)");
}

std::vector<int64_t> LayerSlice::weight_shape() const {
  if (conv) return {out, c, k, k};
  if (bn) return {out};
  return {out, in};
}

void weight_to_checkpoint(const LayerSlice& s, const float* arena_w, float* out) {
  if (!s.conv) {
    std::copy(arena_w, arena_w + s.weights(), out);
    return;
  }
  const size_t c = size_t(s.c), k = size_t(s.k);
  for (size_t o = 0; o < size_t(s.out); ++o)
    for (size_t ci = 0; ci < c; ++ci)
      for (size_t kk = 0; kk < k * k; ++kk) out[(o * c + ci) * k * k + kk] = arena_w[(o * k * k + kk) * c + ci];
}

void weight_from_checkpoint(const LayerSlice& s, const float* in, float* arena_w) {
  if (!s.conv) {
    std::copy(in, in + s.weights(), arena_w);
    return;
  }
  const size_t c = size_t(s.c), k = size_t(s.k);
  for (size_t o = 0; o < size_t(s.out); ++o)
    for (size_t ci = 0; ci < c; ++ci)
      for (size_t kk = 0; kk < k * k; ++kk) arena_w[(o * k * k + kk) * c + ci] = in[(o * c + ci) * k * k + kk];
}

std::vector<ParamShape> mlp_param_shapes(const std::vector<int>& widths) {
  std::vector<ParamShape> s;
  for (size_t i = 0; i + 1 < widths.size(); ++i) s.push_back({widths[i], widths[i + 1], true});
  return s;
}

std::vector<ParamShape> param_shapes(const ModelPlan& plan) {
  std::vector<ParamShape> s;
  for (const PlannedLayer& p : plan.layers) {
    if (p.spec.kind == LayerKind::bn) s.push_back({1, int(p.in.c), false});
    else if (p.spec.has_params()) s.push_back({int(p.weights / p.spec.out), p.spec.out, p.spec.kind == LayerKind::linear});
  }
  return s;
}

std::vector<TensorSeg> param_tensors(const std::vector<LayerSlice>& layers) {
  std::vector<TensorSeg> t;
  for (const LayerSlice& l : layers) {  // from each slice's own offsets: weight and bias may lie apart
    t.push_back({l.w_off, l.w_off + l.weights(), !l.bn});
    t.push_back({l.b_off, l.b_off + size_t(l.out), false});
  }
  std::sort(t.begin(), t.end(), [](const TensorSeg& a, const TensorSeg& b) { return a.begin < b.begin; });
  return t;
}

ArenaLayout packed_layout(const std::vector<ParamShape>& layers) {
  ArenaLayout l;
  size_t off = 0;
  for (const ParamShape& p : layers) {
    l.w_off.push_back(off);
    off += size_t(p.in) * size_t(p.out);
    l.b_off.push_back(off);
    off += size_t(p.out);
    l.piece_rows.push_back(0);
  }
  l.total = off;
  return l;
}

ArenaLayout packed_layout(const std::vector<int>& widths) { return packed_layout(mlp_param_shapes(widths)); }

Model::Model(Backend& be, std::vector<int> widths, Act act, int max_batch, ArenaLayout layout)
    : be_(be), widths_(std::move(widths)), act_(act), max_batch_(max_batch) {
  plan_ = plan_model(mlp_layer_list(widths_, act_), TensorShape::features(widths_.front()), 0);
  build(max_batch, std::move(layout));
}

Model::Model(Backend& be, ModelPlan plan, int max_batch, ArenaLayout layout, Recompute recompute)
    : be_(be), plan_(std::move(plan)), max_batch_(max_batch), recompute_(recompute) {
  build(max_batch, std::move(layout));
}

Model::~Model() = default;

std::vector<ParamShape> Model::param_shapes() const {
  std::vector<ParamShape> s;
  for (const LayerSlice& l : slices_) s.push_back({l.in, l.out, !l.conv});
  return s;
}

void Model::build(int max_batch, ArenaLayout layout) {
  bool resnet_ops = false;
  int widest_out = 1;
  for (const PlannedLayer& p : plan_.layers) {
    const LayerKind k = p.spec.kind;
    resnet_ops |= k == LayerKind::bn || k == LayerKind::res_begin || p.spec.global || (p.spec.pad && k != LayerKind::conv);
    if (!p.spec.has_params()) continue;
    LayerSlice s;
    s.conv = k == LayerKind::conv;
    s.bn = k == LayerKind::bn;
    s.has_bias = p.biases > 0;
    s.out = s.bn ? int(p.in.c) : p.spec.out;
    s.in = s.bn ? 1 : int(p.weights / p.spec.out);
    if (s.conv) {
      s.c = int(p.in.c);
      s.k = p.spec.k;
    }
    s.name = p.name;
    widest_out = std::max(widest_out, s.out);
    slices_.push_back(s);
  }
  if (resnet_ops && !be_.has_resnet_ops()) throw InputError(kNeedsResnetOps);
  nobias_db_ = Buffer<float>(be_, size_t(widest_out));
  if (layout.w_off.empty()) layout = packed_layout(param_shapes());
  const size_t L = slices_.size();
  if (layout.w_off.size() != L || layout.b_off.size() != L || layout.piece_rows.size() != L)
    throw Error("Model: the arena layout has " + std::to_string(layout.w_off.size()) + " layers, the model " +
                std::to_string(L));
  for (size_t i = 0; i < L; ++i) {
    LayerSlice& s = slices_[i];
    s.w_off = layout.w_off[i];
    s.b_off = layout.b_off[i];
    if (s.w_off + s.weights() > layout.total || s.b_off + size_t(s.out) > layout.total)
      throw Error("Model: layer " + std::to_string(i) + " lies outside the arena layout");
  }
  piece_rows_ = layout.piece_rows;
  n_params_ = layout.total;
  params_ = Buffer<float>(be_, n_params_);
  be_.register_parameters(params_.data(), n_params_);
  be_.fill(params_.data(), n_params_, 0.f);  // padding stays zero
  grads_ = Buffer<float>(be_, n_params_);
  be_.fill(grads_.data(), n_params_, 0.f);
  build_ops();
  // Gradients between ops: the largest tensor any op reads or writes (Linear widths included).
  int64_t widest = plan_.input.size();
  for (const PlannedLayer& p : plan_.layers) widest = std::max({widest, p.in.size(), p.out.size()});
  // Activations and the gradients between ops may be kept in bf16 only (the CUDA backend's
  // hints): their floats are lazy memory, backed only where written.
  for (auto& g : grad_) g = Buffer<float>(be_, size_t(max_batch) * size_t(widest), Buffer<float>::Lazy{});
}

void Model::build_ops() {
  const size_t B = size_t(max_batch_);
  auto buf = [&](const TensorShape& t) { return Buffer<float>(be_, B * size_t(t.size()), Buffer<float>::Lazy{}); };
  const std::vector<PlannedLayer>& L = plan_.layers;
  const bool starts_flat = L.front().spec.kind == LayerKind::flatten || L.front().spec.kind == LayerKind::linear;
  if (!plan_.input.flat && plan_.input.c > 1 && !starts_flat) {
    auto op = std::make_unique<Op>();
    op->kind = OpKind::to_nhwc;
    op->in = op->out = plan_.input;
    op->a = buf(plan_.input);
    ops_.push_back(std::move(op));
  }
  int param = 0;
  for (size_t i = 0; i < L.size(); ++i) {
    const PlannedLayer& p = L[i];
    const LayerSpec& l = p.spec;
    // An activation right after a conv or linear layer runs in its epilogue; a ReLU after batch
    // norm or a residual block's sum, in the same pass (one pass over the tensor less each way).
    const bool next_act = i + 1 < L.size() && L[i + 1].spec.kind == LayerKind::act;
    const bool fuse_act =
        next_act && (l.kind == LayerKind::conv || l.kind == LayerKind::linear ||
                     ((l.kind == LayerKind::bn || l.kind == LayerKind::res_end) && L[i + 1].spec.act == Act::relu));
    const Act act = fuse_act ? L[i + 1].spec.act : Act::none;
    const TensorShape out = fuse_act ? L[i + 1].out : p.out;
    if (l.kind == LayerKind::linear) {
      const bool extend = !ops_.empty() && ops_.back()->kind == OpKind::linear_run;
      if (!extend) {
        auto op = std::make_unique<Op>();
        op->kind = OpKind::linear_run;
        op->layer = int(i);
        op->in = p.in;
        ops_.push_back(std::move(op));
      }
      Op& op = *ops_.back();
      const LayerSlice& s = slices_[size_t(param)];
      LinearArgs la;  // z and a are placed once the run is complete (below)
      la.w = params_.data() + s.w_off;
      la.b = params_.data() + s.b_off;
      la.dw = grads_.data() + s.w_off;
      la.db = grads_.data() + s.b_off;
      la.in = s.in;
      la.out = s.out;
      la.act = act;
      la.w_at = s.w_off;
      la.b_at = s.b_off;
      la.piece_rows = piece_rows_[size_t(param)];
      op.run.push_back(la);
      op.run_params.push_back(param);
      op.out = out;
      ++param;
      i += fuse_act;
      continue;
    }
    auto op = std::make_unique<Op>();
    op->layer = int(i);
    op->in = p.in;
    op->out = out;
    switch (l.kind) {
      case LayerKind::conv: {
        op->kind = OpKind::conv;
        op->param = param++;
        op->act = act;
        ConvGeom& g = op->cg;
        g.c = int(p.in.c); g.h = int(p.in.h); g.w = int(p.in.w);
        g.out = l.out; g.k = l.k; g.stride = l.stride; g.pad = l.pad;
        g.batch = max_batch_;
        op->cols = Buffer<float>(be_, be_.conv_cols(g, op->param > 0));  // the first computes no dx
        op->z = buf(p.out);
        // relu, tanh and sigmoid differentiate from a alone (relu: a > 0 exactly where z > 0),
        // so a overwrites z in place: one pass over the output less. gelu needs z.
        if (act == Act::gelu) op->a = buf(p.out);
        break;
      }
      case LayerKind::avgpool:
        if (l.global) {
          op->kind = OpKind::gap;
          op->a = buf(p.out);
          break;
        }
        // fall through
      case LayerKind::maxpool: {
        op->kind = OpKind::pool;
        op->max = l.kind == LayerKind::maxpool;
        PoolGeom& g = op->pg;
        g.c = int(p.in.c); g.h = int(p.in.h); g.w = int(p.in.w);
        g.k = l.k; g.stride = l.stride; g.pad = l.pad;
        op->a = buf(p.out);
        if (op->max) op->argmax = Buffer<uint8_t>(be_, B * size_t(p.out.size()));
        break;
      }
      case LayerKind::act:
        op->kind = OpKind::act;
        op->act = l.act;
        op->a = buf(p.out);
        break;
      case LayerKind::flatten:
        op->kind = OpKind::flatten;
        // NHWC and NCHW are the same bytes with one channel or one pixel; the model's input
        // is NCHW already.
        op->alias = p.in.flat || p.in.c == 1 || p.in.h * p.in.w == 1 || i == 0;
        if (!op->alias) op->a = buf(p.out);
        break;
      case LayerKind::dropout:
        op->kind = OpKind::dropout;
        op->p = l.p;
        op->a = buf(p.out);
        break;
      case LayerKind::bn: {
        op->kind = OpKind::bn;
        op->act = act;
        op->param = param++;
        const size_t c = size_t(p.in.c);
        op->a = buf(p.out);
        op->rmean = Buffer<float>(be_, c);
        op->rvar = Buffer<float>(be_, c);
        op->mean = Buffer<float>(be_, c);
        op->invstd = Buffer<float>(be_, c);
        op->sums = Buffer<double>(be_, 2 * c + 1);
        be_.fill(op->rmean.data(), c, 0.f);
        be_.fill(op->rvar.data(), c, 1.f);
        break;
      }
      case LayerKind::res_begin:
        op->kind = OpKind::res_begin;
        break;
      case LayerKind::res_shortcut:
        op->kind = OpKind::res_shortcut;
        op->a = buf(p.out);  // the shortcut's input gradient, kept while the body's runs
        break;
      case LayerKind::res_end:
        op->kind = OpKind::res_end;
        op->act = act;
        op->a = buf(p.out);  // the sum; backward: its gradient, kept for the body
        break;
      default:
        break;
    }
    ops_.push_back(std::move(op));
    i += fuse_act;
  }
  link_blocks();
  reorder_flatten_reads();
  share_slots();
  give_hints();
  // The runs' activations: every layer's z, and its a where it has an activation (else a is
  // z), one allocation each, as the MLP always kept them.
  for (auto& op : ops_)
    for (LinearArgs& la : op->run) {
      op->zs.emplace_back(be_, B * size_t(la.out));
      la.z = op->zs.back().data();
      la.a = la.z;
      if (la.act == Act::none) continue;
      op->zs.emplace_back(be_, B * size_t(la.out));
      la.a = op->zs.back().data();
    }
}

// A flatten of an NHWC image that a linear run reads next: the run's first layer reads the
// image as it is, its weight reordered to NHWC for each pass (Backend::weight_to_nhwc) and its
// weight gradient back to the arena's NCHW order, where the weight is no larger than the batch's
// activation (out ≤ max batch). Two transposes of the weight per pass instead of two of the
// batch's activation (the compute-bound CNN at batch 256: 10×65,536 weights against
// 256×65,536 activations). The arena, the checkpoint and the optimizer keep NCHW order; only the
// layer's sum over its inputs runs in another order.
void Model::reorder_flatten_reads() {
  for (size_t i = 0; i + 1 < ops_.size(); ++i) {
    Op& f = *ops_[i];
    Op& run = *ops_[i + 1];
    if (f.kind != OpKind::flatten || f.alias || run.kind != OpKind::linear_run) continue;
    LinearArgs& l = run.run.front();
    if (l.out > max_batch_) continue;
    f.alias = f.reordered = true;
    f.a = Buffer<float>();
    run.nhwc_c = int(f.in.c);
    run.nhwc_hw = int(f.in.h * f.in.w);
    const size_t nw = size_t(l.out) * size_t(l.in);
    run.wp = Buffer<float>(be_, nw);
    run.dwp = Buffer<float>(be_, nw);
    l.w = run.wp.data();
    l.dw = run.dwp.data();
  }
}

bool Model::reads_flatten_nhwc() const {
  for (const auto& op : ops_)
    if (op->nhwc_c) return true;
  return false;
}

// Each residual marker learns the other two of its block.
void Model::link_blocks() {
  std::vector<int> open;
  for (size_t i = 0; i < ops_.size(); ++i) {
    Op& op = *ops_[i];
    if (op.kind == OpKind::res_begin) {
      open.push_back(int(i));
    } else if (op.kind == OpKind::res_shortcut) {
      ops_[size_t(open.back())]->mid = int(i);
    } else if (op.kind == OpKind::res_end) {
      Op& b = *ops_[size_t(open.back())];
      b.end = int(i);
      for (int j : {b.mid, int(i)}) {
        ops_[size_t(j)]->begin = open.back();
        ops_[size_t(j)]->mid = b.mid;
        ops_[size_t(j)]->end = int(i);
      }
      open.pop_back();
    }
  }
  // A block's add backward feeds its kept gradient straight to the branches' batch norms: the
  // shortcut's last op (a projection's) and the body's last op (the only one, with an identity).
  auto is_bn = [&](int j) { return j >= 0 && ops_[size_t(j)]->kind == OpKind::bn; };
  for (size_t i = 0; i < ops_.size(); ++i) {
    Op& op = *ops_[i];
    if (op.kind == OpKind::res_end) op.keep_feeds = op.end == op.mid + 1 ? is_bn(op.mid - 1) : is_bn(int(i) - 1);
    if (op.kind == OpKind::bn && i + 1 < ops_.size() && op.act == Act::none)
      op.defer = ops_[i + 1]->kind == OpKind::res_shortcut || ops_[i + 1]->kind == OpKind::res_end;
  }
}

std::vector<BnState> Model::bn_states() {
  std::vector<BnState> s;
  for (auto& op : ops_)
    if (op->kind == OpKind::bn)
      s.push_back({slices_[size_t(op->param)].name, int(op->in.c), op->rmean.data(), op->rvar.data(), &op->tracked});
  return s;
}

void Model::count_bn_passes(int64_t n) {
  for (auto& op : ops_)
    if (op->kind == OpKind::bn) op->tracked += n;
}

std::vector<float> Model::packed(const std::vector<float>& arena) const {
  std::vector<float> out;
  for (const LayerSlice& s : slices_) {
    out.insert(out.end(), arena.begin() + long(s.w_off), arena.begin() + long(s.w_off + s.weights()));
    out.insert(out.end(), arena.begin() + long(s.b_off), arena.begin() + long(s.b_off + size_t(s.out)));
  }
  return out;
}

void Model::init_params(uint64_t seed) {
  // nn.Linear.reset_parameters and nn.Conv2d's: kaiming_uniform_(a=√5) gives U(−1/√fan_in,
  // 1/√fan_in) for the weight, and the bias uses the same bound.
  std::vector<float> host(n_params_), w;
  SplitMix64 rng(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull);
  // Weight then bias of each layer from one stream, as when they were packed in the arena; a
  // conv weight drawn in the checkpoint's order.
  for (const LayerSlice& s : slices_) {
    if (s.bn) {  // nn.BatchNorm's reset_parameters (the bias stays 0)
      std::fill(host.begin() + long(s.w_off), host.begin() + long(s.w_off + size_t(s.out)), 1.f);
      continue;
    }
    const double bound = 1.0 / std::sqrt(double(s.in));  // s.in = c·k·k for a conv
    w.resize(s.weights());
    if (s.conv && plan_.preset) {
      // torchvision's ResNet: kaiming_normal_(mode="fan_out", nonlinearity="relu"), by Box-Muller.
      const double sd = std::sqrt(2.0 / (double(s.out) * s.k * s.k));
      for (size_t i = 0; i < w.size(); i += 2) {
        const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
        const double r = std::sqrt(-2.0 * std::log(u1)) * sd;
        w[i] = float(r * std::cos(6.283185307179586 * u2));
        if (i + 1 < w.size()) w[i + 1] = float(r * std::sin(6.283185307179586 * u2));
      }
    } else {
      for (float& v : w) v = float((2.0 * rng.uniform() - 1.0) * bound);
    }
    weight_from_checkpoint(s, w.data(), host.data() + s.w_off);
    if (s.has_bias)
      for (size_t i = 0; i < size_t(s.out); ++i) host[s.b_off + i] = float((2.0 * rng.uniform() - 1.0) * bound);
  }
  be_.upload(params_.data(), host.data(), n_params_ * sizeof(float));
  for (auto& op : ops_)
    if (op->kind == OpKind::bn) {
      be_.fill(op->rmean.data(), size_t(op->in.c), 0.f);
      be_.fill(op->rvar.data(), size_t(op->in.c), 1.f);
      op->tracked = 0;
    }
}

const float* Model::forward(const float* x, int batch, const TrainPass* train) {
  if (batch > max_batch_) throw Error("batch " + std::to_string(batch) + " exceeds the model's max batch");
  trained_ = train != nullptr;
  if (train) train_ = *train;
  const float* cur = x;
  for (size_t i = 0; i < ops_.size(); ++i) {
    Op& op = *ops_[i];
    if (probe_) probe_(StepPoint::forward, int(i));
    const size_t n = size_t(batch) * size_t(op.out.size());
    switch (op.kind) {
      case OpKind::to_nhwc:
        be_.nchw_to_nhwc(cur, op.a.data(), batch, int(op.in.c), int(op.in.h * op.in.w));
        cur = op.a.data();
        break;
      case OpKind::conv: {
        ConvGeom g = op.cg;
        g.batch = batch;
        const LayerSlice& s = slices_[size_t(op.param)];
        float* a = op.a.data() ? op.a.data() : op.z.data();
        be_.conv_forward(cur, params_.data() + s.w_off, s.has_bias ? params_.data() + s.b_off : nullptr,
                         op.cols.data(), op.z.data(), a, g, op.act);
        cur = a;
        break;
      }
      case OpKind::pool: {
        PoolGeom g = op.pg;
        g.batch = batch;
        be_.pool_forward(cur, op.a.data(), op.max ? op.argmax.data() : nullptr, g, op.max);
        cur = op.a.data();
        break;
      }
      case OpKind::gap:
        be_.global_avgpool_forward(cur, op.a.data(), batch, int(op.in.h * op.in.w), int(op.in.c));
        cur = op.a.data();
        break;
      case OpKind::bn: {
        const LayerSlice& s = slices_[size_t(op.param)];
        const int64_t rows = int64_t(batch) * op.in.h * op.in.w;
        const int c = int(op.in.c);
        const float* w = params_.data() + s.w_off;
        const float* b = params_.data() + s.b_off;
        if (!train) {
          be_.bn_infer(cur, op.a.data(), rows, c, op.rmean.data(), op.rvar.data(), w, b, kBnEps, op.act == Act::relu);
        } else if (!bn_reduce_) {
          // A block's last batch norm may leave its output to the block's sum (op.defer).
          if (!(op.defer && be_.bn_train_deferred(cur, op.a.data(), rows, c, op.sums.data(), w, b, kBnEps,
                                                  kBnMomentum, op.mean.data(), op.invstd.data(), op.rmean.data(),
                                                  op.rvar.data())))
            be_.bn_train_forward(cur, op.a.data(), rows, c, op.sums.data(), w, b, kBnEps, kBnMomentum,
                                 op.mean.data(), op.invstd.data(), op.rmean.data(), op.rvar.data(),
                                 op.act == Act::relu);
          ++op.tracked;
        } else {  // sync_bn: the sums over every rank's micro-batch
          be_.bn_sums(cur, rows, c, op.sums.data());
          bn_reduce_(op.sums.data(), 2 * size_t(c) + 1);
          be_.bn_forward(cur, op.a.data(), rows, c, op.sums.data(), w, b, kBnEps, kBnMomentum, op.mean.data(),
                         op.invstd.data(), op.rmean.data(), op.rvar.data(), op.act == Act::relu);
          ++op.tracked;
        }
        if (op.slot >= 0) slot_holds_[op.slot] = int(i);
        cur = op.a.data();
        break;
      }
      case OpKind::res_begin:
        break;
      case OpKind::res_shortcut:
        op.body_y = cur;
        cur = ops_[size_t(op.begin)]->y;
        break;
      case OpKind::res_end:
        be_.residual_sum(ops_[size_t(op.mid)]->body_y, cur, op.a.data(), n, op.act == Act::relu);
        cur = op.a.data();
        break;
      case OpKind::act:
        be_.act_forward(cur, op.a.data(), n, op.act);
        cur = op.a.data();
        break;
      case OpKind::flatten:
        if (!op.alias) {
          be_.nhwc_to_nchw(cur, op.a.data(), batch, int(op.in.c), int(op.in.h * op.in.w));
          cur = op.a.data();
        }
        break;
      case OpKind::linear_run:
        if (op.nhwc_c)
          be_.weight_to_nhwc(params_.data() + op.run[0].w_at, op.wp.data(), op.run[0].out, op.nhwc_c, op.nhwc_hw);
        be_.mlp_forward(cur, batch, op.run);
        cur = op.run.back().a;
        break;
      case OpKind::dropout:
        if (train && op.p > 0) {
          DropoutArgs d;
          d.p = op.p;
          d.seed = train->seed;
          d.layer = op.layer;
          d.first = train->first;
          d.c = int(op.in.c), d.h = int(op.in.h), d.w = int(op.in.w);
          be_.dropout(cur, op.a.data(), batch, d, train->ctl);
          cur = op.a.data();
        }
        break;
    }
    op.y = cur;
  }
  logits_ = cur;
  return cur;
}

void Model::loss(const int32_t* labels, int batch, float grad_scale, float* stats, bool need_grad, bool smooth) {
  float* d = need_grad ? grad_[0].data() : nullptr;
  if (probe_) probe_(StepPoint::loss, -1);
  if (smooth && smoothing_ > 0) be_.softmax_xent_smoothed(logits_, labels, batch, classes(), grad_scale, d, stats, smoothing_);
  else be_.softmax_xent(logits_, labels, batch, classes(), grad_scale, d, stats);
}

void Model::backward(const float* x, int batch, bool accumulate, const PassHooks& hooks) {
  // grad_[cur] holds dLoss/d(the op's output): the logits' gradient from loss() first. The
  // lowest op computes no input gradient, and the ones below it are skipped (lowest_backward_op).
  const size_t lowest = lowest_backward_op();
  int cur = 0;
  dy_from_ = nullptr;
  for (size_t i = ops_.size(); i-- > lowest;) {
    if (probe_) probe_(StepPoint::backward, int(i));
    if (i > 0) remake_output(i - 1, x, batch);  // before the op that reads it (and its own backward)
    backward_op(*ops_[i], i == 0 ? x : ops_[i - 1]->y, batch, accumulate, hooks, cur, i > lowest);
  }
  // The frozen layers below the floor: their (zero) gradients are as final as they will be.
  for (const auto& [b, e] : skipped_)
    if (hooks.grads_final) hooks.grads_final(b, e);
  for (const auto& [b, e] : skipped_)
    if (hooks.params_released) hooks.params_released(b, e);
}

// One op's backward from grad_[cur]; cur moves to the buffer holding its input's gradient.
void Model::backward_op(Op& op, const float* in, int batch, bool accumulate, const PassHooks& hooks,
                        int& cur, bool want_dx) {
  const bool first = !want_dx;
  // Buffers 0 and 1 take turns; a linear run takes the third as well (cur is 2 only after one),
  // so a model whose linear runs are small never writes most of it (lazy memory, see build).
  const int nxt = cur == 0 ? 1 : 0, spare = 3 - cur - nxt;
  float* d = grad_[cur].data();
  const size_t n = size_t(batch) * size_t(op.out.size());
  switch (op.kind) {
    case OpKind::to_nhwc:
      break;
    case OpKind::conv: {
      ConvGeom g = op.cg;
      g.batch = batch;
      const LayerSlice& s = slices_[size_t(op.param)];
      const float* a = op.a.data() ? op.a.data() : op.z.data();
      if (op.grad_use && !first) be_.note_grad_use(grad_[nxt].data(), *op.grad_use);
      be_.conv_backward(in, params_.data() + s.w_off, op.z.data(), a, d, op.cols.data(), g, op.act,
                        grads_.data() + s.w_off, s.has_bias ? grads_.data() + s.b_off : nobias_db_.data(),
                        first ? nullptr : grad_[nxt].data(), accumulate);
      // conv_backward makes the gradients and the input gradient in one call: both reports follow.
      if (hooks.grads_final) {
        hooks.grads_final(s.b_off, s.b_off + size_t(s.out));
        hooks.grads_final(s.w_off, s.w_off + s.weights());
      }
      if (hooks.params_released) {
        hooks.params_released(s.w_off, s.w_off + s.weights());
        hooks.params_released(s.b_off, s.b_off + size_t(s.out));
      }
      cur = nxt;
      break;
    }
    case OpKind::pool: {
      PoolGeom g = op.pg;
      g.batch = batch;
      if (op.grad_use) be_.note_grad_use(grad_[nxt].data(), *op.grad_use);
      be_.pool_backward(d, op.max ? op.argmax.data() : nullptr, grad_[nxt].data(), g, op.max);
      cur = nxt;
      break;
    }
    case OpKind::gap:
      be_.global_avgpool_backward(d, grad_[nxt].data(), batch, int(op.in.h * op.in.w), int(op.in.c));
      cur = nxt;
      break;
    case OpKind::bn: {
      // Parameter gradients from this rank's sums; the input gradient from every rank's (sync_bn).
      const LayerSlice& s = slices_[size_t(op.param)];
      const int64_t rows = int64_t(batch) * op.in.h * op.in.w;
      const int c = int(op.in.c);
      const float* relu_out = op.act == Act::relu ? op.a.data() : nullptr;  // the fused ReLU's mask
      float* dw = grads_.data() + s.w_off;
      float* db = grads_.data() + s.b_off;
      const float* w = params_.data() + s.w_off;
      auto grads_final = [&] {
        if (!hooks.grads_final) return;
        hooks.grads_final(s.b_off, s.b_off + size_t(s.out));
        hooks.grads_final(s.w_off, s.w_off + s.weights());
      };
      // dy: the current buffer, or a residual block's kept output gradient (dy_from_); dx to d.
      const float* dy = dy_from_ ? dy_from_ : d;
      dy_from_ = nullptr;
      if (!first && op.grad_use) be_.note_grad_use(d, *op.grad_use);
      if (first || !bn_reduce_ || !trained_) {
        be_.bn_train_backward(dy, in, first ? nullptr : d, rows, c, op.sums.data(), op.mean.data(),
                              op.invstd.data(), w, relu_out, dw, db, accumulate);
        grads_final();
      } else {  // sync_bn: the input gradient from the sums over every rank's micro-batch
        be_.bn_backward_sums(dy, in, rows, c, op.mean.data(), op.sums.data(), relu_out);
        be_.bn_param_grads(op.sums.data(), op.invstd.data(), c, dw, db, accumulate);
        grads_final();
        bn_reduce_(op.sums.data(), 2 * size_t(c) + 1);
        be_.bn_backward(dy, in, d, rows, c, op.sums.data(), op.mean.data(), op.invstd.data(), w, relu_out);
      }
      if (hooks.params_released) {
        hooks.params_released(s.w_off, s.w_off + s.weights());
        hooks.params_released(s.b_off, s.b_off + size_t(s.out));
      }
      break;
    }
    case OpKind::res_end:
      // The fused ReLU's backward from its output (> 0 exactly where its input is), and the
      // output's gradient down both branches: kept (in the output's buffer, whose values are no
      // longer needed) for the body, which runs second. Where both branches start with a batch
      // norm, they read the kept gradient (dy_from_) and d is not written (keep_feeds).
      op.kept_only = op.keep_feeds && be_.residual_backward_keep(d, op.a.data(), op.a.data(), n, op.act == Act::relu);
      if (op.kept_only) {
        dy_from_ = op.a.data();
        break;
      }
      if (op.grad_use) be_.note_grad_use(d, *op.grad_use);
      be_.residual_backward(d, op.a.data(), op.a.data(), n, op.act == Act::relu);
      break;
    case OpKind::res_shortcut: {
      // d: the shortcut's input gradient (the block's input), kept; the body's turn. With an
      // identity shortcut d still is the output's gradient, the body's too: nothing to move
      // (res_begin adds the kept copy; dy_from_ still points the body's batch norm at it).
      Op& e = *ops_[size_t(op.end)];
      if (op.end != op.mid + 1) {  // a projection shortcut's ops between
        be_.copy(op.a.data(), d, size_t(batch) * size_t(op.out.size()) * sizeof(float));
        if (e.kept_only && ops_[size_t(op.mid) - 1]->kind == OpKind::bn) dy_from_ = e.a.data();
        else be_.copy(d, e.a.data(), size_t(batch) * size_t(e.out.size()) * sizeof(float));
      }
      break;
    }
    case OpKind::res_begin: {
      if (op.grad_use) be_.note_grad_use(d, *op.grad_use);
      be_.add(op.end == op.mid + 1 ? ops_[size_t(op.end)]->a.data() : ops_[size_t(op.mid)]->a.data(), d, n);
      break;
    }
    case OpKind::act:
      be_.act_backward(d, in, op.a.data(), n, op.act);
      break;
    case OpKind::flatten:
      if (!op.alias) {
        be_.nchw_to_nhwc(d, grad_[nxt].data(), batch, int(op.in.c), int(op.in.h * op.in.w));
        cur = nxt;
      }
      break;
    case OpKind::linear_run: {
      // d and grad_[nxt] are the run's scratch; its input gradient goes to the third buffer.
      float* dx = first ? nullptr : grad_[spare].data();
      cur = spare;
      if (!op.nhwc_c) {
        be_.mlp_backward(in, batch, op.run, d, grad_[nxt].data(), accumulate, hooks, dx);
        break;
      }
      // A reordered first layer (reorder_flatten_reads): its weight gradient is summed in dwp,
      // in NHWC order, added to over micro-batches as the arena's would be (a permutation of the
      // same sums), and written to the arena after each pass; the reports of its range wait
      // for that (and its release follows them, as everywhere).
      const LinearArgs& l = op.run[0];
      const size_t w0 = l.w_at, w1 = l.w_at + size_t(l.out) * size_t(l.in);
      auto outside = [w0, w1](const std::function<void(size_t, size_t)>& f) -> std::function<void(size_t, size_t)> {
        if (!f) return nullptr;
        return [f, w0, w1](size_t b, size_t e) {
          if (b >= w1 || e <= w0) f(b, e);
        };
      };
      be_.mlp_backward(in, batch, op.run, d, grad_[nxt].data(), accumulate,
                       {outside(hooks.grads_final), outside(hooks.params_released)}, dx);
      be_.nhwc_to_nchw(op.dwp.data(), grads_.data() + l.w_at, l.out, op.nhwc_c, op.nhwc_hw);
      if (hooks.grads_final) hooks.grads_final(w0, w1);
      if (hooks.params_released) hooks.params_released(w0, w1);
      break;
    }
    case OpKind::dropout:
      if (trained_ && op.p > 0) {
        DropoutArgs dr;
        dr.p = op.p;
        dr.seed = train_.seed;
        dr.layer = op.layer;
        dr.first = train_.first;
        dr.c = int(op.in.c), dr.h = int(op.in.h), dr.w = int(op.in.w);
        be_.dropout(d, d, batch, dr, train_.ctl);  // linear: the same mask on the gradient
      }
      break;
  }
}

}  // namespace dpt
