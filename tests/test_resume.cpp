// A resumed run is the same run: checkpoint.resume continues a checkpoint only under the
// configuration that wrote it. Another data file or learning rate stops every rank at start-up
// (exit 2) and leaves the folder and the metrics as they were; more epochs, a steps cap and
// another rank count continue as the same run would have (oracle: the uninterrupted run's
// metrics); Ctrl-C checkpoints; an unwritable folder is found before any training.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cli_util.hpp"

namespace fs = std::filesystem;

namespace {

using cli::mpirun;
using cli::Outcome;
using cli::slurp;
using cli::snapshot;

// Every command under a hard 90 s limit.
Outcome sh(const std::string& cmd) { return cli::sh(cmd, 90); }

// A number field of a JSON line ("key": 1.5); NAN when absent.
double number(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\": ";
  const size_t a = line.find(k);
  return a == std::string::npos ? NAN : std::stod(line.substr(a + k.size()));
}

// step -> {loss, lr} of every step record in a metrics file.
std::map<long, std::pair<double, double>> steps_in(const fs::path& metrics) {
  std::map<long, std::pair<double, double>> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("{\"step\": ", 0) == 0) out[long(number(line, "step"))] = {number(line, "loss"), number(line, "lr")};
  return out;
}

void expect_all(const Outcome& r, const std::vector<std::string>& words) {
  for (const std::string& w : words) EXPECT_NE(r.out.find(w), std::string::npos) << "missing '" << w << "' in:\n" << r.out;
}

// Runs cmd in the background with its output in log, sends it `sig` once a progress line is
// there, and returns what `wait` said ("rc=N").
Outcome signal_after_first_step(const std::string& cmd, const std::string& log, const char* sig) {
  return sh("bash -c '" + cmd + " > " + log + " 2>&1 & p=$!; for i in $(seq 300); do grep -q \"^step\" " + log +
            " && break; sleep 0.1; done; kill -" + sig + " $p; wait $p; echo rc=$?'");
}

class Resume : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("dpt-resume-" + std::to_string(::getpid()) + "-" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (auto [name, n, seed] : {std::tuple<const char*, int, int>{"train.h5", 2000, 3}, {"test.h5", 400, 3}, {"other.h5", 2000, 4}}) {
      Outcome r = sh(std::string(DPT_BINARY_DIR) + "/dpdata synth blobs --n " + std::to_string(n) + " --dim 16 --classes 4 " +
                     "--spread 0.5 --seed " + std::to_string(seed) + " --out " + (dir / name).string());
      ASSERT_EQ(r.code, 0) << r.out;
    }
    // 2000 rows / (25 × 2 ranks) = 40 steps per epoch, 2 epochs, a cosine schedule to 0.
    std::ofstream(dir / "run.ini") << "[model]\nlayers = 16,32,4\n[data]\ntrain = " << (dir / "train.h5").string()
                                   << "\ntest = " << (dir / "test.h5").string()
                                   << "\n[train]\nepochs = 2\nbatch_per_rank = 25\noptimizer = adam\nlr = 0.01\n"
                                   << "schedule = cosine\n[checkpoint]\ndir = " << (dir / "ck").string()
                                   << "\nevery_steps = 20\nkeep = 0\n"
                                   << "[log]\nevery_steps = 10\nmetrics = " << (dir / "m.jsonl").string() << "\n";
  }
  void TearDown() override { fs::remove_all(dir); }
  Outcome train(int ranks, const std::string& args) {
    return sh(mpirun(ranks) + DPT_BINARY_DIR + "/dptrain --config " + (dir / "run.ini").string() + " " + args);
  }
  std::string path(const char* name) const { return (dir / name).string(); }
};

}  // namespace

// The sequence that trained nothing on a user's file: the same folder, another data.train.
TEST_F(Resume, ChangedDataOrLrStopsEveryRankAndTouchesNothing) {
  Outcome a = train(2, "");
  ASSERT_EQ(a.code, 0) << a.out;
  const auto files = snapshot(dir / "ck");
  const std::string metrics = slurp(dir / "m.jsonl");

  Outcome b = train(2, "--data.train " + path("other.h5"));
  EXPECT_EQ(b.code, 2) << b.out;
  expect_all(b, {"data.train: " + path("train.h5"), path("other.h5") + " (2000 rows", "in the checkpoint",
                 "--checkpoint.dir OTHER", "--model.init " + path("ck/ckpt-000000080.h5"),
                 "--checkpoint.start_over true", "--checkpoint.accept_changes data.train"});
  EXPECT_EQ(b.out.find("resuming from"), std::string::npos) << b.out;

  Outcome c = train(2, "--train.lr 0.5 --train.epochs 3");
  EXPECT_EQ(c.code, 2) << c.out;
  expect_all(c, {"train.lr: 0.01 in the checkpoint, 0.5 now", "--checkpoint.accept_changes train.lr"});
  EXPECT_EQ(c.out.find("train.epochs:"), std::string::npos) << "more epochs extend the run:\n" << c.out;

  // Accepting one change leaves the other refused.
  Outcome d = train(2, "--train.lr 0.5 --data.train " + path("other.h5") + " --checkpoint.accept_changes train.lr");
  EXPECT_EQ(d.code, 2) << d.out;
  EXPECT_EQ(d.out.find("train.lr: 0.01"), std::string::npos) << d.out;
  expect_all(d, {"data.train: ", "--checkpoint.accept_changes data.train"});

  EXPECT_EQ(snapshot(dir / "ck"), files) << "a refused run touched the checkpoints";
  EXPECT_EQ(slurp(dir / "m.jsonl"), metrics) << "a refused run wrote metrics";

  Outcome e = train(2, "--train.lr 0.5 --checkpoint.accept_changes train.lr");
  ASSERT_EQ(e.code, 0) << e.out;
  expect_all(e, {"resuming from " + path("ck/ckpt-000000080.h5"), "train.lr: 0.01 in the checkpoint, 0.5 now (accepted"});
}

