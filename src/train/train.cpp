#include "dpt/train.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <fstream>
#include <sstream>

#include "dpt/check.hpp"
#include "dpt/ckpt_writer.hpp"
#include "dpt/finetune.hpp"
#include "dpt/log.hpp"
#include "dpt/sync.hpp"
#include "dpt/timing.hpp"
#include "dpt/watchdog.hpp"
#include "train_internal.hpp"

namespace dpt {
using namespace train_detail;
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string hms(double s) {
  if (!std::isfinite(s) || s < 0) s = 0;
  char buf[32];
  const long t = long(s + 0.5);
  std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  return buf;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

namespace {
std::unique_ptr<TrainRows> wrap(const Dataset* train, const Config& cfg, const Comm& comm) {
  return train ? std::make_unique<TrainRows>(*train, rank_order(cfg, comm)) : nullptr;
}

}  // namespace

Trainer::Trainer(const Config& cfg, Backend& be, Comm& comm, const Dataset* train,
                 const Dataset* test)
    : Trainer(cfg, be, comm, wrap(train, cfg, comm), nullptr, test) {}

Trainer::Trainer(const Config& cfg, Backend& be, Comm& comm, TrainRows* train, const Dataset* test)
    : Trainer(cfg, be, comm, nullptr, train, test) {}

Trainer::Trainer(const Config& cfg, Backend& be, Comm& comm, std::unique_ptr<TrainRows> own,
                 TrainRows* rows, const Dataset* test)
    : cfg_(cfg), be_(be), comm_(comm), own_rows_(std::move(own)),
      rows_(own_rows_ ? own_rows_.get() : rows), test_(test) {
  // The model's shapes from the data (every rank alike, before anything is allocated).
  const bool list = !cfg.layer_list.empty();
  // Resized crops: the model sees (C, crop, crop) of images stored at another size (its
  // model.input_shape, if any, describes the stored images).
  xform_ = parse_transform(cfg.augment, cfg.crop_size, cfg.crop_scale, cfg.crop_ratio, cfg.eval_crop_ratio, cfg.mean,
                           cfg.std);
  Config seen_cfg = cfg;
  if (xform_.any()) seen_cfg.input_shape.clear();
  ModelPlan mp;
  int64_t data_dim = 0;  // the most values per stored sample, train or test
  if (rows_) {
    const auto shape = seen_shape(xform_, cfg, rows_->info().sample_shape, rows_->path(), &stored_);
    mp = model_plan(seen_cfg, shape, product(shape), rows_->info().num_classes, rows_->path());
    data_dim = rows_->info().dim;
    if (xform_.any()) model_in_ = TensorShape::image(shape[0], shape[1], shape[2]);
  }
  if (test) {
    TensorShape stored;
    const auto shape = seen_shape(xform_, cfg, test->sample_shape, test->path, &stored);
    ModelPlan t = model_plan(seen_cfg, shape, product(shape), test->num_classes, test->path);
    if (rows_ && !(t.input == mp.input))
      throw InputError(test->path + " has samples of shape " + t.input.str() + ", " + rows_->path() + " of " + mp.input.str());
    if (!rows_) {
      mp = std::move(t);
      if (xform_.any()) model_in_ = TensorShape::image(shape[0], shape[1], shape[2]);
    }
    data_dim = std::max(data_dim, test->dim);
    if (rows_)
      check_same_classes("data.train (" + rows_->path() + ")", rows_->info().class_names,
                         "data.test (" + test->path + ")", test->class_names);
  }
  if (!rows_ && !test) mp = model_plan(cfg, {}, list ? 0 : cfg.layers.front(), 0, "(no data)");
  class_names_ = rows_ ? rows_->info().class_names : test ? test->class_names : std::vector<std::string>{};
  if (comm.rank() == 0) log::info("model (" + std::string(list ? "layer list" : "MLP widths") + "):\n" + mp.describe());
  // Evaluation runs in chunks of max_batch: the MLP's cost little memory; convolutions keep
  // their columns and activations per layer, so a layer list's chunk is a training batch.
  const int max_batch = std::max(cfg.batch_per_rank, list ? 256 : 1024);
  // sync = gradients: the arena in gradient buckets (sharded: padded to the rank count), the
  // large layers' weight gradients in pieces when there is communication to start early.
  const bool by_gradients = cfg.sync == "gradients";
  plan_ = std::make_unique<BucketPlan>(plan_buckets(list ? param_shapes(mp) : mlp_param_shapes(cfg.layers),
                                                    cfg.bucket_mb, comm.size(), comm.rank(),
                                                    by_gradients && cfg.shard_optimizer,
                                                    by_gradients && comm.size() > 1));
  if (list) model_ = std::make_unique<Model>(be, mp, max_batch, plan_->layout, parse_recompute(cfg.recompute));
  else model_ = std::make_unique<Model>(be, cfg.layers, parse_act(cfg.activation), max_batch, plan_->layout);
  if (comm.rank() == 0 && model_->remade_values() > 0)
    log::info("model: " + std::to_string(model_->remade_ops()) + " batch norms' ReLU outputs (" +
              std::to_string(model_->remade_values() >> 20) + " Mi values at batch " + std::to_string(max_batch) +
              ") made again in the backward pass instead of kept (device.recompute = " + cfg.recompute + ")");
  augment_ = parse_augment(cfg.augment, cfg.crop_padding);
  if (augment_.any() && rows_) {
    // Pad-crop and flip work on the stored images, before any resized crop.
    image_ = xform_.any() ? stored_ : augment_shape(cfg, mp, rows_->info().sample_shape, rows_->path());
    xa_ = Buffer<float>(be, size_t(max_batch) * size_t(image_.size()));
  }
  if (xform_.any()) {
    xt_ = Buffer<float>(be, size_t(max_batch) * size_t(model_->in_dim()));
    if (!xform_.mean.empty()) {
      std::vector<float> norm(xform_.mean);
      norm.insert(norm.end(), xform_.std.begin(), xform_.std.end());
      norm_ = Buffer<float>(be, norm.size());
      be.upload(norm_.data(), norm.data(), norm.size() * sizeof(float));
    }
  }
  if (cfg.sync_bn && comm.size() > 1) {
    // Batch norm's per-channel sums over every rank's micro-batch: a small allreduce per layer,
    // forward and backward.
    model_->set_bn_reduce([this](double* sums, size_t n) {
      comm_.allreduce(sums, sums, n, DType::f64, RedOp::sum);
      comm_.synchronize();
    });
  }
  model_->set_label_smoothing(float(cfg.label_smoothing));
  const bool fine_tuning = !cfg.freeze.empty() || cfg.body_lr_scale != 1.0;
  if (fine_tuning) freeze_ = fine_tune_plan(*model_, cfg);
  opt_ = std::make_unique<Optimizer>(be, cfg, plan_->state_size,
                                     fine_tuning ? freeze_.tensors : param_tensors(model_->layers()));
  if (by_gradients) {
    // Each bucket updated as soon as it can be, unless a skipped step must leave the model
    // bitwise as it was (then: every reduction, the check, every update), or the optimizer needs
    // whole tensors' norms first (LARS, LAMB: their first pass already changes the state, so the
    // verdict must come before it). DPT_EAGER_UPDATE=0 keeps the update after the whole backward
    // pass, for measurements.
    const char* e = std::getenv("DPT_EAGER_UPDATE");
    const bool eager = cfg.on_nonfinite == "stop" && !opt_->layerwise() && !(e && std::string(e) == "0");
    sync_ = std::make_unique<GradSync>(*plan_, be, comm, *model_, *opt_, cfg.grad_dtype == "bf16", eager);
  }
  report_memory();
  x_ = Buffer<float>(be, size_t(max_batch) * size_t(std::max(model_->in_dim(), data_dim)));
  y_ = Buffer<int32_t>(be, size_t(max_batch));
  stats_ = Buffer<float>(be, 2);
  on_rank0(comm.mpi(), comm.rank(), "opening the metrics file", [&] { metrics_ = std::make_unique<MetricsWriter>(cfg.metrics_file, true); });
  if (!metrics_) metrics_ = std::make_unique<MetricsWriter>("", false);
  writer_ = std::make_unique<CheckpointWriter>(cfg.ckpt_background);
  load_initial_state();
}

// A checkpoint's write in flight is waited for (~CheckpointWriter); data.read = stream's slots
// on the device are given back.
Trainer::~Trainer() {
  if (ring_on_) {
    try {
      be_.make_ring(ring_, 0);
    } catch (...) {  // a device error in a destructor: the backend reports it on its next call
    }
  }
}


void Trainer::params_into(std::vector<float>& out) {
  if (sync_) return sync_->gather_params(out);
  out.resize(model_->num_params());
  be_.download(out.data(), model_->params(), out.size() * sizeof(float));
}

void Trainer::state_into(const float* state, std::vector<float>& out) {
  if (sync_) return sync_->gather_state(state, out);
  out.resize(opt_->size());
  be_.download(out.data(), state, out.size() * sizeof(float));
}

std::vector<float> Trainer::params_host() {
  std::vector<float> h;
  params_into(h);
  return h;
}

std::vector<float> Trainer::state_host(const float* state) {
  std::vector<float> h;
  state_into(state, h);
  return h;
}

bool Trainer::sharded() const { return plan_->sharded; }

// Every rank's bytes of parameters, gradients, optimizer state and communication buffers.
void Trainer::report_memory() {
  MemoryUse m;
  if (sync_) m = sync_->memory();
  else {
    m.params = model_->num_params() * sizeof(float);
    m.grads = m.params;
    m.optimizer = size_t(opt_->state_arrays()) * opt_->size() * sizeof(float);
  }
  const int W = comm_.size();
  // The datasets this rank holds in host memory (data.read = shard: the current epoch's rows,
  // twice that while the next epoch's are read).
  const auto bytes = [](const Dataset& d) { return d.u8.size() + 4 * (d.f32.size() + d.labels.size()); };
  uint64_t data = test_ ? bytes(*test_) : 0;
  if (rows_ && !rows_->sharded()) data += bytes(rows_->data());
  if (rows_ && rows_->sharded()) {  // not read yet: its size from the file's layout
    const DatasetInfo& in = rows_->info();
    const uint64_t row = uint64_t(in.dim * (in.feature_type == "uint8" ? 1 : 4) + 4);
    // stream: the micro-batches read ahead, the one being read and the one in use, and on a
    // device the pinned copies of the micro-batches staged for two steps.
    const int pinned = be_.host_addressable() ? 0 : 2 * cfg_.accumulate;
    data += rows_->streamed() ? uint64_t(rows_->depth() + 2 + pinned) * uint64_t(cfg_.batch_per_rank) * row
                              : 2 * uint64_t(rows_->rows_per_epoch()) * row;
  }
  constexpr int kFields = 5;
  uint64_t mine[kFields] = {m.params, m.grads, m.optimizer, m.comm, data};
  std::vector<uint64_t> all(size_t(kFields * W));
  {
    watchdog::Phase phase("waiting in gather of memory use");
    DPT_CHECK_MPI(MPI_Gather(mine, kFields, MPI_UINT64_T, all.data(), kFields, MPI_UINT64_T, 0, comm_.mpi()));
  }
  if (comm_.rank() != 0) return;
  auto mib = [](uint64_t b) { return fmt("%.1f", double(b) / (1 << 20)); };
  bool same = true;
  for (int r = 1; r < W; ++r) same = same && std::equal(all.begin(), all.begin() + kFields, all.begin() + kFields * r);
  for (int r = 0; r < (same ? 1 : W); ++r) {
    const uint64_t* v = all.data() + kFields * r;
    const std::string who = W == 1 ? "" : same ? " per rank" : " rank " + std::to_string(r);
    log::info("memory" + who + ": parameters " + mib(v[0]) +
              " MiB, gradients " + mib(v[1]) + " MiB, optimizer state " + mib(v[2]) + " MiB" +
              (plan_->sharded ? " (sharded over " + std::to_string(W) + " ranks)" : "") +
              ", communication buffers " + mib(v[3]) + " MiB; datasets in host memory " + mib(v[4]) + " MiB" +
              (rows_ && rows_->streamed()
                   ? " (data.read = stream: " + std::to_string(rows_->depth()) + " micro-batches read ahead)"
                   : rows_ && rows_->sharded() ? " (data.read = shard: an epoch's rows, and the next's as they are read)"
                                               : ""));
  }
}

// data.read = stream: how long the host waited for the reader (the slowest rank's), against the
// training time. While the host waits, the GPU works through the steps already enqueued, so
// this bounds from above the time the device idled for want of data.
void Trainer::report_stream_wait(double seconds) {
  double w = rows_->waited_s();
  DPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_DOUBLE, MPI_MAX, comm_.mpi()));
  if (comm_.rank() == 0)
    log::info("data.read = stream: waited " + fmt("%.2f", w) + " s for rows in " + fmt("%.2f", seconds) +
              " s of training (" + fmt("%.1f", 100.0 * w / std::max(1e-9, seconds)) + "%, the slowest rank); " +
              std::to_string(rows_->rows_read()) + " rows read by rank 0");
}

