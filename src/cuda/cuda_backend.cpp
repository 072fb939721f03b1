// CudaBackendImpl's construction (device, streams, cuBLAS and cuBLASLt handles, the environment's
// switches), its side lane and bf16 wire conversions, and make_cuda_backend. The other members are
// defined by concern: gemm, linear, mlp_fused, conv_path, optim_launch, gather, graph, memory and
// bf16_copies (.cpp), declared in backend_impl.hpp.
//
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
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>

#include "backend_impl.hpp"
#include "dpt/cuda_check.hpp"
#include "kernels.cuh"

namespace dpt::cuda_impl {
namespace {

// An environment integer (unset or unparsable: dflt).
int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return end && *end == '\0' ? int(x) : dflt;
}

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

}  // namespace

CudaBackendImpl::CudaBackendImpl(const BackendOptions& opt) : precision_(opt.precision) {
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
  const char* conv = std::getenv("DPT_CONV");
  im2col_convs_ = conv && std::string(conv) == "im2col";
  const char* pw = std::getenv("DPT_CONV1X1");
  gemm_1x1_ = !(pw && std::string(pw) == "cudnn");
  bf16_grads_ = env_int("DPT_BF16_GRADS", 1) != 0;
  bf16_acts_ = env_int("DPT_BF16_ACTS", 1) != 0;
  conv_heuristic_ = opt.conv_heuristic;
  conv_graph_ = env_int("DPT_CUDNN_GRAPH", 1) != 0;
  pad_channels_ = env_int("DPT_PAD_CHANNELS", 1) != 0;
  narrow_convs_ = env_int("DPT_NARROW_CONV", 1) != 0;
  narrow_chunk_bytes_ = size_t(std::max(1, env_int("DPT_NARROW_CHUNK_MB", 32))) << 20;
  defer_bn_ = env_int("DPT_DEFER_BN", 1) != 0;
  // alloc_lazy: managed memory where the device takes it concurrently with the host.
  int concurrent = 0;
  DPT_CHECK_CUDA(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev_));
  lazy_acts_ = concurrent && env_int("DPT_LAZY_ACTS", 1) != 0;
  conv_ws_limit_ = opt.conv_workspace_bytes;
  describe_ = make_description();
}

CudaBackendImpl::~CudaBackendImpl() {
  // Let queued work finish before the members (buffers, handles, streams) go; errors ignored:
  // a destructor must not throw, and a failed run is already being reported.
  cudaSetDevice(dev_);
  if (stream_) cudaStreamSynchronize(stream_.get());
  if (comm_) cudaStreamSynchronize(comm_.get());
}

// ---- the side lane: the communication stream ----
// Updates and the bf16 wire's conversions run there, after the collectives they follow, while
// the compute stream goes on with the backward pass; the two meet only through these events.
void CudaBackendImpl::set_side(bool on) { side_ = on; }

void CudaBackendImpl::side_wait() {
  DPT_CHECK_CUDA(cudaEventRecord(to_side_.get(), stream_.get()));
  DPT_CHECK_CUDA(cudaStreamWaitEvent(comm_.get(), to_side_.get(), 0));
}

void CudaBackendImpl::main_wait() {
  DPT_CHECK_CUDA(cudaEventRecord(to_main_.get(), comm_.get()));
  DPT_CHECK_CUDA(cudaStreamWaitEvent(stream_.get(), to_main_.get(), 0));
}

// ---- bf16 on the wire ----
void CudaBackendImpl::to_bf16(const float* src, uint16_t* dst, size_t n) {
  cuda::to_bf16(src, dst, n, lane());
}

void CudaBackendImpl::from_bf16(const uint16_t* src, float* dst, size_t n, StepCtl* ctl) {
  note_write(dst, n * sizeof(float));
  cuda::from_bf16(src, dst, n, ctl ? &ctl->bad : nullptr, lane());
}

void CudaBackendImpl::synchronize() {
  DPT_CHECK_CUDA(cudaStreamSynchronize(stream_.get()));
  DPT_CHECK_CUDA(cudaStreamSynchronize(comm_.get()));
}

int CudaBackendImpl::pick_device(const BackendOptions& opt) {
  const int gpus = cuda_device_count();
  if (gpus == 0) throw InputError("device.type = cuda, but no CUDA device is visible");
  if (opt.local_rank < gpus) return opt.local_rank;
  if (opt.share_gpus) return opt.local_rank % gpus;
  throw InputError(std::to_string(opt.local_size) + " ranks on this node but only " +
                   std::to_string(gpus) +
                   " GPU(s) visible (CUDA_VISIBLE_DEVICES); start one rank per GPU, or use "
                   "comm.backend = mpi to share GPUs");
}

std::string CudaBackendImpl::make_description() const {
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
     << "; convolutions: "
     << (im2col_convs_ ? std::string("im2col + GEMMs (DPT_CONV=im2col)")
                       : "cuDNN " + version_string(int(cudnnGetVersion()), 10000) + " (algorithms " +
                             (conv_heuristic_ ? "from its heuristic" : "timed") + ")")
     << "; math: " << math_mode(precision_);
  return os.str();
}

}  // namespace dpt::cuda_impl

namespace dpt {

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
  return std::make_unique<cuda_impl::CudaBackendImpl>(opt);
}

}  // namespace dpt
