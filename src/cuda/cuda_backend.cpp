// The CUDA backend: cuBLAS GEMMs plus the kernels of kernels.cu, all enqueued in order on one
// non-blocking compute stream; a second, higher-priority stream is kept for the NCCL transport.
// The host waits only in download(), all_finite(), synchronize(), and when a staging slot must be
// reused.
//
// Math modes (chosen once, reported by describe()):
//   fp32  cublasGemmEx with CUBLAS_COMPUTE_32F: IEEE fp32 products and sums, no TF32 tensor cores.
//   tf32  CUBLAS_COMPUTE_32F_FAST_TF32: fp32 operands rounded to TF32 inside the tensor cores.
//   bf16  GEMM operands are bf16 copies (round to nearest even) of the fp32 data; products
//         accumulate in fp32 and the output is fp32. Parameters, gradients and optimizer state
//         stay fp32 (the master copy). The copies are made once, not per GEMM:
//         - weights: register_parameters(arena) gives the arena a bf16 shadow. optimizer_step(_at)
//           writes it in the same pass as the fp32 update (and skips both when ctl->bad). Any
//           other write into the arena (upload, copy, fill, scale, a NCCL collective through
//           note_device_write) marks it stale; a stale shadow is refreshed whole before its
//           next GEMM, or, for a captured step, eagerly before the graph launch (GraphRunner).
//         - activations: linear_forward's epilogue writes bf16(a) beside a (the "twin" of a),
//           used by the next layer's forward GEMM and its weight-gradient GEMM. Other fp32
//           operands (the input batch, unregistered weights) are converted on first use into
//           their twin and reused until written. Every op notes its outputs (note_write), which
//           drops the twins they overlap; capture of a step starts with all twins dropped, so a
//           graph only uses twins produced inside it. Twins are sized once to the end of the
//           allocation holding their address and never move (a graph may hold them).
//         - dz: linear_backward's single epilogue pass writes dz (fp32, over da), bf16(dz) for
//           both GEMMs and the bias gradient (per-chunk column sums, fixed order).
//         Numerics are those of converting before every GEMM: bf16_rn of the same fp32 values.
// GEMMs go through cuBLASLt (DPT_CUBLASLT=0 in the environment: cublasGemmEx, as before). The
// forward GEMM uses the BIAS epilogue (z = x·Wᵀ + b, one fp32 rounding of acc + b, as the kernel
// did); the activation, a and bf16(a) stay in bias_act_forward, which then only reads z. Plans
// (descriptors + algorithm from cublasLtMatmulAlgoGetHeuristic, 32 MiB workspace, the pointers'
// real alignments) are made on first use and cached, so the captured step only looks them up.
// DPT_LT_ALGO=k takes the k-th heuristic candidate (0..7; default 0) for a sweep on the GPU.
// Falls back per GEMM to the plan without bias (bias not 16-byte aligned) or to cublasGemmEx
// (no candidate for the shape/alignment).
// The whole MLP (mlp_forward / mlp_backward): in bf16, hidden ReLU layers take the RELU_BIAS
// epilogue with a bf16 output and keep their activations in bf16 only; the input gradient GEMM
// writes bf16 too (see "the whole MLP" below, with the epilogues measured and not used: DRELU,
// DRELU_BGRAD, RELU_AUX_BIAS, and every epilogue in TF32). Not used either:
//   - timing the heuristic candidates in the warm-up: not deterministic across runs/ranks.
//
// ---- performance notes (wide MLP 784-4096x4-10, batch 4096, nesterov, one H200) ----
// Non-GEMM device traffic per step (compulsory bytes; E = batch x out, X = batch x in, W = in x out,
// P = 53.6 M parameters), see the arithmetic in the report of 2026-11-30:
//   bf16 before: per GEMM both operands converted (6 B/elem read+write): 9 W and 9 X/E
//                conversions + bias_act 12E + act_backward 12E + bias_grad 4E + optimizer 20P
//                + finite check 4P                                            = 5.34 GB (1.34 ms
//                at 4.0 TB/s; the scalar 2-byte-store kernels likely ran well below that)
//   bf16 after:  forward epilogue 14E (z, a, bf16 a), backward epilogue 14E (da, z -> dz, bf16 dz,
//                column sums), input batch converted once, weights from the shadow (+2P in the
//                optimizer), optimizer 22P + check 4P                        = 3.29 GB (0.82 ms)
//   tf32 before: 3.17 GB (0.79 ms); after (bias_grad fused into act_backward, 16-byte kernels)
//                2.90 GB (0.72 ms).
// Prediction: bf16 3.80 -> 2.8-3.3 ms/step (400-470 model TFLOP/s; GEMMs ~1.9 ms at 650-690);
// tf32 5.27 -> 5.0-5.2 ms (GEMM-bound: 1.32 TFLOP at 356 TFLOP/s is 3.7 ms alone).
// What is left: the interface requires fp32 z, a and dz to be written (8E+4E per hidden layer,
// ~0.8 GB/step) and the optimizer's 22 B/parameter (1.2 GB). Next: cuBLASLt BIAS epilogue so
// the GEMM writes z + b (-4E per layer, ~0.27 GB), and algorithm selection per shape.
// 2026-11-30, cuBLASLt BIAS epilogue (measured before: bf16 2.73 ms, tf32 5.05 ms):
//   forward epilogue 14E -> 10E (reads z, writes a and bf16 a; no z read-modify-write): 4 B x
//   16.8 M x 4 hidden layers = 0.27 GB = 0.067 ms at 4.0 TB/s. Prediction: bf16 2.73 -> ~2.66 ms
//   (~495 TFLOP/s), tf32 5.05 -> ~4.98 ms (~264). Algorithm: candidate 0 is what cublasGemmEx
//   picks, so no change by default; DPT_LT_ALGO sweeps the others.
//   Floor with this interface: bf16 GEMMs 1.29 TFLOP (layer 0 has no dx) at 691 = 1.87 ms +
//   ~3.0 GB of non-GEMM traffic (0.75 ms) = ~2.6 ms (~500 TFLOP/s); 620 needs 2.12 ms, i.e.
//   <= 0.25 ms for everything but GEMMs, less than the optimizer's 1.2 GB alone (0.29 ms).
//   TF32 suspicion (unverified): Hopper's TF32 wgmma takes K-major operands only; the dw GEMM
//   (N,T: x and dz both M/N-major) and the dx GEMM (N,N: w M-major) are not, so cuBLAS runs a
//   transposing or pre-Hopper kernel for 2 of the 3 GEMMs. Check the kernel names with nsys;
//   the remedy would be K-major copies (xᵀ, dzᵀ, wᵀ), ~0.25 ms of traffic per step.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dpt/cuda_backend.hpp"
#include "dpt/cuda_check.hpp"
#include "dpt/data.hpp"
#include "dpt/log.hpp"
#include "conv_kernels.cuh"
#include "kernels.cuh"
#include "layerwise.cuh"

namespace dpt {
namespace {

// ---- RAII for the runtime's handles ----
struct StreamDel { void operator()(cudaStream_t s) const noexcept { cudaStreamDestroy(s); } };
struct EventDel { void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); } };
struct BlasDel { void operator()(cublasHandle_t h) const noexcept { cublasDestroy(h); } };
struct LtDel { void operator()(cublasLtHandle_t h) const noexcept { cublasLtDestroy(h); } };
struct DevDel { void operator()(void* p) const noexcept { cudaFree(p); } };
struct PinnedDel { void operator()(void* p) const noexcept { cudaFreeHost(p); } };
using Stream = std::unique_ptr<CUstream_st, StreamDel>;
using Event = std::unique_ptr<CUevent_st, EventDel>;
using Blas = std::unique_ptr<cublasContext, BlasDel>;
using LtHandle = std::unique_ptr<cublasLtContext, LtDel>;

// An environment integer (unset or unparsable: dflt).
int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return end && *end == '\0' ? int(x) : dflt;
}

// Largest power of two (<= 256) dividing the address; 256 for nullptr.
int ptr_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 1;
  while (al < 256 && (a % uintptr_t(al * 2)) == 0) al *= 2;
  return al;
}

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
using DevPtr = std::unique_ptr<void, DevDel>;
using PinnedPtr = std::unique_ptr<void, PinnedDel>;

DevPtr dev_alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes) DPT_CHECK_CUDA(cudaMalloc(&p, bytes));
  return DevPtr(p);
}

Event make_event() {
  cudaEvent_t e = nullptr;
  DPT_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return Event(e);
}

// A device buffer that grows on demand. The old buffer is retired, not freed: work already queued
// may still read it, and so may a captured step graph (evaluation runs a larger batch between
// replays of a step whose graph holds the old address). Retired buffers go with the backend.
class Scratch {
 public:
  void* get(size_t bytes, cudaStream_t s) {
    (void)s;
    if (bytes > cap_) {
      if (p_) retired_.push_back(std::move(p_));
      cap_ = 0;
      p_ = dev_alloc(bytes);
      cap_ = bytes;
    }
    return p_.get();
  }

 private:
  DevPtr p_;
  size_t cap_ = 0;
  std::vector<DevPtr> retired_;
};

// Host -> device copies through two pinned slots, so upload() returns as soon as the caller's
// bytes are in a slot (the caller may then reuse its buffer) without waiting for the GPU. A slot
// is refilled only after the event recorded behind its previous copy has completed.
class UploadRing {
 public:
  static constexpr size_t kSlotBytes = size_t(4) << 20;
  static constexpr int kSlots = 2;

