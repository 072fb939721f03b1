// bench-scaling as a user runs it, end to end on tiny settings: `mpirun -np 2 ./bench-scaling`
// with a config and overrides, and `./bench-scaling` alone (singleton MPI, one rank), each
// writing the table to stdout and the report folder; the variants of the gradient path, the
// reduce-scatter and all-gather sweeps and the PyTorch DDP peer (torchrun over gloo, where
// /usr/bin/python3 imports torch) on CPU ranks, with MLPs and layer lists; a bad key or variant
// is rejected with its name.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli_util.hpp"

namespace fs = std::filesystem;

namespace {

using cli::mpirun;
using cli::Outcome;

// Every command under a hard 240 s limit.
Outcome sh(const std::string& cmd) { return cli::sh(cmd, 240); }

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

  // bench-scaling on tiny.ini with these arguments, on `ranks` processes under mpirun (0: alone).
  static Outcome sweep(const std::string& args, int ranks = 2) {
    return sh((ranks ? mpirun(ranks) : std::string()) + DPT_BINARY_DIR + "/bench-scaling --config " +
              (dir / "tiny.ini").string() + " " + args);
  }

  // The PyTorch DDP peer always run, by /usr/bin/python3, with `steps` timed steps in each of
  // `repeats` windows after one warm-up step. Debian's torch 1.13 under Python 3.11 fails on
  // torchrun's default --redirects 0; 2 (stderr to files, teed) works there and on current torch.
  static std::string peer_args(int steps, int repeats) {
    return std::string(" --ddp.run always --ddp.python /usr/bin/python3 --ddp.script ") + DPT_SOURCE_DIR +
           "/bench/torch_ddp.py --ddp.torchrun_args '--standalone --redirects 2 --tee 2' --ddp.warmup 1 --ddp.steps " +
           std::to_string(steps) + " --ddp.repeats " + std::to_string(repeats);
  }

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
  Outcome r = sweep("--out " + out.string() + " --grid.epochs 1");
  expect_report(r, out, 4, 2);  // n = 1, 2 × weak, strong; a check run on 1 and 2 ranks
  EXPECT_TRUE(fs::exists(out / "busbw-vs-size.svg"));
  EXPECT_NE(r.out.find("#wrong"), std::string::npos);
}

TEST_F(BenchCli, AloneItIsOneRank) {
  const fs::path out = dir / "one";
  Outcome r = sweep("--out " + out.string(), 0);
  expect_report(r, out, 2, 1);  // n = 1 × weak, strong
  EXPECT_NE(r.out.find("one rank: no allreduce"), std::string::npos) << r.out;
}

// A grid alone (report.sections) with LARS and LAMB beside the base optimizer: 3 optimizers ×
// 1 rule × 1 warm-up × 2 batches.
TEST_F(BenchCli, GridAloneWithLarsAndLamb) {
  const fs::path out = dir / "grid";
  Outcome r = sweep("--out " + out.string() + " --report.sections grid --grid.optimizers 'sgd:0.1 lars:2 lamb:0.01' --grid.lr_rules sqrt"
                    " --grid.warmup on --grid.global_batches 16,32");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("# Weak and strong scaling"), std::string::npos) << r.out;
  const std::string cmd = "python3 -c \"import json,sys; d=json.load(open('" + (out / "records.json").string() +
                          "')); t=d['tables']; v=set(r['variant'] for r in t['grid']['rows']); sys.exit(0 if "
                          "'scaling' not in t and len(t['grid']['rows']) == 6 and v == {'sgd:0.1 sqrt +warm-up', "
                          "'lars:2 sqrt +warm-up', 'lamb:0.01 sqrt +warm-up'} else 1)\"";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << slurp(out / "records.json");
}

