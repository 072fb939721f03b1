// Time to accuracy: where a run crosses the target, epochs-to-target against global batch (the
// critical-batch curve), and the time to target on N ranks = steps to target (the grid, one
// rank: the same samples in the same order on any rank count) × the step time on N ranks
// (measured where run, else the one-rank step plus the alpha-beta ring's allreduce).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "dpt/scaling.hpp"

namespace dpt::scaling {

Crossing first_crossing(const std::vector<EvalPoint>& evals, double target) {
  Crossing c;
  for (size_t i = 0; i < evals.size(); ++i) {
    const EvalPoint& e = evals[i];
    if (!(e.accuracy >= target)) continue;
    c.reached = true;
    if (i == 0) {
      c.step = e.step;
      c.seconds = e.seconds;
      return c;
    }
    const EvalPoint& a = evals[i - 1];
    const double f = (target - a.accuracy) / (e.accuracy - a.accuracy);  // in (0, 1]
    c.step = a.step + f * (e.step - a.step);
    c.seconds = a.seconds + f * (e.seconds - a.seconds);
    return c;
  }
  return c;
}

std::vector<EvalPoint> evals_from_metrics(const std::string& jsonl, double eval_s, double& eval_total) {
  std::map<int64_t, double> time_at;
  struct Eval {
    int64_t step;
    double accuracy, ended;
  };
  std::vector<Eval> evals;
  std::istringstream in(jsonl);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step")) continue;
    if (j.contains("eval"))
      evals.push_back({j["step"].get<int64_t>(), j.value("accuracy", double(NAN)), j.value("time_s", double(NAN))});
    else
      time_at[j["step"].get<int64_t>()] = j.value("time_s", double(NAN));
  }
  std::vector<EvalPoint> out;
  double spent = 0;  // seconds of evaluation before the current one
  for (const Eval& e : evals) {
    const double began = time_at.count(e.step) ? time_at[e.step] : NAN;
    out.push_back({double(e.step), e.accuracy, std::max(0.0, began - spent)});
    spent += std::isfinite(e.ended - began) ? e.ended - began : eval_s;
  }
  eval_total = spent;
  return out;
}

double interp_loglog(const std::vector<std::pair<double, double>>& pts, double x) {
  auto ok = [](double v) { return v > 0 && std::isfinite(v); };
  if (!ok(x)) return NAN;
  for (size_t i = 0; i < pts.size(); ++i) {
    if (pts[i].first == x) return pts[i].second;
    if (i + 1 < pts.size() && pts[i].first < x && x < pts[i + 1].first) {
      const auto [x0, y0] = pts[i];
      const auto [x1, y1] = pts[i + 1];
      if (!ok(x0) || !ok(y0) || !ok(x1) || !ok(y1)) return NAN;
      const double f = std::log(x / x0) / std::log(x1 / x0);
      return std::exp(std::log(y0) + f * std::log(y1 / y0));
    }
  }
  return NAN;
}

double epochs_of(double steps, double global_batch, double rows) {
  return rows > 0 ? steps * global_batch / rows : NAN;
}

std::string variant_name(const std::string& optimizer, const std::string& rule, bool warmup) {
  return optimizer + " " + rule + (warmup ? " +warm-up" : "");
}

TtaPoint fastest_to_target(const Table& grid, const std::string& variant, int ranks, double min_b,
                           const StepTime& step_at) {
  TtaPoint best;
  best.variant = variant;
  best.ranks = ranks;
  for (size_t i = 0; i < grid.rows.size(); ++i) {
    if (grid.at(i, "variant")->text != variant || grid.at(i, "status")->text != "ok") continue;
    const double B = grid.at(i, "global_batch")->num, steps = grid.at(i, "steps_to_target")->num;
    if (grid.at(i, "steps_to_target")->empty || std::fmod(B, ranks) != 0 || B / ranks < min_b) continue;
    const double st = step_at(ranks, B / ranks);
    if (!(st > 0)) continue;
    const double t = steps * st;
    if (best.found && !(t < best.seconds)) continue;
    best.found = true;
    best.global_batch = B;
    best.steps = steps;
    best.epochs = grid.at(i, "epochs_to_target")->num;
    best.step_s = st;
    best.seconds = t;
  }
  return best;
}

