// dptrain: data-parallel training of a neural network (an MLP or a layer list), one rank per
// GPU (or CPU share).
//   mpirun -np 2 ./dptrain --config inputs/run.ini [--section.key value ...]
//   mpirun -np 2 ./dptrain --eval --checkpoint runs/x/ckpt-000001000.h5 [--data.test FILE]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
// The model's input shape and classes ("C,H,W;K", for --predict) and the class names of a
// dptrain checkpoint, else "" and none.
Invocation eval_invocation(MPI_Comm c, int argc, char** argv, const Invocation& given, std::string& input_shape,
                           std::vector<std::string>& class_names) {
  const std::string ckpt = given.eval_checkpoint;
  std::string text, err, kind, shape, names;
  if (log::rank() == 0) {
    try {
      kind = weights_kind(ckpt);  // a file that holds no weights is named before the config is asked for
      if (kind == "dptrain checkpoint") {
        const Checkpoint ck = read_checkpoint(ckpt);
        text = ck.config;
        for (int v : ck.input_shape) shape += (shape.empty() ? "" : ",") + std::to_string(v);
        names = join_class_names(ck.class_names);
        // The classes the model was trained for: its class names, else its data's identity
        // ("..., 10 classes, ...").
        int classes = int(ck.class_names.size());
        const size_t at = ck.data_train.find(" classes,");
        if (classes == 0 && at != std::string::npos) {
          const size_t from = ck.data_train.rfind(' ', at - 1);
          classes = std::atoi(ck.data_train.c_str() + (from == std::string::npos ? 0 : from + 1));
        }
        if (classes > 0) shape += ";" + std::to_string(classes);
      }
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  bcast_string(c, err);
  if (!err.empty()) throw InputError(err);
  bcast_string(c, kind);
  bcast_string(c, text);
  bcast_string(c, shape);
  bcast_string(c, names);
  input_shape = shape;
  class_names = split_class_names(names);
  Invocation inv = kind == "dptrain checkpoint" ? parse_invocation(argc, argv, ckpt + " (its config)", text) : given;
  if (kind != "dptrain checkpoint") validate(inv.cfg);
  inv.cfg.init = ckpt;
  inv.cfg.init_skip.clear();
  inv.cfg.resume = "none";
  return inv;
}

// --eval's table: per class its index, rows, correct rows and accuracy, and its name when the
// test set or the checkpoint has class names. Up to 100 classes in class order (as `dpdata info`
// lists them); of more (ImageNet's 1,000), the 100 with the lowest accuracy, lowest first.
void log_class_accuracy(const EvalResult& e, const std::vector<std::string>& names) {
  constexpr int kShown = 100;
  const int classes = int(e.class_rows.size());
  const int shown = std::min(classes, kShown);
  auto accuracy = [&](int c) {  // a class without rows sorts last
    const int64_t n = e.class_rows[size_t(c)];
    return n > 0 ? double(e.class_correct[size_t(c)]) / double(n) : 2.0;
  };
  std::vector<int> order(static_cast<size_t>(classes));
  for (int c = 0; c < classes; ++c) order[size_t(c)] = c;
  char buf[512];
  if (classes > kShown) {
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return accuracy(a) < accuracy(b); });
    std::snprintf(buf, sizeof buf, "the %d of %d classes with the lowest accuracy, lowest first:", kShown, classes);
    log::info(buf);
  }
  std::snprintf(buf, sizeof buf, "%8s %12s %12s %9s%s", "class", "rows", "correct", "accuracy",
                names.empty() ? "" : "  name");
  log::info(buf);
  for (int i = 0; i < shown; ++i) {
    const int c = order[size_t(i)];
    const int64_t n = e.class_rows[size_t(c)], ok = e.class_correct[size_t(c)];
    char acc[16] = "-";
    if (n > 0) std::snprintf(acc, sizeof acc, "%.4f", accuracy(c));
    std::snprintf(buf, sizeof buf, "%8d %12lld %12lld %9s%s", c, (long long)n, (long long)ok, acc,
                  size_t(c) < names.size() ? "  " : "");
    log::info(buf + (size_t(c) < names.size() ? names[size_t(c)] : std::string()));
  }
  if (shown < classes) {
    const double next = accuracy(order[size_t(shown)]);
    if (next <= 1.0) std::snprintf(buf, sizeof buf, "  (%d more classes, each at accuracy %.4f or more)", classes - shown, next);
    else std::snprintf(buf, sizeof buf, "  (%d more classes, without rows in the test set)", classes - shown);
    log::info(buf);
  }
}

