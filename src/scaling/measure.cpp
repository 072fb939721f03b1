// bench-scaling's measurements. Every one runs the product path: Trainer::run on each subset's
// own communicator (make_comm_for: NCCL bootstrapped over MPI_Bcast on GPUs), Comm's
// collectives for the sweeps. Step times are differences of two run lengths in fresh Trainers,
// so start-up, first-touch and warm-up cancel; "the step" is the slowest rank's (MPI_MAX).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>

#include "dpt/app.hpp"
#include "dpt/check.hpp"
#include "dpt/log.hpp"
#include "dpt/scaling.hpp"
#include "dpt/train.hpp"

namespace dpt::scaling {

QuietInfo::QuietInfo() : rank_(log::rank()) { log::set_rank(-1); }
QuietInfo::~QuietInfo() { log::set_rank(rank_); }

namespace {

using Clock = std::chrono::steady_clock;
double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// A timing run's config: synthetic data in order, no files, no evaluation, no progress lines.
Config timing_config(const Settings& s, const ModelSpec& m, int batch_per_rank) {
  Config c = s.base;
  c.layers = m.layers;
  c.layer_list = m.list;  // the synthetic images carry the list's input shape
  c.input_shape.clear();
  c.train_file = "(synthetic)";
  c.test_file.clear();
  c.init.clear();
  c.batch_per_rank = batch_per_rank;
  c.accumulate = 1;
  c.sync = "gradients";
  c.shuffle = false;
  c.epochs = 1 << 30;
  c.lr = 1e-3;  // small and constant: no run should reach non-finite values
  c.lr_scaling = "none";
  c.warmup_steps = 0;
  c.schedule = "constant";
  c.on_nonfinite = "skip";
  c.eval_every = 0;
  c.log_every = int64_t(1) << 40;
  c.progress = false;
  c.metrics_file.clear();
  c.ckpt_dir.clear();
  c.ckpt_at_start = false;
  c.resume = "none";
  return c;
}

double loop_seconds(Config c, int64_t steps, Backend& be, Comm& comm, const Dataset& ds) {
  c.steps = steps;
  std::unique_ptr<Trainer> t;
  {
    QuietInfo quiet;  // the model table: printed once at start
    t = std::make_unique<Trainer>(c, be, comm, &ds, nullptr);
  }
  return t->run().seconds;
}

// This rank's steady-state seconds per step: (t(W+S) − t(W)) / S.
double step_by_difference(const StepCounts& k, const Config& c, Backend& be, Comm& comm, const Dataset& ds) {
  const double a = loop_seconds(c, k.warmup, be, comm, ds);
  const double b = loop_seconds(c, k.warmup + k.timed, be, comm, ds);
  return (b - a) / k.timed;
}

// Seconds per Backend::load_batch of b rows (what the loop's data gather costs, timed alone).
double load_seconds(Backend& be, const Dataset& ds, int b, int iters) {
  Buffer<float> x(be, size_t(b) * size_t(ds.dim));
  Buffer<int32_t> y(be, size_t(b));
  std::vector<int64_t> rows(size_t(ds.n));
  std::iota(rows.begin(), rows.end(), 0);
  const int64_t spans = std::max<int64_t>(1, ds.n / b);
  for (int i = 0; i < 3; ++i) be.load_batch(ds, rows.data(), b, x.data(), y.data());
  be.synchronize();
  const double t0 = now_s();
  for (int i = 0; i < iters; ++i) be.load_batch(ds, rows.data() + (i % spans) * b, b, x.data(), y.data());
  be.synchronize();
  return (now_s() - t0) / iters;
}

std::vector<double> gather(MPI_Comm c, double v) {
  int n = 1;
  MPI_Comm_size(c, &n);
  std::vector<double> all(static_cast<size_t>(n));
  DPT_CHECK_MPI(MPI_Gather(&v, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, c));
  return all;
}

double max_over(MPI_Comm c, double v) {
  DPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, c));
  return v;
}

// One timing row's raw figures (rank 0 of the subset holds the gathered ones).
struct RowTiming {
  StepCounts steps;              // warm-up and timed steps of every run pair, and the probe
  Stat step;                     // seconds, slowest rank, over repeats
  std::vector<double> compute;   // per rank: median no-communication step
  std::vector<double> data;      // per rank: load_batch of its batch
};

