// bench-scaling's harness on CPU ranks (4, oversubscribed): subsets and their communicators,
// the arithmetic against hand-computed values (efficiency, nccl-tests' busbw for allreduce,
// reduce-scatter and all-gather, bucket layout, alpha-beta fit, limiting factor, exposed
// communication, the time budget's step counts; time to target is test_bench_tta's), the
// variants of the gradient path, the probe every rank agrees on, a slow model's rows shortened
// by the budget beside a fast one's, the measurements on a tiny model (collective results
// exact, one row per subset and variant), the PyTorch peer's output read and set beside
// dptrain's rows, and the report files written and well formed (records.json read back cell for
// cell, the plots report.md lists drawn).
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <tuple>
#include <fstream>
#include <sstream>

#include "dpt/app.hpp"
#include "dpt/check.hpp"
#include "dpt/scaling.hpp"

using namespace dpt;
using namespace dpt::scaling;
namespace fs = std::filesystem;

namespace {

int world_rank() { int r; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
int world_size() { int s; MPI_Comm_size(MPI_COMM_WORLD, &s); return s; }

// A sweep small enough for seconds on oversubscribed CPU ranks.
Settings tiny(const std::string& out) {
  Settings s;
  s.base.layers = {12, 16, 8, 4};
  s.base.device_type = "cpu";
  s.base.threads = 1;
  s.base.optimizer = "sgd";
  s.base.momentum = 0;
  s.models = {{"tiny", {12, 16, 8, 4}}};
  s.weak_batch_per_rank = 8;
  s.strong_global_batch = 16;
  // Enough steps that the difference of the two runs stands above oversubscription noise.
  s.warmup_steps = 5;
  s.timed_steps = 200;
  s.repeats = 1;
  s.data_iters = 2;
  s.ar_min_bytes = 4;
  s.ar_max_bytes = 4096;
  s.ar_factor = 8;
  s.ar_iters = 2;
  s.ar_warmup = 1;
  s.ar_repeats = 2;
  s.bucket_mb = {0.0001, 1};
  s.grid = false;
  s.predict_max_ranks = 16;
  s.out_dir = out;
  return s;
}

struct Harness {
  Settings s;
  Runtime rt;
  Context cx;
  explicit Harness(const std::string& out) : s(tiny(out)) {
    make_backend_for(s.base, MPI_COMM_WORLD, rt);
    rt.node = node_info(MPI_COMM_WORLD);
    cx = Context{&s, rt.backend.get(), MPI_COMM_WORLD, world_rank(), world_size(), "cpu", "mpi", rt.node};
  }
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// Fields of one CSV line, honouring quotes.
size_t csv_fields(const std::string& line) {
  size_t n = 1;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    else if (c == ',' && !quoted) ++n;
  }
  return n;
}

}  // namespace

TEST(BenchSubsets, PowersOfTwoUpToTheWorld) {
  EXPECT_EQ(subset_sizes(1), (std::vector<int>{1}));
  EXPECT_EQ(subset_sizes(4), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(subset_sizes(7), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(subset_sizes(8, 2), (std::vector<int>{1, 2}));
}

TEST(BenchSubsets, FirstNRanksGetTheirOwnCommunicator) {
  for (int n : subset_sizes(world_size())) {
    SubComm sub(MPI_COMM_WORLD, n);
    EXPECT_EQ(sub.member(), world_rank() < n);
    if (sub.member()) {
      int size = 0, rank = -1, sum = 0, one = 1;
      MPI_Comm_size(sub.get(), &size);
      MPI_Comm_rank(sub.get(), &rank);
      EXPECT_EQ(size, n);
      EXPECT_EQ(rank, world_rank());
      MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, sub.get());
      EXPECT_EQ(sum, n);
    }
    idle_barrier(MPI_COMM_WORLD);
  }
}

TEST(BenchArithmetic, EfficiencyAndNcclTestsBandwidth) {
  EXPECT_DOUBLE_EQ(efficiency(300, 4, 100), 0.75);
  EXPECT_DOUBLE_EQ(efficiency(100, 1, 100), 1.0);
  EXPECT_TRUE(std::isnan(efficiency(1, 2, 0)));
  EXPECT_DOUBLE_EQ(algbw(1e9, 0.5), 2e9);
  // busbw = algbw × 2(n−1)/n: 1 rank moves nothing, 2 ranks = algbw, 8 ranks = 1.75 × algbw.
  EXPECT_DOUBLE_EQ(busbw_allreduce(10, 1), 0);
  EXPECT_DOUBLE_EQ(busbw_allreduce(10, 2), 10);
  EXPECT_DOUBLE_EQ(busbw_allreduce(10, 8), 17.5);
}

TEST(BenchArithmetic, ReduceScatterAndAllGatherBusBandwidth) {
  // nccl-tests' PERFORMANCE.md: each link carries (n−1)/n of the whole buffer; allreduce twice that.
  for (Collective c : {Collective::reduce_scatter, Collective::all_gather}) {
    EXPECT_DOUBLE_EQ(busbw(c, 10, 1), 0);
    EXPECT_DOUBLE_EQ(busbw(c, 10, 2), 5);
    EXPECT_DOUBLE_EQ(busbw(c, 10, 8), 8.75);
  }
  EXPECT_DOUBLE_EQ(busbw(Collective::allreduce, 10, 8), 17.5);
  EXPECT_EQ(collective_name(Collective::reduce_scatter), "reduce_scatter");
  EXPECT_EQ(collective_name(Collective::all_gather), "all_gather");
}

TEST(BenchArithmetic, ExposedCommunicationIsTheStepBeyondTheSlowestRanksCompute) {
  // Step 10 ms; compute 6 and 8 ms on two ranks, 1 ms of it data on each.
  const Breakdown b = breakdown(10e-3, {6e-3, 8e-3}, {1e-3, 1e-3}, 1e-5);
  EXPECT_NEAR(b.compute_mean, 7e-3, 1e-15);
  EXPECT_NEAR(b.compute_max, 8e-3, 1e-15);
  EXPECT_NEAR(b.data_mean, 1e-3, 1e-15);
  EXPECT_NEAR(b.imbalance_pct, 100.0 / 7, 1e-9);
  EXPECT_NEAR(b.exposed, 2e-3, 1e-15);
  EXPECT_NEAR(b.exposed_pct, 20, 1e-9);
  // 7 − 1 ms of math in a 10 ms step, but 20% exposed communication: not compute-bound.
  EXPECT_EQ(b.limit, "compute (60%) + communication (exposed 20%)");
  // A step timed below the slowest rank's compute (noise) exposes nothing, never a negative time.
  const Breakdown n = breakdown(7e-3, {6e-3, 8e-3}, {1e-3, 1e-3}, 1e-5);
  EXPECT_EQ(n.exposed, 0);
  EXPECT_EQ(n.exposed_pct, 0);
}

TEST(BenchVariants, NamesRoundTripAndSetTheConfigKeys) {
  for (const char* name : {"unsharded-fp32", "unsharded-bf16", "sharded-fp32", "sharded-bf16"}) {
    const Variant v = parse_variant(name, "test");
    EXPECT_EQ(v.name(), name);
    const Config c = v.apply(Config{});
    EXPECT_EQ(c.shard_optimizer, std::string(name).rfind("sharded", 0) == 0);
    EXPECT_EQ(c.grad_dtype, std::string(name).substr(std::string(name).size() - 4));
    EXPECT_EQ(variant_of(c), v);
  }
  try {
    parse_variant("sharded-fp16", "bench/scaling.ini");
    ADD_FAILURE() << "sharded-fp16 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("scaling.variants = 'sharded-fp16'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bench/scaling.ini"), std::string::npos) << e.what();
  }
  // Unset, the variants are the base config's own.
  Settings s;
  s.base.shard_optimizer = true;
  ASSERT_EQ(variants_of(s).size(), 1u);
  EXPECT_EQ(variants_of(s)[0].name(), "sharded-fp32");
}

TEST(BenchVariants, NullCommTakesTheSubsetsRankAndSizeAndDoesNothing) {
  auto c = make_null_comm(3, 4);
  EXPECT_EQ(c->rank(), 3);
  EXPECT_EQ(c->size(), 4);
  EXPECT_TRUE(c->capturable());
  float x[4] = {1, 2, 3, 4}, y[16] = {};
  c->allreduce(x, x, 4, DType::f32, RedOp::sum);
  c->reduce_scatter(x, y, 1, DType::f32, RedOp::sum);
  c->allgather(x, y, 4, DType::f32);
  EXPECT_EQ(x[0] + x[1] + x[2] + x[3], 10);
  EXPECT_EQ(y[0] + y[15], 0);
}

TEST(BenchArithmetic, BucketsFollowTheTrainersLayout) {
  // Layers 12-16-8-4: fc0 = 13·16 = 208, fc1 = 17·8 = 136, fc2 = 9·4 = 36 parameters.
  EXPECT_EQ(param_count({12, 16, 8, 4}), 380u);
  EXPECT_EQ(bucket_elements({12, 16, 8, 4}, 1e-9), (std::vector<size_t>{36, 136, 208}));
  EXPECT_EQ(bucket_elements({12, 16, 8, 4}, 100 * 4.0 / (1 << 20)), (std::vector<size_t>{172, 208}));
  EXPECT_EQ(bucket_elements({12, 16, 8, 4}, 1), (std::vector<size_t>{380}));
}

TEST(BenchModels, WidthsAndLayerListsParseAndWriteBack) {
  // Widths only: whitespace (or ';') between models, as always.
  auto ms = parse_models("default:784,256,10 wide:784,4096,10");
  ASSERT_EQ(ms.size(), 2u);
  EXPECT_EQ(ms[1].name, "wide");
  EXPECT_EQ(ms[1].layers, (std::vector<int>{784, 4096, 10}));
  EXPECT_FALSE(ms[1].is_list());
  // With a layer list: ';' between models, the list normalised, its image shape after '@'.
  ms = parse_models("tiny:12,16,8,4; cnn@1,6,6:conv(4,3,pad=1) relu maxpool(2) flatten linear(4)");
  ASSERT_EQ(ms.size(), 2u);
  EXPECT_EQ(ms[0].layers, (std::vector<int>{12, 16, 8, 4}));
  const ModelSpec& c = ms[1];
  EXPECT_TRUE(c.is_list());
  EXPECT_EQ(c.input, (std::vector<int>{1, 6, 6}));
  EXPECT_EQ(c.list, "conv(4,3,stride=1,pad=1) relu maxpool(2,stride=2) flatten linear(4)");
  EXPECT_EQ(c.text(), "cnn@1,6,6:" + c.list);
  EXPECT_EQ(parse_models(ms[0].text() + "; " + c.text())[1].list, c.list);
  EXPECT_EQ(parse_models(c.text())[0].list, c.list);  // a layer list alone needs no ';'
  EXPECT_EQ(parse_models(c.text() + ";").size(), 1u);
  // conv0: 4·1·3·3 + 4 = 40; fc0: 4·3·3 → 4: 36·4 + 4 = 148; buckets from the last layer.
  EXPECT_EQ(param_count(c), 188u);
  EXPECT_EQ(bucket_elements(c, 1e-9), (std::vector<size_t>{148, 40}));
  EXPECT_EQ(bucket_elements(c, 1), (std::vector<size_t>{188}));
  const ModelPlan plan = model_plan(c);
  EXPECT_EQ(plan.input.size(), 36);
  EXPECT_EQ(plan.output().c, 4);
  // A model's own batches (/W or /W,S before the ':'), written back the same way; the others take
  // the [scaling] ones.
  const std::string clist = c.list;
  ms = parse_models("tiny/4:12,16,8,4; cnn@1,6,6/2,6:conv(4,3,pad=1) relu maxpool(2) flatten linear(4); plain:12,4");
  ASSERT_EQ(ms.size(), 3u);
  EXPECT_EQ(ms[0].weak_batch, 4);
  EXPECT_EQ(ms[0].strong_batch, 0);
  EXPECT_EQ(ms[1].weak_batch, 2);
  EXPECT_EQ(ms[1].strong_batch, 6);
  EXPECT_EQ(ms[1].input, (std::vector<int>{1, 6, 6}));
  EXPECT_EQ(ms[0].text(), "tiny/4:12,16,8,4");
  EXPECT_EQ(ms[1].text(), "cnn@1,6,6/2,6:" + clist);
  const auto back = parse_models(ms[0].text() + "; " + ms[1].text() + "; " + ms[2].text());
  EXPECT_EQ(back[1].weak_batch, 2);
  EXPECT_EQ(back[1].strong_batch, 6);
  EXPECT_EQ(back[2].weak_batch, 0);
  Settings st;
  st.weak_batch_per_rank = 8;
  st.strong_global_batch = 32;
  EXPECT_EQ(st.weak_batch(ms[0]), 4);
  EXPECT_EQ(st.strong_batch(ms[0]), 32);
  EXPECT_EQ(st.weak_batch(ms[1]), 2);
  EXPECT_EQ(st.strong_batch(ms[1]), 6);
  EXPECT_EQ(st.weak_batch(ms[2]), 8);
  EXPECT_EQ(st.strong_batch(ms[2]), 32);
}

TEST(BenchModels, BadModelsNameTheModelAndWhatIsWrong) {
  auto err = [](const std::string& v) {
    try {
      parse_models(v);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(err("a:12,4; cnn:conv(4,3) flatten linear(4)").find("needs the images' shape"), std::string::npos);
  EXPECT_NE(err("a@1,6,6:12,4").find("belongs to layer lists"), std::string::npos);
  for (const char* bad : {"a/0:12,4", "a/x:12,4", "a/4,:12,4", "a/4,,8:12,4", "a/1,2,3:12,4", "a/:12,4", "a/-2:12,4"})
    EXPECT_NE(err(bad).find("a model's own batches are /W or /W,S"), std::string::npos) << bad << ": " << err(bad);
  const std::string big = err("cnn@1,4,4:conv(4,7) flatten linear(4)");
  EXPECT_NE(big.find("model cnn"), std::string::npos) << big;
  EXPECT_NE(big.find("conv"), std::string::npos) << big;
  EXPECT_NE(err("a:12,4 a:12,8").find("named twice"), std::string::npos);
  EXPECT_NE(err("12,4").find("each model is"), std::string::npos);
  EXPECT_NE(err("cnn@1,6:conv(4,3) flatten linear(4)"), "accepted");
  EXPECT_EQ(err(""), "at least one model");
}

TEST(BenchArithmetic, AlphaBetaRecoversAnExactLine) {
  const std::vector<double> m{1e3, 1e4, 1e5, 1e6, 1e7};
  std::vector<double> t;
  for (double x : m) t.push_back(20e-6 + x / 5e9);
  const AlphaBeta ab = fit_alpha_beta(4, m, t);
  EXPECT_NEAR(ab.alpha, 20e-6, 1e-12);
  EXPECT_NEAR(ab.beta, 1 / 5e9, 1e-18);
  EXPECT_LT(ab.max_rel_err, 1e-9);
  // Ring: hop = α / 2(n−1); busbw = 2(n−1) / (n·β); it reproduces the fitted n exactly.
  const RingModel r = ring_from(ab);
  EXPECT_NEAR(r.hop_latency, 20e-6 / 6, 1e-15);
  EXPECT_NEAR(r.bus_bw, 1.5 * 5e9, 1);
  EXPECT_NEAR(r.seconds(1e6, 4), 20e-6 + 1e6 / 5e9, 1e-12);
  EXPECT_DOUBLE_EQ(r.seconds(1e6, 1), 0);
}

TEST(BenchArithmetic, LimitingFactorNamesTheLargestPart) {
  EXPECT_EQ(limiting_factor(10e-3, 8.5e-3, 1e-3, 0, 0.5e-3, 1e-5), "compute-bound (85%)");
  EXPECT_EQ(limiting_factor(10e-3, 8.01e-3, 1e-3, 0, 0.99e-3, 1e-5), "compute-bound (80%)");
  // Compute the largest part but exposed communication at kComputeBoundMaxExposed (10%) or more
  // of the step: both are named, never "compute-bound".
  EXPECT_DOUBLE_EQ(kComputeBoundMaxExposed, 0.10);
  EXPECT_EQ(limiting_factor(10e-3, 7.8e-3, 1e-3, 0, 1.2e-3, 1e-5), "compute (78%) + communication (exposed 12%)");
  EXPECT_EQ(limiting_factor(10e-3, 5.8e-3, 0.5e-3, 0.5e-3, 3.2e-3, 1e-5),
            "compute (58%) + communication (exposed 32%)");
  EXPECT_EQ(limiting_factor(10e-3, 3e-3, 1e-3, 0, 6e-3, 1e-5), "communication (exposed 60%)");
  EXPECT_EQ(limiting_factor(10e-3, 2e-3, 5e-3, 3e-3, 0, 1e-5), "data (50%)");
  EXPECT_EQ(limiting_factor(10e-3, 3e-3, 0, 7e-3, 0, 1e-5), "imbalance (70%)");
  EXPECT_EQ(limiting_factor(20e-6, 20e-6, 0, 0, 0, 50e-6), "launch/latency-bound");
}

// The time budget: min(count, max(floor, ⌈budget / probe⌉)) for the timed and the warm-up steps.
TEST(BenchArithmetic, TimeBudgetCountsFollowTheProbe) {
  Settings s;  // the GPU defaults: 50 + 200 steps, 0.5 s and 2 s, at least 20 timed
  ASSERT_EQ(s.warmup_steps, 50);
  ASSERT_EQ(s.timed_steps, 200);
  EXPECT_TRUE(budget_applies(s));
  auto counts = [&](double probe) {
    const StepCounts k = step_counts(s, probe);
    return std::pair{k.warmup, k.timed};
  };
  // Fast steps (the MLPs and the CNN, 0.1–5 ms on a GPU) keep every step, up to the 10 ms where
  // both budgets trip.
  EXPECT_EQ(counts(0.1e-3), std::pair(50, 200));
  EXPECT_EQ(counts(5e-3), std::pair(50, 200));
  EXPECT_EQ(counts(10e-3), std::pair(50, 200));
  // resnet50 at 64 a GPU in fp32 (~45 ms): ⌈0.5 / 0.045⌉ = 12, ⌈2 / 0.045⌉ = 45.
  EXPECT_EQ(counts(45e-3), std::pair(12, 45));
  // Slower still: the floors (kMinWarmupSteps, min_timed_steps).
  EXPECT_EQ(counts(0.18), std::pair(kMinWarmupSteps, 20));
  EXPECT_EQ(counts(1e9), std::pair(kMinWarmupSteps, 20));
  // A probe that says nothing (noise on a fast step: not positive, or not finite): as configured.
  for (double bad : {0.0, -1e-3, double(NAN), double(INFINITY)}) EXPECT_EQ(counts(bad), std::pair(50, 200)) << bad;
  // A tiny probe cannot overflow.
  EXPECT_EQ(counts(1e-300), std::pair(50, 200));
  // A floor never raises a count: with timed_steps under min_timed_steps no budget applies.
  s.timed_steps = 3;
  s.warmup_steps = 2;
  EXPECT_FALSE(budget_applies(s));
  EXPECT_EQ(counts(1.0), std::pair(2, 3));
  // Each budget is off at 0.
  s.warmup_steps = 50;
  s.timed_steps = 200;
  s.timed_seconds = 0;
  EXPECT_EQ(counts(45e-3), std::pair(12, 200));
  s.warmup_seconds = 0;
  EXPECT_FALSE(budget_applies(s));
  EXPECT_EQ(counts(45e-3), std::pair(50, 200));
}

// Every rank of the communicator gets the same counts, from the slowest rank's probe, and the
// probe is the difference of two runs (start-up cancels). A fake loop stands in for the Trainer:
// rank r takes 0.3 s to start and 7 ms × (r + 1) a step.
TEST(BenchMeasure, PlanStepsAgreesOnEveryRankFromTheSlowestProbe) {
  Settings s;
  s.warmup_steps = 20;
  s.timed_steps = 50;
  s.min_timed_steps = 10;
  s.timed_seconds = 0.25;
  s.warmup_seconds = 0.1;
  const int r = world_rank(), n = world_size();
  std::vector<int64_t> calls;
  auto loop = [&](int64_t k) {
    calls.push_back(k);
    return 0.3 + double(k) * 7e-3 * (r + 1);
  };
  const StepCounts k = plan_steps(s, MPI_COMM_WORLD, loop);
  EXPECT_EQ(calls, (std::vector<int64_t>{5, 5, 10}));  // untimed, then P and 2P
  EXPECT_NEAR(k.probe_s, 7e-3 * n, 1e-9);
  // 4 ranks: 28 ms, ⌈0.25 / 0.028⌉ = 9 → the floor 10; ⌈0.1 / 0.028⌉ = 4 → kMinWarmupSteps.
  const StepCounts want = step_counts(s, 7e-3 * n);
  EXPECT_EQ(k.timed, want.timed);
  EXPECT_EQ(k.warmup, want.warmup);
  if (n == 4) EXPECT_EQ(std::pair(k.warmup, k.timed), std::pair(kMinWarmupSteps, 10));
  int mine[2] = {k.warmup, k.timed};
  std::vector<int> all(size_t(2 * n));
  MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, MPI_COMM_WORLD);
  for (int q = 0; q < n; ++q) EXPECT_EQ(std::pair(all[2 * q], all[2 * q + 1]), std::pair(k.warmup, k.timed)) << "rank " << q;
  // No budget: one untimed run of warmup_steps, the counts as configured, nothing probed.
  s.timed_seconds = s.warmup_seconds = 0;
  calls.clear();
  const StepCounts off = plan_steps(s, MPI_COMM_WORLD, loop);
  EXPECT_EQ(calls, (std::vector<int64_t>{20}));
  EXPECT_EQ(std::pair(off.warmup, off.timed), std::pair(20, 50));
  EXPECT_TRUE(std::isnan(off.probe_s));
}

TEST(BenchMeasure, AllreduceSweepIsExactOnEverySubset) {
  Harness h(fs::temp_directory_path() / "dpt-bench-unused");
  const Table t = measure_allreduce(h.cx);
  if (world_rank() != 0) return;
  // Sizes 4, 32, 256, 2048 bytes on n = 2, 4 ranks.
  ASSERT_EQ(t.rows.size(), 8u);
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const int n = int(t.at(i, "ranks")->num);
    EXPECT_TRUE(n == 2 || n == 4);
    EXPECT_EQ(t.at(i, "wrong")->num, 0) << "ranks " << n << " bytes " << t.at(i, "bytes")->num;
    EXPECT_GT(t.at(i, "time_us")->num, 0);
    EXPECT_NEAR(t.at(i, "algbw_gbs")->num, t.at(i, "bytes")->num / (t.at(i, "time_us")->num * 1e-6) / 1e9, 1e-6);
    EXPECT_NEAR(t.at(i, "busbw_gbs")->num, t.at(i, "algbw_gbs")->num * 2 * (n - 1) / n, 1e-9);
  }
}

TEST(BenchMeasure, ReduceScatterAndAllGatherSweepsAreExactOnEverySubset) {
  Harness h(fs::temp_directory_path() / "dpt-bench-unused");
  for (Collective c : {Collective::reduce_scatter, Collective::all_gather}) {
    const Table t = measure_collective(h.cx, c);
    if (world_rank() != 0) continue;
    EXPECT_EQ(t.name, collective_name(c));
    // Sizes 4, 32, 256, 2048 bytes (the whole buffer) on n = 2, 4 ranks.
    ASSERT_EQ(t.rows.size(), 8u);
    for (size_t i = 0; i < t.rows.size(); ++i) {
      const int n = int(t.at(i, "ranks")->num);
      const double count = t.at(i, "count")->num;
      EXPECT_EQ(t.at(i, "wrong")->num, 0) << t.name << " ranks " << n << " count " << count;
      EXPECT_EQ(t.at(i, "bytes")->num, n * count * 4);  // nccl-tests' size: n × the per-rank count
      EXPECT_NEAR(t.at(i, "algbw_gbs")->num, t.at(i, "bytes")->num / (t.at(i, "time_us")->num * 1e-6) / 1e9, 1e-6);
      EXPECT_NEAR(t.at(i, "busbw_gbs")->num, t.at(i, "algbw_gbs")->num * (n - 1) / n, 1e-9);
    }
    EXPECT_EQ(t.at(7, "count")->num, 2048 / 4 / 4);
  }
}

TEST(BenchMeasure, EveryVariantGetsItsRowsEfficiencyAndExposedCommunication) {
  Harness h(fs::temp_directory_path() / "dpt-bench-unused");
  h.s.variants = {parse_variant("unsharded-fp32", "test"), parse_variant("sharded-bf16", "test")};
  const Table sc = measure_scaling(h.cx);
  const auto fits = fit_allreduce(measure_allreduce(h.cx));  // collective: every rank
  if (world_rank() != 0) return;
  // n = 1, 2, 4 × weak, strong × 2 variants.
  ASSERT_EQ(sc.rows.size(), 12u);
  std::map<std::string, double> one;  // variant -> weak throughput on 1 rank
  double fastest = 0;
  for (size_t i = 0; i < sc.rows.size(); ++i)
    if (sc.at(i, "ranks")->num == 1 && sc.at(i, "mode")->text == "weak") {
      one[sc.at(i, "variant")->text] = sc.at(i, "samples_per_s")->num;
      fastest = std::max(fastest, sc.at(i, "samples_per_s")->num);
    }
  ASSERT_EQ(one.size(), 2u);
  for (size_t i = 0; i < sc.rows.size(); ++i) {
    const std::string v = sc.at(i, "variant")->text;
    const int n = int(sc.at(i, "ranks")->num);
    ASSERT_TRUE(v == "unsharded-fp32" || v == "sharded-bf16") << v;
    ASSERT_FALSE(sc.at(i, "step_ms")->empty) << "unresolved step, variant " << v << " n " << n;
    // Exposed communication = step − the slowest rank's compute, per variant, never negative.
    const double step = sc.at(i, "step_ms")->num, cmax = sc.at(i, "compute_max_ms")->num;
    EXPECT_NEAR(sc.at(i, "exposed_comm_ms")->num, std::max(0.0, step - cmax), 1e-9) << v << " n " << n;
    EXPECT_NEAR(sc.at(i, "exposed_comm_pct")->num, 100 * std::max(0.0, step - cmax) / step, 1e-9);
    if (sc.at(i, "mode")->text != "weak") continue;
    // Efficiency against the same variant on 1 rank, and against the fastest variant there.
    const double thr = sc.at(i, "samples_per_s")->num;
    EXPECT_NEAR(sc.at(i, "efficiency")->num, thr / (n * one[v]), 1e-12);
    EXPECT_NEAR(sc.at(i, "efficiency_vs_best1")->num, thr / (n * fastest), 1e-12);
  }
  // At n = 2 the strong row's batch per rank (16 / 2) is the weak one's: one measurement, shown twice.
  for (size_t i = 0; i < sc.rows.size(); ++i)
    for (size_t j = 0; j < sc.rows.size(); ++j)
      if (sc.at(i, "ranks")->num == 2 && sc.at(j, "ranks")->num == 2 && sc.at(i, "mode")->text == "weak" &&
          sc.at(j, "mode")->text == "strong" && sc.at(i, "variant")->text == sc.at(j, "variant")->text)
        EXPECT_EQ(sc.at(i, "step_ms")->num, sc.at(j, "step_ms")->num);
  // The prediction is per variant.
  const Table pr = predict_scaling(h.s, sc, fits);
  EXPECT_EQ(pr.rows.size(), 10u);  // n = 1 … 16 per variant
  Report r;
  r.tables = {sc};
  const auto f = findings(r);
  size_t mentions = 0;
  for (auto& line : f) mentions += line.find("sharded-bf16") != std::string::npos;
  EXPECT_EQ(mentions, 2u) << "one finding per mode at the largest n";
}

namespace {

// torch_ddp.py's line as it prints it (json.dumps), behind a launcher's prefix.
const char* kPeerLine =
    "[default0]:{\"bench\": \"torch-ddp\", \"error\": \"\", \"partial\": false, \"torch\": \"2.11.0\", "
    "\"world_size\": 2, \"batch_per_gpu\": 8, \"rows\": [{\"kind\": \"eager\", \"ddp\": true, \"bucket_mb\": 25.0, "
    "\"ms_per_step\": 2.5, \"ms_min\": 2.4, \"ms_max\": 2.6, \"per_rank_ms\": [2.5, 2.45]}, {\"kind\": \"eager\", "
    "\"ddp\": true, \"bucket_mb\": 50.0, \"ms_per_step\": 2.2, \"ms_min\": 2.1, \"ms_max\": 2.3}, {\"kind\": "
    "\"compile-model\", \"ddp\": true, \"bucket_mb\": 50.0, \"error\": \"RuntimeError: \\\"no\\\" {graph}\"}, "
    "{\"kind\": \"compile-step\", \"ddp\": true, \"bucket_mb\": 50.0, \"ms_per_step\": 1.25, \"ms_min\": 1.2, "
    "\"ms_max\": 1.3}], \"strongest\": {\"kind\": \"compile-step\", \"ms_per_step\": 1.25}}";

PeerRun one_process(int batch, double eager, double step) {
  PeerRun r;
  r.model = "tiny";
  r.ranks = 1;
  r.batch_per_rank = batch;
  r.rows = {PeerRow{"eager", false, 0, eager, eager, eager, ""}, PeerRow{"compile-step", false, 0, step, step, step, ""}};
  return r;
}

}  // namespace

TEST(BenchPeer, ReadsTorchDdpsLine) {
  const PeerRun r = parse_peer_output(std::string("torchrun noise\n") + kPeerLine + "\n[default1]: more noise\n");
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.torch_version, "2.11.0");
  EXPECT_EQ(r.ranks, 2);
  EXPECT_EQ(r.batch_per_rank, 8);
  ASSERT_EQ(r.rows.size(), 4u);
  EXPECT_EQ(r.rows[1].kind, "eager");
  EXPECT_TRUE(r.rows[1].ddp);
  EXPECT_EQ(r.rows[1].bucket_mb, 50);
  EXPECT_EQ(r.rows[1].ms, 2.2);
  EXPECT_EQ(r.rows[2].error, "RuntimeError: \"no\" {graph}");  // quotes and braces inside a string
  EXPECT_TRUE(std::isnan(r.rows[2].ms));
  EXPECT_EQ(r.rows[3].ms_max, 1.3);
  EXPECT_NE(parse_peer_output("no json here").error, "");
  // A launch cut short by its time limit keeps the rows it finished, and says so.
  std::string partial = kPeerLine;
  partial.replace(partial.find("\"partial\": false"), 16, "\"partial\": true");
  const PeerRun p = parse_peer_output(partial);
  EXPECT_EQ(p.rows.size(), 4u);
  EXPECT_NE(p.error.find("cut short"), std::string::npos);
}

TEST(BenchPeer, SetBesideDptrainsFastestVariantWithTheRatio) {
  Settings s;
  s.models = {{"tiny", {12, 16, 8, 4}}};
  s.weak_batch_per_rank = 8;
  s.strong_global_batch = 16;
  // A scaling table with the columns the peer reads: dptrain's steps per variant.
  Table sc{"scaling", "", {{"model", "", "", ""}, {"mode", "", "", ""}, {"variant", "", "", ""}, {"ranks", "", "", "%.0f"},
                           {"step_ms", "", "", "%.3f"}, {"efficiency", "", "", "%.3f"}}, {}, {}};
  for (auto [mode, variant, n, step, eff] : std::vector<std::tuple<const char*, const char*, int, double, double>>{
           {"weak", "unsharded-fp32", 1, 0.5, 1}, {"weak", "sharded-bf16", 1, 0.6, 1}, {"weak", "unsharded-fp32", 2, 0.7, 0.71},
           {"weak", "sharded-bf16", 2, 0.55, 1.09}, {"strong", "unsharded-fp32", 1, 0.9, 1}, {"strong", "sharded-bf16", 2, 0.55, 0.82}})
    sc.rows.push_back({txt("tiny"), txt(mode), txt(variant), num(n), num(step), num(eff)});
  PeerRun two = parse_peer_output(kPeerLine);
  two.model = "tiny";
  const Table t = peer_table(s, sc, {one_process(8, 2.0, 1.0), one_process(16, 3.0, 1.6), two});
  // weak: 2 rows on 1 process, 4 on 2; strong: 2 on 1 process (batch 16), and the 2-process run
  // again (its batch per rank, 8, is the strong one's at n = 2).
  ASSERT_EQ(t.rows.size(), 12u);
  auto row = [&](const std::string& mode, int n, const std::string& peer) {
    for (size_t i = 0; i < t.rows.size(); ++i)
      if (t.at(i, "mode")->text == mode && t.at(i, "ranks")->num == n && t.at(i, "peer")->text == peer) return i;
    ADD_FAILURE() << mode << " " << n << " " << peer;
    return size_t(0);
  };
  const size_t c = row("weak", 2, "DDP bucket 50 MB, torch.compile, whole step");
  EXPECT_EQ(t.at(c, "strongest")->text, "*");
  EXPECT_NEAR(t.at(c, "peer_efficiency")->num, (16 / 1.25) / (2 * 8 / 1.0), 1e-12);  // against compile-step on 1
  EXPECT_EQ(t.at(c, "ours_variant")->text, "sharded-bf16");                           // 0.55 < 0.7 ms
  EXPECT_NEAR(t.at(c, "ratio")->num, 0.55 / 1.25, 1e-12);
  EXPECT_NEAR(t.at(row("weak", 2, "DDP bucket 50 MB, eager"), "peer_efficiency")->num, (16 / 2.2) / (2 * 8 / 2.0), 1e-12);
  EXPECT_EQ(t.at(row("weak", 2, "DDP bucket 25 MB, eager"), "strongest")->text, "");
  const size_t e = row("weak", 2, "DDP bucket 50 MB, torch.compile, model");
  EXPECT_TRUE(t.at(e, "peer_step_ms")->empty);
  EXPECT_TRUE(t.at(e, "ratio")->empty);
  EXPECT_NE(t.at(e, "note")->text.find("RuntimeError"), std::string::npos);
  // Strong: efficiency against 1 process at the whole global batch (16).
  EXPECT_NEAR(t.at(row("strong", 2, "DDP bucket 25 MB, eager"), "peer_efficiency")->num, (16 / 2.5) / (2 * 16 / 3.0), 1e-12);
  EXPECT_NEAR(t.at(row("strong", 1, "1 process, eager"), "ratio")->num, 0.9 / 3.0, 1e-12);
  EXPECT_EQ(t.at(row("weak", 1, "1 process, torch.compile, whole step"), "ours_variant")->text, "unsharded-fp32");
  Report r;
  r.tables = {t};
  size_t lines = 0;
  for (auto& f : findings(r)) lines += f.rfind("PyTorch, tiny", 0) == 0;
  EXPECT_EQ(lines, 4u);  // the strongest peer row of each mode and rank count
}

TEST(BenchPeer, SkippedWithAReasonWhereItCannotRun) {
  Harness h(fs::temp_directory_path() / "dpt-bench-unused");
  for (const char* run : {"gpu", "never"}) {
    h.s.ddp_run = run;
    std::vector<std::string> notes;
    EXPECT_TRUE(run_ddp_peer(h.cx, notes).empty());
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_NE(notes[0].find(std::string(run) == "gpu" ? "no GPU in use" : "ddp.run = never"), std::string::npos) << notes[0];
  }
  // ddp.run = always with an interpreter that does not exist: skipped on rank 0, named.
  h.s.ddp_run = "always";
  h.s.ddp_python = "/nonexistent/python3";
  h.s.ddp_script = std::string(DPT_SOURCE_DIR) + "/bench/torch_ddp.py";
  std::vector<std::string> notes;
  EXPECT_TRUE(run_ddp_peer(h.cx, notes).empty());
  if (world_rank() == 0) {
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_NE(notes[0].find("/nonexistent/python3 cannot import torch"), std::string::npos) << notes[0];
  }
}

TEST(BenchMeasure, ALayerListIsMeasuredLikeAnMlp) {
  Harness h(fs::temp_directory_path() / "dpt-bench-unused");
  h.s.models = parse_models("cnn@1,6,6:conv(4,3,pad=1) relu maxpool(2) flatten linear(4)");
  h.s.variants = {parse_variant("unsharded-fp32", "test"), parse_variant("sharded-fp32", "test")};
  const Table sc = measure_scaling(h.cx);
  const Table bk = measure_buckets(h.cx);
  if (world_rank() != 0) return;
  // n = 1, 2, 4 × weak, strong × 2 variants, every row the CNN's, with a step or "unresolved".
  ASSERT_EQ(sc.rows.size(), 12u);
  int resolved = 0;
  for (size_t i = 0; i < sc.rows.size(); ++i) {
    EXPECT_EQ(sc.at(i, "model")->text, "cnn");
    if (sc.at(i, "step_ms")->empty) {
      EXPECT_EQ(sc.at(i, "limit")->text.rfind("unresolved", 0), 0u);
      continue;
    }
    ++resolved;
    EXPECT_GT(sc.at(i, "step_ms")->num, 0);
    EXPECT_GT(sc.at(i, "compute_ms")->num, 0);
  }
  EXPECT_GT(resolved, 0);
  // Bucket sweep: n = 2 and 4, two sizes each; 1e-4 MB puts each layer in its own bucket.
  ASSERT_EQ(bk.rows.size(), 4u);
  EXPECT_EQ(bk.at(0, "model")->text, "cnn");
  EXPECT_EQ(bk.at(0, "buckets")->num, 2);
  EXPECT_EQ(bk.at(1, "buckets")->num, 1);
}

// A slow model's rows take fewer steps within the budget; a fast model's keep timed_steps. The
// rows say how many they took and the probe they came from.
TEST(BenchMeasure, TimeBudgetShortensASlowRowAndLeavesAFastOne) {
  Harness h(fs::temp_directory_path() / "dpt-bench-unused");
  h.s.max_ranks = 2;
  // fast: the tiny MLP (well under 1 ms a step); slow: 784-2048-2048-10 at 64 a rank, ~2.2 GFLOP
  // a step, 20 ms or more on one core, so the probe's 5 steps (100 ms) stand above the noise of
  // oversubscribed ranks (a probe lost in noise would leave the row its configured counts).
  h.s.models = parse_models("fast:12,16,8,4 slow/64,64:784,2048,2048,10");
  h.s.warmup_steps = 20;
  h.s.timed_steps = 50;
  h.s.min_timed_steps = 10;
  // Both budgets trip at 4 ms a step: 0.2 s / 50 timed steps, 0.08 s / 20 warm-up steps.
  h.s.timed_seconds = 0.2;
  h.s.warmup_seconds = 0.08;
  const Table sc = measure_scaling(h.cx);
  if (world_rank() != 0) return;
  ASSERT_EQ(sc.rows.size(), 8u);  // 2 models × n = 1, 2 × weak, strong
  for (size_t i = 0; i < sc.rows.size(); ++i) {
    const std::string m = sc.at(i, "model")->text;
    const std::string row = m + " " + sc.at(i, "mode")->text + " n=" + std::to_string(int(sc.at(i, "ranks")->num));
    ASSERT_FALSE(sc.at(i, "probe_ms")->empty) << row;
    const double probe = sc.at(i, "probe_ms")->num * 1e-3;
    const int timed = int(sc.at(i, "timed_steps")->num), warm = int(sc.at(i, "warmup_steps")->num);
    // The counts are the budget's arithmetic on the row's own probe.
    const StepCounts want = step_counts(h.s, probe);
    EXPECT_EQ(timed, want.timed) << row << ", probe " << probe;
    EXPECT_EQ(warm, want.warmup) << row << ", probe " << probe;
    if (m == "fast") {
      EXPECT_EQ(timed, 50) << row << ", probe " << probe;
      EXPECT_EQ(warm, 20) << row << ", probe " << probe;
    } else {
      EXPECT_GT(probe, 4e-3) << row;
      EXPECT_LT(timed, 50) << row << ", probe " << probe;
      EXPECT_GE(timed, 10) << row;
      EXPECT_LT(warm, 20) << row << ", probe " << probe;
      EXPECT_GE(warm, kMinWarmupSteps) << row;
    }
  }
}

TEST(BenchMeasure, ScalingBucketsAndReportOnCpuRanks) {
  const fs::path out = fs::temp_directory_path() / ("dpt-bench-" + std::to_string(getpid()));
  std::string dir = out.string();
  bcast_string(MPI_COMM_WORLD, dir);  // one folder, named by rank 0
  Harness h(dir);
  const Table sc = measure_scaling(h.cx);
  const Table ar = measure_allreduce(h.cx);
  const Table bk = measure_buckets(h.cx);
  Report r;
  r.machine = describe_machine(h.cx, "mpi");
  if (world_rank() != 0) return;
  // n = 1, 2, 4, weak and strong.
  ASSERT_EQ(sc.rows.size(), 6u);
  for (size_t i = 0; i < sc.rows.size(); ++i) {
    const int n = int(sc.at(i, "ranks")->num);
    const bool weak = sc.at(i, "mode")->text == "weak";
    EXPECT_EQ(sc.at(i, "global_batch")->num, weak ? 8.0 * n : 16.0);
    std::istringstream per(sc.at(i, "compute_per_rank_ms")->text);
    EXPECT_EQ(std::distance(std::istream_iterator<std::string>(per), std::istream_iterator<std::string>()), n);
    EXPECT_FALSE(sc.at(i, "limit")->text.empty());
    // The steps the row took: the budget's on its probe (a tiny model's: all 200 but on a stalled machine).
    ASSERT_FALSE(sc.at(i, "probe_ms")->empty);
    EXPECT_EQ(sc.at(i, "timed_steps")->num, step_counts(h.s, sc.at(i, "probe_ms")->num * 1e-3).timed);
    // A step time is a difference of two run lengths: on oversubscribed CPU ranks noise can
    // drown it, and then the row must say so instead of giving a figure.
    if (sc.at(i, "step_ms")->empty) {
      EXPECT_EQ(sc.at(i, "limit")->text.rfind("unresolved", 0), 0u) << sc.at(i, "limit")->text;
      EXPECT_TRUE(sc.at(i, "samples_per_s")->empty);
      continue;
    }
    EXPECT_GT(sc.at(i, "step_ms")->num, 0);
    if (n == 1) EXPECT_DOUBLE_EQ(sc.at(i, "efficiency")->num, 1.0);
  }
  // Efficiency is the ratio of the table's own throughputs.
  if (!sc.at(4, "samples_per_s")->empty && !sc.at(0, "samples_per_s")->empty)
    EXPECT_NEAR(sc.at(4, "efficiency")->num, sc.at(4, "samples_per_s")->num / (4 * sc.at(0, "samples_per_s")->num), 1e-12);
  // Two bucket sizes for n = 2 and n = 4, one marked best each.
  ASSERT_EQ(bk.rows.size(), 4u);
  EXPECT_EQ(bk.at(0, "buckets")->num, 3);  // 0.0001 MB: one bucket per layer
  EXPECT_EQ(bk.at(1, "buckets")->num, 1);
  EXPECT_EQ(int(bk.at(0, "best")->text == "*") + int(bk.at(1, "best")->text == "*"), 1);

  const auto fits = fit_allreduce(ar);
  ASSERT_EQ(fits.size(), 2u);
  const Table pr = predict_scaling(h.s, sc, fits);
  EXPECT_EQ(pr.rows.size(), 5u);  // n = 1 … 16
  r.settings = settings_text(h.s);
  r.tables = {sc, ar, alpha_beta_table(fits), pr, bk};
  r.findings = findings(r);
  EXPECT_GE(r.findings.size(), 4u);  // weak, strong, allreduce, a best bucket per rank count
  const auto files = write_report(h.s, r);
  for (const char* f : {"report.md", "records.csv", "records.json"}) EXPECT_TRUE(fs::exists(out / f)) << f;
  // records.json read back holds every table cell for cell (numbers to the last bit).
  std::string command, config;
  const Report back = report_from_json(slurp(out / "records.json"), command, config);
  EXPECT_EQ(command, h.s.command);
  ASSERT_EQ(back.tables.size(), r.tables.size());
  for (size_t k = 0; k < r.tables.size(); ++k) {
    EXPECT_EQ(back.tables[k].name, r.tables[k].name);
    EXPECT_EQ(back.tables[k].notes, r.tables[k].notes);
    ASSERT_EQ(back.tables[k].rows.size(), r.tables[k].rows.size());
    for (size_t i = 0; i < r.tables[k].rows.size(); ++i)
      for (size_t j = 0; j < r.tables[k].cols.size(); ++j) {
        const Cell &a = r.tables[k].rows[i][j], &b = back.tables[k].rows[i][j];
        EXPECT_EQ(a.empty, b.empty);
        if (a.empty) continue;
        EXPECT_EQ(a.is_num, b.is_num);
        if (a.is_num) EXPECT_EQ(a.num, b.num) << r.tables[k].cols[j].key;
        else EXPECT_EQ(a.text, b.text);
      }
  }
  EXPECT_EQ(back.machine.facts, r.machine.facts);
  // The plots report.md shows: drawn by bench/plot_scaling.py where python3 has matplotlib.
  const auto plots = plot_list(back);
  EXPECT_EQ(plots.size(), 4u);  // efficiency, throughput, busbw, step-vs-bucket
  const bool matplotlib = std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") == 0 ||
                          std::system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") == 0;
  for (auto& [file, title] : plots) {
    EXPECT_NE(slurp(out / "report.md").find("](" + file + ")"), std::string::npos) << file;
    if (matplotlib) EXPECT_TRUE(fs::exists(out / file)) << file;
  }

  // CSV: a header and one line per table row, every line with the header's field count.
  std::istringstream csv(slurp(out / "records.csv"));
  std::string header, line;
  std::getline(csv, header);
  size_t lines = 0;
  while (std::getline(csv, line)) {
    ++lines;
    EXPECT_EQ(csv_fields(line), csv_fields(header)) << line;
  }
  size_t rows = 0;
  for (auto& t : r.tables) rows += t.rows.size();
  EXPECT_EQ(lines, rows);
  // JSON parses (python's json module is the oracle when present).
  if (std::system("python3 -c 'import json' >/dev/null 2>&1") == 0) {
    const std::string cmd = "python3 -c \"import json,sys; d=json.load(open('" + (out / "records.json").string() +
                            "')); sys.exit(0 if len(d['tables']['scaling']['rows']) == 6 else 1)\"";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }
  if (matplotlib) {
    const std::string svg = slurp(out / "efficiency-vs-ranks.svg");
    EXPECT_NE(svg.find("<svg"), std::string::npos);
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
    EXPECT_NE(svg.find("weak tiny"), std::string::npos);  // the legend names the series
  } else {
    EXPECT_NE(slurp(out / "report.md").find("plots not drawn"), std::string::npos);
  }
  const std::string md = slurp(out / "report.md");
  EXPECT_NE(md.find("CPU ranks"), std::string::npos);
  EXPECT_NE(md.find("![Scaling efficiency vs ranks](efficiency-vs-ranks.svg)"), std::string::npos);
  // The stdout table: a title, a header, a units row, then the rows.
  std::istringstream tab(format_table(sc));
  std::getline(tab, line);
  std::getline(tab, line);
  EXPECT_NE(line.find("step"), std::string::npos);
  std::getline(tab, line);
  EXPECT_NE(line.find("(ms)"), std::string::npos);
  EXPECT_EQ(md.find("Incomplete"), std::string::npos);

  // Before a section: the report so far, marked as written when it started, with the cut-short
  // version beside it for a signal to put in place; the final report removes those.
  write_partial_report(h.s, r, "grid", {"scaling", "allreduce", "buckets"});
  const std::string partial = slurp(out / "report.md"), cut = slurp(out / ".report.md.cut");
  EXPECT_NE(partial.find("> **Incomplete**: " + running_status("grid", {"scaling", "allreduce", "buckets"})),
            std::string::npos) << partial;
  EXPECT_NE(cut.find("> **Incomplete**: cut short by a signal"), std::string::npos) << cut;
  EXPECT_NE(cut.find("during the grid section. The tables are the sections finished before it (scaling, allreduce, buckets)"),
            std::string::npos) << cut;
  EXPECT_NE(cut.find("## " + sc.title), std::string::npos);
  std::string c2, f2;
  EXPECT_EQ(report_from_json(slurp(out / ".records.json.cut"), c2, f2).status, cut_short_status("grid", {"scaling", "allreduce", "buckets"}));
  EXPECT_EQ(report_from_json(slurp(out / "records.json"), c2, f2).tables.size(), r.tables.size());
  begin_final_report(h.s);
  EXPECT_FALSE(fs::exists(out / ".report.md.cut"));
  EXPECT_FALSE(fs::exists(out / ".records.json.cut"));
  write_report(h.s, r);
  end_final_report();
  EXPECT_TRUE(report_from_json(slurp(out / "records.json"), c2, f2).status.empty());
  EXPECT_EQ(slurp(out / "report.md").find("Incomplete"), std::string::npos);
  fs::remove_all(out);
}
