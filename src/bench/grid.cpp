// The batch-size / learning-rate grid: the real dataset, the real loop on the largest subset,
// each setting trained to the same budget in epochs; accuracy over time read back from the
// metrics JSON Lines that rank 0 writes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "dpt/bench.hpp"
#include "dpt/check.hpp"
#include "dpt/log.hpp"
#include "dpt/train.hpp"

namespace dpt::bench {
namespace {

namespace fs = std::filesystem;

// The number after "key": in a JSON line, or NaN.
double json_number(const std::string& line, const std::string& key) {
  const auto p = line.find("\"" + key + "\":");
  if (p == std::string::npos) return NAN;
  return std::strtod(line.c_str() + p + key.size() + 3, nullptr);
}

struct Curve {
  std::vector<std::pair<int64_t, double>> evals;  // step, accuracy
  std::vector<std::pair<int64_t, double>> times;  // step, time_s
};

Curve read_metrics(const std::string& path) {
  Curve c;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto step = int64_t(json_number(line, "step"));
    if (line.find("\"eval\"") != std::string::npos) c.evals.push_back({step, json_number(line, "accuracy")});
    else c.times.push_back({step, json_number(line, "time_s")});
  }
  return c;
}

double time_at(const Curve& c, int64_t step) {
  for (auto& [s, t] : c.times)
    if (s == step) return t;
  return NAN;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct GridRun {
  int B, b, warm;
  std::string rule;
};

// One grid cell on `comm`; rank 0 returns its row.
std::vector<Cell> run_cell(Context& cx, Comm& comm, const GridRun& g, const Dataset& train, const Dataset& test,
                           const std::string& metrics) {
  const Settings& s = *cx.s;
  Config c = s.base;
  c.batch_per_rank = g.b;
  c.accumulate = 1;
  c.lr_scaling = g.rule;
  const int64_t per_epoch = train.n / g.B;
  const int64_t total = std::max<int64_t>(1, int64_t(std::llround(s.grid_epochs * double(per_epoch))));
  c.epochs = int(std::ceil(s.grid_epochs));
  c.steps = total;
  c.warmup_steps = g.warm ? std::max<int64_t>(1, std::llround(s.warmup_epochs * double(per_epoch))) : 0;
  c.eval_every = std::max<int64_t>(1, total / s.grid_evals);
  c.log_every = c.eval_every;
  c.metrics_file = metrics;
  c.progress = false;
  c.ckpt_dir.clear();
  c.ckpt_at_start = false;
  c.resume = "none";
  c.on_nonfinite = "stop";
  if (cx.rank == 0) fs::remove(metrics);
  std::string status = "ok";
  double seconds = NAN, eval_s = NAN;
  {
    Trainer t(c, *cx.be, comm, &train, &test);
    log::set_quiet(true);  // the Trainer's evaluation lines; the grid prints one line per run
    try {
      seconds = t.run().seconds;
      log::set_quiet(false);
    } catch (const Error& e) {
      log::set_quiet(false);
      if (e.code() != kExitNonFinite || !e.collective()) throw;
      status = "diverged";  // every rank threw together: safe to go on
    }
    // Evaluations timed alone (median of 3), so time-to-target and throughput can leave the
    // evaluations the run made out.
    std::vector<double> ev;
    for (int i = 0; i < 3; ++i) {
      DPT_CHECK_MPI(MPI_Barrier(comm.mpi()));
      const auto t0 = std::chrono::steady_clock::now();
      t.evaluate(test);
      double e = seconds_since(t0);
      DPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &e, 1, MPI_DOUBLE, MPI_MAX, comm.mpi()));
      ev.push_back(e);
    }
    eval_s = stat_of(ev).med;
  }
  if (cx.rank != 0) return {};
  const Curve cv = read_metrics(metrics);
  double final_acc = NAN, best = NAN, t_target = NAN;
  int64_t s_target = -1;
  for (size_t i = 0; i < cv.evals.size(); ++i) {
    const auto [step, acc] = cv.evals[i];
    final_acc = acc;
    best = std::isnan(best) ? acc : std::max(best, acc);
    // The step line at an eval's step is written before that evaluation: i evaluations precede it.
    if (s_target < 0 && acc >= s.target_accuracy) s_target = step, t_target = time_at(cv, step) - double(i) * eval_s;
  }
  const double train_s = seconds - double(cv.evals.size()) * eval_s;
  if (!(t_target > 0)) t_target = NAN;  // noise in the eval estimate can push it below zero
  const double scale = g.rule == "linear" ? double(g.B) / (c.base_batch ? c.base_batch : g.b)
                       : g.rule == "sqrt" ? std::sqrt(double(g.B) / (c.base_batch ? c.base_batch : g.b))
                                          : 1.0;
  return {num(g.B), num(g.b), txt(g.rule), txt(g.warm ? "on" : "off"), num(c.lr * scale), num(double(total)),
          num(final_acc), num(best), num(t_target),
          s_target > 0 ? num(double(s_target)) : none(), train_s > 0 ? num(double(total * g.B) / train_s) : none(),
          num(eval_s * 1e3), txt(status)};
}

}  // namespace