RowTiming time_row(Context& cx, MPI_Comm sub, Comm& comm, const Config& c, const Dataset& ds, bool breakdown) {
  const Settings& s = *cx.s;
  // The same rank and size as the real run (the same rows, bucket layout and optimizer shard),
  // the same stream order and graph capture, nothing sent.
  auto alone = make_null_comm(comm.rank(), comm.size(), cx.be, comm.capturable());
  std::vector<double> full, compute;
  RowTiming t;
  // The untimed first run (one-time costs: on a GPU the dataset's upload and the libraries'
  // lazy set-up) and the probe; the compute runs take the same counts as the real ones.
  t.steps = plan_steps(s, sub, [&](int64_t k) { return loop_seconds(c, k, *cx.be, comm, ds); });
  for (int r = 0; r < s.repeats; ++r) {
    DPT_CHECK_MPI(MPI_Barrier(sub));
    full.push_back(max_over(sub, step_by_difference(t.steps, c, *cx.be, comm, ds)));
    if (!breakdown) continue;
    // Every rank of the subset runs its compute at the same time, as in the real loop, so
    // shared resources (cores, memory bandwidth, PCIe) are contended alike.
    DPT_CHECK_MPI(MPI_Barrier(sub));
    compute.push_back(step_by_difference(t.steps, c, *cx.be, *alone, ds));
  }
  t.step = stat_of(full);
  if (breakdown) {
    t.compute = gather(sub, stat_of(compute).med);
    t.data = gather(sub, load_seconds(*cx.be, ds, c.batch_per_rank, s.data_iters));
  }
  return t;
}

Dataset synthetic_for(const ModelSpec& m, int64_t rows) {
  const ModelPlan plan = model_plan(m);
  Dataset ds = synth_blobs(rows, int(plan.input.size()), int(plan.output().c), 1.f, 7);
  if (m.is_list()) ds.sample_shape = {m.input[0], m.input[1], m.input[2]};
  ds.path = "(synthetic " + std::to_string(rows) + " rows)";
  return ds;
}

const std::vector<Column> kScalingCols = {
    {"model", "model", "", ""},
    {"mode", "mode", "", ""},
    {"variant", "variant", "", ""},
    {"ranks", "ranks", "", "%.0f"},
    {"batch_per_rank", "b/rank", "samples", "%.0f"},
    {"global_batch", "global", "samples", "%.0f"},
    {"step_ms", "step", "ms", "%.3f"},
    {"step_min_ms", "min", "ms", "%.3f"},
    {"step_max_ms", "max", "ms", "%.3f"},
    {"timed_steps", "timed", "steps", "%.0f"},
    {"warmup_steps", "warm", "steps", "%.0f"},
    {"probe_ms", "probe", "ms", "%.3f"},
    {"samples_per_s", "throughput", "samples/s", "%.0f"},
    {"efficiency", "eff", "", "%.3f"},
    {"efficiency_vs_best1", "eff/best1", "", "%.3f"},
    {"compute_ms", "compute", "ms mean", "%.3f"},
    {"compute_max_ms", "cmp max", "ms", "%.3f"},
    {"data_ms", "data", "ms", "%.3f"},
    {"imbalance_pct", "imbal", "%", "%.1f"},
    {"exposed_comm_ms", "exp comm", "ms", "%.3f"},
    {"exposed_comm_pct", "exp comm", "% step", "%.1f"},
    {"limit", "limiting factor", "", ""},
    {"compute_per_rank_ms", "compute per rank", "ms", ""},
};

std::vector<Cell> scaling_row(const Settings& s, const ModelSpec& m, const char* mode, const Variant& v, int n, int b,
                              const RowTiming& t) {
  const double step = t.step.med;
  const Breakdown bd = breakdown(step, t.compute, t.data, s.latency_ms * 1e-3);
  std::string per_rank;
  for (size_t r = 0; r < t.compute.size(); ++r) per_rank += (r ? " " : "") + fmt("%.3f", t.compute[r] * 1e3);
  const double G = double(b) * n;
  const bool resolved = step > 0;  // else the two run lengths' difference drowned in noise: no figure
  const bool probed = std::isfinite(t.steps.probe_s);
  return {txt(m.name), txt(mode), txt(v.name()), num(n), num(b), num(G), resolved ? num(step * 1e3) : none(),
          num(t.step.min * 1e3), num(t.step.max * 1e3), num(t.steps.timed), num(t.steps.warmup),
          probed ? num(t.steps.probe_s * 1e3) : none(), resolved ? num(G / step) : none(), none(), none(),
          num(bd.compute_mean * 1e3), num(bd.compute_max * 1e3), num(bd.data_mean * 1e3),
          resolved ? num(bd.imbalance_pct) : none(), resolved ? num(bd.exposed * 1e3) : none(),
          resolved ? num(bd.exposed_pct) : none(), txt(resolved ? bd.limit : "unresolved: raise scaling.timed_steps (or timed_seconds)"),
          txt(per_rank)};
}