TEST_F(BenchCli, VariantsCollectivesAndThePyTorchPeerOnCpuRanks) {
  const bool torch = std::system("/usr/bin/python3 -c 'import torch, torch.distributed' >/dev/null 2>&1") == 0;
  const fs::path out = dir / "peer";
  Outcome r = sweep("--out " + out.string() + " --grid.enabled false --scaling.variants 'unsharded-fp32 sharded-bf16'" +
                    peer_args(3, 2) + " --ddp.buckets_mb 1,25");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* title : {"# Reduce-scatter alone", "# All-gather alone", "# PyTorch DDP beside dptrain"})
    EXPECT_NE(r.out.find(title), std::string::npos) << title << "\n" << r.out;
  // The records, counted by python's json module.
  const std::string count = std::string(
      "import json,sys; t=json.load(open(sys.argv[1]))['tables']; sc=t['scaling']['rows']; p=t['ddp_peer']['rows']; "
      "print('scaling', len(sc), ','.join(sorted({r['variant'] for r in sc})), "
      "'collectives', len(t['reduce_scatter']['rows']), len(t['all_gather']['rows']), "
      "sum(r['wrong'] for c in ('allreduce','reduce_scatter','all_gather') for r in t[c]['rows']), "
      "'peer', len(p), sum(1 for r in p if (r['peer_step_ms'] or 0) > 0 and "
      "((r['ratio'] or 0) > 0) == ((r['ours_step_ms'] or 0) > 0)), "
      "sum(1 for r in p if r['strongest'] == '*'), 'ratios', sum(1 for r in p if (r['ratio'] or 0) > 0))");
  const Outcome c = sh("/usr/bin/python3 -c \"" + count + "\" " + (out / "records.json").string());
  ASSERT_EQ(c.code, 0) << c.out;
  // n = 1, 2 × weak, strong × 2 variants; 64, 512, 4096 B on 2 ranks, every result exact.
  EXPECT_NE(c.out.find("scaling 8 sharded-bf16,unsharded-fp32 collectives 3 3 0"), std::string::npos) << c.out;
  if (!torch) {
    EXPECT_NE(r.out.find("cannot import torch"), std::string::npos) << r.out;
    GTEST_SKIP() << "/usr/bin/python3 has no torch: the peer's rows were not checked";
  }
  // weak: 1 process (eager, compiled step) and 2 (buckets 1 and 25 MB, compiled step); strong:
  // 1 process at the global batch, and the 2-process run again (same batch per rank). The
  // six eager rows are timed, each with a ratio exactly where dptrain's own step is there: at
  // this size (microseconds a step, 3 timed) a row of dptrain's can be unresolved, the
  // difference of two short runs lost in noise (weak n = 1 on the CI machine, 2026-12-02), and
  // then no ratio is stated. One strongest per mode and n.
  EXPECT_NE(c.out.find("peer 10 6 4"), std::string::npos) << c.out << r.out;
  EXPECT_EQ(c.out.find("ratios 0\n"), std::string::npos) << "no peer row has a ratio: " << c.out << r.out;
  EXPECT_TRUE(fs::exists(out / "ddp-peer" / "small-n2-b8.log"));
}

