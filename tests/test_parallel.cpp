// Multi-rank tests of the training loop (4 ranks, oversubscribed on 2 cores): data-parallel
// equivalence across rank counts, accumulation, parameter averaging against a hand simulation,
// and resume against an uninterrupted run. Each case trains on sub-communicators of the first
// n ranks; rank 0 of MPI_COMM_WORLD is in every one and broadcasts what it saw.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "dpt/backend.hpp"
#include "dpt/check.hpp"
#include "dpt/ckpt.hpp"
#include "dpt/ckpt_folder.hpp"
#include "dpt/comm.hpp"
#include "dpt/data.hpp"
#include "dpt/log.hpp"
#include "dpt/train.hpp"
#include "parallel_util.hpp"

using namespace dpt;
using namespace dpt::testing;

namespace {

// Rank counts differ only in how the global batch's gradient is summed (one GEMM over 32 rows,
// or per-rank GEMMs then an allreduce), so results agree to float32 rounding amplified by a
// few dozen steps of training: 1e-5 relative on losses and 1e-4 on parameters is ~100× the
// differences seen, and far below what one mis-ordered or missing sample would cause (~1e-2).
constexpr double kLossTol = 1e-5, kParamTol = 1e-4;

void expect_same_run(const Outcome& a, const Outcome& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  ASSERT_GT(a.losses.size(), 10u) << what;
  for (size_t s = 0; s < a.losses.size(); ++s)
    ASSERT_NEAR(a.losses[s], b.losses[s], kLossTol * std::fabs(b.losses[s])) << what << " step " << s + 1;
  EXPECT_LT(max_rel_diff(a.params, b.params), kParamTol) << what;
}

}  // namespace

TEST(DataParallel, GradientSyncMatchesOneRankOnTheGlobalBatch) {
  ASSERT_GE(world_size(), 4);
  Config c = base_config();
  c.batch_per_rank = 32;
  Outcome one = train_on(1, c);
  EXPECT_EQ(one.steps, 3 * (640 / 32));
  for (int n : {2, 4}) {
    c.batch_per_rank = 32 / n;
    expect_same_run(train_on(n, c), one, std::to_string(n) + " ranks vs 1");
  }
  // Sanity of the oracle: a different sample order is far outside the tolerance.
  c.batch_per_rank = 32;
  c.shuffle = false;
  Outcome other = train_on(1, c);
  EXPECT_GT(max_rel_diff(other.params, one.params), 100 * kParamTol);
}

TEST(DataParallel, AccumulationEqualsMoreRanks) {
  Config c = base_config();
  c.optimizer = "adam";
  c.lr = 0.01;
  c.batch_per_rank = 8;
  c.accumulate = 4;
  Outcome acc1 = train_on(1, c);
  c.accumulate = 2;
  Outcome acc2 = train_on(2, c);
  c.accumulate = 1;
  Outcome ranks4 = train_on(4, c);
  expect_same_run(acc1, ranks4, "accumulate 4 on 1 rank vs 4 ranks");
  expect_same_run(acc2, ranks4, "accumulate 2 on 2 ranks vs 4 ranks");
}

