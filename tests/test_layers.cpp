// Single-rank tests of the layer list (parsing, normalised text, config keys, shape inference and
// its messages) and of the CPU backend's convolutional-network ops: convolution against a direct
// loop in double, im2col/col2im as adjoints, every op's gradient against central finite
// differences, pooling's tie rule, the layout transposes, dropout's mask and augmentation.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "dpt/augment.hpp"
#include "dpt/backend.hpp"
#include "dpt/check.hpp"
#include "dpt/config.hpp"
#include "dpt/data.hpp"
#include "dpt/dropout.hpp"
#include "dpt/layer_spec.hpp"
#include "layer_util.hpp"

using namespace dpt;
using namespace layer_util;

namespace {

Invocation parse(const std::string& ini, std::vector<std::string> args = {}) {
  std::vector<const char*> argv{"dptrain"};
  for (auto& a : args) argv.push_back(a.c_str());
  return parse_invocation(int(argv.size()), argv.data(), "test.ini", ini);
}

std::string config_error(const std::string& ini) {
  return error_of([&] { parse(ini); });
}

const char* kCnn =
    "conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1) relu maxpool(2) flatten linear(128) relu "
    "dropout(0.25) linear(10)";

}  // namespace

// ---- the layer list -------------------------------------------------------------------------

TEST(LayerList, ParsesAndNormalises) {
  const auto l = parse_layer_list(
      "  conv( 32 , 3 , pad=1 ) relu maxpool(2) conv(64,5,stride=2,pad=2)\tgelu avgpool(3, stride=1)\n"
      "flatten linear(128) tanh dropout(0.25) sigmoid linear(10)  ");
  ASSERT_EQ(l.size(), 12u);
  EXPECT_EQ(l[0].kind, LayerKind::conv);
  EXPECT_EQ(l[0].out, 32);
  EXPECT_EQ(l[0].k, 3);
  EXPECT_EQ(l[0].stride, 1);
  EXPECT_EQ(l[0].pad, 1);
  EXPECT_EQ(l[2].stride, 2);  // a pool's stride defaults to its kernel
  EXPECT_EQ(l[5].stride, 1);
  EXPECT_EQ(l[9].p, 0.25);
  const std::string norm = layer_list_text(l);
  EXPECT_EQ(norm,
            "conv(32,3,stride=1,pad=1) relu maxpool(2,stride=2) conv(64,5,stride=2,pad=2) gelu "
            "avgpool(3,stride=1) flatten linear(128) tanh dropout(0.25) sigmoid linear(10)");
  EXPECT_EQ(parse_layer_list(norm), l);
  EXPECT_EQ(layer_list_text(parse_layer_list("dropout(0.1) linear(3)")), "dropout(0.1) linear(3)");
  EXPECT_TRUE(is_layer_list(kCnn));
  EXPECT_FALSE(is_layer_list("784, 256,10"));
  EXPECT_EQ(layer_list_text(mlp_layer_list({784, 256, 128, 10}, Act::relu)),
            "linear(256) relu linear(128) relu linear(10)");
}

