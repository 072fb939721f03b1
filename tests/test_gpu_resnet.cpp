// The CUDA backend's residual-network ops (batch norm, global and padded pooling, the
// label-smoothed cross-entropy) against the CPU backend (the oracle), op by op, on random data;
// the residual sum and its gradient stream are test_gpu_residual's. Every test skips where no
// CUDA device is visible.
//
// Tolerances (relative error ‖gpu − cpu‖₂ / ‖cpu‖₂ of a whole output, unless said otherwise):
//   exact   global average pooling's backward (one IEEE multiply per element); global average pooling's forward (double sums in the CPU's order,
//           one IEEE division); padded max pooling and its argmax (a selection); padded avg
//           pooling and both backward passes (the same float terms added in the same order as the
//           CPU: a gather in increasing output order, with __fdiv_rn); bn_param_grads from the
//           same sums (one double product rounded once, then one float add). Inputs are O(1):
//           no denormals, which --use_fast_math would flush.
//   1e-10   batch norm's sums, each half (Σx or Σdy, then Σx² or Σdy·(x − mean)) on its own,
//           the count exactly: both sum in double, in different orders, so they differ by
//           rounding, typically √rows·2⁻⁵³ relative (1e-13 at 800k rows; the inputs have
//           nonzero channel means, so no sum is a near-cancellation).
//   1e-6    batch norm's outputs (y, saved mean and invstd, running stats, dx): statistics in
//           double rounded to float once (a last-bit flip, 6e-8, where the sums' last double bits
//           differ), then the CPU's float operations in its order.
//   1e-6    the smoothed cross-entropy's loss and dlogits: exp and the sums in double (another
//           summation order), dlogits from float(exp(double)) against glibc's expf, at most an ulp
//           apart; the accuracy count exactly.
// Outputs are poisoned (NaN, or 0xf9 for argmax) on the GPU first, so an element the GPU forgets
// fails. Channels get different means and scales, so a kernel that mixes up channels fails too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/data.hpp"
#include "gpu_resnet_util.hpp"
#include "gpu_util.hpp"

