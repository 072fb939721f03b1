// Convolutions on the CUDA backend through cuDNN 9's convolution API, NHWC throughout: the input
// (batch, h, w, c), the output (batch, oh, ow, out) and the filter (out, k, k, c), which is the
// layout the model's arena already holds, so nothing is transposed.
//
// Precision: fp32 — fp32 data with cuDNN's FMA math (no tensor cores, no TF32) and no FFT or
// Winograd algorithm, whose transforms round differently from a direct sum; tf32 — fp32 data,
// cuDNN's default math (TF32 tensor cores); bf16 — bf16 copies of the input (its twin) and of the
// weights (the arena's shadow), fp32 accumulation, bf16 outputs (cuDNN's BFLOAT16 config, as
// PyTorch's autocast), widened to fp32 where the model keeps fp32: z, dx, and dw (added to the fp32
// gradient). The bias and the activation run in one pass after the convolution (bias_act_forward),
// and backward dz, bf16(dz) and the bias gradient in one pass before it (act_backward_bgrad).
//
// A 1×1 convolution with stride 1 and no padding is a Linear layer over the (batch·h·w, c) pixels
// of its NHWC input: it takes linear.cpp's cuBLASLt GEMMs (with the bias in their epilogue),
// which measured faster than cuDNN's algorithms for ResNet-50's 1×1 shapes on the H200
// (DPT_CONV1X1=cudnn keeps them on cuDNN, to measure).
//
// Algorithms: per shape and direction, chosen the first time the shape runs (the eager first
// step, before the step is captured) and reused: timed by cudnnFind*AlgorithmEx on the real
// buffers (device.conv_tuning = time, like PyTorch's cudnn.benchmark), or cuDNN's heuristic
// (heuristic: no timing, the same choice on every run, so a resumed run repeats the bits of an
// uninterrupted one). Only deterministic algorithms, within device.conv_workspace_mb of
// workspace. A shape first met while a step is being captured takes the heuristic. The choice is
// printed once per shape.
#include <algorithm>
#include <string>

#include "backend_impl.hpp"
#include "cudnn_kernels.cuh"
#include "dpt/cuda_check.hpp"
#include "dpt/log.hpp"
#include "kernels.cuh"

