// bench-scaling's time-to-target arithmetic on fixed inputs: the crossing interpolated between
// evaluations, evaluations taken out of the training clock, log-log interpolation, the fastest
// batch, the step model beyond the measured ranks, the critical-batch and time-to-target tables.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>
#include <tuple>

#include "dpt/scaling.hpp"

using namespace dpt;
using namespace dpt::scaling;

// ---- time to accuracy: the arithmetic on fixed inputs ----------------------------------------

TEST(BenchTimeToTarget, CrossingIsInterpolatedBetweenEvaluations) {
  // Evaluations at steps 10, 20, 30 (accuracy 0.6, 0.8, 0.9) after 1, 2, 3 s of training.
  const std::vector<EvalPoint> ev{{10, 0.6, 1.0}, {20, 0.8, 2.0}, {30, 0.9, 3.0}};
  Crossing c = first_crossing(ev, 0.85);  // halfway from 20 to 30
  EXPECT_TRUE(c.reached);
  EXPECT_DOUBLE_EQ(c.step, 25);
  EXPECT_DOUBLE_EQ(c.seconds, 2.5);
  c = first_crossing(ev, 0.8);  // met exactly at an evaluation
  EXPECT_DOUBLE_EQ(c.step, 20);
  c = first_crossing(ev, 0.5);  // already there at the first evaluation: that one, an upper bound
  EXPECT_DOUBLE_EQ(c.step, 10);
  EXPECT_DOUBLE_EQ(c.seconds, 1.0);
  c = first_crossing(ev, 0.95);  // never
  EXPECT_FALSE(c.reached);
  EXPECT_TRUE(std::isnan(c.step));
  // A dip after the crossing does not matter: the first crossing counts.
  c = first_crossing({{10, 0.9, 1}, {20, 0.7, 2}, {30, 0.95, 3}}, 0.85);
  EXPECT_DOUBLE_EQ(c.step, 10);
  EXPECT_DOUBLE_EQ(epochs_of(25, 2400, 60000), 1.0);
}

TEST(BenchTimeToTarget, EvaluationsAreTakenOutOfTheTrainingClock) {
  // Step 10 logged at 1.0 s, its evaluation ends at 1.5 s; step 20 at 2.5 s, evaluation to 2.7 s;
  // step 30 at 3.7 s, its evaluation without time_s (eval_s = 0.4 s is used for it).
  const std::string m =
      "{\"step\": 10, \"epoch\": 1, \"loss\": 1.0, \"lr\": 0.1, \"samples_per_s\": 1, \"time_s\": 1.000}\n"
      "{\"eval\": \"test\", \"step\": 10, \"epoch\": 1, \"loss\": 0.9, \"accuracy\": 0.6, \"time_s\": 1.500}\n"
      "{\"step\": 20, \"epoch\": 1, \"loss\": 0.8, \"lr\": 0.1, \"samples_per_s\": 1, \"time_s\": 2.500}\n"
      "{\"eval\": \"test\", \"step\": 20, \"epoch\": 1, \"loss\": 0.7, \"accuracy\": 0.8, \"time_s\": 2.700}\n"
      "not json\n"
      "{\"step\": 30, \"epoch\": 1, \"loss\": 0.6, \"lr\": 0.1, \"samples_per_s\": 1, \"time_s\": 3.700}\n"
      "{\"eval\": \"test\", \"step\": 30, \"epoch\": 1, \"loss\": 0.5, \"accuracy\": 0.9}\n";
  double total = 0;
  const auto ev = evals_from_metrics(m, 0.4, total);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_DOUBLE_EQ(ev[0].seconds, 1.0);
  EXPECT_DOUBLE_EQ(ev[1].seconds, 2.0);        // 2.5 − 0.5
  EXPECT_NEAR(ev[2].seconds, 3.0, 1e-12);      // 3.7 − 0.5 − 0.2
  EXPECT_NEAR(total, 0.5 + 0.2 + 0.4, 1e-12);  // the last one's from eval_s
  EXPECT_DOUBLE_EQ(ev[1].accuracy, 0.8);
  const Crossing c = first_crossing(ev, 0.7);
  EXPECT_DOUBLE_EQ(c.step, 15);
  EXPECT_DOUBLE_EQ(c.seconds, 1.5);
}

TEST(BenchTimeToTarget, LogLogInterpolation) {
  const std::vector<std::pair<double, double>> pts{{64, 1e-3}, {256, 4e-3}, {1024, 4e-3}};
  EXPECT_DOUBLE_EQ(interp_loglog(pts, 64), 1e-3);
  EXPECT_NEAR(interp_loglog(pts, 128), 2e-3, 1e-15);  // a power law between 64 and 256
  EXPECT_NEAR(interp_loglog(pts, 512), 4e-3, 1e-15);
  EXPECT_TRUE(std::isnan(interp_loglog(pts, 32)));    // no extrapolation
  EXPECT_TRUE(std::isnan(interp_loglog(pts, 2048)));
  EXPECT_TRUE(std::isnan(interp_loglog({{64, 0.0}, {256, 1.0}}, 128)));  // log of 0
}