void Trainer::average_parameters() {
  watchdog::Phase phase("averaging parameters", step_);
  const float inv = 1.f / float(comm_.size());
  comm_.allreduce(model_->params(), model_->params(), model_->num_params(), DType::f32, RedOp::sum);
  comm_.synchronize();
  be_.scale(model_->params(), model_->num_params(), inv);
  for (auto& s : opt_->state()) {
    comm_.allreduce(s.data, s.data, opt_->size(), DType::f32, RedOp::sum);
    comm_.synchronize();
    be_.scale(s.data, opt_->size(), inv);
  }
}

void Trainer::average_bn_stats() {
  if (!bn_apart_) return;
  bn_apart_ = false;
  if (comm_.size() == 1) return;
  watchdog::Phase phase("averaging batch norm's running statistics", step_);
  const float inv = 1.f / float(comm_.size());
  for (const BnState& b : model_->bn_states())
    for (float* s : {b.running_mean, b.running_var}) {
      comm_.allreduce(s, s, size_t(b.c), DType::f32, RedOp::sum);
      comm_.synchronize();
      be_.scale(s, size_t(b.c), inv);
    }
}

int64_t Trainer::global_batch() const {
  return int64_t(cfg_.batch_per_rank) * comm_.size() * cfg_.accumulate;
}

