// The checkpoint folder: listing, the newest valid checkpoint, ownership by run id (claim at
// start-up, prune, overwrite check) and setting another run's checkpoints aside.
#include "dpt/ckpt_folder.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>

#include "dpt/check.hpp"
#include "dpt/log.hpp"

namespace dpt {
namespace {
namespace fs = std::filesystem;

std::string join_dir(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

// "ckpt-000000100.h5 .. ckpt-000000300.h5 (3 files)" for a list newest first.
std::string describe_files(const std::vector<std::string>& newest_first) {
  const auto name = [](const std::string& p) { return fs::path(p).filename().string(); };
  if (newest_first.size() == 1) return name(newest_first[0]);
  return name(newest_first.back()) + " .. " + name(newest_first.front()) + " (" +
         std::to_string(newest_first.size()) + " files)";
}

std::string utc_stamp() { return log::utc_time("%Y%m%dT%H%M%SZ"); }

// A save killed by SIGKILL/OOM/preemption leaves ".ckpt-*.h5.tmp.<pid>" behind, as large as a
// checkpoint. A save in progress rewrites its file continuously and fsyncs within minutes, so a
// temporary file untouched for an hour belongs to a dead writer (possibly on another node,
// which is why the pid is not trusted).
void remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return;
  const auto cutoff = fs::file_time_type::clock::now() - std::chrono::hours(1);
  for (const auto& entry : it) {
    std::string name = entry.path().filename().string();
    if (name.compare(0, 6, ".ckpt-") != 0 || name.find(".h5.tmp.") == std::string::npos) continue;
    std::error_code fec;
    auto mtime = entry.last_write_time(fec);
    if (!fec && mtime < cutoff) fs::remove(entry.path(), fec);
  }
}

// Moves every checkpoint in dir into a new subfolder; returns its path.
std::string set_aside(const std::string& dir, const std::vector<std::string>& files) {
  std::string to = join_dir(dir, "set-aside-" + utc_stamp());
  for (int k = 2; fs::exists(to); ++k) to = join_dir(dir, "set-aside-" + utc_stamp() + "-" + std::to_string(k));
  std::error_code ec;
  fs::create_directories(to, ec);
  if (ec) throw Error("cannot create " + to + " to set the old checkpoints aside: " + ec.message());
  for (const std::string& f : files) {
    // rename(2) within one file system: the file is in one place or the other, never lost.
    fs::rename(f, fs::path(to) / fs::path(f).filename(), ec);
    if (ec) throw Error("cannot move " + f + " into " + to + ": " + ec.message());
  }
  return to;
}

}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "ckpt-%09lld.h5", static_cast<long long>(step));
  return join_dir(dir, name);
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return {};  // a missing folder simply holds no checkpoints
  for (const auto& entry : it) {
    std::string name = entry.path().filename().string();
    // ckpt-<digits>.h5 exactly: temporary files (".ckpt-...tmp.<pid>") never match.
    if (name.size() < 9 || name.compare(0, 5, "ckpt-") != 0 ||
        name.compare(name.size() - 3, 3, ".h5") != 0)
      continue;
    std::string digits = name.substr(5, name.size() - 8);
    if (digits.empty() || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    std::error_code fec;
    if (!entry.is_regular_file(fec)) continue;
    found.emplace_back(std::stoll(digits), join_dir(dir, name));
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::string find_latest_valid(const std::string& dir, Checkpoint* read) {
  for (const std::string& p : list_checkpoints(dir)) {
    try {
      Checkpoint ck = read_checkpoint(p);
      if (read) *read = std::move(ck);
      return p;
    } catch (const InputError& e) {
      std::string reason = e.what();
      const std::string prefix = "checkpoint " + p + ": ";
      if (reason.compare(0, prefix.size(), prefix) == 0) reason = reason.substr(prefix.size());
      log::warn("skipping damaged checkpoint " + p + ": " + reason);
    }
  }
  return "";
}

std::string new_run_id() {
  std::random_device rd;
  const uint64_t now = uint64_t(std::chrono::system_clock::now().time_since_epoch().count());
  const uint64_t r = (uint64_t(rd()) << 32) ^ uint64_t(rd());
  std::mt19937_64 mix(now ^ r);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(mix()));
  return buf;
}

void prune_checkpoints(const std::string& dir, int keep, const std::string& run_id) {
  remove_stale_temporaries(dir);
  if (keep <= 0) return;
  int kept = 0;
  for (const std::string& p : list_checkpoints(dir)) {
    if (run_id.empty() || read_checkpoint_run_id(p) != run_id) continue;  // not ours: never touched
    if (++kept <= keep) continue;
    std::error_code ec;
    // Failing to delete an old checkpoint costs disk, not correctness: warn and go on.
    if (!fs::remove(p, ec) && ec) log::warn("cannot delete old checkpoint " + p + ": " + ec.message());
  }
}

void check_may_write(const std::string& path, const std::string& run_id) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  const std::string owner = read_checkpoint_run_id(path);
  if (!owner.empty() && owner == run_id) return;
  throw Error("not overwriting " + path + ": it was written by " +
              (owner.empty() ? std::string("another run (or cannot be read)") : "run " + owner) +
              ", not this one (" + run_id + "); is another job writing checkpoints to the same "
              "checkpoint.dir? The run stops here; its own earlier checkpoints are intact");
}

FolderClaim claim_checkpoint_folder(const std::string& dir, const std::string& resumed,
                                    const std::string& resumed_id, bool start_over) {
  FolderClaim claim;
  const std::vector<std::string> files = list_checkpoints(dir);
  if (!resumed.empty()) {
    // A checkpoint of an older version names no run: this run takes a new id and leaves the
    // older files alone.
    claim.run_id = resumed_id.empty() ? new_run_id() : resumed_id;
    for (const std::string& f : files)
      if (read_checkpoint_run_id(f) != claim.run_id) ++claim.others;
    return claim;
  }
  claim.run_id = new_run_id();
  if (files.empty()) return claim;
  if (start_over) {
    claim.set_aside = set_aside(dir, files);
    return claim;
  }
  throw InputError(
      "checkpoint.dir " + dir + " holds another run's checkpoints (" + describe_files(files) +
          ") and this run starts fresh (checkpoint.resume = none, or no valid checkpoint to "
          "resume): it would mix its checkpoints with them. Either\n"
          "  - write to another folder: --checkpoint.dir OTHER, or\n"
          "  - continue the newest of them: --checkpoint.resume auto, or\n"
          "  - start over: --checkpoint.start_over true moves them into " + dir +
          "/set-aside-<UTC time>/ (nothing is deleted)",
      /*collective=*/true);
}

}  // namespace dpt