namespace {
using namespace dpt;
using namespace dpt::gpu_test;

constexpr double kSumsTol = 1e-10;
constexpr double kBnTol = 1e-6;
constexpr double kXentTol = 1e-6;

// One channel, rows of 1..3 channels (the narrow tiles), an odd width (a tile of 32 plus one
// channel), ResNet's 64 channels at 200000 rows, 2048 channels at 7x7 (batch 64), more than 800k
// rows, and a single row (n = 1: the running variance takes the biased one).
const BnShape kBnShapes[] = {{5000, 1},  {5000, 3},    {4999, 33},   {200000, 64},
                             {200001, 3}, {3136, 2048}, {802817, 2}, {1, 5}};

// ‖got − want‖ / ‖want‖ over [lo, hi); infinity where got holds a NaN or Inf.
double rel_err_d(const std::vector<double>& got, const std::vector<double>& want, size_t lo, size_t hi) {
  double d = 0, w = 0;
  for (size_t i = lo; i < hi; ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    d += (got[i] - want[i]) * (got[i] - want[i]);
    w += want[i] * want[i];
  }
  return w > 0 ? std::sqrt(d / w) : std::sqrt(d);
}

void expect_sums_near(const std::vector<double>& got, const std::vector<double>& want, int c,
                      const std::string& label) {
  ASSERT_EQ(got.size(), want.size()) << label;
  const size_t n = size_t(c);
  EXPECT_LE(rel_err_d(got, want, 0, n), kSumsTol) << "first half of the sums, " << label;
  EXPECT_LE(rel_err_d(got, want, n, 2 * n), kSumsTol) << "second half of the sums, " << label;
  EXPECT_EQ(got[2 * n], want[2 * n]) << "count, " << label;
}

PoolGeom pool(int batch, int c, int h, int w, int k, int stride, int pad) {
  PoolGeom g;
  g.batch = batch; g.c = c; g.h = h; g.w = w; g.k = k; g.stride = stride; g.pad = pad;
  return g;
}

// ResNet's stem pool (3/2/1 on 112x112, 64 channels) at batch 2, odd sizes and channel counts,
// overlapping windows (stride 1), k = 2 with pad 1, a pad of 2, and no padding.
const PoolGeom kPools[] = {
    pool(2, 64, 112, 112, 3, 2, 1), pool(3, 5, 9, 11, 3, 2, 1), pool(2, 1, 7, 7, 2, 1, 1),
    pool(2, 3, 8, 8, 3, 1, 1),      pool(1, 4, 6, 5, 5, 3, 2),  pool(2, 64, 7, 7, 3, 2, 0),
};

std::string what(const PoolGeom& g, bool max) {
  return std::string(max ? "max" : "avg") + " batch " + std::to_string(g.batch) + " " +
         std::to_string(g.c) + "x" + std::to_string(g.h) + "x" + std::to_string(g.w) + " k" +
         std::to_string(g.k) + " s" + std::to_string(g.stride) + " p" + std::to_string(g.pad);
}

size_t in_size(const PoolGeom& g) { return size_t(g.batch) * g.h * g.w * g.c; }
size_t out_size(const PoolGeom& g) { return size_t(g.batch) * g.oh() * g.ow() * g.c; }

// Forward (y, argmax) and backward (dx from the GPU's own argmax) against the CPU's, exactly.
void check_pool(Backend& cpu, Backend& gpu, const PoolGeom& g, bool max, const std::vector<float>& x,
                const std::string& label) {
  const size_t ni = in_size(g), no = out_size(g);
  std::vector<float> y(no), dx(ni);
  std::vector<uint8_t> arg(max ? no : 0);
  cpu.pool_forward(x.data(), y.data(), max ? arg.data() : nullptr, g, max);
  auto gx = put(gpu, x);
  auto gy = poisoned(gpu, no);
  auto garg = put(gpu, std::vector<uint8_t>(max ? no : 0, 0xf9));
  gpu.pool_forward(gx.data(), gy.data(), max ? garg.data() : nullptr, g, max);
  EXPECT_TRUE(same_bits(get(gpu, gy), y)) << "y " << label;
  if (max) {
    EXPECT_EQ(get(gpu, garg), arg) << "argmax " << label;
  }

  const std::vector<float> dy = uniform(no, 77);
  cpu.pool_backward(dy.data(), max ? arg.data() : nullptr, dx.data(), g, max);
  auto gdy = put(gpu, dy);
  auto gdx = poisoned(gpu, ni);
  gpu.pool_backward(gdy.data(), max ? garg.data() : nullptr, gdx.data(), g, max);
  EXPECT_TRUE(same_bits(get(gpu, gdx), dx)) << "dx " << label;
}

}  // namespace

TEST(CudaResnet, HasResnetOps) {
  SKIP_WITHOUT_GPU();
  EXPECT_TRUE(gpu()->has_resnet_ops());
}

