// Batch norm, residual blocks and the ResNet presets: the layer list's syntax and errors, shape
// planning and torchvision's names, and (below) the CPU backend's ops against finite differences.
#include <algorithm>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/check.hpp"
#include "dpt/data.hpp"
#include "dpt/layer_spec.hpp"
#include "dpt/nn.hpp"
#include "dpt/optim.hpp"
#include "layer_util.hpp"

using namespace dpt;
using namespace layer_util;

namespace {

const PlannedLayer* find_named(const ModelPlan& m, const std::string& name) {
  for (const PlannedLayer& p : m.layers)
    if (p.name == name) return &p;
  return nullptr;
}

}  // namespace

// ---- syntax ---------------------------------------------------------------------------------

TEST(ResnetList, ParsesAndNormalises) {
  const std::string text =
      "conv(16,3,pad=1,bias=false) bn relu maxpool(3, stride=2, pad=1) "
      "res( conv(16,3,pad=1,bias=false) bn relu conv(16,3,pad=1,bias=false) bn ) relu "
      "res(conv(32,3,stride=2,pad=1,bias=false) bn relu conv(32,3,pad=1,bias=false) bn | conv(32,1,stride=2,bias=false) bn) relu "
      "avgpool(global) flatten linear(10) bn";
  const auto l = parse_layer_list(text);
  ASSERT_EQ(l.size(), 12u);
  EXPECT_FALSE(l[0].bias);
  EXPECT_EQ(l[1].kind, LayerKind::bn);
  EXPECT_EQ(l[3].pad, 1);
  EXPECT_EQ(l[4].kind, LayerKind::res);
  EXPECT_EQ(l[4].body.size(), 5u);
  EXPECT_TRUE(l[4].shortcut.empty());
  EXPECT_EQ(l[6].shortcut.size(), 2u);
  EXPECT_TRUE(l[8].global);
  const std::string norm = layer_list_text(l);
  EXPECT_EQ(norm,
            "conv(16,3,stride=1,pad=1,bias=false) bn relu maxpool(3,stride=2,pad=1) "
            "res(conv(16,3,stride=1,pad=1,bias=false) bn relu conv(16,3,stride=1,pad=1,bias=false) bn) relu "
            "res(conv(32,3,stride=2,pad=1,bias=false) bn relu conv(32,3,stride=1,pad=1,bias=false) bn | "
            "conv(32,1,stride=2,pad=0,bias=false) bn) relu avgpool(global) flatten linear(10) bn");
  EXPECT_EQ(parse_layer_list(norm), l);
  // Today's lists keep their normalised text (checkpoints record it).
  EXPECT_EQ(layer_list_text(parse_layer_list("conv(8,3,bias=true) maxpool(2) flatten linear(2)")),
            "conv(8,3,stride=1,pad=0) maxpool(2,stride=2) flatten linear(2)");
  // Nested blocks.
  const auto n = parse_layer_list("conv(4,3) res(res(conv(4,3,pad=1)) relu | conv(4,1)) flatten linear(2)");
  ASSERT_EQ(n[1].body.size(), 2u);
  EXPECT_EQ(n[1].body[0].kind, LayerKind::res);
  EXPECT_EQ(parse_layer_list(layer_list_text(n)), n);
  // Presets.
  const auto p = parse_layer_list("resnet18(stem=small)");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].kind, LayerKind::preset);
  EXPECT_TRUE(p[0].small_stem);
  EXPECT_EQ(layer_list_text(p), "resnet18(stem=small)");
  EXPECT_EQ(layer_list_text(parse_layer_list("resnet50(stem=default, classes=7)")), "resnet50(classes=7)");
}

