// Single-rank tests of config, the CPU backend's layers (against finite differences), the
// optimizers (against steps computed by hand in double) and the LR rules.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "dpt/backend.hpp"
#include "dpt/check.hpp"
#include "dpt/config.hpp"
#include "dpt/nn.hpp"
#include "dpt/optim.hpp"

using namespace dpt;

namespace {

Invocation parse(const std::string& ini, std::vector<std::string> args = {}) {
  std::vector<const char*> argv{"dptrain"};
  for (auto& a : args) argv.push_back(a.c_str());
  return parse_invocation(int(argv.size()), argv.data(), "test.ini", ini);
}

std::string error_of(const std::string& ini, std::vector<std::string> args = {}) {
  try {
    parse(ini, args);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

const char* kMinimal = "[data]\ntrain = x.h5\n";

}  // namespace

TEST(Config, ReadsIniAndCommandLineWins) {
  auto inv = parse("[data]\ntrain = a.h5\n[train]\nlr = 0.5\nbatch_per_rank = 7\n[model]\nlayers = 4,3,2\n",
                   {"--train.lr", "0.25"});
  EXPECT_DOUBLE_EQ(inv.cfg.lr, 0.25);
  EXPECT_EQ(inv.cfg.batch_per_rank, 7);
  EXPECT_EQ(inv.cfg.layers, (std::vector<int>{4, 3, 2}));
  EXPECT_NE(inv.cfg.resolved.find("lr = 0.25"), std::string::npos);
  EXPECT_NE(inv.cfg.resolved.find("[train]"), std::string::npos);
}

TEST(Config, ResolvedTextParsesBackToTheSameConfig) {
  auto a = parse(std::string(kMinimal) + "[train]\noptimizer = adamw\nweight_decay = 0.01\n").cfg;
  auto b = parse(a.resolved).cfg;
  EXPECT_EQ(a.resolved, b.resolved);
}

TEST(Config, ErrorsNameKeyValueAndFile) {
  std::string e = error_of(std::string(kMinimal) + "[train]\nlr = fast\n");
  EXPECT_NE(e.find("test.ini"), std::string::npos) << e;
  EXPECT_NE(e.find("lr"), std::string::npos) << e;
  EXPECT_NE(e.find("fast"), std::string::npos) << e;

  e = error_of(std::string(kMinimal) + "[train]\nlearning_rate = 0.1\n");
  EXPECT_NE(e.find("learning_rate"), std::string::npos) << e;
  EXPECT_NE(e.find("test.ini"), std::string::npos) << e;

  e = error_of(std::string(kMinimal) + "[train]\noptimizer = lion\n");
  EXPECT_NE(e.find("train.optimizer = 'lion'"), std::string::npos) << e;
  EXPECT_NE(e.find("adamw"), std::string::npos) << e;
  EXPECT_NE(e.find("lamb"), std::string::npos) << e;

  e = error_of(std::string(kMinimal) + "[train]\noptimizer = lars\ntrust_coefficient = -0.1\n");
  EXPECT_NE(e.find("train.trust_coefficient = '-0.1'"), std::string::npos) << e;
  EXPECT_NE(e.find("test.ini"), std::string::npos) << e;
  e = error_of(kMinimal, {"--train.trust_clip", "inf"});
  EXPECT_NE(e.find("train.trust_clip"), std::string::npos) << e;

  e = error_of(std::string(kMinimal) + "[train]\nlr = 0.1\nlr = 0.2\n");
  EXPECT_NE(e.find("lr"), std::string::npos) << e;

  e = error_of(std::string(kMinimal) + "[model]\nlayers = 784,,10\n");
  EXPECT_NE(e.find("model.layers"), std::string::npos) << e;

  e = error_of(std::string(kMinimal) + "[train]\nbatch_per_rank = 0\n");
  EXPECT_NE(e.find("train.batch_per_rank = '0'"), std::string::npos) << e;

  e = error_of(std::string(kMinimal) + "[train]\nlr = nan\n");
  EXPECT_NE(e.find("train.lr"), std::string::npos) << e;

  e = error_of(std::string(kMinimal) + "garbage line without equals\n");
  EXPECT_NE(e.find("test.ini"), std::string::npos) << e;

  e = error_of(kMinimal, {"--train.epochs", "-3"});
  EXPECT_NE(e.find("train.epochs"), std::string::npos) << e;

  e = error_of(kMinimal, {"--no-such-flag"});
  EXPECT_NE(e.find("no-such-flag"), std::string::npos) << e;

  e = error_of("[train]\nlr = 0.1\n");
  EXPECT_NE(e.find("data.train"), std::string::npos) << e;

  e = error_of(std::string(kMinimal) + "[train]\nsync = parameters\naverage_every = 4\n[checkpoint]\nevery_steps = 6\n");
  EXPECT_NE(e.find("average_every"), std::string::npos) << e;

  e = error_of(std::string(kMinimal) + "[train]\nepochs = 99999999999999999999\n");
  EXPECT_NE(e.find("epochs"), std::string::npos) << e;
}

TEST(Config, LayersParse) {
  EXPECT_EQ(parse_layers("784, 256,10"), (std::vector<int>{784, 256, 10}));
  EXPECT_THROW(parse_layers("784"), InputError);
  EXPECT_THROW(parse_layers("784,x"), InputError);
  EXPECT_THROW(parse_layers("784,-5,10"), InputError);
  EXPECT_THROW(parse_layers("784,99999999999,10"), InputError);
}

// ---- layers against central finite differences ----------------------------------------------

namespace {

// Loss of the whole MLP on (x, y), in double from the float logits.
double mlp_loss(Backend& be, MLP& m, const std::vector<float>& x, const std::vector<int32_t>& y, int batch) {
  m.forward(x.data(), batch);
  float stats[2] = {0, 0};
  m.loss(y.data(), batch, 1.f / float(batch), stats, false);
  (void)be;
  return double(stats[0]) / batch;
}

void check_gradients(Act act) {
  auto be = make_cpu_backend({});
  const int batch = 5;
  MLP m(*be, {6, 7, 4}, act, batch);
  m.init_params(42);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(batch) * 6);
  for (auto& v : x) v = nd(rng);
  std::vector<int32_t> y{0, 3, 1, 2, 3};
  m.forward(x.data(), batch);
  float stats[2] = {0, 0};
  m.loss(y.data(), batch, 1.f / batch, stats, true);
  m.backward(x.data(), batch, false);
  std::vector<float> analytic(m.grads(), m.grads() + m.num_params());
  // Central differences in float32: h = 1e-2 keeps truncation error O(h²) ≈ 1e-4 and the
  // rounding error of the loss (≈1e-7 / h) small; 2e-3 absolute + 2% relative covers both.
  const float h = 1e-2f;
  for (size_t i = 0; i < m.num_params(); ++i) {
    float* p = m.params() + i;
    const float keep = *p;
    *p = keep + h;
    const double up = mlp_loss(*be, m, x, y, batch);
    *p = keep - h;
    const double down = mlp_loss(*be, m, x, y, batch);
    *p = keep;
    const double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(analytic[i], numeric, 2e-3 + 0.02 * std::fabs(numeric))
        << act_name(act) << " parameter " << i;
  }
}

}  // namespace

TEST(Layers, GradientsMatchFiniteDifferencesRelu) { check_gradients(Act::relu); }
TEST(Layers, GradientsMatchFiniteDifferencesTanh) { check_gradients(Act::tanh); }
TEST(Layers, GradientsMatchFiniteDifferencesSigmoid) { check_gradients(Act::sigmoid); }
TEST(Layers, GradientsMatchFiniteDifferencesGelu) { check_gradients(Act::gelu); }

TEST(Layers, AccumulateAddsGradients) {
  auto be = make_cpu_backend({});
  MLP m(*be, {3, 4, 2}, Act::tanh, 4);
  m.init_params(1);
  std::vector<float> x{0.1f, -0.2f, 0.3f, 1.f, 0.5f, -1.f, 0.2f, 0.2f, 0.2f, -0.4f, 0.8f, 0.f};
  std::vector<int32_t> y{0, 1, 1, 0};
  float st[2] = {0, 0};
  m.forward(x.data(), 4);
  m.loss(y.data(), 4, 0.25f, st, true);
  m.backward(x.data(), 4, false);
  std::vector<float> once(m.grads(), m.grads() + m.num_params());
  m.forward(x.data(), 4);
  m.loss(y.data(), 4, 0.25f, st, true);
  m.backward(x.data(), 4, true);
  for (size_t i = 0; i < once.size(); ++i) EXPECT_FLOAT_EQ(m.grads()[i], 2 * once[i]);
}

TEST(Loss, SoftmaxCrossEntropyAndAccuracy) {
  auto be = make_cpu_backend({});
  std::vector<float> logits{1.f, 2.f, 3.f, 5.f, 0.f, -1.f};
  std::vector<int32_t> y{2, 1};
  std::vector<float> d(6);
  float st[2] = {0, 0};
  be->softmax_xent(logits.data(), y.data(), 2, 3, 0.5f, d.data(), st);
  const double z0 = std::exp(1.) + std::exp(2.) + std::exp(3.);
  const double z1 = std::exp(5.) + std::exp(0.) + std::exp(-1.);
  EXPECT_NEAR(st[0], -std::log(std::exp(3.) / z0) - std::log(std::exp(0.) / z1), 1e-5);
  EXPECT_EQ(st[1], 1.f);  // row 0 right (argmax 2), row 1 wrong (argmax 0)
  EXPECT_NEAR(d[2], 0.5 * (std::exp(3.) / z0 - 1), 1e-6);
  EXPECT_NEAR(d[3], 0.5 * (std::exp(5.) / z1), 1e-6);
}

// ---- optimizers against hand-computed steps (double) -----------------------------------------

namespace {

struct Ref {
  std::vector<double> p, s1, s2;
};

// torch.optim's formulas written out in double, one parameter vector.
void ref_step(const std::string& kind, Ref& r, const std::vector<double>& g, double lr, double mom,
              double wd, int t) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  for (size_t i = 0; i < r.p.size(); ++i) {
    double gi = g[i];
    if (kind == "adamw") r.p[i] *= 1 - lr * wd;
    else gi += wd * r.p[i];
    if (kind == "sgd") {
      r.p[i] -= lr * gi;
    } else if (kind == "momentum" || kind == "nesterov") {
      r.s1[i] = t == 1 ? gi : mom * r.s1[i] + gi;
      r.p[i] -= lr * (kind == "nesterov" ? gi + mom * r.s1[i] : r.s1[i]);
    } else {
      r.s1[i] = b1 * r.s1[i] + (1 - b1) * gi;
      r.s2[i] = b2 * r.s2[i] + (1 - b2) * gi * gi;
      const double mhat = r.s1[i] / (1 - std::pow(b1, t));
      const double vhat = r.s2[i] / (1 - std::pow(b2, t));
      r.p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
}

void check_optimizer(const std::string& kind, double wd) {
  auto be = make_cpu_backend({});
  Config c;
  c.optimizer = kind;
  c.momentum = 0.8;
  c.weight_decay = wd;
  const size_t n = 7;
  Optimizer opt(*be, c, n);
  std::vector<float> p{0.5f, -1.f, 2.f, 0.f, 0.25f, -0.75f, 1.5f};
  Ref r{std::vector<double>(p.begin(), p.end()), std::vector<double>(n), std::vector<double>(n)};
  for (int t = 1; t <= 4; ++t) {
    std::vector<float> g(n);
    std::vector<double> gd(n);
    for (size_t i = 0; i < n; ++i) gd[i] = g[i] = float(std::sin(double(i + 1) * t) * 0.5);
    const double lr = 0.1 / t;
    opt.step(p.data(), g.data(), lr);
    ref_step(kind, r, gd, lr, c.momentum, wd, t);
    // float32 arithmetic against double: a few ulps of values of order 1 per step.
    for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], r.p[i], 2e-6) << kind << " step " << t << " i " << i;
  }
  EXPECT_EQ(opt.steps_taken(), 4);
}

}  // namespace

