// bench-scaling's building blocks: rank subsets, the no-op transport, the variants of the
// gradient path, and the arithmetic (efficiency, nccl-tests bandwidths, bucket layout,
// alpha-beta fit, limiting factor, where a step's time goes).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "dpt/scaling.hpp"
#include "dpt/sync.hpp"
#include "dpt/check.hpp"
#include "dpt/nn.hpp"

namespace dpt::scaling {

std::vector<int> subset_sizes(int world, int max_ranks) {
  const int top = max_ranks > 0 ? std::min(world, max_ranks) : world;
  std::vector<int> v;
  for (int n = 1; n <= top; n *= 2) v.push_back(n);
  return v;
}

SubComm::SubComm(MPI_Comm parent, int n) {
  int rank = 0;
  DPT_CHECK_MPI(MPI_Comm_rank(parent, &rank));
  DPT_CHECK_MPI(MPI_Comm_split(parent, rank < n ? 0 : MPI_UNDEFINED, rank, &c_));
  if (c_ != MPI_COMM_NULL) MPI_Comm_set_errhandler(c_, MPI_ERRORS_RETURN);
}

SubComm::~SubComm() {
  if (c_ != MPI_COMM_NULL) MPI_Comm_free(&c_);
}

void idle_barrier(MPI_Comm c) {
  MPI_Request req;
  DPT_CHECK_MPI(MPI_Ibarrier(c, &req));
  for (int done = 0; !done;) {
    DPT_CHECK_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (!done) usleep(2000);
  }
}

namespace {
class NullComm final : public Comm {
 public:
  NullComm(int rank, int size, Backend* lanes, bool capturable) : Comm(MPI_COMM_SELF), lanes_(lanes), capturable_(capturable) {
    rank_ = rank;
    size_ = size;
  }
  std::string name() const override { return "none"; }
  std::string describe() const override { return "none (collectives removed, timing only)"; }
  // Each collective orders the streams as the NCCL transport's would (the communication stream
  // waits for the compute stream; synchronize() the other way), so a step that forks work onto
  // the communication stream is captured and joined as in the real run, with nothing sent.
  void allreduce(const void*, void*, size_t, DType, RedOp) override { fork(); }
  void broadcast(void*, size_t, DType, int) override { fork(); }
  void reduce_scatter(const void*, void*, size_t, DType, RedOp) override { fork(); }
  void allgather(const void*, void*, size_t, DType) override { fork(); }
  void synchronize() override {
    if (lanes_) lanes_->main_wait();
  }
  bool capturable() const override { return capturable_; }

