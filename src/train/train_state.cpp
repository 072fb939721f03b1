// The Trainer's state across processes: initial parameters (seeded, model.init or a resumed
// checkpoint, broadcast from rank 0), the run's id and its claim on the checkpoint folder, and
// checkpoint writes (gathered whole when sharded, written by rank 0 on its writer's thread
// (ckpt_writer.hpp), pruned to this run's own).
#include <iterator>
#include <sstream>

#include "dpt/ckpt.hpp"
#include "dpt/ckpt_folder.hpp"
#include "dpt/ckpt_writer.hpp"
#include "dpt/finetune.hpp"
#include "dpt/log.hpp"
#include "dpt/sync.hpp"
#include "dpt/train.hpp"
#include "dpt/watchdog.hpp"
#include "train_internal.hpp"

namespace dpt {
using namespace train_detail;

namespace {

// A layer's tensor name under prefix: "<prefix>/<layer>/<leaf>", or for a preset torchvision's
// key "<prefix>/<layer>.<leaf>" ("model/layer1.0.bn1.running_mean").
std::string tensor_name(const Model& m, const std::string& prefix, const std::string& layer, const char* leaf) {
  return prefix + "/" + layer + (m.plan().preset ? "." : "/") + leaf;
}

Tensor float_tensor(std::string name, std::vector<int64_t> shape, std::vector<float> data) {
  Tensor t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.data = std::move(data);
  return t;
}

// The flat arena <-> per-layer tensors named as in DESIGN.md (conv weights in PyTorch's order).
void arena_to_tensors(const Model& m, const std::string& prefix, const std::vector<float>& flat,
                      std::vector<Tensor>& out) {
  for (int i = 0; i < m.num_layers(); ++i) {
    const LayerSlice& s = m.layer(i);
    Tensor w = float_tensor(tensor_name(m, prefix, s.name, "weight"), s.weight_shape(), std::vector<float>(s.weights()));
    weight_to_checkpoint(s, flat.data() + s.w_off, w.data.data());
    out.push_back(std::move(w));
    if (!s.has_bias) continue;
    Tensor b = float_tensor(tensor_name(m, prefix, s.name, "bias"), {s.out},
                            std::vector<float>(flat.begin() + long(s.b_off), flat.begin() + long(s.b_off + size_t(s.out))));
    out.push_back(std::move(b));
  }
}

// Batch norm's running statistics (this rank's: average them first) as model tensors.
void bn_to_tensors(Backend& be, Model& m, std::vector<Tensor>& out) {
  for (const BnState& b : m.bn_states()) {
    for (const char* leaf : {"running_mean", "running_var"}) {
      Tensor t = float_tensor(tensor_name(m, "model", b.name, leaf), {b.c}, std::vector<float>(size_t(b.c)));
      be.download(t.data.data(), leaf[8] == 'm' ? b.running_mean : b.running_var, size_t(b.c) * sizeof(float));
      out.push_back(std::move(t));
    }
    Tensor n = float_tensor(tensor_name(m, "model", b.name, "num_batches_tracked"), {}, {});
    n.int64 = true;
    n.ints = {*b.tracked};
    out.push_back(std::move(n));
  }
}

// Running statistics from a checkpoint into host arrays: means then variances, layer by layer,
// and the counts.
void bn_from_checkpoint(Model& m, const Checkpoint& ck, const std::string& file, std::vector<float>& stats,
                        std::vector<int64_t>& tracked) {
  for (const BnState& b : m.bn_states()) {
    for (const char* leaf : {"running_mean", "running_var"}) {
      const Tensor* t = ck.find(tensor_name(m, "model", b.name, leaf));
      if (!t || t->int64 || t->data.size() != size_t(b.c))
        throw InputError(file + ": tensor /" + tensor_name(m, "model", b.name, leaf) + " is missing or has the wrong size");
      stats.insert(stats.end(), t->data.begin(), t->data.end());
    }
    const Tensor* n = ck.find(tensor_name(m, "model", b.name, "num_batches_tracked"));
    if (!n || !n->int64 || n->ints.size() != 1)
      throw InputError(file + ": tensor /" + tensor_name(m, "model", b.name, "num_batches_tracked") + " is missing");
    tracked.push_back(n->ints[0]);
  }
}

std::vector<float> tensors_to_arena(const Model& m, const Checkpoint& ck, const std::string& prefix,
                                    const std::string& file) {
  std::vector<float> flat(m.num_params());
  for (int i = 0; i < m.num_layers(); ++i) {
    const LayerSlice& s = m.layer(i);
    for (const char* part : {"weight", "bias"}) {
      if (part[0] == 'b' && !s.has_bias) continue;  // its slot stays zero
      const std::string name = tensor_name(m, prefix, s.name, part);
      const Tensor* t = ck.find(name);
      const size_t want = part[0] == 'w' ? s.weights() : size_t(s.out);
      if (!t || t->data.size() != want)
        throw InputError(file + ": tensor /" + name + " is missing or has the wrong size for model.layers");
      if (part[0] == 'w') weight_from_checkpoint(s, t->data.data(), flat.data() + s.w_off);
      else std::copy(t->data.begin(), t->data.end(), flat.begin() + long(s.b_off));
    }
  }
  return flat;
}

// The checkpoint's model attributes for this model: widths, or the layer list and its input.
void describe_model(const Config& cfg, const Model& m, Checkpoint& ck) {
  if (cfg.layer_list.empty()) {
    ck.layers = cfg.layers;
    return;
  }
  ck.model = m.plan().text;  // normalised, however the config wrote it
  const TensorShape& in = m.plan().input;
  ck.input_shape = in.flat ? std::vector<int>{int(in.c)} : std::vector<int>{int(in.c), int(in.h), int(in.w)};
}

}  // namespace

void Trainer::load_initial_state() {
  MPI_Comm c = comm_.mpi();
  std::string path;
  // resume = auto validates the newest checkpoints by reading them; the one found is kept, not
  // read a second time below.
  Checkpoint found;
  bool have_found = false;
  if (cfg_.resume_planned) {  // plan_resume found it, judged it and kept rank 0's copy
    path = cfg_.resume_path;
    // Taken, not copied: its tensors are the model's size, and held nowhere after the load.
    if (cfg_.resume_checkpoint) found = std::move(*cfg_.resume_checkpoint), have_found = true;
  } else if (cfg_.resume == "auto" && !cfg_.start_over) {
    on_rank0(c, comm_.rank(), "finding the checkpoint to resume", [&] {
      if (!cfg_.ckpt_dir.empty()) path = find_latest_valid(cfg_.ckpt_dir, &found);
      have_found = !path.empty();
    });
  } else if (cfg_.resume != "none" && cfg_.resume != "auto") {
    path = cfg_.resume;
  }
  bcast_string(c, path);
  const bool resuming = !path.empty();
  std::string resumed_id;  // rank 0: the run that wrote the checkpoint resumed
  if (!resuming && cfg_.init.empty()) {
    model_->init_params(cfg_.seed);
  } else {
    const std::string file = resuming ? path : cfg_.init;
    std::vector<float> params;
    std::vector<std::vector<float>> state;
    std::vector<float> bn_stats;  // every bn layer's running mean and var
    std::vector<int64_t> bn_tracked;
    int64_t counters[5] = {0, 0, 0, 0, 0};
    if (!resuming) model_->init_params(cfg_.seed);  // what model.init leaves out stays seeded
    on_rank0(c, comm_.rank(), resuming ? "reading a checkpoint" : "reading model.init", [&] {
      if (!resuming) {
        read_init_weights(params, bn_stats, bn_tracked);
        return;
      }
      Checkpoint ck = have_found ? std::move(found) : read_checkpoint(file);
      Checkpoint want;
      describe_model(cfg_, *model_, want);
      check_planned_shape(file, ck.layers, ck.model, ck.input_shape);
      if (ck.layers != want.layers || ck.model != want.model)
        throw InputError(file + ": its model (" +
                         (ck.model.empty() ? "widths " + layers_text(ck.layers) : "'" + ck.model + "'") +
                         ") is not model.layers (" +
                         (want.model.empty() ? "widths " + layers_text(want.layers) : "'" + want.model + "'") +
                         ") on this data");
      params = tensors_to_arena(*model_, ck, "model", file);
      bn_from_checkpoint(*model_, ck, file, bn_stats, bn_tracked);
      resumed_id = ck.run_id;
      if (ck.optimizer != cfg_.optimizer)
        throw InputError(file + ": saved with optimizer " + ck.optimizer + ", config says " + cfg_.optimizer);
      for (auto& s : opt_->state()) state.push_back(tensors_to_arena(*model_, ck, "optimizer/" + s.name, file));
      const int64_t G = int64_t(cfg_.batch_per_rank) * comm_.size() * cfg_.accumulate;
      // The data position is kept in samples, so a run resumed with another global batch
      // continues from the same place in the same epoch order.
      counters[0] = ck.step;
      counters[1] = ck.epoch;
      counters[2] = ck.step_in_epoch * ck.global_batch / G;
      counters[3] = ck.samples_seen;
      counters[4] = ck.optimizer_updates;
      if (ck.step_in_epoch * ck.global_batch % G != 0)
        log::warn("resuming with global batch " + std::to_string(G) + " (saved with " +
                  std::to_string(ck.global_batch) + "): the epoch position is rounded down");
      log::info("resuming from " + file + " at step " + std::to_string(ck.step));
      for (const std::string& n : cfg_.resume_notes) log::info("  " + n);
    });
    params.resize(model_->num_params());
    be_.upload(model_->params(), params.data(), params.size() * sizeof(float));
    watchdog::Phase phase("waiting in broadcast of the resume state");
    DPT_CHECK_MPI(MPI_Bcast(counters, 5, MPI_INT64_T, 0, c));
    step_ = counters[0], epoch_ = counters[1], step_in_epoch_ = counters[2], samples_seen_ = counters[3];
    updates_ = counters[4];
    auto st = opt_->state();
    state.resize(st.size());  // rank 0 read them; the others receive them
    for (size_t i = 0; resuming && i < st.size(); ++i) {
      if (sharded()) {
        // Every rank takes its shard of rank 0's whole array.
        state[i].resize(model_->num_params());
        DPT_CHECK_MPI(MPI_Bcast(state[i].data(), int(state[i].size()), MPI_FLOAT, 0, c));
        sync_->scatter_state(state[i], st[i].data);
        continue;
      }
      if (comm_.rank() == 0) be_.upload(st[i].data, state[i].data(), state[i].size() * sizeof(float));
      comm_.broadcast(st[i].data, opt_->size(), DType::f32, 0);
    }
    opt_->set_steps_taken(updates_);
    if (resuming) last_saved_ = step_;
    // Rank 0's running statistics for every rank (after a run with sync_bn = false they were
    // averaged before they were written).
    auto bn = model_->bn_states();
    if (!bn.empty()) {
      size_t total = 0;
      for (const BnState& b : bn) total += 2 * size_t(b.c);
      bn_stats.resize(total);
      bn_tracked.resize(bn.size());
      DPT_CHECK_MPI(MPI_Bcast(bn_stats.data(), int(total), MPI_FLOAT, 0, c));
      DPT_CHECK_MPI(MPI_Bcast(bn_tracked.data(), int(bn.size()), MPI_INT64_T, 0, c));
      size_t at = 0;
      for (size_t i = 0; i < bn.size(); ++i) {
        be_.upload(bn[i].running_mean, bn_stats.data() + at, size_t(bn[i].c) * sizeof(float));
        be_.upload(bn[i].running_var, bn_stats.data() + at + size_t(bn[i].c), size_t(bn[i].c) * sizeof(float));
        at += 2 * size_t(bn[i].c);
        *bn[i].tracked = bn_tracked[i];
      }
    }
  }
  if (resuming) resumed_from_ = on_disk_ = path;
  if (rows_) claim_run(resuming ? path : "", resumed_id);
  // Ranks agree on the initial parameters whatever their seeds: rank 0's win.
  comm_.broadcast(model_->params(), model_->num_params(), DType::f32, 0);
  comm_.synchronize();
}

// The same model planned for samples of another shape (a checkpoint resumed or evaluated on
// other data): said in those words before any tensor's shape is.
void Trainer::check_planned_shape(const std::string& file, const std::vector<int>& layers,
                                  const std::string& model, const std::vector<int>& input_shape) const {
  Checkpoint want;
  describe_model(cfg_, *model_, want);
  if (layers == want.layers && model == want.model && input_shape != want.input_shape)
    throw InputError(file + ": its model was planned for samples of shape " + shape_text(input_shape) +
                     ", but the data here has samples of shape " + shape_text(want.input_shape) + " (" +
                     (rows_ ? "data.train " + cfg_.train_file : "data.test " + cfg_.test_file) + ")");
}

// Rank 0: model.init's tensors over the seeded model, by name and shape (finetune.hpp).
void Trainer::read_init_weights(std::vector<float>& params, std::vector<float>& bn_stats,
                                std::vector<int64_t>& bn_tracked) {
  HostModelState s;
  s.params.resize(model_->num_params());
  be_.download(s.params.data(), model_->params(), s.params.size() * sizeof(float));
  for (const BnState& b : model_->bn_states()) {
    const size_t at = s.bn_stats.size(), n = size_t(b.c);
    s.bn_stats.resize(at + 2 * n);
    be_.download(s.bn_stats.data() + at, b.running_mean, n * sizeof(float));
    be_.download(s.bn_stats.data() + at + n, b.running_var, n * sizeof(float));
    s.bn_tracked.push_back(*b.tracked);
  }
  const Weights w = read_weights(cfg_.init);
  if (w.kind == "dptrain checkpoint") check_planned_shape(cfg_.init, w.layers, w.model, w.input_shape);
  for (const std::string& line : load_init_weights(*model_, w, cfg_.init, cfg_.init_skip, s)) log::info(line);
  params = std::move(s.params);
  bn_stats = std::move(s.bn_stats);
  bn_tracked = std::move(s.bn_tracked);
}

// A training run's id and its checkpoint folder (rank 0 decides, every rank learns the id), and
// the run's start record in the metrics.
void Trainer::claim_run(const std::string& resumed, const std::string& resumed_id) {
  on_rank0(comm_.mpi(), comm_.rank(), "claiming the checkpoint folder", [&] {
    if (cfg_.ckpt_dir.empty()) {
      run_id_ = resumed.empty() || resumed_id.empty() ? new_run_id() : resumed_id;
      return;
    }
    const FolderClaim claim = claim_checkpoint_folder(cfg_.ckpt_dir, resumed, resumed_id, cfg_.start_over);
    run_id_ = claim.run_id;
    if (!claim.set_aside.empty())
      log::info("checkpoint.start_over: the checkpoints that were in " + cfg_.ckpt_dir + " are now in " +
                claim.set_aside);
    if (claim.others)
      log::info(cfg_.ckpt_dir + " also holds " + std::to_string(claim.others) +
                " checkpoint(s) of other runs: left alone (this run prunes only its own)");
  });
  bcast_string(comm_.mpi(), run_id_);
}

// Rank 0: the run's start record in the metrics, once it is known to train (a run resumed
// where it is already complete trains nothing and adds nothing to the metrics).
void Trainer::write_start_record() {
  if (comm_.rank() != 0) return;
  const bool resumed = !resumed_from_.empty();
  std::ostringstream js;
  js << "{\"run\": \"" << run_id_ << "\", \"start\": \"" << utc_now() << "\", \"resumed_from_step\": " << step_
     << ", \"world_size\": " << comm_.size() << ", \"global_batch\": " << global_batch() << "}";
  metrics_->write(js.str());
  if (cfg_.progress) log::info("run " + run_id_ + (resumed ? " continues at step " + std::to_string(step_) : std::string(" starts at step 0")));
}

// The parameters and optimizer-state arrays in host memory, in the arena's layout, and the
// pages of them that the backend locked (released before the memory is freed).
struct HostArenas {
  Backend* be = nullptr;
  std::vector<float> params;
  std::vector<std::vector<float>> states;
  std::vector<std::string> state_names;
  std::vector<void*> pinned;
  ~HostArenas() {
    for (void* p : pinned) be->unpin_host(p);
  }
  void pin(Backend& b) {
    be = &b;
    if (b.pin_host(params.data(), params.size() * sizeof(float))) pinned.push_back(params.data());
    for (auto& s : states)
      if (b.pin_host(s.data(), s.size() * sizeof(float))) pinned.push_back(s.data());
  }
};

namespace {

// What rank 0 hands its writer: the checkpoint's attributes, the arenas as copied off the device
// and the running statistics; the arenas become per-layer tensors on the writer's thread (conv
// weights reordered to PyTorch's layout), as the file is written.
struct PendingCheckpoint {
  Checkpoint ck;
  std::shared_ptr<const HostArenas> arenas;
  std::vector<Tensor> bn;
};

}  // namespace

// Sharded: gathered over the ranks into a new copy each time. Unsharded: the arenas are one
// download each, into host memory kept from the first checkpoint on and page-locked where the
// backend can (resnet18(stem=small)'s checkpoint held the steps 47-48 ms on one H200 with new
// pageable memory each time, 9-11 ms this way).
std::shared_ptr<HostArenas> Trainer::stage_arenas() {
  const bool keep = !sharded();
  const bool first = !keep || !staging_;
  std::shared_ptr<HostArenas> a = first ? std::make_shared<HostArenas>() : staging_;
  params_into(a->params);
  const auto& st = opt_->state();
  a->states.resize(st.size());
  a->state_names.resize(st.size());
  for (size_t i = 0; i < st.size(); ++i) {
    state_into(st[i].data, a->states[i]);
    a->state_names[i] = st[i].name;
  }
  if (keep && first) {
    a->pin(be_);
    staging_ = a;
  }
  return a;
}

void Trainer::save_checkpoint() {
  if (cfg_.ckpt_dir.empty()) return;
  // The write before this one is on disk (or its failure stops every rank here) before the
  // model is copied again: one checkpoint in host memory at a time.
  finish_checkpoint();
  auto pending = std::make_shared<PendingCheckpoint>();
  const bool root = comm_.rank() == 0;
  // A sharded run's parameters and state are made whole first (collective); then rank 0 alone
  // writes them, in the unsharded layout.
  average_bn_stats();  // collective
  if (sharded() || root) {
    watchdog::Phase phase("copying the model off the device for a checkpoint");
    pending->arenas = stage_arenas();
  }
  if (root) {
    Checkpoint& ck = pending->ck;
    ck.step = step_;
    ck.epoch = epoch_;
    ck.step_in_epoch = step_in_epoch_;
    ck.samples_seen = samples_seen_;
    ck.world_size = comm_.size();
    ck.global_batch = int64_t(cfg_.batch_per_rank) * comm_.size() * cfg_.accumulate;
    ck.optimizer_updates = updates_;
    ck.seed = cfg_.seed;
    ck.optimizer = cfg_.optimizer;
    ck.config = cfg_.resolved;
    ck.run_id = run_id_;
    ck.data_train = cfg_.data_identity;
    ck.schedule_steps = horizon_;
    ck.class_names = class_names_;
    describe_model(cfg_, *model_, ck);
    bn_to_tensors(be_, *model_, pending->bn);
  } else {
    pending.reset();  // a sharded run's gathered copy: rank 0's alone is written
  }
  on_rank0(comm_.mpi(), comm_.rank(), "writing a checkpoint", [&] {
    const std::string path = checkpoint_path(cfg_.ckpt_dir, step_);
    check_may_write(path, run_id_);
    // The model's layer slices are fixed from its construction on, and the writer is destroyed
    // (its write finished) before the model.
    writer_->start([path, pending, model = model_.get(), step = step_, dir = cfg_.ckpt_dir,
                    keep = cfg_.ckpt_keep, run = run_id_] {
      PendingCheckpoint& p = *pending;
      std::vector<Tensor>& out = p.ck.tensors;
      const HostArenas& a = *p.arenas;
      arena_to_tensors(*model, "model", a.params, out);
      std::move(p.bn.begin(), p.bn.end(), std::back_inserter(out));
      for (size_t i = 0; i < a.states.size(); ++i)
        arena_to_tensors(*model, "optimizer/" + a.state_names[i], a.states[i], out);
      p.arenas.reset();
      fault::checkpoint_write(step, path);
      write_checkpoint(path, p.ck);
      prune_checkpoints(dir, keep, run);
    });
    last_checkpoint_ = path;
  });
  last_saved_ = step_;
}

void Trainer::finish_checkpoint() {
  if (cfg_.ckpt_dir.empty()) return;
  on_rank0(comm_.mpi(), comm_.rank(), "finishing a checkpoint's write", [&] {
    try {
      writer_->wait();
      on_disk_ = last_checkpoint_.empty() ? resumed_from_ : last_checkpoint_;
    } catch (const Error& e) {
      if (!writer_->background()) throw;
      throw Error(std::string(e.what()) + " (written while training went on; the run stops at step " +
                      std::to_string(step_) + ", and " +
                      (on_disk_.empty() ? std::string("no checkpoint of this run is on disk")
                                        : "its newest checkpoint on disk is " + on_disk_) + ")",
                  e.code());
    }
  });
}

}  // namespace dpt