TEST(Optim, Sgd) { check_optimizer("sgd", 0.0); }
TEST(Optim, SgdWeightDecay) { check_optimizer("sgd", 0.05); }
TEST(Optim, Momentum) { check_optimizer("momentum", 0.01); }
TEST(Optim, Nesterov) { check_optimizer("nesterov", 0.0); }
TEST(Optim, Adam) { check_optimizer("adam", 0.0); }
TEST(Optim, AdamWeightDecay) { check_optimizer("adam", 0.1); }
TEST(Optim, AdamW) { check_optimizer("adamw", 0.1); }

// ---- LARS and LAMB against their formulas written out in double (README) ----------------------

namespace {

// Two tensors: a weight (4 elements, adapting) and a bias (3, neither trust ratio nor decay).
const std::vector<TensorSeg> kTwoTensors = {{0, 4, true}, {4, 7, false}};

void ref_layerwise(const std::string& kind, Ref& r, const std::vector<double>& g, double lr,
                   double mom, double wd, double eta, double clip, int t) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  for (const TensorSeg& seg : kTwoTensors) {
    const double lam = seg.adapt ? wd : 0.0;
    std::vector<double> d(seg.end - seg.begin);
    double wn = 0, dn = 0;
    for (size_t i = seg.begin; i < seg.end; ++i) {
      double di = g[i];
      if (kind == "lamb") {
        r.s1[i] = b1 * r.s1[i] + (1 - b1) * g[i];
        r.s2[i] = b2 * r.s2[i] + (1 - b2) * g[i] * g[i];
        di = r.s1[i] / (1 - std::pow(b1, t)) / (std::sqrt(r.s2[i] / (1 - std::pow(b2, t))) + eps) + lam * r.p[i];
      }
      d[i - seg.begin] = di;
      wn += r.p[i] * r.p[i];
      dn += di * di;
    }
    wn = std::sqrt(wn), dn = std::sqrt(dn);
    double ratio = 1;
    if (seg.adapt && wn > 0 && dn > 0) ratio = eta * wn / (kind == "lars" ? dn + lam * wn : dn);
    if (seg.adapt && clip > 0) ratio = std::min(ratio, clip);
    for (size_t i = seg.begin; i < seg.end; ++i) {
      if (kind == "lars") {
        r.s1[i] = mom * r.s1[i] + ratio * (g[i] + lam * r.p[i]);
        r.p[i] -= lr * r.s1[i];
      } else {
        r.p[i] -= lr * ratio * d[i - seg.begin];
      }
    }
  }
}

