#include "dpt/nn.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "dpt/check.hpp"
#include "dpt/data.hpp"

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

std::vector<TensorSeg> param_tensors(const std::vector<LayerSlice>& layers) {
  std::vector<TensorSeg> t;
  for (const LayerSlice& l : layers) {  // from each slice's own offsets: weight and bias may lie apart
    t.push_back({l.w_off, l.w_off + size_t(l.in) * size_t(l.out), true});
    t.push_back({l.b_off, l.b_off + size_t(l.out), false});
  }
  std::sort(t.begin(), t.end(), [](const TensorSeg& a, const TensorSeg& b) { return a.begin < b.begin; });
  return t;
}

ArenaLayout packed_layout(const std::vector<int>& widths) {
  ArenaLayout l;
  size_t off = 0;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    l.w_off.push_back(off);
    off += size_t(widths[i]) * size_t(widths[i + 1]);
    l.b_off.push_back(off);
    off += size_t(widths[i + 1]);
    l.piece_rows.push_back(0);
  }
  l.total = off;
  return l;
}

MLP::MLP(Backend& be, std::vector<int> layers, Act act, int max_batch, ArenaLayout layout)
    : be_(be), widths_(std::move(layers)), act_(act), max_batch_(max_batch) {
  if (layout.w_off.empty()) layout = packed_layout(widths_);
  const size_t L = widths_.size() - 1;
  if (layout.w_off.size() != L || layout.b_off.size() != L || layout.piece_rows.size() != L)
    throw Error("MLP: the arena layout has " + std::to_string(layout.w_off.size()) + " layers, the model " +
                std::to_string(L));
  int widest = 0;
  for (size_t i = 0; i < L; ++i) {
    LayerSlice s;
    s.in = widths_[i];
    s.out = widths_[i + 1];
    s.w_off = layout.w_off[i];
    s.b_off = layout.b_off[i];
    if (s.w_off + s.weights() > layout.total || s.b_off + size_t(s.out) > layout.total)
      throw Error("MLP: layer " + std::to_string(i) + " lies outside the arena layout");
    slices_.push_back(s);
    widest = std::max({widest, s.in, s.out});
  }
  n_params_ = layout.total;
  params_ = Buffer<float>(be, n_params_);
  be.register_parameters(params_.data(), n_params_);
  be.fill(params_.data(), n_params_, 0.f);  // padding stays zero
  grads_ = Buffer<float>(be, n_params_);
  be.fill(grads_.data(), n_params_, 0.f);
  for (size_t i = 0; i < L; ++i) {
    const LayerSlice& s = slices_[i];
    const bool last = i + 1 == L;
    z_.emplace_back(be, size_t(max_batch) * size_t(s.out));
    // The last layer has no activation: its a is its z.
    a_.emplace_back(last ? Buffer<float>() : Buffer<float>(be, size_t(max_batch) * size_t(s.out)));
    LinearArgs l;
    l.w = params_.data() + s.w_off;
    l.b = params_.data() + s.b_off;
    l.dw = grads_.data() + s.w_off;
    l.db = grads_.data() + s.b_off;
    l.z = z_.back().data();
    l.a = last ? l.z : a_.back().data();
    l.in = s.in;
    l.out = s.out;
    l.act = last ? Act::none : act_;
    l.w_at = s.w_off;
    l.b_at = s.b_off;
    l.piece_rows = layout.piece_rows[i];
    args_.push_back(l);
  }
  for (auto& d : dbuf_) d = Buffer<float>(be, size_t(max_batch) * size_t(widest));
}

std::vector<float> MLP::packed(const std::vector<float>& arena) const {
  std::vector<float> out;
  for (const LayerSlice& s : slices_) {
    out.insert(out.end(), arena.begin() + long(s.w_off), arena.begin() + long(s.w_off + s.weights()));
    out.insert(out.end(), arena.begin() + long(s.b_off), arena.begin() + long(s.b_off + size_t(s.out)));
  }
  return out;
}

void MLP::init_params(uint64_t seed) {
  // nn.Linear.reset_parameters: kaiming_uniform_(a=√5) gives U(−1/√in, 1/√in) for the weight,
  // and the bias uses the same bound.
  std::vector<float> host(n_params_);
  SplitMix64 rng(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull);
  // Weight then bias of each layer from one stream, as when they were packed in the arena.
  for (auto& s : slices_) {
    const double bound = 1.0 / std::sqrt(double(s.in));
    for (size_t i = 0; i < s.weights(); ++i) host[s.w_off + i] = float((2.0 * rng.uniform() - 1.0) * bound);
    for (size_t i = 0; i < size_t(s.out); ++i) host[s.b_off + i] = float((2.0 * rng.uniform() - 1.0) * bound);
  }
  be_.upload(params_.data(), host.data(), n_params_ * sizeof(float));
}

const float* MLP::forward(const float* x, int batch) {
  if (batch > max_batch_) throw Error("batch " + std::to_string(batch) + " exceeds the model's max batch");
  be_.mlp_forward(x, batch, args_);
  return z_.back().data();
}

void MLP::loss(const int32_t* labels, int batch, float grad_scale, float* stats, bool need_grad) {
  be_.softmax_xent(z_.back().data(), labels, batch, classes(), grad_scale,
                   need_grad ? dbuf_[0].data() : nullptr, stats);
}

void MLP::backward(const float* x, int batch, bool accumulate, const PassHooks& hooks) {
  // dbuf_[0] holds dLoss/dlogits from loss().
  be_.mlp_backward(x, batch, args_, dbuf_[0].data(), dbuf_[1].data(), accumulate, hooks);
}

}  // namespace dpt