// bn_sums, then bn_forward in training from those sums (with and without running stats), with
// and without the fused ReLU.
TEST(CudaResnet, BatchNormForwardTraining) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu();
  const float eps = 1e-5f, momentum = 0.1f;
  for (const BnShape& s : kBnShapes)
    for (bool relu : {false, true}) {
      const std::string label = what(s) + (relu ? " relu" : "");
      const BnData d(s, 100 + uint64_t(s.c));
      const size_t n = d.x.size(), c = size_t(s.c);
      std::vector<double> sums(2 * c + 1);
      std::vector<float> y(n), mean(c), invstd(c), rmean = d.rmean, rvar = d.rvar;
      cpu->bn_sums(d.x.data(), s.rows, s.c, sums.data());
      cpu->bn_forward(d.x.data(), y.data(), s.rows, s.c, sums.data(), d.w.data(), d.b.data(), eps, momentum,
                      mean.data(), invstd.data(), rmean.data(), rvar.data(), relu);

      auto gx = put(*g, d.x), gw = put(*g, d.w), gb = put(*g, d.b);
      auto gsums = poisoned_sums(*g, s.c);
      g->bn_sums(gx.data(), s.rows, s.c, gsums.data());
      expect_sums_near(get(*g, gsums), sums, s.c, label);

      auto gy = poisoned(*g, n), gmean = poisoned(*g, c), ginv = poisoned(*g, c);
      auto grm = put(*g, d.rmean), grv = put(*g, d.rvar);
      g->bn_forward(gx.data(), gy.data(), s.rows, s.c, gsums.data(), gw.data(), gb.data(), eps, momentum,
                    gmean.data(), ginv.data(), grm.data(), grv.data(), relu);
      const std::vector<float> got = get(*g, gy);
      EXPECT_LE(rel_err(got, y), kBnTol) << "y " << label;
      EXPECT_LE(rel_err(get(*g, gmean), mean), kBnTol) << "save_mean " << label;
      EXPECT_LE(rel_err(get(*g, ginv), invstd), kBnTol) << "save_invstd " << label;
      EXPECT_LE(rel_err(get(*g, grm), rmean), kBnTol) << "running_mean " << label;
      EXPECT_LE(rel_err(get(*g, grv), rvar), kBnTol) << "running_var " << label;
      if (relu) {  // the ReLU itself: zero exactly where the CPU's is (its inputs straddle 0)
        size_t zeros = 0, apart = 0;
        for (size_t i = 0; i < n; ++i) {
          zeros += y[i] == 0.f;
          apart += (y[i] == 0.f) != (got[i] == 0.f);
        }
        EXPECT_GT(zeros, 0u) << label;
        EXPECT_LT(zeros, n) << label;
        EXPECT_LE(apart, n / 100000) << "zeros placed apart from the CPU's, " << label;
      }

      // No running stats (the forward pass of a model whose stats are frozen): the same y.
      auto gy2 = poisoned(*g, n);
      g->bn_forward(gx.data(), gy2.data(), s.rows, s.c, gsums.data(), gw.data(), gb.data(), eps, momentum,
                    gmean.data(), ginv.data(), nullptr, nullptr, relu);
      EXPECT_EQ(get(*g, gy2), got) << "y without running stats " << label;
    }
}

TEST(CudaResnet, BatchNormInfer) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu();
  const float eps = 1e-5f;
  for (const BnShape& s : kBnShapes)
    for (bool relu : {false, true}) {
      const BnData d(s, 200 + uint64_t(s.c));
      std::vector<float> y(d.x.size());
      cpu->bn_infer(d.x.data(), y.data(), s.rows, s.c, d.rmean.data(), d.rvar.data(), d.w.data(), d.b.data(), eps,
                    relu);
      auto gx = put(*g, d.x), gw = put(*g, d.w), gb = put(*g, d.b), grm = put(*g, d.rmean), grv = put(*g, d.rvar);
      auto gy = poisoned(*g, d.x.size());
      g->bn_infer(gx.data(), gy.data(), s.rows, s.c, grm.data(), grv.data(), gw.data(), gb.data(), eps, relu);
      EXPECT_LE(rel_err(get(*g, gy), y), kBnTol) << what(s) << (relu ? " relu" : "");
    }
}

