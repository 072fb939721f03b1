// Multi-rank tests of a convolutional layer list with dropout on images and on features and
// with random crops and flips (4 ranks, oversubscribed on 2 cores): 1, 2 and 4 ranks and
// accumulation with one global batch agree; a resume continues bitwise on the same ranks and
// within rounding on others; data.read = shard trains bitwise like the whole file. Dropout's
// masks and the augmentation draws depend on the sample (its place in the global batch, its
// row), never on the rank that computes it, which is what makes these hold.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "dpt/ckpt.hpp"
#include "dpt/ckpt_folder.hpp"
#include "dpt/data.hpp"
#include "dpt/train.hpp"
#include "parallel_util.hpp"

using namespace dpt;
using namespace dpt::testing;

namespace {

// As test_parallel: float32 rounding of differently split sums, amplified over 40 steps.
constexpr double kLossTol = 1e-5, kParamTol = 1e-4;

Config cnn_config() {
  Config c = base_config();
  c.layers.clear();
  c.layer_list = "conv(4,3,pad=1) relu maxpool(2) dropout(0.2) conv(6,2) tanh flatten linear(8) relu "
                 "dropout(0.3) linear(4)";
  c.augment = "crop,flip";
  c.crop_padding = 1;
  c.epochs = 2;
  return c;
}

void expect_same_run(const Outcome& a, const Outcome& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  ASSERT_GT(a.losses.size(), 10u) << what;
  for (size_t s = 0; s < a.losses.size(); ++s)
    ASSERT_NEAR(a.losses[s], b.losses[s], kLossTol * std::fabs(b.losses[s])) << what << " step " << s + 1;
  EXPECT_LT(max_rel_diff(a.params, b.params), kParamTol) << what;
}

void remove_dirs(std::initializer_list<const char*> tags) {
  if (world_rank() != 0) return;
  for (const char* t : tags)
    std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                (std::string("dpt-") + t + "-" + std::to_string(::getpid())));
}

}  // namespace

TEST(CnnDataParallel, RankCountsAndAccumulationAgree) {
  ASSERT_GE(world_size(), 4);
  Config c = cnn_config();
  c.batch_per_rank = 24;
  const Outcome one = train_on(1, c, &small_images());
  EXPECT_EQ(one.steps, 2 * (480 / 24));
  for (int n : {2, 4}) {
    c.batch_per_rank = 24 / n;
    expect_same_run(train_on(n, c, &small_images()), one, std::to_string(n) + " ranks vs 1");
  }
  c.batch_per_rank = 6;
  c.accumulate = 4;
  expect_same_run(train_on(1, c, &small_images()), one, "accumulate 4 on 1 rank vs 1 rank");
  c.accumulate = 2;
  expect_same_run(train_on(2, c, &small_images()), one, "accumulate 2 on 2 ranks vs 1 rank");

  // The oracle has teeth: without dropout, without augmentation, or with other masks, the run
  // is far outside the tolerance.
  Config d = cnn_config();
  d.batch_per_rank = 24;
  d.augment = "none";
  EXPECT_GT(max_rel_diff(train_on(1, d, &small_images()).params, one.params), 100 * kParamTol) << "no augmentation";
  d = cnn_config();
  d.batch_per_rank = 24;
  d.layer_list = "conv(4,3,pad=1) relu maxpool(2) dropout(0) conv(6,2) tanh flatten linear(8) relu dropout(0) linear(4)";
  EXPECT_GT(max_rel_diff(train_on(1, d, &small_images()).params, one.params), 100 * kParamTol) << "no dropout";
}

// random_resized_crop (windows drawn per file row and epoch, resized to 5x5, flipped) with
// per-channel normalisation: 1, 2 and 4 ranks agree; a resume mid-epoch continues bitwise; the
// windows matter (center crops alone train far from it).
TEST(CnnResizedCrops, RankCountsAgreeAndResumeIsBitwise) {
  ASSERT_GE(world_size(), 4);
  Config c = cnn_config();
  c.augment = "random_resized_crop,flip";
  c.crop_size = 5;
  c.crop_scale = "0.3,1";
  c.mean = "0.1,0.2";
  c.std = "0.5,0.6";
  c.batch_per_rank = 24;
  const Outcome one = train_on(1, c, &small_images());
  for (int n : {2, 4}) {
    c.batch_per_rank = 24 / n;
    expect_same_run(train_on(n, c, &small_images()), one, std::to_string(n) + " ranks vs 1, resized crops");
  }
  c.batch_per_rank = 12;
  c.ckpt_every = 7;
  c.ckpt_keep = 0;
  c.ckpt_dir = temp_dir("rrc-resume-a");
  const Outcome full = train_on(2, c, &small_images());
  std::string mid;
  if (world_rank() == 0) mid = checkpoint_path(c.ckpt_dir, 21);
  bcast_string(MPI_COMM_WORLD, mid);
  Config resumed = c;
  resumed.resume = mid;
  resumed.ckpt_dir = temp_dir("rrc-resume-b");
  const Outcome rest = train_on(2, resumed, &small_images());
  ASSERT_EQ(rest.params.size(), full.params.size());
  EXPECT_EQ(0, std::memcmp(rest.params.data(), full.params.data(), full.params.size() * sizeof(float)));
  Config d = c;
  d.augment = "none";
  d.ckpt_dir = "";
  EXPECT_GT(max_rel_diff(train_on(2, d, &small_images()).params, full.params), 100 * kParamTol) << "center crops";
  remove_dirs({"rrc-resume-a", "rrc-resume-b"});
}

