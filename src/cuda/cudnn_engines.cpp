// bf16 convolutions through cuDNN 9's graph (backend) API: one operation graph per shape and
// direction, and the execution plan of the engine configuration chosen among those cuDNN's
// heuristics offer (mode A, then the fallback list), as PyTorch's cudnn.benchmark chooses.
//
// Why not the convolution API alone: its algorithm enums name families, and cuDNN picks the
// kernel inside a family (its tile shape) itself. On the H200 every bf16 shape of the
// compute-bound CNN and of resnet18 took algorithm 1 in every direction, and the same algorithm
// timed 0.21 ms in one process and 0.33-0.41 ms in another for the same shape (256x7x7 -> 256,
// 2026-12-02), so the choice between cuDNN and im2col, and the step, changed from process to
// process. Here every configuration is timed as it will run, best of three after a warm-up.
//
// Only deterministic configurations (no NONDETERMINISTIC numerical note: a resumed run repeats
// the bits of an uninterrupted one), within device.conv_workspace_mb. conv_tuning = heuristic
// keeps the first usable configuration, untimed. Tensors are NHWC bf16, the sums fp32; the plan
// assumes 16-byte aligned operands, and a call with a less aligned pointer (a weight slice of an
// arena whose offsets are not multiples of 8) runs the convolution API instead.
#include <algorithm>
#include <string>

#include "backend_impl.hpp"
#include "dpt/cuda_check.hpp"
#include "dpt/log.hpp"

namespace dpt::cuda_impl {

namespace {

constexpr int64_t kAlignment = 16;
constexpr int kMaxTimed = 16;  // configurations timed per direction (PyTorch's benchmark_limit is 10)
// The graph's handle attributes, deprecated in cuDNN 9.x but still read (cudnn-frontend sets
// them); named by value so that the deprecation does not warn.
constexpr auto kGraphHandle = static_cast<cudnnBackendAttributeName_t>(800);  // OPERATIONGRAPH_HANDLE
constexpr auto kPlanHandle = static_cast<cudnnBackendAttributeName_t>(400);   // EXECUTION_PLAN_HANDLE
enum : int64_t { kUidX = 1, kUidW = 2, kUidY = 3 };

// A descriptor owned by a list (destroyed with it), or nullptr when cuDNN refuses to make it.
cudnnBackendDescriptor_t make(std::vector<cudnnBackendDescriptor_t>& owned, cudnnBackendDescriptorType_t t) {
  cudnnBackendDescriptor_t d = nullptr;
  if (cudnnBackendCreateDescriptor(t, &d) != CUDNN_STATUS_SUCCESS) return nullptr;
  owned.push_back(d);
  return d;
}

bool set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n,
         const void* v) {
  return cudnnBackendSetAttribute(d, a, t, n, v) == CUDNN_STATUS_SUCCESS;
}

// NHWC bf16: dims (n, c, h, w), strides (h·w·c, 1, w·c, c).
cudnnBackendDescriptor_t tensor(std::vector<cudnnBackendDescriptor_t>& owned, int64_t uid, int64_t n, int64_t c,
                                int64_t h, int64_t w) {
  cudnnBackendDescriptor_t d = make(owned, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const cudnnDataType_t dt = CUDNN_DATA_BFLOAT16;
  const int64_t dims[4] = {n, c, h, w}, strides[4] = {h * w * c, 1, w * c, c};
  if (!d || !set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt) ||
      !set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims) ||
      !set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides) ||
      !set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid) ||
      !set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignment) ||
      cudnnBackendFinalize(d) != CUDNN_STATUS_SUCCESS)
    return nullptr;
  return d;
}

