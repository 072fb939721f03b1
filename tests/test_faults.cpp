// Faults as a user's job meets them, on real `mpirun ./dptrain` runs: a rank killed, stalled or
// failing at start-up never leaves the others waiting (every rank gone, a distinct exit code,
// within a bound); signals and kill -9 lose no work (the resumed run ends bitwise equal to the
// uninterrupted one on the CPU backend); a checkpoint resumes on 2 -> 4 -> 1 ranks; an injected
// NaN is caught after the reduction; malformed configs are rejected with exit 2. Faults come from
// the DPT_FAULT test hook (include/dpt/watchdog.hpp) or from real signals sent to real pids.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dpt/ckpt.hpp"
#include "dpt/ckpt_folder.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Outcome {
  int code = -1;
  std::string out;
  double seconds = 0;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// A job in the background: sh execs env, which execs timeout(1) (the hard bound), whose child
// is mpirun, whose children are the ranks.
class Job {
 public:
  Job(const std::string& env, const std::string& cmd, const fs::path& log, int limit_s = 90) : log_(log) {
    const std::string line = "exec env " + env + " timeout -k 5 " + std::to_string(limit_s) + " " +
                             cmd + " > " + log.string() + " 2>&1";
    t0_ = Clock::now();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Job() {
    if (pid_ > 0) wait();
  }
  Outcome wait() {
    Outcome r;
    int status = 0;
    if (pid_ > 0) ::waitpid(pid_, &status, 0);
    pid_ = -1;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.seconds = since(t0_);
    r.out = slurp(log_);
    return r;
  }
  pid_t mpirun() const { return first_child(pid_); }
  // The rank's pid, from OMPI_COMM_WORLD_RANK in its environment.
  pid_t rank_pid(int rank) const {
    for (pid_t p : children(mpirun())) {
      std::ifstream env("/proc/" + std::to_string(p) + "/environ");
      std::string var;
      while (std::getline(env, var, '\0'))
        if (var == "OMPI_COMM_WORLD_RANK=" + std::to_string(rank)) return p;
    }
    return -1;
  }
  static std::vector<pid_t> children(pid_t parent) {
    std::vector<pid_t> out;
    if (parent <= 0) return out;
    FILE* p = ::popen(("pgrep -P " + std::to_string(parent)).c_str(), "r");
    long pid = 0;
    while (p && std::fscanf(p, "%ld", &pid) == 1) out.push_back(pid_t(pid));
    if (p) ::pclose(p);
    return out;
  }
  static pid_t first_child(pid_t parent) {
    auto c = children(parent);
    return c.empty() ? -1 : c.front();
  }

 private:
  pid_t pid_ = -1;
  fs::path log_;
  Clock::time_point t0_;
};

// Foreground run under a hard limit (timeout exits 124 on a hang).
Outcome sh(const std::string& cmd, int limit_s = 60) {
  Outcome r;
  auto t0 = Clock::now();
  FILE* p = ::popen(("timeout -k 5 " + std::to_string(limit_s) + " " + cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (p && std::fgets(buf, sizeof buf, p)) r.out += buf;
  int status = p ? ::pclose(p) : -1;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = since(t0);
  return r;
}

std::string mpirun(int ranks, const std::string& args) {
  return std::string(DPT_MPIEXEC) + " -np " + std::to_string(ranks) +
         (::geteuid() == 0 ? " --allow-run-as-root" : "") + " --oversubscribe --bind-to none " +
         DPT_BINARY_DIR + "/dptrain " + args;
}

bool wait_for(const fs::path& p, double seconds) {
  const auto t0 = Clock::now();
  while (since(t0) < seconds) {
    if (fs::exists(p)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// No process of this test's runs is left (their command lines hold the test's folder).
bool none_left(const fs::path& dir) {
  for (int i = 0; i < 100; ++i) {
    if (std::system(("pgrep -f '^[^ ]*dptrain .*" + dir.string() + "' > /dev/null").c_str()) != 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// Every tensor bitwise equal, or within tol (relative to the tensor's largest magnitude).
void expect_same_params(const std::string& a, const std::string& b, double tol = 0) {
  dpt::Checkpoint x = dpt::read_checkpoint(a), y = dpt::read_checkpoint(b);
  EXPECT_EQ(x.step, y.step);
  ASSERT_EQ(x.tensors.size(), y.tensors.size());
  for (size_t i = 0; i < x.tensors.size(); ++i) {
    const auto& p = x.tensors[i];
    const auto& q = y.tensors[i];
    ASSERT_EQ(p.name, q.name);
    ASSERT_EQ(p.data.size(), q.data.size());
    if (p.name.rfind("model/", 0) != 0 && tol > 0) continue;  // Adam's state: compared when bitwise
    if (tol == 0) {
      EXPECT_EQ(std::memcmp(p.data.data(), q.data.data(), p.data.size() * sizeof(float)), 0) << p.name;
      continue;
    }
    double scale = 1e-30, diff = 0;
    for (size_t k = 0; k < p.data.size(); ++k) {
      scale = std::max(scale, double(std::fabs(p.data[k])));
      diff = std::max(diff, double(std::fabs(p.data[k] - q.data[k])));
    }
    EXPECT_LE(diff / scale, tol) << p.name;
  }
}

class Faults : public ::testing::Test {
 protected:
  static fs::path dir;
  static void SetUpTestSuite() {
    dir = fs::temp_directory_path() / ("dpt-faults-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    for (const char* name : {"train", "test"}) {
      Outcome r = sh(std::string(DPT_BINARY_DIR) + "/dpdata synth blobs --n " +
                     (name[1] == 'r' ? "2000" : "400") + " --dim 16 --classes 4 --spread 0.5 --seed 3 --out " +
                     (dir / (std::string(name) + ".h5")).string());
      ASSERT_EQ(r.code, 0) << r.out;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir); }

  // 2000 rows, global batch 40: 50 steps per epoch, 100 in all; Adam, shuffled, constant lr.
  std::string ini(const std::string& name, const std::string& extra = "") {
    fs::path p = dir / (name + ".ini");
    std::ofstream f(p);
    f << "[model]\nlayers = 16,32,4\n[data]\ntrain = " << (dir / "train.h5").string()
      << "\ntest = " << (dir / "test.h5").string() << "\n[train]\nepochs = 2\nbatch_per_rank = 20\n"
      << "optimizer = adam\nlr = 0.01\n[log]\nevery_steps = 10\nprogress = false\n" << extra;
    return p.string();
  }
  fs::path ckdir(const std::string& name) { return dir / ("ck-" + name); }
  std::string ck_args(const std::string& name) {
    return " --checkpoint.dir " + ckdir(name).string() + " --checkpoint.every_steps 5 --checkpoint.keep 0";
  }
  // The uninterrupted run every resume is compared with (once per suite).
  std::string reference() {
    const fs::path last = ckdir("ref") / "ckpt-000000100.h5";
    if (!fs::exists(last)) {
      Outcome r = sh(mpirun(2, "--config " + ini("ref") + ck_args("ref")));
      EXPECT_EQ(r.code, 0) << r.out;
    }
    return last.string();
  }
  // Slows every step by 50 ms so a signal lands mid-run; sleeping leaves the numerics alone.
  static std::string slow() { return "DPT_FAULT=rank=*,step=1,kind=delay:0.05"; }
};
fs::path Faults::dir;

}  // namespace

// ---- a rank that dies, stalls or fails never leaves the others waiting ----

TEST_F(Faults, OneRankKilledMidRunEndsTheJob) {
  Job job(slow(), mpirun(2, "--config " + ini("kill1") + ck_args("kill1")), dir / "kill1.log");
  ASSERT_TRUE(wait_for(ckdir("kill1") / "ckpt-000000010.h5", 30));
  const pid_t victim = job.rank_pid(1);
  ASSERT_GT(victim, 0);
  const auto t0 = Clock::now();
  ::kill(victim, SIGKILL);
  Outcome r = job.wait();
  const double after = since(t0);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "hung: " << r.out;
  EXPECT_LT(after, 15) << r.out;
  EXPECT_NE(r.out.find("signal 9"), std::string::npos) << r.out;
  EXPECT_TRUE(none_left(dir)) << "a rank outlived the job";
  std::printf("[ fault ] kill -9 of rank 1: mpirun exit %d, %.1f s after the kill\n", r.code, after);
}

TEST_F(Faults, OneRankSleepingInAStepTimesOutEveryRankWithExit4) {
  Job job("DPT_FAULT=rank=1,step=5,kind=sleep:60", mpirun(2, "--config " + ini("sleep") + " --comm.timeout_s 3"),
          dir / "sleep.log");
  Outcome r = job.wait();
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_LT(r.seconds, 3 + 12) << r.out;  // start-up, the deadline, the 1 s grace, slack
  // The rank that is behind names itself, and the one waiting says what it waits in.
  EXPECT_NE(r.out.find("rank 1 on"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("computing, step 5 for"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("waiting in allreduce, step 5"), std::string::npos) << r.out;
  EXPECT_TRUE(none_left(dir));
  std::printf("[ fault ] rank 1 asleep in step 5, timeout 3 s: exit %d after %.1f s\n", r.code, r.seconds);
}

TEST_F(Faults, OneRankExitingAtStartUpEndsEveryRank) {
  Outcome r = sh("env DPT_FAULT=rank=1,step=0,kind=exit:3 " + mpirun(2, "--config " + ini("exit0")));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "hung: " << r.out;
  EXPECT_LT(r.seconds, 20) << r.out;
  EXPECT_NE(r.out.find("DPT_FAULT fires at step 0"), std::string::npos) << r.out;
  EXPECT_TRUE(none_left(dir));
  std::printf("[ fault ] rank 1 _exit(3) at start-up: exit %d after %.1f s\n", r.code, r.seconds);
}

TEST_F(Faults, OneRankFailingAtStartUpIsReportedAndEveryRankExits) {
  Outcome r = sh("env DPT_FAULT=rank=1,step=0,kind=throw " + mpirun(2, "--config " + ini("throw0")));
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_LT(r.seconds, 20) << r.out;
  EXPECT_NE(r.out.find("rank 1: DPT_FAULT: injected error"), std::string::npos) << r.out;
  // A data file that only some ranks can read is the same path: every rank exits with 2.
  Outcome d = sh(mpirun(2, "--config " + ini("nodata") + " --data.train " + (dir / "missing.h5").string()));
  EXPECT_EQ(d.code, 2) << d.out;
  EXPECT_NE(d.out.find("missing.h5"), std::string::npos) << d.out;
}

TEST_F(Faults, ErrorOnOneRankMidRunAbortsEveryRank) {
  Outcome r = sh("env DPT_FAULT=rank=1,step=9,kind=throw " + mpirun(2, "--config " + ini("throw9")));
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_LT(r.seconds, 20) << r.out;
  EXPECT_NE(r.out.find("injected error on rank 1"), std::string::npos) << r.out;
}

// A checkpoint whose write fails (DPT_FAULT kind=ckpt: rank 0's write of step 10's) stops every
// rank with exit 3, naming the file: with checkpoint.background (the default) at the next
// checkpoint, step 15, and with background = false at once. Step 5's checkpoint stays the
// newest; no later one appears, and no temporary file is left.
TEST_F(Faults, FailedCheckpointWriteStopsEveryRankAndKeepsTheOneBefore) {
  for (const std::string bg : {"true", "false"}) {
    const std::string name = "ckfail-" + bg;
    Outcome r = sh("env DPT_FAULT=rank=0,step=10,kind=ckpt " +
                   mpirun(2, "--config " + ini(name) + ck_args(name) + " --checkpoint.background " + bg));
    EXPECT_EQ(r.code, 3) << r.out;
    EXPECT_LT(r.seconds, 20) << r.out;
    const std::string file = (ckdir(name) / "ckpt-000000010.h5").string();
    EXPECT_NE(r.out.find("cannot write checkpoint " + file + ": DPT_FAULT: injected failure"), std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("written while training went on; the run stops at step 15") != std::string::npos,
              bg == "true") << r.out;
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(ckdir(name))) files.push_back(e.path().filename().string());
    EXPECT_EQ(files, std::vector<std::string>{"ckpt-000000005.h5"});
    EXPECT_TRUE(none_left(dir));
    std::printf("[ fault ] checkpoint.background = %s, the write of step 10 fails: exit %d after %.1f s\n",
                bg.c_str(), r.code, r.seconds);
  }
}

// ---- no lost work ----

TEST_F(Faults, Sigusr1ToMpirunCheckpointsExits6AndResumesBitwise) {
  const std::string ref = reference();
  Job job(slow(), mpirun(2, "--config " + ini("usr1") + ck_args("usr1")), dir / "usr1.log");
  ASSERT_TRUE(wait_for(ckdir("usr1") / "ckpt-000000010.h5", 30));
  ::kill(job.mpirun(), SIGUSR1);  // Open MPI forwards SIGUSR1 to every rank
  Outcome r = job.wait();
  EXPECT_EQ(r.code, 6) << r.out;
  EXPECT_NE(r.out.find("stopped by signal after a checkpoint"), std::string::npos) << r.out;
  auto stop = dpt::list_checkpoints(ckdir("usr1").string());
  ASSERT_FALSE(stop.empty());
  const int64_t at = dpt::read_checkpoint(stop.front()).step;
  EXPECT_LT(at, 100) << "the signal came after the end";
  // The stop line names the checkpoint and how to go on.
  EXPECT_NE(r.out.find("its checkpoint is " + stop.front() + "; run the same command again"), std::string::npos)
      << r.out;
  Outcome resumed = sh(mpirun(2, "--config " + ini("usr1") + ck_args("usr1")));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resuming from"), std::string::npos) << resumed.out;
  expect_same_params(ref, (ckdir("usr1") / "ckpt-000000100.h5").string());
  std::printf("[ fault ] SIGUSR1 to mpirun: exit %d, checkpoint at step %lld, resume bitwise equal\n",
              r.code, static_cast<long long>(at));
}

TEST_F(Faults, SigtermToEveryRankCheckpointsExits6AndResumesBitwise) {
  const std::string ref = reference();
  Job job(slow(), mpirun(2, "--config " + ini("term") + ck_args("term")), dir / "term.log");
  ASSERT_TRUE(wait_for(ckdir("term") / "ckpt-000000010.h5", 30));
  // What Slurm does (scancel --signal=TERM, or the time limit): every rank gets SIGTERM.
  for (int r = 0; r < 2; ++r) ::kill(job.rank_pid(r), SIGTERM);
  Outcome r = job.wait();
  EXPECT_EQ(r.code, 6) << r.out;
  Outcome resumed = sh(mpirun(2, "--config " + ini("term") + ck_args("term")));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  expect_same_params(ref, (ckdir("term") / "ckpt-000000100.h5").string());
}

// SIGTERM to mpirun itself: Open MPI 4.1 forwards it to the ranks (which checkpoint and stop)
// but reports the job as terminated (exit 1, not 6). Nothing is lost either way.
TEST_F(Faults, SigtermToMpirunLosesNothing) {
  const std::string ref = reference();
  Job job(slow(), mpirun(2, "--config " + ini("mterm") + ck_args("mterm")), dir / "mterm.log");
  ASSERT_TRUE(wait_for(ckdir("mterm") / "ckpt-000000010.h5", 30));
  ::kill(job.mpirun(), SIGTERM);
  Outcome r = job.wait();
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << r.out;
  EXPECT_TRUE(none_left(dir));
  Outcome resumed = sh(mpirun(2, "--config " + ini("mterm") + ck_args("mterm")));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  expect_same_params(ref, (ckdir("mterm") / "ckpt-000000100.h5").string());
  std::printf("[ fault ] SIGTERM to mpirun: exit %d\n", r.code);
}

TEST_F(Faults, KillMinus9OfTheWholeJobThenResumeIsBitwiseEqual) {
  const std::string ref = reference();
  Job job(slow(), mpirun(2, "--config " + ini("kill9") + ck_args("kill9")), dir / "kill9.log");
  ASSERT_TRUE(wait_for(ckdir("kill9") / "ckpt-000000030.h5", 30));
  std::vector<pid_t> all = Job::children(job.mpirun());
  all.push_back(job.mpirun());
  for (pid_t p : all) ::kill(p, SIGKILL);  // no handler runs: whatever was mid-write stays so
  Outcome r = job.wait();
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(none_left(dir));
  Outcome resumed = sh(mpirun(2, "--config " + ini("kill9") + ck_args("kill9")));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resuming from"), std::string::npos) << resumed.out;
  expect_same_params(ref, (ckdir("kill9") / "ckpt-000000100.h5").string());
}

// The same global batch (40) on 2, then 4, then 1 rank: the same samples in the same order, but
// the gradient sums are added in another order (per-rank partial sums, then the allreduce), so
// the result agrees to float rounding, not bitwise.
TEST_F(Faults, ResumeOn2Then4Then1RanksMatchesTheUninterruptedRun) {
  const std::string ref = reference();
  const std::string cfg = "--config " + ini("241") + ck_args("241");
  Outcome a = sh(mpirun(2, cfg + " --train.steps 30"));
  ASSERT_EQ(a.code, 0) << a.out;
  Outcome b = sh(mpirun(4, cfg + " --train.batch_per_rank 10 --train.steps 60"));
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("at step 30"), std::string::npos) << b.out;
  Outcome c = sh(mpirun(1, cfg + " --train.batch_per_rank 40"));
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("at step 60"), std::string::npos) << c.out;
  expect_same_params(ref, (ckdir("241") / "ckpt-000000100.h5").string(), 1e-4);
}

// ---- non-finite values are caught after the reduction, on every rank alike ----

TEST_F(Faults, InjectedNanStopsTheRunNamingTheStep) {
  Outcome r = sh("env DPT_FAULT=rank=1,step=7,kind=nan " + mpirun(2, "--config " + ini("nan")));
  EXPECT_EQ(r.code, 5) << r.out;
  EXPECT_NE(r.out.find("non-finite gradients at step 7"), std::string::npos) << r.out;
}

TEST_F(Faults, InjectedNanIsSkippedWhenAsked) {
  Outcome r = sh("env DPT_FAULT=rank=1,step=7,kind=nan " +
                 mpirun(2, "--config " + ini("nanskip") + " --train.on_nonfinite skip --log.every_steps 100"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("1 step(s) skipped"), std::string::npos) << r.out;
}

// ---- hostile configs: exit 2 with a message, never a crash or a hang ----

TEST_F(Faults, MalformedConfigCorpusIsRejected) {
  const std::string good = slurp(ini("base"));
  struct Case { std::string name, text; };
  std::vector<Case> corpus = {
      {"empty", ""},
      {"garbage", std::string("\x01\x02\xff\xfe[[[\n===\n\x7f", 13)},
      {"nul_bytes", std::string("[train]\nlr = 0.1\0\0\0epochs = 2\n", 30)},
      {"nul_in_key", good + std::string("[train]\nl\0r = 1\n", 15)},
      {"huge_epochs", good + "[train]\nepochs = 1e30\n"},
      {"huge_int", good + "[train]\nsteps = 99999999999999999999999999\n"},
      {"negative", good + "[train]\nbatch_per_rank = -5\n"},
      {"nan_lr", good + "[train]\nlr = nan\n"},
      {"inf_timeout", good + "[comm]\ntimeout_s = inf\n"},
      {"duplicate_key", good + "[train]\nlr = 0.1\nlr = 0.2\n"},
      {"unknown_section", good + "[nonsense]\nkey = 1\n"},
      {"no_section", "lr = 0.1\n" + good},
      {"long_line", good + "[train]\noptimizer = " + std::string(1 << 20, 'a') + "\n"},
      {"long_key", good + "[train]\n" + std::string(1 << 20, 'k') + " = 1\n"},
      {"unterminated_section", good + "[train\nlr = 1\n"},
      {"layers_absurd", good + "[model]\nlayers = 16,99999999999,4\n"},
      {"layers_empty", good + "[model]\nlayers = ,,\n"},
  };
  for (const Case& c : corpus) {
    const fs::path p = dir / ("bad-" + c.name + ".ini");
    std::ofstream(p, std::ios::binary) << c.text;
    Outcome r = sh(mpirun(2, "--config " + p.string()));
    EXPECT_EQ(r.code, 2) << c.name << ":\n" << r.out;
    EXPECT_LT(r.seconds, 30) << c.name;
    EXPECT_NE(r.out.find("bad-" + c.name + ".ini"), std::string::npos) << c.name << ": no file named in\n" << r.out.substr(0, 2000);
    EXPECT_EQ(r.out.find("Segmentation"), std::string::npos) << c.name;
    EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << c.name << ":\n" << r.out.substr(0, 2000);
  }
  const fs::path d = dir / "a-directory.ini";
  fs::create_directories(d);
  Outcome r = sh(mpirun(2, "--config " + d.string()));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("is a directory"), std::string::npos) << r.out;
  Outcome z = sh(mpirun(2, "--config /dev/zero"));
  EXPECT_EQ(z.code, 2) << z.out;
  EXPECT_NE(z.out.find("larger than 16 MiB"), std::string::npos) << z.out;
}
