// The CUDA backend against the CPU backend (the oracle), op by op, on fresh random data, plus a
// one-rank NCCL sanity check. Every test skips where no CUDA device is visible.
//
// Tolerances are on the relative error ‖gpu − cpu‖₂ / ‖cpu‖₂ of a whole output:
//   fp32 1e-5  Both sides compute in IEEE fp32; GEMMs differ only in summation order (blocking,
//              split-K, FMA), which for sums of up to ~1000 terms of mixed sign stays around
//              1e-6; the elementwise math (exp, erf) differs by a few ulp.
//   tf32 5e-3  TF32 keeps 10 mantissa bits: each product carries ~2^-11 relative error.
//   bf16 2e-2  bf16 keeps 7 mantissa bits (2^-8 per operand), products accumulate in fp32.
// Outputs are poisoned with NaN on the GPU before each op, so an element the GPU forgets to write
// fails the comparison.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/comm.hpp"
#include "dpt/data.hpp"
#include "gpu_util.hpp"

namespace {
using namespace dpt;
using namespace dpt::gpu_test;

// {1000, 16, 516}: the bias gradient summed over several row chunks, 16-byte column vectors.
const Shape kShapes[] = {{33, 17, 5}, {1, 1, 1}, {7, 64, 129}, {256, 784, 1024}, {1000, 16, 516}};
const Act kActs[] = {Act::none, Act::relu, Act::tanh, Act::sigmoid, Act::gelu};

TEST(CudaBackend, Describe) {
  SKIP_WITHOUT_GPU();
  for (Precision p : kPrecisions) {
    auto be = gpu(p);
    EXPECT_EQ(be->name(), "cuda");
    EXPECT_FALSE(be->host_addressable());
    EXPECT_NE(be->describe().find("math:"), std::string::npos) << be->describe();
    std::printf("%s\n", be->describe().c_str());
  }
}

TEST(CudaBackend, LinearForward) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  for (Precision p : kPrecisions) {
    auto g = gpu(p);
    for (const Shape& s : kShapes)
      for (Act act : kActs) {
        const LayerData d(s, 100 + uint64_t(s.out));
        const size_t n = size_t(s.batch) * s.out;
        auto cx = put(*cpu, d.x), cw = put(*cpu, d.w), cb = put(*cpu, d.b);
        Buffer<float> cz(*cpu, n), ca(*cpu, n);
        cpu->linear_forward(cx.data(), cw.data(), cb.data(), cz.data(), ca.data(), s.batch, s.in,
                            s.out, act);
        auto gx = put(*g, d.x), gw = put(*g, d.w), gb = put(*g, d.b);
        auto gz = poisoned(*g, n), ga = poisoned(*g, n);
        g->linear_forward(gx.data(), gw.data(), gb.data(), gz.data(), ga.data(), s.batch, s.in,
                          s.out, act);
        EXPECT_LE(rel_err(get(*g, gz), get(*cpu, cz)), tolerance(p)) << "z " << label(p, act, s);
        EXPECT_LE(rel_err(get(*g, ga), get(*cpu, ca)), tolerance(p)) << "a " << label(p, act, s);
        if (act == Act::none) {  // a may alias z
          auto gz2 = poisoned(*g, n);
          g->linear_forward(gx.data(), gw.data(), gb.data(), gz2.data(), gz2.data(), s.batch,
                            s.in, s.out, act);
          EXPECT_LE(rel_err(get(*g, gz2), get(*cpu, cz)), tolerance(p)) << label(p, act, s);
        }
      }
  }
}