// bn_backward_sums, bn_param_grads (written and accumulated) and bn_backward (in place, dx == dy,
// and out of place from the GPU's own sums), without and with a fused ReLU (its mask from the
// CPU's forward output). Each op is fed the CPU's inputs (mean and invstd of the CPU's forward
// pass, the CPU's sums) so that it is held on its own.
TEST(CudaResnet, BatchNormBackward) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu();
  for (const BnShape& s : kBnShapes)
    for (bool relu : {false, true}) {
      const std::string label = what(s) + (relu ? " relu" : "");
      const BnData d(s, 300 + uint64_t(s.c));
      const size_t n = d.x.size(), c = size_t(s.c);
      std::vector<double> fsums(2 * c + 1), sums(2 * c + 1);
      std::vector<float> y(n), mean(c), invstd(c), dx(n);
      cpu->bn_sums(d.x.data(), s.rows, s.c, fsums.data());
      cpu->bn_forward(d.x.data(), y.data(), s.rows, s.c, fsums.data(), d.w.data(), d.b.data(), 1e-5f, 0.1f,
                      mean.data(), invstd.data(), nullptr, nullptr, relu);
      const float* mask = relu ? y.data() : nullptr;
      cpu->bn_backward_sums(d.dy.data(), d.x.data(), s.rows, s.c, mean.data(), sums.data(), mask);
      cpu->bn_backward(d.dy.data(), d.x.data(), dx.data(), s.rows, s.c, sums.data(), mean.data(), invstd.data(),
                       d.w.data(), mask);

      auto gx = put(*g, d.x), gdy = put(*g, d.dy), gmean = put(*g, mean), ginv = put(*g, invstd), gw = put(*g, d.w);
      auto gy = put(*g, y);
      const float* gmask = relu ? gy.data() : nullptr;
      auto gsums = poisoned_sums(*g, s.c);
      g->bn_backward_sums(gdy.data(), gx.data(), s.rows, s.c, gmean.data(), gsums.data(), gmask);
      expect_sums_near(get(*g, gsums), sums, s.c, label);

      auto csums = put(*g, sums);
      for (bool acc : {false, true}) {
        std::vector<float> dw = uniform(c, 31), db = uniform(c, 32);
        auto gdw = acc ? put(*g, dw) : poisoned(*g, c), gdb = acc ? put(*g, db) : poisoned(*g, c);
        cpu->bn_param_grads(sums.data(), invstd.data(), s.c, dw.data(), db.data(), acc);
        g->bn_param_grads(csums.data(), ginv.data(), s.c, gdw.data(), gdb.data(), acc);
        EXPECT_EQ(get(*g, gdw), dw) << "dw " << (acc ? "accumulated " : "") << label;
        EXPECT_EQ(get(*g, gdb), db) << "db " << (acc ? "accumulated " : "") << label;
      }

      auto gd = put(*g, d.dy);
      g->bn_backward(gd.data(), gx.data(), gd.data(), s.rows, s.c, csums.data(), gmean.data(), ginv.data(), gw.data(),
                     gmask);
      EXPECT_LE(rel_err(get(*g, gd), dx), kBnTol) << "dx in place " << label;

      auto gdx = poisoned(*g, n);
      g->bn_backward(gdy.data(), gx.data(), gdx.data(), s.rows, s.c, gsums.data(), gmean.data(), ginv.data(),
                     gw.data(), gmask);
      EXPECT_LE(rel_err(get(*g, gdx), dx), kBnTol) << "dx from the GPU's sums " << label;
    }
}

