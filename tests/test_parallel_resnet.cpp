// Multi-rank tests of batch norm and residual blocks (4 ranks, oversubscribed on 2 cores):
// sync_bn on N ranks equals one rank at the global batch (with accumulation too); without it,
// N ranks equal one rank accumulating the same micro-batches; a resume continues bitwise with
// the running statistics; presets' checkpoints hold torchvision's state_dict names.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "dpt/ckpt.hpp"
#include "dpt/ckpt_folder.hpp"
#include "dpt/data.hpp"
#include "dpt/train.hpp"
#include "parallel_util.hpp"

using namespace dpt;
using namespace dpt::testing;

namespace {

// As test_parallel_cnn: float32 rounding of differently split sums, amplified over 40 steps.
constexpr double kLossTol = 1e-5, kParamTol = 1e-4;

Config res_config() {
  Config c = base_config();
  c.layers.clear();
  c.layer_list =
      "conv(4,3,pad=1,bias=false) bn relu res(conv(4,3,pad=1,bias=false) bn relu conv(4,3,pad=1,bias=false) bn) relu "
      "res(conv(8,3,stride=2,pad=1,bias=false) bn relu conv(8,3,pad=1,bias=false) bn | conv(8,1,stride=2,bias=false) bn) "
      "relu avgpool(global) flatten linear(6) bn relu linear(4)";
  c.augment = "crop,flip";
  c.crop_padding = 1;
  c.epochs = 2;
  c.weight_decay = 1e-3;
  return c;
}

struct BnOutcome {
  Outcome o;
  std::vector<float> stats;  // every bn layer's running mean and var, averaged over the ranks
  std::vector<int64_t> tracked;
};

BnOutcome train_bn(int ranks, const Config& cfg) {
  BnOutcome out;
  on_first(ranks, [&](Backend& be, Comm& comm) {
    Trainer t(cfg, be, comm, &small_images(), nullptr);
    TrainResult r = t.run();
    out.o.losses = r.losses;
    out.o.params = t.model().packed(t.params_host());
    out.o.steps = r.steps;
    t.average_bn_stats();
    for (const BnState& b : t.model().bn_states()) {
      out.stats.insert(out.stats.end(), b.running_mean, b.running_mean + b.c);
      out.stats.insert(out.stats.end(), b.running_var, b.running_var + b.c);
      out.tracked.push_back(*b.tracked);
    }
  });
  bcast_vec(out.o.losses);
  bcast_vec(out.o.params);
  bcast_vec(out.stats);
  MPI_Bcast(&out.o.steps, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  uint64_t n = out.tracked.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  out.tracked.resize(n);
  MPI_Bcast(out.tracked.data(), int(n), MPI_INT64_T, 0, MPI_COMM_WORLD);
  return out;
}

void expect_same_run(const BnOutcome& a, const BnOutcome& b, const std::string& what, bool stats = true) {
  ASSERT_EQ(a.o.losses.size(), b.o.losses.size()) << what;
  ASSERT_GT(a.o.losses.size(), 10u) << what;
  for (size_t s = 0; s < a.o.losses.size(); ++s)
    ASSERT_NEAR(a.o.losses[s], b.o.losses[s], kLossTol * std::fabs(b.o.losses[s])) << what << " step " << s + 1;
  EXPECT_LT(max_rel_diff(a.o.params, b.o.params), kParamTol) << what;
  if (stats) EXPECT_LT(max_rel_diff(a.stats, b.stats), kParamTol) << what << ": running statistics";
}

}  // namespace

TEST(SyncBn, NRanksEqualOneRankAtTheGlobalBatch) {
  ASSERT_GE(world_size(), 4);
  Config c = res_config();
  c.sync_bn = true;
  c.batch_per_rank = 24;
  const BnOutcome one = train_bn(1, c);
  EXPECT_EQ(one.o.steps, 2 * (480 / 24));
  EXPECT_EQ(one.tracked.front(), one.o.steps);
  for (int n : {2, 4}) {
    c.batch_per_rank = 24 / n;
    expect_same_run(train_bn(n, c), one, "sync_bn on " + std::to_string(n) + " ranks vs 1");
  }
  // Accumulation: statistics per micro-batch, over every rank's.
  c.batch_per_rank = 12;
  c.accumulate = 2;
  const BnOutcome acc1 = train_bn(1, c);
  EXPECT_EQ(acc1.tracked.front(), 2 * acc1.o.steps);
  c.batch_per_rank = 6;
  expect_same_run(train_bn(2, c), acc1, "sync_bn, accumulate 2, on 2 ranks vs 1");
  // The oracle has teeth: each rank's own statistics are another computation.
  c.sync_bn = false;
  c.batch_per_rank = 12;
  c.accumulate = 1;
  EXPECT_GT(max_rel_diff(train_bn(2, c).o.params, one.o.params), 100 * kParamTol) << "sync_bn = false";
}

// Without sync_bn every rank normalises its own micro-batch: 2 ranks are one rank accumulating
// the same two micro-batches (its running statistics move twice where the ranks' move once
// each and are averaged, so they are not compared).
TEST(SyncBn, OffEqualsAccumulatingTheSameMicroBatches) {
  Config c = res_config();
  c.batch_per_rank = 12;
  const BnOutcome two = train_bn(2, c);
  c.accumulate = 2;
  expect_same_run(train_bn(1, c), two, "2 ranks vs accumulate 2", false);
}

// train.decay_bn_and_bias = false keeps weight decay off the 1-D tensors wherever the update
// runs: a sharded optimizer (each rank's chunk of the arena) agrees with the whole arena, and
// both differ from decaying everything.
TEST(NoDecay, ShardedAgreesAndDecayMatters) {
  Config c = res_config();
  c.batch_per_rank = 12;
  c.weight_decay = 0.05;
  c.decay_bn_and_bias = false;
  const BnOutcome whole = train_bn(2, c);
  c.shard_optimizer = true;
  expect_same_run(train_bn(2, c), whole, "sharded vs whole, decay_bn_and_bias = false");
  c.shard_optimizer = false;
  c.decay_bn_and_bias = true;
  EXPECT_GT(max_rel_diff(train_bn(2, c).o.params, whole.o.params), 100 * kParamTol) << "decay everything";
}

TEST(BnResume, Bitwise) {
  for (bool sync_bn : {false, true}) {
    Config c = res_config();
    c.sync_bn = sync_bn;
    c.batch_per_rank = 12;
    c.optimizer = "adam";
    c.lr = 0.01;
    c.ckpt_every = 7;
    c.ckpt_keep = 0;
    c.ckpt_dir = temp_dir("bn-resume-a");
    const BnOutcome full = train_bn(2, c);
    ASSERT_EQ(full.o.steps, 40);
    std::string mid;
    if (world_rank() == 0) mid = checkpoint_path(c.ckpt_dir, 21);
    bcast_string(MPI_COMM_WORLD, mid);
    Config resumed = c;
    resumed.resume = mid;
    resumed.ckpt_dir = temp_dir("bn-resume-b");
    const BnOutcome rest = train_bn(2, resumed);
    EXPECT_EQ(rest.o.steps, full.o.steps);
    ASSERT_EQ(rest.o.params.size(), full.o.params.size());
    EXPECT_EQ(0, std::memcmp(rest.o.params.data(), full.o.params.data(), full.o.params.size() * sizeof(float)))
        << "sync_bn " << sync_bn;
    ASSERT_EQ(rest.o.losses.size(), size_t(full.o.steps - 21));
    for (size_t i = 0; i < rest.o.losses.size(); ++i) EXPECT_EQ(rest.o.losses[i], full.o.losses[21 + i]) << i;
    ASSERT_EQ(rest.stats.size(), full.stats.size());
    EXPECT_EQ(0, std::memcmp(rest.stats.data(), full.stats.data(), full.stats.size() * sizeof(float)));
    EXPECT_EQ(rest.tracked, full.tracked);
    if (world_rank() == 0)
      for (const std::string& d : {c.ckpt_dir, resumed.ckpt_dir}) std::filesystem::remove_all(d);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// A list with bn: /model/bn<i>/{weight,bias,running_mean,running_var,num_batches_tracked}, no
// bias for a conv without one. A preset: torchvision's state_dict keys, all 122 of resnet18's.
TEST(BnCheckpoint, NamesOfListsAndPresets) {
  Config c = res_config();
  c.batch_per_rank = 8;
  c.steps = 3;
  c.optimizer = "momentum";
  c.ckpt_dir = temp_dir("bn-names-a");
  train_bn(2, c);
  if (world_rank() == 0) {
    const Checkpoint ck = read_checkpoint(checkpoint_path(c.ckpt_dir, 3));
    EXPECT_EQ(ck.model, layer_list_text(parse_layer_list(c.layer_list)));
    const Tensor* t = ck.find("model/bn0/num_batches_tracked");
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE(t->int64);
    EXPECT_EQ(t->ints, std::vector<int64_t>{3});
    ASSERT_NE(ck.find("model/bn3/running_var"), nullptr);
    EXPECT_EQ(ck.find("model/bn3/running_var")->shape, std::vector<int64_t>{8});
    EXPECT_EQ(ck.find("model/conv0/bias"), nullptr);
    EXPECT_NE(ck.find("optimizer/momentum_buffer/bn0/weight"), nullptr);
    EXPECT_EQ(ck.find("optimizer/momentum_buffer/bn0/running_mean"), nullptr);
  }
  Config r = base_config();
  r.layers.clear();
  r.layer_list = "resnet18(stem=small)";
  r.batch_per_rank = 4;
  r.steps = 1;
  r.optimizer = "momentum";
  r.ckpt_dir = temp_dir("bn-names-b");
  train_bn(1, r);
  if (world_rank() == 0) {
    const Checkpoint ck = read_checkpoint(checkpoint_path(r.ckpt_dir, 1));
    EXPECT_EQ(ck.model, "resnet18(stem=small,classes=4)");
    std::set<std::string> model;
    for (const Tensor& t : ck.tensors)
      if (t.name.compare(0, 6, "model/") == 0) model.insert(t.name.substr(6));
    EXPECT_EQ(model.size(), 122u);
    for (const char* k : {"conv1.weight", "bn1.running_mean", "layer1.0.bn1.num_batches_tracked", "layer2.0.downsample.0.weight",
                          "layer4.1.bn2.bias", "fc.weight", "fc.bias"})
      EXPECT_TRUE(model.count(k)) << k;
    EXPECT_FALSE(model.count("conv1.bias"));
    EXPECT_EQ(ck.find("model/conv1.weight")->shape, (std::vector<int64_t>{64, 2, 3, 3}));
    EXPECT_NE(ck.find("optimizer/momentum_buffer/layer3.1.conv2.weight"), nullptr);
    for (const std::string& d : {c.ckpt_dir, r.ckpt_dir}) std::filesystem::remove_all(d);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