void check_layerwise(const std::string& kind, double wd, double eta, double clip) {
  auto be = make_cpu_backend({});
  Config c;
  c.optimizer = kind;
  c.momentum = 0.8;
  c.weight_decay = wd;
  c.trust_coefficient = eta;
  c.trust_clip = clip;
  const size_t n = 7;
  Optimizer opt(*be, c, n, kTwoTensors);
  std::vector<float> p{0.5f, -1.f, 2.f, 0.f, 0.25f, -0.75f, 1.5f};
  Ref r{std::vector<double>(p.begin(), p.end()), std::vector<double>(n), std::vector<double>(n)};
  const double coeff = trust_coefficient(c);
  for (int t = 1; t <= 4; ++t) {
    std::vector<float> g(n);
    std::vector<double> gd(n);
    for (size_t i = 0; i < n; ++i) gd[i] = g[i] = float(std::sin(double(i + 1) * t) * 0.5);
    const double lr = (kind == "lars" ? 20.0 : 0.1) / t;
    opt.step(p.data(), g.data(), lr);
    ref_layerwise(kind, r, gd, lr, c.momentum, wd, coeff, clip, t);
    for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], r.p[i], 4e-6) << kind << " step " << t << " i " << i;
  }
}

}  // namespace

TEST(Optim, Lars) { check_layerwise("lars", 0.0, 0.0, 0.0); }
TEST(Optim, LarsWeightDecayAndClip) { check_layerwise("lars", 0.05, 0.02, 0.03); }  // r ≈ 0.04 clipped
TEST(Optim, Lamb) { check_layerwise("lamb", 0.0, 0.0, 0.0); }
TEST(Optim, LambWeightDecayAndClip) { check_layerwise("lamb", 0.1, 0.5, 0.3); }

