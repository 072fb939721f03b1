// Starting from trained weights and fine-tuning them. The safetensors reader against bytes
// written here from the format's definition (every dtype it takes, every kind of damage); the
// optimizer's fine-tuning groups against the update written out by hand (frozen: bitwise
// unchanged; body: its own rate); and dptrain as a user runs it: a file that does not fit names
// each tensor and both shapes (exit 2), a new head, model.init_skip, frozen tensors bitwise
// unchanged with train.train_bn either way, the freeze_epochs switch at its step and across a
// resume (oracle: the uninterrupted run, bitwise), two ranks starting from the same weights.
// torchvision's side (exact losses, the .pth round trip) is tests/torch_finetune_check.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "dpt/backend.hpp"
#include "dpt/check.hpp"
#include "dpt/ckpt.hpp"
#include "dpt/optim.hpp"
#include "dpt/weights.hpp"

namespace fs = std::filesystem;

namespace {

using cli::mpirun;
using cli::Outcome;

Outcome sh(const std::string& cmd) { return cli::sh(cmd, 120); }

// ---- safetensors bytes, from the format's definition ----
struct Entry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

template <class T> std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::string safetensors(const std::vector<Entry>& entries, const std::string& extra_header = "") {
  std::string h = "{", data;
  for (const Entry& e : entries) {
    std::string shape;
    for (int64_t d : e.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    h += (h.size() > 1 ? "," : "") + ("\"" + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":[" + shape +
                                      "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
                                      std::to_string(data.size() + e.bytes.size()) + "]}");
    data += e.bytes;
  }
  h += extra_header + "}";
  const uint64_t n = h.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + h + data;
}

std::string refusal(const std::string& bytes) {
  try {
    dpt::parse_safetensors(bytes, "w.safetensors");
  } catch (const dpt::InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(Safetensors, ReadsEveryDtypeItTakes) {
  const std::vector<uint16_t> f16 = {0x3c00, 0xc100, 0x7bff, 0x0001};  // 1, -2.5, 65504, 2^-24
  const std::vector<uint16_t> bf16 = {0x3f80, 0xc0a0};                // 1, -5
  const std::string b = safetensors({{"a", "F32", {2}, raw(std::vector<float>{0.5f, -3.f})},
                                     {"h", "F16", {2, 2}, raw(f16)},
                                     {"b", "BF16", {2}, raw(bf16)},
                                     {"d", "F64", {1}, raw(std::vector<double>{0.1})},
                                     {"n", "I64", {}, raw(std::vector<int64_t>{123456789012})},
                                     {"i", "I32", {2}, raw(std::vector<int32_t>{-7, 9})}},
                                    ",\"__metadata__\":{\"format\":\"pt\"}");
  std::map<std::string, dpt::Tensor> t;
  for (dpt::Tensor& x : dpt::parse_safetensors(b, "w")) t[x.name] = x;
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t["a"].data, (std::vector<float>{0.5f, -3.f}));
  EXPECT_EQ(t["h"].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(t["h"].data, (std::vector<float>{1.f, -2.5f, 65504.f, std::ldexp(1.f, -24)}));
  EXPECT_EQ(t["b"].data, (std::vector<float>{1.f, -5.f}));
  EXPECT_EQ(t["d"].data, (std::vector<float>{0.1f}));
  EXPECT_TRUE(t["n"].int64);
  EXPECT_EQ(t["n"].ints, (std::vector<int64_t>{123456789012}));
  EXPECT_TRUE(t["n"].shape.empty());
  EXPECT_EQ(t["i"].ints, (std::vector<int64_t>{-7, 9}));
}

TEST(Safetensors, RefusesDamageNamingIt) {
  const std::string good = safetensors({{"w", "F32", {2}, raw(std::vector<float>{1, 2})}});
  EXPECT_NE(refusal(good.substr(0, 5)).find("truncated"), std::string::npos);
  EXPECT_NE(refusal(good.substr(0, good.size() - 4)).find("'w': data_offsets [0, 8] lie outside"), std::string::npos);
  std::string huge = good;
  const uint64_t big = uint64_t(1) << 40;
  std::memcpy(huge.data(), &big, 8);
  EXPECT_NE(refusal(huge).find("claims 1099511627776 bytes"), std::string::npos);
  std::string notjson = good;
  notjson[8] = '[';
  EXPECT_NE(refusal(notjson).find("not a JSON object"), std::string::npos);
  EXPECT_NE(refusal(safetensors({{"w", "F32", {3}, raw(std::vector<float>{1, 2})}})).find("span 8 bytes, its shape and dtype 12"),
            std::string::npos);
  EXPECT_NE(refusal(safetensors({{"w", "U8", {2}, "ab"}})).find("dtype U8 is not one dptrain reads"), std::string::npos);
  EXPECT_NE(refusal(safetensors({{"w", "F32", {-1}, ""}})).find("'w': shape holds something other than a size"),
            std::string::npos);
}

// ---- the optimizer's groups ----
TEST(FineTuneOptimizer, FrozenUnchangedBodyAtItsRate) {
  auto be = dpt::make_cpu_backend({});
  dpt::Config c;
  c.optimizer = "momentum";
  c.momentum = 0.9;
  c.weight_decay = 0.1;
  // [0, 4) frozen (and in the body), [4, 8) body, [8, 10) the head.
  std::vector<dpt::TensorSeg> segs(3);
  segs[0] = {0, 4, true, true, true};
  segs[1] = {4, 8, true, false, true};
  segs[2] = {8, 10, true, false, false};
  dpt::Optimizer opt(*be, c, 10, segs);
  std::vector<float> p(10), g(10);
  for (int i = 0; i < 10; ++i) p[size_t(i)] = 0.1f * float(i + 1), g[size_t(i)] = 0.5f - 0.1f * float(i);
  const std::vector<float> p0 = p;
  const std::vector<float> lr = {0.1f, 0.1f}, body = {0.01f, 0.01f};
  dpt::StepCtl ctl;
  opt.set_body_lr(body.data());
  opt.set_frozen(true);
  opt.step_at(p.data(), g.data(), 0, 10, lr.data(), &ctl);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(std::memcmp(&p[i], &p0[i], 4), 0) << "frozen element " << i << " moved";
  // torch.optim.SGD's first step: buf = g + wd·p; p -= lr·buf.
  for (size_t i = 4; i < 10; ++i) {
    const float rate = i < 8 ? 0.01f : 0.1f;
    EXPECT_FLOAT_EQ(p[i], p0[i] - rate * (g[i] + 0.1f * p0[i])) << "element " << i;
  }
  be->end_step(&ctl, 1, false);
  opt.set_frozen(false);  // freeze_epochs over: the frozen set trains at the body's rate
  const std::vector<float> p1 = p;
  opt.step_at(p.data(), g.data(), 0, 10, lr.data(), &ctl);
  for (size_t i = 0; i < 4; ++i)  // its momentum starts now: nothing accumulated while frozen
    EXPECT_FLOAT_EQ(p[i], p1[i] - 0.01f * (g[i] + 0.1f * p1[i])) << "unfrozen element " << i;
}

// ---- dptrain as a user runs it ----
class FineTune : public ::testing::Test {
 protected:
  fs::path dir;
  std::string bin = std::string(DPT_BINARY_DIR);
  void SetUp() override {
    dir = fs::temp_directory_path() / ("dpt-finetune-" + std::to_string(::getpid()) + "-" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (auto [name, classes, seed] : {std::tuple<const char*, int, int>{"a.h5", 4, 3}, {"b.h5", 3, 5}}) {
      Outcome r = sh(bin + "/dpdata synth blobs --n 2000 --dim 16 --classes " + std::to_string(classes) +
                     " --spread 0.5 --seed " + std::to_string(seed) + " --out " + (dir / name).string());
      ASSERT_EQ(r.code, 0) << r.out;
    }
  }
  void TearDown() override { fs::remove_all(dir); }
  // A run on data file `data` (2000 rows, batch 50: 40 steps an epoch), checkpoints in `ck`.
  Outcome train(const std::string& data, const std::string& layers, const std::string& ck, const std::string& args,
                int ranks = 1) {
    return sh(mpirun(ranks) + bin + "/dptrain --data.train " + (dir / data).string() + " --model.layers '" + layers +
              "' --train.batch_per_rank " + std::to_string(50 / ranks) + " --train.optimizer momentum --train.lr 0.05" +
              " --train.weight_decay 0.01 --checkpoint.dir " + (dir / ck).string() + " --log.progress false " + args);
  }
  // The pretrained model: 2 epochs on a.h5 (4 classes); its checkpoint's path.
  std::string pretrained(const std::string& layers = "linear(32) bn relu linear(4)") {
    Outcome r = train("a.h5", layers, "pre", "--train.epochs 2");
    EXPECT_EQ(r.code, 0) << r.out;
    return (dir / "pre" / "ckpt-000000080.h5").string();
  }
  std::vector<float> tensor(const std::string& ckpt, const std::string& name) {
    const dpt::Checkpoint ck = dpt::read_checkpoint(ckpt);
    const dpt::Tensor* t = ck.find("model/" + name);
    EXPECT_NE(t, nullptr) << name << " not in " << ckpt;
    return t ? t->data : std::vector<float>{};
  }
  std::string ckpt(const std::string& folder, int step) {
    char name[32];
    std::snprintf(name, sizeof name, "ckpt-%09d.h5", step);
    return (dir / folder / name).string();
  }
};

TEST_F(FineTune, AFileThatDoesNotFitNamesEachTensorAndBothShapes) {
  const std::string pre = pretrained();
  Outcome r = train("a.h5", "linear(24) bn relu linear(4)", "x", "--model.init " + pre);
  EXPECT_EQ(r.code, 2) << r.out;
  for (const char* w : {"does not fit model.layers", "tensor 'fc0.weight': the file's shape [32, 16], the model's [24, 16]",
                        "tensor 'bn0.running_mean': the file's shape [32], the model's [24]", "model.init_skip"})
    EXPECT_NE(r.out.find(w), std::string::npos) << "missing '" << w << "' in:\n" << r.out;
  EXPECT_TRUE(cli::snapshot(dir / "x").empty()) << "a refused start wrote checkpoints";
  // A tensor missing from the file, one the model does not have.
  std::ofstream(dir / "w.safetensors", std::ios::binary)
      << safetensors({{"fc0.weight", "F32", {32, 16}, raw(tensor(pre, "fc0/weight"))},
                      {"fc7.weight", "F32", {2}, raw(std::vector<float>{1, 2})}});
  r = train("a.h5", "linear(32) relu linear(4)", "y", "--model.init " + (dir / "w.safetensors").string());
  EXPECT_EQ(r.code, 2) << r.out;
  for (const char* w : {"(safetensors)", "no tensor 'fc0.bias' (the model's [32])", "no tensor 'fc1.weight' (the model's [4, 32])",
                        "tensor 'fc7.weight' [2] is not the model's"})
    EXPECT_NE(r.out.find(w), std::string::npos) << "missing '" << w << "' in:\n" << r.out;
  for (const std::string& bad : {(dir / "none.h5").string(), (dir / "a.txt").string()}) {
    std::ofstream(dir / "a.txt") << "not weights\n";
    r = train("a.h5", "linear(32) relu linear(4)", "z", "--model.init " + bad);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(bad.find("none") != std::string::npos ? "not found" : "neither a dptrain checkpoint"),
              std::string::npos) << r.out;
  }
}

TEST_F(FineTune, ANewHeadAndInitSkipStartSeededTheRestFromTheFile) {
  const std::string pre = pretrained();
  Outcome r = train("b.h5", "linear(32) bn relu linear(3)", "h", "--model.init " + pre + " --checkpoint.at_start true");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the head re-initialised (seeded), its shape differs: fc1.weight (the file's shape [4, 32], the "
                       "model's [3, 32])"), std::string::npos) << r.out;
  const std::string s0 = ckpt("h", 0);
  for (const char* n : {"fc0/weight", "fc0/bias", "bn0/weight", "bn0/bias", "bn0/running_var"})
    EXPECT_EQ(tensor(s0, n), tensor(pre, n)) << n;
  EXPECT_EQ(tensor(s0, "fc1/weight").size(), 96u);
  // model.init_skip: the same head size, left seeded by name.
  r = train("a.h5", "linear(32) bn relu linear(4)", "s", "--model.init " + pre + " --model.init_skip fc1 --checkpoint.at_start true");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("left seeded (model.init_skip): fc1.weight, fc1.bias"), std::string::npos) << r.out;
  EXPECT_EQ(tensor(ckpt("s", 0), "fc0/weight"), tensor(pre, "fc0/weight"));
  EXPECT_NE(tensor(ckpt("s", 0), "fc1/weight"), tensor(pre, "fc1/weight"));
}

TEST_F(FineTune, FrozenTensorsStayBitwiseAndTrainBnIsHonoured) {
  const std::string pre = pretrained();
  for (const char* train_bn : {"true", "false"}) {
    const std::string out = std::string("f") + train_bn;
    Outcome r = train("b.h5", "linear(32) bn relu linear(3)", out,
                      "--model.init " + pre + " --train.freeze body --train.epochs 1 --train.train_bn " + train_bn);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(std::string("tensors frozen for the whole run")), std::string::npos) << r.out;
    const std::string end = ckpt(out, 40);
    EXPECT_EQ(tensor(end, "fc0/weight"), tensor(pre, "fc0/weight"));
    EXPECT_EQ(tensor(end, "fc0/bias"), tensor(pre, "fc0/bias"));
    const bool bn_trains = std::string(train_bn) == "true";
    EXPECT_EQ(tensor(end, "bn0/weight") != tensor(pre, "bn0/weight"), bn_trains) << "train_bn = " << train_bn;
    EXPECT_EQ(tensor(end, "bn0/bias") != tensor(pre, "bn0/bias"), bn_trains) << "train_bn = " << train_bn;
  }
  // Two ranks with the optimizer sharded (every gradient reduced, each rank updating its shard).
  Outcome r = train("b.h5", "linear(32) bn relu linear(3)", "sh",
                    "--model.init " + pre + " --train.freeze body --train.epochs 1 --train.shard_optimizer true "
                    "--checkpoint.at_start true", 2);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("(a sharded optimizer reduces them all)"), std::string::npos) << r.out;
  EXPECT_EQ(tensor(ckpt("sh", 40), "fc0/weight"), tensor(pre, "fc0/weight"));
  EXPECT_NE(tensor(ckpt("sh", 40), "fc1/weight"), tensor(ckpt("sh", 0), "fc1/weight"));
  r = train("b.h5", "linear(32) bn relu linear(3)", "p", "--model.init " + pre + " --train.freeze fc0,nothing");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("'nothing' names no tensor of the model"), std::string::npos) << r.out;
}