size_t col(const Table& t, const std::string& key) {
  for (size_t j = 0; j < t.cols.size(); ++j)
    if (t.cols[j].key == key) return j;
  throw Error("bench-scaling: no column " + key + " in table " + t.name);
}

// Efficiency against the same model, mode and variant on one rank, and against the fastest
// variant on one rank (so a variant that slows the one-rank step cannot flatter itself).
void fill_efficiency(Table& t) {
  const size_t eff = col(t, "efficiency"), best = col(t, "efficiency_vs_best1");
  for (size_t i = 0; i < t.rows.size(); ++i) {
    double own = NAN, fastest = NAN;
    for (size_t j = 0; j < t.rows.size(); ++j) {
      if (t.at(j, "ranks")->num != 1 || t.at(j, "model")->text != t.at(i, "model")->text ||
          t.at(j, "mode")->text != t.at(i, "mode")->text || t.at(j, "samples_per_s")->empty)
        continue;
      const double thr = t.at(j, "samples_per_s")->num;
      if (t.at(j, "variant")->text == t.at(i, "variant")->text) own = thr;
      if (!(fastest >= thr)) fastest = thr;
    }
    if (t.at(i, "samples_per_s")->empty) continue;
    const double thr = t.at(i, "samples_per_s")->num;
    const int n = int(t.at(i, "ranks")->num);
    t.rows[i][eff] = num(efficiency(thr, n, own));
    t.rows[i][best] = num(efficiency(thr, n, fastest));
  }
}

}  // namespace

std::unique_ptr<Comm> subset_comm(Context& cx, MPI_Comm sub) {
  Runtime rt;
  rt.node = cx.node;  // placement is the world's: one device per world rank
  // make_comm_for reads only the backend and the node; lend it the backend for the call.
  struct Lend {
    Runtime& rt;
    Lend(Runtime& r, Backend* be) : rt(r) { rt.backend.reset(be); }
    ~Lend() { (void)rt.backend.release(); }
  } lend(rt, cx.be);
  make_comm_for(cx.s->base, sub, rt);
  return std::move(rt.comm);
}

StepCounts plan_steps(const Settings& s, MPI_Comm c, const std::function<double(int64_t)>& loop) {
  if (!budget_applies(s)) {
    loop(s.warmup_steps);
    return {s.warmup_steps, s.timed_steps, NAN};
  }
  const int p = std::min(s.warmup_steps, kMinWarmupSteps);
  loop(p);
  DPT_CHECK_MPI(MPI_Barrier(c));
  const double a = loop(p);
  const double b = loop(2 * p);
  // The slowest rank's, reduced exactly (MPI_MAX), so every rank computes the same counts.
  return step_counts(s, max_over(c, (b - a) / p));
}

// ---------------------------------------------------------------------------------------------

namespace {

// The variants a subset measures: those whose timing config dptrain accepts (the others are
// named in the table's notes, on every rank alike: validate is pure).
std::vector<Variant> runnable_variants(const Settings& s, const ModelSpec& m, std::vector<std::string>& notes) {
  std::vector<Variant> out;
  for (const Variant& v : variants_of(s)) {
    try {
      validate(v.apply(timing_config(s, m, s.weak_batch(m))));
      out.push_back(v);
    } catch (const InputError& e) {
      notes.push_back("variant " + v.name() + " not measured: " + e.what());
    }
  }
  return out;
}

}  // namespace