namespace {

// A grid of fixed rows: variant "a" reaches the target at every batch but 1024 (not reached);
// "b" diverges at 256.
Table fixed_grid() {
  Table g{"grid", "", {{"variant", "", "", ""}, {"optimizer", "", "", ""}, {"global_batch", "", "", "%.0f"},
                       {"steps_to_target", "", "", "%.1f"}, {"epochs_to_target", "", "", "%.2f"}, {"status", "", "", ""}}, {}, {}};
  auto row = [&](const char* v, double B, double steps, const char* status) {
    const bool hit = std::string(status) == "ok";
    g.rows.push_back({txt(v), txt("sgd"), num(B), hit ? num(steps) : none(), hit ? num(epochs_of(steps, B, 6400)) : none(),
                      txt(status)});
  };
  row("a", 64, 400, "ok");    // 4 epochs
  row("a", 128, 220, "ok");   // 4.4
  row("a", 256, 150, "ok");   // 6
  row("a", 512, 100, "ok");   // 8 (2x of 4)
  row("a", 1024, 0, "not reached");
  row("b", 64, 500, "ok");    // 5
  row("b", 256, 0, "diverged");
  return g;
}

Table fixed_steps() {
  Table t{"steps", "", {{"optimizer", "", "", ""}, {"ranks", "", "", "%.0f"}, {"batch_per_rank", "", "", "%.0f"},
                        {"step_ms", "", "", "%.4f"}}, {}, {}};
  // One rank: 1 ms up to b = 128, then proportional to b; two ranks: 1 ms more.
  for (double b : {32.0, 64.0, 128.0, 256.0, 512.0, 1024.0}) t.rows.push_back({txt("sgd"), num(1), num(b), num(std::max(1.0, b / 128))});
  for (double b : {32.0, 64.0, 128.0, 256.0}) t.rows.push_back({txt("sgd"), num(2), num(b), num(std::max(1.0, b / 128) + 1)});
  return t;
}

}  // namespace

TEST(BenchTimeToTarget, FastestBatchSkipsUnreachedAndDivergedRuns) {
  const Table g = fixed_grid(), st = fixed_steps();
  const StepTime measured = step_model(st, "sgd", nullptr, 0);
  // One rank: steps × step = 400, 220, 150 × 2, 100 × 4 ms: 128 wins (0.22 s); 1024 is not reached.
  TtaPoint p = fastest_to_target(g, "a", 1, 1, measured);
  ASSERT_TRUE(p.found);
  EXPECT_EQ(p.global_batch, 128);
  EXPECT_NEAR(p.seconds, 0.220, 1e-12);
  EXPECT_NEAR(p.epochs, 4.4, 1e-12);
  // Two ranks: B/2 = 32 … 256 cost 2, 2, 2, 3 ms: 256 (150 × 2 ms) wins over 128 (220 × 2).
  p = fastest_to_target(g, "a", 2, 1, measured);
  EXPECT_EQ(p.global_batch, 256);
  EXPECT_NEAR(p.seconds, 0.300, 1e-12);
  EXPECT_EQ(fastest_to_target(g, "a", 2, 100, measured).global_batch, 256);  // b ≥ 100 only
  // "b": its diverged batch is never chosen.
  p = fastest_to_target(g, "b", 1, 1, measured);
  EXPECT_EQ(p.global_batch, 64);
  // Four ranks: nothing measured and no ring model: no answer.
  EXPECT_FALSE(fastest_to_target(g, "a", 4, 1, measured).found);
}

