// The model: an MLP of Linear layers with one activation between them, its parameters and
// gradients each in one flat contiguous arena (Torch's getParameters() idea), forward and
// backward on a Backend. Layer i owns weight (out, in) then bias (out), in layer order, so the
// last layer's gradients sit at the end of the arena. Knows nothing of files or communication.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dpt/backend.hpp"

namespace dpt {

struct LayerSlice {
  int in = 0, out = 0;
  size_t w_off = 0;  // weight (out, in), row-major
  size_t b_off = 0;  // bias (out)
  size_t weights() const { return size_t(in) * size_t(out); }
};

// Where every layer's weight and bias sit in the parameter and gradient arenas (element
// offsets), and the arenas' size with any padding between them (zeros that nothing reads).
// piece_rows[i] > 0 asks the backward pass for layer i's weight gradient in pieces of that many
// rows (gradient buckets that start their reduction inside a layer). The gradient sync plans it
// (sync.hpp); a model without one is packed: layer by layer, weight then bias.
struct ArenaLayout {
  std::vector<size_t> w_off, b_off;
  std::vector<int> piece_rows;
  size_t total = 0;
};
ArenaLayout packed_layout(const std::vector<int>& widths);

// The parameter tensors of layer slices, as the layer-wise optimizers take them, in arena order:
// each weight (adapting) and each bias (1-D: no trust ratio, no weight decay), wherever the
// arena layout puts them.
std::vector<TensorSeg> param_tensors(const std::vector<LayerSlice>& layers);

// Parses "784,256,128,10"; throws InputError.
std::vector<int> parse_layers(const std::string& s);

class MLP {
 public:
  // An empty layout is packed_layout(layers).
  MLP(Backend& be, std::vector<int> layers, Act act, int max_batch, ArenaLayout layout = {});

  int num_layers() const { return int(slices_.size()); }
  const LayerSlice& layer(int i) const { return slices_[size_t(i)]; }
  const std::vector<LayerSlice>& layers() const { return slices_; }
  const std::vector<int>& widths() const { return widths_; }
  Act activation() const { return act_; }
  size_t num_params() const { return n_params_; }
  int max_batch() const { return max_batch_; }
  int in_dim() const { return widths_.front(); }
  int classes() const { return widths_.back(); }

  // An arena-layout host array in the packed order (weight then bias, layer by layer): the same
  // for every layout, so runs with different layouts compare element by element.
  std::vector<float> packed(const std::vector<float>& arena) const;

  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }

  // PyTorch nn.Linear's default init (weight and bias ~ U(−1/√in, 1/√in)), from a deterministic
  // generator seeded by `seed`; computed on the host, uploaded.
  void init_params(uint64_t seed);

  // x (batch, in_dim) -> logits (batch, classes), kept for backward.
  const float* forward(const float* x, int batch);
  // Loss and gradient of the logits from the last forward: adds Σ loss and #correct to stats[0..1];
  // the gradient is scaled by grad_scale (1 / samples the gradient is a mean over).
  void loss(const int32_t* labels, int batch, float grad_scale, float* stats, bool need_grad);
  // Backward from the last loss(); grads are overwritten (accumulate=false) or added to.
  // hooks report the progress (Backend::mlp_backward): gradients final, parameters released.
  void backward(const float* x, int batch, bool accumulate, const PassHooks& hooks = {});

 private:
  Backend& be_;
  std::vector<int> widths_;
  Act act_;
  int max_batch_;
  std::vector<LayerSlice> slices_;
  size_t n_params_ = 0;
  Buffer<float> params_, grads_;
  std::vector<Buffer<float>> z_, a_;  // per layer: pre- and post-activation (batch, out)
  Buffer<float> dbuf_[2];             // backward scratch (batch, max width)
  std::vector<LinearArgs> args_;      // the layers as the backend's mlp_forward/backward take them
};

}  // namespace dpt