  UploadRing() {
    for (int k = 0; k < kSlots; ++k) {
      void* p = nullptr;
      DPT_CHECK_CUDA(cudaMallocHost(&p, kSlotBytes));
      host_[k].reset(p);
      done_[k] = make_event();
    }
  }

  void upload(void* dst, const void* src, size_t bytes, cudaStream_t s) {
    for (size_t off = 0; off < bytes; off += kSlotBytes) {
      const size_t len = std::min(kSlotBytes, bytes - off);
      const int k = next_;
      next_ = (next_ + 1) % kSlots;
      DPT_CHECK_CUDA(cudaEventSynchronize(done_[k].get()));  // never-recorded: returns at once
      std::memcpy(host_[k].get(), static_cast<const char*>(src) + off, len);
      DPT_CHECK_CUDA(cudaMemcpyAsync(static_cast<char*>(dst) + off, host_[k].get(), len,
                                     cudaMemcpyHostToDevice, s));
      DPT_CHECK_CUDA(cudaEventRecord(done_[k].get(), s));
    }
  }

 private:
  PinnedPtr host_[kSlots];
  Event done_[kSlots];
  int next_ = 0;
};

// Micro-batches of a dataset that stays in host memory (too large for the device, or
// DPT_STREAM_DATA=1), streamed through two slots: the host copies a micro-batch's rows in their
// stored type (uint8 or float32, 1/4 of the bytes of the converted batch for uint8) into a
// pinned slot, the copy stream moves the slot to a device slot, and the compute stream waits
// for that copy and converts the slot into x and y with the resident path's gather kernel (rows
// 0..count-1 of the slot), so both paths give the same bits. While the GPU computes on one
// micro-batch, the host fills and the copy engine moves the next; the host waits only for the
// copy out of the pinned slot it is about to refill, the copy stream only for the conversion
// out of the device slot it is about to overwrite.
class BatchStream {
 public:
  static constexpr int kSlots = 2;

  BatchStream() {
    cudaStream_t s = nullptr;
    DPT_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    copy_.reset(s);
    for (Slot& sl : slots_) {
      sl.copied = make_event();
      sl.consumed = make_event();
    }
  }
  ~BatchStream() {
    if (copy_) cudaStreamSynchronize(copy_.get());
  }

  void load(const Dataset& ds, const int64_t* rows, int count, float* x, int32_t* y,
            cudaStream_t compute) {
    if (count <= 0) return;
    for (int i = 0; i < count; ++i)
      if (rows[i] < 0 || rows[i] >= ds.n)
        throw Error("load_batch: row " + std::to_string(rows[i]) + " outside [0, " +
                    std::to_string(ds.n) + ") of " + ds.path);
    Slot& sl = slots_[next_];
    next_ = (next_ + 1) % kSlots;
    const size_t row_bytes = size_t(ds.dim) * (ds.is_u8 ? 1 : sizeof(float));
    const size_t feat = size_t(count) * row_bytes;
    const size_t lab_at = (feat + 255) / 256 * 256;
    const size_t bytes = lab_at + size_t(count) * sizeof(int32_t);
    DPT_CHECK_CUDA(cudaEventSynchronize(sl.copied.get()));  // the pinned slot is free again
    if (bytes > sl.cap) {
      DPT_CHECK_CUDA(cudaEventSynchronize(sl.consumed.get()));  // and so is the device slot
      sl.host.reset();
      sl.dev.reset();
      sl.cap = 0;
      void* h = nullptr;
      DPT_CHECK_CUDA(cudaMallocHost(&h, bytes));
      sl.host.reset(h);
      sl.dev = dev_alloc(bytes);
      sl.cap = bytes;
    }
    if (size_t(count) > iota_n_) grow_iota(size_t(count));
    // Rows in use order (data.read = shard) are one run: one copy.
    char* h = static_cast<char*>(sl.host.get());
    const char* src = ds.is_u8 ? reinterpret_cast<const char*>(ds.u8.data())
                               : reinterpret_cast<const char*>(ds.f32.data());
    auto* hl = reinterpret_cast<int32_t*>(h + lab_at);
    for (int i = 0; i < count;) {
      int j = i + 1;
      while (j < count && rows[j] == rows[j - 1] + 1) ++j;
      std::memcpy(h + size_t(i) * row_bytes, src + size_t(rows[i]) * row_bytes, size_t(j - i) * row_bytes);
      std::memcpy(hl + i, ds.labels.data() + rows[i], size_t(j - i) * sizeof(int32_t));
      i = j;
    }
    DPT_CHECK_CUDA(cudaStreamWaitEvent(copy_.get(), sl.consumed.get(), 0));
    DPT_CHECK_CUDA(cudaMemcpyAsync(sl.dev.get(), h, bytes, cudaMemcpyHostToDevice, copy_.get()));
    DPT_CHECK_CUDA(cudaEventRecord(sl.copied.get(), copy_.get()));
    DPT_CHECK_CUDA(cudaStreamWaitEvent(compute, sl.copied.get(), 0));
    const char* d = static_cast<const char*>(sl.dev.get());
    cuda::gather_rows(d, ds.is_u8, reinterpret_cast<const int32_t*>(d + lab_at),
                      static_cast<const int64_t*>(iota_.get()), count, ds.dim, ds.scale, ds.offset,
                      x, y, compute);
    DPT_CHECK_CUDA(cudaEventRecord(sl.consumed.get(), compute));
  }

 private:
  struct Slot {
    PinnedPtr host;
    DevPtr dev;
    size_t cap = 0;
    Event copied, consumed;
  };
  void grow_iota(size_t n) {
    for (Slot& sl : slots_) DPT_CHECK_CUDA(cudaEventSynchronize(sl.consumed.get()));
    std::vector<int64_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = int64_t(i);
    iota_ = dev_alloc(n * sizeof(int64_t));
    DPT_CHECK_CUDA(cudaMemcpy(iota_.get(), v.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice));
    iota_n_ = n;
  }
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

const char* math_mode(Precision p) {
  switch (p) {
    case Precision::tf32: return "tf32 (CUBLAS_COMPUTE_32F_FAST_TF32: TF32 tensor cores, fp32 accumulate)";
    case Precision::bf16: return "bf16 (bf16 GEMM operands, fp32 accumulate and output, fp32 master weights; bf16 weight shadow and activation copies)";
    default: return "fp32 (CUBLAS_COMPUTE_32F: IEEE fp32, no TF32)";
  }
}

std::string version_string(int v, int major_div) {  // 13000 -> "13.0"; 130100 -> "13.1.0"
  std::ostringstream os;
  if (major_div == 1000) os << v / 1000 << "." << (v % 1000) / 10;
  else os << v / 10000 << "." << (v / 100) % 100 << "." << v % 100;
  return os.str();
}

class CudaBackendImpl final : public CudaBackend {
 public:
  explicit CudaBackendImpl(const BackendOptions& opt) : precision_(opt.precision) {
    // Select the device before anything else touches CUDA, or every rank would also create a
    // context (and spend memory) on device 0.
    dev_ = pick_device(opt);
    DPT_CHECK_CUDA(cudaSetDevice(dev_));
    // Comm stream at the highest priority: collectives' kernels go first when both are ready,
    // so gradient buckets leave while the backward pass of earlier layers still runs.
    int least = 0, greatest = 0;
    DPT_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s = nullptr;
    DPT_CHECK_CUDA(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, least));
    stream_.reset(s);
    DPT_CHECK_CUDA(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    comm_.reset(s);

    cublasHandle_t h = nullptr;
    DPT_CHECK_CUBLAS(cublasCreate(&h));
    blas_.reset(h);
    DPT_CHECK_CUBLAS(cublasSetStream(h, stream_.get()));
    // After cublasSetStream, which resets the workspace to cuBLAS's default pool.
    workspace_ = dev_alloc(kWorkspaceBytes);
    DPT_CHECK_CUBLAS(cublasSetWorkspace(h, workspace_.get(), kWorkspaceBytes));
    DPT_CHECK_CUBLAS(cublasSetMathMode(h, precision_ == Precision::tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                        : CUBLAS_DEFAULT_MATH));
    // cuBLASLt for every GEMM (the forward one with the bias in its epilogue) unless
    // DPT_CUBLASLT=0; DPT_LT_ALGO=k takes the k-th heuristic candidate (default 0, the first).
    use_lt_ = env_int("DPT_CUBLASLT", 1) != 0;
    lt_algo_index_ = std::max(0, std::min(env_int("DPT_LT_ALGO", 0), kLtCandidates - 1));
    if (use_lt_) {
      cublasLtHandle_t lh = nullptr;
      DPT_CHECK_CUBLAS(cublasLtCreate(&lh));
      lt_.reset(lh);
    }
    ring_ = std::make_unique<UploadRing>();  // pinned memory and events: after cudaSetDevice
    to_side_ = make_event();
    to_main_ = make_event();
    stream_data_ = env_int("DPT_STREAM_DATA", 0) != 0;
    fuse_ = env_int("DPT_LT_FUSE", 1) != 0;
    tf32_transpose_ = std::max(0, std::min(2, env_int("DPT_TF32_TRANSPOSE", 1)));
    describe_ = make_description();
  }

