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
#include "cudnn_conv_ops.hpp"
#include "dpt/cuda_check.hpp"
#include "dpt/log.hpp"

namespace dpt::cuda_impl {

namespace {

constexpr int kMaxTimed = 16;  // configurations timed per direction (PyTorch's benchmark_limit is 10)
using cudnn_graph::kAlignment;
using cudnn_graph::kGraphHandle;
using cudnn_graph::kPlanHandle;
using cudnn_graph::make;
using cudnn_graph::nhwc_tensor;
using cudnn_graph::offered;
enum : int64_t { kUidX = 1, kUidW = 2, kUidY = 3 };

bool set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n,
         const void* v) {
  return cudnnBackendSetAttribute(d, a, t, n, v) == CUDNN_STATUS_SUCCESS;
}

// The operation graph of one convolution in direction dir: nullptr where cuDNN refuses it.
cudnnBackendDescriptor_t conv_graph(std::vector<cudnnBackendDescriptor_t>& owned, cudnnHandle_t h, ConvDir dir,
                                    const ConvGeom& g) {
  cudnnBackendDescriptor_t x = nhwc_tensor(owned, kUidX, g.batch, g.c, g.h, g.w);
  cudnnBackendDescriptor_t w = nhwc_tensor(owned, kUidW, g.out, g.c, g.k, g.k);
  cudnnBackendDescriptor_t y = nhwc_tensor(owned, kUidY, g.batch, g.out, g.oh(), g.ow());
  cudnnBackendDescriptor_t conv = make(owned, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  if (!x || !w || !y || !conv) return nullptr;
  if (!cudnn_graph::set_conv_desc(conv, g.stride, g.pad)) return nullptr;
  const int d = dir == ConvDir::fwd ? 0 : dir == ConvDir::data ? 1 : 2;
  cudnnBackendDescriptor_t op = make(owned, cudnn_graph::conv_op_attrs(d).type);
  if (!cudnn_graph::set_conv_op(op, d, x, w, y, conv)) return nullptr;
  cudnnBackendDescriptor_t graph = make(owned, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  if (!graph || !set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op) ||
      !set(graph, kGraphHandle, CUDNN_TYPE_HANDLE, 1, &h) || cudnnBackendFinalize(graph) != CUDNN_STATUS_SUCCESS)
    return nullptr;
  return graph;
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
