// dpdata images: file lists (image_list.cpp) decoded by a pool of threads (image_decode.cpp,
// image_pixels.cpp) into rows that one thread writes, in sample order, to a temporary HDF5 file
// renamed into place at the end. HDF5 serialises its calls behind one global lock, so only the
// writer thread calls it; decoders run ahead of it by at most a window of rows, which bounds
// memory whatever the set's size.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <mutex>
#include <set>
#include <thread>

#include "dpt/check.hpp"
#include "image_decode.hpp"
#include "image_list.hpp"
#include "internal.hpp"
#include "jpeg_codec.hpp"

namespace dpt {
using namespace data_internal;
using namespace image;
namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- the output file

Hid made(hid_t id, Hid::Closer close, const std::string& path, const char* what) {
  if (id < 0) throw Error("writing '" + path + "': " + what + ": " + hdf5_error_string());
  return Hid(id, close);
}

// N × C × S × S uint8 in chunks of whole rows (about 8 MiB, a whole number of 4 KiB pages where
// that takes at most 64 MiB: a reader that reads rows at their offsets looks up one chunk address
// per chunk), all N listed rows' chunks allocated when the dataset is made, the extent cut to the
// rows written at the end (files skipped); labels and attributes at the end. Until commit() the
// file is OUT.tmp.<pid>, removed if the object dies first.
// The pixels do not go through HDF5: each block of rows is written with pwrite at its chunk's
// address in the file (H5Dget_chunk_info_by_coord), with O_DIRECT where the file system takes it
// and the block is page-aligned (the disk reads the rows from our memory: no copy into the page
// cache on the one thread that writes, which set the pace on 16 cores), else through the page
// cache. HDF5 never holds those bytes (no chunk cache), so the file is the same as H5Dwrite's.
// --store jpeg: /jpeg instead, 1-D bytes in chunks of 8 MiB (less for a set whose raw pixels
// would take less: `rows` is its number of files) written whole through HDF5 (append_bytes), and
// /jpeg_offsets at the end.
class ImageFile {
 public:
  // `out`: o.out or o.val_out; channels, size, --store, --quality and --direct-io from `o`.
  ImageFile(const std::string& out, const ImageImportOptions& o, size_t rows)
      : out_(out), tmp_(out + ".tmp." + std::to_string(getpid())), jpeg_(o.store == "jpeg"), c_(o.channels),
        s_(o.size), quality_(o.quality.value_or(90)) {
    row_ = hsize_t(c_) * hsize_t(s_) * hsize_t(s_);
    jpeg_chunk_ = std::clamp<hsize_t>(hsize_t(rows) * row_, hsize_t(64) << 10, hsize_t(8) << 20);
    quiet_hdf5();
    // Objects of 64 KiB and more (the raw chunks) start on a 4 KiB page: the direct writes' unit.
    Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    if (!fapl.ok() || H5Pset_alignment(fapl.get(), hsize_t(64) << 10, 4096) < 0)
      throw Error("writing '" + out_ + "': file properties: " + hdf5_error_string());
    file_ = Hid(H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
    if (!file_.ok())
      throw InputError("cannot create '" + tmp_ + "' (does the folder exist and is it writable?): " +
                       hdf5_error_string());
    chunk_rows_ = chunk_rows(row_);
    const hsize_t dims[4] = {jpeg_ ? 0 : hsize_t(rows), hsize_t(c_), hsize_t(s_), hsize_t(s_)};
    const hsize_t max[4] = {H5S_UNLIMITED, dims[1], dims[2], dims[3]};
    const hsize_t chunk[4] = {chunk_rows_, dims[1], dims[2], dims[3]};
    Hid space = made(H5Screate_simple(4, dims, max), H5Sclose, out_, "features space");
    Hid dcpl = made(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, out_, "properties");
    if (H5Pset_chunk(dcpl.get(), 4, chunk) < 0 || H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER) < 0 ||
        (!jpeg_ && H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY) < 0))
      throw Error("writing '" + out_ + "': chunk properties: " + hdf5_error_string());
    // No chunk cache: /jpeg's whole chunks go straight from the buffer to the file, and HDF5
    // never holds a copy of /features' chunks, which are written beside it (put()).
    Hid dapl = made(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose, out_, "access properties");
    if (H5Pset_chunk_cache(dapl.get(), 0, 0, 1.0) < 0)
      throw Error("writing '" + out_ + "': chunk cache: " + hdf5_error_string());
    if (jpeg_) {  // no filters: a reader finds a row's bytes at its offset in a chunk
      const hsize_t zero = 0, unlimited = H5S_UNLIMITED;
      space = made(H5Screate_simple(1, &zero, &unlimited), H5Sclose, out_, "jpeg space");
      dcpl = made(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, out_, "properties");
      if (H5Pset_chunk(dcpl.get(), 1, &jpeg_chunk_) < 0 || H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER) < 0)
        throw Error("writing '" + out_ + "': chunk properties: " + hdf5_error_string());
      feat_ = made(H5Dcreate2(file_.get(), "jpeg", H5T_STD_U8LE, space.get(), H5P_DEFAULT, dcpl.get(), dapl.get()),
                   H5Dclose, out_, "/jpeg");
      offsets_.push_back(0);
    } else {
      feat_ = made(H5Dcreate2(file_.get(), "features", H5T_STD_U8LE, space.get(), H5P_DEFAULT, dcpl.get(), dapl.get()),
                   H5Dclose, out_, "/features");
      for (hsize_t r = 0; r < hsize_t(rows); r += chunk_rows_) {
        const hsize_t at[4] = {r, 0, 0, 0};
        haddr_t addr = HADDR_UNDEF;
        if (H5Dget_chunk_info_by_coord(feat_.get(), at, nullptr, &addr, nullptr) < 0 || addr == HADDR_UNDEF)
          throw Error("writing '" + out_ + "': the address of /features' chunk at row " + std::to_string(r) + ": " +
                      hdf5_error_string());
        chunk_at_.push_back(off_t(addr));
      }
      listed_ = hsize_t(rows);
      if (o.direct_io == "auto") direct_fd_ = ::open(tmp_.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);  // -1 where not taken: the cache
    }
    // Written pages start for the disk as they are written (below), so the fsync at the end
    // waits for the last few hundred MiB rather than the whole file.
    sync_fd_ = ::open(tmp_.c_str(), O_RDWR | O_CLOEXEC);
    if (sync_fd_ < 0) throw InputError("cannot open '" + tmp_ + "' for writing: " + std::strerror(errno));
    dims_[1] = dims[1];
    dims_[2] = dims[2];
    dims_[3] = dims[3];
  }
  ImageFile(const ImageFile&) = delete;
  ImageFile& operator=(const ImageFile&) = delete;
  ~ImageFile() {
    if (sync_fd_ >= 0) ::close(sync_fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
    if (committed_) return;
    feat_.reset();
    file_.reset();
    std::remove(tmp_.c_str());
  }

  int64_t rows() const { return int64_t(dims_[0]); }
  // Raw rows' bytes written so far with O_DIRECT and through the page cache.
  int64_t direct_bytes() const { return direct_bytes_; }
  int64_t cached_bytes() const { return cached_bytes_; }

  // jpeg: the next rows' JPEG bytes; `sizes` their lengths. Whole chunks are written as they
  // fill (the rest waits in pending_), the last partial one at finish().
  void append_bytes(const std::vector<uint8_t>& bytes, const std::vector<uint64_t>& sizes) {
    for (uint64_t n : sizes) offsets_.push_back(offsets_.back() + int64_t(n));
    pending_.insert(pending_.end(), bytes.begin(), bytes.end());
    const size_t whole = pending_.size() / jpeg_chunk_ * jpeg_chunk_;
    if (whole == 0) return;
    write_bytes(pending_.data(), whole);
    pending_.erase(pending_.begin(), pending_.begin() + std::ptrdiff_t(whole));
  }

  // Rows of a block: `chunk_rows()` of them, whose buffer is 4 KiB-aligned, go straight to the disk.
  hsize_t chunk_rows() const { return chunk_rows_; }

  // The next `count` rows (their buffer aligned to 4 KiB for the direct path), at their chunks'
  // places in the file.
  void append(const uint8_t* rows, hsize_t count) {
    while (count > 0) {
      const hsize_t c = dims_[0] / chunk_rows_, in = dims_[0] - c * chunk_rows_;
      const hsize_t n = std::min(count, chunk_rows_ - in);
      if (c >= chunk_at_.size()) throw Error("writing '" + out_ + "': more rows than files listed");
      put(rows, size_t(n * row_), chunk_at_[c] + off_t(in * row_));
      dims_[0] += n;
      rows += n * row_;
      count -= n;
    }
  }

  // Labels, attributes, flush and fsync: after this the file is whole under its temporary name.
  void finish(const std::vector<int32_t>& labels, int num_classes, const std::vector<std::string>& names) {
    if (jpeg_) finish_jpeg();
    // Files skipped: the extent to the rows written (the chunks past it freed, the last one's
    // rows past it filled with zeros by HDF5).
    else if (dims_[0] < listed_ && H5Dset_extent(feat_.get(), dims_) < 0)
      throw Error("writing '" + out_ + "': the extent of /features: " + hdf5_error_string());
    const float scale = 1.f / 255.f, offset = 0.f;
    scalar_attr(feat_.get(), "scale", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, &scale);
    scalar_attr(feat_.get(), "offset", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, &offset);
    const hsize_t n = labels.size();
    Hid lspace = made(H5Screate_simple(1, &n, nullptr), H5Sclose, out_, "labels space");
    Hid lab = made(H5Dcreate2(file_.get(), "labels", H5T_STD_I32LE, lspace.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                   H5Dclose, out_, "/labels");
    if (H5Dwrite(lab.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()) < 0)
      throw Error("writing '" + out_ + "': /labels: " + hdf5_error_string());
    const int32_t nc = num_classes;
    scalar_attr(file_.get(), "num_classes", H5T_STD_I32LE, H5T_NATIVE_INT32, &nc);
    if (!names.empty()) class_names(names);
    lab.reset();
    feat_.reset();
    if (H5Fflush(file_.get(), H5F_SCOPE_GLOBAL) < 0 || file_.close() < 0)
      throw Error("writing '" + out_ + "': flush: " + hdf5_error_string());
    const bool synced = fsync(sync_fd_) == 0;
    if (!synced) throw Error("writing '" + out_ + "': fsync: " + std::strerror(errno));
  }

  void finish_jpeg() {
    if (!pending_.empty()) write_bytes(pending_.data(), pending_.size());
    pending_.clear();
    const hsize_t n = offsets_.size(), three = 3;
    Hid ospace = made(H5Screate_simple(1, &n, nullptr), H5Sclose, out_, "jpeg_offsets space");
    Hid off = made(H5Dcreate2(file_.get(), "jpeg_offsets", H5T_STD_I64LE, ospace.get(), H5P_DEFAULT, H5P_DEFAULT,
                              H5P_DEFAULT), H5Dclose, out_, "/jpeg_offsets");
    if (H5Dwrite(off.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets_.data()) < 0)
      throw Error("writing '" + out_ + "': /jpeg_offsets: " + hdf5_error_string());
    const int64_t shape[3] = {c_, s_, s_};
    Hid sspace = made(H5Screate_simple(1, &three, nullptr), H5Sclose, out_, "shape space");
    Hid a = made(H5Acreate2(feat_.get(), "shape", H5T_STD_I64LE, sspace.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                 out_, "shape");
    if (H5Awrite(a.get(), H5T_NATIVE_INT64, shape) < 0) throw Error("writing '" + out_ + "': attribute shape");
    scalar_attr(feat_.get(), "quality", H5T_STD_I32LE, H5T_NATIVE_INT32, &quality_);
  }

  void commit() {
    if (std::rename(tmp_.c_str(), out_.c_str()) != 0)
      throw Error("writing '" + out_ + "': rename from " + tmp_ + ": " + std::strerror(errno));
    committed_ = true;
  }

 private:
  std::string out_, tmp_;
  bool jpeg_ = false;
  int c_ = 0, s_ = 0;
  int32_t quality_ = 0;           // jpeg: recorded as /jpeg's attribute quality
  std::vector<int64_t> offsets_;  // jpeg: N + 1 so far
  std::vector<uint8_t> pending_;  // jpeg: bytes short of a whole chunk
  hsize_t jpeg_size_ = 0;         // jpeg: bytes in /jpeg
  hsize_t jpeg_chunk_ = 0;        // jpeg: bytes per chunk
  hsize_t row_ = 0, dims_[4] = {0, 0, 0, 0};
  Hid file_, feat_;
  bool committed_ = false;
  int sync_fd_ = -1;       // the file through the page cache
  int direct_fd_ = -1;     // the file with O_DIRECT; -1: not asked for, not taken by its file system, or given up
  int64_t direct_bytes_ = 0, cached_bytes_ = 0;
  hsize_t chunk_rows_ = 1;
  std::vector<off_t> chunk_at_;  // raw: each chunk's address in the file
  hsize_t listed_ = 0;           // raw: rows allocated, one per file listed
  hsize_t unsynced_ = 0;  // bytes written since the last writeback started

  // Rows per chunk: about 8 MiB, rounded down to a whole number of 4 KiB pages where that takes
  // at most 64 MiB (the direct path's unit), at least one row.
  static hsize_t chunk_rows(hsize_t row) {
    const hsize_t rows = std::max<hsize_t>(1, (hsize_t(8) << 20) / row);
    const hsize_t page = 4096 / std::gcd(row, hsize_t(4096));  // rows to a whole number of pages
    if (page * row > (hsize_t(64) << 20)) return rows;
    return std::max(page, rows / page * page);
  }

  // n bytes at the file offset: straight to the disk where the buffer, offset and length are
  // page-aligned and the file system takes O_DIRECT, else through the page cache.
  void put(const uint8_t* p, size_t n, off_t at) {
    const bool aligned = (reinterpret_cast<uintptr_t>(p) | size_t(at) | n) % 4096 == 0;
    if (direct_fd_ >= 0 && aligned) {
      if (pwrite_all(direct_fd_, p, n, at)) {
        direct_bytes_ += n;
        return;
      }
      if (errno != EINVAL) throw Error("writing '" + out_ + "': " + std::strerror(errno));
      ::close(direct_fd_);  // O_DIRECT opened but refused at write time: the page cache from now on
      direct_fd_ = -1;
    }
    if (!pwrite_all(sync_fd_, p, n, at)) throw Error("writing '" + out_ + "': " + std::strerror(errno));
    cached_bytes_ += n;
    written(n);
  }

  static bool pwrite_all(int fd, const uint8_t* p, size_t n, off_t at) {
    while (n > 0) {
      const ssize_t w = ::pwrite(fd, p, n, at);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        if (w == 0) errno = EIO;
        return false;
      }
      p += w;
      n -= size_t(w);
      at += off_t(w);
    }
    return true;
  }

  void write_bytes(const uint8_t* p, size_t count) {
    const hsize_t start = jpeg_size_, size = count;
    jpeg_size_ += count;
    if (H5Dset_extent(feat_.get(), &jpeg_size_) < 0) throw Error("writing '" + out_ + "': extend /jpeg: " + hdf5_error_string());
    Hid fspace = made(H5Dget_space(feat_.get()), H5Sclose, out_, "jpeg space");
    Hid mspace = made(H5Screate_simple(1, &size, nullptr), H5Sclose, out_, "memory space");
    if (H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &size, nullptr) < 0 ||
        H5Dwrite(feat_.get(), H5T_NATIVE_UINT8, mspace.get(), fspace.get(), H5P_DEFAULT, p) < 0)
      throw Error("writing '" + out_ + "': /jpeg bytes: " + hdf5_error_string());
    written(count);
  }

  void written(hsize_t bytes) {
    unsynced_ += bytes;
    if (sync_fd_ >= 0 && unsynced_ >= (hsize_t(256) << 20)) {
      // Starts the writeback of what is written so far without waiting for it (a hint: errors
      // surface at the fsync).
      (void)sync_file_range(sync_fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
      unsynced_ = 0;
    }
  }

  void scalar_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* v) {
    Hid space = made(H5Screate(H5S_SCALAR), H5Sclose, out_, name);
    Hid a = made(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose, out_, name);
    if (H5Awrite(a.get(), mem_type, v) < 0) throw Error("writing '" + out_ + "': attribute " + name);
  }

  // Variable-length UTF-8 strings, as writer.cpp writes them (h5py reads a list of str).
  void class_names(const std::vector<std::string>& names) {
    std::vector<const char*> ptrs;
    for (const std::string& s : names) ptrs.push_back(s.c_str());
    const hsize_t count = ptrs.size();
    Hid type = made(H5Tcopy(H5T_C_S1), H5Tclose, out_, "class_names type");
    if (H5Tset_size(type.get(), H5T_VARIABLE) < 0 || H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0)
      throw Error("writing '" + out_ + "': class_names type");
    Hid space = made(H5Screate_simple(1, &count, nullptr), H5Sclose, out_, "class_names space");
    Hid a = made(H5Acreate2(file_.get(), "class_names", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                 out_, "class_names");
    if (H5Awrite(a.get(), type.get(), ptrs.data()) < 0) throw Error("writing '" + out_ + "': attribute class_names");
  }
};

// ---------------------------------------------------------------- interruption

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_interrupt(int) { g_interrupted = 1; }

// SIGINT and SIGTERM stop the import between rows (the temporary files are then removed); the
// previous handlers come back when it ends.
class InterruptGuard {
 public:
  InterruptGuard() {
    g_interrupted = 0;
    int_ = std::signal(SIGINT, on_interrupt);
    term_ = std::signal(SIGTERM, on_interrupt);
  }
  ~InterruptGuard() {
    std::signal(SIGINT, int_);
    std::signal(SIGTERM, term_);
  }

 private:
  void (*int_)(int);
  void (*term_)(int);
};

void check_interrupt() {
  if (g_interrupted) throw Error("interrupted: no output written", 128 + SIGINT);
}

// ---------------------------------------------------------------- progress

class Progress {
 public:
  Progress(int64_t total, bool on) : total_(total), on_(on), t0_(Clock::now()), last_(t0_) {}
  void tick() {
    ++done_;
    const auto now = Clock::now();
    if (!on_ || now - last_ < std::chrono::seconds(2)) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - t0_).count(), rate = double(done_) / s;
    std::fprintf(stderr, "images: %lld/%lld (%d%%) %.0f img/s, ETA %.0f s\n", (long long)done_, (long long)total_,
                 int(100 * done_ / std::max<int64_t>(total_, 1)), rate, double(total_ - done_) / rate);
  }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

 private:
  int64_t total_, done_ = 0;
  bool on_;
  Clock::time_point t0_, last_;
};

