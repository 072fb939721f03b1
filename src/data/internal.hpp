// What the parts of the data layer (src/data/) share: HDF5 handles, the error for a broken
// dataset file, overflow-checked sizes and the memory cap, and a file opened and checked against
// the layout of DESIGN.md. Private to src/data/.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dpt/data.hpp"
#include "dpt/h5.hpp"

namespace dpt::data_internal {

using Hid = H5Id;

// common.cpp
void quiet_hdf5();
[[noreturn]] void bad(const std::string& path, const std::string& what);
bool mul_ok(uint64_t a, uint64_t b, uint64_t& out);
uint64_t memory_cap();

// An open, checked file: handles stay open so the loader can read what the probe checked.
// A jpeg file (info.encoding == "jpeg") has no /features: /jpeg and /jpeg_offsets instead, the
// offsets read and checked (N + 1 entries, 0 first, nondecreasing, /jpeg's size last).
struct Opened {
  Hid file, features, labels;
  DatasetInfo info;
  Hid jpeg;                          // jpeg: /jpeg, uint8, all rows' bytes
  std::vector<int64_t> jpeg_offsets;  // jpeg: row r's bytes are [off[r], off[r + 1]) of /jpeg
};

// validate.cpp: opens path and checks it against the layout (whole: all of it is to be read).
Opened open_checked(const std::string& path, bool whole = true);

// validate.cpp: checks every way into the layout shares (the HDF5 reader and the importers), so a
// problem reads the same whichever file it came from. `where` names the file and the object
// ("dataset file 'a.h5': /labels", "labels file 'y.npy'"), `row` the row ("row 7", "line 9").
int check_num_classes(const std::string& where, double v);  // v in [1, 1e6], as an int
[[noreturn]] void label_out_of_range(const std::string& where, const std::string& row, int64_t label,
                                     int num_classes);
[[noreturn]] void non_finite_feature(const std::string& where, const std::string& row);
// Refuses a class name holding a line break (CR or LF): checkpoints carry the names as one string,
// one per line (docs/formats.md), so such a name would come back as two. `where` names the source
// of the names ("image folder 'photos'").
void check_class_names(const std::string& where, const std::vector<std::string>& names);
// Refuses a 4-D shape that looks channels-last; `fix` says how to transpose it.
void check_channels_first(const std::string& where, const std::vector<hsize_t>& dims, const std::string& fix);

// reader.cpp: a Dataset with info's shape and no rows yet.
Dataset empty_like(const std::string& path, const DatasetInfo& info);
// reader.cpp: d made empty_like(path, info), keeping its arrays' memory for the next rows.
void reuse_arrays(Dataset& d, const std::string& path, const DatasetInfo& info);
// reader.cpp: /labels whole, checked against num_classes (the first bad row named).
std::vector<int32_t> read_labels(const std::string& path, const Opened& o);
// train_rows.cpp: a new Dataset::version, never 0.
uint64_t next_version();

// raw_rows.cpp: rows read with pread at their byte offsets on several threads (data.read =
// stream), for an uncompressed /features of the stored type, contiguous or in chunks of whole
// rows; ok() is false for any other file, which is read through HDF5. Labels are read (and
// checked) once, whole.
class RawRows {
 public:
  RawRows(const std::string& path, const Opened& o);
  ~RawRows();
  RawRows(const RawRows&) = delete;
  RawRows& operator=(const RawRows&) = delete;
  bool ok() const { return ok_; }
  void advise_random();  // rows will be asked for in a random order: no read-ahead
  // The rows in the order given (repeats allowed), as read_rows gives them, into d: its arrays'
  // memory is reused when it has the size already (no allocation, no page faults per batch).
  void read(const std::vector<int64_t>& rows, int threads, Dataset& d);

 private:
  std::string path_;
  DatasetInfo info_;
  bool ok_ = false;
  int fd_ = -1;
  size_t row_bytes_ = 0;
  haddr_t base_ = HADDR_UNDEF;   // contiguous: the first row's offset
  int64_t per_chunk_ = 0;        // chunked: rows per chunk (0: contiguous)
  hid_t features_ = -1;          // chunked: the open dataset (its owner outlives this)
  std::vector<haddr_t> chunk_addr_;  // chunked: each chunk's offset, looked up when first needed
  std::vector<int32_t> labels_;
  uint64_t offset(int64_t row);
};

// jpeg_rows.cpp: JpegRows is RawRows for a jpeg file (data.read = stream): each row's bytes
// read with pread at their offsets in /jpeg's chunks (or its contiguous storage), decoded on the
// thread that read them. ok() is false for a raw file or a /jpeg with filters or unwritten
// chunks, which read through HDF5 (read_rows).
class JpegRows {
 public:
  JpegRows(const std::string& path, const Opened& o);
  ~JpegRows();
  JpegRows(const JpegRows&) = delete;
  JpegRows& operator=(const JpegRows&) = delete;
  bool ok() const { return ok_; }
  void advise_random();
  // The rows in the order given (repeats allowed), the bytes read_rows gives, into d (its
  // arrays' memory reused); a row that does not decode is an InputError naming it.
  void read(const std::vector<int64_t>& rows, int threads, Dataset& d);
  Dataset read(const std::vector<int64_t>& rows, int threads) {
    Dataset d;
    read(rows, threads, d);
    return d;
  }

 private:
  std::string path_;
  DatasetInfo info_;
  bool ok_ = false;
  int fd_ = -1;
  std::vector<int64_t> off_;       // /jpeg_offsets
  haddr_t base_ = HADDR_UNDEF;     // contiguous: /jpeg's first byte
  uint64_t chunk_ = 0;             // chunked: bytes per chunk (0: contiguous)
  std::vector<haddr_t> chunk_addr_;
  std::vector<int32_t> labels_;
};

// reader.cpp: load_rows on a file already open and checked.
Dataset read_rows(const std::string& path, const Opened& o, const std::vector<int64_t>& rows);

}  // namespace dpt::data_internal