// Backward from the CPU's forward outputs, so that only the backward op is compared.
void check_backward(Backend& cpu, Backend& g, Precision p, const Shape& s, Act act, bool accumulate,
                    bool want_dx) {
  const std::string what = label(p, act, s) + (accumulate ? " accumulate" : "") +
                           (want_dx ? "" : " no dx");
  const LayerData d(s, 200 + uint64_t(s.in));
  const size_t n = size_t(s.batch) * s.out;
  auto cx = put(cpu, d.x), cw = put(cpu, d.w), cb = put(cpu, d.b);
  Buffer<float> cz(cpu, n), ca(cpu, n);
  cpu.linear_forward(cx.data(), cw.data(), cb.data(), cz.data(), ca.data(), s.batch, s.in, s.out,
                     act);
  const std::vector<float> z = get(cpu, cz), a = get(cpu, ca);
  const std::vector<float> da = uniform(n, 300);
  // Gradients already there (kept when accumulating; poison on the GPU otherwise).
  const std::vector<float> dw0 = uniform(size_t(s.out) * s.in, 301), db0 = uniform(size_t(s.out), 302);

  auto cda = put(cpu, da);
  // Named vectors, not temporaries in a conditional (GCC 12 warns falsely on those).
  const std::vector<float> zero_w(dw0.size(), 0.f), zero_b(db0.size(), 0.f);
  auto cdw = put(cpu, accumulate ? dw0 : zero_w);
  auto cdb = put(cpu, accumulate ? db0 : zero_b);
  Buffer<float> cdx(cpu, want_dx ? size_t(s.batch) * s.in : 0);
  cpu.linear_backward(cx.data(), cw.data(), cz.data(), ca.data(), cda.data(), s.batch, s.in,
                      s.out, act, cdw.data(), cdb.data(), want_dx ? cdx.data() : nullptr,
                      accumulate);

  auto gx = put(g, d.x), gw = put(g, d.w), gz = put(g, z), ga = put(g, a), gda = put(g, da);
  Buffer<float> gdw = accumulate ? put(g, dw0) : poisoned(g, dw0.size());
  Buffer<float> gdb = accumulate ? put(g, db0) : poisoned(g, db0.size());
  Buffer<float> gdx = want_dx ? poisoned(g, size_t(s.batch) * s.in) : Buffer<float>();
  g.linear_backward(gx.data(), gw.data(), gz.data(), ga.data(), gda.data(), s.batch, s.in, s.out,
                    act, gdw.data(), gdb.data(), want_dx ? gdx.data() : nullptr, accumulate);

  // dz and db involve no GEMM: fp32 accuracy whatever the precision.
  EXPECT_LE(rel_err(get(g, gda), get(cpu, cda)), 1e-5) << "dz " << what;
  EXPECT_LE(rel_err(get(g, gdb), get(cpu, cdb)), 1e-5) << "db " << what;
  EXPECT_LE(rel_err(get(g, gdw), get(cpu, cdw)), tolerance(p)) << "dw " << what;
  if (want_dx) EXPECT_LE(rel_err(get(g, gdx), get(cpu, cdx)), tolerance(p)) << "dx " << what;
}

TEST(CudaBackend, LinearBackward) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  for (Precision p : kPrecisions) {
    auto g = gpu(p);
    for (const Shape& s : kShapes)
      for (Act act : kActs)
        for (bool acc : {false, true}) check_backward(*cpu, *g, p, s, act, acc, true);
    check_backward(*cpu, *g, p, kShapes[0], Act::relu, false, false);
  }
}

// ---- cuBLASLt (the default GEMM path: the forward GEMM adds the bias in its epilogue) ----
// A backend with DPT_CUBLASLT / DPT_LT_ALGO set as given for its construction (nullptr: unset).
std::unique_ptr<Backend> gpu_env(Precision p, const char* lt, const char* algo) {
  auto set = [](const char* k, const char* v) { v ? setenv(k, v, 1) : unsetenv(k); };
  set("DPT_CUBLASLT", lt);
  set("DPT_LT_ALGO", algo);
  auto g = gpu(p);
  unsetenv("DPT_CUBLASLT");
  unsetenv("DPT_LT_ALGO");
  return g;
}

