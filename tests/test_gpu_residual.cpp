// The CUDA backend's residual sum and its gradient stream against the CPU backend (the oracle)
// and against its own unfused path: the sum (fp32 and bf16, with and without ReLU, with terms
// kept in bf16 only), the add's backward and the join in bf16, the add's backward writing only
// the kept gradient, a batch norm's affine pass deferred into the sum, and lazy memory. Every
// comparison is exact: one IEEE add (and a ReLU) per element, the same roundings on both sides.
// Outputs are poisoned (NaN) on the GPU first, so an element the GPU forgets fails. Every test
// skips where no CUDA device is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/data.hpp"
#include "gpu_resnet_util.hpp"
#include "gpu_util.hpp"

namespace {
using namespace dpt;
using namespace dpt::gpu_test;
}  // namespace

// y += x, on the float4 path (aligned) and the scalar one (offset by one float), and its tail.
TEST(CudaResidual, Add) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu();
  for (size_t n : {size_t(1), size_t(3), size_t(4), size_t(1000003)})
    for (size_t off : {size_t(0), size_t(1)}) {
      const std::vector<float> x = uniform(n + 1, 50);
      std::vector<float> y = uniform(n + 1, 51);
      auto gx = put(*g, x), gy = put(*g, y);
      cpu->add(x.data() + off, y.data() + off, n);
      g->add(gx.data() + off, gy.data() + off, n);
      EXPECT_EQ(get(*g, gy), y) << "n " << n << " offset " << off;
    }
}

// y = body + shortcut (with and without ReLU), on the float4 path (aligned) and the scalar one
// (offset by one float), in fp32 and in bf16 (which also writes y's bf16 copy after a ReLU):
// exactly the CPU's.
TEST(CudaResidual, ResidualSum) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    auto g = gpu(p);
    for (size_t n : {size_t(1), size_t(3), size_t(4), size_t(1000003)})
      for (size_t off : {size_t(0), size_t(1)})
        for (bool relu : {false, true}) {
          const std::vector<float> a = uniform(n + 1, 52), b = uniform(n + 1, 53);
          std::vector<float> y(n + 1, 0.f);
          auto ga = put(*g, a), gb = put(*g, b), gy = put(*g, y);
          cpu->residual_sum(a.data() + off, b.data() + off, y.data() + off, n, relu);
          g->residual_sum(ga.data() + off, gb.data() + off, gy.data() + off, n, relu);
          EXPECT_EQ(get(*g, gy), y) << "n " << n << " offset " << off << (relu ? " relu " : " ") << int(p);
        }
  }
}