// The watchdog aborts the communicator before MPI_Abort; it must forget it before it is freed.
struct CommWatch {
  explicit CommWatch(Comm* c) { watchdog::set_comm(c); }
  ~CommWatch() { watchdog::set_comm(nullptr); }
};

// --predict: the images this rank classifies (its evaluation shard of the files), at the size
// the model's evaluation expects them stored: crop_size / eval_crop_ratio with resized crops
// (torchvision's Resize(256) + CenterCrop(224) for 224 and 0.875), else the model's input side.
struct PredictInput {
  std::vector<std::string> files, problems;  // problems: this rank's rows'
  std::vector<std::string> class_names;
  int64_t begin = 0;
};
Dataset predict_input(const Invocation& inv, const std::string& shape, const std::vector<std::string>& names, int rank,
                      int world, PredictInput& p) {
  const Config& cfg = inv.cfg;
  int c = 0, h = 0, w = 0, classes = 0;
  if (std::sscanf(shape.c_str(), "%d,%d,%d;%d", &c, &h, &w, &classes) < 3)
    throw InputError("--predict needs a dptrain checkpoint of a model for images (C,H,W input); " +
                     inv.eval_checkpoint + " records input shape '" + shape.substr(0, shape.find(';')) + "'");
  if (classes < 1)
    throw InputError("--predict: " + inv.eval_checkpoint + " records neither class names nor its training data's "
                     "classes (a checkpoint of an older version): evaluate it with --eval instead");
  const int side = cfg.crop_size > 0 ? int(std::lround(cfg.crop_size / cfg.eval_crop_ratio)) : h;
  p.files = list_image_files(inv.predict);
  p.class_names = names;
  int64_t end = 0;
  eval_shard(int64_t(p.files.size()), rank, world, p.begin, end);
  // Labels are 0 and unused; num_classes plans the model's head as the checkpoint holds it.
  return predict_images(p.files, p.begin, end, c, side, classes, p.problems);
}

// A CSV field: quoted when it holds a comma, a quote or a line break (RFC 4180).
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return q + "\"";
}

// Rank 0 writes the CSV: path, then top_k (class, probability) pairs, then why a file could not
// be read (its row has no classes then). Every rank's problems are gathered first.
void write_predictions(MPI_Comm c, const Invocation& inv, const PredictInput& p, const std::vector<Prediction>& preds) {
  std::string mine;
  for (size_t i = 0; i < p.problems.size(); ++i)
    if (!p.problems[i].empty()) mine += std::to_string(p.begin + int64_t(i)) + "\t" + p.problems[i] + "\n";
  const int rank = log::rank();
  int len = int(mine.size()), world = 0;
  MPI_Comm_size(c, &world);
  std::vector<int> lens(static_cast<size_t>(world)), at(static_cast<size_t>(world));
  DPT_CHECK_MPI(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, c));
  int total = 0;
  for (int r = 0; r < world; ++r) {
    at[size_t(r)] = total;
    total += lens[size_t(r)];
  }
  std::string all(rank == 0 ? size_t(total) : 0, '\0');
  DPT_CHECK_MPI(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), at.data(), MPI_CHAR, 0, c));
  if (rank != 0) return;
  std::vector<std::string> problem(p.files.size());
  for (size_t i = 0; i < all.size();) {
    const size_t tab = all.find('\t', i), nl = all.find('\n', i);
    problem[size_t(std::stoll(all.substr(i, tab - i)))] = all.substr(tab + 1, nl - tab - 1);
    i = nl + 1;
  }
  const std::string tmp = inv.predictions + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) throw InputError("--predictions " + inv.predictions + ": cannot write " + tmp);
  const int k = preds.empty() ? inv.top_k : int(preds.front().classes.size());
  std::string line = "path";
  for (int j = 1; j <= k; ++j) line += ",class_" + std::to_string(j) + ",probability_" + std::to_string(j);
  std::fprintf(f, "%s,problem\n", line.c_str());
  int64_t bad = 0;
  for (size_t i = 0; i < p.files.size(); ++i) {
    line = csv_field(p.files[i]);
    for (int j = 0; j < k; ++j) {
      if (!problem[i].empty()) {
        line += ",,";
        continue;
      }
      const int cls = preds[i].classes[size_t(j)];
      char prob[32];
      std::snprintf(prob, sizeof prob, "%.6g", double(preds[i].probs[size_t(j)]));
      line += "," + csv_field(size_t(cls) < p.class_names.size() ? p.class_names[size_t(cls)] : std::to_string(cls)) +
              "," + prob;
    }
    bad += !problem[i].empty();
    std::fprintf(f, "%s,%s\n", line.c_str(), csv_field(problem[i]).c_str());
  }
  const bool ok = std::fflush(f) == 0 && !std::ferror(f);
  std::fclose(f);
  if (!ok || std::rename(tmp.c_str(), inv.predictions.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw InputError("--predictions " + inv.predictions + ": cannot write it");
  }
  log::info("predicted " + std::to_string(int64_t(p.files.size()) - bad) + " of " + std::to_string(p.files.size()) +
            " images: " + inv.predictions + (bad ? " (" + std::to_string(bad) + " could not be read: see its problem column)" : "") +
            (p.class_names.empty() ? "; the checkpoint names no classes: class indices" : ""));
}

