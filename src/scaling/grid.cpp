// The batch-size / learning-rate grid and its time-to-target runs. On the first rank alone: every
// optimizer × lr rule × warm-up × global batch, trained on the real dataset to the same budget
// (epochs, at least grid.min_steps steps), accuracy over time read back from the metrics JSON
// Lines rank 0 writes; a per-rank batch beyond grid.max_batch_per_rank is reached with
// train.accumulate. On every subset: the step time of each per-rank batch (two run lengths'
// difference). Then the setting predicted fastest to the target on the most ranks is trained
// on every subset and its time to target measured.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "dpt/scaling.hpp"
#include "dpt/check.hpp"
#include "dpt/log.hpp"
#include "dpt/train.hpp"

namespace dpt::scaling {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Variant {
  std::string optimizer, rule, name;
  double lr = 0;
  bool warm = false;
};

std::vector<Variant> variants(const Settings& s) {
  std::vector<std::string> entries = s.grid_optimizers;
  if (entries.empty()) {
    char lr[32];
    std::snprintf(lr, sizeof lr, "%g", s.grid_base.lr);
    entries.push_back(s.grid_base.optimizer + ":" + lr);
  }
  std::vector<Variant> out;
  for (const std::string& e : entries) {
    const auto c = e.find(':');
    const std::string opt = e.substr(0, c);
    const double lr = std::stod(e.substr(c + 1));
    // Named by the entry as written (optimizer:lr), so one optimizer may appear with two lrs.
    for (const std::string& rule : s.grid_rules)
      for (int warm : s.grid_warmup) out.push_back({opt, rule, variant_name(e, rule, warm != 0), lr, warm != 0});
  }
  return out;
}

// Global batch B on n ranks: b per micro-batch, `acc` micro-batches (b ≤ max_b).
struct Shape {
  int n = 1, B = 0, b = 0, acc = 1;
  bool ok = false;
};
Shape shape_for(int B, int n, int max_b) {
  Shape sh{n, B, B / n, 1, B % n == 0};
  while (sh.ok && sh.b > max_b && sh.b % 2 == 0) sh.b /= 2, sh.acc *= 2;
  sh.ok = sh.ok && sh.b <= max_b && sh.b > 0;
  return sh;
}

struct Outcome {
  std::string status = "ok";
  double final_acc = NAN, best = NAN, train_s = NAN, eval_s = NAN, peak_lr = NAN;
  int64_t total = 0;
  Crossing cross;
};

// One training run of `v` at shape sh on comm; the outcome is complete on comm's rank 0.
Outcome train_run(const Settings& s, Backend& be, Comm& comm, const Variant& v, const Shape& sh,
                  const Dataset& train, const Dataset& test, const std::string& metrics) {
  Config c = s.grid_base;
  c.optimizer = v.optimizer;
  c.lr = v.lr;
  c.lr_scaling = v.rule;
  c.batch_per_rank = sh.b;
  c.accumulate = sh.acc;
  if (c.base_batch == 0) c.base_batch = s.grid_batches.front();
  const int64_t per_epoch = train.n / sh.B;
  Outcome o;
  o.total = std::max<int64_t>(s.grid_min_steps, int64_t(std::ceil(s.grid_epochs * double(train.n) / sh.B)));
  c.epochs = int((o.total + per_epoch - 1) / per_epoch);
  c.steps = o.total;
  const int64_t warm = std::max<int64_t>({1, s.grid_warmup_min_steps, std::llround(s.warmup_epochs * double(train.n) / sh.B)});
  c.warmup_steps = v.warm ? std::min(warm, o.total) : 0;
  c.eval_every = std::max<int64_t>(1, o.total / s.grid_evals);
  c.log_every = c.eval_every;
  c.metrics_file = metrics;
  c.progress = false;
  c.ckpt_dir.clear();
  c.ckpt_at_start = false;
  c.resume = "none";
  c.on_nonfinite = "stop";
  const bool root = comm.rank() == 0;
  if (root) fs::remove(metrics);
  double seconds = NAN;
  {
    std::unique_ptr<Trainer> owned;
    {
      QuietInfo quiet;  // the model table: printed once, when the grid starts
      owned = std::make_unique<Trainer>(c, be, comm, &train, &test);
    }
    Trainer& t = *owned;
    o.peak_lr = LrSchedule(c, comm.size(), per_epoch, o.total).peak();
    log::set_quiet(true);  // the Trainer's evaluation lines; the grid prints one line per run
    try {
      seconds = t.run().seconds;
      log::set_quiet(false);
    } catch (const Error& e) {
      log::set_quiet(false);
      if (e.code() != kExitNonFinite || !e.collective()) throw;
      o.status = "diverged";  // every rank threw together: safe to go on
    }
    // Evaluations timed alone (median of 3), to take them out of the run's clock.
    std::vector<double> ev;
    for (int i = 0; i < 3; ++i) {
      DPT_CHECK_MPI(MPI_Barrier(comm.mpi()));
      const auto t0 = Clock::now();
      t.evaluate(test);
      double e = seconds_since(t0);
      DPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &e, 1, MPI_DOUBLE, MPI_MAX, comm.mpi()));
      ev.push_back(e);
    }
    o.eval_s = stat_of(ev).med;
  }
  if (!root) return o;
  std::ifstream in(metrics);
  std::ostringstream text;
  text << in.rdbuf();
  double eval_total = 0;
  const std::vector<EvalPoint> evals = evals_from_metrics(text.str(), o.eval_s, eval_total);
  for (const EvalPoint& e : evals) {
    o.final_acc = e.accuracy;
    o.best = std::isnan(o.best) ? e.accuracy : std::max(o.best, e.accuracy);
  }
  o.train_s = seconds - eval_total;
  o.cross = first_crossing(evals, s.target_accuracy);
  return o;
}

