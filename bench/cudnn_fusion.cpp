// bench-cudnn-fusion: what batch norm's and ReLU's work costs when cuDNN's runtime fusion folds it
// into the convolutions, shape by shape, against the plain convolutions. It answers whether
// fusing would bring a ResNet step under a given time: the plain sums are the floor of an
// unfused step's convolutions, and each fused pattern's excess over its plain convolution is
// what that fusion costs in place of a separate pass.
//
// Per shape (NHWC bf16, fp32 accumulation, the graph API; each pattern one operation graph):
//   fwd            y = conv(x, w)
//   fwd+stats      y = conv(x, w); per-channel Σy and Σy² (genstats), the batch statistics
//   sbr+fwd+stats  y = conv(relu(x·s + b), w); Σy, Σy²   (batch norm's apply folded into the input)
//   dgrad          dx = dgrad(dy, w)
//   dgrad+drelu    dx = dgrad(dy, w) ⊙ [xr > 0]          (the ReLU's backward folded in)
//   wgrad          dw = wgrad(x, dy)
//   sbr+wgrad      dw = wgrad(relu(x·s + b), dy)
// Every engine configuration cuDNN's heuristics offer (mode A, else the fallback list), up to
// --candidates (plain) or --fused-candidates (fused: each may compile at run time), is built
// and timed (CUDA events around --reps back-to-back executions, after a warm-up); the fastest
// is reported, and the fastest deterministic one beside it. Each fused pattern's result is
// checked against its plain convolution run on the same operands, with the prologue applied
// and the ReLU mask and the sums computed on the host (relative L2 error).
//
//   ./build/bench/bench-cudnn-fusion --batch 256 --shapes "64,28,28,64,3,1,1;64,28,28,128,3,2,1"
//
// --shapes: "c,h,w,k,r,stride,pad" per convolution, ';' between, in forward order; repeated
// shapes are timed once and counted as often as they appear. The first is the network's first
// convolution: its input is the data, so neither its input gradient nor a prologue is counted
// (--first-is-data false counts them). Channels under 8 are padded to 8, as dptrain does.
// One JSON object per line; a summary table last.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "cuda_bench.hpp"
#include "cudnn_conv_ops.hpp"

namespace {

namespace cudnn_graph = dpt::cudnn_graph;
using bench::Dev;
using bench::download;
using bench::upload;

float round_bf16(float f) { return dpt::bf16_value(dpt::bf16_bits(f)); }

std::vector<float> random(size_t n, uint64_t seed, float lo, float hi) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = round_bf16(lo + (hi - lo) * float(s >> 40) / float(1 << 24));
  }
  return v;
}

double rel_err(const std::vector<float>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));  // NaN stays NaN: an unwritten output fails
}

struct Shape {
  int64_t n, c, h, w, k, r, stride, pad;
  bool data;  // the network's first convolution: no input gradient, no prologue
  int64_t oh() const { return (h + 2 * pad - r) / stride + 1; }
  int64_t ow() const { return (w + 2 * pad - r) / stride + 1; }
  std::string text() const {
    char b[128];
    std::snprintf(b, sizeof b, "%ldx%ldx%ld -> %ld, %ldx%ld/%ld pad %ld", long(c), long(h), long(w), long(k), long(r),
                  long(r), long(stride), long(pad));
    return b;
  }
};