// Backend memory holding v at an offset of `off` floats into the allocation (off = 1: every
// pointer only 4-byte aligned, below what cuBLASLt's vectorized kernels and its bias epilogue
// take, so the plan must pick another kernel or fall back).
struct Offset {
  Buffer<float> buf;
  size_t off;
  Offset(Backend& be, const std::vector<float>& v, size_t o) : buf(be, v.size() + o), off(o) {
    be.fill(buf.data(), buf.size(), kNaN);
    if (!v.empty()) be.upload(ptr(), v.data(), v.size() * sizeof(float));
  }
  float* ptr() const { return buf.data() + off; }
  std::vector<float> get(Backend& be, size_t n) const {
    std::vector<float> h(n);
    be.download(h.data(), ptr(), n * sizeof(float));
    return h;
  }
};

// Forward and backward of one layer against the CPU backend with every GPU operand `off` floats
// into its allocation; the backward from the CPU's forward outputs (as check_backward).
void check_layer_at(Backend& cpu, Backend& g, Precision p, const Shape& s, Act act, bool acc,
                    size_t off) {
  const std::string what = label(p, act, s) + " offset " + std::to_string(off) +
                           (acc ? " accumulate" : "");
  const LayerData d(s, 500 + uint64_t(s.out));
  const size_t n = size_t(s.batch) * s.out, nw = size_t(s.out) * s.in;
  auto cx = put(cpu, d.x), cw = put(cpu, d.w), cb = put(cpu, d.b);
  Buffer<float> cz(cpu, n), ca(cpu, n);
  cpu.linear_forward(cx.data(), cw.data(), cb.data(), cz.data(), ca.data(), s.batch, s.in, s.out, act);
  const std::vector<float> z = get(cpu, cz), a = get(cpu, ca);

  Offset gx(g, d.x, off), gw(g, d.w, off), gb(g, d.b, off);
  Offset gz(g, std::vector<float>(n, kNaN), off), ga(g, std::vector<float>(n, kNaN), off);
  g.linear_forward(gx.ptr(), gw.ptr(), gb.ptr(), gz.ptr(), ga.ptr(), s.batch, s.in, s.out, act);
  EXPECT_LE(rel_err(gz.get(g, n), z), tolerance(p)) << "z " << what;
  EXPECT_LE(rel_err(ga.get(g, n), a), tolerance(p)) << "a " << what;

  const std::vector<float> da = uniform(n, 600);
  const std::vector<float> dw0 = uniform(nw, 601), db0 = uniform(size_t(s.out), 602);
  auto cda = put(cpu, da);
  auto cdw = put(cpu, acc ? dw0 : std::vector<float>(nw, 0.f));
  auto cdb = put(cpu, acc ? db0 : std::vector<float>(size_t(s.out), 0.f));
  Buffer<float> cdx(cpu, size_t(s.batch) * s.in);
  cpu.linear_backward(cx.data(), cw.data(), cz.data(), ca.data(), cda.data(), s.batch, s.in, s.out,
                      act, cdw.data(), cdb.data(), cdx.data(), acc);
  Offset hz(g, z, off), ha(g, a, off), hda(g, da, off);
  Offset gdw(g, acc ? dw0 : std::vector<float>(nw, kNaN), off);
  Offset gdb(g, acc ? db0 : std::vector<float>(size_t(s.out), kNaN), off);
  Offset gdx(g, std::vector<float>(size_t(s.batch) * s.in, kNaN), off);
  g.linear_backward(gx.ptr(), gw.ptr(), hz.ptr(), ha.ptr(), hda.ptr(), s.batch, s.in, s.out, act,
                    gdw.ptr(), gdb.ptr(), gdx.ptr(), acc);
  EXPECT_LE(rel_err(hda.get(g, n), get(cpu, cda)), 1e-5) << "dz " << what;
  EXPECT_LE(rel_err(gdb.get(g, size_t(s.out)), get(cpu, cdb)), 1e-5) << "db " << what;
  EXPECT_LE(rel_err(gdw.get(g, nw), get(cpu, cdw)), tolerance(p)) << "dw " << what;
  EXPECT_LE(rel_err(gdx.get(g, size_t(s.batch) * s.in), get(cpu, cdx)), tolerance(p)) << "dx " << what;
}