const std::vector<Column> kGridCols = {
    {"variant", "variant", "", ""},
    {"optimizer", "optimizer", "", ""},
    {"lr_scaling", "lr rule", "", ""},
    {"warmup", "warm-up", "", ""},
    {"global_batch", "global", "samples", "%.0f"},
    {"batch_per_rank", "b/rank", "samples", "%.0f"},
    {"accumulate", "acc", "", "%.0f"},
    {"peak_lr", "peak lr", "", "%.4g"},
    {"steps", "steps", "", "%.0f"},
    {"epochs", "epochs", "", "%.2f"},
    {"final_accuracy", "final acc", "", "%.4f"},
    {"best_accuracy", "best acc", "", "%.4f"},
    {"steps_to_target", "steps->tgt", "", "%.1f"},
    {"epochs_to_target", "epochs->tgt", "", "%.3f"},
    {"time_to_target_s", "t->target", "s", "%.3f"},
    {"samples_per_s", "throughput", "samples/s", "%.0f"},
    {"eval_ms", "eval", "ms", "%.1f"},
    {"status", "status", "", ""},
};

std::vector<Cell> grid_row(const Variant& v, const Shape& sh, const Outcome& o, double rows) {
  const bool hit = o.cross.reached && o.status == "ok";
  return {txt(v.name), txt(v.optimizer), txt(v.rule), txt(v.warm ? "on" : "off"), num(sh.B), num(sh.b), num(sh.acc),
          num(o.peak_lr), num(double(o.total)), num(epochs_of(double(o.total), sh.B, rows)), num(o.final_acc), num(o.best),
          hit ? num(o.cross.step) : none(), hit ? num(epochs_of(o.cross.step, sh.B, rows)) : none(),
          hit ? num(o.cross.seconds) : none(),
          o.train_s > 0 && o.status == "ok" ? num(double(o.total) * sh.B / o.train_s) : none(), num(o.eval_s * 1e3),
          txt(o.status == "ok" && !o.cross.reached ? "not reached" : o.status)};
}