// The graph API, owned descriptors destroyed in reverse order.
class Graphs {
 public:
  explicit Graphs(cudnnHandle_t h) : h_(h) {}
  ~Graphs() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
  Graphs(const Graphs&) = delete;
  Graphs& operator=(const Graphs&) = delete;
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }

  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d = cudnn_graph::make(owned_, t);
    return d ? d : fail("create descriptor");
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n,
           const void* v, const char* what) {
    if (ok_ && d && cudnnBackendSetAttribute(d, a, t, n, v) != CUDNN_STATUS_SUCCESS) fail(what);
  }
  cudnnBackendDescriptor_t finalize(cudnnBackendDescriptor_t d, const char* what) {
    if (!ok_ || !d) return nullptr;
    const cudnnStatus_t st = cudnnBackendFinalize(d);
    if (st != CUDNN_STATUS_SUCCESS) return fail((std::string(what) + ": " + cudnnGetErrorString(st)).c_str());
    return d;
  }
  // NHWC strides for dims (n, c, h, w); (1, c, 1, 1) per-channel vectors alike.
  cudnnBackendDescriptor_t tensor(int64_t uid, int64_t n, int64_t c, int64_t h, int64_t w, cudnnDataType_t dt,
                                  bool virt = false) {
    if (!ok_) return nullptr;
    cudnnBackendDescriptor_t d = cudnn_graph::nhwc_tensor(owned_, uid, n, c, h, w, dt, virt);
    return d ? d : fail("tensor");
  }
  // The convolution operation of direction dir (0 forward, 1 input gradient, 2 weight gradient).
  cudnnBackendDescriptor_t conv_op(int dir, const Shape& s, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t w,
                                   cudnnBackendDescriptor_t y) {
    if (!ok_) return nullptr;
    cudnnBackendDescriptor_t conv = make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    if (!cudnn_graph::set_conv_desc(conv, s.stride, s.pad)) return fail("convolution");
    cudnnBackendDescriptor_t op = make(cudnn_graph::conv_op_attrs(dir).type);
    return cudnn_graph::set_conv_op(op, dir, x, w, y, conv) ? op : fail("convolution operation");
  }
  // A pointwise operation of mode (fp32 math) on its tensors, each under its attribute:
  // {XDESC, x}, {BDESC, b} (binary modes), {YDESC, y}; a backward activation {DYDESC, dy},
  // {XDESC, x}, {DXDESC, dx}.
  using Io = std::pair<cudnnBackendAttributeName_t, cudnnBackendDescriptor_t>;
  cudnnBackendDescriptor_t pw(cudnnPointwiseMode_t mode, std::initializer_list<Io> io) {
    cudnnBackendDescriptor_t pd = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(pd, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(pd, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
    finalize(pd, "pointwise");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pd, "pointwise op");
    for (const auto& [attr, t] : io) set(op, attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, "pointwise tensor");
    return finalize(op, "pointwise operation");
  }
  cudnnBackendDescriptor_t genstats(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t sum,
                                    cudnnBackendDescriptor_t sq) {
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
    const cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(op, CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &mode, "genstats mode");
    set(op, CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "genstats precision");
    set(op, CUDNN_ATTR_OPERATION_GENSTATS_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "genstats x");
    set(op, CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &sum, "genstats sum");
    set(op, CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &sq, "genstats sqsum");
    return finalize(op, "genstats operation");
  }
  cudnnBackendDescriptor_t graph(const std::vector<cudnnBackendDescriptor_t>& ops) {
    cudnnBackendDescriptor_t g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(g, cudnn_graph::kGraphHandle, CUDNN_TYPE_HANDLE, 1, &h_, "graph handle");
    set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops.size()), ops.data(), "graph ops");
    return finalize(g, "operation graph");
  }
  std::vector<cudnnBackendDescriptor_t> offered(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode) {
    return ok_ ? cudnn_graph::offered(owned_, graph, mode) : std::vector<cudnnBackendDescriptor_t>{};
  }

 private:
  cudnnBackendDescriptor_t fail(const char* what) {
    if (ok_) why_ = what;
    ok_ = false;
    return nullptr;
  }
  cudnnHandle_t h_;
  std::vector<cudnnBackendDescriptor_t> owned_;
  bool ok_ = true;
  std::string why_;
};

constexpr auto kXD = CUDNN_ATTR_OPERATION_POINTWISE_XDESC, kBD = CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
               kYD = CUDNN_ATTR_OPERATION_POINTWISE_YDESC;
enum Uid : int64_t { kX = 1, kW, kY, kS, kB, kSum, kSq, kDY, kDX, kXR, kDW, kV1 = 100, kV2, kV3, kV4 };
enum Variant { kFwd, kFwdStats, kSbrFwdStats, kDgrad, kDgradDrelu, kWgrad, kSbrWgrad, kVariants };
const char* kNames[kVariants] = {"fwd", "fwd+stats", "sbr+fwd+stats", "dgrad", "dgrad+drelu", "wgrad", "sbr+wgrad"};