// ---------------------------------------------------------------- decoding pool

// A sample's outcome; its pixels are in the pool's ring (DecodePool::row).
struct Slot {
  std::string why;            // non-empty: the file is skipped, for this reason
  std::vector<uint8_t> jpeg;  // --store jpeg: the row re-encoded
  bool ready = false;
};

// Decoders take sample indices in order and write each row's pixels straight into a ring of
// `blocks` write blocks of `block_rows` rows, at most the ring ahead of the writer, which takes
// outcomes in sample order and writes whole blocks from the ring (no copy of its own): the
// output does not depend on the thread count, and the one thread that may call HDF5 does
// nothing else.
class DecodePool {
 public:
  DecodePool(const std::vector<Sample>& samples, const ImageImportOptions& o, int threads, size_t row_bytes,
             size_t block_rows, size_t blocks)
      : samples_(samples), o_(o), row_(row_bytes), window_(block_rows * blocks), slots_(window_) {
    // Page-aligned, for the direct writes; not zeroed: every byte is written before it is read.
    const size_t bytes = (window_ * row_ + 4095) / 4096 * 4096;
    ring_.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes)));
    if (!ring_) throw Error("cannot allocate " + std::to_string(bytes >> 20) + " MiB for decoded rows");
    for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { work(); });
  }
  ~DecodePool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // Sample i's pixels (once take(i) has returned them, until release passes i).
  uint8_t* row(size_t i) { return ring_.get() + (i % window_) * row_; }

  // Sample i's outcome, waiting for it; `waited` gains the seconds spent waiting.
  Slot take(size_t i, double& waited) {
    std::unique_lock<std::mutex> lk(m_);
    Slot& s = slots_[i % window_];
    if (!s.ready) {
      const auto t0 = Clock::now();
      while (!s.ready) {
        done_.wait_for(lk, std::chrono::milliseconds(200));
        check_interrupt();
      }
      waited += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    Slot out = std::move(s);
    s = Slot();
    return out;
  }

  // Samples below `end` are written: their places in the ring go to later samples.
  void release(size_t end) {
    {
      std::lock_guard<std::mutex> lk(m_);
      base_ = end;
    }
    wake_.notify_all();
  }

 private:
  const std::vector<Sample>& samples_;
  const ImageImportOptions& o_;
  size_t row_, window_;
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> ring_;
  std::vector<Slot> slots_;
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable wake_, done_;
  size_t next_ = 0, base_ = 0;
  bool stop_ = false;

  void work() {
    for (;;) {
      size_t i;
      {
        std::unique_lock<std::mutex> lk(m_);
        wake_.wait(lk, [&] { return stop_ || next_ >= samples_.size() || next_ < base_ + window_; });
        if (stop_ || next_ >= samples_.size()) return;
        i = next_++;
      }
      Slot s;
      decode_row(samples_[i].path, row(i), s);
      {
        std::lock_guard<std::mutex> lk(m_);
        s.ready = true;
        slots_[i % window_] = std::move(s);
      }
      done_.notify_one();
    }
  }

  void decode_row(const std::string& path, uint8_t* row, Slot& s) const {
    try {
      DecodeOptions d;
      d.min_short = o_.full_decode ? 0 : o_.size;
      d.exif_transpose = o_.exif_transpose;
      d.max_pixels = o_.max_pixels;
      thread_local Image img;  // its buffer kept from one image to the next
      s.why = decode_file(path, d, img);
      if (!s.why.empty()) return;
      if (o_.channels == 1 && img.c == 3) img = to_gray(img);
      const size_t plane = size_t(o_.size) * size_t(o_.size);
      resize_crop_chw(img, o_.size, row);
      if (o_.channels == 3 && img.c == 1)  // gray to RGB: every channel the gray (PIL's convert('RGB'))
        for (int ch = 1; ch < 3; ++ch) std::memcpy(row + plane * size_t(ch), row, plane);
      if (o_.store == "jpeg")  // here, on the decoding threads: the writer only copies bytes
        encode_jpeg_chw(row, o_.channels, o_.size, o_.size, o_.quality.value_or(90), s.jpeg);
    } catch (const std::exception& e) {
      s.why = std::string("cannot decode: ") + e.what();
    }
  }
};

