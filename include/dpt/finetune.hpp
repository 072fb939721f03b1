// Starting from trained weights and fine-tuning them: model.init's tensors matched to a model by
// name and shape (the head re-initialised where only its shape differs, model.init_skip left
// out), and train.freeze / train.body_lr_scale as marks on the optimizer's tensors. Knows the
// model's layers and PyTorch's key names; not how the optimizer or the training loop work.
#pragma once
#include <string>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/config.hpp"
#include "dpt/nn.hpp"
#include "dpt/weights.hpp"

namespace dpt {

// The model's state on the host, as the loader reads and fills it: the parameter arena
// (params, its layout), every batch norm's running mean then running variance (bn_stats, in
// bn_states() order) and num_batches_tracked (bn_tracked).
struct HostModelState {
  std::vector<float> params;
  std::vector<float> bn_stats;
  std::vector<int64_t> bn_tracked;
};

// Overlays w's tensors on s (the model's seeded state) by PyTorch key and shape: conv weights
// from PyTorch's (out, in, K, K) into the arena's order, batch norm's running statistics and
// counts too. The head (head_layer) is left seeded where only its shape differs (another
// number of classes); tensors under a model.init_skip prefix (skip, comma-separated) are left
// seeded. Throws InputError naming, with both shapes, every tensor missing from the file, of
// another shape, or in the file but not in the model. Returns the lines start-up prints.
std::vector<std::string> load_init_weights(Model& m, const Weights& w, const std::string& file,
                                           const std::string& skip, HostModelState& s);

// The head: the last layer with parameters (a preset's fc, a layer list's last linear).
int head_layer(const Model& m);

// The model's parameter tensors in arena order (param_tensors) marked for fine-tuning:
// frozen — in train.freeze's set (body: all but the head; else name prefixes, matched at a dot:
// layer1 covers layer1.0.conv1.weight), batch norm's weight and bias kept out of it with
// train.train_bn; body — every tensor but the head's, where train.body_lr_scale != 1. Throws
// InputError for a prefix that names no tensor.
struct FineTunePlan {
  std::vector<TensorSeg> tensors;   // for the Optimizer
  std::vector<std::string> frozen;  // the frozen tensors' keys
  std::vector<char> frozen_layers;  // per layer slice: weight and bias both frozen (Model::set_frozen)
};
FineTunePlan fine_tune_plan(const Model& m, const Config& cfg);

}  // namespace dpt