// sync = parameters against a simulation written out here: each rank's model stepping on its
// own slice of every global batch, parameters and momentum averaged every k steps.
TEST(DataParallel, ParameterAveragingMatchesHandSimulation) {
  Config c = base_config();
  c.sync = "parameters";
  c.average_every = 3;
  c.batch_per_rank = 16;
  c.epochs = 1;
  c.steps = 16;  // ends on an averaging step? 16 % 3 != 0: the final average is checked too
  const int R = 2;
  Outcome got = train_on(R, c);

  auto be = make_cpu_backend({});
  std::vector<std::unique_ptr<MLP>> models;
  std::vector<std::unique_ptr<Optimizer>> opts;
  for (int r = 0; r < R; ++r) {
    models.push_back(std::make_unique<MLP>(*be, c.layers, parse_act(c.activation), c.batch_per_rank));
    models.back()->init_params(c.seed);  // rank 0's init, broadcast to all
    opts.push_back(std::make_unique<Optimizer>(*be, c, models.back()->num_params()));
  }
  const size_t n = models[0]->num_params();
  const Dataset& ds = blobs();
  std::vector<int64_t> order = epoch_order(ds.n, true, c.seed, 0);
  std::vector<float> x(size_t(c.batch_per_rank) * 12);
  std::vector<int32_t> y(size_t(c.batch_per_rank));
  auto average = [&] {
    for (size_t i = 0; i < n; ++i) {
      float p = 0, m = 0;
      for (int r = 0; r < R; ++r) p += models[r]->params()[i], m += opts[r]->state()[0].data[i];
      for (int r = 0; r < R; ++r) models[r]->params()[i] = p / R, opts[r]->state()[0].data[i] = m / R;
    }
  };
  for (int64_t k = 0; k < c.steps; ++k) {
    for (int r = 0; r < R; ++r) {
      ds.gather(order.data() + batch_offset(k, 0, r, c.batch_per_rank, R, 1), c.batch_per_rank, x.data(), y.data());
      float st[2] = {0, 0};
      models[r]->forward(x.data(), c.batch_per_rank);
      models[r]->loss(y.data(), c.batch_per_rank, 1.f / c.batch_per_rank, st, true);
      models[r]->backward(x.data(), c.batch_per_rank, false);
      opts[r]->step(models[r]->params(), models[r]->grads(), c.lr);
    }
    if ((k + 1) % c.average_every == 0) average();
  }
  average();
  std::vector<float> want(models[0]->params(), models[0]->params() + n);
  // The same float operations in the same order, except the 2-term average: 1e-6.
  EXPECT_LT(max_rel_diff(got.params, want), 1e-6);
  // Averaging is not gradient sync: the runs must differ measurably.
  Config g = c;
  g.sync = "gradients";
  EXPECT_GT(max_rel_diff(train_on(R, g).params, want), 1e-4);
}

TEST(Resume, ContinuesExactlyLikeTheUninterruptedRun) {
  Config c = base_config();
  c.batch_per_rank = 8;
  c.epochs = 2;
  c.optimizer = "adamw";
  c.weight_decay = 0.01;
  c.lr = 0.01;
  c.schedule = "cosine";
  c.ckpt_every = 7;
  c.ckpt_keep = 0;
  c.ckpt_dir = temp_dir("resume-a");
  Outcome full = train_on(2, c);
  const int64_t total = full.steps;

  // Resume from the step-21 checkpoint (mid-epoch) the uninterrupted run left behind, as a
  // job killed after it would.
  std::string mid;
  if (world_rank() == 0) mid = checkpoint_path(c.ckpt_dir, 21);
  bcast_string(MPI_COMM_WORLD, mid);
  Config resumed = c;
  resumed.resume = mid;
  resumed.ckpt_dir = temp_dir("resume-c");
  Outcome rest = train_on(2, resumed);
  EXPECT_EQ(rest.steps, total);
  ASSERT_EQ(rest.params.size(), full.params.size());
  // Same ranks, same operations in the same order: bitwise.
  EXPECT_EQ(0, std::memcmp(rest.params.data(), full.params.data(), full.params.size() * sizeof(float)));
  ASSERT_EQ(rest.losses.size(), size_t(total - 21));
  for (size_t i = 0; i < rest.losses.size(); ++i) EXPECT_EQ(rest.losses[i], full.losses[21 + i]);

  // Another rank count with the same global batch picks up the same sample order.
  for (int ranks : {4, 1}) {
    Config other = resumed;
    other.batch_per_rank = 16 / ranks;
    other.ckpt_dir = temp_dir("resume-d" + std::to_string(ranks));
    Outcome o = train_on(ranks, other);
    EXPECT_EQ(o.steps, total);
    EXPECT_LT(max_rel_diff(o.params, full.params), kParamTol) << ranks << " ranks";
  }
  if (world_rank() == 0)
    for (const char* t : {"resume-a", "resume-c", "resume-d4", "resume-d1"})
      std::filesystem::remove_all(std::filesystem::temp_directory_path() / (std::string("dpt-") + t + "-" + std::to_string(::getpid())));
}

