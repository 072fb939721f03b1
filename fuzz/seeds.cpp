// Writes the seed corpora of the fuzz targets into <dir>/{dataset,ckpt,config}/: a few small
// valid files (uint8 and float32 datasets, a checkpoint, configs), so the fuzzer starts from
// inputs that pass the first checks. Generated at build time; nothing binary is committed.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "dpt/ckpt.hpp"
#include "dpt/config.hpp"
#include "dpt/data.hpp"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  const fs::path dir = argv[1];
  for (const char* d : {"dataset", "ckpt", "config"}) fs::create_directories(dir / d);
  dpt::Dataset a = dpt::synth_blobs(12, 3, 3, 0.5f, 1);  // float32 features
  dpt::write_dataset((dir / "dataset" / "blobs.h5").string(), a);
  dpt::Dataset b = dpt::synth_odd_even(16, 4, 2);  // uint8 features
  dpt::write_dataset((dir / "dataset" / "odd_even.h5").string(), b);

  dpt::Checkpoint ck;
  ck.step = 3;
  ck.global_batch = 4;
  ck.optimizer = "sgd";
  ck.layers = {3, 2};
  ck.config = "[model]\nlayers = 3,2\n";
  ck.tensors.push_back({"model/fc0/weight", {2, 3}, {1, 2, 3, 4, 5, 6}});
  ck.tensors.push_back({"model/fc0/bias", {2}, {0.5f, -0.5f}});
  dpt::write_checkpoint((dir / "ckpt" / "ckpt-000000003.h5").string(), ck);
  // A layer list's checkpoint: model and input_shape attributes, a conv tensor of rank 4.
  dpt::Checkpoint cnn = ck;
  cnn.layers.clear();
  cnn.model = "conv(2,3,stride=1,pad=1) relu flatten linear(2)";
  cnn.input_shape = {1, 3, 3};
  cnn.config = "[model]\nlayers = " + cnn.model + "\n";
  cnn.tensors = {{"model/conv0/weight", {2, 1, 3, 3}, std::vector<float>(18, 0.25f)},
                 {"model/conv0/bias", {2}, {0.1f, -0.1f}},
                 {"model/fc0/weight", {2, 18}, std::vector<float>(36, -0.5f)},
                 {"model/fc0/bias", {2}, {0.f, 1.f}}};
  dpt::write_checkpoint((dir / "ckpt" / "ckpt-000000004.h5").string(), cnn);

  dpt::Config c;
  c.train_file = "train.h5";
  std::ofstream(dir / "config" / "resolved.ini") << dpt::to_ini(c);
  std::ofstream(dir / "config" / "small.ini")
      << "[model]\nlayers = 4,8,2\n[data]\ntrain = t.h5\n[train]\nepochs = 2\nlr = 0.1\n"
         "optimizer = adam\nsync = parameters\naverage_every = 2\n[checkpoint]\nevery_steps = 4\n";
  // Layer lists: a valid CNN, and the kinds of bad list the parser and shape inference reject.
  const char* lists[][2] = {
      {"cnn.ini", "conv(8,3,pad=1) relu maxpool(2) conv(16,3,stride=2,pad=1) gelu avgpool(2,stride=1) "
                  "flatten linear(32) tanh dropout(0.25) sigmoid linear(10)\ninput_shape = 1,28,28"},
      {"unknown_layer.ini", "conv(8,3) relu softmax flatten linear(10)"},
      {"bad_argument.ini", "conv(8,3,pad=-1) flatten linear(10)"},
      {"bad_keyword.ini", "conv(8,3,dilation=2) flatten linear(10)"},
      {"unclosed.ini", "conv(8,3 relu flatten linear(10)"},
      {"kernel_too_large.ini", "conv(8,31) flatten linear(10)\ninput_shape = 1,28,28"},
      {"conv_after_flatten.ini", "flatten conv(8,3) linear(10)\ninput_shape = 1,28,28"},
      {"activation_with_list.ini", "flatten linear(10)\nactivation = tanh"},
  };
  for (auto& l : lists)
    std::ofstream(dir / "config" / l[0])
        << "[model]\nlayers = " << l[1] << "\n[data]\ntrain = t.h5\naugment = crop,flip\ncrop_padding = 2\n";
  return 0;
}
