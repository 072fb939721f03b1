// TrainRows: one rank's training rows, either a view of a dataset held whole, read from the file
// epoch by epoch (only this rank's rows, in use order; the next epoch read ahead on a thread), or
// streamed a micro-batch at a time (data.read = stream).
#include "internal.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "dpt/check.hpp"
#include "dpt/log.hpp"

namespace dpt {
using namespace data_internal;

uint64_t data_internal::next_version() {
  static std::atomic<uint64_t> v{0};
  return ++v;
}

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
  info_.class_names = whole.class_names;
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
  if (stream_) return std::vector<int64_t>(size_t(info_.n), 0);  // rows come with micro_batch
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

// ---- data.read = stream ----
// Rows read a micro-batch at a time, in the order the rank uses them, by a background thread
// that stays at most `depth` micro-batches ahead of training. The rows of micro-batch a of step
// k of epoch e are positions batch_offset(k, a, r, ...) + [0, b) of epoch e's order, the rows
// data.read = all gathers, so the two train alike bit for bit. HDF5 (thread-safe as Debian
// builds it) serialises the reader's calls with any other thread's.

struct TrainRows::Stream {
  struct Item {
    int64_t e, k;
    int a;
    Dataset rows;
  };
  int depth = 8;
  int64_t epochs = 1;
  Opened file;
  std::unique_ptr<RawRows> raw;  // pread on several threads where the file allows it
  std::unique_ptr<JpegRows> jpeg;  // the same for a jpeg file, each row decoded where it was read
  int io_threads = 1;
  std::mutex m;
  std::condition_variable cv;
  std::deque<Item> queue;
  std::exception_ptr error;
  bool stop = false;
  std::thread thread;
  int64_t next_e = -1, next_k = -1;  // the request micro_batch expects next
  int next_a = -1;
  Dataset cur;
  std::vector<Dataset> spare;  // micro-batches used, their memory for the reader's next (guarded by m)
  double waited = 0;
  int64_t rows_read = 0;  // guarded by m

