// Compute backends: `cpu` (OpenBLAS cblas + loops) and `cuda` (cuBLAS/cuBLASLt + kernels).
// A backend owns its memory, streams and library handles; every op works on buffers it
// allocated. Ops may run asynchronously (cuda: on the backend's compute stream); copy_to_host
// and synchronize() are the only points where the host waits. Knows nothing of communication
// or files.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dpt {

struct Dataset;

enum class Act { none, relu, tanh, sigmoid, gelu };
enum class Precision { fp32, tf32, bf16 };
enum class OptKind { sgd, momentum, nesterov, adam, adamw, lars, lamb };

Act parse_act(const std::string& s);
const char* act_name(Act a);
Precision parse_precision(const std::string& s);
OptKind parse_optimizer(const std::string& s);

// One Linear layer of an MLP, pointers into backend memory: weight (out,in), bias (out), their
// gradients, and the layer's pre- and post-activation buffers (max_batch, out), a == z for none.
// w_at and b_at are the weight's and the bias's element offsets in the parameter (and gradient)
// arena, for the progress reports of PassHooks. piece_rows > 0 asks for the weight gradient in
// pieces of that many rows (the last may be shorter), each reported final on its own.
struct LinearArgs {
  const float* w = nullptr;
  const float* b = nullptr;
  float* dw = nullptr;
  float* db = nullptr;
  float* z = nullptr;
  float* a = nullptr;
  int in = 0, out = 0;
  Act act = Act::none;
  size_t w_at = 0, b_at = 0;
  int piece_rows = 0;
};

// Progress of a backward pass, reported while the backend enqueues it, in the order of the
// backend's main lane (a report means: the work that makes it true is enqueued before anything
// enqueued after the call). Ranges are element offsets [begin, end) in the arenas.
struct PassHooks {
  // These gradients are final for the step: their reduction may start.
  std::function<void(size_t begin, size_t end)> grads_final;
  // The pass no longer reads these parameters: their update may run.
  std::function<void(size_t begin, size_t end)> params_released;
};

// ---- convolutional layers ----
// Image activations are NHWC inside the backends: (batch, h, w, c) row-major, so that a
// convolution is one GEMM over all output pixels. A conv weight is held (out, k, k, c): row o
// lines up with a row of im2col's columns, (kh, kw, c) in that order, and the convolution is
// im2col followed by the Linear layer's GEMMs on (batch·oh·ow) rows. Checkpoints keep PyTorch's
// (out, c, k, k); the model converts at that boundary.
struct ConvGeom {
  int batch = 0, c = 0, h = 0, w = 0;      // input (batch, h, w, c)
  int out = 0, k = 1, stride = 1, pad = 0;  // output channels, square kernel, zero padding
  int oh() const { return (h + 2 * pad - k) / stride + 1; }
  int ow() const { return (w + 2 * pad - k) / stride + 1; }
  int rows() const { return batch * oh() * ow(); }  // output pixels: the GEMMs' rows
  int cols() const { return k * k * c; }            // the weight's row: (kh, kw, c)
  std::string text() const;  // "CxHxW -> out, kK sS pP, batch B", for messages
};
// Pooling, output size rounded down (PyTorch's ceil_mode = False). pad > 0: max pooling pads
// with −inf, average pooling with zeros counted in the mean (PyTorch's count_include_pad).
struct PoolGeom {
  int batch = 0, c = 0, h = 0, w = 0, k = 1, stride = 1;  // input (batch, h, w, c)
  int pad = 0;
  int oh() const { return (h + 2 * pad - k) / stride + 1; }
  int ow() const { return (w + 2 * pad - k) / stride + 1; }
};

// What a backend without batch norm, residual blocks, padded or global pooling says when a
// model needs them (the Backend defaults below throw it as an InputError).
inline constexpr const char* kNeedsResnetOps =
    "this backend has no batch norm, residual blocks, padded or global pooling";
// Inverted dropout of one micro-batch. Sample i's element e (its index in the sample's NCHW
// order) is kept when dropout_keep(dropout_key(seed, layer, step, first + i), e, threshold)
// (dropout.hpp), step being ctl->step, read where the op runs: the mask depends on nothing else,
// so not on the rank count, the micro-batch split or a resume. Kept elements are scaled by
// float(1 / (1 − p)).
struct DropoutArgs {
  double p = 0;
  uint64_t seed = 0;
  int layer = 0;        // the layer's position in the model's list (distinct masks per layer)
  int64_t first = 0;    // position of this micro-batch's first sample in the global batch
  int c = 0, h = 1, w = 1;  // a sample's shape; an image is stored NHWC
};

