// Convolutional layer lists trained on the GPU against the CPU backend: the same config (conv,
// pooling, dropout on images, a run of Linear layers after flatten, random crops and flips) on `cuda` and on `cpu`. fp32: the same loss curve and final parameters; TF32 and
// bf16: the first step's loss (same initial weights, no update yet) within the precision's
// forward error, the rest of the curve close. Residual networks with batch norm: the same against
// the CPU (with LARS and LAMB too), and a resume from a checkpoint continues bitwise. Skips where
// no GPU is visible.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dpt/app.hpp"
#include "dpt/backend.hpp"
#include "dpt/ckpt_folder.hpp"
#include "dpt/comm.hpp"
#include "dpt/data.hpp"
#include "dpt/train.hpp"
#include "gpu_util.hpp"
#include "parallel_util.hpp"
#ifdef DPT_HAVE_CUDA
#include "dpt/cuda_backend.hpp"
#endif

using namespace dpt;

namespace {

struct Outcome {
  std::vector<double> losses;
  std::vector<float> params;
  bool graph = false;
  int fused = -1;  // hidden Linear layers the CUDA backend ran fused in bf16 (-1: not cuda)
  EvalResult eval;
  std::vector<float> stats;      // every bn layer's running mean then var, averaged over the ranks
  std::vector<int64_t> tracked;  // every bn layer's num_batches_tracked
};

// After flatten, a run of Linear layers ending in the logits: in bf16 its two hidden ReLU
// layers take the fused path, and the run's input gradient flows back into the convolutions.
Dataset rows_of(const Dataset& d, int64_t first, int64_t n) {
  Dataset r = d;
  r.n = n;
  r.f32.assign(d.f32.begin() + first * d.dim, d.f32.begin() + (first + n) * d.dim);
  r.labels.assign(d.labels.begin() + first, d.labels.begin() + first + n);
  return r;
}

const char* kList =
    "conv(8,3,pad=1) relu maxpool(2) dropout(0.1) conv(16,3,pad=1) gelu avgpool(2) dropout(0.2) "
    "flatten linear(64) relu linear(32) relu linear(6)";

// A small residual network: batch norm after every conv, an identity block, a projection block
// with stride 2, the ResNet stem's padded max pool, global average pooling.
// "Within 3 points" of test accuracy, the boundary included: on the 300-sample test set 3 points
// are 9 samples, and 0.8333 - 0.8033 is 0.030000000000000027 in doubles.
constexpr double kThreePoints = 0.03 + 1e-9;
// The residual network's TF32 and bf16 runs end 0.7 to 3.3 points above the CPU's fp32 run on the
// H200 (one and two ranks, 2026-12-01 to 12-03): 2 to 10 of the 300 test samples, as batch norm
// at 32 samples turns roundings into another trajectory. 5 points (15 samples) leave room for
// that; a wrong gradient or layout ends near chance (1 in 6), far outside.
constexpr double kFivePoints = 0.05 + 1e-9;

const char* kResList =
    "conv(8,3,pad=1,bias=false) bn relu res(conv(8,3,pad=1,bias=false) bn relu conv(8,3,pad=1,bias=false) bn) relu "
    "res(conv(16,3,stride=2,pad=1,bias=false) bn relu conv(16,3,pad=1,bias=false) bn | conv(16,1,stride=2,bias=false) bn) "
    "relu maxpool(3,stride=2,pad=1) avgpool(global) flatten linear(6)";

Config config(const std::string& device, const std::string& transport, const std::string& precision,
              const char* list = kList) {
  Config c;
  c.layers.clear();
  c.layer_list = list;
  c.augment = "crop,flip";
  c.crop_padding = 1;
  c.train_file = "(memory)";
  c.epochs = 2;
  c.batch_per_rank = 32;
  c.optimizer = "nesterov";
  c.lr = 0.05;
  c.momentum = 0.9;
  c.weight_decay = 0.0005;
  c.schedule = "cosine";
  c.seed = 11;
  c.log_every = 1;
  c.progress = false;
  c.resume = "none";
  c.device_type = device;
  c.comm_backend = transport;
  c.precision = precision;
  c.threads = 1;
  c.conv_tuning = "heuristic";  // the same cuDNN algorithms on every run (RunsRepeatBitwise)
  return c;
}

// Three-channel 8x8 images of 6 classes whose class is in each channel's mean over the image
// (so crops and flips keep it) plus per-pixel noise: 1024 to train, 300 to test, one draw.
// The model's input goes NCHW -> NHWC (three channels).
const Dataset& images(bool test) {
  static const Dataset all = [] {
    const Dataset means = synth_blobs(1324, 3, 6, 0.3f, 5);  // per image: 3 channel means
    Dataset d;
    d.path = "synth:images";
    d.n = means.n;
    d.dim = 3 * 8 * 8;
    d.sample_shape = {3, 8, 8};
    d.num_classes = 6;
    d.is_u8 = false;
    d.labels = means.labels;
    d.f32.resize(size_t(d.n * d.dim));
    SplitMix64 g(9);
    for (int64_t i = 0; i < d.n; ++i)
      for (int64_t k = 0; k < d.dim; ++k)
        d.f32[size_t(i * d.dim + k)] = means.f32[size_t(i * 3 + k / 64)] + 0.5f * float(g.uniform() - 0.5);
    return d;
  }();
  static const Dataset part[2] = {[] { return rows_of(all, 0, 1024); }(), [] { return rows_of(all, 1024, 300); }()};
  return part[test ? 1 : 0];
}

Outcome train(const Config& c) {
  Runtime rt;
  make_backend_for(c, MPI_COMM_WORLD, rt);
  make_comm_for(c, MPI_COMM_WORLD, rt);
  Trainer t(c, *rt.backend, *rt.comm, &images(false), &images(true));
  TrainResult r = t.run();
  Outcome o{r.losses, t.model().packed(t.params_host()), r.graph, -1, r.last_eval, {}, {}};
  t.average_bn_stats();  // what a checkpoint holds (collective: every rank trains)
  for (const BnState& b : t.model().bn_states()) {
    for (const float* s : {b.running_mean, b.running_var}) {
      o.stats.resize(o.stats.size() + size_t(b.c));
      rt.backend->download(o.stats.data() + o.stats.size() - size_t(b.c), s, size_t(b.c) * sizeof(float));
    }
    o.tracked.push_back(*b.tracked);
  }
#ifdef DPT_HAVE_CUDA
  if (CudaBackend* cb = as_cuda(*rt.backend)) o.fused = cb->fused_layers();
#endif
  return o;
}

int world_size() { int s; MPI_Comm_size(MPI_COMM_WORLD, &s); return s; }

std::string transport() { return cuda_device_count() < world_size() ? "mpi" : "nccl"; }

double max_weight_err(const Outcome& a, const Outcome& b) {
  double worst = 0, scale = 1e-12;
  for (size_t i = 0; i < b.params.size(); ++i) {
    worst = std::max(worst, std::fabs(double(a.params[i]) - b.params[i]));
    scale = std::max(scale, std::fabs(double(b.params[i])));
  }
  return worst / scale;
}

}  // namespace