TEST(ResnetList, ErrorsNameTheLayerAndWhatIsWrong) {
  struct Case { const char* list; const char* expect; };
  const Case cases[] = {
      {"conv(8,3,bias=no)", "bias 'no' is not true or false"},
      {"bn(4) linear(2)", "bn takes no arguments"},
      {"conv(8,3) res(conv(8,3) | conv(8,1) | conv(8,1))", "one '|' at most"},
      {"conv(8,3) res( | conv(8,1))", "the block's body is empty"},
      {"conv(8,3) res(conv(8,3) | )", "the shortcut after '|' is empty"},
      {"conv(8,3) res(conv(8,3) bogus)", "layer 2 'res(conv(8,3) bogus)': in its body: layer 2 'bogus': unknown layer"},
      {"conv(8,3) res", "expected res(<body>[ | <shortcut>])"},
      {"resnet19", "unknown layer 'resnet19'"},
      {"resnet18(stem=tiny)", "stem 'tiny' is not small or default"},
      {"resnet18(depth=3)", "unknown argument 'depth'"},
      {"conv(8,3) res(resnet18)", "a preset is a whole model"},
      {"maxpool(2,pad=2) linear(2)", "more than half the kernel"},
      {"avgpool(global,stride=2) linear(2)", "avgpool(global) takes no other argument"},
      {"conv(8,3) res(conv(8,3) res(conv(8,3) res(conv(8,3) res(conv(8,3) res(conv(8,3) res(conv(8,3) "
       "res(conv(8,3) res(conv(8,3) res(conv(8,3))))))))))",
       "nested more than 8 deep"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of([&] { parse_layer_list(c.list); });
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.list << " -> " << e;
  }
}

// ---- shapes ---------------------------------------------------------------------------------

TEST(ResnetPlan, ShapesCountsAndNames) {
  const ModelPlan m = plan_model(
      parse_layer_list("conv(8,3,pad=1,bias=false) bn relu maxpool(3,stride=2,pad=1) "
                       "res(conv(8,3,pad=1,bias=false) bn relu conv(8,3,pad=1,bias=false) bn) relu "
                       "res(conv(16,3,stride=2,pad=1) bn | conv(16,1,stride=2,bias=false) bn) relu "
                       "avgpool(global) flatten linear(10) bn"),
      TensorShape::image(3, 9, 9), 10);
  EXPECT_EQ(m.layers[0].weights, 8 * 3 * 9);
  EXPECT_EQ(m.layers[0].biases, 0);
  EXPECT_EQ(m.layers[1].name, "bn0");
  EXPECT_EQ(m.layers[1].weights, 8);
  EXPECT_EQ(m.layers[3].out, TensorShape::image(8, 5, 5));  // (9 + 2 - 3) / 2 + 1
  EXPECT_EQ(m.layers[4].spec.kind, LayerKind::res_begin);
  EXPECT_EQ(m.layers[5].depth, 1);
  const PlannedLayer* sc = find_named(m, "conv4");
  ASSERT_NE(sc, nullptr);
  EXPECT_EQ(sc->out, TensorShape::image(16, 3, 3));
  EXPECT_EQ(find_named(m, "conv3")->biases, 16);
  EXPECT_EQ(find_named(m, "bn5")->out, TensorShape::features(10));  // BatchNorm1d over features
  EXPECT_TRUE(m.has_bn());
  EXPECT_FALSE(m.preset);
  const std::string d = m.describe();
  EXPECT_NE(d.find("  res("), std::string::npos) << d;
  EXPECT_NE(d.find("avgpool(global)"), std::string::npos) << d;
  EXPECT_NE(d.find("16x1x1"), std::string::npos) << d;
}

TEST(ResnetPlan, Errors) {
  struct Case { const char* list; TensorShape in; const char* expect; };
  const auto img = TensorShape::image(3, 8, 8);
  const Case cases[] = {
      {"bn conv(8,3) flatten linear(2)", img, "layer 1 'bn' (input 3x8x8): bn before any layer"},
      {"res(bn conv(3,3,pad=1)) flatten linear(2)", img, "bn before any layer"},
      {"conv(8,3,pad=1) res(conv(16,3,pad=1) bn) flatten linear(2)", img,
       "layer 2 'res(conv(16,3,stride=1,pad=1) bn)' (input 8x8x8): its body gives 16x8x8 but its shortcut "
       "(the identity) gives 8x8x8: a block that changes shape needs a projection shortcut"},
      {"conv(8,3,pad=1) res(conv(8,3,stride=2,pad=1) | conv(8,1)) flatten linear(2)", img,
       "its body gives 8x4x4 but its shortcut gives 8x8x8"},
      {"conv(8,3,pad=1) res(conv(8,3,pad=1) | flatten linear(2)) flatten linear(2)", img,
       "its body gives 8x8x8 but its shortcut gives 2"},
      {"conv(8,3,pad=1) res(conv(8,3,pad=1) | conv(8,9)) flatten linear(2)", img,
       "layer 2 'res(conv(8,3,stride=1,pad=1) | conv(8,9,stride=1,pad=0))', its shortcut: layer 1 "
       "'conv(8,9,stride=1,pad=0)' (input 8x8x8): kernel 9x9 is larger"},
      {"flatten avgpool(global) linear(2)", img, "needs an image input"},
      {"conv(8,3) avgpool(global) linear(2)", img, "needs a flat input"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of([&] { plan_model(parse_layer_list(c.list), c.in, 2); });
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.list << " -> " << e;
  }
  EXPECT_NE(error_of([] { plan_model(parse_layer_list("resnet18 linear(2)"), TensorShape::image(3, 32, 32), 2); })
                .find("a preset is the whole model"),
            std::string::npos);
  EXPECT_NE(error_of([] { plan_model(parse_layer_list("resnet18"), TensorShape::image(3, 32, 32), 0); })
                .find("the number of classes is not known"),
            std::string::npos);
}

// Parameter counts of torchvision's resnet18/34/50 (3 input channels, 1000 classes), and the
// state_dict names of the expanded presets.
TEST(ResnetPlan, PresetsAreTorchvisionsArchitectures) {
  const auto in = TensorShape::image(3, 224, 224);
  EXPECT_EQ(plan_model(parse_layer_list("resnet18"), in, 1000).params, 11689512);
  EXPECT_EQ(plan_model(parse_layer_list("resnet34"), in, 1000).params, 21797672);
  const ModelPlan r50 = plan_model(parse_layer_list("resnet50"), in, 1000);
  EXPECT_EQ(r50.params, 25557032);
  EXPECT_TRUE(r50.preset);
  EXPECT_EQ(r50.text, "resnet50(classes=1000)");
  EXPECT_EQ(r50.output(), TensorShape::features(1000));
  ASSERT_NE(find_named(r50, "layer4.2.bn3"), nullptr);
  EXPECT_EQ(find_named(r50, "layer4.2.bn3")->out, TensorShape::image(2048, 7, 7));
  // Bottlenecks stride on their 3x3 conv.
  EXPECT_EQ(find_named(r50, "layer2.0.conv1")->spec.stride, 1);
  EXPECT_EQ(find_named(r50, "layer2.0.conv2")->spec.stride, 2);
  EXPECT_NE(find_named(r50, "layer1.0.downsample.0"), nullptr);  // 64 -> 256 channels
  EXPECT_EQ(find_named(r50, "layer1.1.downsample.0"), nullptr);

  const ModelPlan s = plan_model(parse_layer_list("resnet18(stem=small)"), TensorShape::image(1, 28, 28), 10);
  EXPECT_EQ(s.text, "resnet18(stem=small,classes=10)");
  EXPECT_EQ(s.layers[0].spec.k, 3);
  EXPECT_EQ(s.layers[0].out, TensorShape::image(64, 28, 28));
  EXPECT_EQ(find_named(s, "layer4.1.bn2")->out, TensorShape::image(512, 4, 4));
  EXPECT_EQ(find_named(s, "fc")->weights, 5120);
  EXPECT_EQ(s.params, 11689512 - 3 * 64 * 49 + 64 * 9 - 513 * 1000 + 513 * 10);
  // The normalised text plans again to the same model (a checkpoint's `model`).
  EXPECT_EQ(plan_model(parse_layer_list(s.text), TensorShape::image(1, 28, 28), 0).params, s.params);
  const std::string d = s.describe();
  EXPECT_NE(d.find("layer3.0.downsample.1"), std::string::npos) << d;
}

// ---- the CPU backend's ops ------------------------------------------------------------------

// Batch norm in training mode: y against the definition, running statistics (unbiased variance,
// momentum 0.1), evaluation from them, and every gradient against finite differences of
// L = Σ r·y (through the batch statistics).
TEST(BnCpu, ForwardRunningStatsAndGradients) {
  auto be = make_cpu_backend({});
  const int64_t rows = 12;
  const int c = 3;
  auto x = rnd(size_t(rows) * c, 1, -2.f, 3.f);
  auto w = rnd(size_t(c), 2, 0.5f, 1.5f);
  auto b = rnd(size_t(c), 3);
  const auto r = rnd(x.size(), 4);
  std::vector<double> sums(2 * size_t(c) + 1);
  std::vector<float> y(x.size()), mean(static_cast<size_t>(c)), invstd(static_cast<size_t>(c)), rm(size_t(c), 0.f), rv(size_t(c), 1.f);
  auto loss = [&] {
    be->bn_sums(x.data(), rows, c, sums.data());
    be->bn_forward(x.data(), y.data(), rows, c, sums.data(), w.data(), b.data(), kBnEps, kBnMomentum, mean.data(),
                   invstd.data(), nullptr, nullptr, false);
    return dot(r, y);
  };
  be->bn_sums(x.data(), rows, c, sums.data());
  be->bn_forward(x.data(), y.data(), rows, c, sums.data(), w.data(), b.data(), kBnEps, kBnMomentum, mean.data(),
                 invstd.data(), rm.data(), rv.data(), false);
  for (int j = 0; j < c; ++j) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < rows; ++i) m += x[size_t(i * c + j)];
    m /= rows;
    for (int64_t i = 0; i < rows; ++i) v += (x[size_t(i * c + j)] - m) * (x[size_t(i * c + j)] - m);
    for (int64_t i = 0; i < rows; ++i)
      EXPECT_NEAR(y[size_t(i * c + j)], (x[size_t(i * c + j)] - m) / std::sqrt(v / rows + 1e-5) * w[size_t(j)] + b[size_t(j)],
                  1e-5);
    EXPECT_NEAR(rm[size_t(j)], 0.1 * m, 1e-6);
    EXPECT_NEAR(rv[size_t(j)], 0.9 + 0.1 * v / (rows - 1), 1e-6);
  }
  std::vector<float> ye(x.size());
  be->bn_infer(x.data(), ye.data(), rows, c, rm.data(), rv.data(), w.data(), b.data(), kBnEps, false);
  EXPECT_NEAR(ye[4], (x[4] - rm[1]) / std::sqrt(rv[1] + 1e-5) * w[1] + b[1], 1e-5);

  loss();
  std::vector<float> dy = r, dx(x.size()), dw(static_cast<size_t>(c)), db(static_cast<size_t>(c));
  std::vector<double> bsums(sums.size());
  be->bn_backward_sums(dy.data(), x.data(), rows, c, mean.data(), bsums.data(), nullptr);
  be->bn_param_grads(bsums.data(), invstd.data(), c, dw.data(), db.data(), false);
  be->bn_backward(dy.data(), x.data(), dx.data(), rows, c, bsums.data(), mean.data(), invstd.data(), w.data(),
                  nullptr);
  expect_fd(x.data(), x.size(), dx.data(), loss, "dx");
  expect_fd(w.data(), w.size(), dw.data(), loss, "dw");
  expect_fd(b.data(), b.size(), db.data(), loss, "db");
  // dx in place of dy.
  be->bn_backward(dy.data(), x.data(), dy.data(), rows, c, bsums.data(), mean.data(), invstd.data(), w.data(),
                  nullptr);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_EQ(dy[i], dx[i]);
}