// Hyper-parameters of one optimizer step, torch.optim semantics.
struct OptimStep;
// Adam's per-step scalars as torch.optim forms them: in double from the Python floats, then
// rounded to float (step_size = lr / (1 − β1^t), bc2_sqrt = sqrt(1 − β2^t), 1 − β1, 1 − β2).
struct AdamScalars {
  float one_minus_b1, one_minus_b2, step_size, bc2_sqrt;
};
AdamScalars adam_scalars(double lr, double beta1, double beta2, int64_t t);
struct OptimStep {
  OptKind kind = OptKind::sgd;
  float lr = 0.01f;
  float momentum = 0.f;      // sgd family, lars
  float weight_decay = 0.f;  // L2 added to the gradient (sgd*, adam, lars); decoupled (adamw); in u (lamb)
  // Adam's betas in double, as torch holds them (Python floats): 1 − β and the bias corrections
  // are formed in double and rounded to float once, as torch.optim does.
  double beta1 = 0.9, beta2 = 0.999;
  float eps = 1e-8f;
  int64_t t = 1;  // 1-based step count (Adam bias correction)
  // LARS and LAMB: trust ratio r = trust_coefficient × ‖w‖ / ‖d‖ per tensor (README gives d),
  // clipped to at most trust_clip when trust_clip > 0.
  float trust_coefficient = 0.001f;
  float trust_clip = 0.f;
};

// One parameter tensor of the flat arena as the layer-wise optimizers (LARS, LAMB) see it:
// arena elements [begin, end). adapt: the tensor takes the trust ratio and weight decay (a
// weight matrix or kernel); biases and other 1-D tensors take neither.
struct TensorSeg {
  size_t begin = 0, end = 0;
  bool adapt = true;
  // Fine-tuning (finetune.hpp): in train.freeze's set (no update while the optimizer holds it
  // frozen); in the body (every tensor but the head: its learning rate train.body_lr_scale ×).
  bool frozen = false;
  bool body = false;
};

// The state one training step reads and advances on the device, so a whole step can be
// replayed (a CUDA graph) with no host work in between: where its batch starts in the epoch
// order, which learning rate it uses, Adam's step count, and the non-finite verdict.
struct StepCtl {
  int64_t cursor = 0;     // position in the epoch order of this step's global batch
  int64_t step = 0;       // steps taken (indexes the learning-rate table)
  int64_t updates = 0;    // updates applied (Adam's t − 1); a skipped step applies none
  int32_t bad = 0;        // this step's gradients hold NaN/Inf (sticky when the policy is stop)
  int32_t skipped = 0;    // steps whose update was skipped
  int64_t first_bad = -1; // the first step (1-based) whose gradients held NaN/Inf
};

// Points on a backend's timeline (Backend::time_marks).
class TimeMarks {
 public:
  virtual ~TimeMarks() = default;
  virtual void mark() = 0;
  virtual std::vector<double> seconds() = 0;  // waits; each mark's time since the first
};

// The measured limits of a backend (Backend::measure_ceilings).
struct Ceilings {
  double gemm_flops = 0;   // per second, in the GEMM's operand type
  double mem_bytes = 0;    // per second, read + written
  std::string gemm_what, mem_what;  // what was timed
};

// Backend::device_memory: bytes allocated now and at the peak (0 where the backend does not
// count); of them (lazy) the bytes of alloc_lazy's allocations, which hold memory only where
// touched; and (in_use) the device's memory in use by every process as its driver reports it
// (0 where there is none).
struct DeviceMemory {
  size_t now = 0, peak = 0, lazy = 0, in_use = 0;
  // Of now, by what holds it (the CUDA backend): buffers the model and trainer allocated
  // (lazy included), bf16 copies of activations and gradients, the parameters' bf16 shadows,
  // scratch in use, scratch outgrown and retired (kept for queued work and captured graphs).
  size_t buffers = 0, copies = 0, shadows = 0, scratch = 0, retired = 0;
};