// One step, enqueued on the backend with no host decision inside, so the backend may record
// it once and replay it: everything that changes from step to step (the batch's rows, the
// learning rate, Adam's t, the non-finite verdict) is read from StepCtl on the device.
// sync (sync = gradients) reduces the gradients and updates the model as the backward pass
// goes; otherwise (sync = parameters) every rank checks and updates on its own gradients.
void Trainer::enqueue_step(GradSync* sync) {
  const int b = cfg_.batch_per_rank, A = cfg_.accumulate, W = comm_.size();
  // Gradients are means: over the global batch when they are summed over ranks, over this
  // rank's samples when each rank steps on its own.
  const float grad_scale = 1.f / float(sync || W == 1 ? global_batch() : int64_t(b) * A);
  // Test hook (DPT_FAULT): one compare per step when unset; a rank with a fault never replays.
  const bool poison = fault::in_step(step_ + 1);
  if (probe_) probe_(StepPoint::data, -1);
  be_.fill(stats_.data(), 2, 0.f);
  bn_apart_ = !cfg_.sync_bn;
  step_enqueued_ = true;
  for (int a = 0; a < A; ++a) {
    const int64_t offset = int64_t(a) * b * W + int64_t(comm_.rank()) * b;
    // The host's copy of the rows, for a backend that streams the data rather than holding it.
    const int64_t* host_rows = index_host_.data() + step_in_epoch_ * global_batch() + offset;
    if (ring_on_) {
      // data.read = stream, staged into the device's slots before the step (stage_batches).
      be_.load_batch_at(ring_, order_.data(), ctl_.data(), offset, b, x_.data(), y_.data());
    } else if (rows_->streamed()) {
      // data.read = stream: this micro-batch's rows, read ahead by the stream, rows 0..b-1.
      const Dataset& mb = rows_->micro_batch(epoch_, step_in_epoch_, a);
      be_.load_batch(mb, iota_.data(), b, x_.data(), y_.data());
    } else {
      be_.load_batch_at(rows_->data(), order_.data(), ctl_.data(), offset, b, x_.data(), y_.data(), host_rows);
    }
    // Augmentation draws are per epoch position (start_epoch), read at ctl->cursor + offset.
    const float* x = x_.data();
    if (xa_.data()) {
      be_.augment(x, xa_.data(), b, int(image_.c), int(image_.h), int(image_.w), augment_.pad, draws_.data(),
                  ctl_.data(), offset);
      x = xa_.data();
    }
    if (xt_.data()) {
      // Training's resized crop: the draw at each position, else evaluation's center window.
      be_.resized_crop(x, xt_.data(), b, int(stored_.c), int(stored_.h), int(stored_.w), int(model_in_.h),
                       int(model_in_.w), windows_.data(), ctl_.data(), offset,
                       center_window(xform_, int(stored_.h), int(stored_.w)), norm_.data());
      x = xt_.data();
    }
    // Dropout's masks follow the sample's place in the global batch, whatever the rank count.
    TrainPass pass;
    pass.ctl = ctl_.data();
    pass.first = offset;
    pass.seed = cfg_.seed;
    model_->forward(x, b, &pass);
    model_->loss(y_.data(), b, grad_scale, stats_.data(), true);
    PassHooks hooks;
    if (a == A - 1 && sync) hooks = sync->hooks(ctl_.data(), lr_.data());
    if (a == A - 1 && poison) {
      // The injected NaN enters the first gradients to be final, before their reduction, which
      // spreads it to every rank.
      auto next = hooks.grads_final;
      auto first = std::make_shared<bool>(true);
      hooks.grads_final = [this, next, first](size_t begin, size_t end) {
        if (*first) be_.fill(model_->grads() + begin, 1, std::nanf(""));
        *first = false;
        if (next) next(begin, end);
      };
    }
    model_->backward(x, b, a > 0, hooks);
  }
  if (probe_) probe_(StepPoint::optimizer, -1);
  if (sync) {
    sync->finish();
  } else {
    be_.check_finite(model_->grads(), model_->num_params(), ctl_.data());
    opt_->step_at(model_->params(), model_->grads(), 0, model_->num_params(), lr_.data(), ctl_.data());
  }
  be_.end_step(ctl_.data(), global_batch(), cfg_.on_nonfinite == "stop");
  if (probe_) probe_(StepPoint::end, -1);
}

