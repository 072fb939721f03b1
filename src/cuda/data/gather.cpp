// Batches on the CUDA backend: a dataset resident in device memory gathered by a kernel, or one
// kept in host memory streamed through pinned double buffers on a copy stream (BatchStream);
// both convert with the same kernel, so they give the same bits.
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend_impl.hpp"
#include "dpt/cuda_check.hpp"
#include "dpt/log.hpp"
#include "kernels.cuh"

namespace dpt::cuda_impl {

// Micro-batches of a dataset that stays in host memory (too large for the device, or
// DPT_STREAM_DATA=1), streamed through two slots: the host copies a micro-batch's rows in their
// stored type (uint8 or float32, 1/4 of the bytes of the converted batch for uint8) into a
// pinned slot, the copy stream moves the slot to a device slot, and the compute stream waits
// for that copy and converts the slot into x and y with the resident path's gather kernel (rows
// 0..count-1 of the slot), so both paths give the same bits. While the GPU computes on one
// micro-batch, the host fills and the copy engine moves the next; the host waits only for the
// copy out of the pinned slot it is about to refill, the copy stream only for the conversion
// out of the device slot it is about to overwrite.

BatchStream::BatchStream() {
  cudaStream_t s = nullptr;
  DPT_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  copy_.reset(s);
  for (Slot& sl : slots_) {
    sl.copied = make_event();
    sl.consumed = make_event();
  }
}

BatchStream::~BatchStream() {
  if (copy_) cudaStreamSynchronize(copy_.get());
}

void BatchStream::load(const Dataset& ds, const int64_t* rows, int count, float* x, int32_t* y,
                       cudaStream_t compute) {
  if (count <= 0) return;
  for (int i = 0; i < count; ++i)
    if (rows[i] < 0 || rows[i] >= ds.n)
      throw Error("load_batch: row " + std::to_string(rows[i]) + " outside [0, " +
                  std::to_string(ds.n) + ") of " + ds.path);
  Slot& sl = slots_[next_];
  next_ = (next_ + 1) % kSlots;
  const size_t row_bytes = size_t(ds.dim) * (ds.is_u8 ? 1 : sizeof(float));
  const size_t feat = size_t(count) * row_bytes;
  const size_t lab_at = (feat + 255) / 256 * 256;
  const size_t bytes = lab_at + size_t(count) * sizeof(int32_t);
  DPT_CHECK_CUDA(cudaEventSynchronize(sl.copied.get()));  // the pinned slot is free again
  if (bytes > sl.cap) {
    DPT_CHECK_CUDA(cudaEventSynchronize(sl.consumed.get()));  // and so is the device slot
    sl.host.reset();
    sl.dev.reset();
    sl.cap = 0;
    void* h = nullptr;
    DPT_CHECK_CUDA(cudaMallocHost(&h, bytes));
    sl.host.reset(h);
    sl.dev = dev_alloc(bytes);
    sl.cap = bytes;
  }
  if (size_t(count) > iota_n_) grow_iota(size_t(count));
  // Rows in use order (data.read = shard) are one run: one copy.
  char* h = static_cast<char*>(sl.host.get());
  const char* src = ds.is_u8 ? reinterpret_cast<const char*>(ds.u8.data())
                             : reinterpret_cast<const char*>(ds.f32.data());
  auto* hl = reinterpret_cast<int32_t*>(h + lab_at);
  for (int i = 0; i < count;) {
    int j = i + 1;
    while (j < count && rows[j] == rows[j - 1] + 1) ++j;
    std::memcpy(h + size_t(i) * row_bytes, src + size_t(rows[i]) * row_bytes, size_t(j - i) * row_bytes);
    std::memcpy(hl + i, ds.labels.data() + rows[i], size_t(j - i) * sizeof(int32_t));
    i = j;
  }
  DPT_CHECK_CUDA(cudaStreamWaitEvent(copy_.get(), sl.consumed.get(), 0));
  DPT_CHECK_CUDA(cudaMemcpyAsync(sl.dev.get(), h, bytes, cudaMemcpyHostToDevice, copy_.get()));
  DPT_CHECK_CUDA(cudaEventRecord(sl.copied.get(), copy_.get()));
  DPT_CHECK_CUDA(cudaStreamWaitEvent(compute, sl.copied.get(), 0));
  const char* d = static_cast<const char*>(sl.dev.get());
  cuda::gather_rows(d, ds.is_u8, reinterpret_cast<const int32_t*>(d + lab_at),
                    static_cast<const int64_t*>(iota_.get()), count, ds.dim, ds.scale, ds.offset,
                    x, y, compute);
  DPT_CHECK_CUDA(cudaEventRecord(sl.consumed.get(), compute));
}

void BatchStream::grow_iota(size_t n) {
  for (Slot& sl : slots_) DPT_CHECK_CUDA(cudaEventSynchronize(sl.consumed.get()));
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = int64_t(i);
  iota_ = dev_alloc(n * sizeof(int64_t));
  DPT_CHECK_CUDA(cudaMemcpy(iota_.get(), v.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice));
  iota_n_ = n;
}

// ---- data ----
void CudaBackendImpl::load_batch(const Dataset& ds, const int64_t* rows, int count, float* x,
                                 int32_t* y) {
  const Resident& r = resident(ds);
  if (!r.fits) {
    note_write(x, size_t(count) * size_t(ds.dim) * sizeof(float));
    note_write(y, size_t(count) * sizeof(int32_t));
    batch_stream().load(ds, rows, count, x, y, stream_.get());
    return;
  }
  for (int i = 0; i < count; ++i)
    if (rows[i] < 0 || rows[i] >= ds.n)
      throw Error("load_batch: row " + std::to_string(rows[i]) + " outside [0, " +
                  std::to_string(ds.n) + ") of " + ds.path);
  cudaStream_t s = stream_.get();
  note_write(x, size_t(count) * size_t(ds.dim) * sizeof(float));
  note_write(y, size_t(count) * sizeof(int32_t));
  auto* drows = static_cast<int64_t*>(rows_.get(size_t(count) * sizeof(int64_t), s));
  upload(drows, rows, size_t(count) * sizeof(int64_t));
  cuda::gather_rows(r.feat.get(), ds.is_u8, static_cast<const int32_t*>(r.labels.get()), drows,
                    count, ds.dim, ds.scale, ds.offset, x, y, s);
}

// ---- device-side step control ----
void CudaBackendImpl::load_batch_at(const Dataset& ds, const int64_t* order, const StepCtl* ctl, int64_t offset,
                                    int count, float* x, int32_t* y, const int64_t* host_rows) {
  const Resident& r = resident(ds);
  if (!r.fits) {
    // Streamed from host memory with the rows the host knows (else read back: a sync).
    Backend::load_batch_at(ds, order, ctl, offset, count, x, y, host_rows);
    return;
  }
  note_write(x, size_t(count) * size_t(ds.dim) * sizeof(float));
  note_write(y, size_t(count) * sizeof(int32_t));
  cuda::gather_rows(r.feat.get(), ds.is_u8, static_cast<const int32_t*>(r.labels.get()), order,
                    count, ds.dim, ds.scale, ds.offset, x, y, stream_.get(), ctl, offset);
}

bool CudaBackendImpl::can_capture(const Dataset& ds) { return resident(ds).fits; }

// ---- data.read = stream: micro-batch slots on the device ----
StagedRing::~StagedRing() {
  if (copy) cudaStreamSynchronize(copy.get());
}

namespace {
// A micro-batch's rows into pinned memory: one copy per thread over a few threads, as one
// thread's memcpy (~10 GB/s) would take a large part of a fast step.
void copy_rows(char* dst, const char* src, size_t bytes) {
  constexpr size_t kPer = size_t(8) << 20;
  const int T = int(std::min<size_t>(4, (bytes + kPer - 1) / kPer));
  if (T <= 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const size_t part = (bytes / size_t(T) + 63) / 64 * 64;
  std::vector<std::thread> pool;
  for (int t = 1; t < T; ++t) {
    const size_t at = size_t(t) * part;
    if (at < bytes) pool.emplace_back([=] { std::memcpy(dst + at, src + at, std::min(part, bytes - at)); });
  }
  std::memcpy(dst, src, std::min(part, bytes));
  for (std::thread& p : pool) p.join();
}
}  // namespace

bool CudaBackendImpl::make_ring(const Dataset& ring, int64_t slot_rows) {
  if (staged_) DPT_CHECK_CUDA(cudaStreamSynchronize(stream_.get()));  // nothing reads the old slots
  staged_.reset();
  resident_.erase(&ring);
  if (ring.n <= 0 || ring.dim <= 0 || slot_rows <= 0 || ring.n % slot_rows != 0) return false;
  auto r = std::make_unique<StagedRing>();
  r->key = &ring;
  r->rows = slot_rows;
  r->row_bytes = size_t(ring.dim) * (ring.is_u8 ? 1 : sizeof(float));
  const size_t feat = size_t(ring.n) * r->row_bytes, lab = size_t(ring.n) * sizeof(int32_t);
  size_t free_b = 0, total_b = 0;
  DPT_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  if (feat + lab > free_b / 4) return false;
  Resident& res = r->res;
  res.n = ring.n;
  res.dim = ring.dim;
  res.u8 = ring.is_u8;
  res.checked = true;
  res.fits = true;
  res.feat = dev_alloc(feat);
  res.labels = dev_alloc(lab);
  cudaStream_t s = nullptr;
  DPT_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  r->copy.reset(s);
  r->lab_at = (size_t(r->rows) * r->row_bytes + 255) / 256 * 256;
  const size_t host_bytes = r->lab_at + size_t(r->rows) * sizeof(int32_t);
  r->slots.resize(size_t(ring.n / r->rows));
  for (StagedRing::Slot& sl : r->slots) {
    void* h = nullptr;
    DPT_CHECK_CUDA(cudaMallocHost(&h, host_bytes));
    sl.host.reset(h);
    sl.copied = make_event();
    sl.consumed = make_event();
  }
  staged_ = std::move(r);
  return true;
}

void CudaBackendImpl::stage(const Dataset& ring, int slot, const Dataset& mb) {
  if (!staged_ || staged_->key != &ring) throw Error("stage: no ring made for this dataset (make_ring)");
  StagedRing& r = *staged_;
  if (slot < 0 || size_t(slot) >= r.slots.size())
    throw Error("stage: slot " + std::to_string(slot) + " of " + std::to_string(r.slots.size()));
  if (mb.n != r.rows || mb.dim != ring.dim || mb.is_u8 != ring.is_u8 || mb.labels.size() != size_t(mb.n))
    throw Error("stage: a micro-batch of " + std::to_string(mb.n) + " rows of " + std::to_string(mb.dim) +
                " for slots of " + std::to_string(r.rows) + " rows of " + std::to_string(ring.dim));
  StagedRing::Slot& sl = r.slots[size_t(slot)];
  DPT_CHECK_CUDA(cudaEventSynchronize(sl.copied.get()));  // the pinned copy is free again
  char* h = static_cast<char*>(sl.host.get());
  const size_t feat = size_t(r.rows) * r.row_bytes;
  copy_rows(h, mb.is_u8 ? reinterpret_cast<const char*>(mb.u8.data()) : reinterpret_cast<const char*>(mb.f32.data()),
            feat);
  std::memcpy(h + r.lab_at, mb.labels.data(), size_t(r.rows) * sizeof(int32_t));
  cudaStream_t c = r.copy.get();
  char* dfeat = static_cast<char*>(r.res.feat.get()) + size_t(slot) * feat;
  int32_t* dlab = static_cast<int32_t*>(r.res.labels.get()) + size_t(slot) * size_t(r.rows);
  DPT_CHECK_CUDA(cudaStreamWaitEvent(c, sl.consumed.get(), 0));
  DPT_CHECK_CUDA(cudaMemcpyAsync(dfeat, h, feat, cudaMemcpyHostToDevice, c));
  DPT_CHECK_CUDA(cudaMemcpyAsync(dlab, h + r.lab_at, size_t(r.rows) * sizeof(int32_t), cudaMemcpyHostToDevice, c));
  DPT_CHECK_CUDA(cudaEventRecord(sl.copied.get(), c));
  DPT_CHECK_CUDA(cudaStreamWaitEvent(stream_.get(), sl.copied.get(), 0));
}

void CudaBackendImpl::release(const Dataset& ring, int slot) {
  if (!staged_ || staged_->key != &ring || slot < 0 || size_t(slot) >= staged_->slots.size()) return;
  DPT_CHECK_CUDA(cudaEventRecord(staged_->slots[size_t(slot)].consumed.get(), stream_.get()));
}

void CudaBackendImpl::refresh_dataset(const Dataset& ds) { resident(ds); }

// The dataset on the device, uploaded on first use when it takes at most half the free
// memory; otherwise marked !fits and batches are gathered on the host. Keyed by the Dataset's
// address and re-checked against its host array and size, so a new Dataset at an old address
// is uploaded afresh.
const Resident& CudaBackendImpl::resident(const Dataset& ds) {
  if (staged_ && &ds == staged_->key) return staged_->res;  // data.read = stream's slots
  if (ds.streamed) {  // data.read = stream: each micro-batch once through the pinned buffers
    static const Resident streamed;
    return streamed;
  }
  const void* host = ds.is_u8 ? static_cast<const void*>(ds.u8.data()) : ds.f32.data();
  Resident& r = resident_[&ds];
  const bool same_shape = r.checked && r.n == ds.n && r.dim == ds.dim && r.u8 == ds.is_u8;
  if (same_shape && r.version == ds.version && (ds.version || r.host == host)) return r;
  const size_t feat = size_t(ds.n) * size_t(ds.dim) * (ds.is_u8 ? 1 : 4);
  const size_t lab = size_t(ds.n) * sizeof(int32_t);
  if (same_shape && ds.version && r.fits) {
    // New contents of the same shape (TrainRows' next epoch): copied over the old in stream
    // order, at the same address, so a captured step reads the new rows. A copy from pageable
    // memory returns once the source is staged; the host may then change it.
    cudaStream_t s = stream_.get();
    DPT_CHECK_CUDA(cudaMemcpyAsync(r.feat.get(), host, feat, cudaMemcpyHostToDevice, s));
    DPT_CHECK_CUDA(cudaMemcpyAsync(r.labels.get(), ds.labels.data(), lab, cudaMemcpyHostToDevice, s));
    r.host = host;
    r.version = ds.version;
    return r;
  }
  r = Resident{};
  r.host = host;
  r.version = ds.version;
  r.n = ds.n;
  r.dim = ds.dim;
  r.u8 = ds.is_u8;
  r.checked = true;  // also when an allocation below throws: the next call falls back
  size_t free_b = 0, total_b = 0;
  DPT_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  if (stream_data_ || feat + lab > free_b / 2 || ds.labels.size() != size_t(ds.n)) {
    log::info("dataset " + ds.path + " stays in host memory (" + std::to_string((feat + lab) >> 20) +
              " MiB" + (stream_data_ ? ", DPT_STREAM_DATA=1" : ", more than half the free GPU memory") +
              "); batches stream to the GPU through pinned double buffers on a copy stream");
    return r;
  }
  r.feat = dev_alloc(feat);
  r.labels = dev_alloc(lab);
  cudaStream_t s = stream_.get();
  DPT_CHECK_CUDA(cudaMemcpyAsync(r.feat.get(), host, feat, cudaMemcpyHostToDevice, s));
  DPT_CHECK_CUDA(cudaMemcpyAsync(r.labels.get(), ds.labels.data(), lab, cudaMemcpyHostToDevice, s));
  DPT_CHECK_CUDA(cudaStreamSynchronize(s));
  r.fits = true;
  return r;
}

BatchStream& CudaBackendImpl::batch_stream() {
  if (!stream_batches_) stream_batches_ = std::make_unique<BatchStream>();
  return *stream_batches_;
}

}  // namespace dpt::cuda_impl
