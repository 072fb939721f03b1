// The model as the user writes it in model.layers: the MLP shorthand ("784,256,10", parsed by
// parse_layers in nn.hpp) or a layer list ("conv(32,3,pad=1) relu maxpool(2) flatten linear(10)"),
// with batch norm, residual blocks ("res(body | shortcut)") and presets ("resnet18(stem=small)"),
// parsed, normalised, and checked against an input shape (shape inference) before anything is
// allocated. Pure host code: knows nothing of backends, files or communication.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dpt/backend.hpp"  // Act

namespace dpt {

// res_begin, res_shortcut and res_end exist only in a ModelPlan: a residual block planned as
// res_begin, its body's layers, res_shortcut, its shortcut's layers (none: the identity), res_end
// (the sum of the two branches).
enum class LayerKind { conv, maxpool, avgpool, act, flatten, linear, dropout, bn, res, preset,
                       res_begin, res_shortcut, res_end };

// One entry of a layer list.
struct LayerSpec {
  LayerKind kind = LayerKind::linear;
  int out = 0;        // conv: output channels; linear: output features
  int k = 0;          // conv, maxpool, avgpool: kernel size (square)
  int stride = 1;     // conv (default 1), pools (default k)
  int pad = 0;        // conv: zero padding on every side; maxpool: -inf padding, avgpool: zeros
                      // (counted in the mean, PyTorch's count_include_pad)
  bool bias = true;   // conv: with a bias (bias=false: none)
  bool global = false;  // avgpool(global): the mean of each channel (adaptive average to 1x1)
  Act act = Act::none;  // act
  double p = 0;         // dropout: probability of zeroing an element
  std::vector<LayerSpec> body, shortcut;  // res: the two branches (shortcut empty: identity)
  std::string preset;   // preset: "resnet18", "resnet34", "resnet50"
  bool small_stem = false;  // preset: stem=small (3x3 stride-1 conv without bias, no max pool)
  int classes = 0;      // preset: the classifier's width (0: the data's num_classes)
  std::string name;     // a preset's layer: its torchvision state_dict prefix ("layer1.0.conv1")
  // The normalised text, every argument written: "conv(32,3,stride=1,pad=1)", "maxpool(2,stride=2)",
  // "relu", "flatten", "linear(10)", "dropout(0.25)", "bn", "res(<body> | <shortcut>)",
  // "resnet18(stem=small,classes=10)"; bias=false and a pool's pad only where they are set.
  // Parses back to the same spec.
  std::string text() const;
  // Owns parameters (weight and bias slices of the arena): conv, linear, bn.
  bool has_params() const {
    return kind == LayerKind::conv || kind == LayerKind::linear || kind == LayerKind::bn;
  }
  bool operator==(const LayerSpec& o) const;
};

// Limits of a layer list (beyond them: InputError).
constexpr size_t kMaxLayerListChars = 65536;
constexpr size_t kMaxListLayers = 1024;

// True when model.layers holds a layer list (any letter), false for the MLP shorthand.
bool is_layer_list(const std::string& text);
// Parses a layer list; throws InputError naming the layer (position and text) and what is wrong.
std::vector<LayerSpec> parse_layer_list(const std::string& text);
// The normalised list: the layers' text() joined by single spaces.
std::string layer_list_text(const std::vector<LayerSpec>& layers);
// A preset ("resnet18", ...) as the layer list it stands for, torchvision's architecture with
// its layer names; classes > 0. Throws InputError for an unknown preset.
std::vector<LayerSpec> expand_preset(const LayerSpec& preset);
// The MLP shorthand (widths, input first) as a layer list: linear(w1) act ... linear(wn), the
// activation between Linear layers and none after the last. The input is flat, widths[0] wide.
std::vector<LayerSpec> mlp_layer_list(const std::vector<int>& widths, Act act);

// The shape of one sample's tensor: an image (c, h, w) stored NCHW, or flat (c features,
// h = w = 1).
struct TensorShape {
  int64_t c = 0, h = 1, w = 1;
  bool flat = true;
  static TensorShape features(int64_t n) { return {n, 1, 1, true}; }
  static TensorShape image(int64_t c, int64_t h, int64_t w) { return {c, h, w, false}; }
  int64_t size() const { return c * h * w; }
  std::string str() const;  // "32x28x28" or "784"
  bool operator==(const TensorShape& o) const {
    return c == o.c && h == o.h && w == o.w && flat == o.flat;
  }
};

// A layer placed in the model: its input and output shapes and parameter counts. A residual
// block's body and shortcut are spec.body and spec.shortcut of its res_begin; the plan lists
// their layers after it (see LayerKind).
struct PlannedLayer {
  LayerSpec spec;
  TensorShape in, out;
  // Parameter counts: conv out·c·k·k and out (0 without bias); linear out·in and out; bn c and c.
  int64_t weights = 0, biases = 0;
  // The checkpoint's name: "conv<i>", "fc<i>", "bn<i>" (i counting that kind in list order), or
  // a preset's torchvision prefix ("layer1.0.bn1", "fc"); "" without parameters.
  std::string name;
  int depth = 0;  // residual blocks around it
};

struct ModelPlan {
  TensorShape input;
  std::vector<PlannedLayer> layers;
  int64_t params = 0;
  // The normalised list as written (presets kept, their classes set): the checkpoint's `model`.
  std::string text;
  bool preset = false;  // a preset: checkpoints use torchvision's state_dict names
  bool has_bn() const;
  TensorShape output() const { return layers.empty() ? input : layers.back().out; }
  // The start-up printout: one line per layer with its output shape and parameter count.
  std::string describe() const;
};

// Shape inference. Throws InputError naming the layer, the shapes involved and what is wrong: a
// conv or pool on a flat input (after flatten, or a flat dataset without model.input_shape), a
// kernel larger than its (padded) input, linear on an image other than as the first layer, an
// output that is not flat or narrower than num_classes, no parameters, sizes past the limits.
// A first linear layer on an image input takes it flattened in NCHW order. Also: bn before any
// layer, a residual block whose branches end in different shapes (a block that changes shape
// needs a projection shortcut), a preset with more layers around it. Presets are expanded
// (num_classes fills their classes where not given).
ModelPlan plan_model(const std::vector<LayerSpec>& layers, const TensorShape& input, int num_classes);

// The model's input shape: the dataset's per-sample shape (sample_shape: {D} or {C, H, W}),
// or model.input_shape (C, H, W; empty when not set), which must agree with it. `what` names
// the dataset in messages. Throws InputError.
TensorShape model_input_shape(const std::vector<int64_t>& sample_shape,
                              const std::vector<int>& input_shape, const std::string& what);

// "C,H,W" (model.input_shape) -> {C, H, W}; "" -> {}. Throws InputError.
std::vector<int> parse_input_shape(const std::string& text);

}  // namespace dpt