TEST(LayerList, ErrorsNameTheLayerAndWhatIsWrong) {
  struct Case { const char* list; const char* expect; };
  const Case cases[] = {
      {"conv(32) relu", "layer 1 'conv(32)': expected conv(C_out, K"},
      {"linear(4) conv(8,3,pad=x)", "layer 2 'conv(8,3,pad=x)': pad 'x' is not an integer"},
      {"conv(0,3)", "C_out '0' is not an integer in [1,"},
      {"conv(8,3,dilation=2)", "unknown argument 'dilation'"},
      {"conv(8,3,stride=2,stride=1)", "argument 'stride' given twice"},
      {"conv(8,3,pad=1,2)", "positional argument '2' after a named one"},
      {"conv(8,,3)", "empty argument"},
      {"linear(4) maxpool", "layer 2 'maxpool': expected maxpool(K[, stride=S][, pad=P])"},
      {"relu(1) linear(2)", "relu takes no arguments"},
      {"linear(10", "'(' without a closing ')'"},
      {"linear(10)relu", "separated by whitespace"},
      {"linear(4) softmax", "layer 2 'softmax': unknown layer 'softmax'"},
      {"dropout(1) linear(2)", "p '1' is not a number in [0, 1)"},
      {"dropout(-0.1) linear(2)", "p '-0.1'"},
      {"dropout(nan) linear(2)", "p 'nan'"},
      {"linear(2) , linear(3)", "expected a layer name"},
      {"linear(99999999999)", "N '99999999999' is not an integer"},
      {"conv(8,65)", "kernel size '65'"},
      {"maxpool(16) flatten linear(2)", "kernel size '16' is not an integer in [1, 15]"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of([&] { parse_layer_list(c.list); });
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.list << " -> " << e;
  }
  // The limit is max pooling's (its argmax is a byte per value), not average pooling's.
  EXPECT_NO_THROW(parse_layer_list("avgpool(16) flatten linear(2)"));
  EXPECT_NO_THROW(parse_layer_list("maxpool(15) flatten linear(2)"));
  std::string huge;
  while (huge.size() < (1u << 20)) huge += "linear(10) ";
  EXPECT_NE(error_of([&] { parse_layer_list(huge); }).find("characters long"), std::string::npos);
  std::string many;
  for (int i = 0; i < 1100; ++i) many += "relu ";
  EXPECT_NE(error_of([&] { parse_layer_list(many); }).find("more than 1024 layers"), std::string::npos);
}

TEST(LayerList, ConfigKeys) {
  const std::string base = "[data]\ntrain = x.h5\n[model]\n";
  Invocation inv = parse(base + "layers = " + kCnn + "\n");
  EXPECT_TRUE(inv.cfg.layers.empty());
  EXPECT_EQ(inv.cfg.layer_list, layer_list_text(parse_layer_list(kCnn)));
  EXPECT_NE(inv.cfg.resolved.find("layers = conv(32,3,stride=1,pad=1) relu"), std::string::npos);
  // The resolved text (what a checkpoint stores) has no activation key, and parses back alike.
  EXPECT_EQ(inv.cfg.resolved.find("activation"), std::string::npos);
  EXPECT_EQ(parse(inv.cfg.resolved).cfg.resolved, inv.cfg.resolved);
  // The command line overrides the list like any key.
  inv = parse(base + "layers = 4,3\n", {"--model.layers", "flatten linear(3)"});
  EXPECT_EQ(inv.cfg.layer_list, "flatten linear(3)");
  // The MLP shorthand is unchanged, activation and all.
  inv = parse(base + "layers = 784, 256,10\nactivation = tanh\n");
  EXPECT_EQ(inv.cfg.layers, (std::vector<int>{784, 256, 10}));
  EXPECT_TRUE(inv.cfg.layer_list.empty());
  EXPECT_NE(inv.cfg.resolved.find("activation = tanh"), std::string::npos);

  std::string e = config_error(base + "layers = linear(10)\nactivation = tanh\n");
  EXPECT_NE(e.find("model.activation = 'tanh'"), std::string::npos) << e;
  EXPECT_NE(e.find("model.layers"), std::string::npos) << e;
  EXPECT_NE(e.find("test.ini"), std::string::npos) << e;
  e = config_error(base + "layers = conv(8,3) relu linear(2) bogus(3)\n");
  EXPECT_NE(e.find("model.layers"), std::string::npos) << e;
  EXPECT_NE(e.find("layer 4 'bogus(3)': unknown layer 'bogus'"), std::string::npos) << e;
  std::string huge = base + "layers = ";
  while (huge.size() < (1u << 20)) huge += "linear(10) ";
  e = config_error(huge + "\n");
  EXPECT_NE(e.find("model.layers"), std::string::npos);
  EXPECT_NE(e.find("characters long"), std::string::npos);
  EXPECT_LT(e.size(), 1000u);  // the value is quoted, not echoed whole

  inv = parse(base + "input_shape = 1, 28,28\n");
  EXPECT_EQ(inv.cfg.input_shape, (std::vector<int>{1, 28, 28}));
  EXPECT_EQ(parse(inv.cfg.resolved).cfg.input_shape, inv.cfg.input_shape);
  e = config_error(base + "input_shape = 1,28\n");
  EXPECT_NE(e.find("model.input_shape = '1,28'"), std::string::npos) << e;
  e = config_error(base + "input_shape = 1,0,28\n");
  EXPECT_NE(e.find("model.input_shape"), std::string::npos) << e;

  inv = parse("[data]\ntrain = x.h5\naugment = crop,flip\ncrop_padding = 2\n");
  EXPECT_EQ(inv.cfg.augment, "crop,flip");
  EXPECT_EQ(inv.cfg.crop_padding, 2);
  e = config_error("[data]\ntrain = x.h5\naugment = rotate\n");
  EXPECT_NE(e.find("data.augment = 'rotate'"), std::string::npos) << e;
  e = config_error("[data]\ntrain = x.h5\ncrop_padding = 65\n");
  EXPECT_NE(e.find("data.crop_padding = '65'"), std::string::npos) << e;
}

// ---- shape inference ------------------------------------------------------------------------

TEST(ShapeInference, ShapesParametersAndNames) {
  const ModelPlan m = plan_model(parse_layer_list(kCnn), TensorShape::image(1, 28, 28), 10);
  ASSERT_EQ(m.layers.size(), 11u);
  EXPECT_EQ(m.layers[0].out.str(), "32x28x28");
  EXPECT_EQ(m.layers[0].name, "conv0");
  EXPECT_EQ(m.layers[0].weights, 32 * 1 * 3 * 3);
  EXPECT_EQ(m.layers[2].out.str(), "32x14x14");
  EXPECT_EQ(m.layers[3].name, "conv1");
  EXPECT_EQ(m.layers[3].weights, 64 * 32 * 9);
  EXPECT_EQ(m.layers[5].out.str(), "64x7x7");
  EXPECT_EQ(m.layers[6].out.str(), "3136");
  EXPECT_EQ(m.layers[7].name, "fc0");
  EXPECT_EQ(m.layers[7].weights, 128 * 3136);
  EXPECT_EQ(m.layers[10].name, "fc1");
  EXPECT_EQ(m.params, 320 + 18496 + 401536 + 1290);
  const std::string d = m.describe();
  EXPECT_NE(d.find("conv(64,3,stride=1,pad=1)"), std::string::npos) << d;
  EXPECT_NE(d.find("64x7x7"), std::string::npos) << d;
  EXPECT_NE(d.find("401536"), std::string::npos) << d;
  EXPECT_NE(d.find("total parameters 421642"), std::string::npos) << d;

  // Stride, padding and rounding down; a first linear takes an image flattened.
  const ModelPlan s = plan_model(parse_layer_list("conv(4,3,stride=2) avgpool(2,stride=1) flatten linear(3)"),
                                 TensorShape::image(3, 8, 7), 3);
  EXPECT_EQ(s.layers[0].out.str(), "4x3x3");
  EXPECT_EQ(s.layers[1].out.str(), "4x2x2");
  const ModelPlan f = plan_model(parse_layer_list("linear(5) relu linear(2)"), TensorShape::image(1, 2, 3), 2);
  EXPECT_EQ(f.layers[0].weights, 30);
}

TEST(ShapeInference, ErrorsNameTheLayerAndBothShapes) {
  struct Case { const char* list; TensorShape in; int classes; const char* expect; };
  const Case cases[] = {
      {"conv(8,3) flatten linear(2)", TensorShape::features(784), 2,
       "layer 1 'conv(8,3,stride=1,pad=0)' (input 784): needs an image input"},
      {"conv(8,3) flatten linear(2)", TensorShape::features(784), 2, "model.input_shape"},
      {"flatten conv(8,3) linear(2)", TensorShape::image(1, 8, 8), 2,
       "layer 2 'conv(8,3,stride=1,pad=0)' (input 64): needs an image input, but its input is flat"},
      {"conv(8,5) flatten linear(2)", TensorShape::image(1, 4, 4), 2,
       "layer 1 'conv(8,5,stride=1,pad=0)' (input 1x4x4): kernel 5x5 is larger than its input 4x4"},
      {"conv(8,3) maxpool(3) maxpool(2) flatten linear(2)", TensorShape::image(1, 5, 5), 2,
       "layer 3 'maxpool(2,stride=2)' (input 8x1x1): kernel 2x2 is larger than its input 1x1"},
      {"conv(8,3) linear(2)", TensorShape::image(1, 5, 5), 2,
       "layer 2 'linear(2)' (input 8x3x3): needs a flat input: put flatten before it"},
      {"linear(5) relu linear(3)", TensorShape::features(8), 10,
       "the model's output has 3 values (after layer 3 'linear(3)') but the data has 10 classes"},
      {"conv(2,3)", TensorShape::image(1, 5, 5), 2, "the model's output 2x3x3 (after layer 1"},
      {"flatten relu", TensorShape::image(1, 5, 5), 2, "no parameters"},
      {"conv(65536,1) conv(65536,1)", TensorShape::image(1, 1024, 1024), 2, "more than 2^31 - 1 elements"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of([&] { plan_model(parse_layer_list(c.list), c.in, c.classes); });
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.list << " -> " << e;
  }
}

TEST(ShapeInference, InputShapeFromDataAndConfig) {
  EXPECT_EQ(model_input_shape({1, 28, 28}, {}, "f.h5"), TensorShape::image(1, 28, 28));
  EXPECT_EQ(model_input_shape({784}, {}, "f.h5"), TensorShape::features(784));
  EXPECT_EQ(model_input_shape({784}, {1, 28, 28}, "f.h5"), TensorShape::image(1, 28, 28));
  EXPECT_EQ(model_input_shape({1, 28, 28}, {1, 28, 28}, "f.h5"), TensorShape::image(1, 28, 28));
  std::string e = error_of([] { model_input_shape({784}, {3, 28, 28}, "f.h5"); });
  EXPECT_NE(e.find("model.input_shape = 3x28x28 (2352 values) does not fit f.h5, whose samples are 784 values"),
            std::string::npos) << e;
  e = error_of([] { model_input_shape({1, 28, 28}, {4, 14, 14}, "f.h5"); });
  EXPECT_NE(e.find("whose samples are 1x28x28"), std::string::npos) << e;
}

// ---- the CPU backend's ops ------------------------------------------------------------------

namespace {

// The definition in dptrain's layouts: x (n, h, w, c), w (o, kh, kw, c), in double.
std::vector<double> direct_conv(const std::vector<float>& x, const std::vector<float>& w,
                                const std::vector<float>& b, const ConvGeom& g) {
  std::vector<double> y(size_t(g.rows()) * g.out);
  for (int n = 0; n < g.batch; ++n)
    for (int oh = 0; oh < g.oh(); ++oh)
      for (int ow = 0; ow < g.ow(); ++ow)
        for (int o = 0; o < g.out; ++o) {
          double s = b[size_t(o)];
          for (int kh = 0; kh < g.k; ++kh)
            for (int kw = 0; kw < g.k; ++kw) {
              const int ih = oh * g.stride - g.pad + kh, iw = ow * g.stride - g.pad + kw;
              if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
              for (int c = 0; c < g.c; ++c)
                s += double(x[((size_t(n) * g.h + ih) * g.w + iw) * g.c + c]) *
                     w[((size_t(o) * g.k + kh) * g.k + kw) * g.c + c];
            }
          y[((size_t(n) * g.oh() + oh) * g.ow() + ow) * g.out + o] = s;
        }
  return y;
}

ConvGeom geom(int batch, int c, int h, int w, int out, int k, int stride, int pad) {
  ConvGeom g;
  g.batch = batch; g.c = c; g.h = h; g.w = w; g.out = out; g.k = k; g.stride = stride; g.pad = pad;
  return g;
}

const ConvGeom kConvs[] = {geom(2, 3, 7, 6, 4, 3, 1, 1), geom(3, 2, 9, 9, 5, 3, 2, 0),
                           geom(1, 1, 5, 5, 2, 5, 1, 2), geom(2, 4, 4, 5, 3, 1, 1, 0),
                           geom(2, 2, 6, 6, 3, 4, 3, 2)};

std::string what(const ConvGeom& g) {
  return "batch " + std::to_string(g.batch) + " " + std::to_string(g.c) + "x" + std::to_string(g.h) + "x" +
         std::to_string(g.w) + " -> " + std::to_string(g.out) + " k" + std::to_string(g.k) + " s" +
         std::to_string(g.stride) + " p" + std::to_string(g.pad);
}

}  // namespace

TEST(ConvCpu, ForwardMatchesTheDirectConvolution) {
  auto be = make_cpu_backend({});
  for (const ConvGeom& g : kConvs) {
    const auto x = rnd(size_t(g.batch) * g.h * g.w * g.c, 1);
    const auto w = rnd(size_t(g.out) * g.cols(), 2);
    const auto b = rnd(size_t(g.out), 3);
    const auto ref = direct_conv(x, w, b, g);
    // Both paths: oneDNN (no columns: conv_cols asks for none) and im2col + the GEMM (columns
    // given); and without bias.
    EXPECT_EQ(be->conv_cols(g), 0u) << what(g);
    for (bool columns : {false, true}) {
      std::vector<float> cols(size_t(g.rows()) * g.cols()), z(size_t(g.rows()) * g.out), a(z.size());
      float* c = columns ? cols.data() : nullptr;
      be->conv_forward(x.data(), w.data(), b.data(), c, z.data(), a.data(), g, Act::none);
      for (size_t i = 0; i < z.size(); ++i)
        EXPECT_NEAR(z[i], ref[i], 1e-5) << what(g) << (columns ? " im2col " : " oneDNN ") << i;
      EXPECT_EQ(a, z) << what(g);
      be->conv_forward(x.data(), w.data(), nullptr, c, z.data(), z.data(), g, Act::none);
      for (size_t i = 0; i < z.size(); ++i)
        EXPECT_NEAR(z[i], ref[i] - b[i % size_t(g.out)], 1e-5) << what(g) << (columns ? " im2col " : " oneDNN ") << i;
    }
  }
}

// relu, tanh and sigmoid differentiate from a alone, so the model lets a overwrite z: the same
// results, bit for bit, as with z kept apart.
TEST(ConvCpu, ActivationInPlaceOfItsInput) {
  auto be = make_cpu_backend({});
  const ConvGeom g = kConvs[0];
  for (Act act : {Act::relu, Act::tanh, Act::sigmoid}) {
    const auto x = rnd(size_t(g.batch) * g.h * g.w * g.c, 61);
    const auto w = rnd(size_t(g.out) * g.cols(), 62), b = rnd(size_t(g.out), 63);
    const auto r = rnd(size_t(g.rows()) * g.out, 64);
    std::vector<float> cols(size_t(g.rows()) * g.cols()), z(r.size()), a(r.size()), za(r.size());
    std::vector<float> dw(w.size()), db(b.size()), dx(x.size()), dw2(w.size()), db2(b.size()), dx2(x.size());
    be->conv_forward(x.data(), w.data(), b.data(), cols.data(), z.data(), a.data(), g, act);
    std::vector<float> d = r;
    be->conv_backward(x.data(), w.data(), z.data(), a.data(), d.data(), cols.data(), g, act, dw.data(), db.data(), dx.data(), false);
    be->conv_forward(x.data(), w.data(), b.data(), cols.data(), za.data(), za.data(), g, act);
    EXPECT_EQ(za, a) << act_name(act);
    d = r;
    be->conv_backward(x.data(), w.data(), za.data(), za.data(), d.data(), cols.data(), g, act, dw2.data(), db2.data(), dx2.data(), false);
    EXPECT_EQ(dw2, dw) << act_name(act);
    EXPECT_EQ(db2, db) << act_name(act);
    EXPECT_EQ(dx2, dx) << act_name(act);
  }
}

// <col2im(d), x> = <d, im2col(x)>: col2im is im2col's adjoint, padding included.
TEST(ConvCpu, Col2imIsTheAdjointOfIm2col) {
  auto be = make_cpu_backend({});
  for (const ConvGeom& g : kConvs) {
    const auto x = rnd(size_t(g.batch) * g.h * g.w * g.c, 4);
    const auto d = rnd(size_t(g.rows()) * g.cols(), 5);
    std::vector<float> cols(d.size()), dx(x.size(), 7.f);  // 7: col2im must overwrite
    be->im2col(x.data(), g, cols.data());
    be->col2im(d.data(), g, dx.data());
    EXPECT_NEAR(dot(dx, x), dot(d, cols), 1e-4 * (1 + std::fabs(dot(d, cols)))) << what(g);
  }
}

TEST(ConvCpu, GradientsMatchFiniteDifferences) {
  auto be = make_cpu_backend({});
  for (Act act : {Act::none, Act::tanh, Act::gelu}) {
    for (const ConvGeom& g : kConvs)
    for (bool columns : {false, true}) {
      auto x = rnd(size_t(g.batch) * g.h * g.w * g.c, 10);
      auto w = rnd(size_t(g.out) * g.cols(), 11, -0.4f, 0.4f);
      auto b = rnd(size_t(g.out), 12, -0.2f, 0.2f);
      const auto r = rnd(size_t(g.rows()) * g.out, 13);
      // oneDNN (no columns), and im2col + the GEMMs (columns given).
      std::vector<float> cols(columns ? size_t(g.rows()) * g.cols() : 0), z(r.size()), a(r.size());
      float* c = cols.empty() ? nullptr : cols.data();
      auto loss = [&] {
        be->conv_forward(x.data(), w.data(), b.data(), c, z.data(), a.data(), g, act);
        return dot(r, a);
      };
      loss();
      std::vector<float> da = r, dw(w.size()), db(b.size()), dx(x.size());
      be->conv_backward(x.data(), w.data(), z.data(), a.data(), da.data(), c, g, act, dw.data(),
                        db.data(), dx.data(), false);
      const std::string label = what(g) + " " + act_name(act) + (columns ? " im2col" : " oneDNN");
      expect_fd(w, dw, loss, "dw " + label);
      expect_fd(b, db, loss, "db " + label);
      expect_fd(x, dx, loss, "dx " + label);
      // accumulate adds to what is there; no dx leaves the columns alone.
      loss();
      std::vector<float> da2 = r, dw2 = dw, db2 = db;
      be->conv_backward(x.data(), w.data(), z.data(), a.data(), da2.data(), c, g, act, dw2.data(),
                        db2.data(), nullptr, true);
      for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw2[i], 2 * dw[i], 1e-5 * (1 + std::fabs(dw[i]))) << label;
      for (size_t i = 0; i < db.size(); ++i) EXPECT_NEAR(db2[i], 2 * db[i], 1e-5 * (1 + std::fabs(db[i]))) << label;
    }
  }
}

namespace {
PoolGeom pgeom(int batch, int c, int h, int w, int k, int stride) {
  PoolGeom g;
  g.batch = batch; g.c = c; g.h = h; g.w = w; g.k = k; g.stride = stride;
  return g;
}
const PoolGeom kPools[] = {pgeom(2, 3, 4, 4, 2, 2), pgeom(1, 2, 7, 5, 3, 2), pgeom(2, 1, 5, 5, 2, 1),
                           pgeom(1, 4, 6, 6, 3, 3)};

// Distinct values 0.01 apart in random order: with h = 1e-3 no perturbation changes a maximum.
std::vector<float> distinct(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.01f * float(i) - 0.005f * float(n);
  SplitMix64 g(seed);
  for (size_t i = n - 1; i > 0; --i) std::swap(v[i], v[g.below(i + 1)]);
  return v;
}
}  // namespace

TEST(PoolCpu, ForwardMatchesTheDefinition) {
  auto be = make_cpu_backend({});
  for (const PoolGeom& g : kPools)
    for (bool max : {true, false}) {
      const auto x = rnd(size_t(g.batch) * g.h * g.w * g.c, 20);
      std::vector<float> y(size_t(g.batch) * g.oh() * g.ow() * g.c);
      std::vector<uint8_t> arg(y.size());
      be->pool_forward(x.data(), y.data(), max ? arg.data() : nullptr, g, max);
      for (int n = 0; n < g.batch; ++n)
        for (int oh = 0; oh < g.oh(); ++oh)
          for (int ow = 0; ow < g.ow(); ++ow)
            for (int c = 0; c < g.c; ++c) {
              double best = -1e30, sum = 0;
              int at = -1;
              for (int j = 0; j < g.k * g.k; ++j) {
                const float v = x[((size_t(n) * g.h + oh * g.stride + j / g.k) * g.w + ow * g.stride + j % g.k) * g.c + c];
                sum += v;
                if (v > best) { best = v; at = j; }
              }
              const size_t o = ((size_t(n) * g.oh() + oh) * g.ow() + ow) * g.c + c;
              EXPECT_NEAR(y[o], max ? best : sum / (g.k * g.k), 1e-6);
              if (max) EXPECT_EQ(arg[o], at);
            }
    }
}

TEST(PoolCpu, GradientsMatchFiniteDifferences) {
  auto be = make_cpu_backend({});
  for (const PoolGeom& g : kPools)
    for (bool max : {true, false}) {
      auto x = distinct(size_t(g.batch) * g.h * g.w * g.c, 21);
      const auto r = rnd(size_t(g.batch) * g.oh() * g.ow() * g.c, 22);
      std::vector<float> y(r.size()), dx(x.size(), 9.f);
      std::vector<uint8_t> arg(r.size());
      auto loss = [&] {
        be->pool_forward(x.data(), y.data(), max ? arg.data() : nullptr, g, max);
        return dot(r, y);
      };
      loss();
      be->pool_backward(r.data(), max ? arg.data() : nullptr, dx.data(), g, max);
      // h = 1e-2 would cross the 0.01 gaps; the loss is piecewise linear, so a small h is exact.
      const float h = 1e-3f;
      for (size_t i = 0; i < x.size(); ++i) {
        const float keep = x[i];
        x[i] = keep + h;
        const double up = loss();
        x[i] = keep - h;
        const double down = loss();
        x[i] = keep;
        EXPECT_NEAR(dx[i], (up - down) / (2 * h), 2e-3) << (max ? "max " : "avg ") << i;
      }
    }
}

// Ties go to the first maximum in row-major order (PyTorch's rule), and a NaN wins.
TEST(PoolCpu, MaxTiesGoToTheFirstAndNanWins) {
  auto be = make_cpu_backend({});
  const PoolGeom g = pgeom(1, 1, 2, 2, 2, 2);
  std::vector<float> x{1.f, 3.f, 3.f, 2.f}, y(1), dx(4);
  std::vector<uint8_t> arg(1);
  be->pool_forward(x.data(), y.data(), arg.data(), g, true);
  EXPECT_EQ(arg[0], 1);
  const std::vector<float> dy{5.f};
  be->pool_backward(dy.data(), arg.data(), dx.data(), g, true);
  EXPECT_EQ(dx, (std::vector<float>{0.f, 5.f, 0.f, 0.f}));
  x = {1.f, NAN, 3.f, 2.f};
  be->pool_forward(x.data(), y.data(), arg.data(), g, true);
  EXPECT_EQ(arg[0], 1);
  EXPECT_TRUE(std::isnan(y[0]));
}

TEST(ActCpu, GradientsMatchFiniteDifferences) {
  auto be = make_cpu_backend({});
  for (Act act : {Act::relu, Act::tanh, Act::sigmoid, Act::gelu}) {
    auto z = rnd(37, 30, -2.f, 2.f);
    for (auto& v : z)
      if (std::fabs(v) < 0.05f) v += 0.1f;  // keep relu's kink away from the differences
    const auto r = rnd(z.size(), 31);
    std::vector<float> a(z.size());
    auto loss = [&] {
      be->act_forward(z.data(), a.data(), z.size(), act);
      return dot(r, a);
    };
    loss();
    std::vector<float> d = r;
    be->act_backward(d.data(), z.data(), a.data(), z.size(), act);
    expect_fd(z, d, loss, act_name(act));
    loss();  // a of the unperturbed z
    std::vector<float> in_place = z;
    be->act_forward(in_place.data(), in_place.data(), z.size(), act);
    EXPECT_EQ(in_place, a) << act_name(act);
  }
}

TEST(LayoutCpu, TransposesAreEachOthersInverse) {
  auto be = make_cpu_backend({});
  const int batch = 3, c = 5, hw = 7;
  const auto x = rnd(size_t(batch) * c * hw, 40);
  std::vector<float> t(x.size()), back(x.size());
  be->nhwc_to_nchw(x.data(), t.data(), batch, c, hw);
  for (int n = 0; n < batch; ++n)
    for (int p = 0; p < hw; ++p)
      for (int ch = 0; ch < c; ++ch)
        ASSERT_EQ(t[(size_t(n) * c + ch) * hw + p], x[(size_t(n) * hw + p) * c + ch]);
  be->nchw_to_nhwc(t.data(), back.data(), batch, c, hw);
  EXPECT_EQ(back, x);
}

namespace {
std::vector<float> run_dropout(Backend& be, const std::vector<float>& x, int batch, DropoutArgs d,
                               int64_t step) {
  StepCtl ctl;
  ctl.step = step;
  std::vector<float> y(x.size());
  be.dropout(x.data(), y.data(), batch, d, &ctl);
  return y;
}
}  // namespace

TEST(DropoutCpu, MaskIsAPureFunctionOfSeedLayerStepAndPosition) {
  auto be = make_cpu_backend({});
  DropoutArgs d;
  d.p = 0.3;
  d.seed = 5;
  d.layer = 4;
  d.c = 500;
  const int batch = 8;
  const auto x = rnd(size_t(batch) * d.c, 50, 0.5f, 1.5f);  // no zeros: a zero out is a drop
  const auto y = run_dropout(*be, x, batch, d, 17);
  const float scale = float(1.0 / (1.0 - d.p));
  size_t dropped = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (y[i] == 0.f) ++dropped;
    else EXPECT_EQ(y[i], x[i] * scale);
  }
  // 4000 Bernoulli(0.3) draws: mean 1200, sd 29.
  EXPECT_NEAR(double(dropped), 1200.0, 150.0);
  // The same samples split into two micro-batches at their global positions: the same mask.
  DropoutArgs second = d;
  second.first = 5;
  const std::vector<float> x0(x.begin(), x.begin() + 5 * d.c), x1(x.begin() + 5 * d.c, x.end());
  auto y0 = run_dropout(*be, x0, 5, d, 17), y1 = run_dropout(*be, x1, 3, second, 17);
  y0.insert(y0.end(), y1.begin(), y1.end());
  EXPECT_EQ(y0, y);
  // Another step, layer or seed: another mask.
  EXPECT_NE(run_dropout(*be, x, batch, d, 18), y);
  DropoutArgs other = d;
  other.layer = 5;
  EXPECT_NE(run_dropout(*be, x, batch, other, 17), y);
  other = d;
  other.seed = 6;
  EXPECT_NE(run_dropout(*be, x, batch, other, 17), y);
  // Backward is the same op: dropout is linear, so <dropout(r), x> = <r, dropout(x)>.
  const auto r = rnd(x.size(), 51);
  EXPECT_NEAR(dot(run_dropout(*be, r, batch, d, 17), x), dot(r, y), 1e-3);
  // p = 0 keeps everything unscaled.
  d.p = 0;
  EXPECT_EQ(run_dropout(*be, x, batch, d, 17), x);
}