// Both GEMM paths (cuBLASLt with the bias epilogue, and cublasGemmEx with DPT_CUBLASLT=0), every
// activation, accumulate or not, aligned and misaligned operands (the latter also a misaligned
// bias, which the Lt path must leave to the kernel), and a later heuristic candidate.
TEST(CudaBackend, GemmPathsAndAlignment) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  const Shape shapes[] = {{33, 17, 5}, {64, 128, 256}, {7, 64, 129}, {256, 784, 1024}};
  struct Env { const char* lt; const char* algo; const char* tag; };
  for (Env e : {Env{nullptr, nullptr, "cuBLASLt"}, Env{"0", nullptr, "cublasGemmEx"},
                Env{"1", "3", "cuBLASLt"}})
    for (Precision p : kPrecisions) {
      auto g = gpu_env(p, e.lt, e.algo);
      EXPECT_NE(g->describe().find(e.tag), std::string::npos) << g->describe();
      for (const Shape& s : shapes)
        for (Act act : kActs)
          for (size_t off : {size_t(0), size_t(1), size_t(2)})
            for (bool acc : {false, true}) {
              SCOPED_TRACE(std::string("DPT_CUBLASLT=") + (e.lt ? e.lt : "unset") +
                           " DPT_LT_ALGO=" + (e.algo ? e.algo : "unset"));
              check_layer_at(*cpu, *g, p, s, act, acc, off);
            }
    }
}

TEST(CudaBackend, SoftmaxXent) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu();
  struct Case { int batch, classes; };
  for (Case c : {Case{33, 5}, Case{256, 10}, Case{7, 1000}, Case{64, 37}, Case{1, 1}}) {
    const std::string what = "batch " + std::to_string(c.batch) + " classes " + std::to_string(c.classes);
    const size_t n = size_t(c.batch) * c.classes;
    const std::vector<float> logits = uniform(n, 400 + uint64_t(c.classes), -4.f, 4.f);
    std::vector<int32_t> labels(size_t(c.batch));
    SplitMix64 r(401);
    for (auto& y : labels) y = int32_t(r.below(uint64_t(c.classes)));
    const std::vector<float> stats0 = {0.5f, 2.f};  // the op adds to what is there
    const float scale = 1.f / float(c.batch);

    auto cl = put(*cpu, logits);
    auto cy = put(*cpu, labels);
    auto cs = put(*cpu, stats0);
    Buffer<float> cd(*cpu, n);
    cpu->softmax_xent(cl.data(), cy.data(), c.batch, c.classes, scale, cd.data(), cs.data());

    auto gl = put(*g, logits);
    auto gy = put(*g, labels);
    auto gs = put(*g, stats0);
    auto gd = poisoned(*g, n);
    g->softmax_xent(gl.data(), gy.data(), c.batch, c.classes, scale, gd.data(), gs.data());
    const auto want = get(*cpu, cs), got = get(*g, gs);
    EXPECT_LE(rel_err({got[0]}, {want[0]}), 1e-5) << "loss " << what;
    EXPECT_EQ(got[1], want[1]) << "correct count " << what;
    EXPECT_LE(rel_err(get(*g, gd), get(*cpu, cd)), 1e-5) << "dlogits " << what;

    // Without dlogits: only the statistics.
    auto gs2 = put(*g, stats0);
    g->softmax_xent(gl.data(), gy.data(), c.batch, c.classes, scale, nullptr, gs2.data());
    EXPECT_EQ(get(*g, gs2), got) << "stats without dlogits " << what;
  }
}

