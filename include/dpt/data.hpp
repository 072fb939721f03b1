// Datasets: the HDF5 layout of DESIGN.md (read with validation, written by dpdata), the data
// order (epoch-seeded global shuffle, the same on every rank, sliced per rank and micro-batch),
// and host-side batch gathering. Knows nothing of models.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dpt {

// A dataset held in host memory. Features stay in their stored type (uint8 or float32) and are
// converted when a batch is gathered: value = raw × scale + offset.
struct Dataset {
  std::string path;
  int64_t n = 0;                    // rows
  int64_t dim = 0;                  // features per row (product of the per-sample shape)
  std::vector<int64_t> sample_shape;  // e.g. {784} or {1, 28, 28}
  int num_classes = 0;
  bool is_u8 = true;
  float scale = 1.f, offset = 0.f;
  std::vector<uint8_t> u8;    // n × dim when is_u8
  std::vector<float> f32;     // n × dim otherwise
  std::vector<int32_t> labels;  // n, each in [0, num_classes)

  // x (count, dim) and y (count) get the given rows, converted to float.
  void gather(const int64_t* rows, int count, float* x, int32_t* y) const;
};

// What `dpdata info` prints and the loader checks before allocating.
struct DatasetInfo {
  int64_t n = 0, dim = 0;
  std::vector<int64_t> sample_shape;
  int num_classes = 0;
  std::string feature_type;  // "uint8" | "float32"
  std::string label_type;    // "int32" | "int64"
  float scale = 1.f, offset = 0.f;
};

// Reads and validates the file; throws InputError naming the file, the dataset and what is
// wrong (missing, wrong rank or type, sizes that disagree, labels out of range, absurd sizes)
// before any large allocation.
DatasetInfo probe_dataset(const std::string& path);
Dataset load_dataset(const std::string& path);

// Writes a dataset in the layout (features uint8 or float32, labels int32). Atomic: temporary
// file + rename.
void write_dataset(const std::string& path, const Dataset& ds);

// Generators for `dpdata synth`.
Dataset synth_odd_even(int64_t n, int bits, uint64_t seed);  // binary digits -> parity
Dataset synth_blobs(int64_t n, int dim, int classes, float spread, uint64_t seed);
// Fashion-MNIST / MNIST idx files (.gz or plain).
Dataset import_idx(const std::string& images, const std::string& labels);

// ---- data order ----
// Deterministic 64-bit generator (SplitMix64): the same stream on every platform and rank.
struct SplitMix64 {
  uint64_t s;
  explicit SplitMix64(uint64_t seed) : s(seed) {}
  uint64_t next();
  uint64_t below(uint64_t n);  // uniform in [0, n), unbiased
  double uniform();            // [0, 1)
};

// Row order of one epoch: the identity when !shuffle, else a permutation seeded by
// (seed, epoch) — independent of the number of ranks.
std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch);

// Where rank r's micro-batch a of global batch k starts in the epoch order:
// k·G + a·(b·W) + r·b, with G = b·W·A. A rank takes b consecutive positions from there.
inline int64_t batch_offset(int64_t k, int a, int r, int b, int world, int accumulate) {
  const int64_t G = int64_t(b) * world * accumulate;
  return k * G + int64_t(a) * b * world + int64_t(r) * b;
}

// Evaluation shard: rank r of W takes rows [r·n/W, (r+1)·n/W) (no row dropped).
inline void eval_shard(int64_t n, int r, int world, int64_t& begin, int64_t& end) {
  begin = n * r / world;
  end = n * (r + 1) / world;
}

}  // namespace dpt
