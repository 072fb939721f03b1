// The model as the user writes it in model.layers: the MLP shorthand ("784,256,10", parsed by
// parse_layers in nn.hpp) or a layer list ("conv(32,3,pad=1) relu maxpool(2) flatten linear(10)"),
// parsed, normalised, and checked against an input shape (shape inference) before anything is
// allocated. Pure host code: knows nothing of backends, files or communication.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dpt/backend.hpp"  // Act

namespace dpt {

enum class LayerKind { conv, maxpool, avgpool, act, flatten, linear, dropout };

// One entry of a layer list.
struct LayerSpec {
  LayerKind kind = LayerKind::linear;
  int out = 0;        // conv: output channels; linear: output features
  int k = 0;          // conv, maxpool, avgpool: kernel size (square)
  int stride = 1;     // conv (default 1), pools (default k)
  int pad = 0;        // conv: zero padding on every side
  Act act = Act::none;  // act
  double p = 0;         // dropout: probability of zeroing an element
  // The normalised text, every argument written: "conv(32,3,stride=1,pad=1)", "maxpool(2,stride=2)",
  // "relu", "flatten", "linear(10)", "dropout(0.25)". Parses back to the same spec.
  std::string text() const;
  bool has_params() const { return kind == LayerKind::conv || kind == LayerKind::linear; }
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

// A layer placed in the model: its input and output shapes and parameter counts.
struct PlannedLayer {
  LayerSpec spec;
  TensorShape in, out;
  int64_t weights = 0, biases = 0;  // parameter counts (conv: out·c·k·k and out; linear: out·in and out)
  std::string name;                 // "conv<i>" or "fc<i>" (checkpoint names); "" without parameters
};

struct ModelPlan {
  TensorShape input;
  std::vector<PlannedLayer> layers;
  int64_t params = 0;
  TensorShape output() const { return layers.empty() ? input : layers.back().out; }
  // The start-up printout: one line per layer with its output shape and parameter count.
  std::string describe() const;
};

// Shape inference. Throws InputError naming the layer, the shapes involved and what is wrong: a
// conv or pool on a flat input (after flatten, or a flat dataset without model.input_shape), a
// kernel larger than its (padded) input, linear on an image other than as the first layer, an
// output that is not flat or narrower than num_classes, no parameters, sizes past the limits.
// A first linear layer on an image input takes it flattened in NCHW order.
ModelPlan plan_model(const std::vector<LayerSpec>& layers, const TensorShape& input, int num_classes);

// The model's input shape: the dataset's per-sample shape (sample_shape: {D} or {C, H, W}),
// or model.input_shape (C, H, W; empty when not set), which must agree with it. `what` names
// the dataset in messages. Throws InputError.
TensorShape model_input_shape(const std::vector<int64_t>& sample_shape,
                              const std::vector<int>& input_shape, const std::string& what);

// "C,H,W" (model.input_shape) -> {C, H, W}; "" -> {}. Throws InputError.
std::vector<int> parse_input_shape(const std::string& text);

}  // namespace dpt