TEST(BenchTimeToTarget, StepModelAddsTheRingBeyondTheMeasuredRanks) {
  const Table st = fixed_steps();
  RingModel ring;
  ring.hop_latency = 10e-6;
  ring.bus_bw = 1e9;
  const StepTime f = step_model(st, "sgd", &ring, 1e6);
  EXPECT_DOUBLE_EQ(f(2, 256), 3e-3);  // measured: the table wins
  // Four ranks at b = 128: two ranks' 2 ms + ring(1 MB, 4) − ring(1 MB, 2) =
  // (6 hops × 10 us + 1.5 × 1e6 / 1e9 s) − (2 hops × 10 us + 1e6 / 1e9 s).
  EXPECT_NEAR(f(4, 128), 2e-3 + (60e-6 + 1.5e-3) - (20e-6 + 1e-3), 1e-12);
  // b = 96 did not run on two ranks: their curve, interpolated (2 ms at 64 and 128), + the extra.
  EXPECT_NEAR(f(8, 96), 2e-3 + ring.seconds(1e6, 8) - ring.seconds(1e6, 2), 1e-12);
  EXPECT_NEAR(f(8, 192), interp_loglog({{128, 2e-3}, {256, 3e-3}}, 192) + ring.seconds(1e6, 8) - ring.seconds(1e6, 2), 1e-12);
  EXPECT_TRUE(std::isnan(f(4, 1024)));  // beyond the two-rank curve (it ran up to 256): unknown
  // One measured count only: its (one-rank) curve + the whole ring, ring(1) being 0.
  Table one = st;
  one.rows.resize(6);
  EXPECT_NEAR(step_model(one, "sgd", &ring, 1e6)(4, 1024), 8e-3 + ring.seconds(1e6, 4), 1e-12);
  EXPECT_TRUE(std::isnan(f(2, 96)));    // inside the measured ranks: only what was measured
  EXPECT_TRUE(step_measured(st, "sgd", 2, 64));
  EXPECT_FALSE(step_measured(st, "sgd", 4, 64));
  EXPECT_FALSE(step_measured(st, "adam", 1, 64));  // per optimizer
}

TEST(BenchTimeToTarget, CriticalBatchAndTimeToTargetTables) {
  const Table c = critical_batch_table(fixed_grid());
  ASSERT_EQ(c.rows.size(), 2u);
  EXPECT_EQ(c.at(0, "variant")->text, "a");
  EXPECT_DOUBLE_EQ(c.at(0, "epochs_at_smallest")->num, 4);
  EXPECT_DOUBLE_EQ(c.at(0, "largest_batch_2x")->num, 512);  // 8 epochs = 2 × 4
  EXPECT_EQ(c.at(0, "reached")->text, "4 of 5");
  EXPECT_DOUBLE_EQ(c.at(1, "diverged")->num, 1);

  Settings s;
  s.predict_max_ranks = 4;
  GridResult g{fixed_grid(), fixed_steps(), Table{"check", "", {{"variant", "", "", ""}, {"ranks", "", "", ""},
                                                               {"global_batch", "", "", ""}, {"measured_s", "", "", ""}}, {}, {}}};
  g.params = 250000;  // 1 MB of gradient
  g.check.rows.push_back({txt("a"), num(2), num(256), num(0.33)});
  const std::vector<AlphaBeta> fits{{2, 20e-6, 1e-9, 0, 5}};  // α 20 us, 1 GB/s; hop 10 us, busbw 1 GB/s
  const Table t = time_to_target_table(s, g, fits);
  // n = 1, 2, 4 for "a" and "b" ("b" at n = 2 and 4: B = 64 split, 32/rank measured at n = 2 only).
  auto row = [&](const std::string& v, int n) {
    for (size_t i = 0; i < t.rows.size(); ++i)
      if (t.at(i, "variant")->text == v && int(t.at(i, "ranks")->num) == n) return i;
    return t.rows.size();
  };
  const size_t a1 = row("a", 1), a2 = row("a", 2), a4 = row("a", 4);
  ASSERT_LT(a4, t.rows.size());
  EXPECT_NEAR(t.at(a1, "predicted_s")->num, 0.220, 1e-12);
  EXPECT_NEAR(t.at(a2, "predicted_s")->num, 0.300, 1e-12);
  EXPECT_NEAR(t.at(a2, "speedup")->num, 0.220 / 0.300, 1e-12);
  EXPECT_DOUBLE_EQ(t.at(a2, "measured_s")->num, 0.33);  // the check run of the same batch
  EXPECT_EQ(t.at(a2, "step_source")->text, "measured");
  // Four ranks: the two-rank step at B/4 + the ring's extra 0.54 ms: B = 512 → 100 × 2.54 ms.
  EXPECT_EQ(t.at(a4, "step_source")->text, "model");
  EXPECT_EQ(t.at(a4, "global_batch")->num, 512);
  EXPECT_NEAR(t.at(a4, "predicted_s")->num, 100 * (2e-3 + 0.54e-3), 1e-9);
  // One "*" per rank count, on the fastest variant there.
  for (int n : {1, 2, 4}) {
    int stars = 0;
    for (size_t i = 0; i < t.rows.size(); ++i) stars += int(t.at(i, "ranks")->num) == n && t.at(i, "best")->text == "*";
    EXPECT_EQ(stars, 1) << n;
  }
  EXPECT_EQ(t.at(a1, "best")->text, "*");  // 0.22 s beats b's 64 × … = 0.5 s
}