TEST(CudaBackend, OptimizerStep) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu();
  // 1000003: the float4 path plus a tail of 3; offset 1: a misaligned slice (scalar path).
  for (OptKind kind : {OptKind::sgd, OptKind::momentum, OptKind::nesterov, OptKind::adam,
                       OptKind::adamw})
    for (size_t n : {size_t(7), size_t(1000003)})
      for (size_t off : {size_t(0), size_t(1)}) {
        const std::string what = "optimizer " + std::to_string(int(kind)) + " n " +
                                 std::to_string(n) + " offset " + std::to_string(off);
        OptimStep h;
        h.kind = kind;
        h.lr = 0.01f;
        h.momentum = 0.9f;
        h.weight_decay = 0.01f;
        const std::vector<float> p0 = uniform(n + off, 500), zeros(n + off, 0.f);
        auto cp = put(*cpu, p0), cs1 = put(*cpu, zeros), cs2 = put(*cpu, zeros);
        auto gp = put(*g, p0), gs1 = put(*g, zeros), gs2 = put(*g, zeros);
        for (int t = 1; t <= 5; ++t) {
          h.t = t;
          const std::vector<float> grad = uniform(n + off, 600 + uint64_t(t), -0.1f, 0.1f);
          auto cg = put(*cpu, grad);
          auto gg = put(*g, grad);
          cpu->optimizer_step(cp.data() + off, cg.data() + off, cs1.data() + off,
                              cs2.data() + off, n, h);
          g->optimizer_step(gp.data() + off, gg.data() + off, gs1.data() + off, gs2.data() + off,
                            n, h);
        }
        EXPECT_LE(rel_err(get(*g, gp), get(*cpu, cp)), 1e-5) << "p " << what;
        EXPECT_LE(rel_err(get(*g, gs1), get(*cpu, cs1)), 1e-5) << "state 1 " << what;
        EXPECT_LE(rel_err(get(*g, gs2), get(*cpu, cs2)), 1e-5) << "state 2 " << what;
      }
}

