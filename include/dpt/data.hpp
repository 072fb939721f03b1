// Datasets: the HDF5 layout of DESIGN.md (read with validation, written by dpdata), the data
// order (epoch-seeded global shuffle, the same on every rank, sliced per rank and micro-batch),
// and host-side batch gathering. Knows nothing of models.
#pragma once
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
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
  std::vector<std::string> class_names;  // optional: name of class i (a CSV's named labels)
  // Part of a file: row i here is row first_row + i of a file of file_rows rows (0: all of it).
  int64_t first_row = 0, file_rows = 0;
  // Changes whenever the contents are replaced in place (TrainRows' epoch switch), so a backend
  // holding a copy knows to refresh it; 0 for a dataset that never changes.
  uint64_t version = 0;

  int64_t rows_in_file() const { return file_rows ? file_rows : n; }
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
// Reads only the given rows (any order; repeats allowed): row i of the result is file row
// rows[i]. The file is validated as by load_dataset except that only these rows' labels and
// features are read and checked, and only their size counts against the memory limit.
Dataset load_rows(const std::string& path, const std::vector<int64_t>& rows);
// Rank r's evaluation rows (eval_shard) of the file, read alone; first_row and file_rows set.
Dataset load_eval_shard(const std::string& path, int rank, int world);

// The file's identity, as a line: rows, sample shape, feature type, classes, scale and offset,
// and a CRC32 of the labels and features of 64 rows spread over it (the first and last among
// them). A copy of the file has the same identity wherever it is; another file's differs.
std::string data_identity(const std::string& path);

// Writes a dataset in the layout (features uint8 or float32, labels int32). Atomic: temporary
// file + rename.
void write_dataset(const std::string& path, const Dataset& ds);

// Generators for `dpdata synth`.
Dataset synth_odd_even(int64_t n, int bits, uint64_t seed);  // binary digits -> parity
Dataset synth_blobs(int64_t n, int dim, int classes, float spread, uint64_t seed);
// Fashion-MNIST / MNIST idx files (.gz or plain).
Dataset import_idx(const std::string& images, const std::string& labels);

// Users' own arrays (`dpdata npy`, `dpdata csv`), held to the checks and messages of the HDF5
// reader. Lines worth telling the user (a conversion, a default taken, the class names) are
// appended to notes.
struct ImportOptions {
  std::optional<int> num_classes;  // unset: max label + 1
  bool channels_last = false;      // npy: 4-D features are N x H x W x C; transposed to N x C x H x W
  std::vector<std::string>* notes = nullptr;
};
// A NumPy .npy pair (format versions 1.0, 2.0, 3.0): features N x D or N x C x H x W of uint8
// (stored as is, read as value / 255), float32 or float64 (narrowed to float32); labels N
// integers (int8 to int64, uint8 to uint32).
Dataset import_npy(const std::string& features, const std::string& labels, const ImportOptions& o);
// A CSV file with a header row: the column `label` (a header name, or a 0-based index when no
// header has that name) holds integer labels or class names; every other column is a feature.
Dataset import_csv(const std::string& path, const std::string& label, const ImportOptions& o);

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

// How one rank walks the training set: the data order above, for this rank.
struct RankOrder {
  bool shuffle = true;
  uint64_t seed = 1;
  int rank = 0, world = 1, batch = 1, accumulate = 1;
  int64_t global_batch() const { return int64_t(batch) * world * accumulate; }
};

// The positions of an epoch's order that the rank uses, in the order it uses them: for each
// global batch k < n / G and micro-batch a, b positions from batch_offset(k, a, r, ...). The
// trailing partial global batch is dropped, as in training.
std::vector<int64_t> rank_positions(int64_t n, const RankOrder& o);

// The training rows of one rank, epoch by epoch (`data.read`):
//  - all: the whole file is in memory (a Dataset the caller owns); an epoch's index is its order.
//  - shard: only the rows this rank's batches use in the epoch are read from the file, stored
//    in the order the rank uses them; while an epoch trains, a background thread reads the next
//    one's (with shuffle = false the rows never change and are read once).
// data() is one object whose contents change at each start_epoch (its version with them).
class TrainRows {
 public:
  TrainRows(const Dataset& whole, const RankOrder& o);
  TrainRows(const std::string& path, const RankOrder& o);
  ~TrainRows();
  TrainRows(const TrainRows&) = delete;
  TrainRows& operator=(const TrainRows&) = delete;

  bool sharded() const { return whole_ == nullptr; }
  const DatasetInfo& info() const { return info_; }
  const std::string& path() const { return path_; }
  int64_t file_rows() const { return info_.n; }
  // Rows of the file this rank uses each epoch (the size of rank_positions).
  int64_t rows_per_epoch() const {
    return info_.n / order_.global_batch() * order_.accumulate * order_.batch;
  }
  const Dataset& data() const { return whole_ ? *whole_ : cur_; }
  // Makes epoch e current (waiting for its rows if they are still being read; a read error is
  // thrown here) and returns its index (file_rows entries): position p of the epoch order is row
  // index[p] of data(); positions other ranks use hold 0. With read_next, epoch e + 1's rows
  // are read in the background meanwhile.
  std::vector<int64_t> start_epoch(int64_t e, bool read_next = true);
  // Rows read from the file so far (shard), or the file's rows (all).
  int64_t rows_read() const { return whole_ ? info_.n : rows_read_; }

 private:
  struct Pending;
  const Dataset* whole_ = nullptr;
  std::string path_;
  DatasetInfo info_;
  RankOrder order_;
  Dataset cur_;
  int64_t cur_epoch_ = -1;
  int64_t rows_read_ = 0;
  std::unique_ptr<Pending> next_;  // the background read of the next epoch, if any

  Dataset read_epoch(int64_t e) const;
  void prefetch(int64_t e);
};

// Evaluation shard: rank r of W takes rows [r·n/W, (r+1)·n/W) (no row dropped).
inline void eval_shard(int64_t n, int r, int world, int64_t& begin, int64_t& end) {
  begin = n * r / world;
  end = n * (r + 1) / world;
}

}  // namespace dpt