// One step of work, run once per call. A backend that can records it into a graph on an early
// call and replays it after (cuda); otherwise every call runs it.
class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual void run() = 0;
  virtual bool captured() const { return false; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;      // "cpu" | "cuda"
  virtual std::string describe() const = 0;  // device, library versions, math mode
  virtual bool host_addressable() const = 0; // buffers readable by the host directly

  // ---- memory ----
  virtual void* alloc_bytes(size_t bytes) = 0;
  // Memory that holds pages only where it is first written or read (the cuda backend's: managed
  // memory kept on the device), for tensors the backend may never write in floats (activations
  // and gradients kept in bf16 only); else alloc_bytes. Freed by free_bytes.
  virtual void* alloc_lazy(size_t bytes) { return alloc_bytes(bytes); }
  virtual void free_bytes(void* p) noexcept = 0;
  // host -> backend; the host buffer may be reused as soon as the call returns.
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  // backend -> host; returns when the data is on the host (waits for pending work).
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  // Host memory that download() will fill again and again (a checkpoint's staging arenas): the
  // cuda backend page-locks it, so the copies run at the link's speed; false where it did not
  // (then it stays pageable, and download still works). unpin_host before the memory is freed.
  virtual bool pin_host(void* p, size_t bytes) { (void)p; (void)bytes; return false; }
  virtual void unpin_host(void* p) noexcept { (void)p; }
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill(float* p, size_t n, float v) = 0;
  virtual void scale(float* p, size_t n, float a) = 0;
  virtual void synchronize() = 0;

  // The flat parameter arena (n floats), told once: a backend may keep derived copies of it
  // (the cuda backend's bf16 weights), refreshed whenever it sees the arena written.
  virtual void register_parameters(float* p, size_t n) { (void)p; (void)n; }

  // ---- the MLP ----
  // z = x·Wᵀ + b; a = act(z). x (batch,in), w (out,in), b (out), z and a (batch,out).
  // With act == none, a may equal z.
  virtual void linear_forward(const float* x, const float* w, const float* b, float* z, float* a,
                              int batch, int in, int out, Act act) = 0;
  // da (batch,out) holds dLoss/da on entry and is overwritten with dz = da·act'(z).
  // dw (out,in) = dzᵀ·x and db (out) = Σ_rows dz, added to what is there when accumulate;
  // dx (batch,in) = dz·w unless dx is nullptr (first layer).
  virtual void linear_backward(const float* x, const float* w, const float* z, const float* a,
                               float* da, int batch, int in, int out, Act act, float* dw,
                               float* db, float* dx, bool accumulate) = 0;
  // ---- the whole MLP (MLP::forward / MLP::backward) ----
  // Layers in order; hidden layers share one activation, the last has none (its a is its z).
  // Default: linear_forward / linear_backward per layer. A backend may fuse across layers (cuda:
  // cuBLASLt's ReLU epilogues) and keep hidden activations in its own memory; then z and a of the
  // hidden layers are not written, and mlp_backward must follow an mlp_forward of the same
  // layers at the same batch. The logits, layers.back().z, are always written.
  virtual void mlp_forward(const float* x, int batch, const std::vector<LinearArgs>& layers);
  // Backward from dLoss/dlogits in d0 (batch, classes), with d0 and d1 (batch, widest) as
  // scratch; dw and db of every layer overwritten (accumulate=false) or added to. Layer by layer
  // from the last: its bias and weight gradients (reported final, the weight's in pieces when
  // asked), then its input gradient (its parameters then reported released). dx0 (batch,
  // layers[0].in), when set and neither d0 nor d1, receives the first layer's input gradient (a
  // run of Linear layers inside a larger model); otherwise the first layer computes none.
  virtual void mlp_backward(const float* x, int batch, const std::vector<LinearArgs>& layers,
                            float* d0, float* d1, bool accumulate, const PassHooks& hooks,
                            float* dx0 = nullptr);

  // ---- convolutional networks (NHWC, see ConvGeom) ----
  // cols (g.rows(), g.cols()) = the input patches of every output pixel, row (n, oh, ow),
  // column (kh, kw, c); zero where the patch reaches into the padding.
  virtual void im2col(const float* x, const ConvGeom& g, float* cols) = 0;
  // dx (batch, h, w, c) = for every input element, the sum of the entries of dcols that im2col
  // copied it to (overwritten, not added to).
  virtual void col2im(const float* dcols, const ConvGeom& g, float* dx) = 0;
  // z (rows, out) = im2col(x)·Wᵀ + b and a = act(z), w (out, k, k, c), b nullptr for a conv
  // without bias (linear_forward takes a nullptr b the same way); cols (rows, cols) is
  // kept for conv_backward (a backend may keep it in its own form, or need none: conv_cols).
  // With a ReLU (a != z) a backend may leave z unwritten and take the ReLU's mask from a in
  // conv_backward (a > 0 exactly where z > 0): the CUDA backend's cuDNN path under bf16 does.
  // Default: im2col + linear_forward.
  virtual void conv_forward(const float* x, const float* w, const float* b, float* cols, float* z,
                            float* a, const ConvGeom& g, Act act);
  // The elements of the cols buffer conv_forward and conv_backward need for g (its largest
  // batch): rows·cols for the im2col path, 0 where the backend convolves without it (a 1x1
  // stride-1 convolution, a GEMM on the input's pixels; cuda: cuDNN, chosen per shape); then
  // they are given cols = nullptr. Called once per layer as a model is built, never inside a
  // captured step. input_grad: whether conv_backward will compute the input gradient (not for
  // the model's first layer with parameters).
  virtual size_t conv_cols(const ConvGeom& g, bool input_grad = true);
  // da (rows, out) holds dLoss/da and becomes dz (not under bf16 on the CUDA backend's cuDNN
  // path, where dz is made in bf16 for the GEMMs and da's floats are left as they are); dw, db as
  // linear_backward's (added to when
  // accumulate); dx (batch, h, w, c) unless nullptr. x is the last conv_forward's input, cols
  // its cols, which is overwritten (it holds the input gradient's columns before col2im).
  // Default: linear_backward on cols + col2im.
  virtual void conv_backward(const float* x, const float* w, const float* z, const float* a, float* da, float* cols,
                             const ConvGeom& g, Act act, float* dw, float* db, float* dx,
                             bool accumulate);
  // y (batch, oh, ow, c) = max or mean of each k×k window (padded by g.pad). Max: argmax (same
  // shape, a byte each: k ≤ 15) = the window index kh·k + kw of the first maximum in row-major
  // order among the taps inside the input (a NaN wins), as PyTorch; argmax is nullptr for avg.
  virtual void pool_forward(const float* x, float* y, uint8_t* argmax, const PoolGeom& g,
                            bool max) = 0;
  // dx (batch, h, w, c) overwritten: max — dy goes to each window's argmax; avg — dy / k² to
  // every element of the window (summed where windows overlap).
  virtual void pool_backward(const float* dy, const uint8_t* argmax, float* dx, const PoolGeom& g,
                             bool max) = 0;
  // a = act(z) elementwise over n values; a may equal z.
  virtual void act_forward(const float* z, float* a, size_t n, Act act) = 0;
  // da (n) becomes dz = da·act'(z), from z and a = act(z) as linear_backward.
  virtual void act_backward(float* da, const float* z, const float* a, size_t n, Act act) = 0;
  // Per sample, dst (c, hw) = src (hw, c)ᵀ: NHWC to flatten's NCHW order, and back.
  virtual void nhwc_to_nchw(const float* src, float* dst, int batch, int c, int hw) = 0;
  virtual void nchw_to_nhwc(const float* src, float* dst, int batch, int c, int hw) = 0;
  // A Linear layer that reads a flattened image in the backend's NHWC order, its weight held in
  // flatten's NCHW order (the checkpoint's, PyTorch's): wp (rows, hw, c) = w (rows, c, hw) per
  // row, made from what the layer's GEMMs read (the CUDA backend under bf16: the weight shadow,
  // into wp's bf16 twin, current where the fp32 master is not, as with the sharded optimizer).
  // Its gradient goes back with nhwc_to_nchw. Default: nchw_to_nhwc(w, wp, rows, c, hw).
  virtual void weight_to_nhwc(const float* w, float* wp, int rows, int c, int hw);
  // y = x·mask·float(1/(1−p)) for a micro-batch (batch samples, DropoutArgs), step = ctl->step
  // (ctl in backend memory; nullptr: step 0). The backward pass applies the same op to dy.
  // y may equal x.
  virtual void dropout(const float* x, float* y, int batch, const DropoutArgs& d,
                       const StepCtl* ctl) = 0;
  // Training-time augmentation of a batch of NCHW images x (batch, c, h, w) into y (not x):
  // sample i takes the draw draws[ctl->cursor + offset + i] (draws and ctl in backend memory;
  // ctl nullptr: draws[offset + i]), packed by augment.hpp: a crop window of the image padded
  // by `pad` zeros on every side, then a horizontal flip.
  virtual void augment(const float* x, float* y, int batch, int c, int h, int w, int pad,
                       const int32_t* draws, const StepCtl* ctl, int64_t offset) = 0;
  // Resized crops (augment.hpp's ImageTransform) of a batch of NCHW images x (batch, c, h, w)
  // into y (batch, c, oh, ow), not x: sample i's window is draws[ctl->cursor + offset + i]
  // (draws and ctl in backend memory; ctl nullptr: draws[offset + i]) or, with draws nullptr,
  // `fixed` for every sample; packed by pack_window. The window is resized by antialiased
  // bilinear interpolation, flipped when it says so, then normalised per channel when norm is
  // not nullptr: (v − norm[ch]) / norm[c + ch] (norm: 2c floats in backend memory).
  virtual void resized_crop(const float* x, float* y, int batch, int c, int h, int w, int oh, int ow,
                            const int64_t* draws, const StepCtl* ctl, int64_t offset, int64_t fixed,
                            const float* norm) = 0;

  // ---- batch norm, residual blocks, global pooling ----
  // The CPU backend has them; the defaults throw InputError(kNeedsResnetOps). A batch-norm
  // layer's input is (rows, c) row-major: an NHWC image's rows = batch·h·w pixels, or a flat
  // (batch, c). Its sums (2c + 1 doubles) are per-channel partial sums, and its count last, that
  // a caller may add over ranks (sync_bn) between the two halves of a pass.
  virtual bool has_resnet_ops() const { return false; }
  // sums = [Σx (c), Σx² (c), rows].
  virtual void bn_sums(const float* x, int64_t rows, int c, double* sums);
  // Training: mean = Σx/n, var = Σx²/n − mean² (biased), invstd = 1/√(var + eps) saved for the
  // backward pass; y = (x − mean)·invstd·w + b; running stats (when not nullptr) move by momentum
  // toward mean and the unbiased var·n/(n−1) (PyTorch's BatchNorm). n = sums[2c]. relu: y =
  // max(y, 0) in the same pass (a ReLU after the batch norm, the same bits as act_forward's).
  virtual void bn_forward(const float* x, float* y, int64_t rows, int c, const double* sums,
                          const float* w, const float* b, float eps, float momentum,
                          float* save_mean, float* save_invstd, float* running_mean,
                          float* running_var, bool relu);
  // Evaluation: y = (x − running_mean)/√(running_var + eps)·w + b, then max(y, 0) with relu.
  virtual void bn_infer(const float* x, float* y, int64_t rows, int c, const float* running_mean,
                        const float* running_var, const float* w, const float* b, float eps, bool relu);
  // sums = [Σdy (c), Σdy·(x − mean) (c), rows]. relu_out (or nullptr): bn_forward's output with
  // relu; dy then counts only where relu_out > 0 (the ReLU's backward, dy itself left as it is).
  virtual void bn_backward_sums(const float* dy, const float* x, int64_t rows, int c,
                                const float* mean, double* sums, const float* relu_out);
  // dw = Σdy·(x − mean)·invstd, db = Σdy from the sums (this rank's own), written or added to.
  virtual void bn_param_grads(const double* sums, const float* invstd, int c, float* dw,
                              float* db, bool accumulate);
  // dx = w·invstd·(dy − Σdy/n − (x − mean)·invstd²·Σdy·(x − mean)/n), n = sums[2c] (the sums
  // over every rank's micro-batch with sync_bn). dx may equal dy. relu_out as bn_backward_sums'.
  virtual void bn_backward(const float* dy, const float* x, float* dx, int64_t rows, int c,
                           const double* sums, const float* mean, const float* invstd,
                           const float* w, const float* relu_out);
  // bn_sums then bn_forward, where nothing comes between them (no sync_bn sum over ranks): one
  // call, so that a backend may derive the statistics where it totals the sums.
  virtual void bn_train_forward(const float* x, float* y, int64_t rows, int c, double* sums, const float* w,
                                const float* b, float eps, float momentum, float* save_mean, float* save_invstd,
                                float* running_mean, float* running_var, bool relu);
  // bn_train_forward without relu for an output y that only residual_sum reads (a residual
  // block's last batch norm, of the body or of a projection shortcut): the statistics saved and
  // moved, but y's values may be left unwritten, to be made by residual_sum as it reads x (the
  // affine pass deferred into the sum: a write and a read of y saved). Returns false, having
  // done nothing, where the backend does not defer (the caller then runs bn_train_forward).
  // Until residual_sum, y must have no other reader. Default: false.
  virtual bool bn_train_deferred(const float* x, float* y, int64_t rows, int c, double* sums, const float* w,
                                 const float* b, float eps, float momentum, float* save_mean, float* save_invstd,
                                 float* running_mean, float* running_var);
  // bn_backward_sums, bn_param_grads and, unless dx is nullptr, bn_backward, where nothing comes
  // between them: one call, as bn_train_forward.
  virtual void bn_train_backward(const float* dy, const float* x, float* dx, int64_t rows, int c, double* sums,
                                 const float* mean, const float* invstd, const float* w, const float* relu_out,
                                 float* dw, float* db, bool accumulate);
  // A hint from the model, once: the activation buffer z is a convolution's output (without bias
  // or activation) that only batch norm reads, forward and backward. The CUDA backend under bf16
  // then keeps that convolution's bf16 output as it is and has batch norm read it, and never
  // writes z's floats. Other backends ignore it.
  virtual void note_bn_input(const float* z) { (void)z; }
  // A hint from the model, once: every reader of the activation buffer y (a batch norm's output,
  // a residual block's sum, a convolution's output after its fused ReLU, a pooling's output, the
  // model's input made NHWC) can
  // take it as a bf16 operand: a convolution (its input, forward and backward), a batch norm, a
  // residual block's sum, a pooling (max pooling then selects among the bf16 values, the first
  // of equal ones winning), and the fused ReLU's backward (its mask). The CUDA backend under bf16 then writes y's bf16 copy only, never y's floats; a
  // residual sum's terms are then bf16 values (as PyTorch's autocast keeps its activations).
  // Other backends ignore it.
  virtual void note_bf16_readers(const float* y) { (void)y; }
  // A hint from the model, once: a convolution's ReLU output a is read only by the max pooling
  // without padding whose argmax buffer is argmax, and that pooling's input gradient only by the
  // convolution's backward. The CUDA backend under bf16 then keeps the convolution's bf16 output
  // before bias and ReLU; the pooling adds the bias and applies the ReLU as it reads it, and
  // applies the ReLU's mask as it writes its input gradient: a is never written. The same bits as
  // without the hint. Other backends ignore it.
  virtual void note_relu_pool(const float* a, const uint8_t* argmax) { (void)a; (void)argmax; }
  // A hint from the model just before the op that writes the input gradient dx, for that write
  // only: GradUse::conv — bn_backward's dx is read only by the backward pass of the convolution
  // below, one without bias or activation (its output was note_bn_input's z); GradUse::bn —
  // conv_backward's or pool_backward's dx, or residual_backward's d, is read only by the batch
  // norm below (bn_backward_sums, bn_backward);
  // GradUse::sum — conv_backward's dx is a residual block's body's input gradient, read only by
  // the block's add (the shortcut's gradient added to it), or a projection shortcut's, copied
  // aside (copy keeps a bf16-only tensor so) for that add; GradUse::act — conv_backward's or
  // pool_backward's dx is read only by the backward pass of the convolution below, one with a
  // fused ReLU; GradUse::pool — conv_backward's dx, or add's sum (the first residual block's
  // input gradient), is read only by the pooling below; GradUse::res — add's sum (a residual
  // block's input gradient) is read only by residual_backward (the previous block's add with a
  // ReLU).
  // The CUDA backend under bf16 then writes dx in bf16 only (the operand the reader takes, or
  // what add widens as it sums), and never dx's floats. Other backends ignore it.
  enum class GradUse { conv, bn, sum, act, pool, res };
  virtual void note_grad_use(const float* dx, GradUse use) { (void)dx; (void)use; }
  // y (n) += x (n): the sum of a residual block's gradients.
  virtual void add(const float* x, float* y, size_t n);
  // y (n) = body + shortcut, then max(y, 0) with relu: a residual block's output. y may be
  // neither input. A term that bn_train_deferred left unwritten is made here from its batch
  // norm's input, with the bits bn_train_forward would have written.
  virtual void residual_sum(const float* body, const float* shortcut, float* y, size_t n, bool relu);
  // Its backward: d (n) = d where y > 0 with relu (y: residual_sum's output), and keep = d, the
  // output's gradient kept for the second branch. keep may be y. Defaults to act_backward + copy.
  virtual void residual_backward(float* d, const float* y, float* keep, size_t n, bool relu);
  // The same backward where both branches' first readers take their gradient from keep (a batch
  // norm's dy: the model's dy_from_), so d is not read after: keep = d where y > 0 with relu,
  // and d's values are left undefined (the CUDA backend does not write them). Returns false,
  // having done nothing, where keep cannot hold those values exactly (the CUDA backend under
  // bf16 keeps keep in bf16 only: it declines a d that is not bf16 values already); the caller
  // then runs residual_backward. Defaults to residual_backward.
  virtual bool residual_backward_keep(float* d, const float* y, float* keep, size_t n, bool relu);
  // y (batch, c) = the mean of each channel of x (batch, hw, c); backward: dx = dy / hw.
  virtual void global_avgpool_forward(const float* x, float* y, int batch, int hw, int c);
  virtual void global_avgpool_backward(const float* dy, float* dx, int batch, int hw, int c);

  // Softmax cross-entropy over logits (batch,classes) against labels (batch):
  // dlogits = (softmax − onehot)·grad_scale unless dlogits is nullptr;
  // stats[0] += Σ −log softmax[label], stats[1] += number of rows whose argmax == label.
  virtual void softmax_xent(const float* logits, const int32_t* labels, int batch, int classes,
                            float grad_scale, float* dlogits, float* stats) = 0;

  // softmax_xent against the smoothed target (1 − eps)·onehot + eps/classes (F.cross_entropy's
  // label_smoothing): loss (1 − eps)·(−log p[label]) + eps·mean_j(−log p[j]), dlogits =
  // (softmax − target)·grad_scale. Default: eps = 0 only (else InputError).
  virtual void softmax_xent_smoothed(const float* logits, const int32_t* labels, int batch, int classes,
                                     float grad_scale, float* dlogits, float* stats, float eps);

  // ---- the optimizer, fused over the flat arena ----
  // s1: momentum buffer / exp_avg; s2: exp_avg_sq (adam*) — nullptr where unused.
  virtual void optimizer_step(float* p, const float* g, float* s1, float* s2, size_t n,
                              const OptimStep& h) = 0;
  // True when every element is finite (waits for the device).
  virtual bool all_finite(const float* p, size_t n) = 0;

  // ---- the layer-wise optimizers (LARS, LAMB): two passes over any range of the arena ----
  // The range is arena elements [lo, lo + n); p, g, s1, s2 point at its first element (the state
  // may be a shard's own); segs are the model's tensors in arena coordinates, not overlapping
  // (the range may cut some). lr and t come from h, or, with ctl, from lr_table[ctl->step] and
  // ctl->updates + 1; with ctl->bad neither pass does anything. A caller holding the arena in
  // shards adds `sums` over its ranks between the two passes.
  // (a) layer_sums: sums[2i] += Σ w², sums[2i+1] += Σ d² over segment i's elements inside the
  //     range (nothing for a segment outside it), d = g (LARS) or LAMB's update direction; LAMB
  //     also advances its moments s1, s2 over the range here. Summed in a fixed order. The
  //     caller zeroes sums first: passes over several ranges (a tensor cut by buckets) add up.
  virtual void layer_sums(const float* p, const float* g, float* s1, float* s2, size_t lo,
                          size_t n, const std::vector<TensorSeg>& segs, const OptimStep& h,
                          const float* lr_table, const StepCtl* ctl, float* sums);
  // (b) layer_apply: the update of the range, each tensor's trust ratio from its whole sums.
  virtual void layer_apply(float* p, const float* g, float* s1, float* s2, size_t lo, size_t n,
                           const std::vector<TensorSeg>& segs, const float* sums,
                           const OptimStep& h, const float* lr_table, const StepCtl* ctl);

  // ---- the side lane: work that overlaps the main lane (cuda: the communication stream) ----
  // side_wait(): the side lane waits for everything enqueued on the main lane so far;
  // main_wait(): the main lane waits for everything enqueued on the side lane so far. While a
  // SideLane is alive, the ops that take `lane` into account (optimizer_step_at, check_finite,
  // fill, to_bf16, from_bf16) enqueue on the side lane. A backend without lanes (cpu) runs
  // everything in order, and these are no-ops.
  virtual void side_wait() {}
  virtual void main_wait() {}
  virtual void set_side(bool on) { (void)on; }
  // The bf16 copy the backend keeps of [p, p + n) of a registered parameter arena (the GEMMs'
  // weight operand in bf16 precision), or nullptr when it keeps none.
  virtual uint16_t* param_shadow(const float* p, size_t n) { (void)p; (void)n; return nullptr; }
  // The shadow's [p, p + n) was written by someone else (an all-gather): it is current, and the
  // fp32 arena there may be stale (only the shadow is read for GEMMs).
  virtual void note_shadow_write(const float* p, size_t n) { (void)p; (void)n; }

  // ---- bf16 on the wire ----
  // dst (n, bf16 bits, round to nearest even) = src (n).
  virtual void to_bf16(const float* src, uint16_t* dst, size_t n) = 0;
  // dst (n) = src (n, bf16 bits), exactly; with ctl, ctl->bad |= any element is NaN/Inf.
  virtual void from_bf16(const uint16_t* src, float* dst, size_t n, StepCtl* ctl) = 0;

  // ---- data ----
  // x (count, dim) and y (count) in backend memory get rows `rows` of the dataset, converted to
  // float with the dataset's scale and offset. Default: gather on the host, then upload.
  virtual void load_batch(const Dataset& ds, const int64_t* rows, int count, float* x, int32_t* y);

  // ---- device-side step control (the training loop's path) ----
  // As load_batch with rows = order[ctl->cursor + offset ...]; order (n) and ctl live in
  // backend memory. host_rows, when given, are the same rows as the host knows them (valid for
  // this call only): a backend that cannot gather on the device (data too large for it) uses
  // them instead of reading order and ctl back. Default: host-addressable backends read order
  // and ctl directly; others take host_rows, or download.
  virtual void load_batch_at(const Dataset& ds, const int64_t* order, const StepCtl* ctl,
                             int64_t offset, int count, float* x, int32_t* y,
                             const int64_t* host_rows = nullptr);
  // ctl->bad |= (any of g[0..n) is NaN/Inf).
  virtual void check_finite(const float* g, size_t n, StepCtl* ctl);
  // optimizer_step with lr = lr_table[ctl->step] and t = ctl->updates + 1; nothing when ctl->bad
  // as the update starts. flag: the non-finite check folded into the update, which reads g
  // anyway: ctl->bad |= any of g is NaN/Inf (the update of those elements goes ahead: only for
  // policies that never keep the result, train.on_nonfinite = stop).
  virtual void optimizer_step_at(float* p, const float* g, float* s1, float* s2, size_t n,
                                 const OptimStep& h, const float* lr_table, StepCtl* ctl,
                                 bool flag = false);
  // End of a step: count it (skipped or applied), advance cursor by global_batch, and clear
  // ctl->bad unless sticky.
  virtual void end_step(StepCtl* ctl, int64_t global_batch, bool sticky);
  // The contents of ds changed (its version): a backend holding a copy refreshes it, in
  // stream order after the work already queued, at the same address.
  virtual void refresh_dataset(const Dataset& ds) { (void)ds; }
  // True when a step that touches only backend memory and `ds` can be captured and replayed.
  virtual bool can_capture(const Dataset& ds) { (void)ds; return false; }
  // data.read = stream on a device backend: `ring` (no host rows; n = slots × slot_rows, the
  // streamed file's dim, type, scale and offset) becomes micro-batch slots in backend
  // memory that stage() fills from the host ahead of the step and load_batch_at() gathers from
  // as from a resident dataset, so a streamed step reads only backend memory and can be
  // captured. False (the default, and where the slots do not fit): the step reads each
  // micro-batch with load_batch. slot_rows = 0 drops the slots (their owner is going away).
  virtual bool make_ring(const Dataset& ring, int64_t slot_rows) { (void)ring, (void)slot_rows; return false; }
  // mb's rows 0..mb.n-1 into the ring's rows [slot × mb.n, (slot + 1) × mb.n): work enqueued
  // after this call reads them; the copy waits for the work enqueued before the slot's last
  // release(). mb may change once this returns.
  virtual void stage(const Dataset& ring, int slot, const Dataset& mb) { (void)ring, (void)slot, (void)mb; }
  // The work enqueued so far is all that reads the slot until it is staged again.
  virtual void release(const Dataset& ring, int slot) { (void)ring, (void)slot; }
  // A runner for `step`; capture is allowed only when the caller says the step can be.
  virtual std::unique_ptr<StepRunner> make_runner(std::function<void()> step, bool capture);

  // ---- measurement (bench-step --account) ----
  // Points on the backend's timeline: mark() records one after everything enqueued so far;
  // seconds() waits and gives each mark's time since the first. The base class reads the
  // host's clock, right for a backend whose work is done when its call returns (cpu).
  virtual std::unique_ptr<TimeMarks> time_marks();
  // What this backend's GEMM and memory reach, measured now (a few hundred ms): a large square
  // GEMM in the precision's operand type, and a copy of a buffer far larger than any cache.
  virtual Ceilings measure_ceilings();
  // Bytes this backend has allocated (alloc_bytes and its own buffers): now and at the most
  // since the backend was made or the peak was last reset.
  virtual DeviceMemory device_memory() const { return {}; }
  virtual void reset_memory_peak() {}

 protected:
  Backend() = default;
};