// bn_train_forward and bn_train_backward (the calls without a sync_bn sum between the halves,
// whose statistics, parameter gradients and coefficients come from the kernel that totals the
// sums) give the separate calls' bits: sums, y, saved and running statistics, dw and db
// (written and accumulated), dx in place, and no dx for the first layer.
TEST(CudaResnet, BatchNormTrainingCallsGiveTheSeparateCallsBits) {
  SKIP_WITHOUT_GPU();
  auto g = gpu();
  const float eps = 1e-5f, momentum = 0.1f;
  for (const BnShape& s : kBnShapes)
    for (bool relu : {false, true}) {
      const std::string label = what(s) + (relu ? " relu" : "");
      const BnData d(s, 600 + uint64_t(s.c));
      const size_t n = d.x.size(), c = size_t(s.c);
      auto gx = put(*g, d.x), gw = put(*g, d.w), gb = put(*g, d.b);
      struct Fwd {
        std::vector<double> sums;
        std::vector<float> y, mean, invstd, rmean, rvar;
      };
      auto forward = [&](bool fused, Buffer<float>& gy, Buffer<float>& gmean, Buffer<float>& ginv) {
        auto sums = poisoned_sums(*g, s.c);
        auto grm = put(*g, d.rmean), grv = put(*g, d.rvar);
        if (fused) {
          g->bn_train_forward(gx.data(), gy.data(), s.rows, s.c, sums.data(), gw.data(), gb.data(), eps, momentum,
                              gmean.data(), ginv.data(), grm.data(), grv.data(), relu);
        } else {
          g->bn_sums(gx.data(), s.rows, s.c, sums.data());
          g->bn_forward(gx.data(), gy.data(), s.rows, s.c, sums.data(), gw.data(), gb.data(), eps, momentum,
                        gmean.data(), ginv.data(), grm.data(), grv.data(), relu);
        }
        return Fwd{get(*g, sums), get(*g, gy), get(*g, gmean), get(*g, ginv), get(*g, grm), get(*g, grv)};
      };
      auto y0 = poisoned(*g, n), m0 = poisoned(*g, c), i0 = poisoned(*g, c);
      auto y1 = poisoned(*g, n), m1 = poisoned(*g, c), i1 = poisoned(*g, c);
      const Fwd sep = forward(false, y0, m0, i0), one = forward(true, y1, m1, i1);
      EXPECT_TRUE(same_bits(one.sums, sep.sums)) << "forward sums " << label;
      EXPECT_TRUE(same_bits(one.y, sep.y)) << "y " << label;
      EXPECT_TRUE(same_bits(one.mean, sep.mean)) << "save_mean " << label;
      EXPECT_TRUE(same_bits(one.invstd, sep.invstd)) << "save_invstd " << label;
      EXPECT_TRUE(same_bits(one.rmean, sep.rmean)) << "running_mean " << label;
      EXPECT_TRUE(same_bits(one.rvar, sep.rvar)) << "running_var " << label;

      const float* mask = relu ? y0.data() : nullptr;
      for (bool acc : {false, true})
        for (bool want_dx : {true, false}) {
          const std::string l2 = label + (acc ? " accumulated" : "") + (want_dx ? "" : " no dx");
          std::vector<std::vector<double>> sums;
          std::vector<std::vector<float>> dw, db, dx;
          for (bool fused : {false, true}) {
            auto bs = poisoned_sums(*g, s.c);
            auto gd = put(*g, d.dy);
            auto gdw = put(*g, uniform(c, 31)), gdb = put(*g, uniform(c, 32));
            if (fused) {
              g->bn_train_backward(gd.data(), gx.data(), want_dx ? gd.data() : nullptr, s.rows, s.c, bs.data(),
                                   m0.data(), i0.data(), gw.data(), mask, gdw.data(), gdb.data(), acc);
            } else {
              g->bn_backward_sums(gd.data(), gx.data(), s.rows, s.c, m0.data(), bs.data(), mask);
              g->bn_param_grads(bs.data(), i0.data(), s.c, gdw.data(), gdb.data(), acc);
              if (want_dx)
                g->bn_backward(gd.data(), gx.data(), gd.data(), s.rows, s.c, bs.data(), m0.data(), i0.data(),
                               gw.data(), mask);
            }
            sums.push_back(get(*g, bs));
            dw.push_back(get(*g, gdw));
            db.push_back(get(*g, gdb));
            dx.push_back(get(*g, gd));
          }
          EXPECT_TRUE(same_bits(sums[1], sums[0])) << "backward sums " << l2;
          EXPECT_TRUE(same_bits(dw[1], dw[0])) << "dw " << l2;
          EXPECT_TRUE(same_bits(db[1], db[0])) << "db " << l2;
          EXPECT_TRUE(same_bits(dx[1], dx[0])) << (want_dx ? "dx " : "dy left as it was ") << l2;
        }
    }
}