// fp32: as the MLP's GpuTraining test (2e-4 on losses, 1e-3 of the largest weight: float32
// rounding of differently ordered sums over 64 steps). Dropout masks and augmentation draws are
// the same bits on both backends, so the curves agree as closely as without them.
TEST(CnnGpuTraining, SameCurveAsTheCpuBackend) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  const Outcome gpu = train(config("cuda", transport(), "fp32"));
  const Outcome cpu = train(config("cpu", "mpi", "fp32"));
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (size_t s = 0; s < cpu.losses.size(); ++s)
    ASSERT_NEAR(gpu.losses[s], cpu.losses[s], 2e-4 * std::fabs(cpu.losses[s])) << "step " << s + 1;
  EXPECT_LT(max_weight_err(gpu, cpu), 1e-3);
  EXPECT_NEAR(gpu.eval.accuracy, cpu.eval.accuracy, 0.01);
  if (transport() == "nccl" || world_size() == 1) EXPECT_TRUE(gpu.graph) << "the step was not captured as a graph";
}

// TF32 and bf16: step 1's loss is a forward pass from the same weights: within 5e-3 (TF32) and
// 2e-2 (bf16) of fp32, the precisions' GEMM errors (test_gpu). Later steps drift apart as any
// two roundings of SGD do; every loss within 10% of the CPU's and the test accuracy within 3
// points still catch a wrong layout or a missing gradient (those diverge within a few steps).
// In bf16 the hidden ReLU Linear layers after flatten (a run inside the model, with its input
// gradient) take the fused path.
TEST(CnnGpuTraining, Tf32AndBf16FollowTheCpuCurve) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  const Outcome cpu = train(config("cpu", "mpi", "fp32"));
  for (const char* p : {"tf32", "bf16"}) {
    const Outcome g = train(config("cuda", transport(), p));
    ASSERT_EQ(g.losses.size(), cpu.losses.size()) << p;
    const double first = std::string(p) == "tf32" ? 5e-3 : 2e-2;
    EXPECT_NEAR(g.losses[0], cpu.losses[0], first * cpu.losses[0]) << p;
    for (size_t s = 0; s < cpu.losses.size(); ++s)
      EXPECT_NEAR(g.losses[s], cpu.losses[s], 0.1 * cpu.losses[s]) << p << " step " << s + 1;
    EXPECT_NEAR(g.eval.accuracy, cpu.eval.accuracy, kThreePoints) << p;
    std::printf("%s: step 1 loss %.6f (cpu %.6f), last %.6f (cpu %.6f), accuracy %.4f (cpu %.4f), fused %d\n", p,
                g.losses[0], cpu.losses[0], g.losses.back(), cpu.losses.back(), g.eval.accuracy, cpu.eval.accuracy,
                g.fused);
    if (std::string(p) == "bf16") EXPECT_EQ(g.fused, 2) << "linear(64) relu and linear(32) relu";
  }
}