// LARS and LAMB: the GPU's two passes against the CPU backend's, on 70 tensors (two launches of
// at most 64) of which one is long enough for many partial-sum blocks; the loop's path (lr and t
// from the step control on the device) over the whole arena and, for the sums, over two ranges
// that cut a tensor, added as a sharded caller would; the sums bitwise reproducible; a step
// with ctl->bad changes nothing.
TEST(CudaBackend, LayerwiseOptimizersMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu();
  std::vector<TensorSeg> segs;
  size_t n = 0;
  for (int i = 0; i < 70; ++i) {
    const size_t len = i == 3 ? 700001 : size_t(5 + 37 * i);
    segs.push_back({n, n + len, i % 2 == 0});
    n += len;
  }
  const size_t cut = segs[3].begin + 12345;
  for (OptKind kind : {OptKind::lars, OptKind::lamb}) {
    const std::string what = kind == OptKind::lars ? "lars" : "lamb";
    OptimStep h;
    h.kind = kind;
    h.momentum = 0.9f;
    h.weight_decay = 0.01f;
    h.trust_coefficient = kind == OptKind::lars ? 0.02f : 1.f;
    h.trust_clip = kind == OptKind::lars ? 0.f : 0.5f;
    const std::vector<float> p0 = uniform(n, 700), zeros(n, 0.f), lr{0.05f, 0.04f, 0.03f, 0.02f};
    auto cp = put(*cpu, p0), cs1 = put(*cpu, zeros), cs2 = put(*cpu, zeros);
    auto gp = put(*g, p0), gs1 = put(*g, zeros), gs2 = put(*g, zeros);
    auto glr = put(*g, lr);
    Buffer<float> csums(*cpu, 2 * segs.size()), gsums(*g, 2 * segs.size());
    Buffer<StepCtl> gctl(*g, 1);
    for (int t = 1; t <= 4; ++t) {
      h.t = t;
      h.lr = lr[size_t(t - 1)];
      const std::vector<float> grad = uniform(n, 800 + uint64_t(t), -0.1f, 0.1f);
      auto cg = put(*cpu, grad);
      auto gg = put(*g, grad);
      cpu->fill(csums.data(), csums.size(), 0.f);  // the sums passes add into them
      cpu->layer_sums(cp.data(), cg.data(), cs1.data(), cs2.data(), 0, n, segs, h, nullptr, nullptr, csums.data());
      cpu->layer_apply(cp.data(), cg.data(), cs1.data(), cs2.data(), 0, n, segs, csums.data(), h, nullptr, nullptr);
      StepCtl c;
      c.step = t - 1;
      c.updates = t - 1;
      g->upload(gctl.data(), &c, sizeof c);
      g->fill(gsums.data(), gsums.size(), 0.f);
      if (t % 2) {  // the whole arena
        g->layer_sums(gp.data(), gg.data(), gs1.data(), gs2.data(), 0, n, segs, h, glr.data(), gctl.data(), gsums.data());
      } else {      // two ranges, their sums added into one buffer
        g->layer_sums(gp.data(), gg.data(), gs1.data(), gs2.data(), 0, cut, segs, h, glr.data(), gctl.data(), gsums.data());
        g->layer_sums(gp.data() + cut, gg.data() + cut, gs1.data() + cut, gs2.data() + cut, cut, n - cut, segs, h,
                      glr.data(), gctl.data(), gsums.data());
      }
      EXPECT_LE(rel_err(get(*g, gsums), get(*cpu, csums)), 1e-5) << "sums " << what << " step " << t;
      g->layer_apply(gp.data(), gg.data(), gs1.data(), gs2.data(), 0, n, segs, gsums.data(), h, glr.data(), gctl.data());
    }
    EXPECT_LE(rel_err(get(*g, gp), get(*cpu, cp)), 1e-5) << "p " << what;
    EXPECT_LE(rel_err(get(*g, gs1), get(*cpu, cs1)), 1e-5) << "state 1 " << what;
    if (kind == OptKind::lamb) EXPECT_LE(rel_err(get(*g, gs2), get(*cpu, cs2)), 1e-5) << "state 2 " << what;
    // LARS's sums pass writes nothing but the sums: running it twice gives the same bits.
    if (kind == OptKind::lars) {
      const std::vector<float> grad = uniform(n, 900, -0.1f, 0.1f);
      auto gg = put(*g, grad);
      g->fill(gsums.data(), gsums.size(), 0.f);
      g->layer_sums(gp.data(), gg.data(), gs1.data(), gs2.data(), 0, n, segs, h, glr.data(), gctl.data(), gsums.data());
      const std::vector<float> first = get(*g, gsums);
      g->fill(gsums.data(), gsums.size(), 0.f);
      g->layer_sums(gp.data(), gg.data(), gs1.data(), gs2.data(), 0, n, segs, h, glr.data(), gctl.data(), gsums.data());
      EXPECT_EQ(first, get(*g, gsums)) << "sums not reproducible";
    }
    // ctl->bad: neither pass touches parameters or state.
    StepCtl bad;
    bad.bad = 1;
    g->upload(gctl.data(), &bad, sizeof bad);
    const std::vector<float> p_before = get(*g, gp), s_before = get(*g, gs1);
    auto gg = put(*g, uniform(n, 901, -0.1f, 0.1f));
    g->layer_sums(gp.data(), gg.data(), gs1.data(), gs2.data(), 0, n, segs, h, glr.data(), gctl.data(), gsums.data());
    g->layer_apply(gp.data(), gg.data(), gs1.data(), gs2.data(), 0, n, segs, gsums.data(), h, glr.data(), gctl.data());
    EXPECT_EQ(get(*g, gp), p_before) << what;
    EXPECT_EQ(get(*g, gs1), s_before) << what;
  }
}