// This subset's slowest rank's seconds per step at shape sh: (t(W+S) − t(W)) / S in fresh
// Trainers on the training set, median of repeats; W and S within the [scaling] budgets.
double step_seconds(const Settings& s, Backend& be, Comm& comm, const Variant& v, const Shape& sh, const Dataset& train,
                    StepCounts& k) {
  Config c = s.grid_base;
  c.optimizer = v.optimizer;
  c.lr = 1e-3;  // small and constant: no timing run should reach non-finite values
  c.lr_scaling = "none";
  c.warmup_steps = 0;
  c.schedule = "constant";
  c.batch_per_rank = sh.b;
  c.accumulate = sh.acc;
  c.epochs = 1 << 30;
  c.on_nonfinite = "skip";
  c.eval_every = 0;
  c.log_every = int64_t(1) << 40;
  c.progress = false;
  c.metrics_file.clear();
  c.ckpt_dir.clear();
  c.ckpt_at_start = false;
  c.resume = "none";
  auto loop = [&](int64_t steps) {
    c.steps = steps;
    std::unique_ptr<Trainer> t;
    {
      QuietInfo quiet;
      t = std::make_unique<Trainer>(c, be, comm, &train, nullptr);
    }
    return t->run().seconds;
  };
  k = plan_steps(s, comm.mpi(), loop);  // first-touch and lazy set-up untimed, then the probe
  std::vector<double> v_s;
  for (int r = 0; r < s.repeats; ++r) {
    DPT_CHECK_MPI(MPI_Barrier(comm.mpi()));
    double d = (loop(k.warmup + k.timed) - loop(k.warmup)) / k.timed;
    DPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &d, 1, MPI_DOUBLE, MPI_MAX, comm.mpi()));
    v_s.push_back(d);
  }
  return stat_of(v_s).med;
}

Table grid_table() {
  return Table{"grid", "Batch size x optimizer x learning-rate rule x warm-up, trained on one rank", kGridCols, {}, {}};
}

Table steps_table() {
  return Table{"steps", "Step time of the grid's model per rank count and per-rank batch",
               {{"optimizer", "optimizer", "", ""},
                {"ranks", "ranks", "", "%.0f"},
                {"batch_per_rank", "b/rank", "samples", "%.0f"},
                {"accumulate", "acc", "", "%.0f"},
                {"global_batch", "global", "samples", "%.0f"},
                {"step_ms", "step", "ms", "%.4f"},
                {"timed_steps", "timed", "steps", "%.0f"}},
               {},
               {"step: the slowest rank's (t(W+S) - t(W)) / S in fresh Trainers on the training set ([scaling] "
                "warmup_steps, timed_steps), median of repeats; no evaluation, no metrics.",
                "timed: S of that row, fewer than timed_steps where the step is slow ([scaling] timed_seconds, "
                "min_timed_steps, warmup_seconds: as in the scaling table)."}};
}

Table check_table() {
  return Table{"check", "Time to target measured on N ranks against the prediction",
               {{"variant", "variant", "", ""},
                {"ranks", "ranks", "", "%.0f"},
                {"global_batch", "global", "samples", "%.0f"},
                {"batch_per_rank", "b/rank", "samples", "%.0f"},
                {"accumulate", "acc", "", "%.0f"},
                {"steps_to_target", "steps->tgt", "", "%.1f"},
                {"predicted_s", "predicted", "s", "%.3f"},
                {"measured_s", "measured", "s", "%.3f"},
                {"error_pct", "error", "%", "%+.1f"},
                {"status", "status", "", ""}},
               {},
               {"predicted = steps to target of the grid's one-rank run at this global batch x the measured step "
                "time on N ranks (table steps); measured = this run's training seconds to the target (interpolated "
                "between evaluations, evaluations taken out); error = measured / predicted - 1.",
                "the setting: the variant and global batch predicted fastest on the most ranks, run on every rank count "
                "with that global batch (split over the ranks)."}};
}

// The three parts of measure_grid over one dataset and one list of variants.
class GridSweep {
 public:
  GridSweep(Context& cx, const Dataset& train, const Dataset& test, std::vector<std::string>& notes)
      : cx_(cx), s_(*cx.s), train_(train), test_(test), notes_(notes), vs_(variants(s_)),
        ns_(subset_sizes(cx.size, s_.max_ranks)), mdir_(fs::path(s_.out_dir) / "grid-metrics") {
    if (cx.rank == 0) fs::create_directories(mdir_);
  }