// Residual networks with batch norm (cuDNN convolutions, the batch-norm, residual-add, padded
// and global pooling kernels): fp32 against the CPU as above. Batch norm divides by the batch's
// standard deviation, which amplifies the convolutions' rounding differences a little more than
// the plain CNN's layers do: 1e-3 on losses, 5e-3 of the largest weight over 64 steps.
TEST(ResnetGpuTraining, SameCurveAsTheCpuBackend) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  for (bool sync : {false, true}) {
    if (sync && world_size() == 1) continue;  // sync_bn is the same as without on one rank
    Config g = config("cuda", transport(), "fp32", kResList), c = config("cpu", "mpi", "fp32", kResList);
    g.sync_bn = c.sync_bn = sync;
    const Outcome gpu = train(g);
    const Outcome cpu = train(c);
    ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
    for (size_t s = 0; s < cpu.losses.size(); ++s)
      ASSERT_NEAR(gpu.losses[s], cpu.losses[s], 1e-3 * std::fabs(cpu.losses[s])) << "step " << s + 1 << " sync_bn " << sync;
    EXPECT_LT(max_weight_err(gpu, cpu), 5e-3) << "sync_bn " << sync;
    EXPECT_NEAR(gpu.eval.accuracy, cpu.eval.accuracy, 0.02) << "sync_bn " << sync;
    if (transport() == "nccl" || world_size() == 1) EXPECT_TRUE(gpu.graph) << "the step was not captured as a graph";
    std::printf("resnet fp32 sync_bn %d: last loss %.6f (cpu %.6f), accuracy %.4f (cpu %.4f)\n", int(sync),
                gpu.losses.back(), cpu.losses.back(), gpu.eval.accuracy, cpu.eval.accuracy);
  }
}