TEST(CudaBackend, FillScaleCopyAllFinite) {
  SKIP_WITHOUT_GPU();
  auto g = gpu();
  for (size_t n : {size_t(1), size_t(1001), size_t(3) << 20}) {
    auto b = poisoned(*g, n);
    g->fill(b.data(), n, 3.5f);
    g->scale(b.data(), n, -2.f);
    EXPECT_EQ(get(*g, b), std::vector<float>(n, -7.f)) << n;
    Buffer<float> c(*g, n);
    g->copy(c.data(), b.data(), n * sizeof(float));
    EXPECT_TRUE(g->all_finite(c.data(), n)) << n;
    const float bad[2] = {kNaN, std::numeric_limits<float>::infinity()};
    for (float v : bad) {
      g->upload(c.data() + n / 2, &v, sizeof v);
      EXPECT_FALSE(g->all_finite(c.data(), n)) << "planted " << v << " at " << n / 2 << " of " << n;
      g->copy(c.data(), b.data(), n * sizeof(float));
    }
    EXPECT_TRUE(g->all_finite(c.data(), n));
  }
}

// upload() may stage through pinned slots and return before the GPU has copied: the host buffer
// must still be reusable at once, across several slots and a wrap-around of the ring.
TEST(CudaBackend, UploadReusesHostBufferAtOnce) {
  SKIP_WITHOUT_GPU();
  auto g = gpu();
  const size_t n = (size_t(11) << 20) / sizeof(float);  // 11 MiB: several staging slots
  std::vector<float> host(n);
  std::vector<Buffer<float>> dev;
  for (int k = 0; k < 4; ++k) {
    std::fill(host.begin(), host.end(), float(k + 1));
    dev.emplace_back(*g, n);
    g->upload(dev.back().data(), host.data(), n * sizeof(float));
  }
  std::fill(host.begin(), host.end(), -1.f);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(get(*g, dev[size_t(k)]), std::vector<float>(n, float(k + 1)));
}

Dataset small_dataset(bool u8) {
  Dataset ds;
  ds.path = u8 ? "synthetic-u8" : "synthetic-f32";
  ds.n = 100;
  ds.dim = 13;
  ds.sample_shape = {13};
  ds.num_classes = 7;
  ds.is_u8 = u8;
  ds.scale = u8 ? 1.f / 255.f : 0.5f;
  ds.offset = -0.25f;
  SplitMix64 r(700);
  if (u8) {
    ds.u8.resize(size_t(ds.n * ds.dim));
    for (auto& v : ds.u8) v = uint8_t(r.below(256));
  } else {
    ds.f32 = uniform(size_t(ds.n * ds.dim), 701, -3.f, 3.f);
  }
  ds.labels.resize(size_t(ds.n));
  for (auto& y : ds.labels) y = int32_t(r.below(7));
  return ds;
}

TEST(CudaBackend, LoadBatchMatchesGather) {
  SKIP_WITHOUT_GPU();
  auto g = gpu();
  for (bool u8 : {true, false}) {
    const Dataset ds = small_dataset(u8);
    SplitMix64 r(800);
    for (int round = 0; round < 3; ++round) {  // first call uploads the dataset, later reuse it
      const int count = 37;
      std::vector<int64_t> rows(static_cast<size_t>(count));
      for (auto& i : rows) i = int64_t(r.below(uint64_t(ds.n)));
      rows[0] = 0;
      rows[1] = ds.n - 1;
      std::vector<float> want_x(size_t(count * ds.dim));
      std::vector<int32_t> want_y(static_cast<size_t>(count));
      ds.gather(rows.data(), count, want_x.data(), want_y.data());
      auto x = poisoned(*g, want_x.size());
      Buffer<int32_t> y(*g, size_t(count));
      g->load_batch(ds, rows.data(), count, x.data(), y.data());
      EXPECT_LE(rel_err(get(*g, x), want_x), 1e-6) << ds.path << " round " << round;
      EXPECT_EQ(get(*g, y), want_y) << ds.path << " round " << round;
    }
  }
}