struct Output {
  std::vector<Sample> samples;
  std::string path;
  int64_t rows = 0;
};

// Where the one writing thread's time went.
struct WriterTime {
  double waited = 0;   // for decoded rows
  double written = 0;  // in HDF5 writes, the finish and its fsync included
};

// Rows the writer takes at a time: the file's chunk (raw), or about 8 MiB of decoded rows (jpeg).
size_t rows_per_block(const ImageImportOptions& o, size_t row, const ImageFile& file) {
  return o.store == "jpeg" ? std::max<size_t>(1, (size_t(8) << 20) / row) : size_t(file.chunk_rows());
}

// Decodes and writes one output's samples; skipped files are appended to `skipped`.
void write_output(Output& out, const ImageImportOptions& o, int threads, int num_classes,
                  const std::vector<std::string>& names, std::vector<Skip>& skipped, Progress& progress,
                  ImageFile& file, WriterTime& time) {
  const size_t row = size_t(o.channels) * size_t(o.size) * size_t(o.size);
  const bool jpeg = o.store == "jpeg";
  const size_t block_rows = rows_per_block(o, row, file);  // raw: a chunk a write
  // Blocks enough that every decoder has rows ahead while one block is written, and at least 3.
  const size_t blocks = std::max<size_t>(3, (size_t(threads) * 8 + 32 + block_rows - 1) / block_rows + 1);
  std::vector<int32_t> labels;
  std::vector<uint8_t> bytes;   // jpeg: the block's rows' bytes (append_bytes keeps them to a whole chunk)
  std::vector<uint64_t> sizes;  // jpeg: each row's bytes in `bytes`
  auto timed = [&](auto&& write) {
    const auto t0 = Clock::now();
    write();
    time.written += std::chrono::duration<double>(Clock::now() - t0).count();
  };
  DecodePool pool(out.samples, o, threads, row, block_rows, blocks);
  const size_t n = out.samples.size();
  for (size_t begin = 0; begin < n; begin += block_rows) {
    const size_t end = std::min(n, begin + block_rows);
    uint8_t* const block = pool.row(begin);  // the ring's block: rows begin..end-1 in order
    size_t kept = 0;
    for (size_t i = begin; i < end; ++i) {
      check_interrupt();
      Slot s = pool.take(i, time.waited);
      progress.tick();
      if (!s.why.empty()) {
        if (o.strict) throw InputError("'" + printable(out.samples[i].path) + "': " + s.why + " (--strict)");
        skipped.push_back({out.samples[i].path, s.why});
        continue;
      }
      labels.push_back(out.samples[i].label);
      if (jpeg) {
        bytes.insert(bytes.end(), s.jpeg.begin(), s.jpeg.end());
        sizes.push_back(s.jpeg.size());
      } else if (kept++ != i - begin) {  // a skipped file before it in the block: close the gap
        std::memmove(block + (kept - 1) * row, pool.row(i), row);
      }
    }
    if (jpeg && !sizes.empty()) {
      timed([&] { file.append_bytes(bytes, sizes); });
      bytes.clear();
      sizes.clear();
    } else if (!jpeg && kept > 0) {
      timed([&] { file.append(block, kept); });
    }
    pool.release(end);
  }
  out.rows = int64_t(labels.size());
  if (out.rows > 0) timed([&] { file.finish(labels, num_classes, names); });
}