// Batch norm's passes round every multiply and add on their own, in the order the CUDA kernels
// (their oracle) use: no a·b + c fused into one FMA by the compiler's SIMD clones. One row makes
// x − mean = 0 and k·dy − off a difference of equals: a fused k·dy − off leaves k·dy's rounding
// error where the separate operations give 0.
TEST(BnCpu, EveryOperationRoundedAsTheGpuKernels) {
  auto be = make_cpu_backend({});
  for (int64_t rows : {int64_t(1), int64_t(7)}) {
    const int c = 37;  // more than one SIMD register's width, and a tail
    const size_t n = size_t(rows) * c;
    auto x = rnd(n, 21, -2.f, 3.f), dy = rnd(n, 22), w = rnd(size_t(c), 23, 0.5f, 1.5f), b = rnd(size_t(c), 24);
    std::vector<double> sums(2 * size_t(c) + 1), bsums(2 * size_t(c) + 1);
    std::vector<float> y(n), mean(static_cast<size_t>(c)), invstd(static_cast<size_t>(c)), dx(n);
    be->bn_sums(x.data(), rows, c, sums.data());
    be->bn_forward(x.data(), y.data(), rows, c, sums.data(), w.data(), b.data(), kBnEps, kBnMomentum, mean.data(),
                   invstd.data(), nullptr, nullptr, false);
    be->bn_backward_sums(dy.data(), x.data(), rows, c, mean.data(), bsums.data(), nullptr);
    be->bn_backward(dy.data(), x.data(), dx.data(), rows, c, bsums.data(), mean.data(), invstd.data(), w.data(),
                    nullptr);
    for (int j = 0; j < c; ++j) {
      const double nn = sums[2 * size_t(c)], m = sums[size_t(j)] / nn;
      const double var = std::max(0.0, sums[size_t(c + j)] / nn - m * m), inv = 1.0 / std::sqrt(var + double(kBnEps));
      const volatile float scale = float(inv * w[size_t(j)]), shift = float(b[size_t(j)] - m * inv * w[size_t(j)]);
      const double kj = double(w[size_t(j)]) * invstd[size_t(j)];
      const volatile float k = float(kj);
      const volatile float mm = float(kj * double(invstd[size_t(j)]) * invstd[size_t(j)] * bsums[size_t(c + j)] / nn);
      const volatile float off = float(kj * bsums[size_t(j)] / nn), mu = mean[size_t(j)];
      for (int64_t r = 0; r < rows; ++r) {
        const size_t i = size_t(r) * size_t(c) + size_t(j);
        volatile float p = x[i] * scale;
        EXPECT_EQ(y[i], float(p + shift)) << "y row " << r << " channel " << j;
        volatile float kd = k * dy[i];
        volatile float t = kd - off;
        volatile float xc = x[i] - mu;
        volatile float mx = mm * xc;
        EXPECT_EQ(dx[i], float(t - mx)) << "dx rows " << rows << " row " << r << " channel " << j;
      }
    }
  }
}

