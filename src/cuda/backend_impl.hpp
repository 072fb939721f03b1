// CudaBackendImpl and what its source files share (RAII for the runtime's handles, scratch, the
// upload ring, streamed batches, cuBLASLt plans); private to src/cuda/. Its members are defined by
// concern in src/cuda/*.cpp; the overview of the backend heads cuda_backend.cpp.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <initializer_list>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "dpt/cuda_backend.hpp"
#include "dpt/data.hpp"
#include "norm/norm_kernels.cuh"

namespace dpt::cuda_impl {

// ---- RAII for the runtime's handles ----
struct StreamDel { void operator()(cudaStream_t s) const noexcept { cudaStreamDestroy(s); } };
struct EventDel { void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); } };
struct BlasDel { void operator()(cublasHandle_t h) const noexcept { cublasDestroy(h); } };
struct LtDel { void operator()(cublasLtHandle_t h) const noexcept { cublasLtDestroy(h); } };
void dev_free(void* p) noexcept;  // memory.cpp: cudaFree, and the bytes no longer counted
struct DevDel { void operator()(void* p) const noexcept { dev_free(p); } };
struct PinnedDel { void operator()(void* p) const noexcept { cudaFreeHost(p); } };
using Stream = std::unique_ptr<CUstream_st, StreamDel>;
using Event = std::unique_ptr<CUevent_st, EventDel>;
using Blas = std::unique_ptr<cublasContext, BlasDel>;
using LtHandle = std::unique_ptr<cublasLtContext, LtDel>;

// One cuBLASLt matmul configuration (shape, transposes, alignments, epilogue), planned once: the
// descriptors and the algorithm chosen by cublasLtMatmulAlgoGetHeuristic. ok == false: cuBLASLt
// offered nothing for it, and the caller takes the cublasGemmEx path instead.
struct LtPlan {
  bool ok = false;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};
// One convolution shape's cuDNN descriptors (NHWC tensors, the filter (out, k, k, c) = our
// weight layout) and the algorithm of each direction, chosen on first use (cudnn_conv.cpp). Each
// direction has its own convolution descriptor: the chosen algorithm's math type is set on it.
// One direction's choice: its algorithm, workspace bytes and time (conv_tuning = time, else -1).
template <class Algo> struct ConvChoice {
  Algo algo{};
  size_t ws = 0;
  float ms = -1;
  bool made = false;
};
// Under bf16, each direction also runs through cuDNN's graph API (cudnn_engines.cpp): the
// operation graph of the one convolution, and the execution plan of the engine configuration
// chosen among those cuDNN's heuristics offer, timed on first use (conv_tuning = time) or the
// first usable one (heuristic). tried: built (plan nullptr where none was usable: the
// convolution API's algorithm runs instead).
struct ConvEngine {
  std::vector<cudnnBackendDescriptor_t> owned;  // the graph's descriptors, destroyed with it
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t engine = -1;  // the engine's global index, printed
  size_t ws = 0;
  float ms = -1;
  int offered = 0;  // configurations offered, usable (timed where timed)
  int usable = 0;
  bool tried = false;
  ConvEngine() = default;
  ConvEngine(const ConvEngine&) = delete;
  ConvEngine& operator=(const ConvEngine&) = delete;
  ~ConvEngine();
};
enum class ConvDir { fwd, data, filter };
struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t fwd_desc = nullptr, data_desc = nullptr, filter_desc = nullptr;
  ConvChoice<cudnnConvolutionFwdAlgo_t> fwd;
  ConvChoice<cudnnConvolutionBwdDataAlgo_t> data;
  ConvChoice<cudnnConvolutionBwdFilterAlgo_t> filter;
  ConvEngine efwd, edata, efilter;
  bool said = false;
  int narrow_said = 0;  // say_narrow's lines logged: 1 the plain form, 2 with the epilogue
  ConvPlan() = default;
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;
  ~ConvPlan();
};
struct CudnnDel { void operator()(cudnnHandle_t h) const noexcept { cudnnDestroy(h); } };
using Cudnn = std::unique_ptr<cudnnContext, CudnnDel>;

using DevPtr = std::unique_ptr<void, DevDel>;
using PinnedPtr = std::unique_ptr<void, PinnedDel>;