// While alive, the lane-aware ops of `be` enqueue on its side lane (see Backend::side_wait).
class SideLane {
 public:
  explicit SideLane(Backend& be, bool on = true) : be_(be), on_(on) { if (on_) be_.set_side(true); }
  ~SideLane() { if (on_) be_.set_side(false); }
  SideLane(const SideLane&) = delete;
  SideLane& operator=(const SideLane&) = delete;

 private:
  Backend& be_;
  bool on_;
};

// bf16 bits of x, rounded to nearest even (NaN stays a quiet NaN), and back: the conversions
// of the CPU backend and of tests, bit for bit those of the CUDA kernels.
uint16_t bf16_bits(float x);
float bf16_value(uint16_t b);

// Backend memory, RAII. T is float, int32_t, etc. An alias views memory another Buffer owns
// (ops that take turns in one tensor: Model's shared slots) and frees nothing.
template <class T> class Buffer {
 public:
  struct Lazy {};  // Backend::alloc_lazy
  Buffer() = default;
  static Buffer alias(const Buffer& owner) {
    Buffer b;
    b.p_ = owner.p_;
    b.n_ = owner.n_;
    return b;
  }
  Buffer(Backend& be, size_t n) : be_(&be), n_(n) {
    p_ = n ? static_cast<T*>(be.alloc_bytes(n * sizeof(T))) : nullptr;
  }
  Buffer(Backend& be, size_t n, Lazy) : be_(&be), n_(n) {
    p_ = n ? static_cast<T*>(be.alloc_lazy(n * sizeof(T))) : nullptr;
  }
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept : be_(o.be_), p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) { reset(); be_ = o.be_; p_ = o.p_; n_ = o.n_; o.p_ = nullptr; o.n_ = 0; }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* data() const { return p_; }
  size_t size() const { return n_; }
  void reset() noexcept { if (p_ && be_) be_->free_bytes(p_); p_ = nullptr; n_ = 0; }

 private:
  Backend* be_ = nullptr;
  T* p_ = nullptr;
  size_t n_ = 0;
};