#define DPT_CHECK_CUDNN(call)                                                                           \
  do {                                                                                                  \
    cudnnStatus_t dpt_rc_ = (call);                                                                     \
    if (dpt_rc_ != CUDNN_STATUS_SUCCESS)                                                                \
      ::dpt::throw_call_error("cuDNN", #call, cudnnGetErrorString(dpt_rc_), __FILE__, __LINE__);       \
  } while (0)

namespace dpt::cuda_impl {

ConvPlan::~ConvPlan() {
  if (x) cudnnDestroyTensorDescriptor(x);
  if (y) cudnnDestroyTensorDescriptor(y);
  if (w) cudnnDestroyFilterDescriptor(w);
  for (auto* d : {fwd_desc, data_desc, filter_desc})
    if (d) cudnnDestroyConvolutionDescriptor(d);
}

namespace {

// fp32 keeps to algorithms that sum the products directly (IEEE fp32 like the CPU's GEMMs).
bool fwd_ok(cudnnConvolutionFwdAlgo_t a, bool fp32) {
  return !fp32 || a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}
bool data_ok(cudnnConvolutionBwdDataAlgo_t a, bool fp32) {
  return !fp32 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
}
bool filter_ok(cudnnConvolutionBwdFilterAlgo_t a, bool fp32) {
  return !fp32 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

// The first usable result (cuDNN returns them fastest first): succeeded, deterministic, within
// the workspace limit, allowed for the precision. -1 when none is.
template <class Perf, class Ok> int pick(const Perf* p, int n, size_t limit, Ok ok) {
  for (int i = 0; i < n; ++i)
    if (p[i].status == CUDNN_STATUS_SUCCESS && p[i].determinism == CUDNN_DETERMINISTIC && p[i].memory <= limit &&
        ok(p[i].algo))
      return i;
  return -1;
}

[[noreturn]] void no_algorithm(const char* dir, const ConvGeom& g, size_t limit) {
  throw Error("cuDNN offers no deterministic " + std::string(dir) + " algorithm for the convolution " + g.text() +
              " within " + std::to_string(limit >> 20) + " MB of workspace (device.conv_workspace_mb)");
}

// Keeps cuDNN's first usable result (pick) as the direction's choice, its math type set on the
// direction's convolution descriptor.
template <class Perf, class Algo, class Ok>
void adopt(ConvChoice<Algo>& c, cudnnConvolutionDescriptor_t d, const Perf* perf, int n, bool timed, size_t limit,
           Ok ok, const char* dir, const ConvGeom& g) {
  const int i = pick(perf, n, limit, ok);
  if (i < 0) no_algorithm(dir, g, limit);
  c = {perf[i].algo, perf[i].memory, timed ? perf[i].time : -1.f, true};
  DPT_CHECK_CUDNN(cudnnSetConvolutionMathType(d, perf[i].mathType));
}

}  // namespace

cudnnHandle_t CudaBackendImpl::cudnn() {
  if (!cudnn_) {
    cudnnHandle_t h = nullptr;
    DPT_CHECK_CUDNN(cudnnCreate(&h));
    cudnn_.reset(h);
    DPT_CHECK_CUDNN(cudnnSetStream(h, stream_.get()));
  }
  return cudnn_.get();
}

// im2col + GEMMs (conv_path.cpp) or cuDNN, per shape: with conv_tuning = time, both are timed on
// scratch buffers (forward, then backward with the input gradient, 3 times after a warm-up) and
// the faster kept; the columns then take rows·k²·c floats per layer, so only shapes whose
// columns fit in kIm2colMaxBytes are candidates. heuristic: cuDNN (no timing). 1x1 stride-1
// convolutions are GEMMs without columns either way. DPT_CONV=im2col: im2col everywhere. A shape
// for which the convolution API (fp32, TF32) offers no usable algorithm in some direction takes
// im2col whatever the tuning: in fp32 resnet50's 256x56x56 -> 512 1x1 stride-2 convolution at
// batch 256 has no deterministic FMA backward-data algorithm on the H200 (cuDNN 9.19).
size_t CudaBackendImpl::conv_cols(const ConvGeom& g, bool input_grad) {
  const size_t full = size_t(g.rows()) * size_t(g.cols());
  if (im2col_convs_) return full;
  if (pointwise_gemm(g) || full * sizeof(float) > kIm2colMaxBytes || capturing()) return 0;
  const std::array<int, 9> key{g.batch, g.c, g.h, g.w, g.out, g.k, g.stride, g.pad, int(input_grad)};
  auto it = im2col_choice_.find(key);
  if (it == im2col_choice_.end()) it = im2col_choice_.emplace(key, im2col_chosen(g, input_grad)).first;
  return it->second ? full : 0;
}

// conv_cols's choice for a shape, made once: im2col where the convolution API (the path of fp32,
// TF32 and DPT_CUDNN_GRAPH=0) can take no algorithm in some direction; else cuDNN under
// heuristic tuning, and the faster of the two timed otherwise.
bool CudaBackendImpl::im2col_chosen(const ConvGeom& g, bool input_grad) {
  if (!(bf16() && conv_graph_))
    if (const char* none = conv_api_lacks(g, input_grad)) {
      log::info("cuda: conv " + g.text() + ": cuDNN offers no deterministic " + none + " algorithm" +
                (precision_ == Precision::fp32 ? " with FMA math" : "") + " within " +
                std::to_string(conv_ws_limit_ >> 20) + " MB of workspace: im2col + GEMMs");
      return true;
    }
  return !conv_heuristic_ && im2col_wins(g, input_grad);
}

// The direction ("forward", "backward-filter", "backward-data") for which the convolution API's
// heuristic lists no algorithm that choose_* could take (pick), else nullptr. No GPU work.
const char* CudaBackendImpl::conv_api_lacks(const ConvGeom& g, bool input_grad) {
  ConvPlan& p = conv_plan(g);
  const bool fp32 = precision_ == Precision::fp32;
  int n = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  DPT_CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(cudnn(), p.x, p.w, p.fwd_desc, p.y,
                                                         CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, fwd));
  if (pick(fwd, n, conv_ws_limit_, [&](cudnnConvolutionFwdAlgo_t a) { return fwd_ok(a, fp32); }) < 0) return "forward";
  cudnnConvolutionBwdFilterAlgoPerf_t filter[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  DPT_CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
      cudnn(), p.x, p.y, p.filter_desc, p.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, filter));
  if (pick(filter, n, conv_ws_limit_, [&](cudnnConvolutionBwdFilterAlgo_t a) { return filter_ok(a, fp32); }) < 0)
    return "backward-filter";
  if (!input_grad) return nullptr;
  cudnnConvolutionBwdDataAlgoPerf_t data[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  DPT_CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnn(), p.w, p.y, p.data_desc, p.x,
                                                              CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, data));
  if (pick(data, n, conv_ws_limit_, [&](cudnnConvolutionBwdDataAlgo_t a) { return data_ok(a, fp32); }) < 0)
    return "backward-data";
  return nullptr;
}