// A ReLU fused into batch norm (forward, evaluation, both backward passes) and into the residual
// sum gives the bits of the separate passes it replaces: bn then act_forward, act_backward then
// bn's backward, copy + add then act_forward.
TEST(BnCpu, FusedReluEqualsTheSeparatePasses) {
  auto be = make_cpu_backend({});
  const int64_t rows = 40;
  const int c = 5;
  const size_t n = size_t(rows) * c;
  auto x = rnd(n, 11, -2.f, 3.f), dy = rnd(n, 12);
  auto w = rnd(size_t(c), 13, 0.5f, 1.5f), b = rnd(size_t(c), 14);
  std::vector<double> sums(2 * size_t(c) + 1);
  be->bn_sums(x.data(), rows, c, sums.data());
  std::vector<float> mean(static_cast<size_t>(c)), invstd(static_cast<size_t>(c)), rm(size_t(c), 0.f), rv(size_t(c), 1.f);
  std::vector<float> y(n), a(n), fused(n);
  be->bn_forward(x.data(), y.data(), rows, c, sums.data(), w.data(), b.data(), kBnEps, kBnMomentum, mean.data(),
                 invstd.data(), nullptr, nullptr, false);
  be->act_forward(y.data(), a.data(), n, Act::relu);
  be->bn_forward(x.data(), fused.data(), rows, c, sums.data(), w.data(), b.data(), kBnEps, kBnMomentum, mean.data(),
                 invstd.data(), nullptr, nullptr, true);
  EXPECT_EQ(fused, a);
  const size_t zeros = size_t(std::count(a.begin(), a.end(), 0.f));
  EXPECT_GT(zeros, n / 10);  // the mask below has both values
  EXPECT_LT(zeros, n - n / 10);

  be->bn_infer(x.data(), y.data(), rows, c, rm.data(), rv.data(), w.data(), b.data(), kBnEps, false);
  be->act_forward(y.data(), a.data(), n, Act::relu);
  be->bn_infer(x.data(), fused.data(), rows, c, rm.data(), rv.data(), w.data(), b.data(), kBnEps, true);
  EXPECT_EQ(fused, a);

  // Backward from the training output a = relu(y), y = bn(x).
  be->bn_forward(x.data(), y.data(), rows, c, sums.data(), w.data(), b.data(), kBnEps, kBnMomentum, mean.data(),
                 invstd.data(), nullptr, nullptr, false);
  be->bn_forward(x.data(), a.data(), rows, c, sums.data(), w.data(), b.data(), kBnEps, kBnMomentum, mean.data(),
                 invstd.data(), nullptr, nullptr, true);
  std::vector<float> dm = dy, dx(n), dxf(n);
  be->act_backward(dm.data(), y.data(), a.data(), n, Act::relu);
  std::vector<double> s1(sums.size()), s2(sums.size());
  be->bn_backward_sums(dm.data(), x.data(), rows, c, mean.data(), s1.data(), nullptr);
  be->bn_backward_sums(dy.data(), x.data(), rows, c, mean.data(), s2.data(), a.data());
  EXPECT_EQ(s1, s2);
  be->bn_backward(dm.data(), x.data(), dx.data(), rows, c, s1.data(), mean.data(), invstd.data(), w.data(), nullptr);
  be->bn_backward(dy.data(), x.data(), dxf.data(), rows, c, s2.data(), mean.data(), invstd.data(), w.data(), a.data());
  EXPECT_EQ(dx, dxf);
  std::vector<float> dyi = dy;  // in place, as the model calls it
  be->bn_backward(dyi.data(), x.data(), dyi.data(), rows, c, s2.data(), mean.data(), invstd.data(), w.data(), a.data());
  EXPECT_EQ(dyi, dx);

  // The residual sum: copy + add (the order body + shortcut) then the ReLU.
  std::vector<float> sum = x, out(n);
  be->add(dy.data(), sum.data(), n);
  be->residual_sum(x.data(), dy.data(), out.data(), n, false);
  EXPECT_EQ(out, sum);
  be->act_forward(sum.data(), sum.data(), n, Act::relu);
  be->residual_sum(x.data(), dy.data(), out.data(), n, true);
  EXPECT_EQ(out, sum);
}