// bf16, outputs that only bf16 readers take (note_bf16_readers): a batch norm's output written
// in bf16 only, then a residual sum of such terms (the body, the shortcut, or both) and its own
// output kept in bf16 only; add into a gradient kept in bf16 only. Each is exactly the CPU's sum
// of the bf16-rounded terms; the floats of a kept tensor are never written (still the poison),
// a copy of it is kept alike, and a reader of floats (add) gets them widened from the bf16 copy.
TEST(CudaResidual, Bf16OnlyTermsOfTheResidualSum) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu_with_hints(Precision::bf16);
  auto round16 = [](std::vector<float> v) {
    for (float& x : v) x = bf16_value(bf16_bits(x));
    return v;
  };
  for (const BnShape& s : {BnShape{4999, 33}, BnShape{3136, 64}}) {
    const std::string label = what(s);
    const BnData d(s, 600 + uint64_t(s.c));
    const size_t n = d.x.size();
    auto gx = put(*g, d.x), gw = put(*g, d.w), gb = put(*g, d.b);
    auto sums = poisoned_sums(*g, s.c);
    auto mean = poisoned(*g, size_t(s.c)), inv = poisoned(*g, size_t(s.c));
    g->bn_sums(gx.data(), s.rows, s.c, sums.data());
    // The batch norm's output as floats (plain), and the same kept in bf16 only.
    auto plain = poisoned(*g, n), kept = poisoned(*g, n), kept2 = poisoned(*g, n);
    g->note_bf16_readers(kept.data());
    g->note_bf16_readers(kept2.data());
    for (Buffer<float>* y : {&plain, &kept, &kept2})
      g->bn_forward(gx.data(), y->data(), s.rows, s.c, sums.data(), gw.data(), gb.data(), 1e-5f, 0.1f, mean.data(),
                    inv.data(), nullptr, nullptr, false);
    const std::vector<float> body = get(*g, plain), body16 = round16(body);
    EXPECT_TRUE(std::isnan(get(*g, kept)[0]) && std::isnan(get(*g, kept)[n - 1])) << "kept floats written " << label;
    const std::vector<float> other = uniform(n, 601);
    auto gother = put(*g, other);
    for (bool relu : {false, true}) {
      std::vector<float> want(n), want_both(n);
      cpu->residual_sum(body16.data(), other.data(), want.data(), n, relu);
      cpu->residual_sum(body16.data(), body16.data(), want_both.data(), n, relu);
      auto y1 = poisoned(*g, n), y2 = poisoned(*g, n), y3 = poisoned(*g, n);
      g->residual_sum(kept.data(), gother.data(), y1.data(), n, relu);  // the body kept
      g->residual_sum(gother.data(), kept.data(), y2.data(), n, relu);  // the shortcut kept
      g->residual_sum(kept.data(), kept2.data(), y3.data(), n, relu);   // both
      EXPECT_EQ(get(*g, y1), want) << "body kept " << label << relu;
      EXPECT_EQ(get(*g, y2), want) << "shortcut kept " << label << relu;
      EXPECT_EQ(get(*g, y3), want_both) << "both kept " << label << relu;
      // The sum kept in bf16 only: its floats never written; a copy of it stays bf16 only (the
      // residual gradient stream's copies), widened for a reader of floats (add).
      auto ky = poisoned(*g, n), wide = poisoned(*g, n);
      g->note_bf16_readers(ky.data());
      g->residual_sum(kept.data(), gother.data(), ky.data(), n, relu);
      EXPECT_TRUE(std::isnan(get(*g, ky)[0])) << "kept sum's floats written " << label << relu;
      g->copy(wide.data(), ky.data(), n * sizeof(float));
      EXPECT_TRUE(std::isnan(get(*g, wide)[0])) << "the copy's floats written " << label << relu;
      EXPECT_EQ(widened(*g, wide), round16(want)) << "kept sum widened " << label << relu;
    }
    // add(x, y) with y kept in bf16 only (a convolution's input gradient for the block's add):
    // y = bf16(y) + x, in floats; and with x kept: y += bf16(x).
    std::vector<float> want = other;
    cpu->add(body16.data(), want.data(), n);
    g->add(gother.data(), kept.data(), n);
    EXPECT_EQ(get(*g, kept), want) << "add into a kept tensor " << label;
    auto y = put(*g, other);
    g->add(kept2.data(), y.data(), n);
    EXPECT_EQ(get(*g, y), want) << "add of a kept tensor " << label;
  }
}

// The residual sum's backward with the gradient only the batch norm below reads
// (note_grad_use: GradUse::bn): the masked gradient written in bf16 only, which batch norm's
// backward takes as its dy. Its sums and input gradient are the bits the same kernels give from
// floats holding the bf16-rounded masked gradient; the kept copy is the masked gradient in
// floats, exactly the CPU's.
TEST(CudaResidual, ResidualBackwardKeepsBatchNormsGradientInBf16) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu_with_hints(Precision::bf16);
  for (const BnShape& s : {BnShape{4999, 33}, BnShape{3136, 64}}) {
    const std::string label = what(s);
    const BnData d(s, 700 + uint64_t(s.c));
    const size_t n = d.x.size();
    const std::vector<float> body = uniform(n, 701), shortcut = uniform(n, 702);
    std::vector<float> y(n), want_d = d.dy, want_keep(n);
    cpu->residual_sum(body.data(), shortcut.data(), y.data(), n, true);
    cpu->residual_backward(want_d.data(), y.data(), want_keep.data(), n, true);
    auto gbody = put(*g, body), gshort = put(*g, shortcut), gy = poisoned(*g, n);
    g->residual_sum(gbody.data(), gshort.data(), gy.data(), n, true);  // y's bf16 copy: the mask
    auto gd = put(*g, d.dy), keep = poisoned(*g, n);
    g->note_grad_use(gd.data(), Backend::GradUse::bn);
    g->residual_backward(gd.data(), gy.data(), keep.data(), n, true);
    // keep is bf16 only (its readers, the block's add and a projection's copy, take that): its
    // floats are never written, and added to zeros it widens to the rounded gradient.
    EXPECT_TRUE(std::isnan(get(*g, keep)[0])) << "keep's floats written " << label;
    EXPECT_EQ(widened(*g, keep), rounded16(want_keep)) << "kept gradient " << label;
    EXPECT_EQ(get(*g, gd), d.dy) << "d's floats written " << label;
    std::vector<float> rounded = want_d;
    for (float& v : rounded) v = bf16_value(bf16_bits(v));
    auto plain = put(*g, rounded);
    auto gx = put(*g, d.x), gw = put(*g, d.w);
    auto mean = put(*g, uniform(size_t(s.c), 703, -0.2f, 0.2f)), inv = put(*g, uniform(size_t(s.c), 704, 0.5f, 2.f));
    const BnBackwardOut kept = bn_backward_out(*g, gd.data(), gx.data(), s, mean.data(), inv.data(), gw.data(), nullptr);
    const BnBackwardOut floats =
        bn_backward_out(*g, plain.data(), gx.data(), s, mean.data(), inv.data(), gw.data(), nullptr);
    EXPECT_TRUE(same_bits(kept.sums, floats.sums)) << "sums " << label;
    EXPECT_TRUE(same_bits(kept.dx, floats.dx)) << "dx " << label;
  }
}