bool CudaBackendImpl::im2col_wins(const ConvGeom& g, bool input_grad) {
  const StartupTiming timing;  // its scratch requests (plain buffers, no hints) are not the step's
  cudaStream_t s = stream_.get();
  const size_t nx = size_t(g.batch) * g.h * g.w * g.c, ny = size_t(g.rows()) * g.out, nw = size_t(g.out) * g.cols();
  std::vector<Buffer<float>> bufs;
  auto buf = [&](size_t n) {
    bufs.emplace_back(*this, n);
    fill(bufs.back().data(), n, 0.01f);
    return bufs.back().data();
  };
  float* x = buf(nx);
  float* w = buf(nw);
  float* z = buf(ny);
  float* da = buf(ny);
  float* dw = buf(nw);
  float* db = buf(size_t(g.out));
  float* dx = input_grad ? buf(nx) : nullptr;
  float* cols = buf(size_t(g.rows()) * size_t(g.cols()));
  // Under bf16 im2col's output and input gradient are floats where cuDNN's are bf16: in a model
  // its output is converted for the bf16 reader above, the output gradient that reader hands
  // down in bf16 is widened for it, and its input gradient converted for the layer below.
  // Those passes are timed with it.
  const bool convert = bf16();
  void* s16 = convert ? static_cast<void*>(buf((std::max(ny, nx) + 1) / 2)) : nullptr;
  void* d16 = convert ? static_cast<void*>(buf((ny + 1) / 2)) : nullptr;
  if (convert) cuda::to_bf16(da, d16, ny, s);
  StreamTimer timer;
  auto time = [&](float* c) {
    return timer.time(s, [&] {
      conv_forward(x, w, nullptr, c, z, z, g, Act::none);
      if (c && convert) {
        cuda::to_bf16(z, s16, ny, s);
        cuda::widen_bf16(d16, da, ny, false, s);
      }
      conv_backward(x, w, z, z, da, c, g, Act::none, dw, db, dx, false);
      if (c && convert && dx) cuda::to_bf16(dx, s16, nx, s);
    });
  };
  // The two paths in turn, each best of three after a warm-up of both (cuDNN's algorithms are
  // chosen in its first): timed one path after the other, cuDNN (first) took 0.40-0.55 ms for
  // shapes where it took 0.30-0.41 in another process on the same H200 while im2col's times
  // matched, and the choice flipped (2026-12-02).
  float ms_cudnn = 1e30f, ms_im2col = 1e30f;
  for (int rep = 0; rep < 4; ++rep) {
    const float a = time(nullptr), b = time(cols);
    if (rep) ms_cudnn = std::min(ms_cudnn, a), ms_im2col = std::min(ms_im2col, b);
  }
  // Under bf16, im2col must win by kIm2colMarginBf16: timed alone it does not pay what it costs in
  // a model, where its input and output are floats (the bf16-only activations and gradients of
  // note_bf16_readers and note_grad_use stop there). resnet18(stem=small)'s bf16 step on the
  // H200 (2026-12-02) took 6.78 ms with cuDNN for its 256x7x7 3x3 and 64x28x28 stride-2 3x3
  // shapes, 7.27 with im2col for the first (timed alone 0.320 against cuDNN's 0.323 ms) and 7.65
  // with im2col for both.
  const float margin = bf16() ? kIm2colMarginBf16 : 1.f;
  const bool im2col = ms_im2col * margin < ms_cudnn;
  log::info("cuda: conv " + g.text() + ": forward + backward " + std::to_string(ms_cudnn).substr(0, 5) +
            " ms on cuDNN, " + std::to_string(ms_im2col).substr(0, 5) + " ms as im2col + GEMMs: " +
            (im2col ? "im2col" : "cuDNN"));
  return im2col;
}

void* CudaBackendImpl::conv_workspace(size_t bytes) { return conv_ws_.get(std::max<size_t>(bytes, 256), stream_.get()); }

