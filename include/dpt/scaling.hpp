// bench-scaling's harness: power-of-two subsets of the ranks, each with its own communicator;
// step times by difference of two run lengths (the real loop, the loop with communication
// removed, data loading alone) for each variant of the gradient path (sharded optimizer or not,
// fp32 or bf16 on the wire); the allreduce, reduce-scatter and all-gather sweeps with a
// correctness count; the bucket sweep; the batch-size / learning-rate grid on a real dataset and
// the time to a target accuracy it predicts and measures on N ranks; the alpha-beta model; the
// PyTorch DDP peer (bench/torch_ddp.py under torchrun); and the report (fixed-width table, CSV,
// records.json through nlohmann-json, Markdown read back from it, plots drawn by
// bench/plot_scaling.py with matplotlib). Drives Trainer and Comm through their public
// interfaces only; knows nothing of how a layer or a transport works inside.
#pragma once
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/comm.hpp"
#include "dpt/config.hpp"
#include "dpt/data.hpp"
#include "dpt/layer_spec.hpp"

namespace dpt::scaling {

// ---------------------------------------------------------------------------------------------
// Settings: dptrain's own sections ([model] [data] [train] [comm] [device]) read by dptrain's
// option table into `base`; the sweep's sections ([scaling] [allreduce] [buckets] [grid]
// [predict] [report]) read here. [cpu] holds `section.key = value` overrides applied when the
// backend is the CPU one; the command line (--section.key value, --out DIR) wins over both.

// A model of the sweep: the MLP shorthand (layers: widths, input first, on synthetic feature
// vectors) or a layer list (list, normalised, on synthetic C×H×W images of `input`).
struct ModelSpec {
  std::string name;
  std::vector<int> layers;  // the MLP shorthand's widths, else empty
  std::string list = {};        // a layer list, else ""
  std::vector<int> input = {};  // a layer list's image shape C,H,W
  int weak_batch = 0;    // samples per rank of its weak-scaling and bucket rows (0: scaling.weak_batch_per_rank)
  int strong_batch = 0;  // global batch of its strong-scaling rows (0: scaling.strong_global_batch)
  bool is_list() const { return !list.empty(); }
  // As scaling.models writes it: name[/W[,S]]:widths or name@C,H,W[/W[,S]]:list.
  std::string text() const;
};
// scaling.models' value: models separated by whitespace (MLP widths) or, where any is a layer
// list, by ';' — `default:784,256,10; cnn@1,28,28:conv(32,3,pad=1) relu maxpool(2) flatten linear(10)`.
// `/W` or `/W,S` before the ':' gives that model its own weak batch per rank (W) and strong
// global batch (S, else the [scaling] one): `rn50@3,224,224/64,256:resnet50(classes=10)`.
// Throws InputError naming the model and what is wrong.
std::vector<ModelSpec> parse_models(const std::string& value);
// A model's shapes: a layer list on its images, the MLP shorthand on its first width.
ModelPlan model_plan(const ModelSpec& m);

// One gradient path measured side by side with the others: optimizer state sharded over the
// ranks or not (train.shard_optimizer), gradients on the wire in fp32 or bf16 (comm.grad_dtype).
struct Variant {
  bool sharded = false;
  std::string wire = "fp32";
  std::string name() const;  // "unsharded-fp32", "sharded-bf16", ...
  Config apply(Config c) const;
  bool operator==(const Variant& o) const { return sharded == o.sharded && wire == o.wire; }
};
// "unsharded-fp32" | "unsharded-bf16" | "sharded-fp32" | "sharded-bf16"; throws InputError
// naming the key (scaling.variants), the value and where it came from.
Variant parse_variant(const std::string& text, const std::string& where);
// The base config's own gradient path.
Variant variant_of(const Config& c);

enum class Collective { allreduce, reduce_scatter, all_gather };
std::string collective_name(Collective c);  // "allreduce", "reduce_scatter", "all_gather"

// The report folder when neither --out nor [report] out names one: relative to the current
// directory, so a run never writes into the repository's bench/results unless asked to.
inline constexpr const char* kDefaultOutDir = "scaling-report";

struct Settings {
  Config base;
  std::string source;   // the INI path or "(built-in defaults)"
  std::string command;  // argv joined, for the report
  std::string out_dir;
  std::string help;  // non-empty: --help was asked; print it and exit 0
  // [scaling]
  std::vector<ModelSpec> models;
  int weak_batch_per_rank = 256;
  int strong_global_batch = 1024;
  // A model's batches: its own (scaling.models' /W,S) or the two above.
  int weak_batch(const ModelSpec& m) const { return m.weak_batch > 0 ? m.weak_batch : weak_batch_per_rank; }
  int strong_batch(const ModelSpec& m) const { return m.strong_batch > 0 ? m.strong_batch : strong_global_batch; }
  int warmup_steps = 50, timed_steps = 200, repeats = 3;
  // Time budgets per timing (0 = off: every timing takes warmup_steps and timed_steps): a timing
  // whose step is slow takes fewer steps (step_counts). The defaults trip at 10 ms per step, so
  // the MLPs and the CNN (0.1–5 ms on a GPU) keep their 50 + 200.
  double timed_seconds = 2.0;
  double warmup_seconds = 0.5;
  int min_timed_steps = 20;  // the budget never takes fewer timed steps (nor more than timed_steps)
  int data_iters = 100;       // load_batch calls timed for the data share
  double latency_ms = 0.05;   // a step shorter than this is called launch/latency-bound
  int max_ranks = 0;          // 0 = the whole world
  std::vector<Variant> variants;  // empty: the base config's own (variants_of)
  // [allreduce]: every collective sweep (allreduce, reduce-scatter, all-gather)
  std::vector<Collective> collectives{Collective::allreduce, Collective::reduce_scatter, Collective::all_gather};
  double ar_min_bytes = 1024, ar_max_bytes = 256.0 * (1 << 20), ar_factor = 2;
  int ar_warmup = 5, ar_iters = 20, ar_repeats = 3;
  // [buckets]
  std::vector<double> bucket_mb{1, 4, 16, 64, 256};
  // [grid]
  bool grid = true;
  std::string grid_config;  // a dptrain INI for the grid's model, data and optimizer ("" = base)
  Config grid_base;         // the grid's dptrain configuration (grid_config's, or base)
  std::vector<std::string> grid_optimizers;  // "name:lr"; empty = grid_base's optimizer and lr
  std::vector<int> grid_batches{64, 256, 1024, 4096};
  std::vector<std::string> grid_rules{"none", "linear", "sqrt"};
  std::vector<int> grid_warmup{0, 1};
  double grid_epochs = 5;
  int grid_min_steps = 0;         // every run takes at least this many steps
  int grid_max_batch_per_rank = 4096;  // larger per-rank batches use train.accumulate
  double warmup_epochs = 0.5;
  int grid_warmup_min_steps = 0;  // warm-up on: at least this many steps (large batches)
  double target_accuracy = 0.85;
  int grid_evals = 10;  // evaluations per run (time-to-target resolution)
  bool grid_check = true;  // measure the predicted fastest setting on every subset
  // [predict]
  int predict_max_ranks = 64;
  // [report]
  std::vector<std::string> sections{"scaling", "allreduce", "buckets", "grid"};  // what runs
  bool plots = true;  // run bench/plot_scaling.py when python3 and matplotlib are there
  bool section(const std::string& name) const;
  // [ddp]: the PyTorch DDP peer, run by rank 0 through torchrun after dptrain's measurements
  std::string ddp_run = "gpu";  // gpu (only with the CUDA backend) | always (CPU too, gloo) | never
  std::string ddp_python = "python3";
  std::string ddp_torchrun_args = "--standalone";  // arguments of -m torch.distributed.run
  std::string ddp_script = "bench/torch_ddp.py";
  std::vector<double> ddp_buckets_mb{25, 50, 100, 200};
  std::string ddp_compile = "step";  // none | model | step | both
  int ddp_warmup = 20, ddp_steps = 50, ddp_repeats = 5;
  double ddp_timeout_s = 600;  // per torchrun launch
};

// Reads --config on rank 0, broadcasts it, parses. The [cpu] overrides are applied by
// finalize_settings once the backend is known. Throws InputError naming key, value and file.
Settings read_settings(MPI_Comm c, int argc, char** argv);
std::vector<Variant> variants_of(const Settings& s);  // s.variants, or the base config's own
void finalize_settings(Settings& s, bool cpu_backend);
std::string settings_text(const Settings& s);  // resolved sweep settings, INI-like
std::string settings_help();

// ---------------------------------------------------------------------------------------------
// Rank subsets.

// 1, 2, 4, … up to world (and at most max_ranks when > 0).
std::vector<int> subset_sizes(int world, int max_ranks = 0);

// The first n ranks of `parent` as their own MPI communicator (MPI_COMM_NULL on the others).
// Move-only; frees the communicator.
class SubComm {
 public:
  SubComm(MPI_Comm parent, int n);
  ~SubComm();
  SubComm(const SubComm&) = delete;
  SubComm& operator=(const SubComm&) = delete;
  bool member() const { return c_ != MPI_COMM_NULL; }
  MPI_Comm get() const { return c_; }

