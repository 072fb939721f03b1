// The model: a list of layers (layer_spec.hpp) — conv, pooling, activations, flatten, linear,
// dropout — whose parameters and gradients each live in one flat arena (Torch's getParameters()
// idea): every conv or linear layer owns a weight and a bias slice of both, where the arena
// layout (the gradient sync's bucket plan) puts them. Forward and backward run through the
// backend's primitives; runs of Linear layers go through Backend::mlp_forward/mlp_backward,
// which the CUDA backend fuses in bf16. The MLP widths form of model.layers is such a list
// (linear, activation, linear, ...), with the checkpoint names and arena order it always had.
// Inside, images are NHWC and conv weights (out, k, k, c); see backend.hpp. Knows nothing of
// files or communication.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/layer_spec.hpp"

namespace dpt {

// A conv, linear or batch-norm layer's place in the arenas. A weight row is `in` values: a
// linear layer's input features, or a conv layer's k·k·c patch ((kh, kw, c) order); `out` rows.
// Batch norm: in = 1, out = channels (its weight and bias, PyTorch's gamma and beta). A conv
// without bias keeps a bias slot of zeros that nothing updates (so every layer has the same
// arena shape for the gradient sync's layouts), and has none in checkpoints.
struct LayerSlice {
  int in = 0, out = 0;
  size_t w_off = 0;  // weight (out, in), row-major
  size_t b_off = 0;  // bias (out)
  bool conv = false;
  bool bn = false;
  bool has_bias = true;
  int c = 0, k = 0;  // conv: input channels and kernel size
  std::string name;  // the checkpoint's: "fc<i>", "conv<i>", "bn<i>", or a preset's torchvision prefix
  size_t weights() const { return size_t(in) * size_t(out); }
  // The checkpoint's (PyTorch's) weight shape: (out, in), (out, c, k, k) or (out) for bn.
  std::vector<int64_t> weight_shape() const;
};

// The weight of s in the checkpoint's order (conv: (out, c, k, k), PyTorch's) from the arena's
// ((out, k, k, c)), and back; a linear weight is copied as it is. n = s.weights() values each.
void weight_to_checkpoint(const LayerSlice& s, const float* arena_w, float* out);
void weight_from_checkpoint(const LayerSlice& s, const float* in, float* arena_w);

// A parameterised layer as the arena layout sees it: out rows of `in` values, plus out biases;
// row pieces (see ArenaLayout) only where the backward pass can report them (Linear layers).
struct ParamShape {
  int in = 0, out = 0;
  bool splittable = true;
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
ArenaLayout packed_layout(const std::vector<ParamShape>& layers);
ArenaLayout packed_layout(const std::vector<int>& widths);  // the MLP widths form's layers
std::vector<ParamShape> mlp_param_shapes(const std::vector<int>& widths);
std::vector<ParamShape> param_shapes(const ModelPlan& plan);  // its conv and linear layers

// The parameter tensors of layer slices, as the layer-wise optimizers take them, in arena order:
// each weight (adapting) and each bias (1-D: no trust ratio, no weight decay), wherever the
// arena layout puts them; batch norm's weight is 1-D too and adapts no more than a bias.
std::vector<TensorSeg> param_tensors(const std::vector<LayerSlice>& layers);

// Parses "784,256,128,10"; throws InputError.
std::vector<int> parse_layers(const std::string& s);

// What a training forward pass needs beyond its batch: dropout's mask key (DropoutArgs). An
// evaluation pass has none, and dropout is the identity.
struct TrainPass {
  const StepCtl* ctl = nullptr;  // backend memory: the step (ctl->step) the masks depend on
  int64_t first = 0;             // position of the batch's first sample in the global batch
  uint64_t seed = 0;             // train.seed
};

// A batch-norm layer's running statistics (backend memory, outside the arenas: they are not
// trained) and the count of training passes that moved them (PyTorch's num_batches_tracked).
struct BnState {
  std::string name;
  int c = 0;
  float* running_mean = nullptr;  // (c), starts at 0
  float* running_var = nullptr;   // (c), starts at 1
  int64_t* tracked = nullptr;     // host
};

// Adds a batch-norm layer's partial sums (n doubles, backend memory) over the ranks: with it,
// every training pass normalises with the statistics of every rank's micro-batch (sync_bn).
using BnReduce = std::function<void(double* sums, size_t n)>;

constexpr float kBnEps = 1e-5f, kBnMomentum = 0.1f;  // PyTorch's BatchNorm defaults

// Where a training step stands, for an observer that accounts for its time (bench-step
// --account): before the batch is loaded (data), before each op's forward and backward (op:
// its position in Model::op_costs), before the loss, before the optimizer, and at the end.
enum class StepPoint { data, forward, loss, backward, optimizer, end };
using StepProbe = std::function<void(StepPoint, int op)>;

// One op of the model, as an account of the step sees it at a batch: the multiply-adds × 2 of
// its convolution or GEMMs (flops), and the values of activations, gradients and parameters it
// reads and writes, each tensor once (the least any implementation of the op moves alone; a
// fused one moves less). Backward: the input gradient only where the op computes one.
struct OpCost {
  std::string kind;    // conv, linear, bn, pool, avgpool, relu, residual, layout, dropout
  std::string name;    // the layer's checkpoint name, or kind and list position
  std::string shape;   // what it computes, e.g. "3x3/2 64->128, 28x28 out"
  double fwd_flops = 0, bwd_flops = 0;
  double fwd_values = 0, bwd_values = 0;    // activations and their gradients
  double param_values = 0;                  // parameters (read forward; read and their gradient written backward)
  bool has_fwd = true, has_bwd = true;      // whether the pass runs anything
};

// Batch norms' ReLU outputs that only the next convolution or pooling reads (ResNet's blocks
// and stem), for the backward pass (device.recompute): kept (off), or dropped after that read and
// made again from the batch norm's input just before the backward pass needs them (on: one more
// affine pass over each, the same bits); automatic: on where they would hold 2^29 values or
// more at the model's max batch (1 GiB in bf16). resnet50 at batch 256 holds 998 Mi of them: on
// an H200 in bf16 its step holds 1.6 GiB less device memory and takes 2.8% longer
// (bench/results/2026-12-02-h200-activation-memory.md); resnet18(stem=small) at batch 512 on
// 28x28 images holds far fewer and keeps them.
enum class Recompute { off, on, automatic };
Recompute parse_recompute(const std::string& s);  // off | on | auto; throws InputError

class Model {
 public:
  // The MLP widths form: Linear layers between the widths, `act` between them. An empty layout
  // is packed_layout(widths).
  Model(Backend& be, std::vector<int> widths, Act act, int max_batch, ArenaLayout layout = {});
  // A layer list with its shapes (plan_model). An empty layout is packed.
  Model(Backend& be, ModelPlan plan, int max_batch, ArenaLayout layout = {}, Recompute recompute = Recompute::off);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // The parameterised layers (conv and linear), in list order.
  int num_layers() const { return int(slices_.size()); }
  const LayerSlice& layer(int i) const { return slices_[size_t(i)]; }
  std::vector<ParamShape> param_shapes() const;
  const ModelPlan& plan() const { return plan_; }
  // The MLP widths form: its widths (else empty) and activation.
  bool widths_form() const { return !widths_.empty(); }
  const std::vector<LayerSlice>& layers() const { return slices_; }
  // Whether a linear run reads a flattened image in NHWC order, its weight reordered per pass
  // (where the weight is no larger than the activation at the max batch; else the image is
  // transposed to flatten's NCHW order).
  bool reads_flatten_nhwc() const;
  const std::vector<int>& widths() const { return widths_; }
  Act activation() const { return act_; }
  size_t num_params() const { return n_params_; }
  int max_batch() const { return max_batch_; }
  int64_t in_dim() const { return plan_.input.size(); }   // input values per sample
  int classes() const { return int(plan_.output().c); }   // logits per sample