// The residual gradient stream in bf16, as PyTorch's autocast keeps it: a block's add backward
// keeps the shortcut's gradient in bf16 only; the join (add) of the body's gradient and that
// one, hinted GradUse::res, writes its sum in bf16 only; the previous block's add backward reads
// that bf16 sum; a copy of a bf16-only tensor stays bf16 only. Against the CPU with the same
// roundings, bit for bit (one rounding per bf16 write), with a tail beyond the eight-wide pass.
TEST(CudaResidual, ResidualGradientStreamInBf16) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu_with_hints(Precision::bf16);
  const size_t n = 3136 * 16 + 5;
  const auto body = uniform(n, 801), shortcut = uniform(n, 802), dy = uniform(n, 803), dbody = uniform(n, 804);
  const auto body2 = uniform(n, 805), shortcut2 = uniform(n, 806);
  // A block's output (its ReLU's mask) and the backward through its add.
  std::vector<float> y(n), d = dy, keep(n);
  cpu->residual_sum(body.data(), shortcut.data(), y.data(), n, true);
  cpu->residual_backward(d.data(), y.data(), keep.data(), n, true);
  auto gbody = put(*g, body), gshort = put(*g, shortcut), gy = poisoned(*g, n);
  g->residual_sum(gbody.data(), gshort.data(), gy.data(), n, true);
  auto gd = put(*g, dy), gkeep = poisoned(*g, n);
  g->residual_backward(gd.data(), gy.data(), gkeep.data(), n, true);
  EXPECT_EQ(get(*g, gd), d) << "d masked, in floats (no batch norm below)";
  EXPECT_TRUE(std::isnan(get(*g, gkeep)[0])) << "keep's floats written";
  EXPECT_EQ(widened(*g, gkeep), rounded16(keep)) << "keep";
  // The join: the body's gradient (floats) plus keep, the sum in bf16 only.
  auto gsum = put(*g, dbody);
  g->note_grad_use(gsum.data(), Backend::GradUse::res);
  g->add(gkeep.data(), gsum.data(), n);
  EXPECT_EQ(get(*g, gsum), dbody) << "the sum's floats written";
  std::vector<float> sum = rounded16(keep);
  for (size_t i = 0; i < n; ++i) sum[i] += dbody[i];
  sum = rounded16(sum);
  EXPECT_EQ(widened(*g, gsum), sum) << "the join's sum";
  // The previous block's add backward from that bf16 sum: d in floats, keep in bf16.
  std::vector<float> y2(n), d2 = sum, keep2(n);
  cpu->residual_sum(body2.data(), shortcut2.data(), y2.data(), n, true);
  cpu->residual_backward(d2.data(), y2.data(), keep2.data(), n, true);
  auto gbody2 = put(*g, body2), gshort2 = put(*g, shortcut2), gy2 = poisoned(*g, n), gkeep2 = poisoned(*g, n);
  g->residual_sum(gbody2.data(), gshort2.data(), gy2.data(), n, true);
  g->residual_backward(gsum.data(), gy2.data(), gkeep2.data(), n, true);
  EXPECT_EQ(get(*g, gsum), d2) << "d from a bf16 sum";
  EXPECT_EQ(widened(*g, gkeep2), keep2) << "keep from a bf16 sum (already bf16 values)";
  // A copy of a bf16-only tensor (a projection block's switch to its body) stays bf16 only.
  auto gcopy = poisoned(*g, n);
  g->copy(gcopy.data(), gkeep2.data(), n * sizeof(float));
  EXPECT_TRUE(std::isnan(get(*g, gcopy)[0])) << "the copy's floats written";
  EXPECT_EQ(widened(*g, gcopy), keep2) << "the copy";
}