Table measure_scaling(Context& cx) {
  const Settings& s = *cx.s;
  Table t{"scaling", "Weak and strong scaling per variant, with where the step time goes", kScalingCols, {}, {}};
  const std::vector<int> ns = subset_sizes(cx.size, s.max_ranks);
  const int nmax = ns.back();
  for (const ModelSpec& m : s.models) {
    const int64_t rows = 4 * std::max<int64_t>(int64_t(s.weak_batch(m)) * nmax, s.strong_batch(m));
    const Dataset ds = synthetic_for(m, rows);
    const std::vector<Variant> variants = runnable_variants(s, m, t.notes);
    for (int n : ns) {
      SubComm sub(cx.world, n);
      if (sub.member()) {
        auto comm = subset_comm(cx, sub.get());
        for (const Variant& v : variants) {
          // A strong row whose batch per rank is the weak one's is the same run: timed once.
          std::map<int, RowTiming> by_batch;
          for (const char* mode : {"weak", "strong"}) {
            const bool weak = mode[0] == 'w';
            if (!weak && s.strong_batch(m) % n != 0) continue;
            const int b = weak ? s.weak_batch(m) : s.strong_batch(m) / n;
            if (!by_batch.count(b))
              by_batch[b] = time_row(cx, sub.get(), *comm, v.apply(timing_config(s, m, b)), ds, true);
            const RowTiming& rt = by_batch[b];
            if (cx.rank == 0) {
              t.rows.push_back(scaling_row(s, m, mode, v, n, b, rt));
              log::info("scaling: " + m.name + " " + mode + " " + v.name() + " n=" + std::to_string(n) + " step " +
                        fmt("%.3f", rt.step.med * 1e3) + " ms");
            }
          }
        }
      }
      idle_barrier(cx.world);
    }
  }
  fill_efficiency(t);
  std::vector<std::string> notes = {
      "variant: train.shard_optimizer (unsharded/sharded) and comm.grad_dtype (fp32/bf16 gradients on the wire) of the timed runs.",
      "step: slowest rank's seconds per step = (t(W+S) - t(W)) / S in fresh Trainers, median (min, max) of the repeats.",
      "timed, warm: S and W of that row. With a time budget (scaling.timed_seconds, warmup_seconds) a slow row takes fewer: "
      "S = min(timed_steps, max(min_timed_steps, ceil(timed_seconds / probe))), W = min(warmup_steps, max(5, "
      "ceil(warmup_seconds / probe))); probe: the slowest rank's (t(2P) - t(P)) / P, P = min(warmup_steps, 5), "
      "taken before the repeats (empty: no budget could shorten the row, not probed).",
      "compute: the same loop with nothing sent (a Comm on MPI_COMM_SELF with the subset's rank and size and the transport's stream order), all ranks at once; mean and max over ranks.",
      "data: Backend::load_batch of one batch timed alone (an estimate of the loop's gather, which it contains).",
      "imbal = (max - mean) / mean of per-rank compute; exp comm = step - max compute (communication and sync not hidden behind compute), per variant.",
      "eff = throughput(n) / (n x throughput(1)), same model, mode and variant; eff/best1: against the fastest variant on 1 rank.",
      "a strong row whose batch per rank equals the weak row's is the same measurement, shown in both modes."};
  notes.insert(notes.end(), t.notes.begin(), t.notes.end());
  t.notes = notes;
  return t;
}

// ---------------------------------------------------------------------------------------------

namespace {

// One collective's buffers and its exact expected result. Every value is a small integer, so the
// float sum is exact in any order: rank r contributes (r+1)·(i mod 13 + 1) at element i of the
// whole buffer (all-gather: at element i of its own slice).
struct CollectiveRun {
  Collective kind;
  int n, rank;
  size_t max_count;  // elements per call argument at the largest size
  Buffer<float> send, recv;