TEST(Optim, LayerwiseDefaultsAndStateNames) {
  Config c;
  c.optimizer = "lars";
  EXPECT_DOUBLE_EQ(trust_coefficient(c), 0.001);
  c.optimizer = "lamb";
  EXPECT_DOUBLE_EQ(trust_coefficient(c), 1.0);
  c.trust_coefficient = 0.02;
  EXPECT_DOUBLE_EQ(trust_coefficient(c), 0.02);
  auto be = make_cpu_backend({});
  Optimizer lamb(*be, c, 3);
  ASSERT_EQ(lamb.state().size(), 2u);
  EXPECT_EQ(lamb.state()[0].name, "exp_avg");
  EXPECT_EQ(lamb.state()[1].name, "exp_avg_sq");
  c.optimizer = "lars";
  Optimizer lars(*be, c, 3);
  ASSERT_EQ(lars.state().size(), 1u);
  EXPECT_EQ(lars.state()[0].name, "momentum_buffer");
  // The model's tensors: each weight (adapting), then its bias.
  MLP m(*be, {3, 4, 2}, Act::relu, 1);
  const auto t = param_tensors(m.layers());
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0].begin, 0u);
  EXPECT_EQ(t[0].end, 12u);
  EXPECT_TRUE(t[0].adapt);
  EXPECT_EQ(t[1].begin, 12u);
  EXPECT_EQ(t[1].end, 16u);
  EXPECT_FALSE(t[1].adapt);
  EXPECT_EQ(t[3].end, m.num_params());
}

