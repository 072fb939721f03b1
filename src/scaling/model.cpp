// The alpha-beta model: t(m) = α + β·m fitted per rank count to the allreduce sweep, turned into
// a ring model (per-hop latency, bus bandwidth) from the largest rank count measured, and used
// to predict weak-scaling efficiency at larger rank counts from the measured compute time and
// the Trainer's bucket layout.
#include <algorithm>
#include <cmath>
#include <map>

#include "dpt/scaling.hpp"

namespace dpt::scaling {

std::vector<AlphaBeta> fit_allreduce(const Table& ar) {
  std::map<int, std::pair<std::vector<double>, std::vector<double>>> by_n;
  for (size_t i = 0; i < ar.rows.size(); ++i) {
    auto& [m, t] = by_n[int(ar.at(i, "ranks")->num)];
    m.push_back(ar.at(i, "bytes")->num);
    t.push_back(ar.at(i, "time_us")->num * 1e-6);
  }
  std::vector<AlphaBeta> fits;
  for (auto& [n, mt] : by_n) fits.push_back(fit_alpha_beta(n, mt.first, mt.second));
  return fits;
}

Table alpha_beta_table(const std::vector<AlphaBeta>& fits) {
  Table t{"alpha_beta", "Alpha-beta fit of the allreduce times: t(m) = alpha + beta * m",
          {{"ranks", "ranks", "", "%.0f"},
           {"alpha_us", "alpha", "us", "%.2f"},
           {"inv_beta_gbs", "1/beta", "GB/s", "%.3f"},
           {"hop_latency_us", "ring hop", "us", "%.2f"},
           {"ring_busbw_gbs", "ring busbw", "GB/s", "%.3f"},
           {"max_rel_err_pct", "max err", "%", "%.1f"},
           {"points", "points", "", "%.0f"}},
          {},
          {}};
  for (const AlphaBeta& ab : fits) {
    const RingModel r = ring_from(ab);
    t.rows.push_back({num(ab.n), num(ab.alpha * 1e6), num(ab.beta > 0 ? 1e-9 / ab.beta : NAN),
                      num(r.hop_latency * 1e6), num(r.bus_bw / 1e9), num(ab.max_rel_err * 100), num(ab.points)});
  }
  t.notes = {"least squares weighted by 1/t^2 (relative error), so latency-bound small messages and bandwidth-bound large ones both count.",
             "ring model: t = 2(n-1) x hop + 2(n-1)/n x m / busbw, with hop = alpha / (2(n-1)) and busbw = 2(n-1) / (n x beta)."};
  if (fits.empty()) t.notes.push_back("no fit: the allreduce sweep needs at least 2 ranks.");
  return t;
}

namespace {

const ModelSpec* find_model(const Settings& s, const std::string& name) {
  for (auto& m : s.models)
    if (m.name == name) return &m;
  return nullptr;
}

}  // namespace

Table predict_scaling(const Settings& s, const Table& sc, const std::vector<AlphaBeta>& fits) {
  Table t{"predict", "Weak scaling: measured efficiency and the alpha-beta model's prediction",
          {{"model", "model", "", ""},
           {"variant", "variant", "", ""},
           {"ranks", "ranks", "", "%.0f"},
           {"measured_eff", "measured", "eff", "%.3f"},
           {"predicted_eff", "predicted", "eff", "%.3f"},
           {"predicted_eff_no_overlap", "no overlap", "eff", "%.3f"},
           {"allreduce_ms", "allreduce", "ms/step", "%.3f"},
           {"predicted_step_ms", "pred step", "ms", "%.3f"},
           {"source", "source", "", ""}},
          {},
          {}};
  if (fits.empty()) {
    t.notes.push_back("no prediction: the allreduce sweep needs at least 2 ranks.");
    return t;
  }
  const AlphaBeta& ab = fits.back();  // the largest rank count measured
  const RingModel ring = ring_from(ab);
  for (const ModelSpec& m : s.models)
    for (const Variant& v : variants_of(s)) {
      // Weak-scaling rows of this model and variant: the per-rank work is the same at every n.
      std::map<int, size_t> rows;
      for (size_t i = 0; i < sc.rows.size(); ++i)
        if (sc.at(i, "model")->text == m.name && sc.at(i, "mode")->text == "weak" && sc.at(i, "variant")->text == v.name())
          rows[int(sc.at(i, "ranks")->num)] = i;
      if (rows.empty() || !rows.count(1) || sc.at(rows[1], "samples_per_s")->empty) continue;
      const size_t top = rows.rbegin()->second;
      const int ntop = rows.rbegin()->first;
      const double thr1 = sc.at(rows[1], "samples_per_s")->num;
      const double compute = sc.at(top, "compute_max_ms")->num * 1e-3;
      const auto buckets = bucket_elements(*find_model(s, m.name), s.base.bucket_mb);
      // A sharded step's reduce-scatter and all-gather move the bytes of one ring allreduce;
      // bf16 on the wire halves them.
      const double wire_bytes = v.wire == "bf16" ? 2 : 4;
      auto comm_at = [&](int n) {
        double c = 0;
        for (size_t e : buckets) c += ring.seconds(double(e) * wire_bytes, n);
        return c;
      };
      // The exposed share of the modelled communication at the largest measured n; the rest was
      // hidden behind backward (or the measurement says it cost nothing beyond the model).
      const double model_top = comm_at(ntop);
      const double exposed_top = sc.at(top, "exposed_comm_ms")->num * 1e-3;
      const double exposed_frac = model_top > 0 ? std::clamp(exposed_top / model_top, 0.0, 1.0) : 1.0;
      for (int n = 1; n <= std::max(s.predict_max_ranks, ntop); n *= 2) {
        const double c = comm_at(n);
        const double step = compute + exposed_frac * c, step_no = compute + c;
        const double b = double(s.weak_batch(m));
        const bool measured = rows.count(n) > 0;
        t.rows.push_back({txt(m.name), txt(v.name()), num(n), measured ? num(sc.at(rows[n], "efficiency")->num) : none(),
                          num(efficiency(n * b / step, n, thr1)), num(efficiency(n * b / step_no, n, thr1)),
                          num(c * 1e3), num(step * 1e3), txt(measured ? "measured n" : "extrapolated")});
      }
    }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "model from the %d-rank fit: hop %.2f us, busbw %.3f GB/s; buckets of comm.bucket_mb = %g; "
                "compute = slowest rank's compute at the largest measured n.",
                ab.n, ring.hop_latency * 1e6, ring.bus_bw / 1e9, s.base.bucket_mb);
  t.notes = {buf,
             "predicted: compute + f x allreduce, f = the exposed fraction measured at the largest n (overlap kept); "
             "no overlap: compute + allreduce. Per variant: bf16 on the wire halves the bytes; a sharded step's "
             "reduce-scatter + all-gather are modelled as one ring allreduce of the same bytes.",
             "caveat: beyond one node the links change (NVLink -> network); the fit knows only the links it measured."};
  return t;
}

}  // namespace dpt::scaling
