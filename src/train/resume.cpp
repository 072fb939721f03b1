// Resuming a run: the checkpoint to continue and the judgement of whether this configuration is
// its run (see resume.hpp; the rules are docs/semantics.md's "Resume").
#include "dpt/resume.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "dpt/ckpt_folder.hpp"
#include "dpt/data.hpp"
#include "dpt/log.hpp"
#include "train_internal.hpp"

namespace dpt {
namespace {

// Keys whose change neither alters what the run computes nor extends it: where files are read
// or written, how ranks talk, what is logged, how the device is used, when evaluations and
// checkpoints happen. A change continues with a line. model.init and model.init_skip are moot for a
// resumed run.
const std::set<std::string> kObserving = {
    "data.test",          "data.read",          "train.eval_every",       "train.on_nonfinite",
    "train.shard_optimizer", "comm.backend",    "comm.bucket_mb",         "comm.timeout_s",
    "comm.nccl_max_ctas", "device.type",        "device.threads",         "device.conv_tuning",
    "device.recompute",   "device.conv_workspace_mb", "checkpoint.dir",   "checkpoint.every_steps",
    "checkpoint.keep",    "checkpoint.at_start", "checkpoint.background", "log.metrics",
    "log.every_steps",    "log.progress",       "log.timing",             "model.init",
    "model.init_skip"};
// Keys that say how a resume is made, not what the run is.
const std::set<std::string> kResumeKeys = {"checkpoint.resume", "checkpoint.start_over",
                                           "checkpoint.accept_changes"};
// Judged on their own below: the data by its identity, the run's length, the global batch.
const std::set<std::string> kJudgedApart = {"data.train", "train.epochs", "train.steps",
                                            "train.batch_per_rank", "train.accumulate", "train.base_batch"};

std::string changed(const std::string& key, const std::string& was, const std::string& now) {
  return key + ": " + (was.empty() ? "(empty)" : was) + " in the checkpoint, " + (now.empty() ? "(empty)" : now) + " now";
}

int effective_base(const Config& c) { return c.base_batch > 0 ? c.base_batch : c.batch_per_rank; }

// The checkpoint's configuration, parsed as this version reads it (keys it lacks take their
// defaults). Throws InputError when this version cannot read it.
Config saved_config(const Checkpoint& ck) {
  const char* argv[] = {"dptrain"};
  return parse_invocation(1, argv, "the checkpoint's configuration", ck.config, /*check=*/false).cfg;
}

struct Judge {
  const Config& cfg;
  const Config& old;
  int world;
  const Checkpoint& ck;
  std::set<std::string> accepted;
  ResumeVerdict v;

