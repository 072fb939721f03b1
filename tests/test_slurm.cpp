// The batch scripts in jobs/ against a real single-node Slurm (munged, slurmctld and slurmd of
// Debian's packages, started by tests/slurm/cluster.sh in a temporary folder on free ports):
// jobs are submitted with sbatch as a user would, on the CPU backend with small synthetic data.
// Oracles: the metrics file for accuracy, job.log and `scontrol show job` for what happened, and an
// uninterrupted job for the signalled-and-requeued one (final checkpoints equal bit for bit).
// Skips, saying why, where Slurm or munge is missing or cannot start (not root).
#include <gtest/gtest.h>
#include <unistd.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "dpt/ckpt.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kSrc = DPT_SOURCE_DIR;
const std::string kBin = DPT_BINARY_DIR;

struct Outcome {
  int code = -1;
  std::string out;
};

// A shell command with a hard limit (timeout(1) exits 124 when it runs over).
Outcome sh(const std::string& cmd, int limit_s = 60) {
  Outcome r;
  FILE* p = popen(("timeout -k 5 " + std::to_string(limit_s) + " bash -c '" + cmd + "' 2>&1").c_str(), "r");
  char buf[4096];
  while (p && fgets(buf, sizeof buf, p)) r.out += buf;
  int status = p ? pclose(p) : -1;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// `scontrol show job -o` field, e.g. field(info, "JobState").
std::string field(const std::string& info, const std::string& key) {
  auto p = info.find(" " + key + "=");
  if (p == std::string::npos) p = info.find(key + "=");
  if (p == std::string::npos) return "";
  p = info.find('=', p) + 1;
  return info.substr(p, info.find_first_of(" \n", p) - p);
}

class Slurm : public ::testing::Test {
 protected:
  static fs::path dir;          // everything: the cluster, data, configs, run folders
  static std::string skip_why;  // set when this machine cannot run Slurm

  static void SetUpTestSuite() {
    dir = fs::temp_directory_path() / ("dpt-slurm-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    // The cluster lives in dir too; its watcher (last argument: our pid) tears it down and
    // removes dir even if we are killed.
    Outcome r = sh(kSrc + "/tests/slurm/cluster.sh up " + dir.string() + " " +
                   std::to_string(::getpid()), 90);
    if (r.code != 0) {
      skip_why = (r.code == 77 ? "" : "a local Slurm could not start: ") + r.out;
      return;
    }
    ::setenv("SLURM_CONF", (dir / "slurm.conf").c_str(), 1);
    for (const char* set : {"train --n 8000", "test --n 1000"}) {
      std::string s(set), name = s.substr(0, s.find(' '));
      Outcome d = sh(kBin + "/dpdata synth blobs " + s.substr(s.find(' ') + 1) +
                     " --dim 32 --classes 4 --spread 0.5 --seed 3 --out " + (dir / (name + ".h5")).string());
      ASSERT_EQ(d.code, 0) << d.out;
    }
  }

  static void TearDownTestSuite() {
    if (dir.empty()) return;
    sh(kSrc + "/tests/slurm/cluster.sh down " + dir.string(), 60);
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  void SetUp() override {
    if (!skip_why.empty()) GTEST_SKIP() << skip_why;
  }

  // A small config: 8000 rows / (25 × 2 ranks) = 160 steps per epoch.
  std::string ini(const std::string& name, const std::string& model, int epochs) {
    fs::path p = dir / (name + ".ini");
    std::ofstream(p) << "[model]\nlayers = " << model << "\n[data]\ntrain = " << (dir / "train.h5").string()
                     << "\ntest = " << (dir / "test.h5").string() << "\n[train]\nepochs = " << epochs
                     << "\nbatch_per_rank = 25\noptimizer = adam\nlr = 0.002\n[checkpoint]\nevery_steps = 40\n"
                     << "keep = 2\n[log]\nevery_steps = 40\n";
    return p.string();
  }

  // sbatch SCRIPT with the environment given; returns the job id. The run folder is dir/<run>.
  std::string submit(const std::string& script, const std::string& run, const std::string& env,
                     const std::string& args, const std::string& sbatch_opts = "") {
    fs::path out = dir / (run + ".out");
    Outcome r = sh("cd " + kSrc + " && env DPT_HOME=" + kSrc + " DPT_BIN=" + kBin + " DPT_RUN_DIR=" +
                   (dir / run).string() + " " + env + " sbatch --parsable -o " + out.string() + " " +
                   sbatch_opts + " " + script + " " + args);
    EXPECT_EQ(r.code, 0) << r.out;
    std::string id = r.out.substr(0, r.out.find_first_of(";\n"));
    EXPECT_FALSE(id.empty()) << r.out;
    return id;
  }

  static std::string job_info(const std::string& id) { return sh("scontrol show job -o " + id, 20).out; }

  // Waits (bounded) for the job to end, after `restarts` requeues; returns `scontrol show job`.
  std::string wait_done(const std::string& id, int restarts = 0, int limit_s = 150) {
    const auto end = Clock::now() + std::chrono::seconds(limit_s);
    std::string info;
    if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos) {
      ADD_FAILURE() << "no job id: " << id;
      return info;
    }
    while (Clock::now() < end) {
      info = job_info(id);
      const std::string state = field(info, "JobState");
      const bool final = state == "COMPLETED" || state == "FAILED" || state == "CANCELLED" ||
                         state == "TIMEOUT" || state == "NODE_FAIL" || state == "OUT_OF_MEMORY";
      if (final && std::atoi(field(info, "Restarts").c_str()) >= restarts) return info;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    sh("scancel " + id, 20);
    ADD_FAILURE() << "job " << id << " did not end within " << limit_s << " s: " << info;
    return info;
  }

  std::string output(const std::string& run) { return slurp(dir / (run + ".out")); }

  // Accuracy of the last evaluation in the metrics file (-1 when there is none).
  double last_accuracy(const std::string& run) {
    std::ifstream m(dir / run / "metrics.jsonl");
    std::string line, last;
    while (std::getline(m, line))
      if (contains(line, "\"eval\": \"test\"")) last = line;
    auto p = last.find("\"accuracy\": ");
    return p == std::string::npos ? -1 : std::stod(last.substr(p + 12));
  }
};
fs::path Slurm::dir;
std::string Slurm::skip_why;

}  // namespace

TEST_F(Slurm, TrainJobWithSrunFinishesAndLearns) {
  std::string id = submit("jobs/train.sbatch", "srun", "", ini("srun", "32,64,4", 2));
  std::string info = wait_done(id);
  std::string out = output("srun");
  EXPECT_EQ(field(info, "JobState"), "COMPLETED") << info << out;
  EXPECT_EQ(field(info, "ExitCode"), "0:0") << out;
  EXPECT_TRUE(contains(out, "dptrain: 2 rank(s), backend cpu")) << out;
  EXPECT_TRUE(contains(out, "launcher srun")) << out;
  EXPECT_GT(last_accuracy("srun"), 0.95) << slurp(dir / "srun" / "metrics.jsonl");
  EXPECT_TRUE(fs::exists(dir / "srun" / "checkpoints" / "ckpt-000000320.h5"));
  EXPECT_TRUE(fs::exists(dir / "srun" / "config.ini"));
  EXPECT_TRUE(contains(slurp(dir / "srun" / "job.log"), "end rc=0 action=none"));
}

TEST_F(Slurm, TrainJobWithMpirunAndStagedDataFinishesAndLearns) {
  std::string stage = (dir / "node-local").string();
  std::string id = submit("jobs/train.sbatch", "mpirun", "DPT_LAUNCHER=mpirun DPT_STAGE=1 DPT_STAGE_DIR=" + stage,
                          ini("mpirun", "32,64,4", 2) + " --train.lr 0.003");
  std::string info = wait_done(id);
  std::string out = output("mpirun");
  EXPECT_EQ(field(info, "JobState"), "COMPLETED") << info << out;
  // The ranks read the node-local copies (the resolved configuration says so), which are
  // removed when the job ends.
  EXPECT_TRUE(contains(out, "train = " + stage + "/train-train.h5")) << out;
  EXPECT_TRUE(contains(out, "test = " + stage + "/test-test.h5")) << out;
  EXPECT_TRUE(contains(out, "lr = 0.003")) << out;
  // Staging turns on data.read = shard: each of the 2 ranks reads only its rows of the copy.
  EXPECT_TRUE(contains(out, "read = shard")) << out;
  EXPECT_TRUE(contains(out, "data.read = shard: each rank reads")) << out;
  EXPECT_FALSE(fs::exists(stage)) << "staged data left behind";
  EXPECT_GT(last_accuracy("mpirun"), 0.95) << slurp(dir / "mpirun" / "metrics.jsonl");
}

TEST_F(Slurm, ScalingJobLeavesAReport) {
  // bench/scaling.ini's sweep cut down to seconds: a tiny model on the blobs, no LR grid.
  const std::string small = "bench/scaling.ini --grid.enabled false --model.layers 32,64,4 --scaling.models tiny:32,64,4"
                            " --scaling.warmup_steps 2 --scaling.timed_steps 10 --scaling.repeats 1"
                            " --allreduce.max_bytes 65536 --allreduce.iters 3 --allreduce.repeats 1"
                            " --buckets.sizes_mb 0.01 --data.train " + (dir / "train.h5").string() +
                            " --data.test " + (dir / "test.h5").string();
  std::string id = submit("jobs/scaling.sbatch", "scaling", "", small);
  std::string info = wait_done(id, 0, 120);
  std::string out = output("scaling");
  if (contains(out, "not implemented")) GTEST_SKIP() << "bench-scaling: not implemented yet:\n" << out;
  EXPECT_EQ(field(info, "JobState"), "COMPLETED") << info << out;
  // The report is whatever bench-scaling writes into --out (today report.md, records.json, ...).
  int files = 0;
  for (auto& e : fs::directory_iterator(dir / "scaling"))
    files += e.is_regular_file() && e.path().filename() != "job.log" && fs::file_size(e.path()) > 0;
  EXPECT_GT(files, 0) << "no report in " << (dir / "scaling") << "\n" << out;
  EXPECT_TRUE(contains(out, "wrote " + (dir / "scaling").string())) << out;
}

// SIGUSR1 to the batch shell, as Slurm sends it for --signal=B:USR1@<s> (scancel --batch does the
// same on demand): the script forwards it through the launcher (srun, or mpirun), the ranks stop at
// one step with a checkpoint, the job requeues itself, resumes, and ends with exactly the
// parameters and optimizer state of an uninterrupted job.
TEST_F(Slurm, SignalledJobCheckpointsRequeuesAndResumesBitwise) {
  // 480 steps of a 32-512-512-4 MLP: a few seconds, long enough to be signalled mid-run.
  std::string cfg = ini("resume", "32,512,512,4", 3);
  std::string ref = submit("jobs/train.sbatch", "reference", "", cfg);
  std::string ref_info = wait_done(ref);
  ASSERT_EQ(field(ref_info, "JobState"), "COMPLETED") << output("reference");
  const dpt::Checkpoint a = dpt::read_checkpoint((dir / "reference" / "checkpoints" / "ckpt-000000480.h5").string());

  for (const std::string launcher : {"srun", "mpirun"}) {
    SCOPED_TRACE("launcher " + launcher);
    const std::string run = "signalled-" + launcher;
    std::string id = submit("jobs/train.sbatch", run, "DPT_LAUNCHER=" + launcher, cfg);
    // Signal once the job has written its first checkpoint.
    const auto end = Clock::now() + std::chrono::seconds(60);
    while (!fs::exists(dir / run / "checkpoints" / "ckpt-000000040.h5") && Clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    Outcome s = sh("scancel --signal=USR1 --batch " + id);
    ASSERT_EQ(s.code, 0) << s.out;
    std::string info = wait_done(id, 1, 120);
    std::string out = output(run), log = slurp(dir / run / "job.log");
    EXPECT_EQ(field(info, "JobState"), "COMPLETED") << info << out;
    EXPECT_EQ(field(info, "Restarts"), "1") << info;
    EXPECT_TRUE(contains(log, "restart=0 signal USR1")) << log;
    EXPECT_TRUE(contains(log, "restart=0 end rc=6 action=requeue")) << log;
    EXPECT_TRUE(contains(log, "restart=1 end rc=0 action=none")) << log;
    EXPECT_TRUE(contains(out, "stopped by signal after a checkpoint")) << out;
    auto p = out.find("resuming from " + (dir / run / "checkpoints").string());
    ASSERT_NE(p, std::string::npos) << out;
    EXPECT_FALSE(contains(out.substr(p, out.find('\n', p) - p), "at step 480")) << "not stopped mid-run:\n" << out;

    const dpt::Checkpoint b = dpt::read_checkpoint((dir / run / "checkpoints" / "ckpt-000000480.h5").string());
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    int model = 0;
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      ASSERT_EQ(a.tensors[i].name, b.tensors[i].name);
      ASSERT_EQ(a.tensors[i].data.size(), b.tensors[i].data.size()) << a.tensors[i].name;
      model += a.tensors[i].name.rfind("model/", 0) == 0;
      EXPECT_EQ(0, std::memcmp(a.tensors[i].data.data(), b.tensors[i].data.data(),
                               a.tensors[i].data.size() * sizeof(float)))
          << a.tensors[i].name << " differs from the uninterrupted run";
    }
    EXPECT_EQ(model, 6);  // 3 Linear layers × (weight, bias)
    EXPECT_EQ(a.samples_seen, b.samples_seen);
  }
}

// MPS with a stand-in control program (no GPU here): the daemon runs before the ranks, they run
// with comm.backend = mpi, and it is stopped afterwards, also when dptrain fails.
TEST_F(Slurm, MpsJobStartsAndStopsItsDaemonEvenWhenTheJobFails) {
  for (bool fail : {false, true}) {
    SCOPED_TRACE(fail ? "failing job" : "good job");
    const std::string run = fail ? "mps-fail" : "mps";
    fs::path events = dir / (run + ".events");
    std::string env = "DPT_MPS_CONTROL=" + kSrc + "/tests/slurm/fake-mps-control FAKE_MPS_EVENTS=" + events.string() +
                      " DPT_MPS_DIR=" + (dir / (run + "-mpsdir")).string();
    std::string id = submit("jobs/mps.sbatch", run, env,
                            ini(run, "32,64,4", 1) + (fail ? " --train.optimizer bogus" : ""),
                            "--ntasks-per-node=2");
    std::string info = wait_done(id);
    std::string out = output(run), ev = slurp(events);
    EXPECT_EQ(field(info, "JobState"), fail ? "FAILED" : "COMPLETED") << info << out;
    if (fail) EXPECT_EQ(field(info, "ExitCode"), "2:0") << out;
    // Order: daemon ready, ranks (with the MPI transport), ranks done, daemon asked to quit, gone.
    auto ready = out.find("MPS control daemon running"), ranks = out.find("dptrain exited with code"),
         stopped = out.find("MPS control daemon stopped");
    ASSERT_NE(ready, std::string::npos) << out;
    ASSERT_NE(ranks, std::string::npos) << out;
    ASSERT_NE(stopped, std::string::npos) << out;
    EXPECT_LT(ready, ranks) << out;
    EXPECT_LT(ranks, stopped) << out;
    if (!fail) EXPECT_TRUE(contains(out, "transport mpi")) << out;
    if (!fail) EXPECT_TRUE(contains(out, "backend = mpi")) << out;
    EXPECT_TRUE(contains(ev, "start pipe=" + (dir / (run + "-mpsdir") / "pipe").string())) << ev;
    EXPECT_TRUE(contains(ev, "\nquit ")) << ev;
    EXPECT_TRUE(contains(ev, "\nstop ")) << ev;
    EXPECT_FALSE(contains(ev, "killed")) << "the daemon had to be killed: " << ev;
    EXPECT_FALSE(fs::exists(dir / (run + "-mpsdir"))) << "MPS pipe folder left behind";
    const fs::path logs = dir / run / "mps-log";
    ASSERT_TRUE(fs::exists(logs)) << out;
    int hosts = 0;
    for (auto& host : fs::directory_iterator(logs)) {
      ++hosts;
      EXPECT_TRUE(contains(slurp(host.path() / "control.log"), "control daemon started")) << host.path();
    }
    EXPECT_EQ(hosts, 1);
  }
}

// SIGUSR1 while the job is still setting up (here: a slow MPS daemon), before dptrain runs: the
// batch shell survives it, cleans up, and requeues; the requeued job trains to the end.
TEST_F(Slurm, SignalBeforeTheRanksStartRequeuesTheJob) {
  fs::path events = dir / "early.events";
  std::string env = "DPT_MPS_CONTROL=" + kSrc + "/tests/slurm/fake-mps-control FAKE_MPS_DELAY_S=4 FAKE_MPS_EVENTS=" +
                    events.string();
  std::string id = submit("jobs/mps.sbatch", "early", env, ini("early", "32,64,4", 1), "--ntasks-per-node=2");
  const auto end = Clock::now() + std::chrono::seconds(60);
  while (!contains(slurp(events), "start ") && Clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Outcome s = sh("scancel --signal=USR1 --batch " + id);
  ASSERT_EQ(s.code, 0) << s.out;
  std::string info = wait_done(id, 1, 120);
  std::string out = output("early"), log = slurp(dir / "early" / "job.log");
  EXPECT_EQ(field(info, "JobState"), "COMPLETED") << info << out;
  EXPECT_TRUE(contains(log, "restart=0 signal USR1")) << log;
  EXPECT_TRUE(contains(log, "restart=0 end rc=6 action=requeue")) << log;
  EXPECT_TRUE(contains(log, "restart=1 end rc=0 action=none")) << log;
  EXPECT_FALSE(contains(out, "resuming from")) << "the first run should not have trained:\n" << out;
  EXPECT_GT(last_accuracy("early"), 0.95) << out;
  // Two daemons started and both stopped.
  std::string ev = slurp(events);
  size_t starts = 0, stops = 0;
  for (size_t p = 0; (p = ev.find("start ", p)) != std::string::npos; ++p) ++starts;
  for (size_t p = 0; (p = ev.find("\nstop ", p)) != std::string::npos; ++p) ++stops;
  EXPECT_EQ(starts, 2u) << ev;
  EXPECT_EQ(stops, 2u) << ev;
}