// The same file staged elsewhere (node-local disk) is the same data; a file rewritten in place
// under the same name is not.
TEST_F(Resume, DataIsKnownByItsContentsNotItsPath) {
  const std::string constant = " --train.schedule constant";  // runs extended past their first length
  ASSERT_EQ(train(2, "--train.steps 40" + constant).code, 0);
  fs::create_directories(dir / "staged");
  fs::copy_file(dir / "train.h5", dir / "staged" / "train.h5");
  Outcome a = train(2, "--train.steps 60 --data.train " + path("staged/train.h5") + constant);
  ASSERT_EQ(a.code, 0) << a.out;
  expect_all(a, {"data.train is " + path("staged/train.h5") + " now", "the same data"});

  fs::copy_file(dir / "other.h5", dir / "staged" / "train.h5", fs::copy_options::overwrite_existing);
  Outcome b = train(2, "--train.steps 80 --data.train " + path("staged/train.h5") + constant);
  EXPECT_EQ(b.code, 2) << b.out;
  expect_all(b, {"data.train: ", "the file's contents changed"});
}

// A steps cap and more epochs end or extend the run; the cosine schedule keeps the horizon it
// started with, so the steps a resumed run takes are the uninterrupted run's, bit for bit.
TEST_F(Resume, CapAndMoreEpochsKeepTheSchedule) {
  ASSERT_EQ(train(2, "").code, 0);  // the oracle: 80 steps uninterrupted
  const auto whole = steps_in(dir / "m.jsonl");
  ASSERT_EQ(whole.size(), 8u);
  Outcome a = train(2, "--checkpoint.resume " + path("ck/ckpt-000000020.h5") + " --checkpoint.dir " + path("ck2") +
                           " --log.metrics " + path("m2.jsonl") + " --train.steps 60");
  ASSERT_EQ(a.code, 0) << a.out;
  const auto capped = steps_in(dir / "m2.jsonl");
  ASSERT_EQ(capped.size(), 4u) << a.out;  // 30, 40, 50, 60
  for (const auto& [step, v] : capped) {
    EXPECT_EQ(v.first, whole.at(step).first) << "loss at step " << step;
    EXPECT_EQ(v.second, whole.at(step).second) << "lr at step " << step;
  }

  // Past the horizon a cosine schedule to min_lr = 0 trains at lr 0: more epochs stop at start-up,
  // unless the schedule is planned again over the new length.
  const auto files = snapshot(dir / "ck");
  Outcome b = train(2, "--train.epochs 3");
  EXPECT_EQ(b.code, 2) << b.out;
  expect_all(b, {"train.epochs 2 -> 3", "past the end of its cosine schedule (step 80)",
                 "--checkpoint.accept_changes train.epochs"});
  EXPECT_EQ(snapshot(dir / "ck"), files);
  Outcome c = train(2, "--train.epochs 3 --checkpoint.accept_changes train.epochs");
  ASSERT_EQ(c.code, 0) << c.out;
  expect_all(c, {"resuming from " + path("ck/ckpt-000000080.h5"), "planned again over the new length"});
  EXPECT_GT(steps_in(dir / "m.jsonl").at(90).second, 0.0) << "the schedule planned over 120 steps";

  // With min_lr > 0 the run goes on past its horizon at min_lr.
  const std::string floor = " --train.min_lr 0.001 --checkpoint.dir " + path("ck3") + " --log.metrics " + path("m3.jsonl");
  ASSERT_EQ(train(2, floor + " --train.steps 40").code, 0);
  Outcome d = train(2, floor);
  ASSERT_EQ(d.code, 0) << d.out;
  expect_all(d, {"train.steps 40 -> 0", "keeps its horizon of 40 steps"});
  const auto extended = steps_in(dir / "m3.jsonl");
  for (long s = 50; s <= 80; s += 10) EXPECT_EQ(extended.at(s).second, 0.001) << "lr past the horizon is min_lr, step " << s;
}