// Layer lists beside dptrain's rows: a CNN the peer builds (torch_cnn.build, --input C,H,W, the
// list one argument) and one with batch norm it cannot, named once and not launched again.
TEST_F(BenchCli, ThePyTorchPeerBuildsLayerLists) {
  if (std::system("/usr/bin/python3 -c 'import torch, torch.distributed' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 has no torch";
  const fs::path out = dir / "peer-lists";
  Outcome r = sweep("--out " + out.string() + " --report.sections scaling --report.plots false --scaling.models "
                    "'cnn@1,8,8:conv(4,3,pad=1) relu maxpool(2) flatten linear(4); bnnet@1,8,8:conv(4,3,pad=1) bn relu "
                    "flatten linear(4)'" + peer_args(2, 1) + " --ddp.buckets_mb 25 --ddp.compile none"
                    // dptrain's tiny steps (~0.02 ms) need more than tiny.ini's 3 timed steps to
                    // resolve on a busy machine: with 3, one came out negative ("unresolved") and
                    // its row had no ratio.
                    " --scaling.timed_steps 40 --scaling.repeats 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("builds MLPs only"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PyTorch DDP peer, bnnet on 1: torch_cnn.build cannot build"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(not run again)"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(out / "ddp-peer" / "bnnet-n1-b8.log"));
  EXPECT_FALSE(fs::exists(out / "ddp-peer" / "bnnet-n2-b8.log"));
  EXPECT_NE(slurp(out / "ddp-peer" / "cnn-n2-b8.log")
                .find("--layers 'conv(4,3,stride=1,pad=1) relu maxpool(2,stride=2) flatten linear(4)' --input 1,8,8 "),
            std::string::npos);
  // cnn: weak on 1 and 2 processes, strong on 1 (its own batch) and 2 (the weak run again), every
  // row timed and set beside dptrain's; bnnet: none.
  const Outcome c = sh("/usr/bin/python3 -c \"import json,sys; p=json.load(open(sys.argv[1]))['tables']['ddp_peer']['rows']; "
                       "print('peer', len(p), sum(1 for r in p if r['model'] == 'cnn' and (r['peer_step_ms'] or 0) > 0 "
                       "and (r['ratio'] or 0) > 0))\" " + (out / "records.json").string());
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("peer 4 4"), std::string::npos) << c.out << r.out;
}

// The DDP peer for a preset: torchvision's resnet18 (the small stem) under DDP on 1 and 2
// processes, each row timed and set beside dptrain's.
TEST_F(BenchCli, ThePyTorchPeerRunsPresets) {
  if (std::system("/usr/bin/python3 -c 'import torch, torch.distributed, torchvision' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 has no torch or torchvision";
  const fs::path out = dir / "peer-preset";
  Outcome r = sweep("--out " + out.string() + " --report.sections scaling --report.plots false --scaling.models "
                    "'rn@1,8,8:resnet18(stem=small,classes=4)'" + peer_args(2, 1) +
                    " --ddp.buckets_mb 25 --ddp.compile none");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("torch_cnn.build cannot build"), std::string::npos) << r.out;
  EXPECT_NE(slurp(out / "ddp-peer" / "rn-n2-b8.log").find("--layers 'resnet18(stem=small,classes=4)' --input 1,8,8 "),
            std::string::npos);
  const Outcome c = sh("/usr/bin/python3 -c \"import json,sys; p=json.load(open(sys.argv[1]))['tables']['ddp_peer']['rows']; "
                       "print('peer', len(p), sum(1 for r in p if (r['peer_step_ms'] or 0) > 0 and (r['ratio'] or 0) > 0))\" " +
                       (out / "records.json").string());
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("peer 4 4"), std::string::npos) << c.out << r.out;
}

// A model's own batches (/W,S in scaling.models): its weak rows at W per rank, its strong rows
// splitting S; the other model keeps the [scaling] batches (8 per rank, 16 global).
TEST_F(BenchCli, AModelsOwnBatches) {
  const fs::path out = dir / "own-batches";
  Outcome r = sweep("--out " + out.string() + " --report.sections scaling --report.plots false --scaling.variants unsharded-fp32"
                    " --scaling.models 'small:16,32,4 mine/4,12:16,32,4'");
  ASSERT_EQ(r.code, 0) << r.out;
  const Outcome c = sh("/usr/bin/python3 -c \"import json,sys; t=json.load(open(sys.argv[1]))['tables']['scaling']['rows']; "
                       "print(' '.join(sorted('%s-%s-n%d-b%d' % (r['model'], r['mode'], r['ranks'], r['batch_per_rank']) "
                       "for r in t))); print(sorted({(int(r['warmup_steps']), int(r['timed_steps']), r['probe_ms']) for r in t}))\" " +
                       (out / "records.json").string());
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("mine-strong-n1-b12 mine-strong-n2-b6 mine-weak-n1-b4 mine-weak-n2-b4 "
                       "small-strong-n1-b16 small-strong-n2-b8 small-weak-n1-b8 small-weak-n2-b8"),
            std::string::npos)
      << c.out << r.out;
  // tiny.ini's 2 + 3 steps are under the time budget's floors: every row takes them, unprobed.
  EXPECT_NE(c.out.find("[(2, 3, None)]"), std::string::npos) << c.out;
}

TEST_F(BenchCli, UnknownSweepKeyIsNamed) {
  Outcome r = sweep("--scaling.repeets 3");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("scaling.repeets"), std::string::npos) << r.out;
  r = sweep("--scaling.variants 'sharded-fp32 zero3-bf16'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("scaling.variants = 'zero3-bf16' (command line)"), std::string::npos) << r.out;
  // The time budget's keys: seconds at least 0 (0 is off), a floor of at least one step.
  r = sweep("--scaling.timed_seconds -1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("scaling.timed_seconds = '-1' (command line): expected seconds ≥ 0 (0 turns the budget off)"),
            std::string::npos) << r.out;
  r = sweep("--scaling.warmup_seconds 1s");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("scaling.warmup_seconds = '1s' (command line): expected seconds ≥ 0"), std::string::npos) << r.out;
  r = sweep("--scaling.min_timed_steps 0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("scaling.min_timed_steps = '0' (command line): expected an integer ≥ 1"), std::string::npos) << r.out;
}

// A stray word is refused on every rank (exit 2) by name; one that names a file gets the
// --config hint. Nothing runs, nothing is written.
TEST_F(BenchCli, StrayPositionalArgumentIsNamed) {
  const std::string ini = (dir / "tiny.ini").string();
  Outcome r = sh(mpirun(2) + DPT_BINARY_DIR + "/bench-scaling " + ini);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("unexpected argument '" + ini + "'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--config " + ini), std::string::npos) << r.out;
  r = sweep("--out " + (dir / "stray").string() + " stray");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("unexpected argument 'stray'"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("--config stray"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "stray"));
}