void Trainer::set_probe(StepProbe p) {
  probe_ = p;
  model_->set_probe(std::move(p));
}

// Reads the device's step control: stops the run (policy stop) or reports skipped steps.
void Trainer::check_health() {
  watchdog::Phase phase("reading the step verdict off the device", step_);
  StepCtl c;
  be_.download(&c, ctl_.data(), sizeof c);
  updates_ = c.updates;
  // Ranks that step on their own gradients, or check only their own shard of them, may see
  // different verdicts: the worst one counts.
  double bad[3] = {c.first_bad >= 0 ? 1.0 : 0.0, double(c.skipped),
                   c.first_bad >= 0 ? -double(c.first_bad) : -1e300};
  if (cfg_.sync == "parameters" || sharded())
    DPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, bad, 3, MPI_DOUBLE, MPI_MAX, comm_.mpi()));
  if (bad[0] == 0) return;
  if (cfg_.on_nonfinite == "stop")
    throw Error("non-finite gradients at step " + std::to_string(int64_t(-bad[2])) +
                " (train.on_nonfinite = stop): the run stops here; no checkpoint holds an update "
                "from that step on, and the last checkpoint is intact", kExitNonFinite, /*collective=*/true);
  if (int64_t(bad[1]) != skipped_reported_) {
    skipped_reported_ = int64_t(bad[1]);
    log::info("non-finite gradients: " + std::to_string(skipped_reported_) +
              " step(s) skipped so far (train.on_nonfinite = skip)");
  }
}