ConvPlan& CudaBackendImpl::conv_plan(const ConvGeom& g) {
  const std::array<int, 8> key{g.batch, g.c, g.h, g.w, g.out, g.k, g.stride, g.pad};
  auto it = conv_plans_.find(key);
  if (it != conv_plans_.end()) return *it->second;
  auto p = std::make_unique<ConvPlan>();
  const cudnnDataType_t dt = bf16() ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  DPT_CHECK_CUDNN(cudnnCreateTensorDescriptor(&p->x));
  DPT_CHECK_CUDNN(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NHWC, dt, g.batch, g.c, g.h, g.w));
  DPT_CHECK_CUDNN(cudnnCreateTensorDescriptor(&p->y));
  DPT_CHECK_CUDNN(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NHWC, dt, g.batch, g.out, g.oh(), g.ow()));
  DPT_CHECK_CUDNN(cudnnCreateFilterDescriptor(&p->w));
  DPT_CHECK_CUDNN(cudnnSetFilter4dDescriptor(p->w, dt, CUDNN_TENSOR_NHWC, g.out, g.c, g.k, g.k));
  const cudnnMathType_t math = precision_ == Precision::fp32 ? CUDNN_FMA_MATH
                               : bf16()                      ? CUDNN_TENSOR_OP_MATH
                                                             : CUDNN_DEFAULT_MATH;
  for (auto* d : {&p->fwd_desc, &p->data_desc, &p->filter_desc}) {
    DPT_CHECK_CUDNN(cudnnCreateConvolutionDescriptor(d));
    DPT_CHECK_CUDNN(cudnnSetConvolution2dDescriptor(*d, g.pad, g.pad, g.stride, g.stride, 1, 1,
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DPT_CHECK_CUDNN(cudnnSetConvolutionMathType(*d, math));
  }
  int n = 0, c = 0, h = 0, w = 0;
  DPT_CHECK_CUDNN(cudnnGetConvolution2dForwardOutputDim(p->fwd_desc, p->x, p->w, &n, &c, &h, &w));
  if (n != g.batch || c != g.out || h != g.oh() || w != g.ow())
    throw Error("cuDNN's output shape for the convolution " + g.text() + " is not the model's");
  return *conv_plans_.emplace(key, std::move(p)).first->second;
}

// Timed (or heuristic) choice of each direction's algorithm. Timing runs the candidates on the
// buffers given (their contents are overwritten later by the real call) with the largest
// workspace allowed: start-up timing's request (StartupTiming), which trim_scratch undoes.
void CudaBackendImpl::choose_fwd(ConvPlan& p, const ConvGeom& g, const void* x, const void* w, void* y) {
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int n = 0;
  const bool fp32 = precision_ == Precision::fp32;
  const bool timed = !conv_heuristic_ && !capturing();
  if (timed) {
    const StartupTiming timing;
    DPT_CHECK_CUDNN(cudnnFindConvolutionForwardAlgorithmEx(cudnn(), p.x, x, p.w, w, p.fwd_desc, p.y, y,
                                                           CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf,
                                                           conv_workspace(conv_ws_limit_), conv_ws_limit_));
  } else {
    DPT_CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(cudnn(), p.x, p.w, p.fwd_desc, p.y,
                                                           CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf));
  }
  adopt(p.fwd, p.fwd_desc, perf, n, timed, conv_ws_limit_,
        [&](cudnnConvolutionFwdAlgo_t a) { return fwd_ok(a, fp32); }, "forward", g);
}

void CudaBackendImpl::choose_data(ConvPlan& p, const ConvGeom& g, const void* w, const void* dy, void* dx) {
  cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  int n = 0;
  const bool fp32 = precision_ == Precision::fp32;
  const bool timed = !conv_heuristic_ && !capturing();
  if (timed) {
    const StartupTiming timing;
    DPT_CHECK_CUDNN(cudnnFindConvolutionBackwardDataAlgorithmEx(
        cudnn(), p.w, w, p.y, dy, p.data_desc, p.x, dx, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf,
        conv_workspace(conv_ws_limit_), conv_ws_limit_));
  } else {
    DPT_CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnn(), p.w, p.y, p.data_desc, p.x,
                                                                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf));
  }
  adopt(p.data, p.data_desc, perf, n, timed, conv_ws_limit_,
        [&](cudnnConvolutionBwdDataAlgo_t a) { return data_ok(a, fp32); }, "backward-data", g);
}

