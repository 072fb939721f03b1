// JpegRows: a jpeg file's rows (dpdata images --store jpeg) for data.read = stream, read as
// RawRows reads /features: each row's bytes with pread at their offset in the file, on several
// threads at once, here decoded on the thread that read them. /jpeg is 1-D bytes in chunks (or
// contiguous) whose file addresses are looked up once; a row's bytes may span two chunks.
// Labels are read once through HDF5 and checked. A /jpeg with filters or unwritten chunks reads
// through HDF5 instead (ok() false).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "dpt/check.hpp"
#include "internal.hpp"
#include "jpeg_codec.hpp"

namespace dpt::data_internal {

JpegRows::JpegRows(const std::string& path, const Opened& o) : path_(path), info_(o.info) {
  if (info_.encoding != "jpeg" || !o.jpeg.ok()) return;
  const hid_t f = o.jpeg.get();
  Hid dcpl(H5Dget_create_plist(f), H5Pclose);
  if (!dcpl.ok() || H5Pget_nfilters(dcpl.get()) != 0) return;
  const uint64_t total = uint64_t(o.jpeg_offsets.back());
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_CONTIGUOUS) {
    base_ = H5Dget_offset(f);
    if (base_ == HADDR_UNDEF && total > 0) return;
  } else if (layout == H5D_CHUNKED) {
    hsize_t chunk = 0;
    if (H5Pget_chunk(dcpl.get(), 1, &chunk) != 1 || chunk == 0) return;
    chunk_ = chunk;
    // Every chunk's address now (dpdata images: one per 8 MiB; 80 us each in HDF5 1.10).
    chunk_addr_.resize(size_t((total + chunk_ - 1) / chunk_));
    for (size_t c = 0; c < chunk_addr_.size(); ++c) {
      hsize_t at = hsize_t(c) * chunk_, size = 0;
      unsigned mask = 0;
      haddr_t addr = HADDR_UNDEF;
      if (H5Dget_chunk_info_by_coord(f, &at, &mask, &addr, &size) < 0 || addr == HADDR_UNDEF) return;
      chunk_addr_[c] = addr;
    }
  } else {
    return;
  }
  off_ = o.jpeg_offsets;
  labels_ = read_labels(path, o);
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ok_ = fd_ >= 0;
}

JpegRows::~JpegRows() {
  if (fd_ >= 0) ::close(fd_);
}

void JpegRows::advise_random() {
  if (fd_ >= 0) (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
}

void JpegRows::read(const std::vector<int64_t>& rows, int threads, Dataset& d) {
  if (!ok_) throw Error("JpegRows::read: '" + path_ + "' is not a jpeg file read by pread");
  reuse_arrays(d, path_, info_);  // everything but the arrays, whose memory d keeps
  d.n = int64_t(rows.size());
  d.file_rows = 0;
  for (int64_t r : rows)
    if (r < 0 || r >= info_.n)
      throw Error("stream: row " + std::to_string(r) + " outside [0, " + std::to_string(info_.n) + ") of " + path_);
  const size_t row_bytes = size_t(info_.dim);
  d.u8.resize(rows.size() * row_bytes);
  d.labels.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) d.labels[i] = labels_[size_t(rows[i])];
  const int c = int(info_.sample_shape[0]), h = int(info_.sample_shape[1]), w = int(info_.sample_shape[2]);
  // Row i by thread i mod T, read then decoded there: T reads in flight.
  const int T = std::max(1, std::min<int>(threads, int(rows.size())));
  std::vector<std::string> errors(static_cast<size_t>(T));
  std::vector<int64_t> bad_at(static_cast<size_t>(T), -1);
  auto work = [&](int t) {
    std::vector<uint8_t> buf;
    for (size_t i = size_t(t); i < rows.size(); i += size_t(T)) {
      const uint64_t a = uint64_t(off_[size_t(rows[i])]), b = uint64_t(off_[size_t(rows[i]) + 1]);
      buf.resize(size_t(b - a));
      for (uint64_t at = a; at < b;) {  // piece by piece: a row may span chunks
        uint64_t file_at, piece;
        if (chunk_ == 0) {
          file_at = uint64_t(base_) + at;
          piece = b - at;
        } else {
          const uint64_t ch = at / chunk_, end = std::min(b, (ch + 1) * chunk_);
          file_at = uint64_t(chunk_addr_[size_t(ch)]) + (at - ch * chunk_);
          piece = end - at;
        }
        const ssize_t got = ::pread(fd_, buf.data() + (at - a), size_t(piece), off_t(file_at));
        if (got <= 0) {
          if (got < 0 && errno == EINTR) continue;
          errors[size_t(t)] = "dataset file '" + path_ + "': /jpeg row " + std::to_string(rows[i]) + ": " +
                              (got < 0 ? std::strerror(errno) : "the file ends before the row does (truncated?)");
          bad_at[size_t(t)] = int64_t(i);
          return;
        }
        at += uint64_t(got);
      }
      const std::string why = image::decode_jpeg_chw(buf.data(), buf.size(), c, h, w, d.u8.data() + i * row_bytes);
      if (!why.empty()) {
        errors[size_t(t)] = "dataset file '" + path_ + "': /jpeg row " + std::to_string(rows[i]) + ": " + why;
        bad_at[size_t(t)] = int64_t(i);
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < T; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& p : pool) p.join();
  int first = -1;  // the error of the earliest row in the order given
  for (int t = 0; t < T; ++t)
    if (bad_at[size_t(t)] >= 0 && (first < 0 || bad_at[size_t(t)] < bad_at[size_t(first)])) first = t;
  if (first >= 0) throw InputError(errors[size_t(first)]);
}

}  // namespace dpt::data_internal