// LARS and LAMB take each tensor's trust ratio from the reduced gradient, so rank counts agree
// as with the other optimizers; their state is checkpointed under torch's names and a resumed
// run continues bitwise.
TEST(Layerwise, LarsAndLambMatchAcrossRankCountsAndResumeBitwise) {
  for (const std::string opt : {"lars", "lamb"}) {
    Config c = base_config();
    c.optimizer = opt;
    c.lr = opt == "lars" ? 0.2 : 0.01;
    c.trust_coefficient = opt == "lars" ? 0.02 : 0.0;
    c.weight_decay = 0.001;
    c.epochs = 2;
    c.batch_per_rank = 32;
    Outcome one = train_on(1, c);
    EXPECT_LT(one.losses.back(), 0.8 * one.losses.front()) << opt << ": it trains";
    for (int n : {2, 4}) {
      c.batch_per_rank = 32 / n;
      expect_same_run(train_on(n, c), one, opt + ": " + std::to_string(n) + " ranks vs 1");
    }

    c.batch_per_rank = 8;
    c.ckpt_every = 7;
    c.ckpt_keep = 0;
    c.ckpt_dir = temp_dir("lw-" + opt);
    Outcome full = train_on(2, c);
    std::string mid;
    if (world_rank() == 0) {
      mid = checkpoint_path(c.ckpt_dir, 21);
      const Checkpoint ck = read_checkpoint(mid);
      EXPECT_EQ(ck.optimizer, opt);
      for (const char* t : {"fc0/weight", "fc2/bias"})
        for (const char* st : opt == "lars" ? std::vector<const char*>{"momentum_buffer"}
                                            : std::vector<const char*>{"exp_avg", "exp_avg_sq"})
          EXPECT_NE(ck.find(std::string("optimizer/") + st + "/" + t), nullptr) << opt << " " << st << "/" << t;
    }
    bcast_string(MPI_COMM_WORLD, mid);
    Config resumed = c;
    resumed.resume = mid;
    resumed.ckpt_dir = temp_dir("lw-r-" + opt);
    Outcome rest = train_on(2, resumed);
    EXPECT_EQ(rest.steps, full.steps) << opt;
    ASSERT_EQ(rest.params.size(), full.params.size());
    EXPECT_EQ(0, std::memcmp(rest.params.data(), full.params.data(), full.params.size() * sizeof(float))) << opt;
    ASSERT_EQ(rest.losses.size(), size_t(full.steps - 21)) << opt;
    for (size_t i = 0; i < rest.losses.size(); ++i) EXPECT_EQ(rest.losses[i], full.losses[21 + i]) << opt;
    if (world_rank() == 0)
      for (const std::string& d : {c.ckpt_dir, resumed.ckpt_dir}) std::filesystem::remove_all(d);
  }
}

// A run capped by train.steps in the middle of an epoch saves its exact place in the epoch
// order; resuming it continues like the uninterrupted run.
TEST(Resume, AfterAStepCapInTheMiddleOfAnEpoch) {
  Config c = base_config();
  c.batch_per_rank = 8;
  c.epochs = 2;
  c.ckpt_keep = 0;
  c.ckpt_dir = temp_dir("cap-a");
  Outcome full = train_on(2, c);
  Config capped = c;
  capped.ckpt_dir = temp_dir("cap-b");
  capped.steps = 13;  // 40 steps per epoch: stops inside epoch 1
  Outcome first = train_on(2, capped);
  EXPECT_EQ(first.steps, 13);
  Config rest = c;
  rest.ckpt_dir = capped.ckpt_dir;
  rest.resume = "auto";
  Outcome second = train_on(2, rest);
  EXPECT_EQ(second.steps, full.steps);
  EXPECT_EQ(0, std::memcmp(second.params.data(), full.params.data(), full.params.size() * sizeof(float)));
  if (world_rank() == 0)
    for (const char* t : {"cap-a", "cap-b"})
      std::filesystem::remove_all(std::filesystem::temp_directory_path() / (std::string("dpt-") + t + "-" + std::to_string(::getpid())));
}