// bf16: batch norm with a fused ReLU also writes its output's bf16 copy, and the backward pass
// takes the ReLU's mask from that copy (2 bytes read instead of 4). The mask must be the float
// output's: the sums and dx equal those of the same backend given the output without a copy
// (a fresh float buffer of the same values), bit for bit.
TEST(CudaResnet, BatchNormReluMaskFromBf16Copy) {
  SKIP_WITHOUT_GPU();
  auto g = gpu(Precision::bf16);
  for (const BnShape& s : {BnShape{200000, 64}, BnShape{4999, 33}, BnShape{3136, 2048}}) {
    const std::string label = what(s);
    const BnData d(s, 500 + uint64_t(s.c));
    const size_t n = d.x.size(), c = size_t(s.c);
    auto gx = put(*g, d.x), gw = put(*g, d.w), gb = put(*g, d.b), gdy = put(*g, d.dy);
    auto fsums = poisoned_sums(*g, s.c);
    auto gy = poisoned(*g, n), gmean = poisoned(*g, c), ginv = poisoned(*g, c);
    g->bn_sums(gx.data(), s.rows, s.c, fsums.data());
    g->bn_forward(gx.data(), gy.data(), s.rows, s.c, fsums.data(), gw.data(), gb.data(), 1e-5f, 0.1f, gmean.data(),
                  ginv.data(), nullptr, nullptr, true);
    auto plain = put(*g, get(*g, gy));  // the same floats, no bf16 copy
    const BnBackwardOut copy =
        bn_backward_out(*g, gdy.data(), gx.data(), s, gmean.data(), ginv.data(), gw.data(), gy.data());
    const BnBackwardOut floats =
        bn_backward_out(*g, gdy.data(), gx.data(), s, gmean.data(), ginv.data(), gw.data(), plain.data());
    EXPECT_TRUE(same_bits(copy.sums, floats.sums)) << "sums " << label;
    EXPECT_TRUE(same_bits(copy.dx, floats.dx)) << "dx " << label;
  }
}

// The same inputs give the same bits: the reductions have a fixed order (no atomics).
TEST(CudaResnet, BatchNormSumsAreDeterministic) {
  SKIP_WITHOUT_GPU();
  auto g = gpu();
  for (const BnShape& s : {BnShape{200000, 64}, BnShape{802817, 2}, BnShape{3136, 2048}}) {
    const BnData d(s, 400);
    auto gx = put(*g, d.x), gdy = put(*g, d.dy);
    auto gmean = put(*g, uniform(size_t(s.c), 401, 0.f, 0.5f));
    std::vector<std::vector<double>> fwd, bwd;
    for (int run = 0; run < 2; ++run) {
      auto a = poisoned_sums(*g, s.c), b = poisoned_sums(*g, s.c);
      g->bn_sums(gx.data(), s.rows, s.c, a.data());
      g->bn_backward_sums(gdy.data(), gx.data(), s.rows, s.c, gmean.data(), b.data(), nullptr);
      fwd.push_back(get(*g, a));
      bwd.push_back(get(*g, b));
    }
    EXPECT_TRUE(same_bits(fwd[0], fwd[1])) << "bn_sums " << what(s);
    EXPECT_TRUE(same_bits(bwd[0], bwd[1])) << "bn_backward_sums " << what(s);
  }
}

TEST(CudaResnet, GlobalAvgPool) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu();
  struct Shape { int batch, hw, c; };
  for (const Shape& s : {Shape{4, 49, 2048}, Shape{3, 1, 5}, Shape{2, 3136, 64}, Shape{5, 10, 3}, Shape{300, 49, 33}}) {
    const std::string label = "batch " + std::to_string(s.batch) + " hw " + std::to_string(s.hw) + " c " +
                              std::to_string(s.c);
    const size_t ni = size_t(s.batch) * s.hw * s.c, no = size_t(s.batch) * s.c;
    const std::vector<float> x = uniform(ni, 60), dy = uniform(no, 61);
    std::vector<float> y(no), dx(ni);
    cpu->global_avgpool_forward(x.data(), y.data(), s.batch, s.hw, s.c);
    cpu->global_avgpool_backward(dy.data(), dx.data(), s.batch, s.hw, s.c);
    auto gx = put(*g, x), gdy = put(*g, dy);
    auto gy = poisoned(*g, no), gdx = poisoned(*g, ni);
    g->global_avgpool_forward(gx.data(), gy.data(), s.batch, s.hw, s.c);
    g->global_avgpool_backward(gdy.data(), gdx.data(), s.batch, s.hw, s.c);
    EXPECT_EQ(get(*g, gy), y) << "forward " << label;
    EXPECT_EQ(get(*g, gdx), dx) << "backward " << label;
  }
}