  ~CudaBackendImpl() override {
    // Let queued work finish before the members (buffers, handles, streams) go; errors ignored:
    // a destructor must not throw, and a failed run is already being reported.
    cudaSetDevice(dev_);
    if (stream_) cudaStreamSynchronize(stream_.get());
    if (comm_) cudaStreamSynchronize(comm_.get());
  }

  std::string name() const override { return "cuda"; }
  std::string describe() const override { return describe_; }
  bool host_addressable() const override { return false; }
  int device() const override { return dev_; }
  cudaStream_t compute_stream() const override { return stream_.get(); }
  cudaStream_t comm_stream() const override { return comm_.get(); }
  int fused_layers() const override { return last_fused_; }

  // ---- memory ----
  void* alloc_bytes(size_t bytes) override {
    void* p = nullptr;
    if (bytes) DPT_CHECK_CUDA(cudaMalloc(&p, bytes));
    if (p) allocs_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
  }

  // cudaFree waits for the device, so no stream can still be using p afterwards.
  void free_bytes(void* p) noexcept override {
    if (!p) return;
    forget(p);
    const cudaError_t rc = cudaFree(p);
    if (rc != cudaSuccess) {
      cudaGetLastError();
      try { log::warn(std::string("cudaFree failed: ") + cudaGetErrorString(rc)); } catch (...) {}
    }
  }

  void upload(void* dst, const void* src, size_t bytes) override {
    note_write(dst, bytes);
    ring_->upload(dst, src, bytes, stream_.get());
  }