// The add's backward writing only the kept gradient (residual_backward_keep), which both
// branches' batch norms then read: keep holds the CPU's masked gradient exactly (in bf16 only
// under bf16, from a gradient that is bf16 values already: the join's bf16-only sum); under bf16
// a gradient in floats is declined (false, keep untouched), as the last block's is; in fp32
// keep is written in floats; without a ReLU keep is d.
TEST(CudaResidual, ResidualBackwardWritesOnlyTheKeptGradient) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  const size_t n = 3136 * 16 + 5;
  const auto body = uniform(n, 811), shortcut = uniform(n, 812), dy = uniform(n, 813), dbody = uniform(n, 814);
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    const std::string label = p == Precision::bf16 ? "bf16" : "fp32";
    auto g = gpu_with_hints(p);
    std::vector<float> y(n);
    cpu->residual_sum(body.data(), shortcut.data(), y.data(), n, true);
    auto gbody = put(*g, body), gshort = put(*g, shortcut), gy = poisoned(*g, n);
    g->residual_sum(gbody.data(), gshort.data(), gy.data(), n, true);
    // d: the join's sum, bf16 only under bf16 (GradUse::res), as a block's output gradient is.
    auto gd = put(*g, dbody);
    auto gk0 = put(*g, dy);
    g->note_grad_use(gd.data(), Backend::GradUse::res);
    g->add(gk0.data(), gd.data(), n);
    std::vector<float> d = dbody;
    for (size_t i = 0; i < n; ++i) d[i] += dy[i];
    if (p == Precision::bf16) d = rounded16(d);
    for (bool relu : {true, false}) {
      std::vector<float> want_d = d, want_keep(n);
      cpu->residual_backward(want_d.data(), y.data(), want_keep.data(), n, relu);
      auto keep = poisoned(*g, n);
      ASSERT_TRUE(g->residual_backward_keep(gd.data(), gy.data(), keep.data(), n, relu)) << label << relu;
      if (p == Precision::bf16 && relu) EXPECT_TRUE(std::isnan(get(*g, keep)[0])) << "keep's floats written";
      EXPECT_EQ(widened(*g, keep), want_keep) << "keep " << label << relu;
    }
    if (p == Precision::bf16) {
      auto gf = put(*g, dy), keep = poisoned(*g, n);
      EXPECT_FALSE(g->residual_backward_keep(gf.data(), gy.data(), keep.data(), n, true)) << "a float gradient";
      EXPECT_TRUE(std::isnan(get(*g, keep)[0])) << "keep written where declined";
      EXPECT_EQ(get(*g, gf), dy) << "d changed where declined";
    }
  }
}

