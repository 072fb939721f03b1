// RawRows: a dataset file's rows read at their byte offsets with pread, on several threads at
// once, for data.read = stream. HDF5 holds one global lock, so its own reads of a micro-batch's
// scattered rows go to the disk one at a time; for an uncompressed /features (contiguous, or in
// chunks of whole rows as dpdata images writes it) the bytes of row r are at a known offset, so
// a pool of threads can keep several reads in flight. Labels are read once through HDF5 and
// checked. Anything else (filters, other types, unallocated chunks) reads through HDF5.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <thread>

#include "dpt/check.hpp"
#include "internal.hpp"

namespace dpt::data_internal {

RawRows::RawRows(const std::string& path, const Opened& o) : path_(path), info_(o.info) {
  const hid_t f = o.features.get();
  Hid dcpl(H5Dget_create_plist(f), H5Pclose), type(H5Dget_type(f), H5Tclose);
  if (!dcpl.ok() || !type.ok() || H5Pget_nfilters(dcpl.get()) != 0) return;
  const bool u8 = info_.feature_type == "uint8";
  // The stored type is the one held in memory, byte for byte (little-endian float32 on x86).
  if (u8 ? H5Tget_size(type.get()) != 1 || H5Tget_class(type.get()) != H5T_INTEGER
         : H5Tequal(type.get(), H5T_IEEE_F32LE) <= 0)
    return;
  row_bytes_ = size_t(info_.dim) * (u8 ? 1 : 4);
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_CONTIGUOUS) {
    base_ = H5Dget_offset(f);
    if (base_ == HADDR_UNDEF) return;
  } else if (layout == H5D_CHUNKED) {
    const int rank = int(info_.sample_shape.size()) + 1;
    std::vector<hsize_t> chunk(static_cast<size_t>(rank));
    if (H5Pget_chunk(dcpl.get(), rank, chunk.data()) != rank) return;
    for (int i = 1; i < rank; ++i)  // whole rows per chunk only
      if (int64_t(chunk[size_t(i)]) != info_.sample_shape[size_t(i - 1)]) return;
    per_chunk_ = int64_t(chunk[0]);
    chunk_addr_.assign(size_t((info_.n + per_chunk_ - 1) / per_chunk_), HADDR_UNDEF);
    features_ = o.features.get();
    // HDF5 1.10 finds a chunk's address in about 80 us (by coordinates; by index it walks the
    // index): a table of up to 2^16 chunks (dpdata images: 8 MiB each) is filled now, a file of
    // more or smaller chunks as rows are first asked for.
    if (chunk_addr_.size() <= (size_t(1) << 16))
      for (size_t c = 0; c < chunk_addr_.size(); ++c) offset(int64_t(c) * per_chunk_);
  } else {
    return;
  }
  // Labels, whole and checked, as load_dataset reads them.
  labels_ = read_labels(path, o);
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ok_ = fd_ >= 0;
}

// Rows read in a shuffled order: the kernel's read-ahead past each row would bring bytes no one
// asked for from the disk.
void RawRows::advise_random() {
  if (fd_ >= 0) (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
}

RawRows::~RawRows() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t RawRows::offset(int64_t row) {
  if (per_chunk_ == 0) return uint64_t(base_) + uint64_t(row) * row_bytes_;
  const size_t c = size_t(row / per_chunk_);
  if (chunk_addr_[c] == HADDR_UNDEF) {
    std::vector<hsize_t> at(info_.sample_shape.size() + 1, 0);
    at[0] = hsize_t(int64_t(c) * per_chunk_);
    unsigned mask = 0;
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0;
    if (H5Dget_chunk_info_by_coord(features_, at.data(), &mask, &addr, &size) < 0 || addr == HADDR_UNDEF)
      bad(path_, "/features: row " + std::to_string(row) + " lies in a chunk that was never written");
    chunk_addr_[c] = addr;
  }
  return uint64_t(chunk_addr_[c]) + uint64_t(row % per_chunk_) * row_bytes_;
}

void RawRows::read(const std::vector<int64_t>& rows, int threads, Dataset& d) {
  reuse_arrays(d, path_, info_);  // everything but the arrays, whose memory d keeps
  d.n = int64_t(rows.size());
  d.file_rows = 0;
  std::vector<uint64_t> at(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {  // chunk addresses through HDF5, on this thread
    if (rows[i] < 0 || rows[i] >= info_.n)
      throw Error("stream: row " + std::to_string(rows[i]) + " outside [0, " + std::to_string(info_.n) + ") of " + path_);
    at[i] = offset(rows[i]);
  }
  char* dst;
  if (d.is_u8) {
    d.u8.resize(rows.size() * row_bytes_);
    dst = reinterpret_cast<char*>(d.u8.data());
  } else {
    d.f32.resize(rows.size() * row_bytes_ / 4);
    dst = reinterpret_cast<char*>(d.f32.data());
  }
  d.labels.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) d.labels[i] = labels_[size_t(rows[i])];
  // Row i by thread i mod T: T reads in flight.
  const int T = std::max(1, std::min<int>(threads, int(rows.size())));
  std::vector<std::string> errors(static_cast<size_t>(T));
  auto work = [&](int t) {
    for (size_t i = size_t(t); i < rows.size(); i += size_t(T)) {
      size_t done = 0;
      while (done < row_bytes_) {
        const ssize_t got = ::pread(fd_, dst + i * row_bytes_ + done, row_bytes_ - done, off_t(at[i] + done));
        if (got <= 0) {
          if (got < 0 && errno == EINTR) continue;
          errors[size_t(t)] = "dataset file '" + path_ + "': /features row " + std::to_string(rows[i]) + ": " +
                              (got < 0 ? std::strerror(errno) : "the file ends before the row does (truncated?)");
          return;
        }
        done += size_t(got);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < T; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& p : pool) p.join();
  for (const std::string& e : errors)
    if (!e.empty()) throw InputError(e);
  if (!d.is_u8)
    for (size_t i = 0; i < d.f32.size(); ++i)
      if (!std::isfinite(d.f32[i]))
        non_finite_feature("dataset file '" + path_ + "': /features", "row " + std::to_string(rows[i / size_t(info_.dim)]));
}

}  // namespace dpt::data_internal