Table measure_grid(Context& cx, std::vector<std::string>& notes) {
  const Settings& s = *cx.s;
  char target[64];
  std::snprintf(target, sizeof target, "%.3g", s.target_accuracy);
  Table t{"grid", std::string("Batch size x learning-rate rule x warm-up, ") + "trained to the same budget in epochs",
          {{"global_batch", "global", "samples", "%.0f"},
           {"batch_per_rank", "b/rank", "samples", "%.0f"},
           {"lr_scaling", "lr rule", "", ""},
           {"warmup", "warm-up", "", ""},
           {"peak_lr", "peak lr", "", "%.4g"},
           {"steps", "steps", "", "%.0f"},
           {"final_accuracy", "final acc", "", "%.4f"},
           {"best_accuracy", "best acc", "", "%.4f"},
           {"time_to_target_s", "t->target", "s", "%.2f"},
           {"steps_to_target", "steps->tgt", "", "%.0f"},
           {"samples_per_s", "throughput", "samples/s", "%.0f"},
           {"eval_ms", "eval", "ms", "%.1f"},
           {"status", "status", "", ""}},
          {},
          {}};
  if (!s.grid) {
    notes.push_back("grid: disabled (grid.enabled = false)");
    return t;
  }
  // Every rank checks the files alike, so a missing dataset skips the grid everywhere.
  std::string missing;
  for (const std::string& f : {s.base.train_file, s.base.test_file})
    if (!fs::exists(f)) missing += (missing.empty() ? "" : ", ") + f;
  if (!missing.empty()) {
    notes.push_back("grid: skipped, dataset not found: " + missing + " (make it with ./dpdata fashion-mnist --out-dir data)");
    log::warn(notes.back());
    return t;
  }
  const Dataset train = load_dataset(s.base.train_file), test = load_dataset(s.base.test_file);
  const int n = subset_sizes(cx.size, s.max_ranks).back();
  SubComm sub(cx.world, n);
  if (sub.member()) {
    auto comm = subset_comm(cx, sub.get());
    fs::create_directories(fs::path(s.out_dir) / "grid-metrics");
    for (int B : s.grid_batches) {
      if (B % n != 0 || B > train.n) {
        if (cx.rank == 0) notes.push_back("grid: global batch " + std::to_string(B) + " skipped (not a multiple of " + std::to_string(n) + " ranks, or larger than the training set)");
        continue;
      }
      for (const std::string& rule : s.grid_rules)
        for (int warm : s.grid_warmup) {
          const GridRun g{B, B / n, warm, rule};
          const std::string m = (fs::path(s.out_dir) / "grid-metrics" /
                                 ("B" + std::to_string(B) + "-" + rule + (warm ? "-warmup" : "") + ".jsonl")).string();
          auto row = run_cell(cx, *comm, g, train, test, m);
          if (cx.rank == 0) {
            char acc[32];
            std::snprintf(acc, sizeof acc, "%.4f", row[6].num);
            log::info("grid: B=" + std::to_string(B) + " " + rule + (warm ? " warm-up" : "") + ": final accuracy " + acc +
                      " (" + row[12].text + ")");
            t.rows.push_back(std::move(row));
          }
        }
    }
  }
  idle_barrier(cx.world);
  t.notes = {"dataset: " + s.base.train_file + " / " + s.base.test_file + ", " + std::to_string(n) + " rank(s), model " +
                 [&] { std::string l; for (size_t i = 0; i < s.base.layers.size(); ++i) l += (i ? "," : "") + std::to_string(s.base.layers[i]); return l; }() +
                 ", optimizer " + s.base.optimizer + ", base lr " + std::to_string(s.base.lr) + " at base_batch " +
                 std::to_string(s.base.base_batch) + ", schedule " + s.base.schedule + ".",
             "budget: " + std::to_string(s.grid_epochs) + " epoch(s) per run; warm-up on = " + std::to_string(s.warmup_epochs) +
                 " epoch(s) of linear ramp; evaluations every ~1/" + std::to_string(s.grid_evals) + " of the run.",
             std::string("t->target: training seconds until the first evaluation at or above accuracy ") + target +
                 " (evaluation time taken out, using the separately timed eval); empty = not reached.",
             "throughput: samples / (loop seconds - evaluations x eval); per-run metrics in grid-metrics/*.jsonl."};
  return t;
}

}  // namespace dpt::bench