// memory.cpp
// What a device allocation holds, for DeviceMemory's breakdown.
enum class MemKind { other, buffer, copy, shadow, scratch, retired };
DevPtr dev_alloc(size_t bytes, MemKind kind = MemKind::other);
void recount(const void* p, MemKind kind);  // p's bytes counted as kind from now on
void trim_scratch();             // every Scratch's retired buffers freed, and each cut to its need (Scratch)
void count_graphs(int delta);    // captured step graphs made (+1) and destroyed (-1)
// Every cudaMalloc of the backend's (dev_alloc, alloc_bytes) counted, process-wide: bytes now
// and the most since the last reset.
DeviceMemory counted_memory();
void reset_counted_peak();
Event make_event();  // an event for ordering (it does not time)

// Milliseconds of GPU time that work() enqueues on stream s, between two timing events; waits
// for it. Start-up choices (im2col or cuDNN, cuDNN's engines) time their candidates with it.
class StreamTimer {
 public:
  StreamTimer();
  template <class F> float time(cudaStream_t s, F&& work) {
    start(s);
    work();
    return stop(s);
  }

 private:
  void start(cudaStream_t s);
  float stop(cudaStream_t s);
  Event t0_, t1_;
};

// A device buffer that grows on demand. The old buffer is retired, not freed: work already queued
// may still read it, and so may a captured step graph (evaluation runs a larger batch between
// replays of a step whose graph holds the old address). Retired buffers go with the backend.
//
// Every Scratch is registered (memory.cpp): trim_scratch, called where capture starts, frees the
// retired buffers of all of them while no captured graph lives in the process (then nothing can
// hold them: cudaFree waits for the device's queued work first), and cuts each buffer to its
// need: the largest request made outside start-up timing (StartupTiming). The eager step before
// capture makes every request the step makes; timing the candidates of a choice (im2col or
// cuDNN, cuDNN's algorithms and engines) on buffers of its own asks for more than the step needs
// (resnet50: 1.0 GiB of scratch, 0.2 GiB of it needed).
class Scratch {
 public:
  Scratch();
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch& operator=(Scratch&& o) noexcept;  // o's buffers become this one's; this one's current is retired
  void* get(size_t bytes, cudaStream_t s);
  size_t capacity() const { return cap_; }
  friend void trim_scratch();

 private:
  void trim();
  DevPtr p_;
  size_t cap_ = 0;
  size_t need_ = 0;  // the largest request outside start-up timing
  std::vector<DevPtr> retired_;
};

// While one lives on this thread, Scratch requests are start-up timing's, not the step's: they
// grow the buffers as before, but trim_scratch does not keep that size for them.
class StartupTiming {
 public:
  StartupTiming();
  ~StartupTiming();
  StartupTiming(const StartupTiming&) = delete;
  StartupTiming& operator=(const StartupTiming&) = delete;
};

// Host -> device copies through two pinned slots, so upload() returns as soon as the caller's
// bytes are in a slot (the caller may then reuse its buffer) without waiting for the GPU. A slot
// is refilled only after the event recorded behind its previous copy has completed (memory.cpp).
class UploadRing {
 public:
  static constexpr size_t kSlotBytes = size_t(4) << 20;
  static constexpr int kSlots = 2;

  UploadRing();
  void upload(void* dst, const void* src, size_t bytes, cudaStream_t s);

 private:
  PinnedPtr host_[kSlots];
  Event done_[kSlots];
  int next_ = 0;
};

// Micro-batches of a dataset that stays in host memory, streamed through two slots (gather.cpp).
class BatchStream {
 public:
  static constexpr int kSlots = 2;

  BatchStream();
  ~BatchStream();

  void load(const Dataset& ds, const int64_t* rows, int count, float* x, int32_t* y,
            cudaStream_t compute);

 private:
  struct Slot {
    PinnedPtr host;
    DevPtr dev;
    size_t cap = 0;
    Event copied, consumed;
  };
  void grow_iota(size_t n);
  Stream copy_;
  Slot slots_[kSlots];
  DevPtr iota_;  // 0, 1, 2, ...: the rows of a slot
  size_t iota_n_ = 0;
  int next_ = 0;
};

// A dataset kept in device memory, features in their stored type.
struct Resident {
  const void* host = nullptr;  // the host array it was copied from (detects a reused address)
  uint64_t version = 0;        // the Dataset's version it holds (contents replaced in place)
  int64_t n = 0, dim = 0;
  bool u8 = true;
  bool checked = false;        // the decision below has been taken for this dataset
  bool fits = false;           // false: too large, batches are gathered on the host
  DevPtr feat, labels;         // (n, dim) uint8 or float32; (n) int32
};