// The filter gradient is timed into scratch, not into dw (which may hold a sum being accumulated).
void CudaBackendImpl::choose_filter(ConvPlan& p, const ConvGeom& g, const void* x, const void* dy) {
  cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  int n = 0;
  const bool fp32 = precision_ == Precision::fp32;
  const bool timed = !conv_heuristic_ && !capturing();
  if (timed) {
    const StartupTiming timing;
    void* probe = conv_probe_.get(size_t(g.out) * size_t(g.cols()) * sizeof(float), stream_.get());
    DPT_CHECK_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithmEx(
        cudnn(), p.x, x, p.y, dy, p.filter_desc, p.w, probe, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf,
        conv_workspace(conv_ws_limit_), conv_ws_limit_));
  } else {
    DPT_CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        cudnn(), p.x, p.y, p.filter_desc, p.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf));
  }
  adopt(p.filter, p.filter_desc, perf, n, timed, conv_ws_limit_,
        [&](cudnnConvolutionBwdFilterAlgo_t a) { return filter_ok(a, fp32); }, "backward-filter", g);
}

// One line per shape once all three directions are chosen (or forward alone, for evaluation).
void CudaBackendImpl::say_conv_plan(ConvPlan& p, const ConvGeom& g) {
  if (p.said || !(p.fwd.made || p.efwd.plan) || !(p.filter.made || p.efilter.plan)) return;
  p.said = true;
  auto ms = [](float t) { return t < 0 ? std::string() : " " + std::to_string(t).substr(0, 5) + " ms"; };
  // The graph API's engine (its global index, and how many configurations cuDNN offered and were
  // usable), else the convolution API's algorithm.
  auto dir = [&](const char* name, const ConvEngine& e, int algo, float algo_ms) {
    if (e.plan)
      return std::string(name) + " engine " + std::to_string(e.engine) + ms(e.ms) + " (" + std::to_string(e.usable) +
             " of " + std::to_string(e.offered) + ")";
    return std::string(name) + " algo " + std::to_string(algo) + ms(algo_ms);
  };
  std::string s = "cuda: conv " + g.text() + ": " + dir("forward", p.efwd, int(p.fwd.algo), p.fwd.ms) + ", " +
                  dir("filter", p.efilter, int(p.filter.algo), p.filter.ms);
  if (p.data.made || p.edata.plan) s += ", " + dir("data", p.edata, int(p.data.algo), p.data.ms);
  const size_t ws = std::max({p.fwd.ws, p.data.ws, p.filter.ws, p.efwd.ws, p.edata.ws, p.efilter.ws});
  s += ", workspace " + std::to_string((ws + (1 << 20) - 1) >> 20) + " MB";
  log::info(s);
}

bool CudaBackendImpl::pointwise_gemm(const ConvGeom& g) const {
  return g.k == 1 && g.stride == 1 && g.pad == 0 && gemm_1x1_;
}

ConvGeom CudaBackendImpl::padded_geom(const ConvGeom& g) const {
  ConvGeom p = g;
  if (pads_channels(g)) p.c = (g.c + 7) / 8 * 8;
  return p;
}

// p's rows of g.c channels with zero channels up to padded_geom's, in bf16 (pad_w_ or pad_x_):
// from a weight's bf16 shadow (as_bf16), an input's current bf16 copy, else the input's floats.
const void* CudaBackendImpl::padded_operand(const float* p, size_t rows, const ConvGeom& g, bool weight) {
  const int cp = padded_geom(g).c;
  const size_t n = rows * size_t(g.c);
  const void* p16 = weight ? as_bf16(p, n, bf16_a_) : valid_twin(p, n);
  void* out = (weight ? pad_w_ : pad_x_).get(std::max<size_t>(1, rows * size_t(cp)) * 2, stream_.get());
  cuda::pad_channels_bf16(p16 ? p16 : p, p16 != nullptr, out, rows, g.c, cp, stream_.get());
  return out;
}