struct BackendOptions {
  std::string type = "auto";  // auto|cuda|cpu
  Precision precision = Precision::fp32;
  int threads = 0;       // cpu: BLAS threads (0 = hardware threads / local ranks)
  std::string threads_source;  // cpu: what decided `threads` (printed at start-up)
  int local_rank = 0;    // which GPU (cuda) / share of cores (cpu)
  int local_size = 1;
  // cuda: ranks beyond the number of visible GPUs share them (device = local_rank % GPUs).
  // Only valid with the MPI transport (NCCL refuses two ranks on one GPU); when false, such a
  // rank is an InputError.
  bool share_gpus = false;
  // cuda: cuDNN's convolution algorithms from its heuristic (the same every run) rather than
  // timed at the first call of each shape; the most workspace one convolution may take.
  bool conv_heuristic = false;
  size_t conv_workspace_bytes = size_t(1) << 30;
};

// Number of CUDA devices this process can use; 0 where the build has no CUDA or no driver.
int cuda_device_count();
bool cuda_compiled();
// Initialises the CUDA driver and, for local_rank_hint >= 0, creates the primary context of the
// GPU a backend for that local rank picks; errors are left to the backend. Any thread, before
// MPI_Init. Nothing without CUDA.
void cuda_early_init(int local_rank_hint);

// "auto" picks cuda where a GPU is visible, else cpu. Throws InputError for "cuda" without one.
std::unique_ptr<Backend> make_backend(const BackendOptions& opt);
std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& opt);
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opt);  // cuda builds only

}  // namespace dpt