// data.read = stream's micro-batch slots on the device (make_ring, gather.cpp): a Resident of
// slots × rows rows that load_batch_at gathers from, filled slot by slot on a copy stream from
// pinned host copies. Each slot's copy waits for the last step that read it (released), and the
// compute stream waits for the copy, so a captured step replays on whichever rows were staged.
struct StagedRing {
  const Dataset* key = nullptr;  // the trainer's ring Dataset
  Resident res;
  int64_t rows = 0;              // rows per slot
  size_t row_bytes = 0;
  Stream copy;
  struct Slot {
    PinnedPtr host;  // rows, then labels (int32) at lab_at
    Event copied, consumed;
  };
  std::vector<Slot> slots;
  size_t lab_at = 0;
  ~StagedRing();
};

class CudaBackendImpl final : public CudaBackend {
 public:
  explicit CudaBackendImpl(const BackendOptions& opt);
  ~CudaBackendImpl() override;

  std::string name() const override { return "cuda"; }
  std::string describe() const override { return describe_; }
  bool host_addressable() const override { return false; }
  int device() const override { return dev_; }
  cudaStream_t compute_stream() const override { return stream_.get(); }
  cudaStream_t comm_stream() const override { return comm_.get(); }
  int fused_layers() const override { return last_fused_; }

  // ---- memory (memory.cpp) ----
  void* alloc_bytes(size_t bytes) override;
  void* alloc_lazy(size_t bytes) override;
  void free_bytes(void* p) noexcept override;
  void upload(void* dst, const void* src, size_t bytes) override;
  void download(void* dst, const void* src, size_t bytes) override;
  bool pin_host(void* p, size_t bytes) override;
  void unpin_host(void* p) noexcept override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void fill(float* p, size_t n, float v) override;
  void scale(float* p, size_t n, float a) override;
  DeviceMemory device_memory() const override { return counted_memory(); }
  void reset_memory_peak() override { reset_counted_peak(); }

  // ---- measurement (ceilings.cpp) ----
  std::unique_ptr<TimeMarks> time_marks() override;
  Ceilings measure_ceilings() override;

  // ---- the bf16 copies of fp32 data (bf16_copies.cpp) ----
  void register_parameters(float* p, size_t n) override;
  void note_device_write(const void* p, size_t bytes) override;
  uint16_t* param_shadow(const float* p, size_t n) override;
  void note_shadow_write(const float* p, size_t n) override;

  // ---- the side lane, bf16 on the wire, synchronisation (cuda_backend.cpp) ----
  void set_side(bool on) override;
  void side_wait() override;
  void main_wait() override;
  void to_bf16(const float* src, uint16_t* dst, size_t n) override;
  void from_bf16(const uint16_t* src, float* dst, size_t n, StepCtl* ctl) override;
  void synchronize() override;

  // ---- Linear layers one at a time, and the loss (linear.cpp) ----
  void linear_forward(const float* x, const float* w, const float* b, float* z, float* a,
                      int batch, int in, int out, Act act) override;
  void linear_fwd(const float* x, const float* w, const float* b, float* z, float* a, int batch,
                  int in, int out, Act act, bool a16_twin);
  void linear_backward(const float* x, const float* w, const float* z, const float* a, float* da,
                       int batch, int in, int out, Act act, float* dw, float* db, float* dx,
                       bool accumulate) override;
  float* bgrad_partial(int batch, int out);
  // The weight gradient dw (out,in) = dzᵀ·x as one GEMM's operands (C = dwᶜ, in×out), made once
  // per layer so that row pieces of dw can be computed one by one (wgrad_rows).
  struct Wgrad {
    bool ta = false, tb = true;
    const void* A = nullptr;
    const void* B = nullptr;
    int lda = 0, ldb = 0;
    size_t esz = 4;  // bytes per element of B
  };
  Wgrad wgrad_ops(const float* x, const void* x16, const float* dz, const void* dz16, int batch,
                  int in, int out);
  void wgrad_rows(const Wgrad& w, int batch, int in, int r0, int r1, float* dw, float beta);
  void weight_grad(const float* x, const void* x16, const float* dz, const void* dz16, int batch,
                   int in, int out, float* dw, float beta);
  void softmax_xent(const float* logits, const int32_t* labels, int batch, int classes,
                    float grad_scale, float* dlogits, float* stats) override;

  // ---- the whole MLP: bf16 hidden ReLU activations that never exist in fp32 (mlp_fused.cpp) ----
  void mlp_forward(const float* x, int batch, const std::vector<LinearArgs>& L) override;
  void mlp_backward(const float* x, int batch, const std::vector<LinearArgs>& L, float* d0, float* d1,
                    bool accumulate, const PassHooks& hooks, float* dx0) override;

