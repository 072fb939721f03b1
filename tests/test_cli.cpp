// dptrain as a user runs it: `mpirun -np 2 ./dptrain ...` on bad input must print a clear
// message naming what is wrong and exit non-zero within seconds, with no hang and no crash;
// a good run trains, evaluates, checkpoints, and `--eval` reads its checkpoint back.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_util.hpp"

namespace fs = std::filesystem;

namespace {

using cli::Outcome;

// Every command under a hard 60 s limit.
Outcome sh(const std::string& cmd) { return cli::sh(cmd, 60); }

std::string dptrain(int ranks, const std::string& args) {
  return cli::mpirun(ranks) + DPT_BINARY_DIR + "/dptrain " + args;
}

class Cli : public ::testing::Test {
 protected:
  static fs::path dir;
  static void SetUpTestSuite() {
    dir = fs::temp_directory_path() / ("dpt-cli-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    Outcome r = sh(std::string(DPT_BINARY_DIR) + "/dpdata synth blobs --n 2000 --dim 16 --classes 4 --spread 0.5 --seed 3 --out " + (dir / "train.h5").string());
    ASSERT_EQ(r.code, 0) << r.out;
    r = sh(std::string(DPT_BINARY_DIR) + "/dpdata synth blobs --n 400 --dim 16 --classes 4 --spread 0.5 --seed 3 --out " + (dir / "test.h5").string());
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() { fs::remove_all(dir); }

  std::string ini(const std::string& extra, const std::string& name = "run.ini") {
    std::ofstream f(dir / name);
    f << "[model]\nlayers = 16,32,4\n[data]\ntrain = " << (dir / "train.h5").string()
      << "\ntest = " << (dir / "test.h5").string() << "\n[train]\nepochs = 2\nbatch_per_rank = 25\n"
      << "optimizer = adam\nlr = 0.01\n[log]\nevery_steps = 10\n" << extra;
    return (dir / name).string();
  }

  // Bad input: non-zero on every rank within seconds, and the message names the problem.
  void expect_rejected(const std::string& args, const std::vector<std::string>& words) {
    Outcome r = sh(dptrain(2, args));
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.code, 124) << "hung: " << r.out;
    EXPECT_LT(r.seconds, 30) << r.out;
    for (auto& w : words) EXPECT_NE(r.out.find(w), std::string::npos) << "missing '" << w << "' in:\n" << r.out;
    EXPECT_EQ(r.out.find("Segmentation"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("HDF5-DIAG"), std::string::npos) << "raw HDF5 dump:\n" << r.out;
  }

  // A dataset written with the raw HDF5 API, labels as given (stored as label_type), each
  // sample of the shape given (16 values by default).
  std::string bad_labels_file(const std::vector<int32_t>& labels, int classes, const std::string& name = "bad_labels.h5",
                              hid_t label_type = H5T_STD_I32LE, std::vector<hsize_t> sample = {16}) {
    std::string path = (dir / name).string();
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    std::vector<hsize_t> fd{labels.size()};
    fd.insert(fd.end(), sample.begin(), sample.end());
    hsize_t ld[1] = {labels.size()}, per = 1;
    for (hsize_t v : sample) per *= v;
    std::vector<float> x(labels.size() * per, 0.5f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(labels[i / per]) + 0.01f * float(i % 7);
    hid_t s = H5Screate_simple(int(fd.size()), fd.data(), nullptr);
    hid_t d = H5Dcreate2(f, "features", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data());
    H5Dclose(d), H5Sclose(s);
    s = H5Screate_simple(1, ld, nullptr);
    d = H5Dcreate2(f, "labels", label_type, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data());
    H5Dclose(d), H5Sclose(s);
    s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, "num_classes", H5T_STD_I32LE, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT32, &classes);
    H5Aclose(a), H5Sclose(s), H5Fclose(f);
    return path;
  }
};
fs::path Cli::dir;

}  // namespace

TEST_F(Cli, TrainsEvaluatesCheckpointsAndEvalReadsItBack) {
  std::string cfg = ini("[checkpoint]\ndir = " + (dir / "ck").string() + "\n[log]\nmetrics = " + (dir / "m.jsonl").string() + "\n", "good.ini");
  Outcome r = sh(dptrain(2, "--config " + cfg + " --log.every_steps 20"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resolved configuration"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("final test accuracy"), std::string::npos) << r.out;
  std::ifstream m(dir / "m.jsonl");
  std::string line, last;
  int steps = 0, evals = 0;
  while (std::getline(m, line)) {
    if (line.find("\"eval\": \"test\"") != std::string::npos) ++evals, last = line;
    else if (line.find("\"samples_per_s\"") != std::string::npos) ++steps;
  }
  EXPECT_EQ(evals, 2);  // once per epoch
  EXPECT_GE(steps, 4);
  // The blobs are well separated: a working trainer gets nearly all of them.
  auto pos = last.find("\"accuracy\": ");
  ASSERT_NE(pos, std::string::npos);
  EXPECT_GT(std::stod(last.substr(pos + 12)), 0.9) << last;
  // 2000 rows / (25 × 2) = 40 steps per epoch: the final checkpoint is step 80.
  fs::path ck = dir / "ck" / "ckpt-000000080.h5";
  ASSERT_TRUE(fs::exists(ck)) << r.out;
  Outcome e = sh(dptrain(2, "--eval --checkpoint " + ck.string()));
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("accuracy"), std::string::npos) << e.out;
  EXPECT_EQ(r.out.find("timing (log.timing)"), std::string::npos) << "log.timing is off by default";
}

// log.timing = true: the phase table accounts for the run. Its serial rows (each the slowest
// rank's) cover the time from process start to the report, the loop holds its parts, the work
// that happened shows up (evaluations, periodic and final checkpoints), and the whole fits in the
// wall time mpirun took.
TEST_F(Cli, TimingReportAccountsForTheRun) {
  std::string cfg = ini("[checkpoint]\ndir = " + (dir / "ck-timing").string() + "\nevery_steps = 30\n", "timing.ini");
  // A wider model and the training set as test set: evaluations take milliseconds, enough for
  // the table's resolution.
  Outcome r = sh(dptrain(2, "--config " + cfg + " --log.timing true --model.layers 16,512,512,4 --data.test " +
                                (dir / "train.h5").string()));
  ASSERT_EQ(r.code, 0) << r.out;
  auto value = [&](const std::string& row) {
    const size_t at = r.out.find("\n  " + row + " ");
    if (at == std::string::npos) return -1.0;
    return std::stod(r.out.substr(r.out.find_first_not_of(' ', at + 3 + row.size())));
  };
  auto seconds_after = [&](const std::string& words) {
    const size_t at = r.out.find(words);
    return at == std::string::npos ? -1.0 : std::stod(r.out.substr(at + words.size()));
  };
  const char* serial[] = {"process start to main", "MPI_Init", "configuration", "backend", "transport",
                          "datasets (wait)", "model", "training loop", "around the loop", "other"};
  double sum = 0;
  for (const char* row : serial) {
    const double v = value(row);
    EXPECT_GE(v, 0) << "row '" << row << "' missing or negative in:\n" << r.out;
    sum += v;
  }
  const double total = value("process start to here");
  ASSERT_GT(total, 0) << r.out;
  EXPECT_GE(sum, total - 0.01) << r.out;  // each row is a maximum over ranks: the sum covers any rank's total
  const double loop = value("training loop");
  const double first = seconds_after("first two steps "), evals = seconds_after("evaluations ");
  const double ckpts = seconds_after("periodic checkpoints "), final_ckpt = seconds_after("final checkpoint ");
  EXPECT_GT(evals, 0) << r.out;       // one per epoch
  EXPECT_GT(ckpts, 0) << r.out;       // steps 30 and 60
  EXPECT_GT(final_ckpt, 0) << r.out;  // step 80
  EXPECT_GE(first, 0) << r.out;
  EXPECT_LE(first + evals + ckpts, loop + 0.003) << r.out;
  const double to_end = seconds_after("process start to the end of main ");
  EXPECT_GE(to_end, total) << r.out;
  EXPECT_LE(to_end, r.seconds) << r.out;
}

TEST_F(Cli, MissingConfigFile) { expect_rejected("--config /nonexistent/run.ini", {"/nonexistent/run.ini"}); }

TEST_F(Cli, UnknownKey) {
  expect_rejected("--config " + ini("[train]\nlearning_rate = 3\n", "u.ini"), {"learning_rate", "u.ini"});
}

TEST_F(Cli, MalformedValue) {
  expect_rejected("--config " + ini("", "m.ini") + " --train.batch_per_rank lots", {"batch_per_rank", "lots"});
}

TEST_F(Cli, GarbageIni) {
  std::string p = (dir / "garbage.ini").string();
  std::ofstream(p) << "\x01\x02 this is not [an ini\n===\n";
  expect_rejected("--config " + p, {"garbage.ini"});
}

TEST_F(Cli, MissingDataFile) {
  expect_rejected("--config " + ini("", "d.ini") + " --data.train /nonexistent/train.h5", {"/nonexistent/train.h5"});
}

// The MLP shorthand gives the input width first: widths that do not start with the data's width
// (only the hidden and output widths given, or widths for other data) are refused with the list
// to give; an output narrower than the classes likewise.
TEST_F(Cli, DatasetWidthDoesNotMatchModel) {
  const std::string train = (dir / "train.h5").string();
  expect_rejected("--config " + ini("", "w.ini") + " --model.layers 20,8,4",
                  {"model.layers = 20,8,4 starts with input width 20, but data.train (" + train +
                       ") has 16 features per row: give model.layers = 16,20,8,4", "or 16,8,4 if 20"});
  expect_rejected("--config " + ini("", "w.ini") + " --model.layers 32,3",
                  {"give model.layers = 16,32,4 (the first width is the input width), or 16,4 if 32"});
  expect_rejected("--config " + ini("", "w.ini") + " --model.layers 16,32,3",
                  {"model.layers = 16,32,3 ends with 3 outputs, but data.train (" + train +
                       ") has 4 classes: give model.layers = 16,32,4"});
}

TEST_F(Cli, LabelsOutOfRange) {
  std::vector<int32_t> labels(100, 1);
  labels[37] = 9;
  std::string f = bad_labels_file(labels, 4);
  expect_rejected("--config " + ini("", "l.ini") + " --data.train " + f, {"bad_labels.h5", "label"});
}

TEST_F(Cli, NotAnHdf5File) {
  std::string p = (dir / "text.h5").string();
  std::ofstream(p) << "just text";
  expect_rejected("--config " + ini("", "t.ini") + " --data.test " + p, {"text.h5"});
}

TEST_F(Cli, EvalOfAForeignFile) {
  expect_rejected("--eval --checkpoint " + (dir / "train.h5").string(), {"train.h5", "format"});
}

TEST_F(Cli, TooFewRowsForOneGlobalBatch) {
  expect_rejected("--config " + ini("", "b.ini") + " --train.batch_per_rank 5000", {"global batch"});
}

TEST_F(Cli, HelpListsEveryKey) {
  Outcome r = sh(dptrain(1, "--help"));
  EXPECT_EQ(r.code, 0) << r.out;
  for (const char* k : {"--model.layers", "--train.accumulate", "--comm.bucket_mb", "--checkpoint.resume", "--log.metrics"})
    EXPECT_NE(r.out.find(k), std::string::npos) << k;
}

// A learning rate that blows the weights up makes the next gradients non-finite: with
// on_nonfinite = stop the run stops with exit 5 naming the step, and no update is applied.
TEST_F(Cli, NonFiniteGradientsStopTheRun) {
  Outcome r = sh(dptrain(2, "--config " + ini("", "nan.ini") + " --train.optimizer sgd --train.lr 1e37 --log.every_steps 5"));
  EXPECT_EQ(r.code, 5) << r.out;
  EXPECT_NE(r.out.find("non-finite gradients at step 2"), std::string::npos) << r.out;
}

TEST_F(Cli, NonFiniteGradientsSkippedWhenAsked) {
  Outcome r = sh(dptrain(2, "--config " + ini("", "skip.ini") +
                                " --train.optimizer sgd --train.lr 1e37 --train.on_nonfinite skip --train.epochs 1 --log.every_steps 40"));
  EXPECT_EQ(r.code, 0) << r.out;
  // 40 steps: step 1 applies its (huge) update, steps 2..40 are skipped.
  EXPECT_NE(r.out.find("39 step(s) skipped"), std::string::npos) << r.out;
}

// A layer list: trains (the layer table printed at start-up), checkpoints with its conv
// tensors, and --eval rebuilds it from the checkpoint's own config.
TEST_F(Cli, LayerListTrainsAndEvalReadsItBack) {
  std::string cfg = ini("[checkpoint]\ndir = " + (dir / "ck-cnn").string() + "\n", "cnn.ini");
  Outcome r = sh(dptrain(2, "--config " + cfg +
                                " --model.layers 'conv(6,3,pad=1) relu maxpool(2) flatten dropout(0.1) linear(4)'"
                                " --model.input_shape 1,4,4 --data.augment flip"));
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* w : {"conv(6,3,stride=1,pad=1)", "conv0", "6x4x4", "6x2x2", "fc0", "total parameters 160"})
    EXPECT_NE(r.out.find(w), std::string::npos) << "missing '" << w << "' in:\n" << r.out;
  EXPECT_NE(r.out.find("final test accuracy"), std::string::npos) << r.out;
  fs::path ck = dir / "ck-cnn" / "ckpt-000000080.h5";
  ASSERT_TRUE(fs::exists(ck)) << r.out;
  Outcome e = sh(dptrain(2, "--eval --checkpoint " + ck.string()));
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("accuracy"), std::string::npos) << e.out;
}

// Bad layer lists exit 2 on every rank before training, with a message naming the layer.
TEST_F(Cli, BadLayerListsExitTwoWithAMessage) {
  const std::string cfg = ini("", "list.ini");
  struct Case { std::string args; std::vector<std::string> words; };
  const Case cases[] = {
      {"--model.layers 'conv(4,3) relu softmax flatten linear(4)' --model.input_shape 1,4,4",
       {"model.layers", "layer 3 'softmax': unknown layer 'softmax'"}},
      {"--model.layers 'conv(4,x) flatten linear(4)' --model.input_shape 1,4,4", {"model.layers", "'x' is not an integer"}},
      {"--model.layers 'conv(4,7) flatten linear(4)' --model.input_shape 1,4,4",
       {"kernel 7x7 is larger than its input 4x4", "train.h5"}},
      {"--model.layers 'conv(4,3) flatten linear(4)'", {"needs an image input", "model.input_shape"}},
      {"--model.layers 'flatten linear(3)'", {"3 values", "4 classes"}},
      {"--model.layers 'linear(8) relu linear(4)' --model.activation tanh", {"model.activation", "model.layers"}},
      {"--model.layers 'conv(4,3) flatten linear(4)' --model.input_shape 2,4,4", {"model.input_shape = 2x4x4", "16 values"}},
  };
  for (const Case& c : cases) {
    Outcome r = sh(dptrain(2, "--config " + cfg + " " + c.args));
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    for (auto& w : c.words) EXPECT_NE(r.out.find(w), std::string::npos) << "missing '" << w << "' in:\n" << r.out;
    EXPECT_EQ(r.out.find("Segmentation"), std::string::npos) << r.out;
  }
  // A 1 MiB list in the INI file: refused, and not echoed back whole.
  std::ofstream f(dir / "huge.ini");
  f << "[data]\ntrain = " << (dir / "train.h5").string() << "\n[model]\nlayers =";
  for (size_t n = 0; n < (1u << 20); n += 11) f << " linear(10)";
  f << "\n";
  f.close();
  Outcome r = sh(dptrain(2, "--config " + (dir / "huge.ini").string()));
  EXPECT_EQ(r.code, 2) << r.out.substr(0, 2000);
  EXPECT_NE(r.out.find("characters long"), std::string::npos) << r.out.substr(0, 2000);
  EXPECT_LT(r.out.size(), 20000u);
}

std::string dpdata(const std::string& args) { return std::string(DPT_BINARY_DIR) + "/dpdata " + args; }

// Labels stored as uint8 or int16 (numpy's and torchvision's habit) validate and train.
TEST_F(Cli, NarrowLabelTypesValidateAndTrain) {
  std::vector<int32_t> labels(400);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t(i % 4);
  for (auto [name, type] : {std::pair{"u8_labels.h5", H5T_STD_U8LE}, std::pair{"i16_labels.h5", H5T_STD_I16LE}}) {
    const std::string f = bad_labels_file(labels, 4, name, type);
    Outcome v = sh(dpdata("validate " + f));
    EXPECT_EQ(v.code, 0) << v.out;
    EXPECT_NE(v.out.find("valid (400 rows"), std::string::npos) << v.out;
    Outcome r = sh(dptrain(2, "--config " + ini("", "narrow.ini") + " --data.train " + f + " --train.epochs 1"));
    EXPECT_EQ(r.code, 0) << r.out;
  }
  labels[123] = -1;
  const std::string neg = bad_labels_file(labels, 4, "neg_labels.h5", H5T_STD_I16LE);
  Outcome v = sh(dpdata("validate " + neg));
  EXPECT_EQ(v.code, 2) << v.out;
  EXPECT_NE(v.out.find("row 123 has label -1"), std::string::npos) << v.out;
}

// An N x H x W x C (channels last) image file: dpdata validate and training both refuse it with
// the layout dptrain wants and the transpose that gives it, before any layer sees the data.
TEST_F(Cli, ChannelsLastImagesAreRefusedWithTheTranspose) {
  std::vector<int32_t> labels(200);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t(i % 4);
  const std::string f = bad_labels_file(labels, 4, "nhwc.h5", H5T_STD_I32LE, {8, 8, 1});
  const std::vector<std::string> words{"nhwc.h5", "(200, 8, 8, 1)", "channels last", "N x C x H x W",
                                       "(200, 1, 8, 8)", "transpose(0, 3, 1, 2)"};
  Outcome v = sh(dpdata("validate " + f));
  EXPECT_EQ(v.code, 2) << v.out;
  for (auto& w : words) EXPECT_NE(v.out.find(w), std::string::npos) << "missing '" << w << "' in:\n" << v.out;
  Outcome r = sh(dptrain(2, "--config " + ini("", "nhwc.ini") + " --data.train " + f + " --data.test " + f +
                                " --model.layers 'conv(4,3,pad=1) relu maxpool(2) flatten linear(4)'"));
  EXPECT_EQ(r.code, 2) << r.out;
  for (auto& w : words) EXPECT_NE(r.out.find(w), std::string::npos) << "missing '" << w << "' in:\n" << r.out;
  // The same images channels first load and train.
  const std::string g = bad_labels_file(labels, 4, "nchw.h5", H5T_STD_I32LE, {1, 8, 8});
  r = sh(dptrain(2, "--config " + ini("", "nchw.ini") + " --data.train " + g + " --data.test " + g +
                     " --model.layers 'conv(4,3,pad=1) relu maxpool(2) flatten linear(4)' --train.epochs 1"));
  EXPECT_EQ(r.code, 0) << r.out;
}

// dpdata refuses positional arguments beyond those a subcommand takes, naming the first.
TEST_F(Cli, DpdataRefusesStrayArguments) {
  const std::string train = (dir / "train.h5").string();
  const std::pair<std::string, std::string> cases[] = {
      {"validate " + train + " extra.h5", "unexpected argument 'extra.h5'"},
      {"info " + train + " more", "unexpected argument 'more'"},
      {"synth blobs stray --out " + (dir / "never.h5").string(), "unexpected argument 'stray'"},
      {"import-idx imgs --labels l --out o.h5", "unexpected argument 'imgs'"},
      {"fashion-mnist data", "unexpected argument 'data'"},
      {"synth bogus --out x.h5", "unknown kind 'bogus'"},
  };
  for (const auto& [args, words] : cases) {
    Outcome r = sh(dpdata(args));
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(words), std::string::npos) << args << "\n" << r.out;
  }
  EXPECT_FALSE(fs::exists(dir / "never.h5"));
  Outcome ok = sh(dpdata("validate " + train));
  EXPECT_EQ(ok.code, 0) << ok.out;
}