TEST(PoolCpu, PaddedAndGlobalPoolingGradients) {
  auto be = make_cpu_backend({});
  for (bool max : {true, false}) {
    PoolGeom g;
    g.batch = 2, g.c = 3, g.h = 7, g.w = 6, g.k = 3, g.stride = 2, g.pad = 1;
    // Values 0.05 apart at least, so that no difference step of 1e-2 changes a window's maximum.
    std::vector<float> x(size_t(g.batch) * g.h * g.w * g.c);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float((i * 37) % x.size()) * 0.05f - 3.f;
    const size_t ny = size_t(g.batch) * g.oh() * g.ow() * g.c;
    EXPECT_EQ(g.oh(), 4);
    EXPECT_EQ(g.ow(), 3);
    const auto r = rnd(ny, 6);
    std::vector<float> y(ny), dx(x.size());
    std::vector<uint8_t> am(ny);
    auto loss = [&] {
      be->pool_forward(x.data(), y.data(), am.data(), g, max);
      return dot(r, y);
    };
    loss();
    // The corner window (0, 0) covers input rows and columns 0..1 only.
    float want = max ? -1e30f : 0.f;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        const float v = x[size_t((i * g.w + j) * g.c)];
        want = max ? std::max(want, v) : want + v;
      }
    EXPECT_FLOAT_EQ(y[0], max ? want : want / 9.f);
    be->pool_backward(r.data(), am.data(), dx.data(), g, max);
    expect_fd(x.data(), x.size(), dx.data(), loss, max ? "maxpool pad" : "avgpool pad");
  }
  auto x = rnd(2 * 5 * 4, 7);
  const auto r = rnd(2 * 4, 8);
  std::vector<float> y(8), dx(x.size());
  auto loss = [&] {
    be->global_avgpool_forward(x.data(), y.data(), 2, 5, 4);
    return dot(r, y);
  };
  loss();
  be->global_avgpool_backward(r.data(), dx.data(), 2, 5, 4);
  expect_fd(x.data(), x.size(), dx.data(), loss, "global avgpool");
}

// ---- the model ------------------------------------------------------------------------------

namespace {

// Σ over the batch of softmax cross-entropy of the model's logits, in double on the host.
double xent(const float* logits, const std::vector<int32_t>& y, int classes) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const float* l = logits + i * size_t(classes);
    double m = l[0], z = 0;
    for (int j = 1; j < classes; ++j) m = std::max(m, double(l[j]));
    for (int j = 0; j < classes; ++j) z += std::exp(double(l[j]) - m);
    s += std::log(z) + m - l[y[i]];
  }
  return s;
}

// Every parameter gradient of a model (training mode: batch statistics), against finite
// differences of the summed cross-entropy; returns the model's batch-norm states' count.
void expect_model_fd(const char* list, const TensorShape& in, int batch) {
  SCOPED_TRACE(list);
  auto be = make_cpu_backend({});
  const int classes = 3;
  Model m(*be, plan_model(parse_layer_list(list), in, classes), batch);
  m.init_params(7);
  // Move batch norm's weights and biases off 1 and 0 so that their gradients mean something.
  for (const LayerSlice& s : m.layers())
    if (s.bn) {
      const auto w = rnd(size_t(s.out), s.w_off + 1, 0.5f, 1.5f), b = rnd(size_t(s.out), s.b_off + 2, -0.5f, 0.5f);
      std::copy(w.begin(), w.end(), m.params() + s.w_off);
      std::copy(b.begin(), b.end(), m.params() + s.b_off);
    }
  const auto x = rnd(size_t(batch) * in.size(), 9);
  std::vector<int32_t> y(static_cast<size_t>(batch));
  for (int i = 0; i < batch; ++i) y[size_t(i)] = (i * 7) % classes;
  TrainPass tp;
  auto loss = [&] { return xent(m.forward(x.data(), batch, &tp), y, classes); };
  loss();
  float stats[2] = {0, 0};
  m.loss(y.data(), batch, 1.f, stats, true);
  m.backward(x.data(), batch, false);
  EXPECT_NEAR(stats[0], loss(), 1e-4);
  const std::vector<float> g(m.grads(), m.grads() + m.num_params());
  for (const LayerSlice& s : m.layers()) {
    const size_t stride = s.weights() > 60 ? 7 : 1;
    expect_fd(m.params() + s.w_off, s.weights(), g.data() + s.w_off, loss, s.name + " weight", stride);
    if (s.has_bias) expect_fd(m.params() + s.b_off, size_t(s.out), g.data() + s.b_off, loss, s.name + " bias");
    else for (int i = 0; i < s.out; ++i) EXPECT_EQ(m.params()[s.b_off + size_t(i)], 0.f) << s.name;
  }
}

}  // namespace

TEST(ResnetModel, GradientsMatchFiniteDifferences) {
  const TensorShape img = TensorShape::image(2, 6, 6);
  expect_model_fd("conv(4,3,pad=1) bn tanh flatten linear(3)", img, 4);
  expect_model_fd("flatten linear(5) bn tanh linear(3)", img, 4);
  expect_model_fd("conv(4,3,pad=1,bias=false) tanh res(conv(4,3,pad=1) tanh) flatten linear(3)", img, 4);
  expect_model_fd("conv(4,3,pad=1) tanh res(conv(6,3,stride=2,pad=1) | conv(6,1,stride=2,bias=false)) tanh "
                  "avgpool(global) flatten linear(3)", img, 4);
  expect_model_fd("conv(4,3,pad=1,bias=false) bn tanh "
                  "res(conv(4,3,pad=1,bias=false) bn tanh conv(4,3,pad=1) bn) tanh "
                  "res(res(conv(6,3,stride=2,pad=1,bias=false) bn | conv(6,1,stride=2,bias=false)) tanh conv(6,1) bn | "
                  "conv(6,1,stride=2,bias=false) bn) tanh avgpool(3,stride=2,pad=1) "
                  "avgpool(global) flatten linear(5) bn tanh linear(3)", img, 4);
  // ResNet's tail: identity blocks with relu on a 2x2 map, then the global average and fc.
  expect_model_fd("conv(8,3,pad=1,bias=false) bn tanh "
                  "res(conv(8,3,pad=1,bias=false) bn tanh conv(8,3,pad=1,bias=false) bn) tanh "
                  "res(conv(8,3,pad=1,bias=false) bn tanh conv(8,3,pad=1,bias=false) bn) tanh "
                  "avgpool(global) flatten linear(3)", TensorShape::image(3, 2, 2), 6);
}