  // 1. Every variant at every global batch, on the first rank alone.
  void run_grid(GridResult& g) {
    SubComm sub(cx_.world, 1);
    if (sub.member()) {
      auto comm = subset_comm(cx_, sub.get());
      {
        Config pc = s_.grid_base;  // the model alone: no checkpoint to read or write
        pc.resume = "none";
        pc.ckpt_dir.clear();
        pc.ckpt_at_start = false;
        pc.metrics_file.clear();
        log::info("grid: model of every grid run (" + s_.grid_base.train_file + "):");
        Trainer probe(pc, *cx_.be, *comm, &train_, nullptr);  // prints its model table, once
        g.params = int64_t(probe.model().num_params());
      }
      for (int B : s_.grid_batches) {
        const Shape sh = shape_for(B, 1, s_.grid_max_batch_per_rank);
        if (!sh.ok || B > train_.n) {
          notes_.push_back("grid: global batch " + std::to_string(B) + " skipped (larger than the training set, or not "
                           "reachable with grid.max_batch_per_rank and accumulation by halving)");
          continue;
        }
        for (const Variant& v : vs_) {
          const Outcome o = train_run(s_, *cx_.be, *comm, v, sh, train_, test_, metrics_for(v, sh));
          g.grid.rows.push_back(grid_row(v, sh, o, double(train_.n)));
          char line[160];
          std::snprintf(line, sizeof line, "grid: B=%d %s: best accuracy %.4f, %s", B, v.name.c_str(), o.best,
                        g.grid.rows.back().back().text.c_str());
          log::info(line);
        }
      }
    }
    idle_barrier(cx_.world);
    DPT_CHECK_MPI(MPI_Bcast(&g.params, 1, MPI_INT64_T, 0, cx_.world));
  }

  // 2. The step time of every per-rank batch the grid's global batches give on each subset.
  void measure_steps(GridResult& g) {
    std::vector<std::string> opts;
    for (const Variant& v : vs_)
      if (std::find(opts.begin(), opts.end(), v.optimizer) == opts.end()) opts.push_back(v.optimizer);
    for (int n : ns_) {
      SubComm sub(cx_.world, n);
      if (sub.member()) {
        auto comm = subset_comm(cx_, sub.get());
        for (int B : s_.grid_batches) {
          const Shape sh = shape_for(B, n, s_.grid_max_batch_per_rank);
          if (!sh.ok || B > train_.n) continue;
          for (const std::string& o : opts) {
            Variant v;
            v.optimizer = o;
            StepCounts k;
            const double st = step_seconds(s_, *cx_.be, *comm, v, sh, train_, k);
            g.steps.rows.push_back({txt(o), num(n), num(sh.b * sh.acc), num(sh.acc), num(B), num(st * 1e3), num(k.timed)});
          }
        }
      }
      idle_barrier(cx_.world);
    }
  }

  // 3. The setting predicted fastest on the most ranks (rank 0 decides, every rank learns it),
  // trained on every subset at the same global batch: the same samples in the same order, so
  // the grid's steps to target hold for each, and only the step time differs.
  void run_checks(GridResult& g) {
    int pick[2] = {-1, 0};  // variant index, global batch
    if (cx_.rank == 0 && s_.grid_check) pick_fastest(g, pick);
    DPT_CHECK_MPI(MPI_Bcast(pick, 2, MPI_INT, 0, cx_.world));
    if (pick[0] < 0) {
      if (s_.grid_check)
        notes_.push_back("grid: no check run (no setting reached the target with a measured step time on " +
                         std::to_string(ns_.back()) + " rank(s))");
      return;
    }
    const Variant& v = vs_[size_t(pick[0])];
    for (int n : ns_) {
      const Shape sh = shape_for(pick[1], n, s_.grid_max_batch_per_rank);
      SubComm sub(cx_.world, n);
      if (sub.member() && sh.ok) {
        auto comm = subset_comm(cx_, sub.get());
        const Outcome o = train_run(s_, *cx_.be, *comm, v, sh, train_, test_, metrics_for(v, sh));
        if (cx_.rank == 0) g.check.rows.push_back(check_row(g, v, sh, o));
      }
      idle_barrier(cx_.world);
    }
  }

 private:
  Context& cx_;
  const Settings& s_;
  const Dataset &train_, &test_;
  std::vector<std::string>& notes_;
  const std::vector<Variant> vs_;
  const std::vector<int> ns_;
  const fs::path mdir_;