 private:
  void fork() {
    if (lanes_) lanes_->side_wait();
  }
  Backend* lanes_;
  bool capturable_;
};
}  // namespace

std::unique_ptr<Comm> make_null_comm(int rank, int size, Backend* lanes, bool capturable) {
  return std::make_unique<NullComm>(rank, size, lanes, capturable);
}

// ---------------------------------------------------------------------------------------------

std::string Variant::name() const { return std::string(sharded ? "sharded-" : "unsharded-") + wire; }

Config Variant::apply(Config c) const {
  c.shard_optimizer = sharded;
  c.grad_dtype = wire;
  return c;
}

Variant parse_variant(const std::string& text, const std::string& where) {
  for (bool sharded : {false, true})
    for (const char* wire : {"fp32", "bf16"})
      if (Variant v{sharded, wire}; v.name() == text) return v;
  throw InputError("bench-scaling: scaling.variants = '" + text + "' (" + where +
                   "): variants are unsharded-fp32, unsharded-bf16, sharded-fp32, sharded-bf16 "
                   "(train.shard_optimizer false/true, comm.grad_dtype fp32/bf16)");
}

Variant variant_of(const Config& c) { return Variant{c.shard_optimizer, c.grad_dtype}; }

std::string collective_name(Collective c) {
  switch (c) {
    case Collective::allreduce: return "allreduce";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::all_gather: return "all_gather";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------

double efficiency(double throughput_n, int n, double throughput_1) {
  if (n <= 0 || !(throughput_1 > 0)) return NAN;
  return throughput_n / (double(n) * throughput_1);
}

double algbw(double bytes, double seconds) { return seconds > 0 ? bytes / seconds : NAN; }

double busbw_allreduce(double alg, int n) { return n > 0 ? alg * 2.0 * (n - 1) / n : NAN; }

// nccl-tests' PERFORMANCE.md: a ring reduce-scatter or all-gather moves (n−1)/n of the whole
// buffer through each rank's link, an allreduce (one of each) twice that.
double busbw(Collective c, double alg, int n) {
  if (c == Collective::allreduce) return busbw_allreduce(alg, n);
  return n > 0 ? alg * double(n - 1) / n : NAN;
}

ModelPlan model_plan(const ModelSpec& m) {
  if (m.is_list()) {
    if (m.input.size() != 3) throw InputError("model " + m.name + ": a layer list needs its image shape, name@C,H,W:list");
    return plan_model(parse_layer_list(m.list), TensorShape::image(m.input[0], m.input[1], m.input[2]), 0);
  }
  if (m.layers.size() < 2) throw InputError("model " + m.name + ": need at least an input and an output width");
  return plan_model(mlp_layer_list(m.layers, Act::relu), TensorShape::features(m.layers.front()), 0);
}

std::string ModelSpec::text() const {
  std::string o = name;
  if (is_list()) {
    o += "@";
    for (size_t i = 0; i < input.size(); ++i) o += (i ? "," : "") + std::to_string(input[i]);
  }
  if (weak_batch > 0) o += "/" + std::to_string(weak_batch) + (strong_batch > 0 ? "," + std::to_string(strong_batch) : "");
  if (is_list()) return o + ":" + list;
  o += ":";
  for (size_t i = 0; i < layers.size(); ++i) o += (i ? "," : "") + std::to_string(layers[i]);
  return o;
}

size_t param_count(const ModelSpec& m) {
  if (!m.is_list()) return param_count(m.layers);
  return size_t(model_plan(m).params);
}

std::vector<size_t> bucket_elements(const ModelSpec& m, double bucket_mb) {
  if (!m.is_list()) return bucket_elements(m.layers, bucket_mb);
  std::vector<size_t> sizes;
  for (const Bucket& b : plan_buckets(param_shapes(model_plan(m)), bucket_mb, 1, 0, false, false).buckets)
    sizes.push_back(b.elements);
  return sizes;
}

size_t param_count(const std::vector<int>& layers) {
  size_t p = 0;
  for (size_t i = 0; i + 1 < layers.size(); ++i) p += size_t(layers[i] + 1) * size_t(layers[i + 1]);
  return p;
}

// The Trainer's buckets (plan_buckets, one rank, whole layers): their parameter counts in
// reduction order.
std::vector<size_t> bucket_elements(const std::vector<int>& layers, double bucket_mb) {
  std::vector<size_t> sizes;
  for (const Bucket& b : plan_buckets(layers, bucket_mb, 1, 0, false, false).buckets) sizes.push_back(b.elements);
  return sizes;
}

namespace {
// min(count, max(floor, ⌈budget / probe⌉)), in doubles so a tiny probe cannot overflow an int.
int budgeted(int count, int floor, double budget_s, double probe_s) {
  if (!(budget_s > 0) || !(probe_s > 0) || !std::isfinite(probe_s)) return count;
  return int(std::min<double>(count, std::max<double>(floor, std::ceil(budget_s / probe_s))));
}
}  // namespace

bool budget_applies(const Settings& s) {
  return (s.timed_seconds > 0 && s.timed_steps > s.min_timed_steps) ||
         (s.warmup_seconds > 0 && s.warmup_steps > kMinWarmupSteps);
}

StepCounts step_counts(const Settings& s, double probe_s) {
  return {budgeted(s.warmup_steps, kMinWarmupSteps, s.warmup_seconds, probe_s),
          budgeted(s.timed_steps, s.min_timed_steps, s.timed_seconds, probe_s), probe_s};
}

Stat stat_of(std::vector<double> v) {
  Stat s;
  if (v.empty()) return {NAN, NAN, NAN};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.min = v.front();
  s.max = v.back();
  return s;
}

AlphaBeta fit_alpha_beta(int n, const std::vector<double>& m, const std::vector<double>& t) {
  // Minimise Σ w·(t − α − β·m)² with w = 1/t²: the 2×2 normal equations.
  double sw = 0, sm = 0, st = 0, smm = 0, smt = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    if (!(t[i] > 0)) continue;
    const double w = 1.0 / (t[i] * t[i]);
    sw += w, sm += w * m[i], st += w * t[i], smm += w * m[i] * m[i], smt += w * m[i] * t[i];
  }
  AlphaBeta ab;
  ab.n = n;
  ab.points = int(m.size());
  const double det = sw * smm - sm * sm;
  if (m.size() < 2 || !(std::fabs(det) > 0)) return ab;
  ab.beta = (sw * smt - sm * st) / det;
  ab.alpha = (st - ab.beta * sm) / sw;
  for (size_t i = 0; i < m.size(); ++i)
    if (t[i] > 0) ab.max_rel_err = std::max(ab.max_rel_err, std::fabs(ab.alpha + ab.beta * m[i] - t[i]) / t[i]);
  return ab;
}

RingModel ring_from(const AlphaBeta& ab) {
  RingModel r;
  if (ab.n < 2) return r;
  r.hop_latency = std::max(0.0, ab.alpha) / (2.0 * (ab.n - 1));
  r.bus_bw = ab.beta > 0 ? 2.0 * (ab.n - 1) / (double(ab.n) * ab.beta) : INFINITY;
  return r;
}

double RingModel::seconds(double bytes, int n) const {
  if (n < 2) return 0;
  return 2.0 * (n - 1) * hop_latency + 2.0 * (n - 1) / n * bytes / bus_bw;
}

std::string limiting_factor(double step, double math, double data, double imbalance_wait,
                            double exposed_comm, double latency_s) {
  if (!(step > 0)) return "-";
  if (step < latency_s) return "launch/latency-bound";
  // The largest part names the limit; the formats say which share the percentage is.
  struct Part {
    const char* fmt;
    double v;
  } parts[] = {{"compute-bound (%.0f%%)", math}, {"data (%.0f%%)", data},
               {"imbalance (%.0f%%)", imbalance_wait}, {"communication (exposed %.0f%%)", exposed_comm}};
  const Part* top = &parts[0];
  double total = 0;  // the parts' sum: the step, or more when noise puts compute above it
  for (const Part& p : parts) {
    total += std::max(0.0, p.v);
    if (p.v > top->v) top = &p;
  }
  const double whole = std::max(total, step);
  char buf[96];
  // Compute the largest part is not enough to call a step compute-bound: with a third of it
  // exposed communication, faster compute alone would not make it much faster. Above
  // kComputeBoundMaxExposed both shares are named.
  const double exposed_share = std::max(0.0, exposed_comm) / whole;
  if (top == &parts[0] && exposed_share >= kComputeBoundMaxExposed) {
    std::snprintf(buf, sizeof buf, "compute (%.0f%%) + communication (exposed %.0f%%)",
                  100.0 * std::max(0.0, math) / whole, 100.0 * exposed_share);
    return buf;
  }
  std::snprintf(buf, sizeof buf, top->fmt, 100.0 * std::max(0.0, top->v) / whole);
  return buf;
}

Breakdown breakdown(double step, const std::vector<double>& compute, const std::vector<double>& data, double latency_s) {
  Breakdown b;
  for (size_t r = 0; r < compute.size(); ++r) {
    b.compute_mean += compute[r] / double(compute.size());
    b.compute_max = std::max(b.compute_max, compute[r]);
  }
  for (double d : data) b.data_mean += d / double(data.size());
  b.imbalance_pct = b.compute_mean > 0 ? 100.0 * (b.compute_max - b.compute_mean) / b.compute_mean : NAN;
  b.exposed = std::max(0.0, step - b.compute_max);
  b.exposed_pct = step > 0 ? 100.0 * b.exposed / step : NAN;
  b.limit = limiting_factor(step, b.compute_mean - b.data_mean, b.data_mean, b.compute_max - b.compute_mean, b.exposed,
                            latency_s);
  return b;
}

}  // namespace dpt::scaling
