// dptrain: data-parallel training of a neural network (an MLP or a layer list), one rank per
// GPU (or CPU share).
//   mpirun -np 2 ./dptrain --config inputs/run.ini [--section.key value ...]
//   mpirun -np 2 ./dptrain --eval --checkpoint runs/x/ckpt-000001000.h5 [--data.test FILE]
#include <algorithm>
#include <cstdio>
#include <memory>

#include "dpt/app.hpp"
#include "dpt/check.hpp"
#include "dpt/ckpt.hpp"
#include "dpt/data.hpp"
#include "dpt/log.hpp"
#include "dpt/resume.hpp"
#include "dpt/timing.hpp"
#include "dpt/train.hpp"
#include "dpt/version.hpp"
#include "dpt/watchdog.hpp"
#include "dpt/weights.hpp"

using namespace dpt;

namespace {

// --eval: a dptrain checkpoint's own configuration is the base, the command line overrides it;
// other weights (an HDF5 /model group, a .safetensors file) take the command line's (--config,
// keys), which must then say what model they are.
Invocation eval_invocation(MPI_Comm c, int argc, char** argv, const Invocation& given) {
  const std::string ckpt = given.eval_checkpoint;
  std::string text, err, kind;
  if (log::rank() == 0) {
    try {
      kind = weights_kind(ckpt);  // a file that holds no weights is named before the config is asked for
      if (kind == "dptrain checkpoint") text = read_checkpoint(ckpt).config;
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  bcast_string(c, err);
  if (!err.empty()) throw InputError(err);
  bcast_string(c, kind);
  bcast_string(c, text);
  Invocation inv = kind == "dptrain checkpoint" ? parse_invocation(argc, argv, ckpt + " (its config)", text) : given;
  if (kind != "dptrain checkpoint") validate(inv.cfg);
  inv.cfg.init = ckpt;
  inv.cfg.init_skip.clear();
  inv.cfg.resume = "none";
  return inv;
}

// The watchdog aborts the communicator before MPI_Abort; it must forget it before it is freed.
struct CommWatch {
  explicit CommWatch(Comm* c) { watchdog::set_comm(c); }
  ~CommWatch() { watchdog::set_comm(nullptr); }
};

constexpr const char* kUsage =
    "usage: dptrain --config FILE [--section.key value ...]   train (mpirun -np N ./dptrain ...)\n"
    "       dptrain --eval --checkpoint FILE [--data.test FILE]\n"
    "       dptrain --eval --checkpoint WEIGHTS --config FILE   (an HDF5 /model group, .safetensors)\n"
    "       dptrain --help | --version";

void print_summary(const TrainResult& r, const Config& cfg) {
  const long long first = r.first_step, last = r.steps;
  if (r.already_complete) {
    log::info("already complete at step " + std::to_string(last) + " (train.epochs = " +
              std::to_string(cfg.epochs) + (cfg.steps ? ", train.steps = " + std::to_string(cfg.steps) : "") +
              "): nothing to train; evaluate it with --eval --checkpoint " + r.checkpoint +
              ", or train further with a larger train.epochs / train.steps");
    return;
  }
  char buf[512];
  const std::string steps = first == 0 ? std::to_string(last) + " steps"
                                       : "steps " + std::to_string(first) + " -> " + std::to_string(last) +
                                             " (" + std::to_string(last - first) + " in this run)";
  std::snprintf(buf, sizeof buf, "done: %s in %.2f s, %.0f samples/s%s", steps.c_str(), r.seconds,
                r.samples_per_s, r.stopped_by_signal ? " (stopped by signal after a checkpoint)" : "");
  log::info(buf);
  // The last evaluation, then (after a signal) the checkpoint: the last line says where the run is.
  if (r.last_eval.n && r.last_eval_step == last) {
    std::snprintf(buf, sizeof buf, "final test accuracy %.4f, loss %.4f", r.last_eval.accuracy, r.last_eval.loss);
    log::info(buf);
  } else if (r.last_eval.n) {
    std::snprintf(buf, sizeof buf, "last evaluation at step %lld (not of the final model): test accuracy %.4f, loss %.4f",
                  static_cast<long long>(r.last_eval_step), r.last_eval.accuracy, r.last_eval.loss);
    log::info(buf);
  }
  if (r.stopped_by_signal)
    log::info(r.checkpoint.empty()
                  ? "stopped by signal at step " + std::to_string(last) +
                        " with no checkpoint.dir: nothing was saved"
                  : "stopped by signal at step " + std::to_string(last) + ": its checkpoint is " +
                        r.checkpoint + "; run the same command again to resume from it (checkpoint.resume = auto)");
}

// The end of a run that worked: what holds device memory goes with the process (DPT_FAST_EXIT),
// then MPI. The datasets are host memory, and a shard reader may still have a thread to join:
// freed here.
void shut_down(MpiSession& mpi, Runtime& rt, std::unique_ptr<Trainer>& trainer, RunData& data,
               bool print_timing) {
  const double t0 = timing::now();
  leave_to_exit(trainer);
  trainer.reset();
  data = RunData();
  watchdog::set_comm(nullptr);  // before the communicator goes
  rt.comm.reset();
  leave_to_exit(rt.backend);
  rt.backend.reset();
  mpi.finalize();
  timing::report_exit(print_timing, timing::now() - t0);
}

}  // namespace

int main(int argc, char** argv) {
  timing::start();
  EarlyDriverInit driver;  // the CUDA driver starts while MPI does
  MpiSession mpi(argc, argv);
  // First thing after MPI: a signal during start-up is remembered, never fatal; the loop then
  // stops at its first step with a checkpoint (exit 6).
  install_stop_signals();
  const MPI_Comm world = MPI_COMM_WORLD;
  if (argc <= 1) {  // every rank sees the same argv: all return together
    if (mpi.rank() == 0) std::fprintf(stderr, "%s\n", kUsage);
    return kExitUsage;
  }
  watchdog::start(Config{}.timeout_s);  // every blocking phase from here on has a deadline
  Invocation inv;
  if (int rc = stage(world, [&] {
        timing::Scope timed(timing::Phase::config);
        fault::init(mpi.rank());
        inv = read_invocation(world, argc, argv);
        watchdog::set_timeout(inv.cfg.timeout_s);
        fault::in_step(0);  // test hook: a rank that fails at start-up
      }))
    return rc;
  if (inv.help) {
    log::info(inv.help_text);
    return 0;
  }
  if (inv.version) {
    log::info(version_line("dptrain"));
    return 0;
  }
  if (inv.eval_only && stage(world, [&] {
        if (inv.eval_checkpoint.empty()) throw InputError("--eval needs --checkpoint FILE");
        inv = eval_invocation(world, argc, argv, inv);
        inv.eval_only = true;
        watchdog::set_timeout(inv.cfg.timeout_s);
      }))
    return kExitUsage;
  // A training run's checkpoint to continue, judged before any data is read: another run's
  // checkpoint stops every rank here (exit 2), and the global batch's split is decided before
  // the shard reader plans its rows.
  if (!inv.eval_only) {
    if (int rc = stage(world, [&] {
          timing::Scope timed(timing::Phase::config);
          watchdog::Phase phase("judging the checkpoint to resume", 0);
          if (!inv.eval_checkpoint.empty())
            throw InputError("--checkpoint " + inv.eval_checkpoint + " is the checkpoint --eval evaluates, and --eval "
                             "is not given. To continue training it: --checkpoint.resume " + inv.eval_checkpoint +
                             "; to start a new run from its weights: --model.init " + inv.eval_checkpoint +
                             "; to evaluate it: --eval --checkpoint " + inv.eval_checkpoint);
          plan_resume(inv.cfg, world);
        }))
      return rc;
  }
  const Config& cfg = inv.cfg;
  // data.read = all: every rank loads both files whole. shard: a rank reads only the training
  // rows its batches use (epoch by epoch) and only its evaluation rows of the test set. Read on
  // a thread while the device, its handles and the transport start.
  DataLoader loader(cfg, world, !inv.eval_only);
  Runtime rt;
  if (int rc = stage(world, [&] {
        timing::Scope timed(timing::Phase::backend);
        driver.join();
        make_backend_for(cfg, world, rt);
      }))
    return rc;
  driver.check(rt.node.local_rank);
  if (int rc = stage(world, [&] {
        timing::Scope timed(timing::Phase::comm);
        make_comm_for(cfg, world, rt);
      }))
    return rc;
  CommWatch watch(rt.comm.get());
  print_banner(cfg, rt, world);
  RunData data;
  if (int rc = stage(world, [&] {
        watchdog::Phase phase("loading the datasets", 0);
        try {
          data = loader.get();
        } catch (const InputError& e) {
          const auto& cli = cfg.cli_keys;
          if (!inv.eval_only || std::find(cli.begin(), cli.end(), "data.test") != cli.end()) throw;
          throw InputError(std::string(e.what()) + "\n  data.test = '" + cfg.test_file +
                           "' comes from the checkpoint's stored configuration: it is the training "
                           "run's path, relative to the folder that run started in. Run from that "
                           "folder, or name the test set: --data.test FILE");
        }
        if (inv.eval_only && cfg.test_file.empty()) throw InputError("--eval needs data.test");
      }))
    return rc;
  if (data.rows && data.rows->file_rows() > 0)
    log::info("data.read = shard: each rank reads " + std::to_string(data.rows->rows_per_epoch()) +
              " of the " + std::to_string(data.rows->file_rows()) + " rows of " + cfg.train_file +
              " per epoch" + (cfg.shuffle ? " (the next epoch's while one trains)" : " (once: shuffle = false)"));
  std::unique_ptr<Trainer> trainer;
  if (int rc = stage(world, [&] {
        timing::Scope timed(timing::Phase::model);
        watchdog::Phase phase("setting up the model", 0);
        trainer = make_trainer(cfg, *rt.backend, *rt.comm, data);
      }))
    return rc;
  int rc = kExitOk;
  try {
    if (inv.eval_only) {
      EvalResult e = trainer->evaluate(data.test);
      char buf[256];
      std::snprintf(buf, sizeof buf, "eval %s: %lld samples, loss %.8g, accuracy %.4f", cfg.test_file.c_str(),
                    static_cast<long long>(e.n), e.loss, e.accuracy);
      log::info(buf);
    } else {
      const double t0 = timing::now();
      TrainResult r = trainer->run();
      timing::add(timing::Phase::first_rows, r.first_rows_s);
      timing::add(timing::Phase::loop, r.seconds);
      timing::add(timing::Phase::around, timing::now() - t0 - r.seconds - r.first_rows_s);
      print_summary(r, cfg);
      rc = r.stopped_by_signal ? kExitSignal : kExitOk;
    }
    timing::report(world, cfg.timing);
  } catch (const std::exception& e) {
    return fail_run(e, world);
  }
  shut_down(mpi, rt, trainer, data, cfg.timing);
  end_process(rc);
  return rc;
}