// What a sharded or bucketed caller does: the sums pass over two ranges that cut a tensor, the
// sums added, then the update of each range, equals one pass over the whole arena (to the
// rounding of adding two partial sums).
TEST(Optim, LayerwiseRangesAddUpToTheWholeArena) {
  auto be = make_cpu_backend({});
  for (const char* kind : {"lars", "lamb"}) {
    Config c;
    c.optimizer = kind;
    c.weight_decay = 0.01;
    const std::vector<TensorSeg> segs = {{0, 40, true}, {40, 45, false}, {45, 85, true}, {85, 89, false}};
    const size_t n = 89, cut = 60;  // inside the second weight
    Optimizer whole(*be, c, n, segs), parts(*be, c, n, segs);
    std::vector<float> p(n), g(n);
    for (size_t i = 0; i < n; ++i) p[i] = float(std::cos(0.3 * double(i))), g[i] = float(std::sin(0.7 * double(i)) * 0.1);
    std::vector<float> q = p;
    const float lr_table[1] = {0.05f};
    for (int t = 0; t < 3; ++t) {
      whole.step(p.data(), g.data(), 0.05);
      StepCtl ctl;  // the loop's path: lr and t read from the step control
      ctl.updates = t;
      parts.clear_layer_sums();
      parts.layer_sums_at(q.data(), g.data(), 0, 0, cut, lr_table, &ctl);
      const std::vector<float> first(parts.layer_sums(), parts.layer_sums() + 2 * segs.size());
      EXPECT_EQ(first[6], 0.f) << "the last tensor lies outside [0, cut)";
      parts.layer_sums_at(q.data() + cut, g.data() + cut, cut, cut, n - cut, lr_table, &ctl);  // adds
      EXPECT_EQ(parts.layer_sums()[0], first[0]) << "the first tensor lies outside [cut, n)";
      parts.layer_apply_at(q.data(), g.data(), 0, 0, cut, lr_table, &ctl);
      parts.layer_apply_at(q.data() + cut, g.data() + cut, cut, cut, n - cut, lr_table, &ctl);
    }
    // A step whose gradients were non-finite does nothing.
    StepCtl bad;
    bad.bad = 1;
    const std::vector<float> before = q;
    parts.layer_sums_at(q.data(), g.data(), 0, 0, n, lr_table, &bad);
    parts.layer_apply_at(q.data(), g.data(), 0, 0, n, lr_table, &bad);
    EXPECT_EQ(q, before) << kind;
    for (size_t i = 0; i < n; ++i) EXPECT_NEAR(q[i], p[i], 1e-6) << kind << " i " << i;
  }
}

