// The command line's edges as a new user meets them: no arguments, --version, stray words, a
// bad value named where it came from, --eval run from another folder or on data of another
// shape, and how many BLAS threads a CPU rank starts under the allocation it was given.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_util.hpp"
#include "dpt/cpu_threads.hpp"

namespace fs = std::filesystem;

namespace {

using cli::mpirun;
using cli::Outcome;

// Every command under a hard 60 s limit, in folder cwd.
Outcome sh(const std::string& cmd, const std::string& cwd = ".") { return cli::sh(cmd, 60, cwd); }

const std::string kBin = DPT_BINARY_DIR;

class Edges : public ::testing::Test {
 protected:
  static fs::path dir;
  static void SetUpTestSuite() {
    dir = fs::temp_directory_path() / ("dpt-edges-" + std::to_string(::getpid()));
    fs::create_directories(dir / "elsewhere");
    for (auto [name, n] : {std::pair<const char*, int>{"train.h5", 1000}, {"test.h5", 200}}) {
      Outcome r = sh(kBin + "/dpdata synth blobs --n " + std::to_string(n) +
                     " --dim 16 --classes 4 --spread 0.5 --seed 3 --out " + (dir / name).string());
      ASSERT_EQ(r.code, 0) << r.out;
    }
    Outcome r = sh(kBin + "/dpdata synth blobs --n 200 --dim 36 --classes 4 --spread 0.5 --seed 3 --out " +
                   (dir / "wide.h5").string());
    ASSERT_EQ(r.code, 0) << r.out;
    // Relative data paths, as a user's config in the folder they run from.
    std::ofstream(dir / "run.ini") << "[model]\nlayers = 16,32,4\n[data]\ntrain = train.h5\ntest = test.h5\n"
                                   << "[train]\nepochs = 1\nbatch_per_rank = 25\nsteps = 4\n"
                                   << "[checkpoint]\ndir = ck\n";
  }
  static void TearDownTestSuite() { fs::remove_all(dir); }
  static Outcome in_dir(const std::string& cmd) { return sh(cmd, dir.string()); }
};
fs::path Edges::dir;

}  // namespace

TEST_F(Edges, NoArgumentsPrintsUsage) {
  Outcome r = sh(mpirun(2) + kBin + "/dptrain");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("usage: dptrain --config FILE"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("data.train"), std::string::npos) << "not a missing-key error:\n" << r.out;
}

TEST_F(Edges, VersionOnEveryExecutable) {
  for (const char* exe : {"dptrain", "dpdata", "bench-scaling"}) {
    if (!fs::exists(kBin + "/" + exe)) continue;  // bench-scaling is built with nlohmann-json only
    Outcome r = sh(kBin + "/" + exe + " --version");
    EXPECT_EQ(r.code, 0) << exe << ": " << r.out;
    EXPECT_EQ(r.out.rfind(std::string(exe) + " ", 0), 0u) << r.out;
    EXPECT_NE(r.out.find("(git "), std::string::npos) << r.out;
  }
}