// A residual block's last batch norm with its affine pass deferred into the block's sum
// (bn_train_deferred): its statistics and the sum are the bits bn_train_forward then
// residual_sum give, with the body's, the shortcut's or both terms deferred, in fp32 and in bf16
// (the batch norm's output a bf16 reader's: kept in bf16 only), with and without the sum's ReLU,
// for channel counts of the vector kernel (64) and of the scalar one (33, 5); the deferred
// output's floats are never written; once that output is written (a fill) the sum reads it.
TEST(CudaResidual, DeferredBatchNormGivesTheSumsBits) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  const float eps = 1e-5f, momentum = 0.1f;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    auto g = gpu_with_hints(p);
    for (const BnShape& s : {BnShape{4999, 33}, BnShape{3136, 64}, BnShape{3, 5}}) {
      const BnData d(s, 900 + uint64_t(s.c)), e(s, 950 + uint64_t(s.c));
      const size_t n = d.x.size(), c = size_t(s.c);
      const std::string label = what(s) + (p == Precision::bf16 ? " bf16" : " fp32");
      auto gx = put(*g, d.x), gx2 = put(*g, e.x), gw = put(*g, d.w), gb = put(*g, d.b);
      auto other = put(*g, uniform(n, 961)), other2 = put(*g, uniform(n, 962));
      struct Stats {
        std::vector<double> sums;
        std::vector<float> mean, invstd, rmean, rvar;
      };
      // One batch norm's training forward into y (a bf16 reader's), plain or deferred.
      auto bn = [&](const Buffer<float>& x, Buffer<float>& y, bool defer, Stats& st) {
        auto sums = poisoned_sums(*g, s.c);
        auto mean = poisoned(*g, c), inv = poisoned(*g, c);
        auto rm = put(*g, d.rmean), rv = put(*g, d.rvar);
        g->note_bf16_readers(y.data());
        if (defer) {
          EXPECT_TRUE(g->bn_train_deferred(x.data(), y.data(), s.rows, s.c, sums.data(), gw.data(), gb.data(), eps,
                                           momentum, mean.data(), inv.data(), rm.data(), rv.data()))
              << "not deferred " << label;
        } else {
          g->bn_train_forward(x.data(), y.data(), s.rows, s.c, sums.data(), gw.data(), gb.data(), eps, momentum,
                              mean.data(), inv.data(), rm.data(), rv.data(), false);
        }
        st = {get(*g, sums), get(*g, mean), get(*g, inv), get(*g, rm), get(*g, rv)};
      };
      for (bool relu : {false, true})
        for (int which : {1, 2, 3}) {  // deferred: the body (1), the shortcut (2), both
          const std::string l2 = label + (relu ? " relu" : "") + " terms " + std::to_string(which);
          std::vector<float> out[2];
          Stats plain_b, plain_s;
          for (bool defer : {false, true}) {
            auto yb = poisoned(*g, n), ys = poisoned(*g, n), y = poisoned(*g, n);
            Stats sb, ss;
            if (which & 1) bn(gx, yb, defer, sb);
            if (which & 2) bn(gx2, ys, defer, ss);
            g->residual_sum((which & 1) ? yb.data() : other.data(), (which & 2) ? ys.data() : other2.data(),
                            y.data(), n, relu);
            out[defer] = get(*g, y);
            if (!defer) {
              plain_b = sb;
              plain_s = ss;
              continue;
            }
            for (auto [st, want, name] : {std::tuple{&sb, &plain_b, "body"}, std::tuple{&ss, &plain_s, "shortcut"}}) {
              EXPECT_TRUE(same_bits(st->sums, want->sums)) << name << " sums " << l2;
              EXPECT_TRUE(same_bits(st->mean, want->mean)) << name << " mean " << l2;
              EXPECT_TRUE(same_bits(st->invstd, want->invstd)) << name << " invstd " << l2;
              EXPECT_TRUE(same_bits(st->rmean, want->rmean)) << name << " running mean " << l2;
              EXPECT_TRUE(same_bits(st->rvar, want->rvar)) << name << " running var " << l2;
            }
            if (which & 1) EXPECT_TRUE(std::isnan(get(*g, yb)[0])) << "deferred output's floats written " << l2;
            // Written after (here filled), the output is read as written.
            if (which == 1) {
              g->fill(yb.data(), n, 0.5f);
              std::vector<float> half(n, 0.5f), o2 = get(*g, other2), want(n);
              cpu->residual_sum(half.data(), o2.data(), want.data(), n, relu);
              auto y2 = poisoned(*g, n);
              g->residual_sum(yb.data(), other2.data(), y2.data(), n, relu);
              EXPECT_EQ(get(*g, y2), want) << "a deferred output written after " << l2;
            }
          }
          EXPECT_TRUE(same_bits(out[1], out[0])) << "the sum " << l2;
          EXPECT_FALSE(std::isnan(out[0][0]) || std::isnan(out[0][n - 1])) << "the sum not written " << l2;
        }
    }
  }
}

// Lazy memory (activations' floats): allocating 1 GiB takes (almost) no device memory; writing
// half of it takes that half; the values read back are the ones written.
TEST(CudaResidual, LazyMemoryHoldsOnlyWhatIsWritten) {
  SKIP_WITHOUT_GPU();
  auto g = gpu(Precision::bf16);
  const size_t n = size_t(1) << 28, mib = size_t(1) << 20;  // 1 GiB of floats
  g->synchronize();
  const DeviceMemory m0 = g->device_memory();
  Buffer<float> b(*g, n, Buffer<float>::Lazy{});
  g->synchronize();
  const DeviceMemory m1 = g->device_memory();
  if (m1.lazy - m0.lazy != n * sizeof(float)) GTEST_SKIP() << "this GPU takes device memory for lazy buffers";
  EXPECT_LT(m1.in_use, m0.in_use + 64 * mib) << "allocating";
  g->fill(b.data(), n / 2, 2.5f);
  g->synchronize();
  const DeviceMemory m2 = g->device_memory();
  EXPECT_GE(m2.in_use, m1.in_use + n / 2 * sizeof(float) - 64 * mib) << "half written";
  EXPECT_LT(m2.in_use, m1.in_use + n / 2 * sizeof(float) + 64 * mib) << "half written";
  std::vector<float> tail(1024);
  g->download(tail.data(), b.data() + n / 2 - 1024, tail.size() * sizeof(float));
  EXPECT_EQ(tail, std::vector<float>(1024, 2.5f));
}