// Adam's per-step scalars as torch.optim forms them: in double from the betas as given (Python
// floats), rounded to float once. In float from float(0.999), 1 - beta2 is off by 1.3e-5.
TEST(Optim, AdamScalarsAreFormedInDoubleAsTorchDoes) {
  const dpt::AdamScalars a = dpt::adam_scalars(0.01, 0.9, 0.999, 3);
  EXPECT_EQ(a.one_minus_b1, float(1.0 - 0.9));
  EXPECT_EQ(a.one_minus_b2, float(1.0 - 0.999));
  EXPECT_NE(a.one_minus_b2, 1.f - 0.999f);
  EXPECT_EQ(a.step_size, float(0.01 / (1.0 - 0.9 * 0.9 * 0.9)));
  EXPECT_EQ(a.bc2_sqrt, float(std::sqrt(1.0 - 0.999 * 0.999 * 0.999)));
}

TEST(Optim, StateNamesFollowTorch) {
  auto be = make_cpu_backend({});
  Config c;
  c.optimizer = "adamw";
  Optimizer a(*be, c, 3);
  ASSERT_EQ(a.state().size(), 2u);
  EXPECT_EQ(a.state()[0].name, "exp_avg");
  EXPECT_EQ(a.state()[1].name, "exp_avg_sq");
  c.optimizer = "nesterov";
  Optimizer m(*be, c, 3);
  ASSERT_EQ(m.state().size(), 1u);
  EXPECT_EQ(m.state()[0].name, "momentum_buffer");
}

TEST(Schedule, ScalingWarmupAndDecay) {
  Config c;
  c.lr = 0.1;
  c.batch_per_rank = 32;
  c.base_batch = 32;
  c.lr_scaling = "linear";
  c.warmup_steps = 10;
  LrSchedule lin(c, 4, 100, 1000);  // global 128: scale 4
  EXPECT_DOUBLE_EQ(lin.scale(), 4.0);
  EXPECT_NEAR(lin.at(10), 0.4, 1e-12);
  EXPECT_NEAR(lin.at(5), 0.1 + 0.3 * 0.5, 1e-12);  // ramps from the unscaled lr
  EXPECT_NEAR(lin.at(500), 0.4, 1e-12);
  c.lr_scaling = "sqrt";
  LrSchedule sq(c, 4, 100, 1000);
  EXPECT_NEAR(sq.at(11), 0.2, 1e-12);
  c.lr_scaling = "none";
  c.warmup_steps = 4;
  LrSchedule none(c, 4, 100, 1000);
  EXPECT_NEAR(none.at(1), 0.025, 1e-12);  // from 0 when there is no scaling
  c.warmup_steps = 0;
  c.schedule = "step";
  c.step_every = 10;
  c.step_gamma = 0.5;
  LrSchedule st(c, 1, 100, 1000);
  EXPECT_NEAR(st.at(10), 0.1, 1e-12);
  EXPECT_NEAR(st.at(11), 0.05, 1e-12);
  c.schedule = "cosine";
  c.min_lr = 0.0;
  LrSchedule cs(c, 1, 100, 101);
  EXPECT_NEAR(cs.at(1), 0.1, 1e-12);
  EXPECT_NEAR(cs.at(51), 0.05, 1e-12);
  EXPECT_NEAR(cs.at(101), 0.0, 1e-12);
}