// TF32 and bf16 residual networks: step 1's loss within the precision's forward error, as the
// CNN's. Later single-batch losses decorrelate faster than the CNN's: batch norm at 32 samples
// turns the roundings into different normalisations, and on the H200 single steps differed from
// the CPU's by up to 21% in TF32 and bf16 while the curves ended within 0.01 of each other. So
// the last quarter's mean loss within 20% and the test accuracy within 5 points: a wrong
// gradient or layout stalls or diverges (a loss near ln 6 = 1.79 against ~0.4).
TEST(ResnetGpuTraining, Tf32AndBf16FollowTheCpuCurve) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  const Outcome cpu = train(config("cpu", "mpi", "fp32", kResList));
  auto tail_mean = [](const std::vector<double>& l) {
    const size_t from = l.size() - l.size() / 4;
    double s = 0;
    for (size_t i = from; i < l.size(); ++i) s += l[i];
    return s / double(l.size() - from);
  };
  for (const char* p : {"tf32", "bf16"}) {
    const Outcome g = train(config("cuda", transport(), p, kResList));
    ASSERT_EQ(g.losses.size(), cpu.losses.size()) << p;
    const double first = std::string(p) == "tf32" ? 5e-3 : 2e-2;
    EXPECT_NEAR(g.losses[0], cpu.losses[0], first * cpu.losses[0]) << p;
    for (size_t s = 0; s < cpu.losses.size(); ++s) ASSERT_TRUE(std::isfinite(g.losses[s])) << p << " step " << s + 1;
    EXPECT_NEAR(tail_mean(g.losses), tail_mean(cpu.losses), 0.2 * tail_mean(cpu.losses)) << p;
    EXPECT_NEAR(g.eval.accuracy, cpu.eval.accuracy, kFivePoints) << p;
    std::printf("resnet %s: step 1 loss %.6f (cpu %.6f), last %.6f (cpu %.6f), accuracy %.4f (cpu %.4f)\n", p,
                g.losses[0], cpu.losses[0], g.losses.back(), cpu.losses.back(), g.eval.accuracy, cpu.eval.accuracy);
  }
}

// Two runs of the same config on the GPU end in the same bits (deterministic kernels and cuDNN
// algorithms; conv_tuning = heuristic picks the same ones), in every precision.
TEST(ResnetGpuTraining, RunsRepeatBitwise) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  for (const char* p : {"fp32", "bf16"}) {
    Config c = config("cuda", transport(), p, kResList);
    c.epochs = 1;
    const Outcome a = train(c), b = train(c);
    EXPECT_EQ(a.losses, b.losses) << p;
    EXPECT_TRUE(a.params == b.params) << p;
  }
}

// A block's last batch norm deferred into the block's sum (the default) trains the bits of the
// unfused pass (DPT_DEFER_BN=0), eager step and captured ones alike, in fp32 and in bf16: the
// losses, the parameters and the running statistics.
TEST(ResnetGpuTraining, DeferredBatchNormTrainsTheSameBits) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  for (const char* p : {"fp32", "bf16"}) {
    Config c = config("cuda", transport(), p, kResList);
    c.epochs = 1;
    Outcome plain, deferred;
    {
      const gpu_test::ScopedEnv env({{"DPT_DEFER_BN", "0"}});
      plain = train(c);
    }
    {
      const gpu_test::ScopedEnv env({{"DPT_DEFER_BN", "1"}});
      deferred = train(c);
    }
    EXPECT_EQ(deferred.losses, plain.losses) << p;
    EXPECT_TRUE(deferred.params == plain.params) << p;
    EXPECT_TRUE(deferred.stats == plain.stats) << p;
    if (transport() == "nccl" || world_size() == 1) EXPECT_TRUE(deferred.graph) << p << ": the step was not captured";
  }
}

// Batch norms' ReLU outputs made again for the backward pass (device.recompute = on:
// Model::share_slots) train the bits of keeping them (off), eager step and captured ones alike,
// in fp32 and in bf16.
TEST(ResnetGpuTraining, RecomputedReluOutputsTrainTheSameBits) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  for (const char* p : {"fp32", "bf16"}) {
    Config c = config("cuda", transport(), p, kResList);
    c.epochs = 1;
    c.recompute = "off";
    const Outcome kept = train(c);
    c.recompute = "on";
    const Outcome remade = train(c);
    EXPECT_EQ(remade.losses, kept.losses) << p;
    EXPECT_TRUE(remade.params == kept.params) << p;
    EXPECT_TRUE(remade.stats == kept.stats) << p;
    if (transport() == "nccl" || world_size() == 1) EXPECT_TRUE(remade.graph) << p << ": the step was not captured";
  }
}