TEST_F(FineTune, FreezeEpochsSwitchAtItsStepAndAcrossAResume) {
  const std::string pre = pretrained();
  const std::string args = "--model.init " + pre + " --train.freeze body --train.freeze_epochs 1 --train.epochs 2 "
                           "--train.body_lr_scale 0.1 --checkpoint.keep 0 --checkpoint.every_steps 1";
  Outcome r = train("b.h5", "linear(32) bn relu linear(3)", "u", args);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step 41: train.freeze's tensors unfrozen"), std::string::npos) << r.out;
  EXPECT_EQ(tensor(ckpt("u", 40), "fc0/weight"), tensor(pre, "fc0/weight"));
  EXPECT_NE(tensor(ckpt("u", 41), "fc0/weight"), tensor(pre, "fc0/weight"));
  // Stopped before the switch (step 30) and after it (step 50), then resumed: the same run.
  for (int stop : {30, 50}) {
    const std::string f = "r" + std::to_string(stop);
    r = train("b.h5", "linear(32) bn relu linear(3)", f, args + " --train.steps " + std::to_string(stop));
    ASSERT_EQ(r.code, 0) << r.out;
    r = train("b.h5", "linear(32) bn relu linear(3)", f, args);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("resuming from"), std::string::npos) << r.out;
    for (const char* n : {"fc0/weight", "bn0/weight", "fc1/weight", "bn0/running_mean"})
      EXPECT_EQ(tensor(ckpt(f, 80), n), tensor(ckpt("u", 80), n)) << n << " after a resume at step " << stop;
  }
}