void check_options(const ImageImportOptions& o) {
  if (o.folder.empty() == o.csv.empty()) throw InputError("give one of --folder DIR or --csv FILE");
  if (!o.root.empty() && o.csv.empty()) throw InputError("--root goes with --csv");
  if (o.out.empty()) throw InputError("--out OUT.h5 is required");
  if (o.size < 1 || o.size > 8192) throw InputError("--size " + std::to_string(o.size) + " is outside [1, 8192]");
  if (o.channels != 1 && o.channels != 3) throw InputError("--channels must be 3 (RGB) or 1 (gray)");
  if (o.threads < 0 || o.threads > 1024) throw InputError("--threads must be in [0, 1024] (0: one per core)");
  if (o.max_pixels < 1) throw InputError("--max-pixels must be at least 1");
  if (o.store != "raw" && o.store != "jpeg")
    throw InputError("--store must be raw (pixels, the default) or jpeg (each image re-encoded as a JPEG), not '" +
                     o.store + "'");
  if (o.direct_io != "auto" && o.direct_io != "off")
    throw InputError("--direct-io must be auto or off, not '" + o.direct_io + "'");
  if (o.quality && o.store != "jpeg")
    throw InputError("--quality goes with --store jpeg (--store raw keeps the pixels exactly)");
  if (o.quality && (*o.quality < 1 || *o.quality > 100))
    throw InputError("--quality " + std::to_string(*o.quality) + " is outside [1, 100]");
  const bool frac = o.val_fraction != 0, vfold = !o.val_folder.empty();
  if (frac && vfold) throw InputError("give --val-fraction or --val-folder, not both");
  if (frac && !(o.val_fraction > 0 && o.val_fraction < 1))
    throw InputError("--val-fraction must be in (0, 1), e.g. 0.1");
  if ((frac || vfold) != !o.val_out.empty())
    throw InputError(o.val_out.empty() ? "--val-fraction and --val-folder need --val-out VAL.h5"
                                       : "--val-out needs --val-fraction F or --val-folder DIR");
  if (!o.val_out.empty() && o.val_out == o.out) throw InputError("--val-out and --out name the same file");
}