// Running statistics move once per training pass; evaluation uses them.
TEST(ResnetModel, RunningStatistics) {
  auto be = make_cpu_backend({});
  const TensorShape in = TensorShape::image(2, 6, 6);
  Model m(*be, plan_model(parse_layer_list("conv(4,3,pad=1) bn relu res(conv(4,3,pad=1) bn) flatten linear(5) bn linear(3)"), in, 3), 4);
  m.init_params(1);
  const auto x = rnd(4 * size_t(in.size()), 2);
  auto bn = m.bn_states();
  ASSERT_EQ(bn.size(), 3u);
  EXPECT_EQ(bn[0].name, "bn0");
  EXPECT_EQ(bn[2].name, "bn2");
  EXPECT_EQ(bn[2].c, 5);
  TrainPass tp;
  m.forward(x.data(), 4, &tp);
  m.forward(x.data(), 4, &tp);
  EXPECT_EQ(*bn[1].tracked, 2);
  EXPECT_NE(bn[0].running_mean[0], 0.f);
  const float* e1 = m.forward(x.data(), 4);
  EXPECT_EQ(*bn[1].tracked, 2);
  const std::vector<float> eval1(e1, e1 + 12);
  bn[2].running_var[0] += 1.f;
  const float* e2 = m.forward(x.data(), 4);
  EXPECT_NE(eval1[0], e2[0]);
}

// Batch norms' ReLU outputs that take turns in one buffer and are made again for the backward
// pass (Recompute::on, Model::share_slots) give the bits of keeping each (Recompute::off):
// logits, losses and gradients of two training passes (the second accumulated) with an
// evaluation pass between them, which writes the slot too. resnet50: its bottlenecks' batch norms
// before a convolution, and the stem's before the max pooling. (Its four projection shortcuts
// share one kept gradient either way.)
TEST(ResnetModel, RecomputedReluOutputsGiveTheBitsOfKeptOnes) {
  const TensorShape in = TensorShape::image(3, 32, 32);
  const auto x = rnd(2 * size_t(in.size()), 7);
  const std::vector<int32_t> y = {2, 0};
  struct Run {
    std::vector<float> logits, grads1, grads2, stats;
  };
  auto run = [&](Recompute rc, bool sync_bn) {
    auto be = make_cpu_backend({});
    Model m(*be, plan_model(parse_layer_list("resnet50(classes=3)"), in, 3), 2, {}, rc);
    EXPECT_EQ(m.remade_ops(), rc == Recompute::on ? 1 + 3 * 2 + 4 * 2 + 6 * 2 + 3 * 2 : 0);
    // sync_bn's path (the sums added over ranks between the passes' halves), with one rank.
    if (sync_bn) m.set_bn_reduce([](double*, size_t) {});
    m.init_params(5);
    Run r;
    float stats[2] = {0, 0};
    TrainPass tp;
    const float* l = m.forward(x.data(), 2, &tp);
    r.logits.assign(l, l + 6);
    m.loss(y.data(), 2, 0.5f, stats, true);
    m.backward(x.data(), 2, false);
    r.grads1.assign(m.grads(), m.grads() + m.num_params());
    const float* e = m.forward(x.data(), 2);
    r.logits.insert(r.logits.end(), e, e + 6);
    m.forward(x.data(), 2, &tp);
    m.loss(y.data(), 2, 0.5f, stats, true);
    m.backward(x.data(), 2, true);
    r.grads2.assign(m.grads(), m.grads() + m.num_params());
    r.stats.assign(stats, stats + 2);
    return r;
  };
  for (bool sync_bn : {false, true}) {
    const Run own = run(Recompute::off, sync_bn), shared = run(Recompute::on, sync_bn);
    EXPECT_EQ(shared.logits, own.logits) << "sync_bn " << sync_bn;
    EXPECT_EQ(shared.stats, own.stats) << "sync_bn " << sync_bn;
    ASSERT_EQ(shared.grads1.size(), own.grads1.size());
    size_t differ1 = 0, differ2 = 0, nonzero = 0;
    for (size_t i = 0; i < own.grads1.size(); ++i) {
      differ1 += shared.grads1[i] != own.grads1[i];
      differ2 += shared.grads2[i] != own.grads2[i];
      nonzero += own.grads1[i] != 0.f;
    }
    EXPECT_EQ(differ1, 0u) << "sync_bn " << sync_bn;
    EXPECT_EQ(differ2, 0u) << "sync_bn " << sync_bn;
    EXPECT_GT(nonzero, own.grads1.size() / 2) << "sync_bn " << sync_bn;  // the gradients reach the stem
  }
}

// Recompute::automatic makes them again where they would hold 2^29 values or more at the max
// batch: resnet50 on 224x224 images at batch 256 (about 0.88 G), not at batch 128.
TEST(ResnetModel, AutomaticRecomputeFollowsTheSize) {
  auto be = make_cpu_backend({});
  const ModelPlan plan = plan_model(parse_layer_list("resnet50(classes=3)"), TensorShape::image(3, 224, 224), 3);
  const Model at256(*be, plan, 256, {}, Recompute::automatic);
  EXPECT_EQ(at256.remade_ops(), 33);
  EXPECT_GE(at256.remade_values(), size_t(1) << 29);
  const Model at128(*be, plan, 128, {}, Recompute::automatic);
  EXPECT_EQ(at128.remade_ops(), 0);
  EXPECT_EQ(at128.remade_values(), 0u);
  EXPECT_THROW(parse_recompute("sometimes"), InputError);
}