// Another rank count keeps the global batch (accumulate or batch per rank adjusted); the
// resumed run's losses follow the uninterrupted 2-rank run's to reduction order.
TEST_F(Resume, AnotherRankCountKeepsTheGlobalBatch) {
  ASSERT_EQ(train(2, "--checkpoint.dir " + path("oracle") + " --log.metrics " + path("oracle.jsonl")).code, 0);
  Outcome a = train(1, "--checkpoint.resume " + path("oracle/ckpt-000000040.h5"));
  ASSERT_EQ(a.code, 0) << a.out;
  expect_all(a, {"2 rank(s) in the checkpoint, 1 now: train.accumulate 1 -> 2 keeps the global batch 50"});
  EXPECT_NE(slurp(dir / "m.jsonl").find("\"world_size\": 1, \"global_batch\": 50"), std::string::npos);
  const auto oracle = steps_in(dir / "oracle.jsonl"), resumed = steps_in(dir / "m.jsonl");
  for (long s = 50; s <= 80; s += 10) {
    EXPECT_NEAR(resumed.at(s).first, oracle.at(s).first, 1e-4 * std::fabs(oracle.at(s).first) + 1e-6) << "step " << s;
    EXPECT_EQ(resumed.at(s).second, oracle.at(s).second) << "lr at step " << s;
  }
  // 50 samples cannot be split over 3 ranks of 25 or 3 ranks of 1 micro-batch.
  Outcome b = train(3, "--train.epochs 3");
  EXPECT_EQ(b.code, 2) << b.out;
  expect_all(b, {"ranks: 1 in the checkpoint, 3 now", "global batch 50"});
}

// Ctrl-C on one process stops it at a step with a checkpoint (exit 6), the last line names the
// checkpoint, and the same command continues from it.
TEST_F(Resume, CtrlCOnOneProcessCheckpoints) {
  const std::string run = std::string(DPT_BINARY_DIR) + "/dptrain --config " + path("run.ini") +
                          " --train.epochs 100000 --checkpoint.every_steps 0 --log.every_steps 40";
  Outcome a = signal_after_first_step(run, path("one.log"), "INT");
  const std::string log = slurp(dir / "one.log");
  ASSERT_NE(a.out.find("rc=6"), std::string::npos) << a.out << log;
  const auto files = snapshot(dir / "ck");
  ASSERT_EQ(files.size(), 1u) << log;
  const std::string ckpt = path("ck/") + files.begin()->first;
  const std::string last = log.substr(log.rfind('\n', log.size() - 2) + 1);
  EXPECT_NE(last.find("its checkpoint is " + ckpt), std::string::npos) << log;
  const long step = std::stol(files.begin()->first.substr(5));
  Outcome b = sh(run + " --train.steps " + std::to_string(step + 40));
  ASSERT_EQ(b.code, 0) << b.out;
  expect_all(b, {"resuming from " + ckpt});
}

// Under mpirun, SIGUSR1 to mpirun reaches every rank (Open MPI forwards it): each checkpoints
// and exits 6, and so does mpirun. (Ctrl-C is mpirun's own abort: it stops forwarding the ranks'
// output and kills them a second later; docs/semantics.md.)
TEST_F(Resume, SigusrToMpirunCheckpointsAndExits6) {
  const std::string run = mpirun(2) + DPT_BINARY_DIR + "/dptrain --config " + path("run.ini") +
                          " --train.epochs 100000 --checkpoint.every_steps 0 --log.every_steps 40";
  Outcome a = signal_after_first_step(run, path("mp.log"), "USR1");
  const std::string log = slurp(dir / "mp.log");
  EXPECT_NE(a.out.find("rc=6"), std::string::npos) << a.out << log;
  const auto files = snapshot(dir / "ck");
  ASSERT_EQ(files.size(), 1u) << log;
  EXPECT_NE(log.find("its checkpoint is " + path("ck/") + files.begin()->first), std::string::npos) << log;
}

// An unwritable checkpoint.dir is found at start-up, before any step, on every rank.
TEST_F(Resume, UnwritableFolderStopsAtStartUp) {
  Outcome a = train(2, "--checkpoint.dir /proc/dptrain-checkpoints");
  EXPECT_EQ(a.code, 2) << a.out;
  expect_all(a, {"checkpoint.dir = '/proc/dptrain-checkpoints'", "checked at start-up"});
  EXPECT_EQ(a.out.find("\nstep "), std::string::npos) << a.out;
  Outcome b = train(2, "--checkpoint.dir " + path("run.ini"));  // a file, not a folder
  EXPECT_EQ(b.code, 2) << b.out;
  expect_all(b, {"checkpoint.dir = '" + path("run.ini") + "'"});
}

// --checkpoint names the file --eval evaluates; without --eval it is an error that says what
// each intent is spelt as, not a fresh run that ignores it.
TEST_F(Resume, CheckpointFlagWithoutEvalSaysWhatToWrite) {
  ASSERT_EQ(train(2, "--train.steps 20").code, 0);
  const auto files = snapshot(dir / "ck");
  Outcome a = train(2, "--checkpoint " + path("ck/ckpt-000000020.h5"));
  EXPECT_EQ(a.code, 2) << a.out;
  expect_all(a, {"--checkpoint.resume " + path("ck/ckpt-000000020.h5"), "--model.init ", "--eval --checkpoint "});
  EXPECT_EQ(snapshot(dir / "ck"), files);
}