// Below the lowest trainable layer the backward pass is left out, and only what trains is
// reduced: the same model, bitwise, as with every backward pass kept (DPT_FROZEN_BACKWARD=full,
// the oracle). The lowest trainable layer (bn1) lies inside a residual block here.
TEST_F(FineTune, LeftOutPassesChangeNothing) {
  const std::string layers = "conv(8,3,pad=1) bn relu res(conv(8,3,pad=1) bn relu conv(8,3,pad=1) bn) relu "
                             "avgpool(global) flatten linear(3)";
  const std::string args = "--model.input_shape 1,4,4 --train.epochs 1 --train.freeze conv0,bn0,conv1 "
                           "--train.train_bn false --comm.backend mpi --checkpoint.at_start true";
  Outcome r = train("b.h5", layers, "floor", args, 2);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the backward pass stops below the lowest trainable layer: 3 layers compute no gradient"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gradients on the wire per step: 0.003 MB of 0.006 MB"), std::string::npos) << r.out;
  r = sh("env DPT_FROZEN_BACKWARD=full " + mpirun(2) + bin + "/dptrain --data.train " + (dir / "b.h5").string() +
         " --model.layers '" + layers + "' --train.batch_per_rank 25 --train.optimizer momentum --train.lr 0.05 "
         "--train.weight_decay 0.01 --checkpoint.dir " + (dir / "full").string() + " --log.progress false " + args);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("the backward pass stops"), std::string::npos) << r.out;
  const dpt::Checkpoint a = dpt::read_checkpoint(ckpt("floor", 40)), b = dpt::read_checkpoint(ckpt("full", 40));
  size_t compared = 0;
  for (const dpt::Tensor& t : a.tensors) {
    if (t.name.rfind("model/", 0) != 0) continue;
    const dpt::Tensor* u = b.find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(t.data, u->data) << t.name;
    EXPECT_EQ(t.ints, u->ints) << t.name;
    ++compared;
  }
  EXPECT_GE(compared, 10u);
  for (const char* n : {"conv0/weight", "conv0/bias", "bn0/weight", "conv1/weight"})
    EXPECT_EQ(tensor(ckpt("floor", 40), n), tensor(ckpt("floor", 0), n)) << n << " is frozen";
  EXPECT_NE(tensor(ckpt("floor", 40), "bn1/weight"), tensor(ckpt("floor", 0), "bn1/weight"));
}

TEST_F(FineTune, TwoRanksStartFromTheSameWeights) {
  const std::string pre = pretrained("linear(32) relu linear(4)");
  std::vector<double> first;
  for (int ranks : {1, 2}) {
    const std::string m = (dir / ("m" + std::to_string(ranks) + ".jsonl")).string();
    Outcome r = train("b.h5", "linear(32) relu linear(3)", "t" + std::to_string(ranks),
                      "--model.init " + pre + " --train.steps 1 --log.every_steps 1 --log.metrics " + m, ranks);
    ASSERT_EQ(r.code, 0) << r.out;
    const std::string text = cli::slurp(m);
    const size_t a = text.find("\"loss\": ");
    ASSERT_NE(a, std::string::npos) << text;
    first.push_back(std::stod(text.substr(a + 8)));
  }
  // Step 1's loss is each rank's forward pass on its own weights: one rank left seeded would
  // move it far off.
  EXPECT_NEAR(first[1], first[0], 1e-5 * std::abs(first[0]));
}

}  // namespace