// The mask's element is the NCHW index: dropout on an NHWC image then flatten's transpose equals
// the transpose then dropout of the flat features.
TEST(DropoutCpu, ImageMaskFollowsNchwOrder) {
  auto be = make_cpu_backend({});
  const int batch = 2, c = 3, h = 4, w = 5;
  const auto x = rnd(size_t(batch) * c * h * w, 52);
  DropoutArgs img;
  img.p = 0.5;
  img.seed = 9;
  img.c = c;
  img.h = h;
  img.w = w;
  DropoutArgs flat = img;
  flat.c = c * h * w;
  flat.h = flat.w = 1;
  std::vector<float> a(x.size()), b(x.size());
  be->nhwc_to_nchw(run_dropout(*be, x, batch, img, 3).data(), a.data(), batch, c, h * w);
  std::vector<float> t(x.size());
  be->nhwc_to_nchw(x.data(), t.data(), batch, c, h * w);
  b = run_dropout(*be, t, batch, flat, 3);
  EXPECT_EQ(a, b);
}

TEST(AugmentCpu, CropAndFlipByHand) {
  auto be = make_cpu_backend({});
  // One 1x2x3 image: rows [1 2 3], [4 5 6].
  const std::vector<float> x{1, 2, 3, 4, 5, 6};
  const int pad = 1;
  std::vector<int32_t> draws{pack_draw(false, 1, 1), pack_draw(true, 1, 1), pack_draw(false, 0, 2),
                             pack_draw(true, 2, 0)};
  const std::vector<std::vector<float>> want{
      {1, 2, 3, 4, 5, 6},  // the image itself
      {3, 2, 1, 6, 5, 4},  // flipped
      {0, 0, 0, 2, 3, 0},  // window one row up, one column right
      // Window one row down, one column left: rows [0 4 5], [0 0 0]; flipped: [5 4 0], [0 0 0].
      {5, 4, 0, 0, 0, 0},
  };
  for (size_t i = 0; i < draws.size(); ++i) {
    std::vector<float> y(x.size(), -1.f);
    StepCtl ctl;
    ctl.cursor = int64_t(i);
    be->augment(x.data(), y.data(), 1, 1, 2, 3, pad, draws.data(), &ctl, 0);
    std::vector<float> ref(x.size());
    augment_image(x.data(), ref.data(), 1, 2, 3, pad, draws[i]);
    EXPECT_EQ(y, ref) << "draw " << i;
    EXPECT_EQ(y, want[i]) << "draw " << i;
  }
}

