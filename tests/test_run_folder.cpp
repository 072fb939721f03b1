// A run's checkpoint folder as users meet it: a second run in a folder that holds another run's
// checkpoints never deletes or overwrites them (it stops at start-up, continues them, or sets
// them aside), the same command run again continues a stopped run and says when there is
// nothing left to do, and every run's metrics records are told apart by a run id. Oracles: the
// folder's files (names and bytes) before and after, and the metrics file.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.hpp"

namespace fs = std::filesystem;

namespace {

using cli::mpirun;
using cli::Outcome;

// Every command under a hard 90 s limit.
Outcome sh(const std::string& cmd) { return cli::sh(cmd, 90); }

using cli::slurp;
using cli::snapshot;

std::vector<std::string> names(const std::map<std::string, std::string>& m) {
  std::vector<std::string> v;
  for (const auto& kv : m) v.push_back(kv.first);
  return v;
}

// The value of "key": "..." in a JSON line ("" when absent).
std::string field(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\": \"";
  const size_t a = line.find(k);
  if (a == std::string::npos) return "";
  const size_t b = line.find('"', a + k.size());
  return line.substr(a + k.size(), b - a - k.size());
}

class RunFolder : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("dpt-runfolder-" + std::to_string(::getpid()) + "-" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (auto [name, n] : {std::pair<const char*, int>{"train.h5", 2000}, {"test.h5", 400}}) {
      Outcome r = sh(std::string(DPT_BINARY_DIR) + "/dpdata synth blobs --n " + std::to_string(n) +
                     " --dim 16 --classes 4 --spread 0.5 --seed 3 --out " + (dir / name).string());
      ASSERT_EQ(r.code, 0) << r.out;
    }
    // 2000 rows / (25 × 2 ranks) = 40 steps per epoch; 10 epochs; resume = auto (the default).
    std::ofstream(dir / "run.ini") << "[model]\nlayers = 16,32,4\n[data]\ntrain = " << (dir / "train.h5").string()
                                   << "\ntest = " << (dir / "test.h5").string()
                                   << "\n[train]\nepochs = 10\nbatch_per_rank = 25\noptimizer = adam\nlr = 0.01\n"
                                   << "[checkpoint]\ndir = " << (dir / "ck").string() << "\nkeep = 3\n"
                                   << "[log]\nevery_steps = 10\nmetrics = " << (dir / "m.jsonl").string() << "\n";
  }
  void TearDown() override { fs::remove_all(dir); }
  Outcome train(const std::string& args) {
    return sh(mpirun(2) + DPT_BINARY_DIR + "/dptrain --config " + (dir / "run.ini").string() + " " + args);
  }
};

}  // namespace

// The sequence that lost a run's work: a long run, then a short fresh run into the same folder.
TEST_F(RunFolder, FreshRunNeverPrunesAnotherRunsCheckpoints) {
  Outcome a = train("--train.steps 120 --checkpoint.every_steps 40");
  ASSERT_EQ(a.code, 0) << a.out;
  const auto first = snapshot(dir / "ck");
  ASSERT_EQ(names(first), (std::vector<std::string>{"ckpt-000000040.h5", "ckpt-000000080.h5", "ckpt-000000120.h5"}));

  // A fresh run (resume = none): stops at start-up, exit 2, naming the folder and the ways out.
  Outcome b = train("--train.steps 20 --checkpoint.every_steps 5 --checkpoint.resume none");
  EXPECT_EQ(b.code, 2) << b.out;
  for (const std::string& w : std::vector<std::string>{(dir / "ck").string(), "another run's checkpoints", "--checkpoint.dir OTHER",
                              "--checkpoint.resume auto", "--checkpoint.start_over true"})
    EXPECT_NE(b.out.find(w), std::string::npos) << "missing '" << w << "' in:\n" << b.out;
  EXPECT_EQ(snapshot(dir / "ck"), first) << "the refused run touched the first run's checkpoints";

  // The same with resume = auto: the first run is continued, and it is complete already.
  Outcome c = train("--train.steps 20 --checkpoint.every_steps 5");
  EXPECT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("already complete at step 120"), std::string::npos) << c.out;
  EXPECT_EQ(c.out.find("0 samples/s"), std::string::npos) << c.out;
  EXPECT_EQ(snapshot(dir / "ck"), first);

  // start_over: the first run's checkpoints are moved aside unchanged; the new run keeps 3 of its own.
  Outcome d = train("--train.steps 20 --checkpoint.every_steps 5 --checkpoint.start_over true");
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_EQ(names(snapshot(dir / "ck")),
            (std::vector<std::string>{"ckpt-000000010.h5", "ckpt-000000015.h5", "ckpt-000000020.h5"}));
  std::vector<fs::path> aside;
  for (const auto& e : fs::directory_iterator(dir / "ck"))
    if (e.is_directory() && e.path().filename().string().rfind("set-aside-", 0) == 0) aside.push_back(e.path());
  ASSERT_EQ(aside.size(), 1u) << d.out;
  EXPECT_EQ(snapshot(aside[0]), first) << "set aside, bit for bit";
  EXPECT_NE(d.out.find(aside[0].string()), std::string::npos) << "the new place is named:\n" << d.out;

  // Metrics: one start record per run that trained (the complete run resumed trained nothing
  // and added none), each record names its run.
  std::ifstream m(dir / "m.jsonl");
  std::string line;
  std::vector<std::string> starts;
  std::map<std::string, std::set<long>> steps_of;
  while (std::getline(m, line)) {
    const std::string run = field(line, "run");
    ASSERT_EQ(run.size(), 16u) << "record without a run id: " << line;
    if (line.find("\"start\": \"") != std::string::npos) starts.push_back(run);
    const size_t s = line.find("{\"step\": ");
    if (s == 0) steps_of[run].insert(std::stol(line.substr(9)));
  }
  ASSERT_EQ(starts.size(), 2u) << slurp(dir / "m.jsonl");
  EXPECT_NE(starts[0], starts[1]) << "the run that started over has an id of its own";
  EXPECT_EQ(*steps_of[starts[0]].rbegin(), 120);
  EXPECT_EQ(*steps_of[starts[1]].rbegin(), 20);
}

// A stopped job run again with the same command continues (resume = auto), says which steps it
// ran, prunes its own older checkpoints, and a train.steps cap still ends with an evaluation.
TEST_F(RunFolder, SameCommandAgainContinues) {
  Outcome a = train("--train.steps 55 --checkpoint.every_steps 20");
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_NE(a.out.find("eval  step 55"), std::string::npos) << "a cap mid-epoch still evaluates:\n" << a.out;
  EXPECT_NE(a.out.find("done: 55 steps in"), std::string::npos) << a.out;
  Outcome b = train("--train.steps 130 --checkpoint.every_steps 20");
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("resuming from " + (dir / "ck" / "ckpt-000000055.h5").string()), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("done: steps 55 -> 130 (75 in this run)"), std::string::npos) << b.out;
  // keep = 3 over the run's own checkpoints, the first invocation's included (20 40 55 60 80 100 120 130).
  EXPECT_EQ(names(snapshot(dir / "ck")),
            (std::vector<std::string>{"ckpt-000000100.h5", "ckpt-000000120.h5", "ckpt-000000130.h5"}));
}