// data.read = stream with the device's slots: position p of the epoch (the step's micro-batch
// a of this rank, row i of it) reads slot row ring_slot(step, a) × b + i; other ranks' positions
// are never read here.
void Trainer::ring_index(std::vector<int64_t>& index) const {
  const int64_t b = cfg_.batch_per_rank, W = comm_.size(), G = global_batch(), r = comm_.rank();
  std::fill(index.begin(), index.end(), 0);
  for (int64_t k = 0; k < per_epoch_; ++k)
    for (int a = 0; a < cfg_.accumulate; ++a) {
      const int64_t at = k * G + int64_t(a) * b * W + r * b;
      const int64_t slot = ring_slot(epoch_ * per_epoch_ + k, a);
      for (int64_t i = 0; i < b; ++i) index[size_t(at + i)] = slot * b + i;
    }
}

// This step's micro-batches, read ahead by the stream, into their slots on the device; the
// step enqueued next reads them there.
void Trainer::stage_batches() {
  watchdog::Phase phase("waiting for this step's rows (data.read = stream)", step_ + 1);
  for (int a = 0; a < cfg_.accumulate; ++a)
    be_.stage(ring_, ring_slot(epoch_ * per_epoch_ + step_in_epoch_, a), rows_->micro_batch(epoch_, step_in_epoch_, a));
}

void Trainer::start_epoch() {
  // The next epoch's rows are read ahead only when training will reach it.
  const bool next = epoch_ + 1 < cfg_.epochs && (epoch_ + 1) * per_epoch_ < total_steps_;
  std::vector<int64_t> index;
  // A read error on one rank (a bad row deep in the file) stops every rank together.
  std::string msg;
  const int code = run_captured([&] {
    watchdog::Phase phase("reading this rank's training rows", step_);
    index = rows_->start_epoch(epoch_, next);
  }, msg);
  if (comm_.size() > 1 || code) {
    watchdog::Phase phase("waiting for every rank's rows", step_);
    if (!all_ok(comm_.mpi(), code == 0, msg)) {
      // An epoch boundary: the model is whole (and, with sync = parameters, one model after an
      // average), so the work done so far is kept before every rank stops.
      const bool one_model = cfg_.sync == "gradients" || step_ % cfg_.average_every == 0;
      if (step_ > 0 && last_saved_ != step_ && one_model) {
        check_health();
        save_checkpoint();
      }
      finish_checkpoint();
      throw Error("reading the training rows of " + rows_->path() + " failed (see above)" +
                  (last_saved_ == step_ && step_ > 0 ? "; a checkpoint of step " + std::to_string(step_) + " was written" : ""),
                  kExitUsage, true);
    }
  }
  be_.refresh_dataset(rows_->data());
  if (ring_on_) ring_index(index);
  be_.upload(order_.data(), index.data(), index.size() * sizeof(int64_t));
  if (xa_.data() || windows_.data()) {
    // Each position's draw from (seed, epoch, its row in the file): the epoch order's rows.
    const auto rows = epoch_order(rows_->file_rows(), cfg_.shuffle, cfg_.seed, epoch_);
    if (xa_.data()) {
      const auto draws = augment_draws(augment_, cfg_.seed, epoch_, rows);
      be_.upload(draws_.data(), draws.data(), draws.size() * sizeof(int32_t));
    }
    if (windows_.data()) {
      const auto w = window_draws(xform_, int(stored_.h), int(stored_.w), cfg_.seed, epoch_, rows);
      be_.upload(windows_.data(), w.data(), w.size() * sizeof(int64_t));
    }
  }
  index_host_ = std::move(index);
  const int64_t cursor = step_in_epoch_ * global_batch();
  be_.upload(&ctl_.data()->cursor, &cursor, sizeof cursor);
}