// The operation graph of one convolution in direction dir: nullptr where cuDNN refuses it.
cudnnBackendDescriptor_t conv_graph(std::vector<cudnnBackendDescriptor_t>& owned, cudnnHandle_t h, ConvDir dir,
                                    const ConvGeom& g) {
  cudnnBackendDescriptor_t x = tensor(owned, kUidX, g.batch, g.c, g.h, g.w);
  cudnnBackendDescriptor_t w = tensor(owned, kUidW, g.out, g.c, g.k, g.k);
  cudnnBackendDescriptor_t y = tensor(owned, kUidY, g.batch, g.out, g.oh(), g.ow());
  cudnnBackendDescriptor_t conv = make(owned, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  if (!x || !w || !y || !conv) return nullptr;
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t dims = 2, dil[2] = {1, 1}, str[2] = {g.stride, g.stride}, pad[2] = {g.pad, g.pad};
  if (!set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp) ||
      !set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode) ||
      !set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims) ||
      !set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil) ||
      !set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, str) ||
      !set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad) ||
      !set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad) ||
      cudnnBackendFinalize(conv) != CUDNN_STATUS_SUCCESS)
    return nullptr;
  // The operation's attributes per direction: its x (dx), w (dw), y (dy), convolution, alpha, beta.
  struct OpAttrs {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
  };
  static const OpAttrs kOps[3] = {
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA},
  };
  const OpAttrs& at = kOps[dir == ConvDir::fwd ? 0 : dir == ConvDir::data ? 1 : 2];
  const float alpha = 1.f, beta = 0.f;
  cudnnBackendDescriptor_t op = make(owned, at.type);
  const bool ok = op && set(op, at.x, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x) &&
                  set(op, at.w, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w) &&
                  set(op, at.y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y) &&
                  set(op, at.conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv) &&
                  set(op, at.alpha, CUDNN_TYPE_FLOAT, 1, &alpha) && set(op, at.beta, CUDNN_TYPE_FLOAT, 1, &beta);
  if (!ok || cudnnBackendFinalize(op) != CUDNN_STATUS_SUCCESS) return nullptr;
  cudnnBackendDescriptor_t graph = make(owned, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  if (!graph || !set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op) ||
      !set(graph, kGraphHandle, CUDNN_TYPE_HANDLE, 1, &h) || cudnnBackendFinalize(graph) != CUDNN_STATUS_SUCCESS)
    return nullptr;
  return graph;
}

// The engine configurations cuDNN's heuristics offer for the graph in one mode, best first.
std::vector<cudnnBackendDescriptor_t> offered(std::vector<cudnnBackendDescriptor_t>& owned,
                                              cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode) {
  cudnnBackendDescriptor_t heur = make(owned, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  if (!heur || !set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph) ||
      !set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode) ||
      cudnnBackendFinalize(heur) != CUDNN_STATUS_SUCCESS)
    return {};
  int64_t n = 0;
  if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr) !=
          CUDNN_STATUS_SUCCESS ||
      n <= 0)
    return {};
  std::vector<cudnnBackendDescriptor_t> cfgs;
  for (int64_t i = 0; i < n; ++i)
    if (cudnnBackendDescriptor_t c = make(owned, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)) cfgs.push_back(c);
  int64_t got = 0;
  if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               int64_t(cfgs.size()), &got, cfgs.data()) != CUDNN_STATUS_SUCCESS)
    return {};
  cfgs.resize(size_t(std::max<int64_t>(0, std::min<int64_t>(got, int64_t(cfgs.size())))));
  return cfgs;
}

// The configuration's engine: its global index, and whether its results are deterministic.
bool engine_of(std::vector<cudnnBackendDescriptor_t>& owned, cudnnBackendDescriptor_t cfg, int64_t& index) {
  cudnnBackendDescriptor_t eng = make(owned, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t n = 0;
  if (!eng || cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) !=
                  CUDNN_STATUS_SUCCESS)
    return false;
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) != CUDNN_STATUS_SUCCESS)
    return false;
  for (int64_t i = 0; i < n; ++i)
    if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return false;
  index = -1;
  cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
  return true;
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % uintptr_t(kAlignment) == 0; }

// A plan's operands (x or dx, w or dw, y or dy by unique id) and workspace, for execute.
class Operands {
 public:
  Operands(const void* x, const void* w, const void* y, void* ws) {
    void* ptrs[3] = {const_cast<void*>(x), const_cast<void*>(w), const_cast<void*>(y)};
    const int64_t uids[3] = {kUidX, kUidW, kUidY};
    pack_ = make(owned_, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    ok_ = pack_ && set(pack_, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids) &&
          set(pack_, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs) &&
          set(pack_, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws) &&
          cudnnBackendFinalize(pack_) == CUDNN_STATUS_SUCCESS;
  }
  ~Operands() {
    for (auto d : owned_) cudnnBackendDestroyDescriptor(d);
  }
  Operands(const Operands&) = delete;
  Operands& operator=(const Operands&) = delete;
  cudnnStatus_t execute(cudnnHandle_t h, cudnnBackendDescriptor_t plan) const {
    return ok_ ? cudnnBackendExecute(h, plan, pack_) : CUDNN_STATUS_BAD_PARAM;
  }

 private:
  std::vector<cudnnBackendDescriptor_t> owned_;
  cudnnBackendDescriptor_t pack_ = nullptr;
  bool ok_ = false;
};

}  // namespace