// Accumulating the gradient over two passes doubles it; a second backward pass with the same
// batch gives the same gradient (the residual buffers hold nothing over).
TEST(ResnetModel, BackwardIsRepeatable) {
  auto be = make_cpu_backend({});
  const TensorShape in = TensorShape::image(1, 8, 8);
  Model m(*be, plan_model(parse_layer_list("resnet18(stem=small,classes=3)"), in, 3), 2);
  m.init_params(3);
  const auto x = rnd(2 * 64, 4);
  const std::vector<int32_t> y = {1, 2};
  TrainPass tp;
  float stats[2] = {0, 0};
  auto step = [&](bool acc) {
    m.forward(x.data(), 2, &tp);
    m.loss(y.data(), 2, 0.5f, stats, true);
    m.backward(x.data(), 2, acc);
    return std::vector<float>(m.grads(), m.grads() + m.num_params());
  };
  const auto g1 = step(false), g2 = step(false), g3 = step(true);
  for (size_t i = 0; i < g1.size(); ++i) {
    ASSERT_EQ(g1[i], g2[i]) << i;
    ASSERT_NEAR(g3[i], 2 * g1[i], 1e-6 + 1e-6 * std::fabs(g1[i])) << i;
  }
}

// The step's observer (bench-step's account) sees every op forward in order, the loss, then the
// ops backward in reverse down to the first with parameters; op_costs describes the same ops,
// with a convolution's flops and values as its shapes give them.
TEST(ResnetModel, ProbeVisitsEveryOpAndCostsFollowTheShapes) {
  auto be = make_cpu_backend({});
  const TensorShape in = TensorShape::image(2, 6, 6);
  const int B = 4;
  Model m(*be, plan_model(parse_layer_list("conv(4,3,pad=1,bias=false) bn relu "
                                           "res(conv(6,3,stride=2,pad=1) | conv(6,1,stride=2,bias=false)) relu "
                                           "avgpool(global) flatten linear(3)"), in, 3), B);
  m.init_params(5);
  const std::vector<OpCost> c = m.op_costs(B);
  std::vector<std::pair<StepPoint, int>> seen;
  m.set_probe([&](StepPoint p, int op) { seen.emplace_back(p, op); });
  const auto x = rnd(size_t(B) * size_t(in.size()), 6);
  const std::vector<int32_t> y = {0, 1, 2, 0};
  TrainPass tp;
  float stats[2] = {0, 0};
  m.forward(x.data(), B, &tp);
  m.loss(y.data(), B, 0.25f, stats, true);
  m.backward(x.data(), B, false);
  const int n = int(c.size());
  // Two channels: the image is made NHWC first, and that op has no backward.
  ASSERT_EQ(c[0].kind, "layout");
  EXPECT_FALSE(c[0].has_bwd);
  ASSERT_EQ(int(seen.size()), n + 1 + (n - 1));
  for (int i = 0; i < n; ++i) EXPECT_EQ(seen[size_t(i)], std::make_pair(StepPoint::forward, i));
  EXPECT_EQ(seen[size_t(n)], std::make_pair(StepPoint::loss, -1));
  for (int i = 0; i < n - 1; ++i) EXPECT_EQ(seen[size_t(n + 1 + i)], std::make_pair(StepPoint::backward, n - 1 - i));
  // The first conv (no input gradient: the first op with parameters) and the strided one.
  ASSERT_EQ(c[1].kind, "conv");
  EXPECT_EQ(c[1].name, "conv0");
  EXPECT_DOUBLE_EQ(c[1].fwd_flops, 2.0 * B * 6 * 6 * 4 * (3 * 3 * 2));
  EXPECT_DOUBLE_EQ(c[1].bwd_flops, c[1].fwd_flops);
  EXPECT_DOUBLE_EQ(c[1].fwd_values, B * (2.0 * 36 + 4.0 * 36));
  EXPECT_DOUBLE_EQ(c[1].param_values, 4.0 * 3 * 3 * 2);
  const auto conv = std::find_if(c.begin() + 2, c.end(), [](const OpCost& o) { return o.kind == "conv"; });
  ASSERT_NE(conv, c.end());
  EXPECT_DOUBLE_EQ(conv->fwd_flops, 2.0 * B * 3 * 3 * 6 * (3 * 3 * 4));
  EXPECT_DOUBLE_EQ(conv->bwd_flops, 2 * conv->fwd_flops);
  EXPECT_DOUBLE_EQ(conv->bwd_values, B * (6.0 * 9 + 2 * 4.0 * 36));
  EXPECT_EQ(conv->shape, "3x3/2 4->6, 3x3 out");
  int linear = 0, bn = 0, residual = 0;
  for (const OpCost& o : c) {
    linear += o.kind == "linear";
    bn += o.kind == "bn";
    residual += o.kind == "residual";
    if (o.kind == "linear") EXPECT_DOUBLE_EQ(o.fwd_flops, 2.0 * B * 6 * 3);
  }
  EXPECT_EQ(linear, 1);
  EXPECT_EQ(bn, 1);
  EXPECT_EQ(residual, 3);  // the block's begin, the switch to the shortcut, the sum
}