  std::string metrics_for(const Variant& v, const Shape& sh) const {
    std::string name = v.name + " B" + std::to_string(sh.B) + " n" + std::to_string(sh.n);
    for (char& ch : name)  // a plain file name: letters, digits, '.', '-', '_'
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '-') ch = ch == ' ' ? '-' : '_';
    return (mdir_ / (name + ".jsonl")).string();
  }

  // Only global batches every subset can run (split over n ranks, within grid.max_batch_per_rank).
  void pick_fastest(const GridResult& g, int pick[2]) const {
    const int top = ns_.back();
    auto on_every_subset = [&](int B) {
      for (int n : ns_)
        if (!shape_for(B, n, s_.grid_max_batch_per_rank).ok) return false;
      return true;
    };
    double best = INFINITY;
    const Table& t = g.grid;
    for (size_t i = 0; i < vs_.size(); ++i) {
      const StepTime measured = step_model(g.steps, vs_[i].optimizer, nullptr, 0);
      for (size_t r = 0; r < t.rows.size(); ++r) {
        if (t.at(r, "variant")->text != vs_[i].name || t.at(r, "status")->text != "ok" ||
            t.at(r, "steps_to_target")->empty || !on_every_subset(int(t.at(r, "global_batch")->num)))
          continue;
        const int B = int(t.at(r, "global_batch")->num);
        const double sec = t.at(r, "steps_to_target")->num * measured(top, double(B) / top);
        if (sec < best) best = sec, pick[0] = int(i), pick[1] = B;
      }
    }
  }

  std::vector<Cell> check_row(const GridResult& g, const Variant& v, const Shape& sh, const Outcome& o) const {
    double steps = NAN;
    for (size_t i = 0; i < g.grid.rows.size(); ++i)
      if (g.grid.at(i, "variant")->text == v.name && g.grid.at(i, "global_batch")->num == sh.B)
        steps = g.grid.at(i, "steps_to_target")->num;
    const double pred = steps * step_model(g.steps, v.optimizer, nullptr, 0)(sh.n, double(sh.B) / sh.n);
    const bool hit = o.cross.reached && o.status == "ok";
    return {txt(v.name), num(sh.n), num(sh.B), num(sh.b), num(sh.acc), num(steps), num(pred),
            hit ? num(o.cross.seconds) : none(), hit ? num(100.0 * (o.cross.seconds / pred - 1.0)) : none(),
            txt(o.status == "ok" && !o.cross.reached ? "not reached" : o.status)};
  }
};

std::vector<std::string> grid_notes(const Settings& s) {
  const Config& base = s.grid_base;
  return {"dataset: " + base.train_file + " / " + base.test_file + "; base_batch " + std::to_string(base.base_batch) +
              " (the lr rules scale from it), schedule " + base.schedule + "; one rank (the same samples in the same "
              "order as on any rank count).",
          "budget: " + std::to_string(s.grid_epochs) + " epoch(s), at least " + std::to_string(s.grid_min_steps) +
              " steps; warm-up on = a linear ramp over " + std::to_string(s.warmup_epochs) + " epoch(s), at least " +
              std::to_string(s.grid_warmup_min_steps) + " steps; " + std::to_string(s.grid_evals) +
              " evaluations per run; target accuracy " + std::to_string(s.target_accuracy) + ".",
          "steps->tgt: interpolated between the last evaluation below the target and the first at or above it "
          "(the first evaluation when already there); t->target the same on the training clock (the loop's clock "
          "less every earlier evaluation, each as long as its metrics records say); empty = not reached or diverged "
          "(non-finite loss, train.on_nonfinite = stop). eval: one evaluation timed alone, median of 3.",
          "per-run metrics in grid-metrics/*.jsonl."};
}

}  // namespace

GridResult measure_grid(Context& cx, std::vector<std::string>& notes) {
  const Settings& s = *cx.s;
  GridResult g{grid_table(), steps_table(), check_table()};
  if (!s.grid || !s.section("grid")) {
    notes.push_back("grid: not run (grid.enabled = false or report.sections without grid)");
    return g;
  }
  // Every rank checks the files alike, so a missing dataset skips the grid everywhere.
  std::string missing;
  for (const std::string& f : {s.grid_base.train_file, s.grid_base.test_file})
    if (!fs::exists(f)) missing += (missing.empty() ? "" : ", ") + f;
  if (!missing.empty()) {
    notes.push_back("grid: skipped, dataset not found: " + missing + " (make it with ./dpdata fashion-mnist --out-dir data)");
    log::warn(notes.back());
    return g;
  }
  const Dataset train = load_dataset(s.grid_base.train_file), test = load_dataset(s.grid_base.test_file);
  g.train_rows = train.n;
  GridSweep sweep(cx, train, test, notes);
  sweep.run_grid(g);
  sweep.measure_steps(g);
  sweep.run_checks(g);
  g.grid.notes = grid_notes(s);
  return g;
}

}  // namespace dpt::scaling
