// Checkpoints: the HDF5 layout of DESIGN.md (readable with h5dump and h5py), written atomically
// (temporary file, fsync, rename, folder fsync) and validated on read (format, version, shapes,
// checksum). Knows nothing of the training loop: it stores named float tensors and attributes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dpt {

struct Tensor {
  std::string name;             // path inside the file, e.g. "model/fc0/weight"
  std::vector<int64_t> shape;   // e.g. {out, in}
  std::vector<float> data;      // row-major
  // An int64 tensor (batch norm's num_batches_tracked) holds its values here, data empty.
  bool int64 = false;
  std::vector<int64_t> ints;
  size_t count() const { return int64 ? ints.size() : data.size(); }
};

struct Checkpoint {
  static constexpr int kVersion = 1;
  static constexpr const char* kFormat = "dptrain-checkpoint";  // root attribute `format`
  int version = kVersion;
  int64_t step = 0;          // optimizer steps taken
  int64_t epoch = 0;         // epoch the next step belongs to
  int64_t step_in_epoch = 0; // global batches of that epoch already consumed
  int64_t samples_seen = 0;
  int world_size = 1;
  int64_t global_batch = 0;
  int64_t optimizer_updates = 0;  // updates applied (Adam's step count): step minus skipped steps
  uint64_t seed = 0;
  std::string optimizer;     // e.g. "adam"
  std::string config;        // the resolved INI text
  // What the run trained on and how far its schedule reaches (resume.hpp): root attributes
  // `data_train` (data.train's identity, data_identity()) and `schedule_steps` (the lr
  // schedule's horizon); "" and 0 in files of older versions.
  std::string data_train;
  int64_t schedule_steps = 0;
  std::string run_id;        // the run that wrote it (root attribute `run_id`; "" in files of
                             // older versions): a run prunes and overwrites only its own
  // The training set's class names (root attribute `class_names`, one per line; absent when
  // the data had none): what --predict and --eval name classes by.
  std::vector<std::string> class_names;
  // The model: the MLP widths form in `layers` (root attribute `layers`), or a layer list in
  // `model` (root attribute `model`, the normalised list) with the input shape it was planned
  // for (root attribute `input_shape`: {C, H, W} or {D}); `layers` is empty then.
  std::vector<int> layers;   // e.g. {784, 256, 128, 10}
  std::string model;         // e.g. "conv(32,3,stride=1,pad=1) relu ... linear(10)"
  std::vector<int> input_shape;
  // "model/<layer>/weight|bias", "optimizer/<state>/<layer>/weight|bias", <layer> = fc<i>,
  // conv<i> or bn<i> (bn also running_mean, running_var, num_batches_tracked; a conv without
  // bias has none); a preset's "model/<torchvision key>" and "optimizer/<state>/<key>"
  // (read_checkpoint returns them in byte-wise name order).
  std::vector<Tensor> tensors;

  const Tensor* find(const std::string& name) const;
};

// Root attribute `checksum_crc32` (uint32): zlib crc32 over the tensors in byte-wise name order,
// each fed as its name bytes, one NUL, int64 rank, int64 dims, then float32 data (int64 data for
// an int64 tensor; all little-endian). Attributes are not covered; HDF5's own structure checks catch most damage there.
uint32_t tensor_checksum(const std::vector<Tensor>& tensors);

// Class names as the root attribute `class_names` holds them: one string, one name per line
// (no name holds a line break: the importers refuse one). "" is no names.
std::string join_class_names(const std::vector<std::string>& names);
std::vector<std::string> split_class_names(const std::string& joined);

// Atomic write; throws Error on I/O failure (the previous file, if any, is left intact).
// Also throws Error, before touching the disk, when the tensors disagree with `layers`.
void write_checkpoint(const std::string& path, const Checkpoint& ck);
// Recomputes the whole-file checksum in the file's 512-byte header (an HDF5 user block) after
// another tool (h5py, h5edit) edited a checkpoint in place; an edited file without it is
// rejected as damaged. The reader checks the header before HDF5 parses the file.
void seal_checkpoint(const std::string& path);
// Validated read; throws InputError naming the file and what is wrong.
Checkpoint read_checkpoint(const std::string& path);

// The tensors under /model of an HDF5 file in the checkpoint layout that dptrain did not write
// (h5py, scripts/torch_to_h5.py): no seal or root attributes needed, float tensors of any width
// read as float32, int64 ones as they are. Throws InputError naming the file and what is wrong.
std::vector<Tensor> read_model_group(const std::string& path);

// Whether an HDF5 file has a /model group, nothing else read (throws InputError as
// read_model_group does for a file HDF5 cannot open).
bool has_model_group(const std::string& path);

// The `run_id` root attribute alone, without validating the rest of the file: "" when the
// file has none (older versions) or cannot be read as HDF5.
std::string read_checkpoint_run_id(const std::string& path);

}  // namespace dpt