// The validation tree must hold the training tree's classes, no more, no fewer: a class index
// means the same class in both files.
void check_same_classes(const std::vector<std::string>& train, const std::vector<std::string>& val,
                        const std::string& val_folder) {
  const std::set<std::string> a(train.begin(), train.end()), b(val.begin(), val.end());
  std::string missing, extra;
  for (const std::string& c : a)
    if (!b.count(c)) missing += (missing.empty() ? "'" : ", '") + c + "'";
  for (const std::string& c : b)
    if (!a.count(c)) extra += (extra.empty() ? "'" : ", '") + c + "'";
  if (missing.empty() && extra.empty()) return;
  std::string msg = "--val-folder '" + printable(val_folder) + "' has other classes than --folder:";
  if (!missing.empty()) msg += " missing " + missing;
  if (!extra.empty()) msg += std::string(missing.empty() ? "" : ";") + " extra " + extra;
  throw InputError(msg + " (class indices would differ between the files)");
}

void write_report(const std::string& path, const std::vector<Skip>& skipped) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  for (const Skip& s : skipped) f << printable(s.path) << '\t' << s.reason << '\n';
  if (!f) throw Error("cannot write the report '" + path + "'");
}

}  // namespace

ImageImportSummary import_images(const ImageImportOptions& o) {
  check_options(o);
  keep_buffers_on_heap();
  Listing all = o.folder.empty() ? list_csv(o.csv, o.root) : list_folder(o.folder);
  ImageImportSummary sum;
  sum.classes = all.classes;
  sum.num_classes = int(all.classes.size());
  const bool named = std::any_of(all.classes.begin(), all.classes.end(), [](auto& c) { return !c.empty(); });
  const std::vector<std::string> names = named ? all.classes : std::vector<std::string>();
  Output train{{}, o.out}, val{{}, o.val_out};
  if (!o.val_folder.empty()) {
    Listing v = list_folder(o.val_folder);
    check_same_classes(all.classes, v.classes, o.val_folder);
    val.samples = std::move(v.samples);
    all.skipped.insert(all.skipped.end(), v.skipped.begin(), v.skipped.end());
    train.samples = std::move(all.samples);
  } else if (o.val_fraction > 0) {
    split_val(all.samples, sum.num_classes, o.val_fraction, o.seed, train.samples, val.samples);
  } else {
    train.samples = std::move(all.samples);
  }
  std::vector<Skip>& skipped = all.skipped;
  for (const Skip& s : skipped)
    if (o.strict && !s.ignored) throw InputError("'" + printable(s.path) + "': " + s.reason + " (--strict)");
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  sum.files = int64_t(train.samples.size() + val.samples.size());
  const size_t listed_skips = skipped.size();
  InterruptGuard guard;
  Progress progress(sum.files, o.progress);
  ImageFile train_file(o.out, o, train.samples.size());
  std::unique_ptr<ImageFile> val_file;
  if (!o.val_out.empty()) val_file = std::make_unique<ImageFile>(o.val_out, o, val.samples.size());
  WriterTime time;
  write_output(train, o, threads, sum.num_classes, names, skipped, progress, train_file, time);
  if (val_file) write_output(val, o, threads, sum.num_classes, names, skipped, progress, *val_file, time);
  sum.write_seconds = time.written;
  sum.wait_seconds = time.waited;
  for (const ImageFile* f : {&train_file, val_file.get()}) {
    if (!f) continue;
    sum.direct_bytes += f->direct_bytes();
    sum.cached_bytes += f->cached_bytes();
  }
  sum.report = o.report.empty() ? o.out + ".skipped.txt" : o.report;
  write_report(sum.report, skipped);
  for (const Skip& s : skipped) sum.ignored += s.ignored;
  sum.skipped = int64_t(skipped.size() - listed_skips) + sum.ignored;  // files not written
  sum.problems = int64_t(listed_skips) - sum.ignored;                   // folders: empty, looping, unreadable
  sum.files += sum.ignored;
  if (train.rows == 0)
    throw InputError("no image could be read for '" + o.out + "' (" + std::to_string(train.samples.size()) +
                     " image files listed; reasons in " + sum.report + "); nothing written");
  if (val_file && val.rows == 0)
    throw InputError("no image could be read for --val-out '" + o.val_out + "' (" +
                     std::to_string(val.samples.size()) + " image files; reasons in " + sum.report +
                     "); nothing written");
  train_file.commit();
  if (val_file) val_file->commit();
  sum.train_rows = train.rows;
  sum.val_rows = val.rows;
  sum.seconds = progress.seconds();
  return sum;
}

}  // namespace dpt