void Trainer::prepare_run(int64_t per_epoch) {
  per_epoch_ = per_epoch;
  total_steps_ = int64_t(cfg_.epochs) * per_epoch;
  if (cfg_.steps > 0) total_steps_ = std::min(total_steps_, cfg_.steps);
  // A resumed run keeps its schedule's horizon when its length changes (resume.hpp).
  horizon_ = cfg_.schedule_steps > 0 ? cfg_.schedule_steps : total_steps_;
  LrSchedule sched(cfg_, comm_.size(), per_epoch, horizon_);
  std::vector<float> lr(size_t(std::max<int64_t>(total_steps_, 1)));
  for (size_t i = 0; i < lr.size(); ++i) lr[i] = float(sched.at(int64_t(i) + 1));
  lr_host_.assign(lr.begin(), lr.end());
  lr_ = Buffer<float>(be_, lr.size());
  be_.upload(lr_.data(), lr.data(), lr.size() * sizeof(float));
  prepare_fine_tuning(sched, lr.size());
  order_ = Buffer<int64_t>(be_, size_t(rows_->file_rows()));
  if (rows_->streamed()) {
    iota_.resize(size_t(cfg_.batch_per_rank));
    for (size_t i = 0; i < iota_.size(); ++i) iota_[i] = int64_t(i);
    ring_ = rows_->data();  // a streamed set's shape, type, scale and offset, and no rows
    ring_.streamed = false;
    ring_.n = int64_t(ring_slot(1, cfg_.accumulate - 1) + 1) * cfg_.batch_per_rank;
    ring_on_ = be_.make_ring(ring_, cfg_.batch_per_rank);
  }
  if (xa_.data()) draws_ = Buffer<int32_t>(be_, size_t(rows_->file_rows()));
  if (xform_.random_crop) windows_ = Buffer<int64_t>(be_, size_t(rows_->file_rows()));
  ctl_ = Buffer<StepCtl>(be_, 1);
  StepCtl c;
  c.step = step_;
  c.updates = updates_;
  be_.upload(ctl_.data(), &c, sizeof c);
}

// train.body_lr_scale's learning rates (the schedule's, scaled in double as a parameter group's
// lr is) and train.freeze's phase: frozen until freeze_epochs' last step, or the whole run.
void Trainer::prepare_fine_tuning(const LrSchedule& sched, size_t steps) {
  if (cfg_.body_lr_scale != 1.0) {
    std::vector<float> body(steps);
    for (size_t i = 0; i < steps; ++i) body[i] = float(sched.at(int64_t(i) + 1) * cfg_.body_lr_scale);
    lr_body_ = Buffer<float>(be_, steps);
    be_.upload(lr_body_.data(), body.data(), steps * sizeof(float));
    opt_->set_body_lr(lr_body_.data());
  }
  if (cfg_.freeze.empty()) return;
  frozen_until_ = cfg_.freeze_epochs > 0 ? int64_t(cfg_.freeze_epochs) * per_epoch_ : INT64_MAX;
  set_frozen(step_ < frozen_until_);
  if (comm_.rank() != 0) return;
  std::string when = cfg_.freeze_epochs == 0 ? "the whole run"
                     : "steps 1-" + std::to_string(frozen_until_) + " (train.freeze_epochs = " +
                           std::to_string(cfg_.freeze_epochs) + "), then trained" +
                           (cfg_.body_lr_scale != 1.0 ? " at train.body_lr_scale × lr" : "");
  log::info("train.freeze = " + cfg_.freeze + ": " + std::to_string(freeze_.frozen.size()) + " tensors frozen for " +
            when + (cfg_.train_bn ? "; batch norm's weights and biases train (train.train_bn)" : ""));
  if (frozen_layers_ > 0)
    log::info("  the backward pass stops below the lowest trainable layer: " + std::to_string(frozen_layers_) +
              (frozen_layers_ == 1 ? " layer computes" : " layers compute") + " no gradient");
  if (sync_ && comm_.size() > 1)
    log::info("  gradients on the wire per step: " + fmt("%.3f", double(sync_->wire_bytes(true)) / 1e6) + " MB of " +
              fmt("%.3f", double(sync_->wire_bytes(false)) / 1e6) + " MB" +
              (sharded() ? " (a sharded optimizer reduces them all)" : ""));
}

// The optimizer's and the backward pass's frozen state together.
void Trainer::set_frozen(bool on) {
  opt_->set_frozen(on);
  frozen_layers_ = model_->set_frozen(on ? freeze_.frozen_layers : std::vector<char>{});
}

