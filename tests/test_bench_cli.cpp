// bench-scaling as a user runs it, end to end on tiny settings: `mpirun -np 2 ./bench-scaling`
// with a config and overrides, and `./bench-scaling` alone (singleton MPI, one rank), each
// writing the table to stdout and the report folder; a bad key is rejected with its name.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

struct Outcome {
  int code = -1;
  std::string out;
};

Outcome sh(const std::string& cmd) {
  Outcome r;
  FILE* p = popen(("timeout -k 5 240 " + cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (p && fgets(buf, sizeof buf, p)) r.out += buf;
  const int status = p ? pclose(p) : -1;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string mpirun(int ranks) {
  return std::string(DPT_MPIEXEC) + " -np " + std::to_string(ranks) + (::geteuid() == 0 ? " --allow-run-as-root" : "") +
         " --oversubscribe --bind-to none ";
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

class BenchCli : public ::testing::Test {
 protected:
  static fs::path dir;
  static void SetUpTestSuite() {
    dir = fs::temp_directory_path() / ("dpt-bench-cli-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    for (auto [name, n] : {std::pair{"train.h5", 2000}, std::pair{"test.h5", 400}}) {
      Outcome r = sh(std::string(DPT_BINARY_DIR) + "/dpdata synth blobs --n " + std::to_string(n) +
                     " --dim 16 --classes 4 --spread 0.5 --seed 3 --out " + (dir / name).string());
      ASSERT_EQ(r.code, 0) << r.out;
    }
    std::ofstream f(dir / "tiny.ini");
    f << "[model]\nlayers = 16,32,4\n[data]\ntrain = " << (dir / "train.h5").string() << "\ntest = "
      << (dir / "test.h5").string() << "\n[train]\noptimizer = sgd\nlr = 0.1\nbase_batch = 16\n[device]\nthreads = 1\n"
      << "[scaling]\nmodels = small:16,32,4\nweak_batch_per_rank = 8\nstrong_global_batch = 16\nwarmup_steps = 2\n"
      << "timed_steps = 3\nrepeats = 1\ndata_iters = 2\n[allreduce]\nmin_bytes = 64\nmax_bytes = 4096\nfactor = 8\n"
      << "iters = 2\nrepeats = 1\n[buckets]\nsizes_mb = 0.0001,1\n[grid]\nglobal_batches = 16,32,64\nlr_rules = none,linear\n"
      << "warmup = off\nepochs = 1\ntarget_accuracy = 0.5\nevals_per_run = 3\n[predict]\nmax_ranks = 8\n";
  }
  static void TearDownTestSuite() { fs::remove_all(dir); }

  // The report folder holds every file, the JSON parses with the grid's time-to-target tables
  // (one check run per subset: `ranks` of them), the plots are drawn where matplotlib is, and
  // the stdout table has a units row.
  void expect_report(const Outcome& r, const fs::path& out, int scaling_rows, int ranks) {
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("# Weak and strong scaling"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("(samples/s)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("# Time to the target accuracy on N ranks"), std::string::npos) << r.out;
    for (const char* f : {"report.md", "records.csv", "records.json"}) EXPECT_TRUE(fs::exists(out / f)) << f << "\n" << r.out;
    const std::string cmd = "python3 -c \"import json,sys; d=json.load(open('" + (out / "records.json").string() +
                            "')); t=d['tables']; sys.exit(0 if len(t['scaling']['rows']) == " + std::to_string(scaling_rows) +
                            " and len(t['grid']['rows']) == 6 and len(t['critical']['rows']) == 2 and len(t['tta']['rows']) > 0"
                            " and len(t['check']['rows']) == " + std::to_string(ranks) +
                            " and all(c['measured_s'] is not None for c in t['check']['rows']) else 1)\"";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << slurp(out / "records.json");
    const std::string md = slurp(out / "report.md");
    EXPECT_NE(md.find("## Machine"), std::string::npos);
    EXPECT_NE(md.find("no GPU"), std::string::npos);
    const bool matplotlib = std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") == 0 ||
                            std::system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") == 0;
    for (const char* f : {"efficiency-vs-ranks.svg", "accuracy-vs-batch.svg", "throughput-vs-batch.svg",
                          "epochs-to-target-vs-batch.svg", "time-to-target-vs-ranks.svg", "tta-speedup-vs-ranks.svg"}) {
      EXPECT_NE(md.find(std::string("](") + f + ")"), std::string::npos) << f;
      if (matplotlib) EXPECT_TRUE(fs::exists(out / f)) << f << "\n" << r.out;
    }
    if (!matplotlib) EXPECT_NE(md.find("plots not drawn"), std::string::npos);
  }
};
fs::path BenchCli::dir;

}  // namespace

TEST_F(BenchCli, TwoRanksMeasureEverySubsetAndWriteTheReport) {
  const fs::path out = dir / "two";
  Outcome r = sh(mpirun(2) + DPT_BINARY_DIR + "/bench-scaling --config " + (dir / "tiny.ini").string() + " --out " +
                 out.string() + " --grid.epochs 1");
  expect_report(r, out, 4, 2);  // n = 1, 2 × weak, strong; a check run on 1 and 2 ranks
  EXPECT_TRUE(fs::exists(out / "busbw-vs-size.svg"));
  EXPECT_NE(r.out.find("#wrong"), std::string::npos);
}

TEST_F(BenchCli, AloneItIsOneRank) {
  const fs::path out = dir / "one";
  Outcome r = sh(std::string(DPT_BINARY_DIR) + "/bench-scaling --config " + (dir / "tiny.ini").string() + " --out " + out.string());
  expect_report(r, out, 2, 1);  // n = 1 × weak, strong
  EXPECT_NE(r.out.find("one rank: no allreduce"), std::string::npos) << r.out;
}

// A grid alone (report.sections) with LARS and LAMB beside the base optimizer: 3 optimizers ×
// 1 rule × 1 warm-up × 2 batches.
TEST_F(BenchCli, GridAloneWithLarsAndLamb) {
  const fs::path out = dir / "grid";
  Outcome r = sh(mpirun(2) + DPT_BINARY_DIR + "/bench-scaling --config " + (dir / "tiny.ini").string() + " --out " +
                 out.string() + " --report.sections grid --grid.optimizers 'sgd:0.1 lars:2 lamb:0.01' --grid.lr_rules sqrt"
                 " --grid.warmup on --grid.global_batches 16,32");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("# Weak and strong scaling"), std::string::npos) << r.out;
  const std::string cmd = "python3 -c \"import json,sys; d=json.load(open('" + (out / "records.json").string() +
                          "')); t=d['tables']; v=set(r['variant'] for r in t['grid']['rows']); sys.exit(0 if "
                          "'scaling' not in t and len(t['grid']['rows']) == 6 and v == {'sgd:0.1 sqrt +warm-up', "
                          "'lars:2 sqrt +warm-up', 'lamb:0.01 sqrt +warm-up'} else 1)\"";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << slurp(out / "records.json");
}

TEST_F(BenchCli, UnknownSweepKeyIsNamed) {
  Outcome r = sh(mpirun(2) + DPT_BINARY_DIR + "/bench-scaling --config " + (dir / "tiny.ini").string() +
                 " --scaling.repeets 3");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("scaling.repeets"), std::string::npos) << r.out;
}
