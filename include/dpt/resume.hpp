// Resuming a run: which checkpoint a training run continues (checkpoint.resume), and whether
// this configuration is that checkpoint's run. A checkpoint records what it was trained on and
// how (its resolved configuration, data.train's identity, the global batch, the schedule's
// horizon). A change that alters what the run computes stops every rank at start-up unless
// checkpoint.accept_changes names it; a change that only extends or observes the run continues
// with a line saying so; another rank count keeps the global batch. Knows nothing of the loop.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dpt/ckpt.hpp"
#include "dpt/config.hpp"

namespace dpt {

// How a checkpoint's configuration compares with this run's, and what the run becomes.
struct ResumeVerdict {
  std::vector<std::string> refused;  // "train.lr: 0.05 in the checkpoint, 0.5 now"
  std::vector<std::string> refused_keys;  // the keys checkpoint.accept_changes would accept
  std::vector<std::string> notes;    // what changed and goes on, a line each
  // The global batch kept over another rank count, the lr scaling's base kept with it, and
  // the schedule's horizon (what Config's fields of the same names become).
  int batch_per_rank = 0, accumulate = 0, base_batch = 0;
  int64_t schedule_steps = 0;
};

// Pure. ck is the checkpoint to continue; cfg the run's configuration for `world` ranks;
// identity and rows are data.train's (data_identity, its row count).
ResumeVerdict judge_resume(const Config& cfg, int world, const Checkpoint& ck,
                           const std::string& identity, int64_t rows);

// The message of a refused resume: each changed key with both values, and the ways out.
std::string refusal_text(const Config& cfg, const std::string& path, const Checkpoint& ck, const ResumeVerdict& v);

// Collective, at start-up before any data is read. Rank 0 checks that checkpoint.dir can be
// written, reads data.train's identity, finds the checkpoint to continue (resume = auto: the
// newest valid one in checkpoint.dir; resume = FILE: that file) and judges it. A refusal throws
// InputError on every rank (exit 2); otherwise cfg takes the verdict (resume_planned,
// resume_path, resume_checkpoint on rank 0, data_identity, schedule_steps, the global batch's
// split, and rank 0's resume_notes, printed as the Trainer resumes).
void plan_resume(Config& cfg, MPI_Comm c);

// Rank 0: creates dir if needed and proves a file can be made in it (and removed); throws
// InputError naming checkpoint.dir and the system's reason.
void check_checkpoint_dir(const std::string& dir);

}  // namespace dpt