TEST(AugmentCpu, DrawsArePureFunctionsOfSeedEpochAndRow) {
  const AugmentSpec s = parse_augment("crop,flip", 4);
  EXPECT_TRUE(s.crop && s.flip);
  EXPECT_EQ(s.pad, 4);
  const std::vector<int64_t> rows{5, 9, 2, 7, 5};
  const auto d = augment_draws(s, 3, 1, rows);
  EXPECT_EQ(d[0], d[4]);  // row 5 twice: the same draw
  EXPECT_EQ(d[1], augment_draw(s, 3, 1, 9));
  int flips = 0, max_dy = 0, min_dy = 99;
  for (int64_t r = 0; r < 2000; ++r) {
    const int32_t x = augment_draw(s, 3, 1, r);
    flips += draw_flip(x);
    max_dy = std::max(max_dy, draw_dy(x));
    min_dy = std::min(min_dy, draw_dy(x));
    EXPECT_LE(draw_dx(x), 8);
  }
  EXPECT_NEAR(flips, 1000, 120);
  EXPECT_EQ(min_dy, 0);
  EXPECT_EQ(max_dy, 8);
  EXPECT_NE(augment_draws(s, 3, 2, rows), d);  // another epoch
  EXPECT_NE(augment_draws(s, 4, 1, rows), d);  // another seed
  const AugmentSpec f = parse_augment("flip", 4);
  for (int64_t r = 0; r < 50; ++r) {
    const int32_t x = augment_draw(f, 3, 1, r);
    EXPECT_EQ(draw_dy(x), 4);  // no crop: the window is the image
    EXPECT_EQ(draw_dx(x), 4);
  }
  EXPECT_THROW(parse_augment("flip,crop", 4), InputError);
}