// Without --out the report goes to ./scaling-report in the current directory, never into the
// repository's bench/results; each model's table is printed once, not per measurement.
TEST_F(BenchCli, DefaultReportFolderIsInTheCurrentDirectory) {
  const fs::path cwd = dir / "cwd", results = fs::path(DPT_SOURCE_DIR) / "bench" / "results";
  fs::create_directories(cwd);
  auto listing = [&] {
    std::string names;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(results, ec)) names += e.path().filename().string() + "\n";
    return names;
  };
  const std::string before = listing();
  Outcome r = sh("sh -c 'cd " + cwd.string() + " && " + DPT_BINARY_DIR + "/bench-scaling --config " +
                 (dir / "tiny.ini").string() + " --report.sections scaling,buckets --report.plots false'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("report to scaling-report"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(cwd / "scaling-report" / "report.md")) << r.out;
  EXPECT_TRUE(fs::exists(cwd / "scaling-report" / "records.json")) << r.out;
  EXPECT_FALSE(fs::exists(cwd / "scaling-report" / ".report.md.cut"));
  EXPECT_EQ(listing(), before) << "bench-scaling wrote into " << results;
  size_t tables = 0;
  for (size_t at = r.out.find("total parameters"); at != std::string::npos; at = r.out.find("total parameters", at + 1)) ++tables;
  EXPECT_EQ(tables, 1u) << r.out;  // one model; the scaling and bucket rows build dozens of Trainers
  EXPECT_EQ(slurp(cwd / "scaling-report" / "report.md").find("Incomplete"), std::string::npos);
}