// LARS and LAMB on the residual network (per-tensor sums and the update inside the captured
// step graph): bn's weight and bias are 1-D tensors, updated without a trust ratio or weight
// decay, the kernels and the Linear weight with their own ratios (docs/models.md). fp32 against
// the CPU with the Nesterov test's tolerances. The rates are test_gpu_train's LARS and
// test_parallel's LAMB: on the CPU, with images like these, both reach ~0.98 test accuracy and a
// one-ulp change of the inputs moved their curves by < 1e-5 in each of four draws, where LARS at
// lr 0.1 and LAMB at 0.005 moved by ~1e-3 in one: too near the tolerance to tell a bug from chaos.
TEST(ResnetGpuTraining, LarsAndLambFollowTheCpuCurve) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  for (const std::string opt : {"lars", "lamb"}) {
    Config g = config("cuda", transport(), "fp32", kResList), c = config("cpu", "mpi", "fp32", kResList);
    for (Config* x : {&g, &c}) {
      x->optimizer = opt;
      x->lr = opt == "lars" ? 0.2 : 0.01;
      x->trust_coefficient = opt == "lars" ? 0.02 : 0.0;
    }
    const Outcome gpu = train(g);
    const Outcome cpu = train(c);
    ASSERT_EQ(gpu.losses.size(), cpu.losses.size()) << opt;
    for (size_t s = 0; s < cpu.losses.size(); ++s)
      ASSERT_NEAR(gpu.losses[s], cpu.losses[s], 1e-3 * std::fabs(cpu.losses[s])) << opt << " step " << s + 1;
    EXPECT_LT(max_weight_err(gpu, cpu), 5e-3) << opt;
    EXPECT_NEAR(gpu.eval.accuracy, cpu.eval.accuracy, 0.02) << opt;
    if (transport() == "nccl" || world_size() == 1) EXPECT_TRUE(gpu.graph) << opt << ": the step was not captured";
    std::printf("resnet %s: last loss %.6f (cpu %.6f), accuracy %.4f (cpu %.4f)\n", opt.c_str(), gpu.losses.back(),
                cpu.losses.back(), gpu.eval.accuracy, cpu.eval.accuracy);
  }
}

// A run resumed from a mid-epoch checkpoint of the uninterrupted run (as BnResume.Bitwise on the
// CPU) ends in its bits on the GPU: parameters, running statistics, num_batches_tracked, every
// loss after the checkpoint and the test evaluation. bf16 too: its weight copies are derived
// from the fp32 master the checkpoint holds, so the resumed run must rebuild them to the same bits.
TEST(ResnetGpuTraining, ResumeIsBitwise) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  for (const char* p : {"fp32", "bf16"}) {
    Config c = config("cuda", transport(), p, kResList);
    c.ckpt_every = 7;
    c.ckpt_keep = 0;
    c.ckpt_dir = dpt::testing::temp_dir("gpu-resume-a");
    const Outcome full = train(c);
    const size_t from = 21;  // mid-epoch; the rest crosses an epoch's end and its evaluation
    ASSERT_GT(full.losses.size(), from + 10) << p;
    Config resumed = c;
    resumed.resume = checkpoint_path(c.ckpt_dir, int64_t(from));
    resumed.ckpt_dir = dpt::testing::temp_dir("gpu-resume-b");
    const Outcome rest = train(resumed);
    ASSERT_EQ(rest.params.size(), full.params.size()) << p;
    EXPECT_EQ(0, std::memcmp(rest.params.data(), full.params.data(), full.params.size() * sizeof(float))) << p;
    ASSERT_EQ(rest.losses.size(), full.losses.size() - from) << p;
    for (size_t i = 0; i < rest.losses.size(); ++i)
      EXPECT_EQ(rest.losses[i], full.losses[from + i]) << p << " step " << from + i + 1;
    ASSERT_EQ(rest.stats.size(), full.stats.size()) << p;
    EXPECT_FALSE(full.stats.empty()) << p;
    EXPECT_EQ(0, std::memcmp(rest.stats.data(), full.stats.data(), full.stats.size() * sizeof(float))) << p;
    EXPECT_EQ(rest.tracked, full.tracked) << p;
    EXPECT_EQ(rest.eval.loss, full.eval.loss) << p;
    if (dpt::testing::world_rank() == 0)
      for (const std::string& d : {c.ckpt_dir, resumed.ckpt_dir}) std::filesystem::remove_all(d);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}
