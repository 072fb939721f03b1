// The training loop: data order, forward/backward, gradient sync (bucketed, reverse layer order)
// or periodic parameter averaging, the optimizer and LR schedule, evaluation reduced over all
// ranks, metrics JSONL, progress, checkpoints and resume, signals. Knows how no layer works
// inside: it drives MLP, Optimizer, Comm and the checkpoint store through their interfaces.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dpt/augment.hpp"
#include "dpt/backend.hpp"
#include "dpt/comm.hpp"
#include "dpt/config.hpp"
#include "dpt/data.hpp"
#include "dpt/finetune.hpp"
#include "dpt/nn.hpp"
#include "dpt/optim.hpp"

namespace dpt {

struct Prediction {
  std::vector<int32_t> classes;  // the top k, most probable first
  std::vector<float> probs;
};

struct EvalResult {
  double loss = 0;      // mean over the dataset
  double accuracy = 0;  // fraction correct
  int64_t n = 0;
  // evaluate(ds, true): per class (the label), the rows and those whose most probable class is
  // the label (ties to the lower class index), summed over the ranks; else empty.
  std::vector<int64_t> class_rows, class_correct;
};

struct TrainResult {
  int64_t steps = 0;           // optimizer steps taken in total (including before a resume)
  int64_t epoch = 0;           // epoch the next step would belong to
  double seconds = 0;          // wall time of the loop on this run
  double first_rows_s = 0;     // data.read = shard: reading the first epoch's rows, before the loop
  double samples_per_s = 0;    // global samples per second over the loop
  EvalResult last_eval;        // last evaluation on the test set (n = 0 if none)
  int64_t last_eval_step = -1; // the step it evaluated
  std::vector<double> losses;  // global mean loss of every logged step (log.every_steps)
  bool stopped_by_signal = false;
  bool graph = false;          // the step was captured and replayed as one graph
  int64_t first_step = 0;      // where this run started (after a resume: the checkpoint's step)
  bool already_complete = false;  // resumed at or past the last step: nothing was trained
  std::string checkpoint;      // rank 0: the newest checkpoint written, else the one resumed
};

class Trainer {
 public:
  // train/test may be null (test: no evaluation). Parameters are initialised (or loaded from
  // model.init or a resume checkpoint) and broadcast from rank 0.
  // A train Dataset is the whole file in memory; TrainRows (not owned) may read only this
  // rank's rows (data.read = shard). A test Dataset may be this rank's evaluation shard
  // (load_eval_shard) or the whole file.
  Trainer(const Config& cfg, Backend& be, Comm& comm, const Dataset* train, const Dataset* test);
  Trainer(const Config& cfg, Backend& be, Comm& comm, TrainRows* train, const Dataset* test);
  ~Trainer();

  TrainResult run();
  // Loss and accuracy of ds (collective); per_class also counts rows and correct ones per class
  // (reading each chunk's outputs back: --eval's table, not the training loop's evaluations).
  EvalResult evaluate(const Dataset& ds, bool per_class = false);
  // --predict: the k most probable classes of each row of ds (a set read as load_eval_shard
  // reads one: this rank's rows) and their softmax probabilities, the most probable first, after
  // evaluation's transform. Collective; rank 0 gets every rank's rows in file order, the others
  // nothing.
  std::vector<Prediction> predict(const Dataset& ds, int top_k);

  Model& model() { return *model_; }
  Optimizer& optimizer() { return *opt_; }
  // An observer of every step's points (bench-step --account): the steps then run as they are
  // enqueued, never replayed from a captured graph, so that it sees each one.
  void set_probe(StepProbe p);
  // The parameters (the fp32 master) and an optimizer-state array, whole, in the arena's
  // layout: collective over the ranks when the optimizer is sharded.
  std::vector<float> params_host();
  std::vector<float> state_host(const float* state);
  // The same into out: unsharded, into the memory out already holds when it has the size.
  void params_into(std::vector<float>& out);
  void state_into(const float* state, std::vector<float>& out);
  bool sharded() const;
  // Global batch: batch_per_rank × ranks × accumulate.
  int64_t global_batch() const;
  // Batch norm's running statistics averaged over the ranks (collective), where training passes
  // moved them apart (sync_bn = false) since the last average; evaluations and checkpoints do it.
  void average_bn_stats();
  // Where training starts (after a resume): optimizer steps already taken.
  int64_t start_step() const { return step_; }
  // This run's id (every rank; "" for an evaluation-only Trainer).
  const std::string& run_id() const { return run_id_; }