namespace {

struct FileOutcome {
  Outcome run;
  EvalResult eval;
  int64_t rows_read = 0;  // rank 0's rows read from the training file
};

// As train_on, but from cfg.train_file / cfg.test_file the way dptrain reads them: whole
// (data.read = all) or, for data.read = shard, only this rank's rows of each.
FileOutcome train_from_files(int ranks, const Config& cfg) {
  FileOutcome out;
  double ev[3] = {0, 0, 0};
  on_first(ranks, [&](Backend& be, Comm& comm) {
    RunData d = load_run_data(cfg, comm, true);
    std::unique_ptr<Trainer> t = make_trainer(cfg, be, comm, d);
    TrainResult r = t->run();
    out.run.losses = r.losses;
    out.run.params = t->params_host();
    out.run.steps = r.steps;
    ev[0] = r.last_eval.loss;
    ev[1] = r.last_eval.accuracy;
    ev[2] = double(r.last_eval.n);
    out.rows_read = d.rows ? d.rows->rows_read() : d.train.n;
  });
  bcast_vec(out.run.losses);
  bcast_vec(out.run.params);
  MPI_Bcast(&out.run.steps, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  MPI_Bcast(ev, 3, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Bcast(&out.rows_read, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  out.eval.loss = ev[0];
  out.eval.accuracy = ev[1];
  out.eval.n = int64_t(ev[2]);
  return out;
}

void expect_bitwise(const FileOutcome& a, const FileOutcome& b, const std::string& what) {
  EXPECT_EQ(a.run.steps, b.run.steps) << what;
  EXPECT_EQ(a.run.losses, b.run.losses) << what;
  ASSERT_EQ(a.run.params.size(), b.run.params.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.run.params.data(), b.run.params.data(), a.run.params.size() * sizeof(float))) << what;
  EXPECT_EQ(a.eval.loss, b.eval.loss) << what;
  EXPECT_EQ(a.eval.accuracy, b.eval.accuracy) << what;
  EXPECT_EQ(a.eval.n, b.eval.n) << what;
}

}  // namespace

// data.read = shard changes where the rows come from, not which rows a step uses: the same
// ranks train bitwise alike, evaluation included, while each rank reads only its share.
TEST(DataRead, ShardTrainsBitwiseLikeTheWholeFile) {
  const std::string dir = temp_dir("shard");
  const std::string train = dir + "/train.h5", test = dir + "/test.h5";
  if (world_rank() == 0) {
    std::filesystem::create_directories(dir);
    write_dataset(train, blobs());
    write_dataset(test, synth_blobs(101, 12, 4, 0.8f, 7));  // 101 rows: uneven eval shards
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (bool shuffle : {true, false}) {
    Config c = base_config();
    c.train_file = train;
    c.test_file = test;
    c.shuffle = shuffle;
    c.batch_per_rank = 5;
    c.accumulate = 2;
    c.epochs = 3;
    const int ranks = 3;  // G = 30: 21 steps per epoch, 10 of the 640 rows unused each epoch
    const FileOutcome all = train_from_files(ranks, c);
    c.data_read = "shard";
    const FileOutcome shard = train_from_files(ranks, c);
    const std::string what = shuffle ? "shuffled" : "in file order";
    ASSERT_EQ(all.run.steps, 3 * 21) << what;
    expect_bitwise(shard, all, what);
    EXPECT_EQ(all.eval.n, 101);
    // Rank 0 read 21 steps × 2 micro-batches × 5 rows per epoch: once in file order, every
    // epoch when shuffled; the whole-file run read all 640.
    EXPECT_EQ(shard.rows_read, (shuffle ? 3 : 1) * 21 * 2 * 5) << what;
    EXPECT_EQ(all.rows_read, 640);

    // A shard run resumed mid-epoch from its checkpoint ends like the uninterrupted one.
    Config capped = c;
    capped.ckpt_dir = dir + "/ckpt-" + std::to_string(shuffle);
    capped.ckpt_keep = 0;
    capped.steps = 30;  // inside epoch 2
    EXPECT_EQ(train_from_files(ranks, capped).run.steps, 30);
    Config rest = c;
    rest.ckpt_dir = capped.ckpt_dir;
    rest.resume = "auto";
    const FileOutcome resumed = train_from_files(ranks, rest);
    EXPECT_EQ(resumed.run.steps, all.run.steps);
    EXPECT_EQ(0, std::memcmp(resumed.run.params.data(), all.run.params.data(), all.run.params.size() * sizeof(float))) << what;
  }
  if (world_rank() == 0) std::filesystem::remove_all(dir);
}

// A row that breaks the file, first needed in the second epoch (data.read = shard reads it only
// then): every rank stops together with the row named, after keeping the first epoch's work in a
// checkpoint from which the run resumes.
TEST(DataRead, ABadRowFoundMidRunStopsEveryRankAfterACheckpoint) {
  const std::string dir = temp_dir("badrow");
  const std::string train = dir + "/train.h5";
  Config c = base_config();
  c.train_file = train;
  c.data_read = "shard";
  c.batch_per_rank = 4;
  c.epochs = 3;
  c.ckpt_dir = dir + "/ckpt";
  c.ckpt_every = 0;
  c.ckpt_keep = 0;
  // 41 rows, global batch 8 on 2 ranks: 5 steps an epoch; the row at position 40 of epoch 0's
  // order is dropped then, and used in epoch 1 (checked below).
  const int64_t n = 41;
  const auto o0 = epoch_order(n, true, c.seed, 0), o1 = epoch_order(n, true, c.seed, 1);
  const int64_t bad = o0[40];
  ASSERT_NE(o1[40], bad);
  if (world_rank() == 0) {
    std::filesystem::create_directories(dir);
    write_dataset(train, synth_blobs(n, 12, 4, 0.8f, 3));
    // Label 9 (num_classes is 4) written into row `bad` behind the writer's back.
    hid_t f = H5Fopen(train.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "labels", H5P_DEFAULT);
    hid_t space = H5Dget_space(d);
    const hsize_t start = hsize_t(bad), one = 1;
    H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, nullptr, &one, nullptr);
    hid_t mem = H5Screate_simple(1, &one, nullptr);
    const int32_t nine = 9;
    EXPECT_GE(H5Dwrite(d, H5T_NATIVE_INT32, mem, space, H5P_DEFAULT, &nine), 0);
    H5Sclose(mem), H5Sclose(space), H5Dclose(d), H5Fclose(f);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  int code = -1, collective = 0;
  std::string what;
  on_first(2, [&](Backend& be, Comm& comm) {
    TrainRows rows(train, rank_order(c, comm));
    Trainer t(c, be, comm, &rows, nullptr);
    try {
      t.run();
    } catch (const Error& e) {
      code = e.code();
      collective = e.collective();
      what = e.what();
    }
  });
  if (world_rank() < 2) {
    EXPECT_EQ(code, kExitUsage) << what;  // on both ranks: none is left in a collective
    EXPECT_TRUE(collective);
    EXPECT_NE(what.find("a checkpoint of step 5 was written"), std::string::npos) << what;
  }
  if (world_rank() == 0) EXPECT_TRUE(std::filesystem::exists(checkpoint_path(c.ckpt_dir, 5)));
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
}
