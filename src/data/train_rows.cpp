// TrainRows: one rank's training rows, either a view of a dataset held whole or read from the
// file epoch by epoch (only this rank's rows, in use order), the next epoch read ahead on a thread.
#include "internal.hpp"

#include <atomic>
#include <exception>
#include <memory>
#include <thread>
#include <utility>

#include "dpt/check.hpp"

namespace dpt {
using namespace data_internal;

namespace {
uint64_t next_version() {
  static std::atomic<uint64_t> v{0};
  return ++v;
}
}  // namespace

struct TrainRows::Pending {
  int64_t epoch = -1;
  Dataset data;
  std::exception_ptr error;
  std::thread thread;
  ~Pending() {
    if (thread.joinable()) thread.join();
  }
};

TrainRows::TrainRows(const Dataset& whole, const RankOrder& o) : whole_(&whole), path_(whole.path), order_(o) {
  info_.n = whole.n;
  info_.dim = whole.dim;
  info_.sample_shape = whole.sample_shape;
  info_.num_classes = whole.num_classes;
  info_.feature_type = whole.is_u8 ? "uint8" : "float32";
  info_.scale = whole.scale;
  info_.offset = whole.offset;
}

TrainRows::TrainRows(const std::string& path, const RankOrder& o) : path_(path), order_(o) {
  info_ = open_checked(path, /*whole=*/false).info;  // the header only; rows are read per epoch
  // The rows themselves need not fit, but every epoch's order and index (8 bytes a row each) do.
  uint64_t order_bytes = 0;
  if (!mul_ok(uint64_t(info_.n), 16, order_bytes) || order_bytes > memory_cap())
    bad(path, "/features: " + std::to_string(info_.n) + " rows: the epoch order alone needs " +
                  std::to_string(order_bytes >> 20) + " MiB, over the memory limit of " +
                  std::to_string(memory_cap() >> 20) + " MiB");
  cur_ = empty_like(path, info_);
}

TrainRows::~TrainRows() = default;

// Epoch e's rows for this rank, in the order it uses them.
Dataset TrainRows::read_epoch(int64_t e) const {
  const std::vector<int64_t> order = epoch_order(info_.n, order_.shuffle, order_.seed, e);
  std::vector<int64_t> rows = rank_positions(info_.n, order_);
  for (int64_t& p : rows) p = order[size_t(p)];
  return load_rows(path_, rows);
}

void TrainRows::prefetch(int64_t e) {
  next_ = std::make_unique<Pending>();
  Pending* p = next_.get();
  p->epoch = e;
  p->thread = std::thread([this, p] {
    try {
      p->data = read_epoch(p->epoch);
    } catch (...) {
      p->error = std::current_exception();
    }
  });
}

std::vector<int64_t> TrainRows::start_epoch(int64_t e, bool read_next) {
  if (whole_) return epoch_order(info_.n, order_.shuffle, order_.seed, e);
  // Without shuffling every epoch uses the same rows: the first read serves them all.
  if (cur_epoch_ < 0 || (order_.shuffle && cur_epoch_ != e)) {
    Dataset d;
    std::unique_ptr<Pending> ahead = std::move(next_);  // joined when it goes out of scope
    if (ahead && ahead->epoch == e) {
      ahead->thread.join();
      if (ahead->error) std::rethrow_exception(ahead->error);
      d = std::move(ahead->data);
    } else {
      ahead.reset();  // read ahead for another epoch (a resume): read this one now
      d = read_epoch(e);
    }
    rows_read_ += d.n;
    d.first_row = 0;
    d.file_rows = 0;  // rows of this rank's epoch, not a slice of the file
    d.version = next_version();
    cur_ = std::move(d);
    cur_epoch_ = e;
    if (order_.shuffle && read_next) prefetch(e + 1);
  }
  std::vector<int64_t> index(size_t(info_.n), 0);
  const std::vector<int64_t> pos = rank_positions(info_.n, order_);
  for (size_t i = 0; i < pos.size(); ++i) index[size_t(pos[i])] = int64_t(i);
  return index;
}

}  // namespace dpt