  // An arena-layout host array in the packed order (weight then bias, layer by layer): the same
  // for every layout, so runs with different layouts compare element by element.
  std::vector<float> packed(const std::vector<float>& arena) const;

  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }

  // Batch norm's running statistics, in list order (empty without bn).
  std::vector<BnState> bn_states();
  // n training passes ran without forward() being called (a replayed step graph): every bn
  // layer's num_batches_tracked moves by n, as forward() moves it by one.
  void count_bn_passes(int64_t n);
  // sync_bn: how the statistics are added over the ranks in training passes (empty: each rank's
  // micro-batch alone).
  void set_bn_reduce(BnReduce r) { bn_reduce_ = std::move(r); }

  // PyTorch's default init of nn.Linear and nn.Conv2d: weight and bias ~ U(−1/√fan_in,
  // 1/√fan_in), fan_in = in (linear) or c·k·k (conv), layer by layer, weight (in the
  // checkpoint's order) then bias, from a deterministic generator seeded by `seed`; computed on
  // the host, uploaded. Batch norm: weight 1, bias 0, running mean 0 and var 1. Presets:
  // torchvision's ResNet init, conv weights ~ N(0, 2/(out·k·k)) (Kaiming normal, fan_out).
  void init_params(uint64_t seed);
  // train.freeze (finetune.hpp): frozen[i] = layer slice i takes no update. The backward pass
  // then stops below the lowest op that still has a trainable parameter (nothing is computed
  // there, not even an input gradient; DPT_FROZEN_BACKWARD=full keeps every pass, a test's
  // oracle), and at its end reports the ranges of the layers it left out as final and released,
  // so that a gradient sync sees every bucket; their gradients are zeroed here once. Empty: every
  // gradient again. Returns how many layers' gradients are left out.
  int set_frozen(const std::vector<char>& frozen);