  // ---- convolutions through cuDNN (cudnn_conv.cpp); DPT_CONV=im2col: conv_path.cpp's ----
  size_t conv_cols(const ConvGeom& g, bool input_grad = true) override;
  void conv_backward(const float* x, const float* w, const float* z, const float* a, float* da, float* cols,
                     const ConvGeom& g, Act act, float* dw, float* db, float* dx, bool accumulate) override;
  void cudnn_conv_forward(const float* x, const float* w, const float* b, float* z, float* a, const ConvGeom& g,
                          Act act);
  bool pointwise_gemm(const ConvGeom& g) const;  // a 1x1 stride-1 conv taken as a Linear layer
  // bf16: a convolution of a single input channel (a grey image's first) runs on copies of its
  // input and weight padded with zero channels to 8 (padded_geom), which cuDNN's tensor-core
  // kernels take; its filter and input gradients drop the padding. On the H200 (2026-12-02)
  // resnet18(stem=small)'s 1-channel 3x3 convolution took 0.062 ms forward and 0.074 ms for its
  // filter gradient padded against 0.086 and 0.101; ResNet-50's 3-channel 7x7 stem took 2.06
  // and 1.25 ms padded, the padding passes included, against 1.83 and 1.13: it is not padded.
  bool pads_channels(const ConvGeom& g) const { return bf16() && g.c == 1 && pad_channels_; }
  // narrow_conv.cpp: a first layer's few channels forward as bf16 columns and cuBLASLt GEMMs
  bool narrow_conv(const ConvGeom& g) const;
  int narrow_chunk_rows(const ConvGeom& g) const;
  void say_narrow(ConvPlan& p, const ConvGeom& g, bool epilogue);
  bool narrow_forward(const float* x, const float* w, const ConvGeom& g, void* y, const float* relu_bias);
  void gemm_bf16_out(bool ta, bool tb, int m, int n, int k, const void* A, int lda, const void* B, int ldb, void* D,
                     int ldd);
  ConvGeom padded_geom(const ConvGeom& g) const;
  const void* padded_operand(const float* p, size_t rows, const ConvGeom& g, bool weight);
  bool pointwise_gemm_bf16(const float* x, const float* w, float* z, const ConvGeom& g);
  void pointwise_backward_bf16(const float* x, const float* w, const void* dz16, const ConvGeom& g, float* dw,
                               float* dx, bool keep_dx16, bool accumulate);

  // ---- convolutional networks (conv_path.cpp) ----
  void im2col(const float* x, const ConvGeom& g, float* cols) override;
  void conv_forward(const float* x, const float* w, const float* b, float* cols, float* z, float* a,
                    const ConvGeom& g, Act act) override;
  void col2im(const float* dcols, const ConvGeom& g, float* dx) override;
  void pool_forward(const float* x, float* y, uint8_t* argmax, const PoolGeom& g, bool max) override;
  void pool_backward(const float* dy, const uint8_t* argmax, float* dx, const PoolGeom& g,
                     bool max) override;
  void act_forward(const float* z, float* a, size_t n, Act act) override;
  void act_backward(float* da, const float* z, const float* a, size_t n, Act act) override;
  void nhwc_to_nchw(const float* src, float* dst, int batch, int c, int hw) override;
  void nchw_to_nhwc(const float* src, float* dst, int batch, int c, int hw) override;
  void weight_to_nhwc(const float* w, float* wp, int rows, int c, int hw) override;
  void dropout(const float* x, float* y, int batch, const DropoutArgs& d, const StepCtl* ctl) override;
  void augment(const float* x, float* y, int batch, int c, int h, int w, int pad,
               const int32_t* draws, const StepCtl* ctl, int64_t offset) override;
  void resized_crop(const float* x, float* y, int batch, int c, int h, int w, int oh, int ow,
                    const int64_t* draws, const StepCtl* ctl, int64_t offset, int64_t fixed,
                    const float* norm) override;