void Trainer::log_step(TrainResult& res) {
  const double lr = lr_host_[size_t(step_ - 1)];
  watchdog::Phase phase("reading the loss off the device", step_);
  float st[2];
  be_.download(st, stats_.data(), sizeof st);
  double sums[1] = {st[0]};
  host_sum(comm_.mpi(), sums, 1);
  const double loss = sums[0] / double(global_batch());
  res.losses.push_back(loss);
  const double now = seconds_since(t0_);
  const double sps = double((step_ - s_last_) * global_batch()) / std::max(1e-9, now - t_last_);
  t_last_ = now;
  s_last_ = step_;
  if (comm_.rank() != 0) return;
  std::ostringstream js;
  js << "{\"step\": " << step_ << ", \"epoch\": " << epoch_ + 1 << ", \"loss\": " << fmt("%.6g", loss)
     << ", \"lr\": " << fmt("%.6g", lr) << ", \"samples_per_s\": " << fmt("%.1f", sps)
     << ", \"time_s\": " << fmt("%.3f", now) << ", \"run\": \"" << run_id_ << "\"}";
  metrics_->write(js.str());
  if (cfg_.progress) {
    const double left = double(total_steps_ - step_) * double(global_batch()) / std::max(sps, 1e-9);
    log::info("step " + std::to_string(step_) + "/" + std::to_string(total_steps_) + "  epoch " +
              std::to_string(epoch_ + 1) + "/" + std::to_string(cfg_.epochs) + "  loss " +
              fmt("%.4f", loss) + "  lr " + fmt("%.4g", lr) + "  " + fmt("%.0f", sps) +
              " samples/s  ETA " + hms(left));
  }
}

void Trainer::log_eval(const EvalResult& e) {
  last_eval_step_ = step_;
  if (comm_.rank() != 0) return;
  std::ostringstream js;
  // time_s: when the evaluation ended (the step's record has when it began).
  js << "{\"eval\": \"test\", \"step\": " << step_ << ", \"epoch\": " << epoch_ + 1
     << ", \"loss\": " << fmt("%.6g", e.loss) << ", \"accuracy\": " << fmt("%.6g", e.accuracy)
     << ", \"time_s\": " << fmt("%.3f", seconds_since(t0_)) << ", \"run\": \"" << run_id_ << "\"}";
  metrics_->write(js.str());
  log::info("eval  step " + std::to_string(step_) + "  test loss " + fmt("%.4f", e.loss) +
            "  accuracy " + fmt("%.4f", e.accuracy) + "  (" + std::to_string(e.n) + " samples)");
}

// A signal reaches one rank or all; every rank stops at the same step either way.
bool Trainer::agree_stop() {
  watchdog::Phase phase("waiting in allreduce of the stop flag", step_);
  int mine = stop_requested() ? 1 : 0, any = 0;
  DPT_CHECK_MPI(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm_.mpi()));
  return any != 0;
}