  // Ordered after everything on the compute stream. A collective's result is covered once
  // Comm::synchronize() has made the compute stream wait for the comm stream.
  void download(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    DPT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_.get()));
    DPT_CHECK_CUDA(cudaStreamSynchronize(stream_.get()));
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    note_write(dst, bytes);
    DPT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_.get()));
  }

  void fill(float* p, size_t n, float v) override {
    note_write(p, n * sizeof(float));
    cuda::fill(p, n, v, lane());
  }
  void scale(float* p, size_t n, float a) override {
    note_write(p, n * sizeof(float));
    cuda::scale(p, n, a, stream_.get());
  }

  void register_parameters(float* p, size_t n) override {
    if (precision_ != Precision::bf16 || !p || n == 0) return;
    for (auto it = shadows_.begin(); it != shadows_.end();)
      it = overlaps(it->p, it->n * sizeof(float), p, n * sizeof(float)) ? shadows_.erase(it) : it + 1;
    Shadow sh;
    sh.p = p;
    sh.n = n;
    sh.w16 = dev_alloc(n * 2);
    sh.dirty = true;  // filled from the fp32 arena before its first use
    shadows_.push_back(std::move(sh));
  }

  void note_device_write(const void* p, size_t bytes) override { note_write(p, bytes); }

  // ---- the side lane: the communication stream ----
  // Updates and the bf16 wire's conversions run there, after the collectives they follow, while
  // the compute stream goes on with the backward pass; the two meet only through these events.
  void set_side(bool on) override { side_ = on; }
  void side_wait() override {
    DPT_CHECK_CUDA(cudaEventRecord(to_side_.get(), stream_.get()));
    DPT_CHECK_CUDA(cudaStreamWaitEvent(comm_.get(), to_side_.get(), 0));
  }
  void main_wait() override {
    DPT_CHECK_CUDA(cudaEventRecord(to_main_.get(), comm_.get()));
    DPT_CHECK_CUDA(cudaStreamWaitEvent(stream_.get(), to_main_.get(), 0));
  }

  uint16_t* param_shadow(const float* p, size_t n) override {
    for (Shadow& sh : shadows_)
      if (p >= sh.p && p + n <= sh.p + sh.n) return static_cast<uint16_t*>(sh.w16.get()) + (p - sh.p);
    return nullptr;
  }
  // Written by an all-gather of the shadow itself: nothing derived from it to drop, and it must
  // not be refreshed from the fp32 arena (stale there outside this rank's shards).
  void note_shadow_write(const float* p, size_t n) override { (void)p; (void)n; }

  void to_bf16(const float* src, uint16_t* dst, size_t n) override {
    cuda::to_bf16(src, dst, n, lane());
  }
  void from_bf16(const uint16_t* src, float* dst, size_t n, StepCtl* ctl) override {
    note_write(dst, n * sizeof(float));
    cuda::from_bf16(src, dst, n, ctl ? &ctl->bad : nullptr, lane());
  }

  void synchronize() override {
    DPT_CHECK_CUDA(cudaStreamSynchronize(stream_.get()));
    DPT_CHECK_CUDA(cudaStreamSynchronize(comm_.get()));
  }

  // ---- the MLP ----
  // Row-major (r, c) is column-major (c, r) to cuBLAS, so every product is written transposed:
  //   z (batch,out)  : Zᶜ (out×batch)  = Wᶜᵀ·Xᶜ  with Wᶜ = w as (in×out), Xᶜ = x as (in×batch)
  //   dw (out,in)    : dWᶜ (in×out)    = Xᶜ·dZᶜᵀ  with dZᶜ = dz as (out×batch)
  //   dx (batch,in)  : dXᶜ (in×batch)  = Wᶜ·dZᶜ
  void linear_forward(const float* x, const float* w, const float* b, float* z, float* a,
                      int batch, int in, int out, Act act) override {
    linear_fwd(x, w, b, z, a, batch, in, out, act, true);
  }

  // a16_twin: bf16 also writes bf16(a) for the next GEMMs (a conv's output goes to pooling or
  // im2col instead, which read fp32).
  void linear_fwd(const float* x, const float* w, const float* b, float* z, float* a, int batch,
                  int in, int out, Act act, bool a16_twin) {
    cudaStream_t s = stream_.get();
    const size_t n = size_t(batch) * size_t(out);
    // With cuBLASLt the GEMM's epilogue adds the bias (z = x·Wᵀ + b written once), and the
    // kernel below only reads z; otherwise the kernel adds b to z in place.
    bool biased = false;
    if (bf16()) {
      const void* w16 = as_bf16(w, size_t(out) * size_t(in), bf16_a_);
      const void* x16 = as_bf16(x, size_t(batch) * size_t(in), bf16_b_);
      biased = gemm(true, false, out, batch, in, w16, in, x16, in, z, out, 0.f, b);
    } else {
      biased = gemm(true, false, out, batch, in, w, in, x, in, z, out, 0.f, b);
    }
    note_write(z, n * sizeof(float));
    note_write(a, n * sizeof(float));
    // bf16: the epilogue also writes bf16(a), the operand of the next layer's forward GEMM and of
    // that layer's weight-gradient GEMM.
    void* a16 = bf16() && a16_twin ? twin_slot(a, n) : nullptr;
    cuda::bias_act_forward(z, a, biased ? nullptr : b, batch, out, act, s, a16);
    if (a16) twins_[a].valid = n;
  }

  // One pass computes dz (over da), bf16(dz) for both GEMMs (bf16) and the bias gradient.
  void linear_backward(const float* x, const float* w, const float* z, const float* a, float* da,
                       int batch, int in, int out, Act act, float* dw, float* db, float* dx,
                       bool accumulate) override {
    cudaStream_t s = stream_.get();
    const size_t n = size_t(batch) * size_t(out);
    const float beta = accumulate ? 1.f : 0.f;
    // The operands' bf16 copies are looked up before the outputs' notes drop any copy they hit.
    const void* x16 = bf16() ? as_bf16(x, size_t(batch) * size_t(in), bf16_b_) : nullptr;
    const void* w16 = bf16() && dx ? as_bf16(w, size_t(out) * size_t(in), bf16_a_) : nullptr;
    note_write(da, n * sizeof(float));
    note_write(dw, size_t(out) * size_t(in) * sizeof(float));
    note_write(db, size_t(out) * sizeof(float));
    if (dx) note_write(dx, size_t(batch) * size_t(in) * sizeof(float));
    float* partial = bgrad_partial(batch, out);
    void* dz16 = bf16() ? bf16_dz_.get(std::max<size_t>(1, n) * 2, s) : nullptr;
    cuda::act_backward_bgrad(da, z, a, batch, out, act, db, accumulate, partial, dz16, s);
    weight_grad(x, x16, da, dz16, batch, in, out, dw, beta);
    if (dx) gemm(false, false, in, batch, out, bf16() ? w16 : static_cast<const void*>(w), in,
                 bf16() ? dz16 : static_cast<const void*>(da), out, dx, in, 0.f);
  }

  // Scratch for the per-chunk column sums of a backward pass over (batch, out).
  float* bgrad_partial(int batch, int out) {
    const size_t n = std::max<size_t>(1, cuda::act_bgrad_partial_floats(batch, out));
    return static_cast<float*>(partial_.get(n * sizeof(float), stream_.get()));
  }

  // The weight gradient dw (out,in) = dzᵀ·x as one GEMM's operands (C = dwᶜ, in×out), made once
  // per layer so that row pieces of dw can be computed one by one (wgrad_rows).
  struct Wgrad {
    bool ta = false, tb = true;
    const void* A = nullptr;
    const void* B = nullptr;
    int lda = 0, ldb = 0;
    size_t esz = 4;  // bytes per element of B
  };

  // bf16 from x16 and dz16, else from x and dz.
  Wgrad wgrad_ops(const float* x, const void* x16, const float* dz, const void* dz16, int batch,
                  int in, int out) {
    cudaStream_t s = stream_.get();
    Wgrad w;
    if (bf16()) {
      w.A = x16; w.lda = in; w.B = dz16; w.ldb = out; w.esz = 2;
    } else if (precision_ == Precision::tf32 && tf32_transpose_ > 0 && batch <= kMaxTransposeRows) {
      // The weight gradient's operands x and dz both run along the batch, its K, so neither is
      // K-major, and Hopper's tensor cores read TF32 operands K-major only: cuBLAS's product
      // runs at 245 TFLOP/s for 4096³ as stored, 350 with one operand transposed first, 373 with
      // both (bench/gemm_layouts.py on the H200). DPT_TF32_TRANSPOSE = 1 (default) transposes the
      // smaller of x and dz, 2 both, 0 neither; the wide MLP's step: 4.53 ms, 4.70, 4.94.
      const bool tx = tf32_transpose_ == 2 || in <= out, td = tf32_transpose_ == 2 || !tx;
      float* xt = tx ? static_cast<float*>(tposed_x_.get(size_t(batch) * size_t(in) * sizeof(float), s)) : nullptr;
      float* dt = td ? static_cast<float*>(tposed_dz_.get(size_t(batch) * size_t(out) * sizeof(float), s)) : nullptr;
      if (tx) cuda::transpose(x, batch, in, xt, s);
      if (td) cuda::transpose(dz, batch, out, dt, s);
      w.ta = tx; w.tb = !td;
      w.A = tx ? static_cast<const void*>(xt) : x; w.lda = tx ? batch : in;
      w.B = td ? static_cast<const void*>(dt) : dz; w.ldb = td ? batch : out;
    } else {
      w.A = x; w.lda = in; w.B = dz; w.ldb = out;
    }
    return w;
  }

  // Rows [r0, r1) of dw (+ dw there when beta == 1).
  void wgrad_rows(const Wgrad& w, int batch, int in, int r0, int r1, float* dw, float beta) {
    const size_t boff = (w.tb ? size_t(r0) : size_t(r0) * size_t(w.ldb)) * w.esz;
    gemm(w.ta, w.tb, in, r1 - r0, batch, w.A, w.lda, static_cast<const char*>(w.B) + boff, w.ldb,
         dw + size_t(r0) * size_t(in), in, beta);
  }

  void weight_grad(const float* x, const void* x16, const float* dz, const void* dz16, int batch,
                   int in, int out, float* dw, float beta) {
    wgrad_rows(wgrad_ops(x, x16, dz, dz16, batch, in, out), batch, in, 0, out, dw, beta);
  }

  // ---- the whole MLP: bf16 hidden ReLU activations that never exist in fp32 ----
  // With precision bf16, a hidden ReLU layer i is "fused" (when cuBLASLt plans both GEMMs below):
  //   forward   the GEMM's RELU_BIAS epilogue writes a = bf16(relu(x·Wᵀ + b)) straight into the
  //             twin of a; neither z nor the fp32 a is written (the twin is the activation's only
  //             copy: the next layer's forward GEMM and this layer's weight gradient read it).
  //   backward  layer i+1's input-gradient GEMM writes bf16(da) (bf16 output, not fp32), and one
  //             kernel pass turns it into bf16(dz) = bf16(da)·[a > 0] in place and sums the bias
  //             gradient (relu_backward_bgrad_bf16).
  // Numbers: a and dz are the bits of the per-layer path (bf16 of the same fp32 values; a > 0
  // exactly where z > 0), except that cuBLASLt takes the bias in bf16 when its output is bf16
  // (no fp32 bias is offered with a bf16 D: the bias enters rounded like the weights, as under
  // torch.autocast) and the bias gradient is summed over bf16(dz) instead of the fp32 dz.
  // Per fused 4096-wide layer at batch 4096 this drops 22 of the 32 bytes per activation element
  // that the per-layer path moves outside the GEMMs (fp32 z written and read, fp32 a written,
  // fp32 da written and read, dz rewritten) and the GEMMs write half the bytes.
  // Not used, measured (bench-lt-epilogues, H200, cuBLAS 13.1, 4096³): RELU_AUX_BIAS (+5% on the
  // forward GEMM) with DRELU_BGRAD on the input gradient, which would also drop the kernel pass:
  // DRELU(_BGRAD) GEMMs run at 0.28 ms against 0.17 ms plain, more than the pass they save, and
  // DRELU_BGRAD's bias gradient with a bf16 output is bf16-summed (2.3% off the fp32 sum). In
  // TF32 every epilogue but BIAS costs more than it saves (RELU_BIAS 0.37 ms against 0.33 ms), so
  // fp32 and tf32 keep the per-layer path. DPT_LT_FUSE=0 turns the bf16 path off.
  void mlp_forward(const float* x, int batch, const std::vector<LinearArgs>& L) override {
    Fusion& f = fusion_for(x, batch, L);
    last_fused_ = 0;
    const float* in = x;
    for (size_t i = 0; i < L.size(); ++i) {
      const LinearArgs& l = L[i];
      if (!f.d->on[i]) {
        linear_forward(in, l.w, l.b, l.z, l.a, batch, l.in, l.out, l.act);
        in = l.a;
        continue;
      }
      const void* B = as_bf16(in, size_t(batch) * size_t(l.in), bf16_b_);
      const FusedGemm g = fused_forward_gemm(L, i, B, batch, f.d->bias16[i] != 0);
      if (!g.D || !lt_matmul(g.sp, g.A, g.B, g.D, 0.f, g.bias))
        throw Error("cuBLASLt refused a GEMM it had planned (fused forward, layer " + std::to_string(i) + ")");
      twins_[l.a].valid = size_t(batch) * size_t(l.out);
      ++last_fused_;
      in = l.a;
    }
    f.fwd_batch = batch;
  }

  // Layer by layer from the last: the bias gradient with dz (one pass), the weight gradient (in
  // row pieces when asked, each reported final as soon as it is enqueued, so its reduction
  // starts while the next piece is computed), then the input gradient, after which the layer's
  // parameters are reported released. Fused layers (bf16 ReLU) keep dz in bf16 only.
  void mlp_backward(const float* x, int batch, const std::vector<LinearArgs>& L, float* d0, float* d1,
                    bool accumulate, const PassHooks& hooks, float* dx0) override {
    Fusion& f = fusion_for(x, batch, L);
    const std::vector<char>& on = f.d->on;
    if (std::find(on.begin(), on.end(), 1) != on.end() && f.fwd_batch != batch)
      throw Error("mlp_backward: the last mlp_forward of these layers ran another batch size");
    // d0 holds dLoss/dlogits; each layer's bf16 dz (bf16 precision) is in dz16[cur].
    cudaStream_t s = stream_.get();
    const float beta = accumulate ? 1.f : 0.f;
    float* d[2] = {d0, d1};
    int cur = 0;
    const size_t dzb = std::max<size_t>(1, size_t(batch) * f.widest) * 2;
    for (int i = int(L.size()) - 1; i >= 0; --i) {
      const LinearArgs& l = L[size_t(i)];
      const size_t n = size_t(batch) * size_t(l.out), nw = size_t(l.out) * size_t(l.in);
      const float* xin = i == 0 ? x : L[size_t(i) - 1].a;
      const void* x16 = bf16() ? as_bf16(xin, size_t(batch) * size_t(l.in), bf16_b_) : nullptr;
      const bool want_dx = i > 0 || dx0;
      const void* w16 = bf16() && want_dx ? as_bf16(l.w, nw, bf16_a_) : nullptr;
      void* dz16 = bf16() ? f.dz16[cur].get(dzb, s) : nullptr;
      note_write(l.dw, nw * sizeof(float));
      note_write(l.db, size_t(l.out) * sizeof(float));
      float* partial = bgrad_partial(batch, l.out);
      if (!on[size_t(i)]) {
        // d[cur] holds dLoss/da in fp32 (the logits' gradient, or the input gradient of the
        // layer above when that one is not fused): dz (over it), bf16 dz and db in one pass.
        note_write(d[cur], n * sizeof(float));
        cuda::act_backward_bgrad(d[cur], l.z, l.a, batch, l.out, l.act, l.db, accumulate, partial, dz16, s);
      } else {
        // dz16 holds bf16(da) from the layer above's input-gradient GEMM.
        cuda::relu_backward_bgrad_bf16(dz16, twin_of(l.a), batch, l.out, l.db, accumulate, partial, s);
      }
      if (hooks.grads_final) hooks.grads_final(l.b_at, l.b_at + size_t(l.out));
      const Wgrad wg = wgrad_ops(xin, x16, d[cur], dz16, batch, l.in, l.out);
      const int rows = l.piece_rows > 0 ? l.piece_rows : l.out;
      for (int r0 = 0; r0 < l.out; r0 += rows) {
        const int r1 = std::min(l.out, r0 + rows);
        wgrad_rows(wg, batch, l.in, r0, r1, l.dw, beta);
        if (hooks.grads_final) hooks.grads_final(l.w_at + size_t(r0) * size_t(l.in), l.w_at + size_t(r1) * size_t(l.in));
      }
      if (want_dx) {
        if (i > 0 && on[size_t(i) - 1]) {
          const FusedGemm g = fused_backward_gemm(L, size_t(i), w16, dz16, f.dz16[1 - cur].get(dzb, s), batch);
          if (!lt_matmul(g.sp, g.A, g.B, g.D, 0.f, nullptr))
            throw Error("cuBLASLt refused a GEMM it had planned (bf16 input gradient, layer " + std::to_string(i) + ")");
        } else {
          float* dx = i > 0 ? d[1 - cur] : dx0;  // dx0: the input gradient of a run inside a model
          note_write(dx, size_t(batch) * size_t(l.in) * sizeof(float));
          gemm(false, false, l.in, batch, l.out, bf16() ? w16 : static_cast<const void*>(l.w), l.in,
               bf16() ? dz16 : static_cast<const void*>(d[cur]), l.out, dx, l.in, 0.f);
        }
      }
      if (hooks.params_released) {
        hooks.params_released(l.w_at, l.w_at + nw);
        hooks.params_released(l.b_at, l.b_at + size_t(l.out));
      }
      cur = 1 - cur;
    }
  }

  // ---- convolutional networks: conv.cu's kernels; the GEMMs are linear_forward/backward's ----
  void im2col(const float* x, const ConvGeom& g, float* cols) override {
    note_write(cols, size_t(g.rows()) * size_t(g.cols()) * sizeof(float));
    cuda::im2col(x, g, cols, false, stream_.get());
  }
  // bf16: the columns go straight into the bf16 twin of cols (never written in fp32), which
  // linear_forward and then conv_backward's linear_backward take as their input operand.
  void conv_forward(const float* x, const float* w, const float* b, float* cols, float* z, float* a,
                    const ConvGeom& g, Act act) override {
    const size_t n = size_t(g.rows()) * size_t(g.cols());
    void* c16 = bf16() ? twin_slot(cols, n) : nullptr;
    if (!c16) {
      Backend::conv_forward(x, w, b, cols, z, a, g, act);
      return;
    }
    note_write(cols, n * sizeof(float));
    cuda::im2col(x, g, c16, true, stream_.get());
    twins_[cols].valid = n;
    linear_fwd(cols, w, b, z, a, g.rows(), g.cols(), g.out, act, false);
  }
  void col2im(const float* dcols, const ConvGeom& g, float* dx) override {
    note_write(dx, size_t(g.batch) * g.h * g.w * g.c * sizeof(float));
    cuda::col2im(dcols, g, dx, stream_.get());
  }
  void pool_forward(const float* x, float* y, int32_t* argmax, const PoolGeom& g, bool max) override {
    const size_t n = size_t(g.batch) * g.oh() * g.ow() * g.c;
    note_write(y, n * sizeof(float));
    if (max) note_write(argmax, n * sizeof(int32_t));
    cuda::pool_forward(x, y, argmax, g, max, stream_.get());
  }
  void pool_backward(const float* dy, const int32_t* argmax, float* dx, const PoolGeom& g,
                     bool max) override {
    note_write(dx, size_t(g.batch) * g.h * g.w * g.c * sizeof(float));
    cuda::pool_backward(dy, argmax, dx, g, max, stream_.get());
  }
  void act_forward(const float* z, float* a, size_t n, Act act) override {
    note_write(a, n * sizeof(float));
    cuda::act_forward(z, a, n, act, stream_.get());
  }
  void act_backward(float* da, const float* z, const float* a, size_t n, Act act) override {
    note_write(da, n * sizeof(float));
    cuda::act_backward(da, z, a, n, act, stream_.get());
  }
  void nhwc_to_nchw(const float* src, float* dst, int batch, int c, int hw) override {
    note_write(dst, size_t(batch) * c * hw * sizeof(float));
    cuda::batched_transpose(src, dst, batch, hw, c, stream_.get());
  }
  void nchw_to_nhwc(const float* src, float* dst, int batch, int c, int hw) override {
    note_write(dst, size_t(batch) * c * hw * sizeof(float));
    cuda::batched_transpose(src, dst, batch, c, hw, stream_.get());
  }
  void dropout(const float* x, float* y, int batch, const DropoutArgs& d, const StepCtl* ctl) override {
    note_write(y, size_t(batch) * d.c * d.h * d.w * sizeof(float));
    cuda::dropout(x, y, batch, d, ctl, stream_.get());
  }
  void augment(const float* x, float* y, int batch, int c, int h, int w, int pad,
               const int32_t* draws, const StepCtl* ctl, int64_t offset) override {
    note_write(y, size_t(batch) * c * h * w * sizeof(float));
    cuda::augment(x, y, batch, c, h, w, pad, draws, ctl, offset, stream_.get());
  }

  void softmax_xent(const float* logits, const int32_t* labels, int batch, int classes,
                    float grad_scale, float* dlogits, float* stats) override {
    cudaStream_t s = stream_.get();
    auto* row_loss = static_cast<float*>(row_loss_.get(size_t(batch) * sizeof(float), s));
    auto* row_ok = static_cast<int*>(row_ok_.get(size_t(batch) * sizeof(int), s));
    if (dlogits) note_write(dlogits, size_t(batch) * size_t(classes) * sizeof(float));
    if (stats) note_write(stats, 2 * sizeof(float));
    cuda::softmax_xent(logits, labels, batch, classes, grad_scale, dlogits, row_loss, row_ok,
                       stats, s);
  }

  // ---- the optimizer ----
  void optimizer_step(float* p, const float* g, float* s1, float* s2, size_t n,
                      const OptimStep& h) override {
    void* p16 = note_update(p, s1, s2, n);
    cuda::optimizer_step(p, g, s1, s2, n, h, stream_.get(), nullptr, nullptr, p16);
  }

  // LARS and LAMB: the two passes of layerwise.cu; LAMB's sums pass writes the moments.
  void layer_sums(const float* p, const float* g, float* s1, float* s2, size_t lo, size_t n,
                  const std::vector<TensorSeg>& segs, const OptimStep& h, const float* lr_table,
                  const StepCtl* ctl, float* sums) override {
    cudaStream_t s = stream_.get();
    if (h.kind == OptKind::lamb) {
      note_write(s1, n * sizeof(float));
      note_write(s2, n * sizeof(float));
    }
    note_write(sums, 2 * segs.size() * sizeof(float));
    auto* partial = static_cast<float*>(layer_partial_.get(cuda::layer_partial_floats(segs, lo, n) * sizeof(float), s));
    cuda::layer_sums(p, g, s1, s2, lo, n, segs, h, lr_table, ctl, sums, partial, s);
  }

  void layer_apply(float* p, const float* g, float* s1, float* s2, size_t lo, size_t n,
                   const std::vector<TensorSeg>& segs, const float* sums, const OptimStep& h,
                   const float* lr_table, const StepCtl* ctl) override {
    void* p16 = note_update(p, s1, nullptr, n);
    cuda::layer_apply(p, g, s1, s2, lo, n, segs, sums, h, lr_table, ctl, p16, stream_.get());
  }

  bool all_finite(const float* p, size_t n) override {
    cudaStream_t s = stream_.get();
    int* flag = static_cast<int*>(flag_.get(sizeof(int), s));
    DPT_CHECK_CUDA(cudaMemsetAsync(flag, 0, sizeof(int), s));
    cuda::flag_nonfinite(p, n, flag, s);
    int bad = 0;
    download(&bad, flag, sizeof bad);
    return bad == 0;
  }

  // ---- data ----
  void load_batch(const Dataset& ds, const int64_t* rows, int count, float* x,
                  int32_t* y) override {
    const Resident& r = resident(ds);
    if (!r.fits) {
      note_write(x, size_t(count) * size_t(ds.dim) * sizeof(float));
      note_write(y, size_t(count) * sizeof(int32_t));
      batch_stream().load(ds, rows, count, x, y, stream_.get());
      return;
    }
    for (int i = 0; i < count; ++i)
      if (rows[i] < 0 || rows[i] >= ds.n)
        throw Error("load_batch: row " + std::to_string(rows[i]) + " outside [0, " +
                    std::to_string(ds.n) + ") of " + ds.path);
    cudaStream_t s = stream_.get();
    note_write(x, size_t(count) * size_t(ds.dim) * sizeof(float));
    note_write(y, size_t(count) * sizeof(int32_t));
    auto* drows = static_cast<int64_t*>(rows_.get(size_t(count) * sizeof(int64_t), s));
    upload(drows, rows, size_t(count) * sizeof(int64_t));
    cuda::gather_rows(r.feat.get(), ds.is_u8, static_cast<const int32_t*>(r.labels.get()), drows,
                      count, ds.dim, ds.scale, ds.offset, x, y, s);
  }

  // ---- device-side step control ----
  void load_batch_at(const Dataset& ds, const int64_t* order, const StepCtl* ctl, int64_t offset,
                     int count, float* x, int32_t* y, const int64_t* host_rows) override {
    const Resident& r = resident(ds);
    if (!r.fits) {
      // Streamed from host memory with the rows the host knows (else read back: a sync).
      Backend::load_batch_at(ds, order, ctl, offset, count, x, y, host_rows);
      return;
    }
    note_write(x, size_t(count) * size_t(ds.dim) * sizeof(float));
    note_write(y, size_t(count) * sizeof(int32_t));
    cuda::gather_rows(r.feat.get(), ds.is_u8, static_cast<const int32_t*>(r.labels.get()), order,
                      count, ds.dim, ds.scale, ds.offset, x, y, stream_.get(), ctl, offset);
  }

  void check_finite(const float* g, size_t n, StepCtl* ctl) override {
    cuda::flag_nonfinite(g, n, &ctl->bad, lane());
  }

  void optimizer_step_at(float* p, const float* g, float* s1, float* s2, size_t n,
                         const OptimStep& h, const float* lr_table, StepCtl* ctl, bool flag) override {
    void* p16 = note_update(p, s1, s2, n);
    cuda::optimizer_step(p, g, s1, s2, n, h, lane(), lr_table, ctl, p16, flag ? &ctl->bad : nullptr);
  }

  void end_step(StepCtl* ctl, int64_t global_batch, bool sticky) override {
    cuda::end_step(ctl, global_batch, sticky, stream_.get());
  }

  bool can_capture(const Dataset& ds) override { return resident(ds).fits; }
  void refresh_dataset(const Dataset& ds) override { resident(ds); }

  std::unique_ptr<StepRunner> make_runner(std::function<void()> step, bool capture) override;

  // ---- the step graph's hooks (GraphRunner) ----
  // Before a replay or a capture: refresh stale weight shadows eagerly, outside the graph (the
  // graph was captured with them fresh, and only the optimizer's fused write changes them).
  void refresh_shadows() {
    for (Shadow& sh : shadows_)
      if (sh.dirty) {
        cuda::to_bf16(sh.p, sh.w16.get(), sh.n, stream_.get());
        sh.dirty = false;
      }
  }
  // Capture starts: every activation copy must be produced inside the step to be used there, so
  // that each replay uses the copy its own producer wrote.
  void capture_begin() {
    refresh_shadows();
    for (auto& t : twins_) t.second.valid = 0;
  }
  // Capture ended: true when the captured step leaves a weight shadow stale (a write into the
  // arena other than the optimizer's, after the step's last use); each replay must then mark it.
  bool capture_leaves_stale() const {
    for (const Shadow& sh : shadows_)
      if (sh.dirty) return true;
    return false;
  }
  void mark_shadows_stale() {
    for (Shadow& sh : shadows_) sh.dirty = true;
  }

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
  };

  bool bf16() const { return precision_ == Precision::bf16; }
  // Where the lane-aware ops enqueue (Backend::set_side).
  cudaStream_t lane() const { return side_ ? comm_.get() : stream_.get(); }

  static bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
    const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
    return an && bn && a0 < b0 + bn && b0 < a0 + an;
  }

  // Host-side bookkeeping of a write to [p, p + bytes): copies derived from it are dropped
  // (twins) or marked stale (weight shadows). Every op that writes backend memory calls it for
  // its outputs before it enqueues; the NCCL transport calls note_device_write.
  void note_write(const void* p, size_t bytes) {
    if (!p || bytes == 0) return;
    for (Shadow& sh : shadows_)
      if (overlaps(sh.p, sh.n * sizeof(float), p, bytes)) sh.dirty = true;
    for (auto& t : twins_)
      if (t.second.valid && overlaps(t.first, t.second.valid * sizeof(float), p, bytes))
        t.second.valid = 0;
  }

  // The optimizer writes p, s1, s2. When [p, p + n) lies in a registered arena it also writes the
  // shadow's slice (returned), which then stays as fresh as it was; otherwise the arena is noted.
  void* note_update(float* p, float* s1, float* s2, size_t n) {
    void* p16 = nullptr;
    for (Shadow& sh : shadows_)
      if (p >= sh.p && p + n <= sh.p + sh.n && n)
        p16 = static_cast<uint16_t*>(sh.w16.get()) + (p - sh.p);
    if (p16) {
      for (auto& t : twins_)
        if (t.second.valid && overlaps(t.first, t.second.valid * sizeof(float), p, n * sizeof(float)))
          t.second.valid = 0;
    } else {
      note_write(p, n * sizeof(float));
    }
    if (s1) note_write(s1, n * sizeof(float));
    if (s2) note_write(s2, n * sizeof(float));
    return p16;
  }

  // free_bytes(p): drop what the backend derived from the allocation at p.
  void forget(void* p) noexcept {
    auto it = allocs_.find(reinterpret_cast<uintptr_t>(p));
    if (it == allocs_.end()) return;
    const size_t bytes = it->second;
    allocs_.erase(it);
    for (auto t = twins_.begin(); t != twins_.end();)
      t = overlaps(t->first, 1, p, bytes) ? twins_.erase(t) : std::next(t);
    for (auto sh = shadows_.begin(); sh != shadows_.end();)
      sh = overlaps(sh->p, 1, p, bytes) ? shadows_.erase(sh) : sh + 1;
    for (auto f = fusions_.begin(); f != fusions_.end();)
      f = overlaps(f->first, 1, p, bytes) ? fusions_.erase(f) : std::next(f);
  }

  bool capturing() const {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    DPT_CHECK_CUDA(cudaStreamIsCapturing(stream_.get(), &st));
    return st != cudaStreamCaptureStatusNone;
  }

  // The twin buffer of p for n elements, created on first use (never while a graph is being
  // captured: then nullptr); nullptr where p is not in an allocation of this backend.
  void* twin_slot(const float* p, size_t n) {
    if (n == 0) return nullptr;
    auto it = twins_.find(p);
    if (it == twins_.end()) {
      const auto key = reinterpret_cast<uintptr_t>(p);
      auto al = allocs_.upper_bound(key);
      if (al == allocs_.begin()) return nullptr;
      --al;
      if (key >= al->first + al->second || capturing()) return nullptr;
      Twin t;
      t.cap = (al->first + al->second - key) / sizeof(float);
      t.buf = dev_alloc(t.cap * 2);
      it = twins_.emplace(p, std::move(t)).first;
    }
    return it->second.cap >= n ? it->second.buf.get() : nullptr;
  }

  // The bf16 operand for fp32 data [p, p + n): the weight shadow's slice when p lies in a
  // registered arena (refreshed first if stale); else p's twin when it is valid; else p is
  // converted into its twin (kept for later uses until p is written) or, failing that, into
  // `fallback`.
  const void* as_bf16(const float* p, size_t n, Scratch& fallback) {
    cudaStream_t s = stream_.get();
    for (Shadow& sh : shadows_)
      if (p >= sh.p && p + n <= sh.p + sh.n) {
        if (sh.dirty) {
          cuda::to_bf16(sh.p, sh.w16.get(), sh.n, s);
          sh.dirty = false;
        }
        return static_cast<const uint16_t*>(sh.w16.get()) + (p - sh.p);
      }
    auto it = twins_.find(p);
    if (it != twins_.end() && it->second.valid >= n) return it->second.buf.get();
    if (void* t = twin_slot(p, n)) {
      cuda::to_bf16(p, t, n, s);
      twins_[p].valid = n;
      return t;
    }
    void* f = fallback.get(n * 2, s);
    cuda::to_bf16(p, f, n, s);
    return f;
  }

  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's advice for Hopper
  static constexpr int kLtCandidates = 8;  // heuristic results asked for (DPT_LT_ALGO < this)

  static int pick_device(const BackendOptions& opt) {
    const int gpus = cuda_device_count();
    if (gpus == 0) throw InputError("device.type = cuda, but no CUDA device is visible");
    if (opt.local_rank < gpus) return opt.local_rank;
    if (opt.share_gpus) return opt.local_rank % gpus;
    throw InputError(std::to_string(opt.local_size) + " ranks on this node but only " +
                     std::to_string(gpus) +
                     " GPU(s) visible (CUDA_VISIBLE_DEVICES); start one rank per GPU, or use "
                     "comm.backend = mpi to share GPUs");
  }

  std::string make_description() const {
    cudaDeviceProp prop{};
    DPT_CHECK_CUDA(cudaGetDeviceProperties(&prop, dev_));
    char bus[32] = {0};
    DPT_CHECK_CUDA(cudaDeviceGetPCIBusId(bus, sizeof bus, dev_));
    int rt = 0, drv = 0, blas = 0;
    DPT_CHECK_CUDA(cudaRuntimeGetVersion(&rt));
    DPT_CHECK_CUDA(cudaDriverGetVersion(&drv));
    DPT_CHECK_CUBLAS(cublasGetVersion(blas_.get(), &blas));
    std::ostringstream os;
    os << "cuda: " << prop.name << " (device " << dev_ << ", PCI " << bus << ", "
       << prop.totalGlobalMem / (size_t(1) << 30) << " GiB, " << prop.multiProcessorCount
       << " SMs); CUDA runtime " << version_string(rt, 1000) << ", driver "
       << version_string(drv, 1000) << ", cuBLAS " << version_string(blas, 10000)
       << "; GEMMs: "
       << (!use_lt_ ? "cublasGemmEx (DPT_CUBLASLT=0)"
           : !bf16() ? "cuBLASLt (bias epilogue)"
           : fuse_ ? "cuBLASLt (bias epilogue; hidden ReLU layers: RELU_BIAS epilogue, bf16 activations only)"
                   : "cuBLASLt (bias epilogue; DPT_LT_FUSE=0)")
       << "; math: " << math_mode(precision_);
    return os.str();
  }

  // C (m×n, column-major, ldc) = op(A)·op(B) + beta·C in the backend's precision; A is stored
  // (m×k, or k×m when ta) with leading dimension lda, B (k×n, or n×k when tb) with ldb. A and B
  // are bf16 with precision bf16 (see as_bf16), fp32 otherwise. With bias (m floats, set only
  // with beta == 0) the GEMM may also add bias[i] to row i of C (cuBLASLt's BIAS epilogue, the
  // sum rounded once in fp32 as the separate kernel does): returns true when it did, false when
  // the caller must still add it.
  bool gemm(bool ta, bool tb, int m, int n, int k, const void* A, int lda, const void* B,
            int ldb, float* C, int ldc, float beta, const float* bias = nullptr) {
    if (m == 0 || n == 0) return false;
    const float alpha = 1.f;
    if (use_lt_ && k > 0) {
      // The bias epilogue only for a 16-byte-aligned bias (a misaligned one is added by the
      // kernel); the plain product is the fallback of the biased one.
      const bool with_bias = bias && beta == 0.f && ptr_alignment(bias) >= 16;
      for (int pass = with_bias ? 0 : 1; pass < 2; ++pass) {
        LtSpec sp = spec(ta, tb, m, n, k, A, lda, B, ldb, C, ldc, beta);
        if (pass == 0) sp.epi = CUBLASLT_EPILOGUE_BIAS;
        if (lt_matmul(sp, A, B, C, beta, pass == 0 ? bias : nullptr)) return pass == 0;
      }
    }
    const cudaDataType_t ab = bf16() ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute =
        precision_ == Precision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    DPT_CHECK_CUBLAS(cublasGemmEx(blas_.get(), ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A, ab, lda, B,
                                  ab, ldb, &beta, C, CUDA_R_32F, ldc, compute,
                                  CUBLAS_GEMM_DEFAULT));
    return false;
  }

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

  // The spec of a plain product with fp32 C; operands in the precision's type.
  LtSpec spec(bool ta, bool tb, int m, int n, int k, const void* A, int lda, const void* B, int ldb,
              const void* C, int ldc, float beta, int d_type = CUDA_R_32F) const {
    const int esz = bf16() ? 2 : 4, dsz = d_type == CUDA_R_16BF ? 2 : 4;
    LtSpec sp;
    sp.ta = ta; sp.tb = tb; sp.m = m; sp.n = n; sp.k = k; sp.lda = lda; sp.ldb = ldb; sp.ldc = ldc;
    sp.beta_nonzero = beta != 0.f;
    sp.d_type = d_type;
    sp.alA = std::min(ptr_alignment(A), ptr_alignment(reinterpret_cast<const void*>(uintptr_t(lda) * esz)));
    sp.alB = std::min(ptr_alignment(B), ptr_alignment(reinterpret_cast<const void*>(uintptr_t(ldb) * esz)));
    sp.alC = std::min(ptr_alignment(C), ptr_alignment(reinterpret_cast<const void*>(uintptr_t(ldc) * dsz)));
    return sp;
  }

  // D = op(A)·op(B) (+ beta·D) through the plan of sp with its bias (for a bias epilogue);
  // false, and nothing enqueued, when cuBLASLt offers no algorithm.
  bool lt_matmul(const LtSpec& sp, const void* A, const void* B, void* D, float beta,
                 const void* bias) {
    const LtPlan& pl = lt_plan(sp, bias);
    if (!pl.ok) return false;
    if (bias)
      DPT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias, sizeof bias));
    const float alpha = 1.f;
    DPT_CHECK_CUBLAS(cublasLtMatmul(lt_.get(), pl.op, &alpha, A, pl.a, B, pl.b, &beta, D, pl.c, D,
                                    pl.c, &pl.algo, workspace_.get(), kWorkspaceBytes,
                                    stream_.get()));
    return true;
  }

  // The cuBLASLt plan of one configuration with this bias (its alignment is part of the key),
  // made on first use and cached (the eager warm-up step meets every configuration of the
  // captured step, so capture only looks up). pl.ok: lt_matmul would run.
  const LtPlan& lt_plan(LtSpec sp, const void* bias) {
    sp.alBias = bias ? ptr_alignment(bias) : 0;
    auto it = lt_plans_.find(sp);
    if (it != lt_plans_.end()) return *it->second;
    auto pl = std::make_unique<LtPlan>();
    make_lt_plan(*pl, sp, bias);
    return *lt_plans_.emplace(sp, std::move(pl)).first->second;
  }

  // Fills pl (pl.ok stays false when any step fails or no algorithm fits: the caller's fallback).
  void make_lt_plan(LtPlan& pl, const LtSpec& sp, const void* bias) {
    const cudaDataType_t ab = bf16() ? CUDA_R_16BF : CUDA_R_32F;
    const auto dt = cudaDataType_t(sp.d_type);
    const cublasComputeType_t compute =
        precision_ == Precision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const cublasOperation_t opa = sp.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = sp.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    auto good = [](cublasStatus_t st) { return st == CUBLAS_STATUS_SUCCESS; };
    if (!good(cublasLtMatmulDescCreate(&pl.op, compute, CUDA_R_32F))) return;
    if (!good(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa)) ||
        !good(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb)))
      return;
    if (sp.epi != CUBLASLT_EPILOGUE_DEFAULT) {
      const auto epi = cublasLtEpilogue_t(sp.epi);
      const auto bt = cudaDataType_t(sp.bias_type);
      if (!good(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)))
        return;
      // The heuristic reads the pointer's value for its alignment.
      if (bias && (!good(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt)) ||
                   !good(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias))))
        return;
    }
    if (!good(cublasLtMatrixLayoutCreate(&pl.a, ab, sp.ta ? sp.k : sp.m, sp.ta ? sp.m : sp.k, sp.lda)) ||
        !good(cublasLtMatrixLayoutCreate(&pl.b, ab, sp.tb ? sp.n : sp.k, sp.tb ? sp.k : sp.n, sp.ldb)) ||
        !good(cublasLtMatrixLayoutCreate(&pl.c, dt, sp.m, sp.n, sp.ldc)))
      return;
    cublasLtMatmulPreference_t pref = nullptr;
    if (!good(cublasLtMatmulPreferenceCreate(&pref))) return;
    const uint64_t ws = kWorkspaceBytes;
    const uint32_t a32 = uint32_t(sp.alA), b32 = uint32_t(sp.alB), c32 = uint32_t(sp.alC);
    bool set = good(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) &&
               good(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a32, sizeof a32)) &&
               good(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b32, sizeof b32)) &&
               good(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &c32, sizeof c32)) &&
               good(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &c32, sizeof c32));
    cublasLtMatmulHeuristicResult_t res[kLtCandidates] = {};
    int found = 0;
    if (set && !good(cublasLtMatmulAlgoGetHeuristic(lt_.get(), pl.op, pl.a, pl.b, pl.c, pl.c, pref,
                                                    kLtCandidates, res, &found)))
      found = 0;
    cublasLtMatmulPreferenceDestroy(pref);
    // The requested candidate, else the best one that is there; each must fit the workspace.
    for (int i = std::min(lt_algo_index_, found - 1); i >= 0; --i)
      if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= kWorkspaceBytes) {
        pl.algo = res[i].algo;
        pl.ok = true;
        return;
      }
  }

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

  // Layer i's forward GEMM with RELU_BIAS into the twin of a, input operand B (bf16).
  FusedGemm fused_forward_gemm(const std::vector<LinearArgs>& L, size_t i, const void* B, int batch,
                               bool bias16) {
    const LinearArgs& l = L[i];
    FusedGemm g;
    g.A = as_bf16(l.w, size_t(l.out) * size_t(l.in), bf16_a_);
    g.B = B;
    g.D = twin_slot(l.a, size_t(batch) * size_t(l.out));
    g.bias = bias16 ? as_bf16(l.b, size_t(l.out), bf16_c_) : static_cast<const void*>(l.b);
    g.sp = spec(true, false, l.out, batch, l.in, g.A, l.in, g.B, l.in, g.D, l.out, 0.f, CUDA_R_16BF);
    g.sp.epi = CUBLASLT_EPILOGUE_RELU_BIAS;
    g.sp.bias_type = bias16 ? CUDA_R_16BF : CUDA_R_32F;
    return g;
  }

  // Layer i's input-gradient GEMM with a bf16 output D = bf16(dz_i·W_i), the da of layer i−1.
  FusedGemm fused_backward_gemm(const std::vector<LinearArgs>& L, size_t i, const void* w16,
                                const void* dz16, void* D, int batch) {
    const LinearArgs& l = L[i];
    FusedGemm g;
    g.A = w16;
    g.B = dz16;
    g.D = D;
    g.sp = spec(false, false, l.in, batch, l.out, w16, l.in, dz16, l.out, D, l.in, 0.f, CUDA_R_16BF);
    return g;
  }

  // The bf16 copy of a fused layer's activation (its twin), which the forward pass wrote.
  const void* twin_of(const float* a) const {
    auto it = twins_.find(a);
    if (it == twins_.end() || it->second.valid == 0)
      throw Error("fused bf16 layer: its activation's bf16 copy is missing");
    return it->second.buf.get();
  }

  // The model's fusion state with this batch's decision, taken on first use: which hidden ReLU
  // layers cuBLASLt plans both GEMMs for (bf16 only; an fp32 bias preferred where offered).
  Fusion& fusion_for(const float* x, int batch, const std::vector<LinearArgs>& L) {
    Fusion& f = fusions_[L.back().z];
    auto same = [](const LinearArgs& a, const LinearArgs& b) {
      return a.w == b.w && a.b == b.b && a.dw == b.dw && a.db == b.db && a.z == b.z && a.a == b.a &&
             a.in == b.in && a.out == b.out && a.act == b.act;
    };
    if (!std::equal(L.begin(), L.end(), f.layers.begin(), f.layers.end(), same)) {
      f = Fusion{};
      f.layers = L;
      for (const LinearArgs& l : L) f.widest = std::max({f.widest, size_t(l.in), size_t(l.out)});
    }
    auto it = f.by_batch.find(batch);
    if (it == f.by_batch.end()) {
      Decision d;
      d.on.assign(L.size(), 0);
      d.bias16.assign(L.size(), 0);
      const bool eligible = bf16() && fuse_ && use_lt_ && batch > 0 && L.back().act == Act::none;
      const size_t dzb = std::max<size_t>(1, size_t(batch) * f.widest) * 2;
      for (size_t i = 0; eligible && i + 1 < L.size(); ++i) {
        const LinearArgs& l = L[i];
        if (l.act != Act::relu) continue;
        const void* B = i == 0 ? as_bf16(x, size_t(batch) * size_t(l.in), bf16_b_)
                               : twin_slot(L[i - 1].a, size_t(batch) * size_t(l.in));
        if (!B) continue;
        bool fwd_ok = false;
        for (int b16 = 0; b16 < 2 && !fwd_ok; ++b16) {
          const FusedGemm g = fused_forward_gemm(L, i, B, batch, b16 != 0);
          if (g.D && lt_plan(g.sp, g.bias).ok) {
            fwd_ok = true;
            d.bias16[i] = char(b16);
          }
        }
        const LinearArgs& up = L[i + 1];
        const void* w = as_bf16(up.w, size_t(up.out) * size_t(up.in), bf16_a_);
        const FusedGemm g = fused_backward_gemm(L, i + 1, w, f.dz16[0].get(dzb, stream_.get()),
                                                f.dz16[1].get(dzb, stream_.get()), batch);
        d.on[i] = fwd_ok && lt_plan(g.sp, nullptr).ok;
      }
      if (!fusion_said_ && eligible) {  // said once per backend (a benchmark makes many models)
        int on = 0, b16 = 0, relu = 0;
        for (size_t i = 0; i + 1 < L.size(); ++i) {
          relu += L[i].act == Act::relu;
          on += d.on[i];
          b16 += d.on[i] && d.bias16[i];
        }
        fusion_said_ = relu > 0;
        if (relu)
          log::info("cuda: " + std::to_string(on) + " of " + std::to_string(relu) +
                    " hidden ReLU layers keep bf16 activations only (ReLU in the GEMM's epilogue, bias " +
                    (b16 ? "bf16" : "fp32") + ") at batch " + std::to_string(batch));
      }
      it = f.by_batch.emplace(batch, std::move(d)).first;
    }
    f.d = &it->second;
    return f;
  }

  // The dataset on the device, uploaded on first use when it takes at most half the free
  // memory; otherwise marked !fits and batches are gathered on the host. Keyed by the Dataset's
  // address and re-checked against its host array and size, so a new Dataset at an old address
  // is uploaded afresh.
  const Resident& resident(const Dataset& ds) {
    const void* host = ds.is_u8 ? static_cast<const void*>(ds.u8.data()) : ds.f32.data();
    Resident& r = resident_[&ds];
    const bool same_shape = r.checked && r.n == ds.n && r.dim == ds.dim && r.u8 == ds.is_u8;
    if (same_shape && r.version == ds.version && (ds.version || r.host == host)) return r;
    const size_t feat = size_t(ds.n) * size_t(ds.dim) * (ds.is_u8 ? 1 : 4);
    const size_t lab = size_t(ds.n) * sizeof(int32_t);
    if (same_shape && ds.version && r.fits) {
      // New contents of the same shape (TrainRows' next epoch): copied over the old in stream
      // order, at the same address, so a captured step reads the new rows. A copy from pageable
      // memory returns once the source is staged; the host may then change it.
      cudaStream_t s = stream_.get();
      DPT_CHECK_CUDA(cudaMemcpyAsync(r.feat.get(), host, feat, cudaMemcpyHostToDevice, s));
      DPT_CHECK_CUDA(cudaMemcpyAsync(r.labels.get(), ds.labels.data(), lab, cudaMemcpyHostToDevice, s));
      r.host = host;
      r.version = ds.version;
      return r;
    }
    r = Resident{};
    r.host = host;
    r.version = ds.version;
    r.n = ds.n;
    r.dim = ds.dim;
    r.u8 = ds.is_u8;
    r.checked = true;  // also when an allocation below throws: the next call falls back
    size_t free_b = 0, total_b = 0;
    DPT_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    if (stream_data_ || feat + lab > free_b / 2 || ds.labels.size() != size_t(ds.n)) {
      log::info("dataset " + ds.path + " stays in host memory (" + std::to_string((feat + lab) >> 20) +
                " MiB" + (stream_data_ ? ", DPT_STREAM_DATA=1" : ", more than half the free GPU memory") +
                "); batches stream to the GPU through pinned double buffers on a copy stream");
      return r;
    }
    r.feat = dev_alloc(feat);
    r.labels = dev_alloc(lab);
    cudaStream_t s = stream_.get();
    DPT_CHECK_CUDA(cudaMemcpyAsync(r.feat.get(), host, feat, cudaMemcpyHostToDevice, s));
    DPT_CHECK_CUDA(cudaMemcpyAsync(r.labels.get(), ds.labels.data(), lab, cudaMemcpyHostToDevice, s));
    DPT_CHECK_CUDA(cudaStreamSynchronize(s));
    r.fits = true;
    return r;
  }

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
  BatchStream& batch_stream() {
    if (!stream_batches_) stream_batches_ = std::make_unique<BatchStream>();
    return *stream_batches_;
  }
  Scratch bf16_a_, bf16_b_, bf16_c_, bf16_dz_, partial_, row_loss_, row_ok_, flag_, rows_;
  bool fuse_ = true;                             // DPT_LT_FUSE (default 1): ReLU epilogues
  int last_fused_ = 0;                           // hidden layers fused in the last mlp_forward
  bool fusion_said_ = false;                     // the fused path's start-up line was logged
  std::map<const float*, Fusion> fusions_;       // per model, keyed by its logits buffer
  Scratch layer_partial_;  // LARS/LAMB: per-block partial sums of squares
  Scratch tposed_x_, tposed_dz_;  // tf32: K-major copies of the weight gradient's operands
  int tf32_transpose_ = 1;        // DPT_TF32_TRANSPOSE: 0 none, 1 the smaller operand, 2 both
  static constexpr int kMaxTransposeRows = 65535 * 32;  // the transpose kernel's grid
  std::map<const Dataset*, Resident> resident_;
  std::map<uintptr_t, size_t> allocs_;  // alloc_bytes: address -> bytes
  std::vector<Shadow> shadows_;          // bf16 only
  std::map<const float*, Twin> twins_;   // bf16 only
};