  bool accepts(const std::string& key) const { return accepted.count(key) > 0; }
  void computes(const std::string& key, const std::string& line) {
    if (accepts(key)) v.notes.push_back(line + " (accepted: checkpoint.accept_changes)");
    else v.refused.push_back(line), v.refused_keys.push_back(key);
  }
  void keys();
  void data(const std::string& identity);
  void global_batch();
  void length(int64_t rows);
};

void Judge::keys() {
  const auto was = key_values(old);
  std::map<std::string, std::string> before(was.begin(), was.end());
  std::string observed;
  for (const auto& [key, now] : key_values(cfg)) {
    const std::string prev = before.count(key) ? before[key] : now;
    if (prev == now || kResumeKeys.count(key) || kJudgedApart.count(key)) continue;
    if (kObserving.count(key)) observed += (observed.empty() ? "" : ", ") + key + " " + prev + " -> " + now;
    else computes(key, changed(key, prev, now));
  }
  if (!observed.empty()) v.notes.push_back("changed since the checkpoint, without changing what the run computes: " + observed);
}

void Judge::data(const std::string& identity) {
  const std::string& was = old.train_file;
  const std::string& now = cfg.train_file;
  if (ck.data_train.empty()) {  // a checkpoint of an older version: the path is all it names
    if (was != now) computes("data.train", changed("data.train", was, now));
    else v.notes.push_back("the checkpoint records no identity of data.train (an older version wrote it): " + now +
                           " is taken to be the same file by its path");
    return;
  }
  if (ck.data_train != identity)
    computes("data.train", "data.train: " + was + " (" + ck.data_train + ") in the checkpoint, " + now + " (" +
                               identity + ") now" + (was == now ? ": the file's contents changed" : ""));
  else if (was != now)
    v.notes.push_back("data.train is " + now + " now (" + was + " in the checkpoint): the same data (" + identity + ")");
}

// Global batch = batch_per_rank × ranks × accumulate. Another rank count with the checkpoint's
// batch_per_rank and accumulate keeps the global batch: accumulate first (the micro-batch, so
// batch norm's statistics, stays), else batch_per_rank (with lr scaling's base kept).
void Judge::global_batch() {
  v.batch_per_rank = cfg.batch_per_rank, v.accumulate = cfg.accumulate, v.base_batch = cfg.base_batch;
  const int64_t G = ck.global_batch, b = cfg.batch_per_rank, a = cfg.accumulate;
  const int64_t now = b * world * a;
  const std::string split = std::to_string(b) + " per rank x " + std::to_string(world) + " rank(s) x " +
                            std::to_string(a) + " micro-batch(es)";
  const bool asked = b != old.batch_per_rank || a != old.accumulate;
  if (now == G) {
    if (asked || world != ck.world_size)
      v.notes.push_back("global batch " + std::to_string(G) + " as in the checkpoint (" + std::to_string(ck.world_size) +
                        " rank(s) then), now " + split);
  } else if (asked) {
    const std::string line = "global batch (train.batch_per_rank x ranks x train.accumulate): " + std::to_string(G) +
                             " in the checkpoint, " + std::to_string(now) + " now (" + split + ")";
    computes(accepts("train.accumulate") ? "train.accumulate" : "train.batch_per_rank", line);
  } else if (G % (b * world) == 0) {
    v.accumulate = int(G / (b * world));
    v.notes.push_back(std::to_string(ck.world_size) + " rank(s) in the checkpoint, " + std::to_string(world) +
                      " now: train.accumulate " + std::to_string(a) + " -> " + std::to_string(v.accumulate) +
                      " keeps the global batch " + std::to_string(G));
  } else if (G % (int64_t(world) * a) == 0) {
    v.batch_per_rank = int(G / (int64_t(world) * a));
    v.base_batch = effective_base(old);  // lr_scaling's ratio stays the checkpoint's
    v.notes.push_back(std::to_string(ck.world_size) + " rank(s) in the checkpoint, " + std::to_string(world) +
                      " now: train.batch_per_rank " + std::to_string(b) + " -> " + std::to_string(v.batch_per_rank) +
                      " keeps the global batch " + std::to_string(G));
  } else {
    v.refused.push_back("ranks: " + std::to_string(ck.world_size) + " in the checkpoint, " + std::to_string(world) +
                        " now, and its global batch " + std::to_string(G) + " is no multiple of " +
                        std::to_string(world) + " x train.accumulate or of " + std::to_string(world) +
                        " x train.batch_per_rank; run on a rank count that divides it, or name the new split "
                        "(--train.batch_per_rank N --checkpoint.accept_changes train.batch_per_rank)");
  }
  Config after = cfg;
  after.batch_per_rank = v.batch_per_rank, after.base_batch = v.base_batch;
  if (cfg.lr_scaling != "none" && effective_base(after) != effective_base(old))
    computes("train.base_batch", changed("train.base_batch (the lr scaling's base; 0 = batch_per_rank)",
                                         std::to_string(effective_base(old)), std::to_string(effective_base(after))));
}

// More epochs or steps extend the run; fewer end it sooner. The lr schedule keeps the
// checkpoint's horizon unless the change of length is accepted, which re-plans it.
void Judge::length(int64_t rows) {
  const int64_t per_epoch = std::max<int64_t>(1, rows / std::max<int64_t>(1, ck.global_batch));
  int64_t horizon = ck.schedule_steps;
  if (horizon == 0) {  // older checkpoints: the horizon their configuration implies
    horizon = int64_t(old.epochs) * per_epoch;
    if (old.steps > 0) horizon = std::min(horizon, old.steps);
  }
  v.schedule_steps = horizon;
  std::string what;
  if (cfg.epochs != old.epochs) what += "train.epochs " + std::to_string(old.epochs) + " -> " + std::to_string(cfg.epochs);
  if (cfg.steps != old.steps)
    what += (what.empty() ? "" : ", ") + std::string("train.steps ") + std::to_string(old.steps) + " -> " + std::to_string(cfg.steps);
  if (what.empty()) return;
  const bool replan = accepts("train.epochs") || accepts("train.steps");
  if (replan) v.schedule_steps = 0;
  int64_t last = int64_t(cfg.epochs) * per_epoch;
  if (cfg.steps > 0) last = std::min(last, cfg.steps);
  if (cfg.schedule == "cosine" && cfg.min_lr == 0 && !replan && last > std::max(horizon, ck.step)) {
    // Past the horizon a cosine schedule to 0 trains at lr 0: the steps added would not move the weights.
    v.refused.push_back(what + ": the run would go on to step " + std::to_string(last) + ", past the end of its cosine "
                        "schedule (step " + std::to_string(horizon) + "), where the lr is train.min_lr = 0 and no "
                        "step changes the weights; to train further, plan the schedule over the new length");
    v.refused_keys.push_back(cfg.epochs != old.epochs ? "train.epochs" : "train.steps");
    return;
  }
  std::string sched;
  if (cfg.schedule == "cosine")
    sched = replan ? "; the cosine schedule is planned again over the new length (accepted: checkpoint.accept_changes), "
                     "so the lr from here on differs from the checkpoint's plan"
                   : "; the cosine schedule keeps its horizon of " + std::to_string(horizon) +
                         " steps (train.min_lr after it); --checkpoint.accept_changes train.epochs plans it over the new length";
  v.notes.push_back(what + ": the run's length changes" + sched);
}

}  // namespace

ResumeVerdict judge_resume(const Config& cfg, int world, const Checkpoint& ck, const std::string& identity,
                           int64_t rows) {
  Config old;
  try {
    old = saved_config(ck);
  } catch (const InputError& e) {
    ResumeVerdict v;
    v.refused.push_back(std::string("its stored configuration cannot be read by this version: ") + e.what());
    return v;
  }
  Judge j{cfg, old, world, ck, {}, {}};
  for (const std::string& k : split_list(cfg.accept_changes)) j.accepted.insert(k);
  j.keys();
  j.data(identity);
  j.global_batch();
  j.length(rows);
  return j.v;
}

std::string refusal_text(const Config& cfg, const std::string& path, const Checkpoint& ck, const ResumeVerdict& v) {
  std::string keys, text = "checkpoint.resume = " + cfg.resume + ": " + path + " (step " + std::to_string(ck.step) +
                           ") was trained under another configuration; continuing it would not be this run. "
                           "Changed since that checkpoint:\n";
  for (const std::string& r : v.refused) text += "  " + r + "\n";
  for (const std::string& k : v.refused_keys) keys += (keys.empty() ? "" : ",") + k;
  const std::string dir = cfg.ckpt_dir.empty() ? "checkpoint.dir" : cfg.ckpt_dir;
  text += "Either\n"
          "  - start a new run in another folder: --checkpoint.dir OTHER (add --model.init " + path +
          " to start from its weights), or\n"
          "  - start over in this one: --checkpoint.start_over true moves the checkpoints in " + dir + " into " + dir +
          "/set-aside-<UTC time>/ (nothing is deleted), or\n"
          "  - continue this checkpoint under the changes: --checkpoint.accept_changes " +
          (keys.empty() ? std::string("KEY,...") : keys);
  return text;
}

void check_checkpoint_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec))
    throw InputError("checkpoint.dir = '" + dir + "': cannot create it" + (ec ? ": " + ec.message() : std::string(": not a folder")) +
                     "; name a folder this job can write (checked at start-up, before any training)");
  const fs::path probe = fs::path(dir) / (".dptrain-write-test." + std::to_string(::getpid()));
  { std::ofstream out(probe); }
  if (!fs::exists(probe, ec))
    throw InputError("checkpoint.dir = '" + dir + "': cannot write a file in it (" + std::strerror(errno) +
                     "); name a folder this job can write (checked at start-up, before any training)");
  fs::remove(probe, ec);
}