TEST(CudaResnet, PaddedPool) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu();
  for (const PoolGeom& p : kPools)
    for (bool max : {true, false}) check_pool(*cpu, *g, p, max, uniform(in_size(p), 70), what(p, max));
}

// Max pooling's selection rules: ties (values on a coarse grid) go to the first tap in row-major
// order; a NaN wins; negative inputs show that the padding is not a zero.
// bf16, ResNet's stem: the pooling reads a batch norm's ReLU output kept in bf16 only, writes
// its output in bf16 only (the first block's convolutions read it), reads its output gradient
// kept in bf16 only (the first block's join) and writes its input gradient in bf16 only for the
// batch norm below (GradUse::bn). Each is the CPU's result on the bf16 values, rounded to bf16
// (max: the selected value itself; avg: the quotient; backward: the same sums), argmax the CPU's.
TEST(CudaResnet, PaddedPoolOnBf16OnlyTensors) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu_with_hints(Precision::bf16);
  // A bf16-only copy of v: a residual sum with zeros into an output only bf16 readers take.
  auto kept = [&](const std::vector<float>& v) {
    auto a = put(*g, v), z = put(*g, std::vector<float>(v.size(), 0.f));
    auto k = poisoned(*g, v.size());
    g->note_bf16_readers(k.data());
    g->residual_sum(a.data(), z.data(), k.data(), v.size(), false);
    return k;
  };
  for (const PoolGeom& p : kPools)
    for (bool max : {true, false}) {
      const std::string label = what(p, max);
      const size_t ni = in_size(p), no = out_size(p);
      const std::vector<float> x = rounded16(uniform(ni, 71)), dy = rounded16(uniform(no, 72));
      std::vector<float> y(no), dx(ni);
      std::vector<uint8_t> arg(max ? no : 0);
      cpu->pool_forward(x.data(), y.data(), max ? arg.data() : nullptr, p, max);
      cpu->pool_backward(dy.data(), max ? arg.data() : nullptr, dx.data(), p, max);
      auto gx = kept(x);
      auto gy = poisoned(*g, no);
      auto garg = put(*g, std::vector<uint8_t>(max ? no : 0, 0xf9));
      g->note_bf16_readers(gy.data());
      g->pool_forward(gx.data(), gy.data(), max ? garg.data() : nullptr, p, max);
      EXPECT_TRUE(std::isnan(get(*g, gy)[0])) << "y's floats written " << label;
      EXPECT_EQ(widened(*g, gy), rounded16(y)) << "y " << label;
      if (max) EXPECT_EQ(get(*g, garg), arg) << "argmax " << label;
      auto gdy = kept(dy);
      auto gdx = poisoned(*g, ni);
      g->note_grad_use(gdx.data(), Backend::GradUse::bn);
      g->pool_backward(gdy.data(), max ? garg.data() : nullptr, gdx.data(), p, max);
      EXPECT_TRUE(std::isnan(get(*g, gdx)[0])) << "dx's floats written " << label;
      EXPECT_EQ(widened(*g, gdx), rounded16(dx)) << "dx " << label;
    }
}

// The model's input made NHWC for the first convolution, where only bf16 readers take it
// (note_bf16_readers): written in bf16 only, each value the CPU's transpose rounded to bf16; few
// channels (an image's) and more than the small-rows kernel takes.
TEST(CudaResnet, NchwToNhwcIntoBf16Only) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu_with_hints(Precision::bf16);
  for (int c : {3, 40}) {
    const int batch = 3, hw = 7 * 9;
    const size_t n = size_t(batch) * size_t(c) * size_t(hw);
    const std::vector<float> x = uniform(n, 81);
    std::vector<float> y(n);
    cpu->nchw_to_nhwc(x.data(), y.data(), batch, c, hw);
    auto gx = put(*g, x);
    auto gy = poisoned(*g, n);
    g->note_bf16_readers(gy.data());
    g->nchw_to_nhwc(gx.data(), gy.data(), batch, c, hw);
    EXPECT_TRUE(std::isnan(get(*g, gy)[0])) << "floats written, c " << c;
    EXPECT_EQ(widened(*g, gy), rounded16(y)) << "c " << c;
  }
}