// The operation graph of a pattern on shape s (intermediates of type `mid`), and the unique ids
// of the real tensors it reads and writes.
cudnnBackendDescriptor_t pattern(Graphs& g, Variant v, const Shape& s, cudnnDataType_t mid,
                                 std::vector<int64_t>& uids) {
  const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  const int64_t oh = s.oh(), ow = s.ow();
  auto X = [&] { return g.tensor(kX, s.n, s.c, s.h, s.w, bf); };
  auto W = [&] { return g.tensor(kW, s.k, s.c, s.r, s.r, bf); };
  auto Y = [&] { return g.tensor(kY, s.n, s.k, oh, ow, bf); };
  auto DY = [&] { return g.tensor(kDY, s.n, s.k, oh, ow, bf); };
  // relu(x·s + b) as three pointwise operations into a virtual tensor of x's shape.
  auto sbr = [&](std::vector<cudnnBackendDescriptor_t>& ops) {
    cudnnBackendDescriptor_t x = X(), sc = g.tensor(kS, 1, s.c, 1, 1, bf), bi = g.tensor(kB, 1, s.c, 1, 1, bf);
    cudnnBackendDescriptor_t v1 = g.tensor(kV1, s.n, s.c, s.h, s.w, mid, true);
    cudnnBackendDescriptor_t v2 = g.tensor(kV2, s.n, s.c, s.h, s.w, mid, true);
    cudnnBackendDescriptor_t v3 = g.tensor(kV3, s.n, s.c, s.h, s.w, mid, true);
    ops.push_back(g.pw(CUDNN_POINTWISE_MUL, {{kXD, x}, {kBD, sc}, {kYD, v1}}));
    ops.push_back(g.pw(CUDNN_POINTWISE_ADD, {{kXD, v1}, {kBD, bi}, {kYD, v2}}));
    ops.push_back(g.pw(CUDNN_POINTWISE_RELU_FWD, {{kXD, v2}, {kYD, v3}}));
    uids.insert(uids.end(), {kX, kS, kB});
    return v3;
  };
  std::vector<cudnnBackendDescriptor_t> ops;
  switch (v) {
    case kFwd:
      ops.push_back(g.conv_op(0, s, X(), W(), Y()));
      uids = {kX, kW, kY};
      break;
    case kFwdStats:
    case kSbrFwdStats: {
      cudnnBackendDescriptor_t x = v == kSbrFwdStats ? sbr(ops) : X();
      if (v == kFwdStats) uids.push_back(kX);
      cudnnBackendDescriptor_t y = Y();
      ops.push_back(g.conv_op(0, s, x, W(), y));
      ops.push_back(g.genstats(y, g.tensor(kSum, 1, s.k, 1, 1, f32), g.tensor(kSq, 1, s.k, 1, 1, f32)));
      uids.insert(uids.end(), {kW, kY, kSum, kSq});
      break;
    }
    case kDgrad:
      ops.push_back(g.conv_op(1, s, g.tensor(kDX, s.n, s.c, s.h, s.w, bf), W(), DY()));
      uids = {kDX, kW, kDY};
      break;
    case kDgradDrelu: {
      cudnnBackendDescriptor_t t = g.tensor(kV4, s.n, s.c, s.h, s.w, mid, true);
      ops.push_back(g.conv_op(1, s, t, W(), DY()));
      ops.push_back(g.pw(CUDNN_POINTWISE_RELU_BWD, {{CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, t},
                                                    {kXD, g.tensor(kXR, s.n, s.c, s.h, s.w, bf)},
                                                    {CUDNN_ATTR_OPERATION_POINTWISE_DXDESC,
                                                     g.tensor(kDX, s.n, s.c, s.h, s.w, bf)}}));
      uids = {kW, kDY, kXR, kDX};
      break;
    }
    case kWgrad:
      ops.push_back(g.conv_op(2, s, X(), g.tensor(kDW, s.k, s.c, s.r, s.r, bf), DY()));
      uids = {kX, kDW, kDY};
      break;
    case kSbrWgrad: {
      cudnnBackendDescriptor_t x = sbr(ops);
      ops.push_back(g.conv_op(2, s, x, g.tensor(kDW, s.k, s.c, s.r, s.r, bf), DY()));
      uids.insert(uids.end(), {kDW, kDY});
      break;
    }
    default:
      break;
  }
  return g.ok() ? g.graph(ops) : nullptr;
}

