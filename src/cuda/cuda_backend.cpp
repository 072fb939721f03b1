// The CUDA backend: cuBLAS GEMMs plus the kernels of kernels.cu, all enqueued in order on one
// non-blocking compute stream; a second, higher-priority stream is kept for the NCCL transport.
// The host waits only in download(), all_finite(), synchronize(), and when a staging slot or
// scratch buffer must be reused or grown.
//
// Math modes (chosen once, reported by describe()):
//   fp32  cublasGemmEx with CUBLAS_COMPUTE_32F: IEEE fp32 products and sums, no TF32 tensor cores.
//   tf32  CUBLAS_COMPUTE_32F_FAST_TF32: fp32 operands rounded to TF32 inside the tensor cores.
//   bf16  each GEMM's fp32 operands are converted to bf16 scratch copies (round to nearest even)
//         right before it; products accumulate in fp32 and the output is fp32. Parameters,
//         gradients and optimizer state stay fp32 (the master copy).
// cuBLASLt epilogues are not used: bias, activation and their gradients are small fused kernels,
// one extra pass over (batch, out) per layer, simple to check against the CPU backend.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "dpt/cuda_backend.hpp"
#include "dpt/cuda_check.hpp"
#include "dpt/data.hpp"
#include "dpt/log.hpp"
#include "kernels.cuh"

namespace dpt {
namespace {

// ---- RAII for the runtime's handles ----
struct StreamDel { void operator()(cudaStream_t s) const noexcept { cudaStreamDestroy(s); } };
struct EventDel { void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); } };
struct BlasDel { void operator()(cublasHandle_t h) const noexcept { cublasDestroy(h); } };
struct DevDel { void operator()(void* p) const noexcept { cudaFree(p); } };
struct PinnedDel { void operator()(void* p) const noexcept { cudaFreeHost(p); } };
using Stream = std::unique_ptr<CUstream_st, StreamDel>;
using Event = std::unique_ptr<CUevent_st, EventDel>;
using Blas = std::unique_ptr<cublasContext, BlasDel>;
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

// A device buffer that grows on demand. Growing waits for the stream first: work already queued
// may still read the old buffer.
class Scratch {
 public:
  void* get(size_t bytes, cudaStream_t s) {
    if (bytes > cap_) {
      DPT_CHECK_CUDA(cudaStreamSynchronize(s));
      p_.reset();
      cap_ = 0;
      p_ = dev_alloc(bytes);
      cap_ = bytes;
    }
    return p_.get();
  }

 private:
  DevPtr p_;
  size_t cap_ = 0;
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

// A dataset kept in device memory, features in their stored type.
struct Resident {
  const void* host = nullptr;  // the host array it was copied from (detects a reused address)
  int64_t n = 0, dim = 0;
  bool checked = false;        // the decision below has been taken for this dataset
  bool fits = false;           // false: too large, batches are gathered on the host
  DevPtr feat, labels;         // (n, dim) uint8 or float32; (n) int32
};

const char* math_mode(Precision p) {
  switch (p) {
    case Precision::tf32: return "tf32 (CUBLAS_COMPUTE_32F_FAST_TF32: TF32 tensor cores, fp32 accumulate)";
    case Precision::bf16: return "bf16 (bf16 GEMM operands, fp32 accumulate and output, fp32 master weights)";
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
    ring_ = std::make_unique<UploadRing>();  // pinned memory and events: after cudaSetDevice
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

  // ---- memory ----
  void* alloc_bytes(size_t bytes) override {
    void* p = nullptr;
    if (bytes) DPT_CHECK_CUDA(cudaMalloc(&p, bytes));
    return p;
  }

  // cudaFree waits for the device, so no stream can still be using p afterwards.
  void free_bytes(void* p) noexcept override {
    if (!p) return;
    const cudaError_t rc = cudaFree(p);
    if (rc != cudaSuccess) {
      cudaGetLastError();
      try { log::warn(std::string("cudaFree failed: ") + cudaGetErrorString(rc)); } catch (...) {}
    }
  }

  void upload(void* dst, const void* src, size_t bytes) override {
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
    DPT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_.get()));
  }