  // x (batch, in_dim) — images NCHW as the dataset stores them — to logits (batch, classes),
  // kept for backward. train: a training pass (dropout active); nullptr: evaluation.
  const float* forward(const float* x, int batch, const TrainPass* train = nullptr);
  // Loss and gradient of the logits from the last forward: adds Σ loss and #correct to stats[0..1];
  // the gradient is scaled by grad_scale (1 / samples the gradient is a mean over).
  // Training losses (smooth) use the label smoothing set; evaluation reports plain cross-entropy.
  void loss(const int32_t* labels, int batch, float grad_scale, float* stats, bool need_grad, bool smooth = true);
  void set_label_smoothing(float eps) { smoothing_ = eps; }
  // Backward from the last loss() through the last forward (x as given to it); grads are
  // overwritten (accumulate=false) or added to. hooks report the progress, last layer first: a
  // layer's gradients final (bias, then weight, in pieces where asked), then its parameters
  // released once its input gradient is enqueued (Backend::mlp_backward).
  void backward(const float* x, int batch, bool accumulate, const PassHooks& hooks = {});

  // The values (at the max batch) of the ReLU outputs the backward pass makes again (Recompute),
  // and how many ops they are.
  size_t remade_values() const;
  int remade_ops() const;

  // The step's observer (none: empty); the model calls it before each op and before the loss.
  void set_probe(StepProbe p) { probe_ = std::move(p); }
  // Its ops in forward order, at a batch (nn_account.cpp).
  std::vector<OpCost> op_costs(int batch) const;

 private:
  struct Op;
  void build(int max_batch, ArenaLayout layout);
  void build_ops();
  void link_blocks();
  void reorder_flatten_reads();
  std::vector<bool> bf16_read_outputs() const;
  void give_hints();
  void share_slots();
  void remake_output(size_t j, const float* x, int batch);
  size_t lowest_backward_op() const;  // the first op with parameters: backward stops there
  size_t grad_floor_ = 0;             // set_frozen: no op below this one runs backward
  std::vector<std::pair<size_t, size_t>> skipped_;  // arena ranges of the layers below it
  void backward_op(Op& op, const float* in, int batch, bool accumulate, const PassHooks& hooks, int& cur,
                   bool want_dx);

  Backend& be_;
  std::vector<int> widths_;  // the MLP widths form, else empty
  Act act_ = Act::none;
  ModelPlan plan_;
  int max_batch_;
  std::vector<LayerSlice> slices_;
  std::vector<int> piece_rows_;
  size_t n_params_ = 0;
  Buffer<float> params_, grads_;
  std::vector<std::unique_ptr<Op>> ops_;
  // Backward: gradients between ops (batch, largest tensor). Two take turns; a linear run takes
  // the third too (its input gradient apart from its own two).
  Buffer<float> grad_[3];
  // Tensors that ops take turns in (share_slots): batch norms' ReLU outputs that only the next
  // convolution or pooling reads, made again before the backward pass reads them (relu_slot_,
  // one per form the backend may keep them in: bf16_read_outputs; with recompute_), and
  // projection shortcuts' kept input gradients (keep_slot_). slot_holds_: whose output a relu
  // slot holds now.
  Recompute recompute_ = Recompute::off;
  Buffer<float> relu_slot_[2], keep_slot_;
  int slot_holds_[2] = {-1, -1};
  // Backward: where the next batch norm takes its dy from instead of the current gradient buffer
  // (a residual block's kept output gradient, Op::keep_feeds); it writes its dx to that buffer.
  const float* dy_from_ = nullptr;
  const float* logits_ = nullptr;
  Buffer<float> nobias_db_;  // the bias gradient of convs without bias: computed, never used
  BnReduce bn_reduce_;
  float smoothing_ = 0.f;
  TrainPass train_;        // the last forward's (dropout's backward applies the same mask)
  bool trained_ = false;   // the last forward was a training pass
  StepProbe probe_;
};

// The model's former name, when it was an MLP only.
using MLP = Model;

}  // namespace dpt