struct Result {
  int offered = 0, built = 0;
  double ms = -1, ms_det = -1;  // fastest; fastest deterministic
  int64_t engine = -1;
  bool det = false, rtc = false;
  double build_s = 0;
  double err = -1, err2 = -1;  // check errors (relative L2)
  std::string why;
};

struct Plan {
  cudnnBackendDescriptor_t plan = nullptr;
  size_t ws = 0;
};

// Engine notes of a configuration: deterministic, runtime-compiled; its global index.
void notes(cudnnBackendDescriptor_t cfg, bool& det, bool& rtc, int64_t& index) {
  det = true, rtc = false, index = -1;
  cudnnBackendDescriptor_t eng = nullptr;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS) return;
  int64_t n = 0;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) ==
      CUDNN_STATUS_SUCCESS) {
    cudnnBackendNumericalNote_t nn[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, nn) == CUDNN_STATUS_SUCCESS)
      for (int64_t i = 0; i < n; ++i) det = det && nn[i] != CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
    cudnnBackendBehaviorNote_t bn[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                 CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, bn) == CUDNN_STATUS_SUCCESS)
      for (int64_t i = 0; i < n; ++i) rtc = rtc || bn[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
    cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
  }
  cudnnBackendDestroyDescriptor(eng);
}

class Pack {
 public:
  Pack(const std::vector<int64_t>& uids, const std::map<int64_t, void*>& ptrs, void* ws) {
    std::vector<void*> p;
    for (int64_t u : uids) p.push_back(ptrs.at(u));
    ok_ = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &d_) == CUDNN_STATUS_SUCCESS &&
          cudnnBackendSetAttribute(d_, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()),
                                   uids.data()) == CUDNN_STATUS_SUCCESS &&
          cudnnBackendSetAttribute(d_, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(p.size()),
                                   p.data()) == CUDNN_STATUS_SUCCESS &&
          cudnnBackendSetAttribute(d_, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws) ==
              CUDNN_STATUS_SUCCESS &&
          cudnnBackendFinalize(d_) == CUDNN_STATUS_SUCCESS;
  }
  ~Pack() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Pack(const Pack&) = delete;
  Pack& operator=(const Pack&) = delete;
  cudnnStatus_t run(cudnnHandle_t h, cudnnBackendDescriptor_t plan) const {
    return ok_ ? cudnnBackendExecute(h, plan, d_) : CUDNN_STATUS_BAD_PARAM;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  bool ok_ = false;
};

struct Bench {
  cudnnHandle_t h;
  cudaStream_t stream;
  Dev* ws;
  int candidates, fused_candidates, reps;
  std::map<int64_t, void*> ptrs;