// Runs the step eagerly once (it sizes every scratch buffer and lets NCCL and cuBLAS do their
// lazy set-up), records the second call into a CUDA graph and launches it, then only launches.
// Work captured from other streams (the NCCL transport's comm stream) joins through the events
// the transport records, so the graph holds the overlap of backward and allreduce as well.
class GraphRunner final : public StepRunner {
 public:
  GraphRunner(std::function<void()> step, CudaBackendImpl& be, bool capture)
      : step_(std::move(step)), be_(be), stream_(be.compute_stream()), capture_(capture) {}
  ~GraphRunner() override {
    if (exec_) cudaGraphExecDestroy(exec_);
  }

  void run() override {
    if (exec_) {
      be_.refresh_shadows();  // after writes between replays (upload, broadcast, average)
      DPT_CHECK_CUDA(cudaGraphLaunch(exec_, stream_));
      if (leaves_stale_) be_.mark_shadows_stale();
      return;
    }
    if (!capture_ || calls_++ == 0) {
      step_();
      return;
    }
    cudaGraph_t graph = nullptr;
    be_.capture_begin();
    DPT_CHECK_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      step_();
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      throw;
    }
    DPT_CHECK_CUDA(cudaStreamEndCapture(stream_, &graph));
    leaves_stale_ = be_.capture_leaves_stale();
    const cudaError_t rc = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    DPT_CHECK_CUDA(rc);
    DPT_CHECK_CUDA(cudaGraphLaunch(exec_, stream_));
  }

  bool captured() const override { return exec_ != nullptr; }

 private:
  std::function<void()> step_;
  CudaBackendImpl& be_;
  cudaStream_t stream_;
  bool capture_;
  bool leaves_stale_ = false;
  int calls_ = 0;
  cudaGraphExec_t exec_ = nullptr;
};

std::unique_ptr<StepRunner> CudaBackendImpl::make_runner(std::function<void()> step, bool capture) {
  return std::make_unique<GraphRunner>(std::move(step), *this, capture);
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {  // e.g. cudaErrorNoDevice, cudaErrorInsufficientDriver: no usable GPU
    cudaGetLastError();     // clear the error state so later calls do not report it
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opt) {
  return std::make_unique<CudaBackendImpl>(opt);
}

}  // namespace dpt