TrainResult Trainer::run() {
  TrainResult res;
  if (!rows_) throw Error("Trainer::run without a training set");
  const int64_t N = rows_->file_rows(), G = global_batch();
  const int64_t per_epoch = N / G;
  if (per_epoch == 0)
    throw InputError(rows_->path() + " has " + std::to_string(N) + " rows, fewer than one global batch (" +
                     std::to_string(G) + " = batch_per_rank × ranks × accumulate)", true);
  prepare_run(per_epoch);
  const bool by_gradients = cfg_.sync == "gradients";
  GradSync* reduce = sync_.get();
  // The first epoch's rows are in place before the backend decides whether it can capture.
  const bool training = epoch_ < cfg_.epochs && step_ < total_steps_;
  res.already_complete = !training;
  if (training) write_start_record();
  if (training) {
    const double t = timing::now();
    start_epoch();
    if (rows_->sharded()) res.first_rows_s = timing::now() - t;
  }
  const bool capture = be_.can_capture(ring_on_ ? ring_ : rows_->data()) && (comm_.size() == 1 || !reduce || comm_.capturable()) &&
                       !fault::any() && !probe_;
  auto runner = be_.make_runner([this, reduce] { enqueue_step(reduce); }, capture);
  if (cfg_.ckpt_at_start && step_ == 0) save_checkpoint();
  t0_ = Clock::now();
  t_last_ = 0;
  s_last_ = step_;
  const int64_t first_step = step_;
  for (bool first = true; epoch_ < cfg_.epochs && step_ < total_steps_; ++epoch_, step_in_epoch_ = 0) {
    if (!first) start_epoch();
    first = false;
    for (; step_in_epoch_ < per_epoch && step_ < total_steps_;) {
      {
        // On the CPU the step's allreduces happen inside (each its own phase); on a GPU the
        // host blocks only where it reads results back, which are phases of their own.
        watchdog::Phase phase("computing", step_ + 1);
        const bool early = step_ - first_step < 2;  // the eager first step, then the capture
        const double t = early ? timing::now() : 0;
        step_enqueued_ = false;
        if (opt_->frozen() && step_ >= frozen_until_) {
          // train.freeze_epochs are over: the frozen tensors train from this step on (a
          // captured step would replay the frozen update, so it is captured again).
          set_frozen(false);
          if (comm_.rank() == 0)
            log::info("step " + std::to_string(step_ + 1) + ": train.freeze's tensors unfrozen");
          runner = be_.make_runner([this, reduce] { enqueue_step(reduce); }, capture);
        }
        if (ring_on_) stage_batches();
        runner->run();
        if (ring_on_)
          for (int a = 0; a < cfg_.accumulate; ++a) be_.release(ring_, ring_slot(epoch_ * per_epoch_ + step_in_epoch_, a));
        // A replayed graph ran the batch norm passes without the host seeing them.
        if (!step_enqueued_) {
          model_->count_bn_passes(cfg_.accumulate);
          bn_apart_ = !cfg_.sync_bn;
        }
        if (early) timing::add(timing::Phase::first_steps, timing::now() - t);
      }
      ++step_;
      ++step_in_epoch_;
      samples_seen_ += G;
      if (!by_gradients && step_ % cfg_.average_every == 0) average_parameters();
      const bool log = step_ % cfg_.log_every == 0 || step_ == total_steps_;
      const bool eval = test_ && cfg_.eval_every > 0 && step_ % cfg_.eval_every == 0;
      const bool save = cfg_.ckpt_every > 0 && step_ % cfg_.ckpt_every == 0;
      if (log || eval || save) check_health();
      if (log) log_step(res);
      if (eval) log_eval(res.last_eval = evaluate(*test_));
      if (save) {
        timing::Scope timed(timing::Phase::checkpoint);
        save_checkpoint();
      }
      // With sync = parameters, stop only where the ranks hold one model (after an average).
      const bool one_model = by_gradients || step_ % cfg_.average_every == 0;
      if (one_model && (comm_.size() > 1 ? agree_stop() : stop_requested())) {
        res.stopped_by_signal = true;
        break;
      }
    }
    if (res.stopped_by_signal || step_in_epoch_ < per_epoch) break;  // stopped mid-epoch
    if (test_ && cfg_.eval_every == 0) {
      check_health();
      log_eval(res.last_eval = evaluate(*test_));
    }
  }
  // Training that ends off an evaluation point (a train.steps cap mid-epoch, eval_every not
  // dividing the last step) still ends with the final model's test figures.
  if (test_ && !res.stopped_by_signal && step_ > first_step && last_eval_step_ != step_) {
    check_health();
    log_eval(res.last_eval = evaluate(*test_));
  }
  {
    watchdog::Phase phase("waiting for the device", step_);
    be_.synchronize();
  }
  res.seconds = seconds_since(t0_);
  res.samples_per_s = double((step_ - first_step) * G) / std::max(1e-9, res.seconds);
  res.graph = runner->captured();
  if (rows_->streamed()) report_stream_wait(res.seconds);
  check_health();
  if (!by_gradients && step_ % cfg_.average_every != 0) average_parameters();  // one final model
  {
    timing::Scope timed(timing::Phase::final_ckpt);
    if (last_saved_ != step_) save_checkpoint();
    finish_checkpoint();  // the run ends with its checkpoints on disk
  }
  res.steps = step_;
  res.last_eval_step = last_eval_step_;
  res.first_step = first_step;
  res.epoch = epoch_;
  res.checkpoint = last_checkpoint_.empty() ? resumed_from_ : last_checkpoint_;
  return res;
}

// ---------------------------------------------------------------------------------------------

struct MetricsWriter::Impl {
  std::ofstream out;
};

MetricsWriter::MetricsWriter(const std::string& path, bool active) : impl_(new Impl) {
  if (!active || path.empty()) return;
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  impl_->out.open(path, std::ios::app);
  if (!impl_->out) throw InputError("cannot open log.metrics file " + path + " for writing");
}

MetricsWriter::~MetricsWriter() = default;

void MetricsWriter::write(const std::string& json_object) {
  if (!impl_->out.is_open()) return;
  impl_->out << json_object << '\n';
  impl_->out.flush();  // a killed job keeps every line written so far
}

namespace {
volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_stop_signal(int) { g_stop = 1; }
}  // namespace

void install_stop_signals() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGUSR1, on_stop_signal);
  // Ctrl-C stops as SIGTERM does (a checkpoint, then exit 6); a second Ctrl-C ends the process
  // at once (SA_RESETHAND restores the default action after the first).
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  sigaction(SIGINT, &sa, nullptr);
}

bool stop_requested() { return g_stop != 0; }

}  // namespace dpt