void CudaBackendImpl::cudnn_conv_forward(const float* x, const float* w, const float* b, float* z, float* a,
                                         const ConvGeom& g, Act act) {
  // bf16, no bias or activation, and only batch norm reads z (note_bn_input): the bf16 output
  // stays bf16, in z's twin, and z's floats are never written (batch norm reads the twin).
  const bool keep16 = bf16() && !b && act == Act::none && a == z && bn_inputs_.count(z);
  const size_t ny = size_t(g.rows()) * g.out;
  if (pointwise_gemm(g)) {
    if (keep16 && pointwise_gemm_bf16(x, w, z, g)) return;
    linear_fwd(x, w, b, z, a, g.rows(), g.c, g.out, act, false);
    return;
  }
  cudaStream_t s = stream_.get();
  const ConvGeom gc = padded_geom(g);  // the geometry cuDNN runs
  ConvPlan& p = conv_plan(gc);
  const size_t pixels = size_t(g.batch) * g.h * g.w, nx = pixels * g.c, nw = size_t(g.out) * g.cols();
  const bool narrow = narrow_conv(g);  // narrow_conv.cpp's columns and GEMMs, not cuDNN
  const void* xin = narrow             ? nullptr
                    : pads_channels(g) ? padded_operand(x, pixels, g, false)
                    : bf16()           ? as_bf16(x, nx, bf16_b_)
                                       : static_cast<const void*>(x);
  const void* win = narrow             ? nullptr
                    : pads_channels(g) ? padded_operand(w, size_t(g.out) * g.k * g.k, g, true)
                    : bf16()           ? as_bf16(w, nw, bf16_a_)
                                       : static_cast<const void*>(w);
  note_write(z, ny * sizeof(float));
  if (a != z) note_write(a, ny * sizeof(float));
  void* only = keep16 ? only_twin(z, ny) : nullptr;
  // bf16, a ReLU output that only a max pooling reads (note_relu_pool): cuDNN's output goes to a's
  // twin as it is, before bias and ReLU, which the pooling applies as it reads it.
  void* pre = bf16() && !only && act == Act::relu && relu_pool_input(a) ? twin_slot(a, ny) : nullptr;
  if (narrow && !only && !pre && act == Act::relu && b) {
    // Bias and ReLU in the GEMM's epilogue, into a's bf16 copy, where only bf16 readers take a.
    bool a_only = false;
    void* a16 = out_twin(a, ny, false, a_only);
    if (a16 && a_only && narrow_forward(x, w, g, a16, b)) {
      wrote_twin(a, ny, a16, true);
      say_narrow(p, g, true);
      return;
    }
  }
  void* y = only ? only : pre ? pre : bf16() ? conv_y16_.get(ny * 2, s) : static_cast<void*>(z);
  if (narrow) {
    narrow_forward(x, w, g, y, nullptr);
    say_narrow(p, g, false);
  } else if (!run_conv_engine(p, ConvDir::fwd, gc, xin, win, y)) {
    if (!p.fwd.made) choose_fwd(p, gc, xin, win, y);
    const float one = 1.f, zero = 0.f;
    DPT_CHECK_CUDNN(cudnnConvolutionForward(cudnn(), &one, p.x, xin, p.w, win, p.fwd_desc, p.fwd.algo,
                                            conv_workspace(p.fwd.ws), p.fwd.ws, &zero, p.y, y));
  }
  if (only) {
    made_only_twin(z, ny);
  } else if (pre) {
    made_only_twin(a, ny);
    twins_[a].pre_act = true;
    twins_[a].pre_bias = b;
  } else if (bf16()) {
    // A ReLU's backward takes its mask from a (a > 0 exactly where z > 0): z is not written (the
    // model lets a overwrite z). Where only bf16 readers take a (note_bf16_readers: the
    // convolution above), a's bf16 copy alone.
    const bool relu = act == Act::relu;
    bool a_only = false;
    void* a16 = relu ? out_twin(a, ny, false, a_only) : nullptr;
    cuda::conv_epilogue_bf16(y, b, relu || a == z ? nullptr : z, a_only ? nullptr : a, a16, size_t(g.rows()), g.out,
                             act, s);
    wrote_twin(a, ny, a16, a_only);
  } else {
    cuda::bias_act_forward(z, a, b, g.rows(), g.out, act, s);
  }
}

// A 1x1 stride-1 convolution's GEMM with a bf16 output into z's twin (cuBLASLt, D in bf16):
// false, with nothing enqueued, where cuBLASLt is off or offers no algorithm.
bool CudaBackendImpl::pointwise_gemm_bf16(const float* x, const float* w, float* z, const ConvGeom& g) {
  if (!use_lt_ || g.c == 0) return false;
  const size_t ny = size_t(g.rows()) * g.out;
  const void* w16 = as_bf16(w, size_t(g.out) * size_t(g.c), bf16_a_);
  const void* x16 = as_bf16(x, size_t(g.rows()) * size_t(g.c), bf16_b_);
  note_write(z, ny * sizeof(float));
  void* z16 = only_twin(z, ny);
  if (!z16) return false;
  const LtSpec sp = spec(true, false, g.out, g.rows(), g.c, w16, g.c, x16, g.c, z16, g.out, 0.f, CUDA_R_16BF);
  if (!lt_matmul(sp, w16, x16, z16, 0.f, nullptr)) return false;
  made_only_twin(z, ny);
  return true;
}

