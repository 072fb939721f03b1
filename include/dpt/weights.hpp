// Weights from outside a run, for model.init: a dptrain checkpoint, an HDF5 file with a /model
// group in the checkpoint layout that another tool wrote (h5py, scripts/torch_to_h5.py), or a
// .safetensors file (the format timm and Hugging Face ship). Knows nothing of models: it returns
// named tensors; the Trainer matches them to its layers (finetune.hpp).
#pragma once
#include <string>
#include <vector>

#include "dpt/ckpt.hpp"

namespace dpt {

struct Weights {
  std::string kind;  // "dptrain checkpoint" | "HDF5 /model group" | "safetensors"
  // PyTorch state_dict keys: a preset's torchvision key ("layer1.0.bn1.running_mean"), a layer
  // list's "<layer>.<leaf>" ("conv0.weight", "fc1.bias"): the checkpoint's /model/<layer>/<leaf>
  // with the slash a dot. Float tensors as float32; int64 and int32 ones (num_batches_tracked)
  // as int64.
  std::vector<Tensor> tensors;
  // A dptrain checkpoint's model as it recorded it (Checkpoint's layers, model, input_shape);
  // empty for the other kinds.
  std::vector<int> layers;
  std::string model;
  std::vector<int> input_shape;
};

// Reads path by what its first bytes say it is; throws InputError naming the file and what is
// wrong (not found, another format, a damaged header, a tensor outside the file, a dtype it
// cannot take).
Weights read_weights(const std::string& path);

// What path is by its first bytes ("dptrain checkpoint", "HDF5 /model group", "safetensors"),
// and for an HDF5 file whether it has a /model group; no tensor read. Throws InputError as
// read_weights does for a file it cannot be.
std::string weights_kind(const std::string& path);

// A safetensors file's tensors from its bytes: an 8-byte little-endian header length N, N bytes
// of JSON ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}),
// then the data; F32, F64, F16, BF16 become float32, I64 and I32 int64. `what` names the file in
// messages.
std::vector<Tensor> parse_safetensors(const std::string& bytes, const std::string& what);

}  // namespace dpt