  // Builds and times pattern v on s; keeps the fastest plan in `best` (caller destroys it).
  Result time(Variant v, const Shape& s, Plan& best) {
    Result r;
    for (cudnnDataType_t mid : {CUDNN_DATA_FLOAT, CUDNN_DATA_BFLOAT16}) {
      Graphs g(h);
      std::vector<int64_t> uids;
      cudnnBackendDescriptor_t graph = pattern(g, v, s, mid, uids);
      if (!graph) {
        r.why = "graph: " + g.why();
        continue;
      }
      std::vector<cudnnBackendDescriptor_t> cfgs = g.offered(graph, CUDNN_HEUR_MODE_A);
      if (cfgs.empty()) cfgs = g.offered(graph, CUDNN_HEUR_MODE_FALLBACK);
      r.offered = int(cfgs.size());
      if (cfgs.empty()) {
        r.why = "no engine configuration offered";
        continue;
      }
      cudaEvent_t e0, e1;
      CK(cudaEventCreate(&e0));
      CK(cudaEventCreate(&e1));
      const bool plain = v == kFwd || v == kDgrad || v == kWgrad;
      for (size_t i = 0; i < cfgs.size() && r.built < (plain ? candidates : fused_candidates); ++i) {
        bool det, rtc;
        int64_t engine;
        notes(cfgs[i], det, rtc, engine);
        cudnnBackendDescriptor_t plan = nullptr;
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS)
          continue;
        const auto t0 = std::chrono::steady_clock::now();
        int64_t wsz = 0, n = 0;
        cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
        if (cudnnBackendSetAttribute(plan, cudnn_graph::kPlanHandle, CUDNN_TYPE_HANDLE, 1, &h) !=
                CUDNN_STATUS_SUCCESS ||
            cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                     &cfgs[i]) != CUDNN_STATUS_SUCCESS ||
            (st = cudnnBackendFinalize(plan)) != CUDNN_STATUS_SUCCESS ||
            cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &wsz) !=
                CUDNN_STATUS_SUCCESS ||
            wsz < 0 || size_t(wsz) > ws->bytes) {
          if (r.why.empty()) r.why = std::string("plan: ") + cudnnGetErrorString(st);
          cudnnBackendDestroyDescriptor(plan);
          continue;
        }
        r.build_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++r.built;
        const Pack pack(uids, ptrs, ws->p);
        bool ran = true;
        for (int k = 0; k < 2 && ran; ++k) ran = pack.run(h, plan) == CUDNN_STATUS_SUCCESS;
        float ms = 0;
        if (ran) {
          CK(cudaEventRecord(e0, stream));
          for (int k = 0; k < reps && ran; ++k) ran = pack.run(h, plan) == CUDNN_STATUS_SUCCESS;
          CK(cudaEventRecord(e1, stream));
          CK(cudaEventSynchronize(e1));
          CK(cudaEventElapsedTime(&ms, e0, e1));
          ms /= float(reps);
        }
        CK(cudaGetLastError());
        if (!ran) {
          if (r.why.empty()) r.why = "execute failed";
          cudnnBackendDestroyDescriptor(plan);
          continue;
        }
        if (det && (r.ms_det < 0 || ms < r.ms_det)) r.ms_det = ms;
        if (r.ms < 0 || ms < r.ms) {
          if (best.plan) cudnnBackendDestroyDescriptor(best.plan);
          best.plan = plan, best.ws = size_t(wsz);
          r.ms = ms, r.engine = engine, r.det = det, r.rtc = rtc;
          best_uids = uids;
        } else {
          cudnnBackendDestroyDescriptor(plan);
        }
      }
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      if (r.ms >= 0) {
        r.why.clear();
        break;
      }
    }
    return r;
  }
  std::vector<int64_t> best_uids;

  bool run(const Plan& p) {
    const Pack pack(best_uids, ptrs, ws->p);
    const bool ok = pack.run(h, p.plan) == CUDNN_STATUS_SUCCESS;
    CK(cudaStreamSynchronize(stream));
    return ok;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 256;
  int candidates = 8, fused_candidates = 4, reps = 20;
  bool first_is_data = true;
  std::string shapes_arg;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--batch") batch = std::stol(v);
    else if (k == "--shapes") shapes_arg = v;
    else if (k == "--candidates") candidates = std::stoi(v);
    else if (k == "--fused-candidates") fused_candidates = std::stoi(v);
    else if (k == "--reps") reps = std::stoi(v);
    else if (k == "--first-is-data") first_is_data = v == "true";
    else {
      std::fprintf(stderr, "bench-cudnn-fusion: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  // The shapes, in forward order, counted.
  std::vector<Shape> order;
  for (size_t p = 0; p < shapes_arg.size();) {
    size_t e = shapes_arg.find(';', p);
    if (e == std::string::npos) e = shapes_arg.size();
    long c, h, w, k, r, st, pd;
    if (std::sscanf(shapes_arg.substr(p, e - p).c_str(), "%ld,%ld,%ld,%ld,%ld,%ld,%ld", &c, &h, &w, &k, &r, &st, &pd) !=
            7 ||
        c < 1 || h < 1 || w < 1 || k < 1 || r < 1 || st < 1 || pd < 0) {
      std::fprintf(stderr, "bench-cudnn-fusion: --shapes: \"%s\" is not c,h,w,k,r,stride,pad\n",
                   shapes_arg.substr(p, e - p).c_str());
      return 2;
    }
    order.push_back({batch, std::max<int64_t>(c, 8), h, w, k, r, st, pd, first_is_data && order.empty()});
    p = e + 1;
  }
  if (order.empty() || batch < 1 || candidates < 1 || fused_candidates < 1 || reps < 1) {
    std::fprintf(stderr,
                 "bench-cudnn-fusion: give --shapes, and --batch, --candidates, --fused-candidates, --reps >= 1\n");
    return 2;
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::fprintf(stderr, "bench-cudnn-fusion: no CUDA device visible\n");
    return 2;
  }
  std::vector<std::pair<Shape, int>> unique;
  for (const Shape& s : order) {
    auto it = std::find_if(unique.begin(), unique.end(), [&](const std::pair<Shape, int>& u) {
      const Shape& q = u.first;
      return q.c == s.c && q.h == s.h && q.w == s.w && q.k == s.k && q.r == s.r && q.stride == s.stride &&
             q.pad == s.pad && q.data == s.data;
    });
    if (it == unique.end()) unique.push_back({s, 1});
    else ++it->second;
  }
  cudnnHandle_t h;
  if (cudnnCreate(&h) != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "bench-cudnn-fusion: cudnnCreate failed\n");
    return 1;
  }
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  cudnnSetStream(h, stream);
  Dev ws(size_t(1) << 30);
  std::printf("{\"bench\": \"cudnn-fusion\", \"cudnn\": %zu, \"batch\": %ld, \"convolutions\": %zu, \"shapes\": %zu}\n",
              cudnnGetVersion(), long(batch), order.size(), unique.size());
  double total[kVariants] = {}, total_det[kVariants] = {};
  bool complete[kVariants], complete_det[kVariants];
  std::fill(complete, complete + kVariants, true);
  std::fill(complete_det, complete_det + kVariants, true);
  for (const auto& [s, count] : unique) {
    const int64_t nx = s.n * s.c * s.h * s.w, ny = s.n * s.k * s.oh() * s.ow(), nw = s.k * s.c * s.r * s.r;
    Dev x(nx * 2), w(nw * 2), y(ny * 2), sc(s.c * 2), bi(s.c * 2), sum(s.k * 4), sq(s.k * 4), dy(ny * 2), dx(nx * 2),
        xr(nx * 2), dw(nw * 2), rx(nx * 2);
    const std::vector<float> hx = random(size_t(nx), 1, -1.f, 1.f), hw = random(size_t(nw), 2, -0.05f, 0.05f);
    const std::vector<float> hs = random(size_t(s.c), 3, 0.5f, 1.5f), hb = random(size_t(s.c), 4, -0.5f, 0.5f);
    const std::vector<float> hdy = random(size_t(ny), 5, -1.f, 1.f), hxr = random(size_t(nx), 6, -1.f, 1.f);
    std::vector<float> hr(static_cast<size_t>(nx));  // relu(x·s + b) rounded to bf16: the prologue's result
    for (int64_t i = 0; i < nx; ++i)
      hr[size_t(i)] = round_bf16(std::max(0.f, hx[size_t(i)] * hs[size_t(i % s.c)] + hb[size_t(i % s.c)]));
    upload(x, hx, true), upload(w, hw, true), upload(sc, hs, true), upload(bi, hb, true);
    upload(dy, hdy, true), upload(xr, hxr, true), upload(rx, hr, true);
    const std::map<int64_t, void*> ptrs = {{kX, x.p},   {kW, w.p},   {kY, y.p},    {kS, sc.p},
                                           {kB, bi.p},  {kSum, sum.p}, {kSq, sq.p}, {kDY, dy.p},
                                           {kDX, dx.p}, {kXR, xr.p},  {kDW, dw.p}};
    Bench b{h, stream, &ws, candidates, fused_candidates, reps, ptrs};
    for (int vi = 0; vi < kVariants; ++vi) {
      const Variant v = Variant(vi);
      const bool counted = !(s.data && (v == kDgrad || v == kDgradDrelu || v == kSbrFwdStats || v == kSbrWgrad));
      Plan best;
      Result r = b.time(v, s, best);
      // The check: the best plan's outputs, poisoned first, against the plain pattern's on the
      // same operands (the prologue applied on the host, the ReLU mask and sums on the host).
      if (best.plan) {
        auto plain_on = [&](Variant pv, void* xin, Dev& out, size_t n) {
          Plan p;
          Bench pb = b;
          pb.ptrs[kX] = xin;
          pb.reps = 1, pb.candidates = 1, pb.fused_candidates = 1;
          pb.time(pv, s, p);
          std::vector<float> o;
          if (p.plan) {
            out.poison();
            if (pb.run(p)) o = download(out, n, true);
            cudnnBackendDestroyDescriptor(p.plan);
          }
          return o;
        };
        if (v == kFwdStats || v == kSbrFwdStats) {
          y.poison(), sum.poison(), sq.poison();
          if (b.run(best)) {
            const std::vector<float> hy = download(y, size_t(ny), true), hsum = download(sum, size_t(s.k), false),
                                     hsq = download(sq, size_t(s.k), false);
            std::vector<double> rs(size_t(s.k)), rq(size_t(s.k));
            for (int64_t i = 0; i < ny; ++i) {
              const double t = hy[size_t(i)];
              rs[size_t(i % s.k)] += t, rq[size_t(i % s.k)] += t * t;
            }
            std::vector<float> both(hsum);
            both.insert(both.end(), hsq.begin(), hsq.end());
            std::vector<double> ref(rs);
            ref.insert(ref.end(), rq.begin(), rq.end());
            r.err2 = rel_err(both, ref);
            if (v == kSbrFwdStats) {
              const std::vector<float> py = plain_on(kFwd, rx.p, y, size_t(ny));
              if (!py.empty()) r.err = rel_err(hy, std::vector<double>(py.begin(), py.end()));
            }
          }
        } else if (v == kDgradDrelu) {
          dx.poison();
          if (b.run(best)) {
            const std::vector<float> got = download(dx, size_t(nx), true);
            std::vector<float> pd = plain_on(kDgrad, x.p, dx, size_t(nx));
            if (!pd.empty()) {
              std::vector<double> ref(static_cast<size_t>(nx));
              for (int64_t i = 0; i < nx; ++i) ref[size_t(i)] = hxr[size_t(i)] > 0 ? pd[size_t(i)] : 0.0;
              r.err = rel_err(got, ref);
            }
          }
        } else if (v == kSbrWgrad) {
          dw.poison();
          if (b.run(best)) {
            const std::vector<float> got = download(dw, size_t(nw), true);
            const std::vector<float> pw = plain_on(kWgrad, rx.p, dw, size_t(nw));
            if (!pw.empty()) r.err = rel_err(got, std::vector<double>(pw.begin(), pw.end()));
          }
        }
        cudnnBackendDestroyDescriptor(best.plan);
      }
      if (counted) {
        if (r.ms >= 0) total[vi] += count * r.ms;
        else complete[vi] = false;
        if (r.ms_det >= 0) total_det[vi] += count * r.ms_det;
        else complete_det[vi] = false;
      }
      std::printf("{\"shape\": \"%s\", \"count\": %d, \"counted\": %s, \"pattern\": \"%s\", \"offered\": %d, "
                  "\"built\": %d, \"ms\": %.5f, \"ms_deterministic\": %.5f, \"engine\": %ld, \"deterministic\": %s, "
                  "\"runtime_compiled\": %s, \"build_s\": %.2f, \"check_rel_err\": %.3g, \"stats_rel_err\": %.3g, "
                  "\"why\": \"%s\"}\n",
                  s.text().c_str(), count, counted ? "true" : "false", kNames[vi], r.offered, r.built, r.ms, r.ms_det,
                  long(r.engine), r.det ? "true" : "false", r.rtc ? "true" : "false", r.build_s, r.err, r.err2,
                  r.why.c_str());
      std::fflush(stdout);
    }
  }
  std::printf("\npattern          sum ms (fastest)  sum ms (deterministic)   per convolution counted\n");
  for (int vi = 0; vi < kVariants; ++vi)
    std::printf("%-16s %10.4f%s %18.4f%s\n", kNames[vi], total[vi], complete[vi] ? " " : "*", total_det[vi],
                complete_det[vi] ? " " : "*");
  std::printf("(* some shape had no usable plan: the sum leaves it out)\n");
  std::printf("plain convolutions (fwd + dgrad + wgrad): %.4f ms fastest, %.4f deterministic\n",
              total[kFwd] + total[kDgrad] + total[kWgrad], total_det[kFwd] + total_det[kDgrad] + total_det[kWgrad]);
  std::printf("{\"bench\": \"cudnn-fusion-sums\", \"batch\": %ld", long(batch));
  for (int vi = 0; vi < kVariants; ++vi)
    std::printf(", \"%s_ms\": %.5f, \"%s_ms_deterministic\": %.5f", kNames[vi], total[vi], kNames[vi], total_det[vi]);
  std::printf("}\n");
  cudnnDestroy(h);
  return 0;
}