namespace {

// The steps table's seconds of one optimizer on `ranks` ranks, by per-rank batch.
std::vector<std::pair<double, double>> step_curve(const Table& steps, const std::string& optimizer, int ranks) {
  std::map<double, std::vector<double>> by_b;
  for (size_t i = 0; i < steps.rows.size(); ++i)
    if (int(steps.at(i, "ranks")->num) == ranks && !steps.at(i, "step_ms")->empty &&
        steps.at(i, "optimizer")->text == optimizer)
      by_b[steps.at(i, "batch_per_rank")->num].push_back(steps.at(i, "step_ms")->num * 1e-3);
  std::vector<std::pair<double, double>> pts;
  for (auto& [b, v] : by_b) pts.push_back({b, stat_of(v).med});
  return pts;
}

}  // namespace

bool step_measured(const Table& steps, const std::string& optimizer, int ranks, double b) {
  for (auto& [x, y] : step_curve(steps, optimizer, ranks))
    if (x == b) return true;
  return false;
}

StepTime step_model(const Table& steps, const std::string& optimizer, const RingModel* ring, double gradient_bytes) {
  std::map<int, std::vector<std::pair<double, double>>> curves;
  std::set<int> ns;
  for (size_t i = 0; i < steps.rows.size(); ++i) ns.insert(int(steps.at(i, "ranks")->num));
  for (int n : ns) curves[n] = step_curve(steps, optimizer, n);
  const RingModel r = ring ? *ring : RingModel{};
  const bool have_ring = ring != nullptr;
  const int top = ns.empty() ? 0 : *ns.rbegin();
  return [curves, r, have_ring, gradient_bytes, top](int n, double b) {
    auto exact = [&](int m) {
      auto it = curves.find(m);
      if (it != curves.end())
        for (auto& [x, y] : it->second)
          if (x == b) return y;
      return double(NAN);
    };
    const double here = exact(n);
    if (!std::isnan(here) || n <= top || !have_ring) return here;  // a measured count: only what it ran
    // Beyond the measured ranks: the largest measured count's step at b (log-log interpolated
    // between the batches it ran) plus the allreduce time the ring adds from there to n, so what
    // that count measured (contention for shared cores or links included) is kept.
    return interp_loglog(curves.at(top), b) + r.seconds(gradient_bytes, n) - r.seconds(gradient_bytes, top);
  };
}

Table critical_batch_table(const Table& grid) {
  Table t{"critical", "Epochs to the target against global batch: how far each rule scales",
          {{"variant", "variant", "", ""},
           {"smallest_batch", "smallest B", "samples", "%.0f"},
           {"epochs_at_smallest", "epochs", "", "%.2f"},
           {"largest_batch_2x", "largest B <= 2x", "samples", "%.0f"},
           {"epochs_at_largest", "epochs", "", "%.2f"},
           {"reached", "reached", "", ""},
           {"diverged", "diverged", "", "%.0f"}},
          {},
          {}};
  std::vector<std::string> order;
  std::map<std::string, std::vector<size_t>> by;
  for (size_t i = 0; i < grid.rows.size(); ++i) {
    const std::string v = grid.at(i, "variant")->text;
    if (!by.count(v)) order.push_back(v);
    by[v].push_back(i);
  }
  for (const std::string& v : order) {
    auto rows = by[v];
    std::sort(rows.begin(), rows.end(), [&](size_t a, size_t b) {
      return grid.at(a, "global_batch")->num < grid.at(b, "global_batch")->num;
    });
    int reached = 0, diverged = 0;
    for (size_t i : rows) {
      reached += !grid.at(i, "epochs_to_target")->empty && grid.at(i, "status")->text == "ok";
      diverged += grid.at(i, "status")->text == "diverged";
    }
    const size_t s0 = rows.front();
    const bool base = !grid.at(s0, "epochs_to_target")->empty && grid.at(s0, "status")->text == "ok";
    const double e0 = grid.at(s0, "epochs_to_target")->num;
    Cell lb = none(), le = none();
    for (size_t i : rows)
      if (base && grid.at(i, "status")->text == "ok" && !grid.at(i, "epochs_to_target")->empty &&
          grid.at(i, "epochs_to_target")->num <= 2 * e0)
        lb = num(grid.at(i, "global_batch")->num), le = num(grid.at(i, "epochs_to_target")->num);
    t.rows.push_back({txt(v), num(grid.at(s0, "global_batch")->num), base ? num(e0) : none(), lb, le,
                      txt(std::to_string(reached) + " of " + std::to_string(rows.size())), num(diverged)});
  }
  t.notes = {"epochs to target = steps to the target (interpolated between evaluations) x global batch / training rows.",
             "largest B <= 2x: the largest global batch whose epochs to target are at most twice those at the smallest "
             "batch (empty: the smallest batch did not reach the target).",
             "the curve is flat (perfect scaling) below the critical batch size and rises past it (Shallue et al. "
             "1811.03600; McCandlish et al. 1812.06162)."};
  return t;
}