 private:
  // Both public constructors: rows is own (a whole Dataset wrapped) or the caller's.
  Trainer(const Config& cfg, Backend& be, Comm& comm, std::unique_ptr<TrainRows> own,
          TrainRows* rows, const Dataset* test);

  const Config& cfg_;
  Backend& be_;
  Comm& comm_;
  std::unique_ptr<TrainRows> own_rows_;
  TrainRows* rows_ = nullptr;  // null: evaluation only
  const Dataset* test_;
  std::unique_ptr<struct BucketPlan> plan_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<class GradSync> sync_;  // sync = gradients
  Buffer<float> x_, stats_;  // x (max_batch, in_dim); stats [Σ loss, #correct]
  Buffer<float> eval_stats_; // (2 × chunks) an evaluation's [Σ loss, #correct] per chunk
  AugmentSpec augment_;      // data.augment
  TensorShape image_;        // the training images' shape (augmentation)
  Buffer<float> xa_;         // (max_batch, in_dim): x augmented (allocated only with data.augment)
  Buffer<int32_t> draws_;    // (n) this epoch's augmentation draw of every position
  ImageTransform xform_;     // data.augment = random_resized_crop, data.crop_size, data.mean/std
  TensorShape stored_;       // the training images' shape as stored (resized crops)
  TensorShape model_in_;     // the model's input shape
  Buffer<float> xt_;         // (max_batch, in_dim): x resized and normalised (only with xform_.any())
  Buffer<int64_t> windows_;  // (n) this epoch's random_resized_crop window of every position
  Buffer<float> norm_;       // (2c) data.mean then data.std, or unallocated
  Buffer<int32_t> y_;        // (max_batch)
  Buffer<int64_t> order_;    // (n) this epoch's row order
  std::vector<int64_t> index_host_;  // the same, on the host
  std::vector<int64_t> iota_;        // data.read = stream: 0, 1, ..., batch_per_rank - 1
  // data.read = stream on a device backend: 2 × accumulate micro-batch slots in backend memory
  // (Backend::make_ring), step s's micro-batch a in slot (s mod 2) × accumulate + a, so the
  // step reads only backend memory and is captured as the resident one is.
  Dataset ring_;
  bool ring_on_ = false;
  int ring_slot(int64_t step, int a) const { return int(step % 2) * cfg_.accumulate + a; }
  std::vector<std::string> class_names_;  // the training set's (or the test set's), for checkpoints
  Buffer<StepCtl> ctl_;      // (1) what the device-side step reads and advances
  Buffer<float> lr_;         // (total steps) learning rate of each step
  Buffer<float> lr_body_;    // (total steps) the body's (train.body_lr_scale), else unallocated
  int64_t frozen_until_ = 0; // train.freeze: the steps before this one keep its tensors frozen
  FineTunePlan freeze_;      // train.freeze and body_lr_scale's marks (empty without them)
  std::vector<float> lr_host_;
  int64_t step_ = 0, epoch_ = 0, step_in_epoch_ = 0, samples_seen_ = 0;
  int64_t updates_ = 0;      // optimizer updates applied (differs from step_ after skipped steps)
  int64_t skipped_reported_ = 0;
  int64_t last_saved_ = -1;
  int64_t last_eval_step_ = -1;
  std::string run_id_;          // this run's (every rank): checkpoints and metrics records carry it
  std::string resumed_from_;    // the checkpoint this run continues ("" = a fresh run)
  std::string last_checkpoint_; // rank 0: the newest one this run wrote
  std::string on_disk_;         // rank 0: the newest one known written whole ("" = none)
  int64_t total_steps_ = 0;
  int64_t horizon_ = 0;       // the lr schedule's horizon (cfg.schedule_steps, else total_steps_)
  int64_t per_epoch_ = 1;     // optimizer steps per epoch
  std::chrono::steady_clock::time_point t0_;
  double t_last_ = 0;  // seconds since t0_ at the last logged step
  int64_t s_last_ = 0; // step at the last logged step
  std::unique_ptr<class MetricsWriter> metrics_;
  // Rank 0 writes the files (checkpoint.background). Declared after model_, so destroyed (its
  // write in flight finished) before the model whose layer slices that write reads.
  std::unique_ptr<class CheckpointWriter> writer_;
  // Rank 0 of an unsharded run: the host copy of the arenas that every checkpoint refills
  // (allocated and page-locked once; the writer is done with it before the next checkpoint).
  std::shared_ptr<struct HostArenas> staging_;

