// bench-scaling's harness on CPU ranks (4, oversubscribed): subsets and their communicators,
// the arithmetic against hand-computed values (efficiency, nccl-tests' busbw, bucket layout,
// alpha-beta fit, limiting factor), the measurements on a tiny model (allreduce results exact,
// one row per subset), and the report files written and well formed.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dpt/app.hpp"
#include "dpt/bench.hpp"

using namespace dpt;
using namespace dpt::bench;
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

TEST(BenchArithmetic, BucketsFollowTheTrainersLayout) {
  // Layers 12-16-8-4: fc0 = 13·16 = 208, fc1 = 17·8 = 136, fc2 = 9·4 = 36 parameters.
  EXPECT_EQ(param_count({12, 16, 8, 4}), 380u);
  EXPECT_EQ(bucket_elements({12, 16, 8, 4}, 1e-9), (std::vector<size_t>{36, 136, 208}));
  EXPECT_EQ(bucket_elements({12, 16, 8, 4}, 100 * 4.0 / (1 << 20)), (std::vector<size_t>{172, 208}));
  EXPECT_EQ(bucket_elements({12, 16, 8, 4}, 1), (std::vector<size_t>{380}));
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
  EXPECT_EQ(limiting_factor(10e-3, 8e-3, 1e-3, 0, 1e-3, 1e-5), "compute-bound (80%)");
  EXPECT_EQ(limiting_factor(10e-3, 3e-3, 1e-3, 0, 6e-3, 1e-5), "communication (exposed 60%)");
  EXPECT_EQ(limiting_factor(10e-3, 2e-3, 5e-3, 3e-3, 0, 1e-5), "data (50%)");
  EXPECT_EQ(limiting_factor(10e-3, 3e-3, 0, 7e-3, 0, 1e-5), "imbalance (70%)");
  EXPECT_EQ(limiting_factor(20e-6, 20e-6, 0, 0, 0, 50e-6), "launch/latency-bound");
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
    EXPECT_GT(sc.at(i, "step_ms")->num, 0);
    if (n == 1) EXPECT_DOUBLE_EQ(sc.at(i, "efficiency")->num, 1.0);
    std::istringstream per(sc.at(i, "compute_per_rank_ms")->text);
    EXPECT_EQ(std::distance(std::istream_iterator<std::string>(per), std::istream_iterator<std::string>()), n);
    EXPECT_FALSE(sc.at(i, "limit")->text.empty());
  }
  // Efficiency is the ratio of the table's own throughputs.
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
  for (const char* f : {"report.md", "records.csv", "records.json", "efficiency-vs-ranks.svg", "busbw-vs-size.svg",
                        "throughput-vs-ranks.svg", "step-vs-bucket.svg"})
    EXPECT_TRUE(fs::exists(out / f)) << f;

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
  const std::string svg = slurp(out / "efficiency-vs-ranks.svg");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("weak tiny"), std::string::npos);
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
  fs::remove_all(out);
}