TEST(CnnResume, BitwiseOnTheSameRanksAndCloseOnOthers) {
  Config c = cnn_config();
  c.batch_per_rank = 12;
  c.optimizer = "adam";
  c.lr = 0.01;
  c.ckpt_every = 7;
  c.ckpt_keep = 0;
  c.ckpt_dir = temp_dir("cnn-resume-a");
  const Outcome full = train_on(2, c, &small_images());
  ASSERT_EQ(full.steps, 40);

  std::string mid;
  if (world_rank() == 0) mid = checkpoint_path(c.ckpt_dir, 21);  // mid-epoch 2
  bcast_string(MPI_COMM_WORLD, mid);
  Config resumed = c;
  resumed.resume = mid;
  resumed.ckpt_dir = temp_dir("cnn-resume-b");
  const Outcome rest = train_on(2, resumed, &small_images());
  EXPECT_EQ(rest.steps, full.steps);
  ASSERT_EQ(rest.params.size(), full.params.size());
  EXPECT_EQ(0, std::memcmp(rest.params.data(), full.params.data(), full.params.size() * sizeof(float)));
  ASSERT_EQ(rest.losses.size(), size_t(full.steps - 21));
  for (size_t i = 0; i < rest.losses.size(); ++i) EXPECT_EQ(rest.losses[i], full.losses[21 + i]) << i;
  ASSERT_EQ(rest.state.size(), full.state.size());
  for (size_t k = 0; k < full.state.size(); ++k)
    EXPECT_EQ(0, std::memcmp(rest.state[k].data(), full.state[k].data(), full.state[k].size() * sizeof(float)));

  for (int ranks : {4, 1}) {
    Config other = resumed;
    other.batch_per_rank = 24 / ranks;
    other.ckpt_dir = temp_dir("cnn-resume-c" + std::to_string(ranks));
    const Outcome o = train_on(ranks, other, &small_images());
    EXPECT_EQ(o.steps, full.steps);
    EXPECT_LT(max_rel_diff(o.params, full.params), kParamTol) << ranks << " ranks";
  }
  remove_dirs({"cnn-resume-a", "cnn-resume-b", "cnn-resume-c4", "cnn-resume-c1"});
}

// data.read = shard and stream: the rows and the augmentation draws (keyed by file row) are
// those of the whole file; evaluation (dropout off) on this rank's test rows.
TEST(CnnDataRead, ShardTrainsBitwiseLikeTheWholeFile) {
  const std::string dir = temp_dir("cnn-shard");
  const std::string train = dir + "/train.h5", test = dir + "/test.h5";
  if (world_rank() == 0) {
    std::filesystem::create_directories(dir);
    write_dataset(train, small_images());
    Dataset t = synth_blobs(53, 2 * 6 * 6, 4, 0.8f, 3);
    t.sample_shape = {2, 6, 6};
    write_dataset(test, t);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  Config c = cnn_config();
  c.train_file = train;
  c.test_file = test;
  c.batch_per_rank = 5;
  c.accumulate = 2;
  Outcome out[3];
  double eval[3][2] = {};
  for (int shard = 0; shard < 3; ++shard) {
    c.data_read = shard == 2 ? "stream" : shard ? "shard" : "all";
    c.stream_batches = 3;
    on_first(3, [&](Backend& be, Comm& comm) {
      RunData d = load_run_data(c, comm, true);
      std::unique_ptr<Trainer> t = make_trainer(c, be, comm, d);
      TrainResult r = t->run();
      out[shard].losses = r.losses;
      out[shard].params = t->params_host();
      out[shard].steps = r.steps;
      eval[shard][0] = r.last_eval.loss;
      eval[shard][1] = r.last_eval.accuracy;
    });
    bcast_vec(out[shard].losses);
    bcast_vec(out[shard].params);
    MPI_Bcast(&out[shard].steps, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    MPI_Bcast(eval[shard], 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  }
  EXPECT_EQ(out[0].steps, 2 * (480 / 30));
  for (int k : {1, 2}) {  // shard, stream
    EXPECT_EQ(out[k].losses, out[0].losses) << c.data_read;
    ASSERT_EQ(out[k].params.size(), out[0].params.size());
    EXPECT_EQ(0, std::memcmp(out[k].params.data(), out[0].params.data(), out[0].params.size() * sizeof(float))) << k;
    EXPECT_EQ(eval[k][0], eval[0][0]);
    EXPECT_EQ(eval[k][1], eval[0][1]);
  }
  EXPECT_GT(eval[0][1], 0.0);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
}
