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
  // Rows that arrive a micro-batch at a time (data.read = stream): a device backend streams
  // them through its own buffers and never keeps a copy.
  bool streamed = false;

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
  std::vector<std::string> class_names;  // the optional root attribute class_names (may be empty)
  // How the rows are stored: "raw" (/features) or "jpeg" (/jpeg, /jpeg_offsets: each row a JPEG,
  // decoded to uint8 C x H x W when read, so every reader sees the pixels as /features would hold them).
  std::string encoding = "raw";
  int64_t stored_bytes = 0;  // jpeg: the size of /jpeg (all rows' JPEG bytes)
  int jpeg_quality = 0;      // jpeg: /jpeg's optional attribute quality (0: not recorded)
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

// Two class lists (a training set's and a test set's, a checkpoint's and a test set's), each
// named as the user knows it ("data.test (val.h5)"): throws InputError when both are given and
// a class index carries different names in them, so that labels would mean different classes.
// A list without names, or one that is the start of the other, passes.
void check_same_classes(const std::string& a_name, const std::vector<std::string>& a, const std::string& b_name,
                        const std::vector<std::string>& b);

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

// `dpdata images`: JPEG and PNG photos (an ImageFolder tree, or a CSV of path,label) into
// N x C x size x size uint8, written row block by row block by one thread while `threads`
// decode, so the set never has to fit in memory (docs/formats.md, the rules in decisions.md).
struct ImageImportOptions {
  std::string folder;               // DIR/<class>/<images>, or
  std::string csv, root;            // a CSV with header path,label; paths relative to root (default: its folder)
  std::string out;                  // OUT.h5
  std::string val_folder, val_out;  // a validation tree of the same classes, or
  double val_fraction = 0;          // a stratified share of the training files ...
  uint64_t seed = 1;                // ... chosen by SplitMix64(seed)
  int size = 256, channels = 3;     // S and C of each row
  int threads = 0;                  // decoders; 0: one per hardware thread
  bool strict = false;              // the first bad file is an error (exit 2); else it is skipped and reported
  bool exif_transpose = false;      // turn JPEGs by their EXIF orientation (torchvision does not)
  bool full_decode = false;         // no DCT-domain downscaling of JPEGs (torchvision's pixels)
  std::string report;               // default: out + ".skipped.txt"
  uint64_t max_pixels = 89478485;   // PIL's Image.MAX_IMAGE_PIXELS
  bool progress = true;             // a line on stderr every 2 s
  std::string store = "raw";        // "raw": /features pixels; "jpeg": each row re-encoded as a JPEG (/jpeg)
  std::optional<int> quality;       // --store jpeg's quality, 1-100 (unset: 90); refused with raw
  std::string direct_io = "auto";  // "auto": raw rows with O_DIRECT where the file system takes it; "off": the page cache
};
struct ImageImportSummary {
  std::vector<std::string> classes;
  int num_classes = 0;
  int64_t train_rows = 0, val_rows = 0;
  int64_t files = 0, skipped = 0, ignored = 0;  // files found; not written (of them, ignored: no image extension)
  int64_t problems = 0;                         // folders reported: empty classes, symlink loops, unreadable
  std::string report;                           // the report's path: one line per file or folder, path TAB reason
  double seconds = 0;
  // The one thread that writes: seconds in HDF5 writes (the final flush and fsync included) and
  // waiting for the decoding threads' rows. Waiting little: the writes set the pace.
  double write_seconds = 0, wait_seconds = 0;
  // Raw rows' bytes written with O_DIRECT and through the page cache (--store jpeg: neither).
  int64_t direct_bytes = 0, cached_bytes = 0;
};
ImageImportSummary import_images(const ImageImportOptions& o);

// `dptrain --predict`: the image files the paths name (a folder: its .jpg, .jpeg and .png files,
// walked recursively without following links, in sorted order); throws InputError for a path
// that does not exist or a folder without images.
std::vector<std::string> list_image_files(const std::vector<std::string>& paths);
// files[begin, end) decoded and brought to channels x side x side uint8 as `dpdata images`
// stores them (shorter side to `side`, center crop): a Dataset of those rows (first_row = begin,
// file_rows = files.size(), labels 0). A file that cannot be decoded leaves zeros and its reason
// in problems[i - begin] ("" for the others).
Dataset predict_images(const std::vector<std::string>& files, int64_t begin, int64_t end, int channels, int side,
                       int num_classes, std::vector<std::string>& problems);

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
  // data.read = stream: rows are read a micro-batch at a time, in the order the rank uses them,
  // by a background thread at most `depth` micro-batches ahead of training (across epoch
  // boundaries, up to the end of epoch epochs - 1), so host memory holds about depth + 2
  // micro-batches whatever the file's size.
  TrainRows(const std::string& path, const RankOrder& o, int depth, int64_t epochs);
  ~TrainRows();
  TrainRows(const TrainRows&) = delete;
  TrainRows& operator=(const TrainRows&) = delete;

  bool sharded() const { return whole_ == nullptr; }
  bool streamed() const { return stream_ != nullptr; }
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
  // Rows read from the file so far (shard, stream), or the file's rows (all).
  int64_t rows_read() const;

  // stream: micro-batch a of step k of epoch e (batch rows in use order, streamed), waiting for
  // the reader if it is behind; a request other than the one after the last (a resume, a
  // restart) starts the reader there. A read error is thrown here. The reference stays valid
  // until the next call.
  const Dataset& micro_batch(int64_t e, int64_t k, int a);
  double waited_s() const;  // stream: seconds micro_batch spent waiting for the reader
  int depth() const;        // stream: micro-batches read ahead

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
  struct Stream;
  std::shared_ptr<Stream> stream_;  // data.read = stream

  Dataset read_epoch(int64_t e) const;
  void prefetch(int64_t e);
};

// Evaluation shard: rank r of W takes rows [r·n/W, (r+1)·n/W) (no row dropped).
inline void eval_shard(int64_t n, int r, int world, int64_t& begin, int64_t& end) {
  begin = n * r / world;
  end = n * (r + 1) / world;
}

}  // namespace dpt