TEST_F(Edges, StrayWordsAreErrors) {
  // A forgotten --config: named, and the fix suggested.
  Outcome r = in_dir((mpirun(2) + kBin + "/dptrain run.ini"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("unexpected argument 'run.ini'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("did you mean --config run.ini?"), std::string::npos) << r.out;
  r = in_dir((mpirun(2) + kBin + "/dptrain --config run.ini stray words"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("unexpected arguments 'stray', 'words'"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "ck")) << "nothing trained";
}

TEST_F(Edges, BadValueNamesWhereItCameFrom) {
  Outcome r = in_dir((mpirun(2) + kBin + "/dptrain --config run.ini --train.lr -1"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("config error in the command line (--train.lr): train.lr = '-1'"), std::string::npos) << r.out;
  std::ofstream(dir / "badlr.ini") << "[data]\ntrain = train.h5\n[train]\nlr = -1\n";
  r = in_dir((mpirun(2) + kBin + "/dptrain --config badlr.ini"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("config error in badlr.ini: train.lr = '-1'"), std::string::npos) << r.out;
}

// --eval rebuilds the run from the checkpoint's stored configuration, whose data paths are
// relative to where training ran.
TEST_F(Edges, EvalFromAnotherFolderAndOnAnotherShape) {
  Outcome t = in_dir((mpirun(2) + kBin + "/dptrain --config run.ini --checkpoint.dir ck-eval"));
  ASSERT_EQ(t.code, 0) << t.out;
  const std::string ck = (dir / "ck-eval" / "ckpt-000000004.h5").string();
  ASSERT_TRUE(fs::exists(ck)) << t.out;
  const std::string elsewhere = (dir / "elsewhere").string();
  Outcome e = sh(mpirun(2) + kBin + "/dptrain --eval --checkpoint " + ck, elsewhere);
  EXPECT_EQ(e.code, 2) << e.out;
  for (const char* w : {"test.h5", "the checkpoint's stored configuration", "the training run's path", "--data.test FILE"})
    EXPECT_NE(e.out.find(w), std::string::npos) << "missing '" << w << "' in:\n" << e.out;
  e = sh(mpirun(2) + kBin + "/dptrain --eval --checkpoint " + ck + " --data.test " + (dir / "test.h5").string(), elsewhere);
  EXPECT_EQ(e.code, 0) << e.out;

  // A layer list planned for 1x4x4 samples, evaluated on 4x3x3 ones: the shapes are named.
  const std::string list = " --model.layers 'conv(2,3,pad=1) relu flatten linear(4)' --model.input_shape 1,4,4";
  t = in_dir((mpirun(2) + kBin + "/dptrain --config run.ini --checkpoint.dir ck-list" + list));
  ASSERT_EQ(t.code, 0) << t.out;
  e = in_dir((mpirun(2) + kBin + "/dptrain --eval --checkpoint ck-list/ckpt-000000004.h5 --data.test wide.h5 "
                                   "--model.input_shape 4,3,3"));
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("planned for samples of shape 1x4x4, but the data here has samples of shape 4x3x3"),
            std::string::npos) << e.out;
}

TEST(Threads, DecidedInTheOrderTheAllocationSays) {
  dpt::ThreadSources s;
  s.online_cpus = 64;
  s.mask_cpus = 64;
  s.sharing_mask = 4;
  EXPECT_EQ(dpt::choose_cpu_threads(s).threads, 16);  // the node's cores over its ranks
  EXPECT_EQ(dpt::choose_cpu_threads(s).source, "64 CPUs shared by 4 ranks");
  s.omp_num_threads = "6,2";
  s.openblas_num_threads = "3";
  EXPECT_EQ(dpt::choose_cpu_threads(s).threads, 6);
  EXPECT_EQ(dpt::choose_cpu_threads(s).source, "OMP_NUM_THREADS=6,2");
  s.omp_num_threads = "lots";  // not a count: the next source
  EXPECT_EQ(dpt::choose_cpu_threads(s).threads, 3);
  s.slurm_cpus_per_task = "8";
  EXPECT_EQ(dpt::choose_cpu_threads(s).threads, 8);
  EXPECT_EQ(dpt::choose_cpu_threads(s).source, "SLURM_CPUS_PER_TASK=8");
  s.mask_cpus = 16;  // a cpuset of 16 CPUs shared by the 4 ranks beats the environment
  EXPECT_EQ(dpt::choose_cpu_threads(s).threads, 4);
  EXPECT_EQ(dpt::choose_cpu_threads(s).source, "CPU affinity mask: 16 CPUs shared by 4 ranks");
  s.mask_cpus = 1, s.sharing_mask = 1;  // bound to one core
  EXPECT_EQ(dpt::choose_cpu_threads(s).threads, 1);
  EXPECT_EQ(dpt::choose_cpu_threads(s).source, "CPU affinity mask: 1 CPU");
  s.configured = 5;
  EXPECT_EQ(dpt::choose_cpu_threads(s).threads, 5);
  EXPECT_EQ(dpt::choose_cpu_threads(s).source, "device.threads");
}

// What a rank prints at start-up under taskset, mpirun -x SLURM_CPUS_PER_TASK / OMP_NUM_THREADS.
TEST_F(Edges, ThreadsFollowTheAllocation) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs 2 CPUs to narrow the mask to 1";
  const std::string run = kBin + "/dptrain --config run.ini --checkpoint.dir '' --train.steps 1 --data.test ''";
  struct Case { std::string prefix, mpi_opts, want; };
  const Case cases[] = {
      {"taskset -c 0 ", "--bind-to none", "1 BLAS thread(s) per rank (CPU affinity mask: 1 CPU)"},
      {"", "--bind-to none -x SLURM_CPUS_PER_TASK=1", "1 BLAS thread(s) per rank (SLURM_CPUS_PER_TASK=1)"},
      {"", "--bind-to none -x OMP_NUM_THREADS=1", "1 BLAS thread(s) per rank (OMP_NUM_THREADS=1)"},
      {"", "--bind-to none -x OPENBLAS_NUM_THREADS=1", "1 BLAS thread(s) per rank (OPENBLAS_NUM_THREADS=1)"},
      {"taskset -c 0 ", "--bind-to none", "3 BLAS thread(s) per rank (device.threads)"},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    const Case& c = cases[i];
    const std::string extra = i == 4 ? " --device.threads 3" : "";
    Outcome r = in_dir((c.prefix + mpirun(1, c.mpi_opts) + run + extra));
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(c.want), std::string::npos) << "missing '" << c.want << "' in:\n" << r.out;
  }
}

// A training set larger than the memory a process may take ends with a message naming the file,
// its size and what to change, exit 3, never a bare std::bad_alloc. The address-space limit
// (ulimit -v) walks up from 256 MiB in steps smaller than the file, so one of them falls where
// the libraries fit and the dataset does not, whatever this build maps (CUDA libraries or not);
// limits below that fail at once, before main.
TEST_F(Edges, OutOfHostMemoryNamesTheDataset) {
  Outcome g = sh(kBin + "/dpdata synth blobs --n 40000 --dim 2000 --classes 4 --spread 0.5 --seed 3 --out " +
                 (dir / "big.h5").string());
  ASSERT_EQ(g.code, 0) << g.out;  // 40000 x 2000 float32: 305 MiB
  std::string seen;
  for (long kib = 256 << 10; kib <= 4 << 20 && seen.empty(); kib += 128 << 10) {
    Outcome r = in_dir("bash -c 'ulimit -v " + std::to_string(kib) + "; " + kBin +
                       "/dptrain --config run.ini --data.train big.h5 --data.test \"\" --model.layers 2000,32,4 "
                       "--checkpoint.dir \"\"'");
    ASSERT_NE(r.code, 0) << "trained within " << kib << " KiB before running out at the dataset:\n" << r.out;
    if (r.out.find("out of host memory") == std::string::npos) continue;
    seen = r.out;
    EXPECT_EQ(r.code, 3) << r.out;
    for (const char* w : {"reading data.train big.h5 (40000 rows x 2000 float32 features: 0.30 GiB)", "data.read = shard"})
      EXPECT_NE(r.out.find(w), std::string::npos) << "missing '" << w << "' in:\n" << r.out;
    EXPECT_EQ(r.out.find("std::bad_alloc"), std::string::npos) << r.out;
  }
  EXPECT_FALSE(seen.empty()) << "no limit between 256 MiB and 4 GiB ran out of memory at the dataset";
  fs::remove(dir / "big.h5");
}