TEST(CudaResnet, PaddedMaxPoolTiesNaNAndNegatives) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu();
  for (const PoolGeom& p : {pool(2, 5, 9, 9, 3, 2, 1), pool(2, 64, 112, 112, 3, 2, 1), pool(2, 3, 8, 8, 3, 1, 1)}) {
    std::vector<float> ties = uniform(in_size(p), 80);
    for (float& v : ties) v = std::floor(v * 2.f) / 2.f;
    check_pool(*cpu, *g, p, true, ties, "ties " + what(p, true));
    std::vector<float> nans = ties;
    for (size_t i = 0; i < nans.size(); i += 37) nans[i] = kNaN;
    check_pool(*cpu, *g, p, true, nans, "NaNs " + what(p, true));
    check_pool(*cpu, *g, p, true, uniform(in_size(p), 81, -2.f, -1.f), "negative " + what(p, true));
    check_pool(*cpu, *g, p, false, uniform(in_size(p), 82, -2.f, -1.f), "negative " + what(p, false));
  }
}

// Smoothed cross-entropy at eps 0.1 and 0: the loss and accuracy added to stats, dlogits (also
// the call without dlogits, the evaluation's).
TEST(CudaResnet, SmoothedCrossEntropy) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu();
  struct Shape { int batch, classes; float spread; };
  for (const Shape& s : {Shape{256, 1000, 4.f}, Shape{37, 10, 3.f}, Shape{5, 1, 1.f}, Shape{64, 100, 12.f}})
    for (float eps : {0.1f, 0.f}) {
      const std::string label = "batch " + std::to_string(s.batch) + " classes " + std::to_string(s.classes) +
                                " eps " + std::to_string(eps);
      const size_t n = size_t(s.batch) * s.classes;
      const std::vector<float> logits = uniform(n, 90, -s.spread, s.spread);
      std::vector<int32_t> labels(size_t(s.batch));
      SplitMix64 r(91);
      for (auto& l : labels) l = int32_t(r.below(uint64_t(s.classes)));
      const float scale = 1.f / float(s.batch);
      std::vector<float> dl(n), stats = {0.25f, 3.f}, stats2 = {0.25f, 3.f};
      cpu->softmax_xent_smoothed(logits.data(), labels.data(), s.batch, s.classes, scale, dl.data(), stats.data(), eps);
      cpu->softmax_xent_smoothed(logits.data(), labels.data(), s.batch, s.classes, scale, nullptr, stats2.data(), eps);

      auto gl = put(*g, logits);
      auto gy = put(*g, labels);
      auto gdl = poisoned(*g, n);
      auto gs = put(*g, std::vector<float>{0.25f, 3.f}), gs2 = put(*g, std::vector<float>{0.25f, 3.f});
      g->softmax_xent_smoothed(gl.data(), gy.data(), s.batch, s.classes, scale, gdl.data(), gs.data(), eps);
      g->softmax_xent_smoothed(gl.data(), gy.data(), s.batch, s.classes, scale, nullptr, gs2.data(), eps);
      EXPECT_LE(rel_err(get(*g, gdl), dl), kXentTol) << "dlogits " << label;
      const std::vector<float> st = get(*g, gs), st2 = get(*g, gs2);
      EXPECT_LE(std::fabs(double(st[0]) - stats[0]), kXentTol * std::fabs(stats[0])) << "loss " << label;
      EXPECT_EQ(st[1], stats[1]) << "correct " << label;
      EXPECT_EQ(st2, st) << "stats without dlogits " << label;
    }
}
