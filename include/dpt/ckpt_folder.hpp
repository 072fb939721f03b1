// A checkpoint folder and who owns what in it. Every checkpoint names the run that wrote it
// (root attribute `run_id`); a run lists, prunes and overwrites only its own, and a fresh run
// stops at start-up rather than mix its checkpoints with another run's. Knows nothing of the
// training loop; the file format is ckpt.hpp's.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dpt/ckpt.hpp"

namespace dpt {

// <dir>/ckpt-<step, 9 digits>.h5
std::string checkpoint_path(const std::string& dir, int64_t step);
// Checkpoint files in dir, newest (highest step) first.
std::vector<std::string> list_checkpoints(const std::string& dir);
// Newest file in dir that reads back valid; damaged ones are skipped with a warning.
// Returns "" when there is none.
std::string find_latest_valid(const std::string& dir, Checkpoint* read = nullptr);

// A new run's id: 16 hex digits from the clock and the random device.
std::string new_run_id();

// Deletes all but the newest `keep` checkpoints of run `run_id` (keep <= 0: keep all), never a
// file of another run or one whose owner cannot be read; and temporary files of killed saves
// that have not been touched for an hour.
void prune_checkpoints(const std::string& dir, int keep, const std::string& run_id);

// Throws Error (exit 3) when `path` exists and was not written by run `run_id`: two runs are
// writing to one folder, and this one must not destroy the other's checkpoint.
void check_may_write(const std::string& path, const std::string& run_id);

// What a run found in its checkpoint folder at start-up.
struct FolderClaim {
  std::string run_id;     // this run's: the resumed checkpoint's, or a new one
  std::string set_aside;  // where another run's checkpoints were moved ("" = nowhere)
  size_t others = 0;      // checkpoints of other runs left in the folder (resumed runs only)
};

// Rank 0, before the first step. `resumed` is the checkpoint this run continues ("" = a fresh
// run) and `resumed_id` its run id. A fresh run in a folder that holds checkpoints (any run's:
// the new run owns none) throws InputError naming the folder and the ways out, unless
// start_over, which moves them into <dir>/set-aside-<UTC time>/ and goes on.
FolderClaim claim_checkpoint_folder(const std::string& dir, const std::string& resumed,
                                    const std::string& resumed_id, bool start_over);

}  // namespace dpt