Table time_to_target_table(const Settings& s, const GridResult& g, const std::vector<AlphaBeta>& fits) {
  Table t{"tta", "Time to the target accuracy on N ranks: the fastest global batch per variant",
          {{"variant", "variant", "", ""},
           {"ranks", "ranks", "", "%.0f"},
           {"global_batch", "global", "samples", "%.0f"},
           {"batch_per_rank", "b/rank", "samples", "%.0f"},
           {"steps_to_target", "steps", "", "%.1f"},
           {"epochs_to_target", "epochs", "", "%.2f"},
           {"step_ms", "step", "ms", "%.4f"},
           {"predicted_s", "predicted", "s", "%.3f"},
           {"measured_s", "measured", "s", "%.3f"},
           {"speedup", "speed-up", "x 1 rank", "%.2f"},
           {"step_source", "step from", "", ""},
           {"best", "best", "", ""}},
          {},
          {}};
  if (g.grid.rows.empty() || g.steps.rows.empty()) return t;
  const RingModel ring = fits.empty() ? RingModel{} : ring_from(fits.back());
  std::vector<std::string> variants;
  std::map<std::string, std::string> optimizer;
  for (size_t i = 0; i < g.grid.rows.size(); ++i) {
    const std::string v = g.grid.at(i, "variant")->text;
    if (std::find(variants.begin(), variants.end(), v) == variants.end()) variants.push_back(v);
    optimizer[v] = g.grid.at(i, "optimizer")->text;
  }
  int measured_max = 1;
  for (size_t i = 0; i < g.steps.rows.size(); ++i) measured_max = std::max(measured_max, int(g.steps.at(i, "ranks")->num));
  std::map<std::string, double> t1;
  for (int n = 1; n <= std::max(s.predict_max_ranks, measured_max); n *= 2) {
    const size_t first = t.rows.size();
    for (const std::string& v : variants) {
      const StepTime step_at = step_model(g.steps, optimizer[v], fits.empty() ? nullptr : &ring, double(g.params) * sizeof(float));
      const TtaPoint p = fastest_to_target(g.grid, v, n, 1, step_at);
      if (!p.found) continue;
      if (n == 1) t1[v] = p.seconds;
      Cell measured = none();
      for (size_t i = 0; i < g.check.rows.size(); ++i)
        if (g.check.at(i, "variant")->text == v && int(g.check.at(i, "ranks")->num) == n &&
            g.check.at(i, "global_batch")->num == p.global_batch)
          measured = *g.check.at(i, "measured_s");
      const bool meas_step = step_measured(g.steps, optimizer[v], n, p.global_batch / n);
      t.rows.push_back({txt(v), num(n), num(p.global_batch), num(p.global_batch / n), num(p.steps), num(p.epochs),
                        num(p.step_s * 1e3), num(p.seconds), measured,
                        t1.count(v) ? num(t1[v] / p.seconds) : none(),
                        txt(meas_step ? "measured" : "model"), txt("")});
    }
    size_t best = first;
    for (size_t i = first; i < t.rows.size(); ++i)
      if (t.rows[i][7].num < t.rows[best][7].num) best = i;
    if (best < t.rows.size()) t.rows[best][11] = txt("*");
  }
  char buf[200];
  if (!fits.empty())
    std::snprintf(buf, sizeof buf, "model: the %d-rank ring (hop %.2f us, busbw %.3f GB/s) reducing the %lld-parameter gradient once per step.",
                  fits.back().n, ring.hop_latency * 1e6, ring.bus_bw / 1e9, static_cast<long long>(g.params));
  else
    std::snprintf(buf, sizeof buf, "no allreduce fit (one rank, or the allreduce section skipped): only measured rank counts are predicted.");
  t.notes = {"predicted = steps to target at that global batch (the grid, one rank) x step time on N ranks at B / N per rank; "
             "the fastest global batch per variant and N; * = the fastest variant at that N.",
             "step from: measured = the steps table (this launch); model = beyond the measured ranks, the largest "
             "measured count's step at B / N (log-log interpolated between its batches) + the ring's allreduce time "
             "added from there to N; nothing hidden (one gradient bucket, reduced after backward).",
             buf,
             "measured: a check run of that variant and batch on N ranks (table check); speed-up = predicted time on 1 rank / on N."};
  return t;
}

}  // namespace dpt::scaling