void plan_resume(Config& cfg, MPI_Comm c) {
  int rank = 0, world = 1;
  MPI_Comm_rank(c, &rank);
  MPI_Comm_size(c, &world);
  auto found = std::make_shared<Checkpoint>();
  ResumeVerdict v;
  std::string path;
  const bool resumes = cfg.resume != "none" && !(cfg.resume == "auto" && (cfg.start_over || cfg.ckpt_dir.empty()));
  train_detail::on_rank0(c, rank, "finding the checkpoint to resume", [&] {
    if (!cfg.ckpt_dir.empty()) check_checkpoint_dir(cfg.ckpt_dir);
    if (cfg.ckpt_dir.empty() && !resumes) return;  // nothing is stored or continued
    cfg.data_identity = data_identity(cfg.train_file);
    if (cfg.resume == "auto" && resumes) path = find_latest_valid(cfg.ckpt_dir, found.get());
    else if (resumes) path = cfg.resume, *found = read_checkpoint(path);
    if (path.empty()) return;
    v = judge_resume(cfg, world, *found, cfg.data_identity, probe_dataset(cfg.train_file).n);
    if (!v.refused.empty()) throw InputError(refusal_text(cfg, path, *found, v), /*collective=*/true);
  });
  bcast_string(c, path);
  bcast_string(c, cfg.data_identity);
  int64_t split[4] = {v.batch_per_rank, v.accumulate, v.base_batch, v.schedule_steps};
  DPT_CHECK_MPI(MPI_Bcast(split, 4, MPI_INT64_T, 0, c));
  cfg.resume_planned = true;
  cfg.resume_path = path;
  if (path.empty()) return;
  cfg.batch_per_rank = int(split[0]), cfg.accumulate = int(split[1]), cfg.base_batch = int(split[2]);
  // cfg.resolved stays what was asked: checkpoints store the request, and their global_batch
  // and world_size attributes how this run met it.
  cfg.schedule_steps = split[3];
  if (rank == 0) cfg.resume_checkpoint = std::move(found), cfg.resume_notes = v.notes;
}

}  // namespace dpt