// A linear run on a flattened image reads it in NHWC order, its first weight reordered per pass,
// where the weight is no larger than the activation (max batch >= its outputs); otherwise the
// activation is transposed to NCHW. Both give the same logits and gradients up to summation
// order, in the arena's (the checkpoint's) NCHW order, added to under accumulation; the
// reordered weight's gradient is reported final once, after the arena holds it.
TEST(ResnetModel, FlattenReadInNhwcOrderMatchesTheTransposedRead) {
  auto be = make_cpu_backend({});
  const TensorShape in = TensorShape::image(2, 6, 6);
  const char* list = "conv(4,3,pad=1) relu maxpool(2) flatten linear(3) relu linear(3)";
  Model plain(*be, plan_model(parse_layer_list(list), in, 3), 2);     // 3 outputs > max batch 2
  Model reordered(*be, plan_model(parse_layer_list(list), in, 3), 8);  // 3 <= 8
  EXPECT_FALSE(plain.reads_flatten_nhwc());
  EXPECT_TRUE(reordered.reads_flatten_nhwc());
  plain.init_params(5);
  std::copy(plain.params(), plain.params() + plain.num_params(), reordered.params());
  const auto x = rnd(2 * size_t(in.size()), 6);
  const std::vector<int32_t> y = {0, 2};
  const LayerSlice& fc = reordered.layers()[1];
  ASSERT_FALSE(fc.conv);
  const size_t w0 = fc.w_off, w1 = fc.w_off + fc.weights();
  TrainPass tp;
  auto pass = [&](Model& m, bool acc, const PassHooks& h) {
    const float* l = m.forward(x.data(), 2, &tp);
    std::vector<float> logits(l, l + 6);
    float stats[2] = {0, 0};
    m.loss(y.data(), 2, 1.f, stats, true);
    m.backward(x.data(), 2, acc, h);
    return logits;
  };
  int reports = 0;
  std::vector<float> at_report;
  PassHooks h;
  h.grads_final = [&](size_t b, size_t e) {
    if (b < w1 && e > w0) {
      EXPECT_TRUE(b == w0 && e == w1) << "the reordered weight reported in part: [" << b << ", " << e << ")";
      ++reports;
      at_report.assign(reordered.grads() + w0, reordered.grads() + w1);
    }
  };
  for (bool acc : {false, true}) {
    SCOPED_TRACE(acc ? "accumulated" : "first pass");
    const auto lp = pass(plain, acc, {}), lr = pass(reordered, acc, h);
    for (size_t i = 0; i < lp.size(); ++i) EXPECT_NEAR(lr[i], lp[i], 1e-5f * (1 + std::fabs(lp[i]))) << i;
    double scale = 0;
    for (size_t i = 0; i < plain.num_params(); ++i) scale = std::max(scale, double(std::fabs(plain.grads()[i])));
    ASSERT_GT(scale, 0);
    for (size_t i = 0; i < plain.num_params(); ++i)
      ASSERT_NEAR(reordered.grads()[i], plain.grads()[i], 1e-5 * scale) << i;
    EXPECT_EQ(reports, acc ? 2 : 1);
    ASSERT_EQ(at_report.size(), w1 - w0);
    for (size_t i = 0; i < at_report.size(); ++i) ASSERT_EQ(at_report[i], reordered.grads()[w0 + i]) << i;
  }
}

// ---- label smoothing and weight decay -------------------------------------------------------

// F.cross_entropy(label_smoothing = eps): loss (1 − eps)·nll + eps·mean_j(−log p_j), and its
// gradient against finite differences.
TEST(LossCpu, LabelSmoothing) {
  auto be = make_cpu_backend({});
  const int batch = 3, classes = 5;
  const float eps = 0.1f;
  auto logits = rnd(size_t(batch) * classes, 11, -2.f, 2.f);
  const std::vector<int32_t> y = {4, 0, 2};
  auto loss = [&] {
    float stats[2] = {0, 0};
    be->softmax_xent_smoothed(logits.data(), y.data(), batch, classes, 1.f, nullptr, stats, eps);
    return double(stats[0]);
  };
  double want = 0;
  for (int i = 0; i < batch; ++i) {
    const float* l = logits.data() + size_t(i) * classes;
    double z = 0;
    for (int j = 0; j < classes; ++j) z += std::exp(double(l[j]));
    double nll_all = 0;
    for (int j = 0; j < classes; ++j) nll_all += std::log(z) - l[j];
    want += (1 - eps) * (std::log(z) - l[y[size_t(i)]]) + eps * nll_all / classes;
  }
  EXPECT_NEAR(loss(), want, 1e-5);
  std::vector<float> d(logits.size());
  float stats[2] = {0, 0};
  be->softmax_xent_smoothed(logits.data(), y.data(), batch, classes, 1.f, d.data(), stats, eps);
  expect_fd(logits.data(), logits.size(), d.data(), loss, "dlogits");
  // eps = 0 is the plain loss.
  float a[2] = {0, 0}, b[2] = {0, 0};
  be->softmax_xent_smoothed(logits.data(), y.data(), batch, classes, 1.f, nullptr, a, 0.f);
  be->softmax_xent(logits.data(), y.data(), batch, classes, 1.f, nullptr, b);
  EXPECT_NEAR(a[0], b[0], 1e-6);
}

// train.decay_bn_and_bias = false: 1-D tensors (biases, batch norm) step without weight decay;
// the padding between tensors is left alone.
TEST(OptimCpu, NoDecayOnBnAndBias) {
  auto be = make_cpu_backend({});
  Config cfg;
  cfg.optimizer = "sgd";
  cfg.weight_decay = 0.5;
  const std::vector<TensorSeg> segs = {{0, 4, true}, {4, 6, false}, {8, 10, false}};
  float lr = 0.1f;
  for (bool decay : {true, false}) {
    cfg.decay_bn_and_bias = decay;
    Optimizer opt(*be, cfg, 10, segs);
    std::vector<float> p(10, 1.f), g(10, 0.2f);
    StepCtl ctl;
    opt.step_at(p.data() + 2, g.data() + 2, 2, 8, &lr, &ctl, false);  // a range cutting the first tensor
    EXPECT_EQ(p[0], 1.f);
    EXPECT_FLOAT_EQ(p[3], 1.f - 0.1f * (0.2f + 0.5f));
    EXPECT_FLOAT_EQ(p[5], decay ? 1.f - 0.1f * 0.7f : 1.f - 0.1f * 0.2f) << decay;
    EXPECT_FLOAT_EQ(p[9], decay ? 1.f - 0.1f * 0.7f : 1.f - 0.1f * 0.2f) << decay;
    EXPECT_EQ(p[6], decay ? 1.f - 0.1f * 0.7f : 1.f) << "padding";
  }
}