// TF32's weight gradient with its operands made K-major first (DPT_TF32_TRANSPOSE: 1 the
// smaller of x and dz, 2 both) or as they are (0): the same product, within TF32's tolerance of
// the CPU. The shapes take both branches of 1 (in <= out and in > out).
TEST(CudaBackend, Tf32WeightGradientInEveryOperandLayout) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  for (const char* mode : {"0", "1", "2"}) {
    auto g = [&] {
      const ScopedEnv env({{"DPT_TF32_TRANSPOSE", mode}});
      return gpu(Precision::tf32);
    }();
    SCOPED_TRACE(std::string("DPT_TF32_TRANSPOSE=") + mode);
    for (const Shape& sh : kShapes)
      for (bool acc : {false, true}) check_backward(*cpu, *g, Precision::tf32, sh, Act::relu, acc, true);
  }
}

// Data left in host memory (DPT_STREAM_DATA=1) streams through the pinned slots: the same
// values as the host's gather, for scattered rows, runs of consecutive rows, batches that grow
// the slots, and more batches than slots in flight before anything is read back.
TEST(CudaBackend, StreamedBatchesMatchGather) {
  SKIP_WITHOUT_GPU();
  auto g = [] {
    const ScopedEnv env({{"DPT_STREAM_DATA", "1"}});
    return gpu();
  }();
  for (bool u8 : {true, false}) {
    const Dataset ds = small_dataset(u8);
    SplitMix64 r(900);
    std::vector<std::vector<float>> want_x;
    std::vector<std::vector<int32_t>> want_y;
    std::vector<Buffer<float>> xs;
    std::vector<Buffer<int32_t>> ys;
    for (int round = 0; round < 6; ++round) {
      const int count = 5 + 13 * round;  // grows: the slots are re-allocated
      std::vector<int64_t> rows(static_cast<size_t>(count));
      const int64_t start = int64_t(r.below(uint64_t(ds.n - count)));
      for (int i = 0; i < count; ++i)  // even rounds: one run; odd: scattered
        rows[size_t(i)] = round % 2 == 0 ? start + i : int64_t(r.below(uint64_t(ds.n)));
      want_x.emplace_back(size_t(count * ds.dim));
      want_y.emplace_back(static_cast<size_t>(count));
      ds.gather(rows.data(), count, want_x.back().data(), want_y.back().data());
      xs.push_back(poisoned(*g, want_x.back().size()));
      ys.emplace_back(*g, size_t(count));
      g->load_batch(ds, rows.data(), count, xs.back().data(), ys.back().data());
    }
    for (size_t i = 0; i < xs.size(); ++i) {
      EXPECT_LE(rel_err(get(*g, xs[i]), want_x[i]), 1e-6) << ds.path << " batch " << i;
      EXPECT_EQ(get(*g, ys[i]), want_y[i]) << ds.path << " batch " << i;
    }
    const int64_t bad = ds.n;
    Buffer<float> x(*g, size_t(ds.dim));
    Buffer<int32_t> y(*g, 1);
    EXPECT_THROW(g->load_batch(ds, &bad, 1, x.data(), y.data()), std::exception);
  }
}

// One rank: allreduce and broadcast over NCCL leave the data as it is.
TEST(NcclComm, OneRankSanity) {
  SKIP_WITHOUT_GPU();
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 1) GTEST_SKIP() << "one-rank test";
  auto g = gpu();
  auto comm = make_nccl_comm(MPI_COMM_WORLD, *g);
  EXPECT_EQ(comm->name(), "nccl");
  const std::vector<float> v = uniform(1000, 900);
  auto a = put(*g, v);
  Buffer<float> b(*g, v.size());
  comm->allreduce(a.data(), b.data(), v.size(), DType::f32, RedOp::sum);
  comm->allreduce(a.data(), v.size());  // in place
  comm->broadcast(a.data(), v.size(), 0);
  comm->synchronize();
  EXPECT_EQ(get(*g, a), v);
  EXPECT_EQ(get(*g, b), v);
}

}  // namespace