  void load_initial_state();
  void read_init_weights(std::vector<float>& params, std::vector<float>& bn_stats, std::vector<int64_t>& bn_tracked);
  void check_planned_shape(const std::string& file, const std::vector<int>& layers, const std::string& model,
                           const std::vector<int>& input_shape) const;
  void report_memory();
  // Collective. The model copied off the device now; rank 0 writes the file (on the writer's
  // thread with checkpoint.background) after the write before it has finished.
  void save_checkpoint();
  // The arenas copied off the device for a checkpoint (collective when sharded).
  std::shared_ptr<HostArenas> stage_arenas();
  // Collective (none without checkpoint.dir): rank 0's write in flight finished, or its failure
  // thrown on every rank.
  void finish_checkpoint();
  void claim_run(const std::string& resumed, const std::string& resumed_id);
  void write_start_record();
  void report_stream_wait(double seconds);
  void ring_index(std::vector<int64_t>& index) const;
  void stage_batches();
  int64_t eval_window(const Dataset& ds, TensorShape& img) const;
  const float* eval_forward(const Dataset& ds, int64_t first, int n, std::vector<int64_t>& rows,
                            const TensorShape& img, int64_t center);
  void average_parameters();
  bool bn_apart_ = false;  // training passes moved the ranks' running statistics apart
  bool step_enqueued_ = false;  // enqueue_step ran in this step (not a replay of its graph)
  StepProbe probe_;
  void prepare_run(int64_t per_epoch);
  void prepare_fine_tuning(const LrSchedule& sched, size_t steps);
  void set_frozen(bool on);
  int frozen_layers_ = 0;  // layers whose backward the frozen phase leaves out
  void start_epoch();
  void enqueue_step(class GradSync* sync);
  void check_health();
  void log_step(TrainResult& res);
  void log_eval(const EvalResult& e);
  bool agree_stop();
};

// This rank's walk through the training set under cfg.
RankOrder rank_order(const Config& cfg, const Comm& comm);
RankOrder rank_order(const Config& cfg, int rank, int world);

// cfg's datasets as this rank reads them (data.read): all — both files whole; shard — the
// training rows through TrainRows (epoch by epoch) and this rank's evaluation slice of the test
// file. with_train = false (evaluation only) reads no training data.
struct RunData {
  Dataset train;                    // data.read = all
  std::unique_ptr<TrainRows> rows;  // data.read = shard
  Dataset test;
  bool has_test = false;
};
RunData load_run_data(const Config& cfg, const Comm& comm, bool with_train);
// The same for rank `rank` of `world` ranks, before any transport exists (no MPI call: it may
// run on a thread of its own while the backend starts).
RunData load_run_data(const Config& cfg, int rank, int world, bool with_train);
// A Trainer over d (its training data if read, its test set if any).
std::unique_ptr<Trainer> make_trainer(const Config& cfg, Backend& be, Comm& comm, RunData& d);

// Rank 0 writes one JSON object per line; other ranks hold a closed writer.
class MetricsWriter {
 public:
  MetricsWriter(const std::string& path, bool active);
  ~MetricsWriter();
  void write(const std::string& json_object);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Installs SIGTERM/SIGUSR1 handlers that set a flag; the loop agrees on it across ranks.
void install_stop_signals();
bool stop_requested();

}  // namespace dpt