  // ---- batch norm, residual blocks, padded and global pooling (resnet_ops.cpp) ----
  bool has_resnet_ops() const override { return true; }
  void bn_sums(const float* x, int64_t rows, int c, double* sums) override;
  void bn_forward(const float* x, float* y, int64_t rows, int c, const double* sums, const float* w,
                  const float* b, float eps, float momentum, float* save_mean, float* save_invstd,
                  float* running_mean, float* running_var, bool relu) override;
  void bn_infer(const float* x, float* y, int64_t rows, int c, const float* running_mean,
                const float* running_var, const float* w, const float* b, float eps, bool relu) override;
  void bn_backward_sums(const float* dy, const float* x, int64_t rows, int c, const float* mean,
                        double* sums, const float* relu_out) override;
  void bn_param_grads(const double* sums, const float* invstd, int c, float* dw, float* db,
                      bool accumulate) override;
  void bn_backward(const float* dy, const float* x, float* dx, int64_t rows, int c, const double* sums,
                   const float* mean, const float* invstd, const float* w, const float* relu_out) override;
  void bn_train_forward(const float* x, float* y, int64_t rows, int c, double* sums, const float* w, const float* b,
                        float eps, float momentum, float* save_mean, float* save_invstd, float* running_mean,
                        float* running_var, bool relu) override;
  void bn_train_backward(const float* dy, const float* x, float* dx, int64_t rows, int c, double* sums,
                         const float* mean, const float* invstd, const float* w, const float* relu_out, float* dw,
                         float* db, bool accumulate) override;
  void add(const float* x, float* y, size_t n) override;
  void note_bn_input(const float* z) override { bn_inputs_.insert(z); }
  void note_relu_pool(const float* a, const uint8_t* argmax) override {
    if (bf16_acts_ && bf16_grads_) relu_pools_[argmax] = a;
  }
  void note_bf16_readers(const float* y) override {
    if (bf16_acts_) bf16_readers_.insert(y);
  }
  void note_grad_use(const float* dx, GradUse use) override {
    if (bf16_grads_) grad_uses_[dx] = use;
  }
  bool bn_train_deferred(const float* x, float* y, int64_t rows, int c, double* sums, const float* w, const float* b,
                         float eps, float momentum, float* save_mean, float* save_invstd, float* running_mean,
                         float* running_var) override;
  void residual_sum(const float* body, const float* shortcut, float* y, size_t n, bool relu) override;
  void residual_backward(float* d, const float* y, float* keep, size_t n, bool relu) override;
  bool residual_backward_keep(float* d, const float* y, float* keep, size_t n, bool relu) override;
  void global_avgpool_forward(const float* x, float* y, int batch, int hw, int c) override;
  void global_avgpool_backward(const float* dy, float* dx, int batch, int hw, int c) override;
  void softmax_xent_smoothed(const float* logits, const int32_t* labels, int batch, int classes,
                             float grad_scale, float* dlogits, float* stats, float eps) override;

  // ---- the optimizers' launches (optim_launch.cpp) ----
  void optimizer_step(float* p, const float* g, float* s1, float* s2, size_t n,
                      const OptimStep& h) override;
  void layer_sums(const float* p, const float* g, float* s1, float* s2, size_t lo, size_t n,
                  const std::vector<TensorSeg>& segs, const OptimStep& h, const float* lr_table,
                  const StepCtl* ctl, float* sums) override;
  void layer_apply(float* p, const float* g, float* s1, float* s2, size_t lo, size_t n,
                   const std::vector<TensorSeg>& segs, const float* sums, const OptimStep& h,
                   const float* lr_table, const StepCtl* ctl) override;
  bool all_finite(const float* p, size_t n) override;
  void check_finite(const float* g, size_t n, StepCtl* ctl) override;
  void optimizer_step_at(float* p, const float* g, float* s1, float* s2, size_t n,
                         const OptimStep& h, const float* lr_table, StepCtl* ctl, bool flag) override;
  void end_step(StepCtl* ctl, int64_t global_batch, bool sticky) override;

  // ---- data (gather.cpp) ----
  void load_batch(const Dataset& ds, const int64_t* rows, int count, float* x,
                  int32_t* y) override;
  void load_batch_at(const Dataset& ds, const int64_t* order, const StepCtl* ctl, int64_t offset,
                     int count, float* x, int32_t* y, const int64_t* host_rows) override;
  bool can_capture(const Dataset& ds) override;
  void refresh_dataset(const Dataset& ds) override;
  bool make_ring(const Dataset& ring, int64_t slot_rows) override;
  void stage(const Dataset& ring, int slot, const Dataset& mb) override;
  void release(const Dataset& ring, int slot) override;

  // ---- the step graph and its hooks (graph.cpp) ----
  std::unique_ptr<StepRunner> make_runner(std::function<void()> step, bool capture) override;
  void refresh_shadows();
  void capture_begin();
  bool capture_leaves_stale() const;
  void mark_shadows_stale();