  ~Stream() { halt(); }
  void halt() {
    {
      std::lock_guard<std::mutex> lk(m);
      stop = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
    queue.clear();
    spare.clear();
    error = nullptr;
    stop = false;
  }
};

TrainRows::TrainRows(const std::string& path, const RankOrder& o, int depth, int64_t epochs)
    : TrainRows(path, o) {
  stream_ = std::make_shared<Stream>();
  stream_->depth = std::max(1, depth);
  stream_->epochs = std::max<int64_t>(1, epochs);
  stream_->file = open_checked(path, /*whole=*/false);
  stream_->raw = std::make_unique<RawRows>(path, stream_->file);
  if (!stream_->raw->ok()) stream_->raw.reset();
  if (stream_->raw && o.shuffle) stream_->raw->advise_random();
  if (!stream_->raw) {
    stream_->jpeg = std::make_unique<JpegRows>(path, stream_->file);
    if (!stream_->jpeg->ok()) stream_->jpeg.reset();
    else if (o.shuffle) stream_->jpeg->advise_random();
  }
  // Reads in flight: enough to keep a disk's queue busy, not more than the node's cores.
  stream_->io_threads = int(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1u, 16u));
  // JPEG rows are decoded by those threads, on the cores this rank may use: Open MPI binds each
  // rank of `mpirun -np 1` or `-np 2` to one core unless told otherwise, which caps decoding at
  // one core's rate (~1,000 images/s of 256 x 256 on the H100 machine, against 5,400 unbound).
  if (stream_->jpeg) {
    cpu_set_t set;
    CPU_ZERO(&set);
    const int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (cores > 0 && cores < 4 && unsigned(cores) < std::thread::hardware_concurrency())
      log::info("data.read = stream: " + path + " holds JPEG rows, decoded on this rank's cores, and it may run on " +
                std::to_string(cores) + " of the node's " + std::to_string(std::thread::hardware_concurrency()) +
                " (mpirun binds ranks to cores): give each rank more, e.g. mpirun --bind-to none, or "
                "--map-by socket:PE=<cores per rank>");
  }
  cur_.streamed = true;
}

TrainRows::~TrainRows() = default;

int64_t TrainRows::rows_read() const {
  if (whole_) return info_.n;
  if (!stream_) return rows_read_;
  std::lock_guard<std::mutex> lk(stream_->m);
  return stream_->rows_read;
}

double TrainRows::waited_s() const { return stream_ ? stream_->waited : 0.0; }
int TrainRows::depth() const { return stream_ ? stream_->depth : 0; }

const Dataset& TrainRows::micro_batch(int64_t e, int64_t k, int a) {
  if (!stream_) throw Error("TrainRows::micro_batch: data.read is not stream");
  Stream& s = *stream_;
  const int A = order_.accumulate;
  const int64_t steps = info_.n / order_.global_batch();
  if (!(e == s.next_e && k == s.next_k && a == s.next_a)) {
    // Not where the reader is heading: start it at (e, k), micro-batch 0.
    if (a != 0) throw Error("TrainRows::micro_batch: a stream starts at a step's first micro-batch");
    s.halt();
    s.thread = std::thread([this, &s, e, k, A, steps] {
      try {
        for (int64_t ep = e; ep < std::max(e + 1, s.epochs); ++ep) {
          const std::vector<int64_t> order = epoch_order(info_.n, order_.shuffle, order_.seed, ep);
          for (int64_t kk = ep == e ? k : 0; kk < steps; ++kk)
            for (int aa = 0; aa < A; ++aa) {
              Dataset d;
              {
                std::unique_lock<std::mutex> lk(s.m);
                s.cv.wait(lk, [&] { return s.stop || int(s.queue.size()) < s.depth; });
                if (s.stop) return;
                if (!s.spare.empty()) {
                  d = std::move(s.spare.back());
                  s.spare.pop_back();
                }
              }
              const int64_t at = batch_offset(kk, aa, order_.rank, order_.batch, order_.world, A);
              std::vector<int64_t> rows(order.begin() + at, order.begin() + at + order_.batch);
              if (s.raw)
                s.raw->read(rows, s.io_threads, d);
              else if (s.jpeg)
                s.jpeg->read(rows, s.io_threads, d);
              else
                d = read_rows(path_, s.file, rows);
              d.streamed = true;
              d.version = next_version();
              d.file_rows = 0;
              {
                std::lock_guard<std::mutex> lk(s.m);
                s.rows_read += d.n;
                s.queue.push_back({ep, kk, aa, std::move(d)});
              }
              s.cv.notify_all();
            }
        }
      } catch (...) {
        {
          std::lock_guard<std::mutex> lk(s.m);
          s.error = std::current_exception();
        }
        s.cv.notify_all();
      }
    });
  }
  Stream::Item item;
  {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lk(s.m);
    s.cv.wait(lk, [&] { return !s.queue.empty() || s.error; });
    s.waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s.queue.empty()) std::rethrow_exception(s.error);
    item = std::move(s.queue.front());
    s.queue.pop_front();
    // The micro-batch returned last time is done with (its caller has read it): its memory
    // serves the reader's next read.
    if (!s.cur.u8.empty() || !s.cur.f32.empty()) s.spare.push_back(std::move(s.cur));
    s.cur = Dataset{};
  }
  s.cv.notify_all();
  if (item.e != e || item.k != k || item.a != a)
    throw Error("TrainRows::micro_batch: the reader delivered epoch " + std::to_string(item.e) + " step " +
                std::to_string(item.k) + " micro-batch " + std::to_string(item.a) + " for epoch " + std::to_string(e) +
                " step " + std::to_string(k) + " micro-batch " + std::to_string(a));
  // The request after this one.
  s.next_e = e;
  s.next_k = k;
  s.next_a = a + 1;
  if (s.next_a == A) {
    s.next_a = 0;
    if (++s.next_k == steps) {
      s.next_k = 0;
      ++s.next_e;
    }
  }
  s.cur = std::move(item.rows);
  return s.cur;
}

}  // namespace dpt