ConvEngine::~ConvEngine() {
  if (plan) cudnnBackendDestroyDescriptor(plan);
  for (auto it = owned.rbegin(); it != owned.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
}

void CudaBackendImpl::build_conv_engine(ConvEngine& e, ConvDir dir, const ConvGeom& g, const void* x, const void* w,
                                        const void* y) {
  e.tried = true;
  cudnnHandle_t h = cudnn();
  cudnnBackendDescriptor_t graph = conv_graph(e.owned, h, dir, g);
  if (!graph) return;
  std::vector<cudnnBackendDescriptor_t> cfgs = offered(e.owned, graph, CUDNN_HEUR_MODE_A);
  if (cfgs.empty()) cfgs = offered(e.owned, graph, CUDNN_HEUR_MODE_FALLBACK);
  e.offered = int(cfgs.size());
  // The usable plans, in the heuristics' order: deterministic, finalized, within the workspace.
  struct Candidate {
    cudnnBackendDescriptor_t plan;
    int64_t engine;
    size_t ws;
  };
  std::vector<Candidate> cands;
  const bool timed = !conv_heuristic_;
  for (cudnnBackendDescriptor_t cfg : cfgs) {
    if (int(cands.size()) >= (timed ? kMaxTimed : 1)) break;
    int64_t engine = -1;
    if (!engine_of(e.owned, cfg, engine)) continue;
    cudnnBackendDescriptor_t plan = nullptr;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS) continue;
    int64_t ws = 0, n = 0;
    const bool ok = set(plan, kPlanHandle, CUDNN_TYPE_HANDLE, 1, &h) &&
                    set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg) &&
                    cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS &&
                    cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                             &ws) == CUDNN_STATUS_SUCCESS &&
                    ws >= 0 && size_t(ws) <= conv_ws_limit_;
    if (!ok) {
      cudnnBackendDestroyDescriptor(plan);
      continue;
    }
    cands.push_back({plan, engine, size_t(ws)});
  }
  e.usable = int(cands.size());
  if (cands.empty()) return;
  size_t best = 0;
  if (timed && cands.size() > 1) {
    // Each as it will run, on these operands: a warm-up, then the best of three.
    const StartupTiming timing;  // each candidate's workspace: the chosen one's is asked for when it runs
    cudaStream_t s = stream_.get();
    StreamTimer timer;
    float best_ms = 1e30f;
    for (size_t i = 0; i < cands.size(); ++i) {
      const Operands ops(x, w, y, conv_workspace(cands[i].ws));
      float ms = 1e30f;
      if (ops.execute(h, cands[i].plan) == CUDNN_STATUS_SUCCESS) {
        for (int rep = 0; rep < 3; ++rep) {
          cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
          const float t = timer.time(s, [&] { st = ops.execute(h, cands[i].plan); });
          if (st == CUDNN_STATUS_SUCCESS) ms = std::min(ms, t);
        }
      }
      DPT_CHECK_CUDA(cudaGetLastError());
      if (ms < best_ms) best_ms = ms, best = i;
    }
    if (best_ms >= 1e30f) {  // none ran
      for (const Candidate& c : cands) cudnnBackendDestroyDescriptor(c.plan);
      e.usable = 0;
      return;
    }
    e.ms = best_ms;
  }
  for (size_t i = 0; i < cands.size(); ++i)
    if (i != best) cudnnBackendDestroyDescriptor(cands[i].plan);
  e.plan = cands[best].plan;
  e.engine = cands[best].engine;
  e.ws = cands[best].ws;
}

bool CudaBackendImpl::run_conv_engine(ConvPlan& p, ConvDir dir, const ConvGeom& g, const void* x, const void* w,
                                      const void* y) {
  if (!bf16() || !conv_graph_) return false;
  ConvEngine& e = dir == ConvDir::fwd ? p.efwd : dir == ConvDir::data ? p.edata : p.efilter;
  if (!e.tried) {
    if (capturing()) return false;  // building times kernels: never inside a capture
    build_conv_engine(e, dir, g, x, w, y);
  }
  if (!e.plan || !aligned(x) || !aligned(w) || !aligned(y)) return false;
  const cudnnStatus_t st = Operands(x, w, y, conv_workspace(e.ws)).execute(cudnn(), e.plan);
  if (st != CUDNN_STATUS_SUCCESS)
    throw Error(std::string("cuDNN's execution plan for the convolution ") + g.text() + " failed: " +
                cudnnGetErrorString(st));
  return true;
}

}  // namespace dpt::cuda_impl