 private:
  // A bf16 copy of the fp32 parameter arena, kept equal to bf16_rn(arena) whenever !dirty.
  struct Shadow {
    float* p = nullptr;
    size_t n = 0;
    DevPtr w16;
    bool dirty = true;
  };
  // A bf16 copy of fp32 data at a fixed address (an activation, a batch): its first `valid`
  // elements equal bf16_rn of the fp32 ones. Sized once to the end of the allocation holding the
  // address, so it never moves (a captured graph may hold its address).
  struct Twin {
    DevPtr buf;
    size_t cap = 0;    // elements
    size_t valid = 0;  // elements
    bool only = false; // the float tensor was not written: the twin is its only copy (valid > 0)
    // note_relu_pool: the twin holds the convolution's output before bias and ReLU (its
    // activation's only copy, readable only by that pooling), pre_bias the bias (or nullptr).
    bool pre_act = false;
    const float* pre_bias = nullptr;
  };

  // bn_train_deferred's output y, not written: residual_sum makes its values from x (the batch
  // norm's input operand) and coef ([scale, shift], c channels). live until y is written.
  struct Deferred {
    cuda::Operand x{nullptr, false};
    DevPtr coef;
    int c = 0;
    size_t n = 0;
    bool round16 = false;
    bool live = false;
  };

  bool bf16() const { return precision_ == Precision::bf16; }
  // Where the lane-aware ops enqueue (Backend::set_side).
  cudaStream_t lane() const { return side_ ? comm_.get() : stream_.get(); }