  CollectiveRun(Backend& be, Collective k, int n_, int rank_, size_t max_count_)
      : kind(k), n(n_), rank(rank_), max_count(max_count_),
        send(be, k == Collective::reduce_scatter ? size_t(n_) * max_count_ : max_count_),
        recv(be, k == Collective::all_gather ? size_t(n_) * max_count_ : max_count_) {
    std::vector<float> h(send.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = float((rank + 1) * int(i % 13 + 1));
    be.upload(send.data(), h.data(), h.size() * sizeof(float));
  }
  size_t recv_count(size_t count) const { return kind == Collective::all_gather ? size_t(n) * count : count; }
  void run(Comm& c, size_t count) {
    switch (kind) {
      case Collective::allreduce: c.allreduce(send.data(), recv.data(), count, DType::f32, RedOp::sum); break;
      case Collective::reduce_scatter: c.reduce_scatter(send.data(), recv.data(), count, DType::f32, RedOp::sum); break;
      case Collective::all_gather: c.allgather(send.data(), recv.data(), count, DType::f32); break;
    }
  }
  // Elements of the result (count per call) that differ from the exact one.
  double wrong(Backend& be, size_t count) const {
    std::vector<float> h(recv_count(count));
    be.download(h.data(), recv.data(), h.size() * sizeof(float));
    const double tri = double(n) * (n + 1) / 2;
    const size_t first = kind == Collective::reduce_scatter ? size_t(rank) * count : 0;  // this rank's slice
    double bad = 0;
    for (size_t q = 0; q < h.size() / count; ++q)  // all-gather: rank q's slice; else one slice
      for (size_t j = 0; j < count; ++j) {
        const double want = kind == Collective::all_gather ? double(q + 1) * double(j % 13 + 1)
                                                            : tri * double((first + j) % 13 + 1);
        bad += h[q * count + j] != float(want);
      }
    return bad;
  }
};

const std::vector<Column> kCollectiveCols = {{"ranks", "ranks", "", "%.0f"},
                                             {"bytes", "size", "B", "%.0f"},
                                             {"count", "count", "elements", "%.0f"},
                                             {"type", "type", "", ""},
                                             {"redop", "redop", "", ""},
                                             {"time_us", "time", "us", "%.1f"},
                                             {"time_min_us", "min", "us", "%.1f"},
                                             {"time_max_us", "max", "us", "%.1f"},
                                             {"algbw_gbs", "algbw", "GB/s", "%.3f"},
                                             {"busbw_gbs", "busbw", "GB/s", "%.3f"},
                                             {"wrong", "#wrong", "elements", "%.0f"}};

}  // namespace

Table measure_collective(Context& cx, Collective coll) {
  const Settings& s = *cx.s;
  const bool ar = coll == Collective::allreduce, ag = coll == Collective::all_gather;
  const std::string name = collective_name(coll);
  const char* call = ar ? "Comm::allreduce" : ag ? "Comm::allgather" : "Comm::reduce_scatter";
  Table t{name, std::string(ar ? "Allreduce" : ag ? "All-gather" : "Reduce-scatter") + " alone (" + call +
                    ", float32" + (ag ? "" : " sum") + ", out of place), nccl-tests definitions",
          kCollectiveCols, {}, {}};
  std::vector<double> sizes;
  for (double b = s.ar_min_bytes; b <= s.ar_max_bytes * 1.0000001; b *= s.ar_factor) sizes.push_back(std::floor(b / 4) * 4);
  for (int n : subset_sizes(cx.size, s.max_ranks)) {
    if (n < 2) continue;
    SubComm sub(cx.world, n);
    if (sub.member()) {
      auto comm = subset_comm(cx, sub.get());
      // As nccl-tests: the size is the whole buffer (reduce-scatter's input, all-gather's
      // output), so each rank's count is size / n.
      auto count_of = [&](double bytes) { return std::max<size_t>(1, size_t(bytes / 4) / (ar ? 1 : size_t(n))); };
      CollectiveRun run(*cx.be, coll, n, comm->rank(), count_of(sizes.back()));
      for (double bytes : sizes) {
        const size_t count = count_of(bytes);
        std::vector<double> times;
        double wrong = 0;
        for (int r = 0; r < s.ar_repeats; ++r) {
          cx.be->fill(run.recv.data(), run.recv_count(count), -1.f);
          for (int w = 0; w < s.ar_warmup; ++w) run.run(*comm, count);
          comm->synchronize();
          cx.be->synchronize();
          DPT_CHECK_MPI(MPI_Barrier(sub.get()));
          const double t0 = now_s();
          for (int i = 0; i < s.ar_iters; ++i) run.run(*comm, count);
          comm->synchronize();
          cx.be->synchronize();
          times.push_back(max_over(sub.get(), (now_s() - t0) / s.ar_iters));
          wrong += run.wrong(*cx.be, count);
        }
        DPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_DOUBLE, MPI_SUM, sub.get()));
        const Stat st = stat_of(times);
        const double B = double(count) * (ar ? 1 : n) * 4, alg = algbw(B, st.med);
        if (cx.rank == 0)
          t.rows.push_back({num(n), num(B), num(double(count)), txt("float"), txt(ag ? "none" : "sum"), num(st.med * 1e6),
                            num(st.min * 1e6), num(st.max * 1e6), num(alg / 1e9), num(busbw(coll, alg, n) / 1e9),
                            num(wrong)});
      }
      if (cx.rank == 0) log::info(name + ": n=" + std::to_string(n) + " done");
    }
    idle_barrier(cx.world);
  }
  t.notes = {"time: slowest rank's mean per call over the timed iterations (after untimed warm-up), median (min, max) of the repeats."};
  if (ar)
    t.notes.push_back("algbw = size / time; busbw = algbw x 2(n-1)/n (nccl-tests' allreduce bus bandwidth, comparable with all_reduce_perf).");
  else
    t.notes.push_back(std::string("size = the whole ") + (ag ? "output (n x count)" : "input (n x count)") +
                      ", count = elements per rank, as nccl-tests; algbw = size / time; busbw = algbw x (n-1)/n "
                      "(comparable with " + (ag ? "all_gather_perf" : "reduce_scatter_perf") + ").");
  t.notes.push_back("#wrong: elements of the last result that differ from the exact one, over all ranks and repeats.");
  if (cx.size < 2) t.notes.push_back("one rank: no " + name + " to measure.");
  return t;
}

