// bench-step --account: each op's share of a training step, against its floor (step_account.hpp).
//
// The floor of an op is the longer of its flops at the GEMM ceiling and its bytes at the memory
// ceiling, both measured in the same process (Backend::measure_ceilings). Its bytes are
// Model::op_costs' values — every activation, gradient and parameter it reads or writes, once —
// at the step's storage sizes: activations and their gradients in bf16 under bf16 (as
// PyTorch's autocast keeps them), else fp32; parameters read in the GEMMs' operand type,
// their gradients written in fp32. The sum of the floors is what the step would take if every
// op ran alone at the GPU's limit; fusing ops lowers it further (a fused op moves less).
#include "step_account.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "dpt/check.hpp"
#include "dpt/log.hpp"
#include "dpt/nn.hpp"
#include "dpt/train.hpp"

namespace dpt::bench {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One row of the account: an op (or the step's other parts) with its median times.
struct Row {
  std::string name, kind, shape;
  double fwd_s = 0, bwd_s = 0;  // medians over the timed steps
  double flops = 0, bytes = 0;  // forward and backward together
  bool bwd = false;  // the op has a backward pass
};

std::string str(const char* f, double a) {
  char b[64];
  std::snprintf(b, sizeof b, f, a);
  return b;
}

}  // namespace

void print_account(const Config& cfg, Runtime& rt, const Dataset& ds, const AccountArgs& a) {
  Backend& be = *rt.backend;
  const Ceilings ce = be.measure_ceilings();
  Config c = cfg;
  c.steps = a.warmup + a.steps;
  Trainer t(c, be, *rt.comm, &ds, nullptr);
  Model& m = t.model();
  const int B = cfg.batch_per_rank;
  const std::vector<OpCost> costs = m.op_costs(B);
  auto marks = be.time_marks();
  std::vector<std::pair<StepPoint, int>> at;  // each mark's point
  t.set_probe([&](StepPoint p, int op) {
    at.emplace_back(p, op);
    marks->mark();
  });
  t.run();
  const std::vector<double> sec = marks->seconds();
  if (sec.size() != at.size()) throw Error("bench-step --account: a time for every mark");

  // Segment k runs from mark k to mark k+1 and belongs to mark k's point; steps begin at data.
  const size_t n_ops = costs.size();
  std::vector<std::vector<double>> fwd(n_ops), bwd(n_ops);
  std::vector<double> data_s, loss_s, opt_s, step_s, gap_s;
  int step = -1;
  std::vector<double> f_acc(n_ops), b_acc(n_ops);
  double d_acc = 0, l_acc = 0, o_acc = 0, g_acc = 0, step_t0 = 0;
  for (size_t k = 0; k + 1 < at.size(); ++k) {
    const auto [p, op] = at[k];
    const double dt = sec[k + 1] - sec[k];
    if (p == StepPoint::data) {
      ++step;
      step_t0 = sec[k];
      std::fill(f_acc.begin(), f_acc.end(), 0.0);
      std::fill(b_acc.begin(), b_acc.end(), 0.0);
      d_acc = l_acc = o_acc = g_acc = 0;
    }
    switch (p) {
      case StepPoint::data: d_acc += dt; break;
      case StepPoint::forward: f_acc[size_t(op)] += dt; break;
      case StepPoint::loss: l_acc += dt; break;
      case StepPoint::backward: b_acc[size_t(op)] += dt; break;
      case StepPoint::optimizer: o_acc += dt; break;
      case StepPoint::end: g_acc += dt; break;
    }
    // A step's account closes at the next step's data mark (the gap after `end` included), the
    // last step's at its end.
    const bool closes = at[k + 1].first == StepPoint::data || k + 2 == at.size();
    if (closes && step >= a.warmup) {
      for (size_t i = 0; i < n_ops; ++i) {
        fwd[i].push_back(f_acc[i]);
        bwd[i].push_back(b_acc[i]);
      }
      data_s.push_back(d_acc);
      loss_s.push_back(l_acc);
      opt_s.push_back(o_acc);
      gap_s.push_back(g_acc);
      step_s.push_back(sec[k + 1] - step_t0);
    }
  }
  if (rt.comm->rank() != 0) return;
  if (step_s.empty()) throw Error("bench-step --account: no step was timed (raise --account-steps)");

  const bool b16 = cfg.precision == "bf16";
  const double act_b = b16 ? 2 : 4, par_b = b16 ? 2 : 4;
  std::vector<Row> rows;
  for (size_t i = 0; i < n_ops; ++i) {
    const OpCost& oc = costs[i];
    if (!oc.has_fwd && !oc.has_bwd) continue;
    Row r;
    r.name = oc.name;
    r.kind = oc.kind;
    r.shape = oc.shape;
    r.bwd = oc.has_bwd;
    r.fwd_s = median(fwd[i]);
    r.bwd_s = oc.has_bwd ? median(bwd[i]) : 0;
    r.flops = oc.fwd_flops + (oc.has_bwd ? oc.bwd_flops : 0);
    r.bytes = (oc.fwd_values + (oc.has_bwd ? oc.bwd_values : 0)) * act_b +
              oc.param_values * (par_b + (oc.has_bwd ? par_b + 4 : 0));
    rows.push_back(r);
  }
  // The step's other parts: the batch gathered from the resident dataset (rows read, x
  // written, fp32), the loss, the optimizer over the arena (each parameter, gradient and state
  // array read, the parameters and states written, and the bf16 copy of the weights under
  // bf16), and what runs between the end of one step and the start of the next.
  const double params = double(m.num_params());
  const int states = t.optimizer().state_arrays();
  auto extra = [&](const std::string& name, const std::vector<double>& s, double bytes) {
    Row r;
    r.name = name;
    r.kind = name;
    r.fwd_s = median(s);
    r.bytes = bytes;
    rows.push_back(r);
  };
  extra("data", data_s, 2.0 * double(B) * double(m.in_dim()) * 4);
  extra("loss", loss_s, 2.0 * double(B) * m.classes() * 4);
  extra("optimizer*", opt_s, params * (4.0 * (3 + 2 * states) + (b16 ? 2 : 0)));
  extra("between steps", gap_s, 0);

  const double gemm = ce.gemm_flops, mem = ce.mem_bytes;
  auto floor_s = [&](const Row& r) { return std::max(r.flops / gemm, r.bytes / mem); };
  char line[512];
  log::info("account of the step: " + a.label + ", batch " + std::to_string(B) + ", " + cfg.precision +
            "; each op between two timing events, steps enqueued op by op (not replayed), the median of " +
            std::to_string(step_s.size()) + " steps after " + std::to_string(a.warmup));
  std::snprintf(line, sizeof line, "ceilings: GEMM %.1f TFLOP/s (%s); memory %.0f GB/s (%s)", gemm / 1e12,
                ce.gemm_what.c_str(), mem / 1e9, ce.mem_what.c_str());
  log::info(line);
  std::snprintf(line, sizeof line, "%-24s %-34s %8s %8s %8s %8s %8s %7s", "op", "what", "fwd ms", "bwd ms", "TFLOP/s",
                "GB/s", "floor ms", "x floor");
  log::info(line);
  struct Kind {
    double s = 0, floor = 0, flops = 0, bytes = 0;
    int n = 0;
  };
  std::map<std::string, Kind> kinds;
  double sum_s = 0, sum_floor = 0;
  for (const Row& r : rows) {
    const double s = r.fwd_s + r.bwd_s, fl = floor_s(r);
    Kind& k = kinds[r.kind];
    k.s += s;
    k.floor += fl;
    k.flops += r.flops;
    k.bytes += r.bytes;
    ++k.n;
    sum_s += s;
    sum_floor += fl;
    const double tfs = s > 0 ? r.flops / s / 1e12 : 0;
    const std::string tf = r.flops > 0 && s > 0 ? str(tfs < 10 ? "%.2f" : "%.1f", tfs) : "";
    const std::string gb = r.flops == 0 && r.bytes > 0 && s > 0 ? str("%.0f", r.bytes / s / 1e9) : "";
    const std::string over = fl > 0 ? str("%.2f", s / fl) : "";
    std::snprintf(line, sizeof line, "%-24s %-34s %8.4f %8s %8s %8s %8.4f %7s", r.name.substr(0, 24).c_str(),
                  r.shape.substr(0, 34).c_str(), r.fwd_s * 1e3, r.bwd ? str("%.4f", r.bwd_s * 1e3).c_str() : "",
                  tf.c_str(), gb.c_str(), fl * 1e3, over.c_str());
    log::info(line);
  }
  log::info("by kind (forward and backward together):");
  std::snprintf(line, sizeof line, "%-14s %4s %9s %6s %9s %7s %9s", "kind", "ops", "ms", "share", "floor ms", "x floor",
                "TFLOP/s");
  log::info(line);
  std::string kinds_json;
  for (const auto& [name, k] : kinds) {
    std::snprintf(line, sizeof line, "%-14s %4d %9.3f %5.1f%% %9.3f %7s %9s", name.c_str(), k.n, k.s * 1e3,
                  100 * k.s / sum_s, k.floor * 1e3, k.floor > 0 ? str("%.2f", k.s / k.floor).c_str() : "",
                  k.flops > 0 ? str("%.1f", k.flops / k.s / 1e12).c_str() : "");
    log::info(line);
    std::snprintf(line, sizeof line, "%s\"%s\": {\"ops\": %d, \"ms\": %.4f, \"floor_ms\": %.4f, \"tflop\": %.4f, \"gb\": %.4f}",
                  kinds_json.empty() ? "" : ", ", name.c_str(), k.n, k.s * 1e3, k.floor * 1e3, k.flops / 1e12,
                  k.bytes / 1e9);
    kinds_json += line;
  }
  log::info("* the optimizer's row times what runs after the backward pass; with train.on_nonfinite = stop the "
            "updates of buckets final before its end run inside it (DPT_EAGER_UPDATE=0 keeps them after), on a side "
            "stream where the backend has one, and their time is in the rows of the ops they overlap");
  const double eager = median(step_s);
  std::snprintf(line, sizeof line,
                "step: %.3f ms enqueued op by op (the sum of its parts' medians %.3f ms), %.3f ms as the product runs it "
                "(bench-step's median above); the sum of the floors %.3f ms: the step is %.2fx "
                "the floor, %.1f%% of the time is above it",
                eager * 1e3, sum_s * 1e3, a.graph_ms, sum_floor * 1e3, a.graph_ms / (sum_floor * 1e3),
                100 * (1 - sum_floor * 1e3 / a.graph_ms));
  log::info(line);
  char js[4096];
  std::snprintf(js, sizeof js,
                "{\"bench\": \"step-account\", \"layers\": \"%s\", \"batch_per_rank\": %d, \"precision\": \"%s\", "
                "\"gemm_tflops\": %.2f, \"mem_gbs\": %.1f, \"eager_ms\": %.4f, \"graph_ms\": %.4f, \"floor_ms\": %.4f, "
                "\"kinds\": {%s}}",
                a.label.c_str(), B, cfg.precision.c_str(), gemm / 1e12, mem / 1e9, eager * 1e3, a.graph_ms,
                sum_floor * 1e3, kinds_json.c_str());
  log::info(js);
}

}  // namespace dpt::bench