// bf16 between a convolution and batch norm (note_grad_use): where batch norm's backward wrote
// dz (over da) in bf16 only, that is the GEMMs' operand as it is (the convolution has no bias or
// activation: no pass over da); where only batch norm or a residual block's sum reads dx
// (GradUse::bn, GradUse::sum), cuDNN's bf16 dx stays bf16.
void CudaBackendImpl::conv_backward(const float* x, const float* w, const float* z, const float* a, float* da,
                                    float* cols, const ConvGeom& g, Act act, float* dw, float* db, float* dx,
                                    bool accumulate) {
  const size_t nx = size_t(g.batch) * g.h * g.w * g.c, ny = size_t(g.rows()) * g.out, nw = size_t(g.out) * g.cols();
  const bool keep_dx16 = dx && take_grad_use(dx, {GradUse::bn, GradUse::sum, GradUse::act, GradUse::pool}) && bf16();
  const cuda::BnIn dzin = bf16() && act == Act::none ? bn_in(da, ny) : cuda::BnIn{da, false};
  if (cols || (!dzin.bf16 && pointwise_gemm(g))) {  // the im2col path (conv_cols), or a GEMM on floats
    floats_of(da, ny);
    if (cols) Backend::conv_backward(x, w, z, a, da, cols, g, act, dw, db, dx, accumulate);
    else linear_backward(x, w, z, a, da, g.rows(), g.c, g.out, act, dw, db, dx, accumulate);
    return;
  }
  if (pointwise_gemm(g)) {
    pointwise_backward_bf16(x, w, dzin.p, g, dw, dx, keep_dx16, accumulate);
    return;
  }
  cudaStream_t s = stream_.get();
  const bool pad = pads_channels(g);
  const ConvGeom gc = padded_geom(g);  // the geometry cuDNN runs
  ConvPlan& p = conv_plan(gc);
  // The operands' bf16 copies are looked up before the outputs' notes drop any copy they hit
  // (padded again from x and w where the channels are padded: the forward's copies may have
  // been overwritten by another convolution's since).
  const size_t pixels = size_t(g.batch) * g.h * g.w, kk_out = size_t(g.out) * g.k * g.k;
  const void* xin = pad ? padded_operand(x, pixels, g, false)
                    : bf16() ? as_bf16(x, nx, bf16_b_)
                             : static_cast<const void*>(x);
  const void* win = pad && dx      ? padded_operand(w, kk_out, g, true)
                    : bf16() && dx ? as_bf16(w, nw, bf16_a_)
                                   : static_cast<const void*>(w);
  note_write(dw, nw * sizeof(float));
  if (dx) note_write(dx, nx * sizeof(float));
  const void* dy = dzin.p;
  if (!dzin.bf16 && premasked_ == da && da) {
    // The pooling above ran this ReLU's backward (note_relu_pool): dz in da's bf16 twin; the
    // bias gradient alone here.
    premasked_ = nullptr;
    void* d16 = const_cast<void*>(only_copy(da, ny));
    if (!d16) throw Error("conv backward: the pooling's masked gradient is not in bf16");
    note_write(db, size_t(g.out) * sizeof(float));
    cuda::relu_backward_bgrad_bf16(d16, nullptr, g.rows(), g.out, db, accumulate, bgrad_partial(g.rows(), g.out), s);
    dy = d16;
  } else if (!dzin.bf16) {
    const bool relu16 = bf16() && act == Act::relu;  // z not written (cudnn_conv_forward): the mask from a
    const void* a16 = relu16 ? valid_twin(a, ny) : nullptr;
    void* d16 = a16 ? const_cast<void*>(only_copy(da, ny)) : nullptr;
    note_write(db, size_t(g.out) * sizeof(float));
    if (d16) {
      // da kept in bf16 only (GradUse::act: the convolution above's input gradient): the ReLU's
      // backward and the bias gradient over it in place, the mask from a's bf16 copy.
      note_write(da, ny * sizeof(float));
      cuda::relu_backward_bgrad_bf16(d16, a16, g.rows(), g.out, db, accumulate, bgrad_partial(g.rows(), g.out), s);
      dy = d16;
    } else {
      // dz (over da: fp32 and TF32 only; the GEMMs take bf16(dz)), bf16(dz) and the bias
      // gradient in one pass; a ReLU's mask from a's floats.
      if (relu16) floats_of(a, ny);
      floats_of(da, ny);
      note_write(da, ny * sizeof(float));
      void* dz16 = bf16() ? bf16_dz_.get(std::max<size_t>(1, ny) * 2, s) : nullptr;
      cuda::act_backward_bgrad(da, relu16 ? a : z, a, g.rows(), g.out, act, db, accumulate,
                               bgrad_partial(g.rows(), g.out), dz16, s, /*write_dz=*/!bf16());
      dy = bf16() ? dz16 : static_cast<const void*>(da);
    }
  }
  const float one = 1.f, zero = 0.f;
  if (bf16()) {
    void* dw16 = conv_dw16_.get(size_t(g.out) * size_t(gc.cols()) * 2, s);
    if (!run_conv_engine(p, ConvDir::filter, gc, xin, dw16, dy)) {
      if (!p.filter.made) choose_filter(p, gc, xin, dy);
      DPT_CHECK_CUDNN(cudnnConvolutionBackwardFilter(cudnn(), &one, p.x, xin, p.y, dy, p.filter_desc,
                                                     p.filter.algo, conv_workspace(p.filter.ws), p.filter.ws, &zero,
                                                     p.w, dw16));
    }
    if (pad) cuda::unpad_widen_bf16(dw16, dw, kk_out, g.c, gc.c, accumulate, s);
    else cuda::widen_bf16(dw16, dw, nw, accumulate, s);
  } else {
    if (!p.filter.made) choose_filter(p, g, xin, dy);
    const float beta = accumulate ? 1.f : 0.f;
    DPT_CHECK_CUDNN(cudnnConvolutionBackwardFilter(cudnn(), &one, p.x, xin, p.y, dy, p.filter_desc,
                                                   p.filter.algo, conv_workspace(p.filter.ws), p.filter.ws, &beta,
                                                   p.w, dw));
  }
  if (dx) {
    // A padded input's gradient comes out padded: widened into dx's floats without the padding.
    void* keep = keep_dx16 && !pad ? twin_slot(dx, nx) : nullptr;
    void* out = keep ? keep : bf16() ? conv_dx16_.get(pixels * size_t(gc.c) * 2, s) : static_cast<void*>(dx);
    if (!run_conv_engine(p, ConvDir::data, gc, out, win, dy)) {
      if (!p.data.made) choose_data(p, gc, win, dy, out);
      DPT_CHECK_CUDNN(cudnnConvolutionBackwardData(cudnn(), &one, p.w, win, p.y, dy, p.data_desc, p.data.algo,
                                                   conv_workspace(p.data.ws), p.data.ws, &zero, p.x, out));
    }
    if (keep) made_only_twin(dx, nx);
    else if (pad) cuda::unpad_widen_bf16(out, dx, pixels, g.c, gc.c, false, s);
    else if (bf16()) cuda::widen_bf16(out, dx, nx, false, s);
  }
  say_conv_plan(p, gc);
}

