// Batches on the CUDA backend: a dataset resident in device memory gathered by a kernel, or one
// kept in host memory streamed through pinned double buffers on a copy stream (BatchStream);
// both convert with the same kernel, so they give the same bits.
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <string>
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

void CudaBackendImpl::refresh_dataset(const Dataset& ds) { resident(ds); }

// The dataset on the device, uploaded on first use when it takes at most half the free
// memory; otherwise marked !fits and batches are gathered on the host. Keyed by the Dataset's
// address and re-checked against its host array and size, so a new Dataset at an old address
// is uploaded afresh.
const Resident& CudaBackendImpl::resident(const Dataset& ds) {
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