// SIGTERM (a time limit, mpirun passing on Ctrl-C) during the grid: the report holds the
// sections finished before it and says the run was cut short there.
TEST_F(BenchCli, CutShortKeepsTheFinishedSections) {
  const fs::path out = dir / "cut", script = dir / "cut.sh";
  std::ofstream(script) << mpirun(2) << DPT_BINARY_DIR << "/bench-scaling --config " << (dir / "tiny.ini").string()
                        << " --out " << out.string() << " --grid.epochs 100000 --grid.check false &\n"
                        << "pid=$!\n"
                        << "for i in $(seq 1800); do grep -q 'grid section started' " << (out / "report.md").string()
                        << " 2>/dev/null && break; sleep 0.1; done\n"
                        << "sleep 1; kill -TERM $pid; wait $pid; echo \"exit $?\"\n";
  Outcome r = sh("bash " + script.string());
  EXPECT_EQ(r.out.find("exit 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cut short during the grid section"), std::string::npos) << r.out;
  const std::string md = slurp(out / "report.md");
  EXPECT_NE(md.find("**Incomplete**: cut short by a signal"), std::string::npos) << md;
  EXPECT_NE(md.find("during the grid section"), std::string::npos) << md;
  EXPECT_NE(md.find("(scaling, allreduce, buckets)"), std::string::npos) << md;
  EXPECT_NE(md.find("## Weak and strong scaling"), std::string::npos) << md;
  EXPECT_NE(md.find("## Gradient bucket size sweep"), std::string::npos) << md;
  EXPECT_EQ(md.find("## Batch size x optimizer"), std::string::npos) << md;
  const std::string cmd = "python3 -c \"import json,sys; d=json.load(open('" + (out / "records.json").string() +
                          "')); t=d['tables']; sys.exit(0 if d['status'].startswith('cut short') and len(t['scaling']['rows']) == 4"
                          " and 'grid' not in t and 'buckets' in t else 1)\"";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << slurp(out / "records.json");
  EXPECT_FALSE(fs::exists(out / ".report.md.cut"));
}

// bench-step --account on the CPU: a row for every op that runs (a small residual network's
// convolutions, batch norms, residual ops, pooling, linear, and the step's other parts), times
// that add up to the step (one timed step: each row's median is its time), a floor below it from the ceilings measured in the run, and the peak
// memory; a bad --account value is named.
TEST(BenchStep, AccountOfTheStepOnTheCpu) {
  const std::string list =
      "conv(8,3,pad=1,bias=false) bn relu res(conv(8,3,pad=1,bias=false) bn relu conv(8,3,pad=1,bias=false) bn) relu "
      "avgpool(global) flatten linear(10)";
  const Outcome r = sh(mpirun(1) + DPT_BINARY_DIR + "/bench/bench-step --layers \"" + list +
                       "\" --input 1,8,8 --batch 16 --warmup 2 --steps 3 --repeat 1 --account true "
                       "--account-warmup 1 --account-steps 1");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* row : {"conv0 ", "bn1 ", "conv2 ", "block@3 add", "block@3 join", "avgpool@", "fc0 ", "data ",
                          "loss ", "optimizer* ", "by kind", "ceilings: GEMM "})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  double eager = 0, parts = 0, graph = 0, floor = 0;
  const size_t at = r.out.find("\nstep: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at,
                        "\nstep: %lf ms enqueued op by op (the sum of its parts' medians %lf ms), %lf ms as the product runs it "
                        "(bench-step's median above); the sum of the floors %lf ms",
                        &eager, &parts, &graph, &floor),
            4)
      << r.out.substr(at, 400);
  EXPECT_NEAR(parts, eager, 2e-3 + 1e-3 * eager);  // rounded to 1 us per row
  EXPECT_GT(floor, 0);
  EXPECT_LT(floor, eager);
  EXPECT_GT(graph, 0);
  const size_t mem = r.out.find("\"peak_mib\": ");
  ASSERT_NE(mem, std::string::npos) << r.out;
  EXPECT_GT(std::stod(r.out.substr(mem + 12)), 0);
  const Outcome bad = sh(mpirun(1) + DPT_BINARY_DIR + "/bench/bench-step --layers 16,4 --account maybe");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("--account maybe: true or false"), std::string::npos) << bad.out;
}