// A 1x1 stride-1 convolution's backward pass from batch norm's bf16 dz (dz16, the bias-free case
// of conv_backward): the weight gradient's GEMM, and the input gradient's with a bf16 D into dx's
// twin where only batch norm or a residual block's sum reads dx (cuBLASLt), else in floats.
void CudaBackendImpl::pointwise_backward_bf16(const float* x, const float* w, const void* dz16, const ConvGeom& g,
                                              float* dw, float* dx, bool keep_dx16, bool accumulate) {
  const int rows = g.rows(), in = g.c, out = g.out;
  const size_t nx = size_t(rows) * size_t(in);
  const void* x16 = as_bf16(x, nx, bf16_b_);
  const void* w16 = dx ? as_bf16(w, size_t(out) * size_t(in), bf16_a_) : nullptr;
  note_write(dw, size_t(out) * size_t(in) * sizeof(float));
  if (dx) note_write(dx, nx * sizeof(float));
  weight_grad(x, x16, nullptr, dz16, rows, in, out, dw, accumulate ? 1.f : 0.f);
  if (!dx) return;
  if (void* dx16 = keep_dx16 && use_lt_ ? twin_slot(dx, nx) : nullptr) {
    const LtSpec sp = spec(false, false, in, rows, out, w16, in, dz16, out, dx16, in, 0.f, CUDA_R_16BF);
    if (lt_matmul(sp, w16, dz16, dx16, 0.f, nullptr)) {
      made_only_twin(dx, nx);
      return;
    }
  }
  gemm(false, false, in, rows, out, w16, in, dz16, out, dx, in, 0.f);
}

}  // namespace dpt::cuda_impl