 private:
  MPI_Comm c_ = MPI_COMM_NULL;
};

// A barrier that sleeps instead of spinning, so ranks left out of a subset do not take CPU
// from those measuring.
void idle_barrier(MPI_Comm c);

// A Comm whose collectives send nothing, over MPI_COMM_SELF, that reports the given rank and
// size: the training loop then lays out its buckets and shards, takes its rows and captures its
// step as on `size` ranks, and runs its compute alone (the loss is wrong, the compute time is
// right). With `lanes`, each collective and synchronize() order its streams as the NCCL
// transport does (Backend::side_wait / main_wait); `capturable` as the transport it stands for.
std::unique_ptr<Comm> make_null_comm(int rank = 0, int size = 1, Backend* lanes = nullptr, bool capturable = true);

// ---------------------------------------------------------------------------------------------
// Arithmetic, all pure (tested).

// The steps one timing takes. With a budget on, timed = min(timed_steps, max(min_timed_steps,
// ⌈timed_seconds / probe⌉)) and warmup = min(warmup_steps, max(kMinWarmupSteps, ⌈warmup_seconds /
// probe⌉)), probe being the slowest rank's seconds per step; a probe that is not positive and
// finite (noise on a fast step) leaves the counts as configured.
inline constexpr int kMinWarmupSteps = 5;  // the eager first step and the graph capture are the first two
struct StepCounts {
  int warmup = 0, timed = 0;
  double probe_s = NAN;  // what they came from; NaN: not probed (no budget could shorten them)
};
StepCounts step_counts(const Settings& s, double probe_s);
// Whether a probe can change anything: a budget on and its count above its floor.
bool budget_applies(const Settings& s);

// Scaling efficiency = throughput(n) / (n × throughput(1)).
double efficiency(double throughput_n, int n, double throughput_1);
// nccl-tests: algbw = bytes / time, bytes being the whole buffer (for reduce-scatter the input,
// for all-gather the output: n × the per-rank count); busbw = algbw × 2(n−1)/n for allreduce,
// algbw × (n−1)/n for reduce-scatter and all-gather.
double algbw(double bytes, double seconds);
double busbw_allreduce(double algbw, int n);
double busbw(Collective c, double algbw, int n);
// Gradient bucket sizes in elements, as the Trainer builds them (consecutive layers from the
// last, each at least bucket_mb, the first layer's bucket possibly smaller).
std::vector<size_t> bucket_elements(const std::vector<int>& layers, double bucket_mb);
std::vector<size_t> bucket_elements(const ModelSpec& m, double bucket_mb);
size_t param_count(const std::vector<int>& layers);
size_t param_count(const ModelSpec& m);

struct Stat {
  double med = 0, min = 0, max = 0;
};
Stat stat_of(std::vector<double> v);

// t(m) = alpha + beta·m, least squares weighted by 1/t² (relative error), so the small-message
// latency and the large-message bandwidth both count.
struct AlphaBeta {
  int n = 0;
  double alpha = 0, beta = 0;  // seconds, seconds per byte
  double max_rel_err = 0;      // over the fitted points
  int points = 0;
};
AlphaBeta fit_alpha_beta(int n, const std::vector<double>& bytes, const std::vector<double>& seconds);
// Ring allreduce: t = 2(n−1)·a + 2(n−1)/n · m / bw. From one fitted rank count: a = α/(2(n−1)),
// bw = 2(n−1)/(n·β) (the busbw asymptote). Predicts any n.
struct RingModel {
  double hop_latency = 0;  // seconds per step of the ring
  double bus_bw = 0;       // bytes per second
  double seconds(double bytes, int n) const;
};
RingModel ring_from(const AlphaBeta& ab);

// What limits a step, from its parts (seconds): the largest share, unless the step is shorter
// than latency_s ("launch/latency-bound"). "compute-bound" needs compute to be the largest part
// and exposed communication under kComputeBoundMaxExposed of the step; with compute the largest
// and more exposed, both are named: "compute (58%) + communication (exposed 32%)".
inline constexpr double kComputeBoundMaxExposed = 0.10;
std::string limiting_factor(double step, double math, double data, double imbalance_wait,
                            double exposed_comm, double latency_s);

// Where one step's time goes (seconds), from the slowest rank's step and every rank's compute
// (the loop with no communication) and data (load_batch alone): exposed communication =
// step − the slowest rank's compute, never negative.
struct Breakdown {
  double compute_mean = 0, compute_max = 0, data_mean = 0;
  double imbalance_pct = 0;  // (max − mean) / mean of the compute
  double exposed = 0, exposed_pct = 0;
  std::string limit;
};
Breakdown breakdown(double step, const std::vector<double>& compute, const std::vector<double>& data, double latency_s);

// ---------------------------------------------------------------------------------------------
// Report tables: a value is a number (kept at full precision for CSV/JSON, shown with the
// column's printf format) or text; empty means not measured.

struct Column {
  std::string key;   // CSV/JSON name
  std::string head;  // table header
  std::string unit;  // units row
  std::string fmt;   // printf format for numbers; "" = text
};

struct Cell {
  bool is_num = false, empty = true;
  double num = 0;
  std::string text;
};
Cell num(double v);
Cell txt(const std::string& s);
Cell none();

struct Table {
  std::string name, title;
  std::vector<Column> cols;
  std::vector<std::vector<Cell>> rows;
  std::vector<std::string> notes;  // printed under the table
  const Cell* at(size_t row, const std::string& key) const;
};

std::string format_table(const Table& t);  // fixed width, header, units row, notes
std::string csv_escape(const std::string& s);

// ---------------------------------------------------------------------------------------------
// Measurements. Every rank of `world` calls each; ranks outside a subset wait in idle_barrier.
// Tables are complete on rank 0 only.

struct Context {
  Settings* s = nullptr;
  Backend* be = nullptr;
  MPI_Comm world = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  std::string backend_name, comm_kind;
  NodeInfo node;  // this rank's placement in the world (node_info is collective: taken once)
};

// The subset's communicator with the run's transport (make_comm_for; on GPUs its own NCCL
// communicator bootstrapped over MPI_Bcast). Placement is the world's: one device per world rank.
std::unique_ptr<Comm> subset_comm(Context& cx, MPI_Comm sub);

// One timing's step counts, the same on every rank of `c` (they meet in collectives). loop(k)
// runs a fresh Trainer for k steps and returns its loop's seconds. Runs loop once untimed (the
// first Trainer on a dataset pays one-time costs); where a budget applies, that run is P =
// min(warmup_steps, kMinWarmupSteps) steps and the probe is (loop(2P) − loop(P)) / P, its max
// over `c` (start-up cancels as in the timing itself); else it is warmup_steps, as before budgets.
StepCounts plan_steps(const Settings& s, MPI_Comm c, const std::function<double(int64_t steps)>& loop);

Table measure_scaling(Context& cx);                          // weak + strong per variant, with the breakdown
Table measure_collective(Context& cx, Collective c);         // n ≥ 2
Table measure_allreduce(Context& cx);                        // measure_collective(cx, allreduce)
Table measure_buckets(Context& cx);                          // n ≥ 2
// The grid: every optimizer × lr rule × warm-up × global batch trained on one rank (the
// epochs-to-target curve), the step time of each per-rank batch on every subset, and the
// predicted fastest setting trained on every subset (time to target measured).
struct GridResult {
  Table grid, steps, check;
  int64_t params = 0;      // the grid model's parameters (the allreduce per step)
  int64_t train_rows = 0;  // training set rows (epochs = steps × global batch / rows)
};
GridResult measure_grid(Context& cx, std::vector<std::string>& notes);
std::vector<AlphaBeta> fit_allreduce(const Table& allreduce);
Table alpha_beta_table(const std::vector<AlphaBeta>& fits);
Table predict_scaling(const Settings& s, const Table& scaling, const std::vector<AlphaBeta>& fits);

// ---------------------------------------------------------------------------------------------
// Time to accuracy: arithmetic on fixed inputs (tested), then the tables.

// One evaluation of a run: its step, its accuracy, and the training seconds before it
// (evaluations taken out).
struct EvalPoint {
  double step = 0, accuracy = 0, seconds = 0;
};
// Where a run first reaches `target`: linear interpolation in step and seconds between the last
// evaluation below and the first at or above it (the first evaluation itself when it is already
// there: an upper bound); reached = false when no evaluation gets there.
struct Crossing {
  bool reached = false;
  double step = NAN, seconds = NAN;
};
Crossing first_crossing(const std::vector<EvalPoint>& evals, double target);
// The evaluations of a run's metrics JSON Lines (rank 0's log.metrics). An evaluation's training
// seconds = the loop's clock at its step (that step's record, written just before it) less the
// evaluations before it, each as long as its record's time_s (when it ended) says, or eval_s
// where the record has none. eval_total: every evaluation's seconds.
std::vector<EvalPoint> evals_from_metrics(const std::string& jsonl, double eval_s, double& eval_total);
// y at x on the polyline through pts (x ascending) with log x and log y; NaN outside its range or
// where a neighbour is not positive and finite.
double interp_loglog(const std::vector<std::pair<double, double>>& pts, double x);
// Epochs the samples of `steps` steps of `global_batch` make of a training set of `rows`.
double epochs_of(double steps, double global_batch, double rows);

// A grid setting's name: optimizer:lr as grid.optimizers gives it, lr rule, warm-up.
std::string variant_name(const std::string& optimizer, const std::string& rule, bool warmup);

// The fastest way to the target for one variant on `ranks` ranks: over the grid's global batches
// B (B / ranks at least min_b), steps to target (grid) × step seconds (step_at(ranks, B / ranks),
// NaN when unknown); runs that did not reach the target or diverged are left out.
struct TtaPoint {
  std::string variant;
  int ranks = 0;
  double global_batch = NAN, steps = NAN, epochs = NAN, step_s = NAN, seconds = NAN;
  bool found = false;
};
using StepTime = std::function<double(int ranks, double batch_per_rank)>;
TtaPoint fastest_to_target(const Table& grid, const std::string& variant, int ranks, double min_b,
                           const StepTime& step_at);
// Step seconds of `optimizer` at (ranks, b): the steps table on the rank counts it measured;
// beyond the largest, n (ring given): n's step at b (log-log interpolated between its batches)
// + ring(ranks) − ring(n), the allreduce of the gradient (bytes) added — one bucket reduced
// after the backward pass, so nothing overlaps it.
StepTime step_model(const Table& steps, const std::string& optimizer, const RingModel* ring, double gradient_bytes);
bool step_measured(const Table& steps, const std::string& optimizer, int ranks, double batch_per_rank);

// Per variant: epochs to target at the smallest global batch, and the largest batch that still
// reaches it within 2× those epochs.
Table critical_batch_table(const Table& grid);
// Per variant and rank count (1 … predict.max_ranks): the fastest global batch, its predicted
// time to target, the speed-up over 1 rank, and the measured time where a check run matched.
Table time_to_target_table(const Settings& s, const GridResult& g, const std::vector<AlphaBeta>& fits);
// The PyTorch DDP peer: bench/torch_ddp.py under `python3 -m torch.distributed.run --standalone`
// (torchrun), run by rank 0 alone for 1 GPU and for the GPUs of rank 0's host, each model and
// mode, after dptrain's own measurements (the other ranks sleep in idle_barrier; dptrain then
// holds no model, data or communicator on the GPU). Same model, batch per GPU, precision and
// optimizer as the scaling rows.

// One timing row of torch_ddp.py's JSON line.
struct PeerRow {
  std::string kind;      // "eager" | "compile-step" | "compile-model"
  bool ddp = false;      // wrapped in DistributedDataParallel (more than one process)
  double bucket_mb = 0;  // DDP's bucket_cap_mb (0 without DDP)
  double ms = NAN, ms_min = NAN, ms_max = NAN;  // slowest rank's median step, and its spread
  std::string error;     // why the row has no time (e.g. torch.compile unavailable)
};
struct PeerRun {
  std::string model, torch_version, command, error;
  int ranks = 0, batch_per_rank = 0;
  std::vector<PeerRow> rows;
};
// Parses the `{"bench": "torch-ddp", ...}` line of torch_ddp.py's output (other lines ignored);
// error says what is missing when there is none.
PeerRun parse_peer_output(const std::string& output);
// The peer beside the scaling table's rows: per model, mode and rank count, every peer row with
// its efficiency (against the same kind on 1 GPU), the strongest marked, and dptrain's fastest
// variant there with the ratio of step times (dptrain / peer).
Table peer_table(const Settings& s, const Table& scaling, const std::vector<PeerRun>& runs);
// Runs the peer where it can (rank 0; every rank calls it), else returns none and says why in
// notes. Logs go to <out_dir>/ddp-peer/. After each launch rank 0 calls done(runs so far), so a
// report can be written before a time limit cuts the rest.
std::vector<PeerRun> run_ddp_peer(Context& cx, std::vector<std::string>& notes,
                                  const std::function<void(const std::vector<PeerRun>&)>& done = {});

// ---------------------------------------------------------------------------------------------
// The machine and the report.

struct Machine {
  std::vector<std::pair<std::string, std::string>> facts;  // in display order
};
Machine describe_machine(const Context& cx, const std::string& comm_describe);
std::string load_average();  // /proc/loadavg: a busy machine's figures are not comparable

struct Report {
  Machine machine;
  std::string settings;
  std::vector<Table> tables;
  std::vector<std::string> notes;
  std::vector<std::string> findings;
  double seconds = 0;
  std::string status;  // empty: the run finished; else why these are not all the sections (report.md says it first)
};

// What the tables say, in sentences: efficiency and limit at the largest n per model and mode,
// the best bucket, the allreduce's peak busbw, the grid's best accuracy and fastest to target.
std::vector<std::string> findings(const Report& r);

// Writes records.json (nlohmann-json), reads it back for report.md, writes records.csv, and draws
// the plots with bench/plot_scaling.py where python3 has matplotlib (else says how to); returns
// the files written.
std::vector<std::string> write_report(const Settings& s, const Report& r);

// A launch cut short keeps the sections it finished. Before each section rank 0 calls
// write_partial_report: the report of the sections done so far (no plots yet), marked as written
// when `running` started, and the same report marked as cut short during `running`, kept in hidden
// files beside it (.records.json.cut, .report.md.cut). On SIGINT (Ctrl-C), SIGTERM (mpirun
// passing one on, Slurm or timeout(1) at a time limit) or SIGUSR1 the handler from
// install_cut_short_handlers renames those over records.json and report.md (rename(2) is
// async-signal-safe), says so on stderr and ends the process as the signal would have. A signal
// that comes while rank 0 writes a report waits until its files are whole. At the end, between
// begin_final_report (which removes the hidden files) and end_final_report, write_report writes
// the whole report; a signal meanwhile ends the process only after it.
void install_cut_short_handlers();
void write_partial_report(const Settings& s, Report r, const std::string& running,
                          const std::vector<std::string>& done);
void begin_final_report(const Settings& s);
void end_final_report();
// The two statuses write_partial_report gives a report.
std::string running_status(const std::string& running, const std::vector<std::string>& done);
std::string cut_short_status(const std::string& running, const std::vector<std::string>& done);

// While it lives, log::info prints nothing (log::rank() comes back after): every Trainer prints
// its model table and memory use when built, and the bench builds hundreds of them;
// bench-scaling shows each model once at start instead.
class QuietInfo {
 public:
  QuietInfo();
  ~QuietInfo();
  QuietInfo(const QuietInfo&) = delete;
  QuietInfo& operator=(const QuietInfo&) = delete;

 private:
  int rank_;
};

// The report's records as JSON text, and the report read back from it (tables, notes, findings,
// machine, settings; command and config into the two strings).
std::string records_json(const Settings& s, const Report& r);
Report report_from_json(const std::string& text, std::string& command, std::string& config);
// The plots report.md shows (file, title), for the tables the report holds; plot_scaling.py
// draws exactly these.
std::vector<std::pair<std::string, std::string>> plot_list(const Report& r);

}  // namespace dpt::scaling