constexpr const char* kUsage =
    "usage: dptrain --config FILE [--section.key value ...]   train (mpirun -np N ./dptrain ...)\n"
    "       dptrain --eval --checkpoint FILE [--data.test FILE]\n"
    "       dptrain --eval --checkpoint WEIGHTS --config FILE   (an HDF5 /model group, .safetensors)\n"
    "       dptrain --predict IMAGE|FOLDER... --checkpoint FILE [--top-k K] [--predictions OUT.csv]\n"
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
  // --eval and --predict: the checkpoint's input shape and class names.
  std::string ckpt_shape;
  std::vector<std::string> ckpt_names;
  if (inv.eval_only && stage(world, [&] {
        if (inv.eval_checkpoint.empty()) throw InputError("--eval needs --checkpoint FILE");
        inv = eval_invocation(world, argc, argv, inv, ckpt_shape, ckpt_names);
        inv.eval_only = true;
        watchdog::set_timeout(inv.cfg.timeout_s);
      }))
    return kExitUsage;
  // --predict: the checkpoint's model and config, no data files; the images in place of a test set.
  const bool predicting = !inv.predict.empty();
  if (predicting && stage(world, [&] {
        if (inv.eval_checkpoint.empty()) throw InputError("--predict needs --checkpoint FILE (a dptrain checkpoint)");
        Invocation given = inv;
        inv = eval_invocation(world, argc, argv, inv, ckpt_shape, ckpt_names);
        inv.predict = given.predict;
        inv.top_k = given.top_k;
        inv.predictions = given.predictions;
        inv.eval_only = true;
        inv.cfg.test_file.clear();
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
        if (inv.eval_only && !predicting && cfg.test_file.empty()) throw InputError("--eval needs data.test");
        if (inv.eval_only && !predicting)
          check_same_classes("the checkpoint (" + inv.eval_checkpoint + ")", ckpt_names,
                             "data.test (" + cfg.test_file + ")", data.test.class_names);
      }))
    return rc;
  PredictInput pin;
  if (predicting && stage(world, [&] {
        watchdog::Phase phase("reading the images to predict", 0);
        data.test = predict_input(inv, ckpt_shape, ckpt_names, rt.comm->rank(), rt.comm->size(), pin);
        data.has_test = true;
      }))
    return kExitUsage;
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
    if (predicting) {
      const std::vector<Prediction> preds = trainer->predict(data.test, inv.top_k);
      write_predictions(world, inv, pin, preds);
    } else if (inv.eval_only) {
      EvalResult e = trainer->evaluate(data.test, true);
      char buf[256];
      std::snprintf(buf, sizeof buf, "eval %s: %lld samples, loss %.8g, accuracy %.4f", cfg.test_file.c_str(),
                    static_cast<long long>(e.n), e.loss, e.accuracy);
      log::info(buf);
      log_class_accuracy(e, data.test.class_names.empty() ? ckpt_names : data.test.class_names);
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