Table measure_allreduce(Context& cx) { return measure_collective(cx, Collective::allreduce); }

// ---------------------------------------------------------------------------------------------

Table measure_buckets(Context& cx) {
  const Settings& s = *cx.s;
  Table t{"buckets", "Gradient bucket size sweep (weak-scaling batch, the real loop)",
          {{"model", "model", "", ""},
           {"ranks", "ranks", "", "%.0f"},
           {"bucket_mb", "bucket", "MB", "%.3g"},
           {"buckets", "buckets", "", "%.0f"},
           {"largest_mb", "largest", "MB", "%.2f"},
           {"step_ms", "step", "ms", "%.3f"},
           {"step_min_ms", "min", "ms", "%.3f"},
           {"step_max_ms", "max", "ms", "%.3f"},
           {"samples_per_s", "throughput", "samples/s", "%.0f"},
           {"vs_best_pct", "vs best", "% slower", "%.1f"},
           {"best", "best", "", ""},
           {"timed_steps", "timed", "steps", "%.0f"}},
          {},
          {}};
  for (const ModelSpec& m : s.models) {
    const Dataset ds = synthetic_for(m, 4 * int64_t(s.weak_batch(m)) * cx.size);
    for (int n : subset_sizes(cx.size, s.max_ranks)) {
      if (n < 2) continue;
      SubComm sub(cx.world, n);
      if (sub.member()) {
        auto comm = subset_comm(cx, sub.get());
        const size_t first = t.rows.size();
        for (double mb : s.bucket_mb) {
          Config c = timing_config(s, m, s.weak_batch(m));
          c.bucket_mb = mb;
          const RowTiming rt = time_row(cx, sub.get(), *comm, c, ds, false);
          const auto bk = bucket_elements(m, mb);
          const double largest = double(*std::max_element(bk.begin(), bk.end())) * 4 / (1 << 20);
          const bool resolved = rt.step.med > 0;
          if (cx.rank == 0)
            t.rows.push_back({txt(m.name), num(n), num(mb), num(double(bk.size())), num(largest),
                              resolved ? num(rt.step.med * 1e3) : none(), num(rt.step.min * 1e3), num(rt.step.max * 1e3),
                              resolved ? num(double(s.weak_batch(m)) * n / rt.step.med) : none(), none(),
                              txt(resolved ? "" : "unresolved"), num(rt.steps.timed)});
        }
        if (cx.rank == 0 && t.rows.size() > first) {
          size_t best = t.rows.size();
          for (size_t i = first; i < t.rows.size(); ++i)
            if (!t.rows[i][5].empty && (best == t.rows.size() || t.rows[i][5].num < t.rows[best][5].num)) best = i;
          for (size_t i = first; best < t.rows.size() && i < t.rows.size(); ++i)
            t.rows[i][9] = num(100.0 * (t.rows[i][5].num / t.rows[best][5].num - 1));
          if (best < t.rows.size()) t.rows[best][10] = txt("*");
          log::info("buckets: " + m.name + " n=" + std::to_string(n) + " done");
        }
      }
      idle_barrier(cx.world);
    }
  }
  t.notes = {"buckets: how many allreduces a step makes (consecutive layers from the last, each at least the bucket size).",
             "best (*): the fastest bucket size for that model and rank count; vs best = how much slower each other size is.",
             "step and timed: as in the scaling table (timed steps within scaling.timed_seconds, warm-up and repeats alike)."};
  if (cx.size < 2) t.notes.push_back("one rank: no gradient allreduce, no bucket sweep.");
  return t;
}

}  // namespace dpt::scaling