  void fill(float* p, size_t n, float v) override { cuda::fill(p, n, v, stream_.get()); }
  void scale(float* p, size_t n, float a) override { cuda::scale(p, n, a, stream_.get()); }

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
    gemm(true, false, out, batch, in, w, in, x, in, z, out, 0.f);
    cuda::bias_act_forward(z, a, b, batch, out, act, stream_.get());
  }

  void linear_backward(const float* x, const float* w, const float* z, const float* a, float* da,
                       int batch, int in, int out, Act act, float* dw, float* db, float* dx,
                       bool accumulate) override {
    cudaStream_t s = stream_.get();
    cuda::act_backward(da, z, a, size_t(batch) * size_t(out), act, s);  // da becomes dz
    gemm(false, true, in, out, batch, x, in, da, out, dw, in, accumulate ? 1.f : 0.f);
    cuda::bias_grad(da, db, batch, out, accumulate, s);
    if (dx) gemm(false, false, in, batch, out, w, in, da, out, dx, in, 0.f);
  }

  void softmax_xent(const float* logits, const int32_t* labels, int batch, int classes,
                    float grad_scale, float* dlogits, float* stats) override {
    cudaStream_t s = stream_.get();
    auto* row_loss = static_cast<float*>(row_loss_.get(size_t(batch) * sizeof(float), s));
    auto* row_ok = static_cast<int*>(row_ok_.get(size_t(batch) * sizeof(int), s));
    cuda::softmax_xent(logits, labels, batch, classes, grad_scale, dlogits, row_loss, row_ok,
                       stats, s);
  }

  // ---- the optimizer ----
  void optimizer_step(float* p, const float* g, float* s1, float* s2, size_t n,
                      const OptimStep& h) override {
    cuda::optimizer_step(p, g, s1, s2, n, h, stream_.get());
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
      Backend::load_batch(ds, rows, count, x, y);
      return;
    }
    for (int i = 0; i < count; ++i)
      if (rows[i] < 0 || rows[i] >= ds.n)
        throw Error("load_batch: row " + std::to_string(rows[i]) + " outside [0, " +
                    std::to_string(ds.n) + ") of " + ds.path);
    cudaStream_t s = stream_.get();
    auto* drows = static_cast<int64_t*>(rows_.get(size_t(count) * sizeof(int64_t), s));
    upload(drows, rows, size_t(count) * sizeof(int64_t));
    cuda::gather_rows(r.feat.get(), ds.is_u8, static_cast<const int32_t*>(r.labels.get()), drows,
                      count, ds.dim, ds.scale, ds.offset, x, y, s);
  }

  // ---- device-side step control ----
  void load_batch_at(const Dataset& ds, const int64_t* order, const StepCtl* ctl, int64_t offset,
                     int count, float* x, int32_t* y) override {
    const Resident& r = resident(ds);
    if (!r.fits) {
      Backend::load_batch_at(ds, order, ctl, offset, count, x, y);
      return;
    }
    cuda::gather_rows(r.feat.get(), ds.is_u8, static_cast<const int32_t*>(r.labels.get()), order,
                      count, ds.dim, ds.scale, ds.offset, x, y, stream_.get(), ctl, offset);
  }

  void check_finite(const float* g, size_t n, StepCtl* ctl) override {
    cuda::flag_nonfinite(g, n, &ctl->bad, stream_.get());
  }

  void optimizer_step_at(float* p, const float* g, float* s1, float* s2, size_t n,
                         const OptimStep& h, const float* lr_table, const StepCtl* ctl) override {
    cuda::optimizer_step(p, g, s1, s2, n, h, stream_.get(), lr_table, ctl);
  }

  void end_step(StepCtl* ctl, int64_t global_batch, bool sticky) override {
    cuda::end_step(ctl, global_batch, sticky, stream_.get());
  }

  bool can_capture(const Dataset& ds) override { return resident(ds).fits; }

  std::unique_ptr<StepRunner> make_runner(std::function<void()> step, bool capture) override;

 private:
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's advice for Hopper

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
       << "; math: " << math_mode(precision_);
    return os.str();
  }

  // C (m×n, column-major, ldc) = op(A)·op(B) + beta·C in the backend's precision; A is stored
  // (m×k, or k×m when ta) with leading dimension lda, B (k×n, or n×k when tb) with ldb.
  void gemm(bool ta, bool tb, int m, int n, int k, const float* A, int lda, const float* B,
            int ldb, float* C, int ldc, float beta) {
    if (m == 0 || n == 0) return;
    cudaStream_t s = stream_.get();
    const float alpha = 1.f;
    const void* a = A;
    const void* b = B;
    cudaDataType_t ab = CUDA_R_32F;
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    if (precision_ == Precision::tf32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    if (precision_ == Precision::bf16) {
      // Both scratch copies are reused by the next GEMM; stream order keeps that safe.
      const size_t na = size_t(lda) * size_t(ta ? m : k), nb = size_t(ldb) * size_t(tb ? k : n);
      void* a16 = bf16_a_.get(na * 2, s);
      void* b16 = bf16_b_.get(nb * 2, s);
      cuda::to_bf16(A, a16, na, s);
      cuda::to_bf16(B, b16, nb, s);
      a = a16;
      b = b16;
      ab = CUDA_R_16BF;
    }
    DPT_CHECK_CUBLAS(cublasGemmEx(blas_.get(), ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a, ab, lda, b,
                                  ab, ldb, &beta, C, CUDA_R_32F, ldc, compute,
                                  CUBLAS_GEMM_DEFAULT));
  }

  // The dataset on the device, uploaded on first use when it takes at most half the free
  // memory; otherwise marked !fits and batches are gathered on the host. Keyed by the Dataset's
  // address and re-checked against its host array and size, so a new Dataset at an old address
  // is uploaded afresh.
  const Resident& resident(const Dataset& ds) {
    const void* host = ds.is_u8 ? static_cast<const void*>(ds.u8.data()) : ds.f32.data();
    Resident& r = resident_[&ds];
    if (r.checked && r.host == host && r.n == ds.n && r.dim == ds.dim) return r;
    r = Resident{};
    r.host = host;
    r.n = ds.n;
    r.dim = ds.dim;
    r.checked = true;  // also when an allocation below throws: the next call falls back
    const size_t feat = size_t(ds.n) * size_t(ds.dim) * (ds.is_u8 ? 1 : 4);
    const size_t lab = size_t(ds.n) * sizeof(int32_t);
    size_t free_b = 0, total_b = 0;
    DPT_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    if (feat + lab > free_b / 2 || ds.labels.size() != size_t(ds.n)) {
      log::info("dataset " + ds.path + " stays in host memory (" +
                std::to_string((feat + lab) >> 20) + " MiB); batches are gathered on the host");
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
  DevPtr workspace_;
  Blas blas_;
  std::unique_ptr<UploadRing> ring_;
  Scratch bf16_a_, bf16_b_, row_loss_, row_ok_, flag_, rows_;
  std::map<const Dataset*, Resident> resident_;
};

// Runs the step eagerly once (it sizes every scratch buffer and lets NCCL and cuBLAS do their
// lazy set-up), records the second call into a CUDA graph and launches it, then only launches.
// Work captured from other streams (the NCCL transport's comm stream) joins through the events
// the transport records, so the graph holds the overlap of backward and allreduce as well.
class GraphRunner final : public StepRunner {
 public:
  GraphRunner(std::function<void()> step, cudaStream_t s, bool capture)
      : step_(std::move(step)), stream_(s), capture_(capture) {}
  ~GraphRunner() override {
    if (exec_) cudaGraphExecDestroy(exec_);
  }

  void run() override {
    if (exec_) {
      DPT_CHECK_CUDA(cudaGraphLaunch(exec_, stream_));
      return;
    }
    if (!capture_ || calls_++ == 0) {
      step_();
      return;
    }
    cudaGraph_t graph = nullptr;
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
    const cudaError_t rc = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    DPT_CHECK_CUDA(rc);
    DPT_CHECK_CUDA(cudaGraphLaunch(exec_, stream_));
  }

  bool captured() const override { return exec_ != nullptr; }

 private:
  std::function<void()> step_;
  cudaStream_t stream_;
  bool capture_;
  int calls_ = 0;
  cudaGraphExec_t exec_ = nullptr;
};

std::unique_ptr<StepRunner> CudaBackendImpl::make_runner(std::function<void()> step, bool capture) {
  return std::make_unique<GraphRunner>(std::move(step), stream_.get(), capture);
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