  static bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
    const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
    return an && bn && a0 < b0 + bn && b0 < a0 + an;
  }

  // bf16_copies.cpp
  void note_write(const void* p, size_t bytes);
  void* note_update(float* p, float* s1, float* s2, size_t n);
  void forget(void* p) noexcept;
  void* twin_slot(const float* p, size_t n);
  const void* valid_twin(const float* p, size_t n) const;
  void* only_twin(const float* z, size_t n);
  void made_only_twin(const float* z, size_t n);
  std::optional<GradUse> take_grad_use(const float* dx);
  bool take_grad_use(const float* dx, std::initializer_list<GradUse> uses);
  bool relu_pool_input(const float* a) const;
  const void* pre_act_twin(const float* a, size_t n, const float** bias) const;
  const void* only_copy(const float* p, size_t n) const;
  void floats_of(const float* p, size_t n);
  const void* as_bf16(const float* p, size_t n, Scratch& fallback);
  // graph.cpp
  bool capturing() const;
  // resnet_ops.cpp
  double* bn_partial(int64_t rows, int c);
  void residual_mask(float* d, cuda::Operand din, const float* y, float* keep, size_t n, bool write_d,
                     bool d16_only);
  template <class Run>
  void bn_forward_with(const float* x, float* y, int64_t rows, int c, float* save_mean, float* save_invstd,
                       float* running_mean, float* running_var, bool relu, Run&& run);
  template <class Run>
  void bn_backward_with(const float* dy, const float* x, float* dx, int64_t rows, int c, const float* relu_out,
                        Run&& run);
  float* bn_coef(int c);
  void* out_twin(const float* y, size_t n, bool relu, bool& only);
  void wrote_twin(const float* y, size_t n, const void* y16, bool only);
  cuda::BnIn bn_in(const float* x, size_t n) const;

  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's advice for Hopper
  static constexpr int kLtCandidates = 8;  // heuristic results asked for (DPT_LT_ALGO < this)
  static constexpr size_t kIm2colMaxBytes = size_t(1) << 30;  // conv_cols: one layer's columns
  static constexpr int kNarrowMaxChannels = 3;  // narrow_conv: an image's channels (grey or RGB)
  static constexpr int kNarrowMaxCols = 160;  // narrow_conv: c·k·k at most (resnet50's stem: 147)
  static constexpr float kIm2colMarginBf16 = 1.25f;  // im2col_wins: how much faster im2col must time under bf16

  // cuda_backend.cpp
  static int pick_device(const BackendOptions& opt);
  std::string make_description() const;

  // gemm.cpp
  bool gemm(bool ta, bool tb, int m, int n, int k, const void* A, int lda, const void* B,
            int ldb, float* C, int ldc, float beta, const float* bias = nullptr);
  // One cuBLASLt GEMM configuration: everything its plan depends on, the pointers' alignments
  // included (the heuristic otherwise assumes 256 bytes). D is C (same type and layout).
  struct LtSpec {
    int ta = 0, tb = 0, m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
    int beta_nonzero = 0;
    int epi = CUBLASLT_EPILOGUE_DEFAULT;  // DEFAULT, BIAS or RELU_BIAS
    int d_type = CUDA_R_32F;              // fp32, or bf16 (the fused path's activations)
    int bias_type = CUDA_R_32F;           // the bias's type (fp32, or bf16 where cuBLASLt wants it)
    int alA = 256, alB = 256, alC = 256, alBias = 0;
    auto key() const {
      return std::make_tuple(ta, tb, m, n, k, lda, ldb, ldc, beta_nonzero, epi, d_type, bias_type,
                             alA, alB, alC, alBias);
    }
    bool operator<(const LtSpec& o) const { return key() < o.key(); }
  };
  LtSpec spec(bool ta, bool tb, int m, int n, int k, const void* A, int lda, const void* B, int ldb,
              const void* C, int ldc, float beta, int d_type = CUDA_R_32F) const;
  bool lt_matmul(const LtSpec& sp, const void* A, const void* B, void* D, float beta,
                 const void* bias);
  const LtPlan& lt_plan(LtSpec sp, const void* bias);
  void make_lt_plan(LtPlan& pl, const LtSpec& sp, const void* bias);

  // ---- the fused path's state and GEMMs (see mlp_forward) ----
  struct Decision {
    std::vector<char> on, bias16;  // per layer: fused; its bias taken in bf16
  };
  struct Fusion {
    std::vector<LinearArgs> layers;    // the model it was made for
    std::map<int, Decision> by_batch;  // decided on the first (eager) call with a batch size
    const Decision* d = nullptr;       // the current batch's
    Scratch dz16[2];                   // bf16 dz of the current layer and of the one below
    size_t widest = 0;
    int fwd_batch = -1;                // batch of the last mlp_forward (the twins hold it)
  };
  struct FusedGemm {
    LtSpec sp;
    const void* A = nullptr;
    const void* B = nullptr;
    void* D = nullptr;
    const void* bias = nullptr;
  };
  // mlp_fused.cpp
  FusedGemm fused_forward_gemm(const std::vector<LinearArgs>& L, size_t i, const void* B, int batch,
                               bool bias16);
  FusedGemm fused_backward_gemm(const std::vector<LinearArgs>& L, size_t i, const void* w16,
                                const void* dz16, void* D, int batch);
  const void* twin_of(const float* a) const;
  Fusion& fusion_for(const float* x, int batch, const std::vector<LinearArgs>& L);

  // gather.cpp
  const Resident& resident(const Dataset& ds);

  // cudnn_conv.cpp
  cudnnHandle_t cudnn();
  ConvPlan& conv_plan(const ConvGeom& g);
  void choose_fwd(ConvPlan& p, const ConvGeom& g, const void* x, const void* w, void* y);
  void choose_data(ConvPlan& p, const ConvGeom& g, const void* w, const void* dy, void* dx);
  void choose_filter(ConvPlan& p, const ConvGeom& g, const void* x, const void* dy);
  void* conv_workspace(size_t bytes);
  void say_conv_plan(ConvPlan& p, const ConvGeom& g);
  // cudnn_engines.cpp: the direction's graph-API plan run on (x, w, y) — fwd: y = conv(x, w);
  // data: x = dgrad(w, y); filter: w = wgrad(x, y) — built and chosen on first use; false, with
  // nothing enqueued, where none is usable (not bf16, DPT_CUDNN_GRAPH=0, first met while a
  // step is being captured, no engine, a pointer less aligned than the plan assumes).
  bool run_conv_engine(ConvPlan& p, ConvDir dir, const ConvGeom& g, const void* x, const void* w, const void* y);
  void build_conv_engine(ConvEngine& e, ConvDir dir, const ConvGeom& g, const void* x, const void* w, const void* y);
  bool im2col_chosen(const ConvGeom& g, bool input_grad);
  bool im2col_wins(const ConvGeom& g, bool input_grad);
  const char* conv_api_lacks(const ConvGeom& g, bool input_grad);

  Precision precision_;
  int dev_ = 0;
  std::string describe_;
  // Declaration order is destruction order reversed: streams outlive everything that uses them.
  Stream stream_, comm_;
  Event to_side_, to_main_;  // side_wait / main_wait
  bool side_ = false;        // lane-aware ops go to the comm stream
  DevPtr workspace_;
  Blas blas_;
  LtHandle lt_;  // null when DPT_CUBLASLT=0
  bool use_lt_ = false;
  int lt_algo_index_ = 0;
  std::map<LtSpec, std::unique_ptr<LtPlan>> lt_plans_;  // destroyed before lt_ (declared after)
  std::unique_ptr<UploadRing> ring_;
  std::unique_ptr<BatchStream> stream_batches_;  // made on first use
  bool stream_data_ = false;                     // DPT_STREAM_DATA=1: never keep data resident
  BatchStream& batch_stream();                    // made on first use (gather.cpp)
  Scratch bf16_a_, bf16_b_, bf16_c_, bf16_dz_, partial_, row_loss_, row_ok_, flag_, rows_;
  bool fuse_ = true;                             // DPT_LT_FUSE (default 1): ReLU epilogues
  int last_fused_ = 0;                           // hidden layers fused in the last mlp_forward
  bool fusion_said_ = false;                     // the fused path's start-up line was logged
  std::map<const float*, Fusion> fusions_;       // per model, keyed by its logits buffer
  Scratch layer_partial_;  // LARS/LAMB: per-block partial sums of squares
  Scratch bn_partial_;  // batch norm's sums: per-block partial sums (double)
  Scratch bn_coef_;     // batch norm's per-channel coefficients of the vector passes
  Scratch xent_loss_, xent_ok_;  // softmax_xent_smoothed: per-row loss (double) and hit
  Scratch tposed_x_, tposed_dz_;  // tf32: K-major copies of the weight gradient's operands
  int tf32_transpose_ = 1;        // DPT_TF32_TRANSPOSE: 0 none, 1 the smaller operand, 2 both
  static constexpr int kMaxTransposeRows = 65535 * 32;  // the transpose kernel's grid
  std::map<const Dataset*, Resident> resident_;
  std::unique_ptr<StagedRing> staged_;  // data.read = stream's slots (make_ring)
  std::map<uintptr_t, size_t> allocs_;  // alloc_bytes, alloc_lazy: address -> bytes
  bool lazy_acts_ = true;  // alloc_lazy takes managed memory (else device memory): DPT_LAZY_ACTS, the device
  // cuDNN (cudnn_conv.cpp): its handle, made on the first convolution; plans per shape.
  Cudnn cudnn_;
  bool im2col_convs_ = false;     // DPT_CONV=im2col: convolutions as im2col + cuBLASLt GEMMs
  bool gemm_1x1_ = true;          // DPT_CONV1X1=cudnn: 1x1 stride-1 convs on cuDNN too
  bool conv_heuristic_ = false;   // device.conv_tuning = heuristic
  bool conv_graph_ = true;        // DPT_CUDNN_GRAPH (default 1): bf16 convolutions through cuDNN's graph API
  bool pad_channels_ = true;      // DPT_PAD_CHANNELS (default 1): pads_channels, for measurement
  bool narrow_convs_ = true;      // DPT_NARROW_CONV (default 1): narrow_conv's path
  size_t narrow_chunk_bytes_ = size_t(32) << 20;  // DPT_NARROW_CHUNK_MB: one chunk of its columns
  bool bf16_grads_ = true;        // note_grad_use's hints taken (DPT_BF16_GRADS=0: ignored, to measure)
  bool bf16_acts_ = true;         // note_bf16_readers's hints taken (DPT_BF16_ACTS=0: ignored, to measure)
  size_t conv_ws_limit_ = 0;      // device.conv_workspace_mb
  std::map<std::array<int, 8>, std::unique_ptr<ConvPlan>> conv_plans_;
  std::map<std::array<int, 9>, bool> im2col_choice_;  // conv_cols's choice per shape (im2col_chosen)
  Scratch conv_ws_, conv_y16_, conv_dx16_, conv_dw16_, conv_probe_;
  Scratch pad_x_, pad_w_;  // pads_channels: the padded input and weight (narrow_conv: the weight)
  Scratch narrow_cols_;    // narrow_conv: one chunk of columns
  // The scratch above by name, for say_scratch's line (graph.cpp) when the first capture starts.
  std::vector<std::pair<const char*, const Scratch*>> named_scratch() const;
  void say_scratch();
  bool scratch_said_ = false;
  std::vector<Shadow> shadows_;          // bf16 only
  std::map<const float*, Twin> twins_;   // bf16 only
  std::set<const float*> bn_inputs_;     // note_bn_input's buffers
  std::map<const uint8_t*, const float*> relu_pools_;  // note_relu_pool's: argmax -> the ReLU output
  const float* premasked_ = nullptr;     // pool_backward's input gradient with the ReLU's mask applied
  std::set<const float*> bf16_readers_;   // note_bf16_readers's buffers
  std::map<const float*, GradUse> grad_uses_;  // note_grad_use's hints not yet taken
  std::map<const float*, Deferred> deferred_;  // bn_train_deferred's outputs
  bool defer_bn_ = true;  // DPT_DEFER_BN (default 1): bn_train_deferred defers (0: never, to measure)
};

}  // namespace dpt::cuda_impl
