// The CUDA backend's memory: device allocations and events, growing scratch, host -> device
// copies through the pinned upload ring, and the backend's allocate / free / upload / download /
// copy / fill / scale.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "backend_impl.hpp"
#include "dpt/cuda_check.hpp"
#include "dpt/log.hpp"
#include "kernels.cuh"

namespace dpt::cuda_impl {

namespace {
// Every allocation counted: address -> its bytes, whether it is lazy (alloc_lazy) and its kind.
struct Alloc {
  size_t bytes = 0;
  bool lazy = false;
  MemKind kind = MemKind::other;
};
constexpr int kKinds = int(MemKind::retired) + 1;
struct Counted {
  std::mutex m;
  std::unordered_map<const void*, Alloc> at;
  size_t now = 0, peak = 0, lazy = 0;
  size_t by_kind[kKinds] = {};
};
Counted& counted() {
  static Counted* c = new Counted;  // never destroyed: buffers may outlive static destruction
  return *c;
}

void count(void* p, size_t bytes, bool lazy, MemKind kind) {
  Counted& c = counted();
  std::lock_guard<std::mutex> lock(c.m);
  c.at[p] = {bytes, lazy, kind};
  c.now += bytes;
  if (lazy) c.lazy += bytes;
  c.by_kind[int(kind)] += bytes;
  c.peak = std::max(c.peak, c.now);
}

void* counted_malloc(size_t bytes, MemKind kind) {
  void* p = nullptr;
  if (!bytes) return p;
  DPT_CHECK_CUDA(cudaMalloc(&p, bytes));
  count(p, bytes, false, kind);
  return p;
}

// cudaFree's error (it waits for the device), else cudaSuccess.
cudaError_t counted_free(void* p) noexcept {
  if (!p) return cudaSuccess;
  {
    Counted& c = counted();
    std::lock_guard<std::mutex> lock(c.m);
    auto it = c.at.find(p);
    if (it != c.at.end()) {
      c.now -= it->second.bytes;
      if (it->second.lazy) c.lazy -= it->second.bytes;
      c.by_kind[int(it->second.kind)] -= it->second.bytes;
      c.at.erase(it);
    }
  }
  return cudaFree(p);
}
}  // namespace

DevPtr dev_alloc(size_t bytes, MemKind kind) { return DevPtr(counted_malloc(bytes, kind)); }

void recount(const void* p, MemKind kind) {
  Counted& c = counted();
  std::lock_guard<std::mutex> lock(c.m);
  auto it = c.at.find(p);
  if (it == c.at.end()) return;
  c.by_kind[int(it->second.kind)] -= it->second.bytes;
  it->second.kind = kind;
  c.by_kind[int(kind)] += it->second.bytes;
}

void dev_free(void* p) noexcept { counted_free(p); }

DeviceMemory counted_memory() {
  DeviceMemory m;
  {
    Counted& c = counted();
    std::lock_guard<std::mutex> lock(c.m);
    m.now = c.now;
    m.peak = c.peak;
    m.lazy = c.lazy;
    m.buffers = c.by_kind[int(MemKind::buffer)];
    m.copies = c.by_kind[int(MemKind::copy)];
    m.shadows = c.by_kind[int(MemKind::shadow)];
    m.scratch = c.by_kind[int(MemKind::scratch)];
    m.retired = c.by_kind[int(MemKind::retired)];
  }
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) m.in_use = total_b - free_b;
  else cudaGetLastError();
  return m;
}

void reset_counted_peak() {
  Counted& c = counted();
  std::lock_guard<std::mutex> lock(c.m);
  c.peak = c.now;
}

Event make_event() {
  cudaEvent_t e = nullptr;
  DPT_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return Event(e);
}

StreamTimer::StreamTimer() {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  DPT_CHECK_CUDA(cudaEventCreate(&e0));
  t0_.reset(e0);
  DPT_CHECK_CUDA(cudaEventCreate(&e1));
  t1_.reset(e1);
}

void StreamTimer::start(cudaStream_t s) { DPT_CHECK_CUDA(cudaEventRecord(t0_.get(), s)); }

float StreamTimer::stop(cudaStream_t s) {
  DPT_CHECK_CUDA(cudaEventRecord(t1_.get(), s));
  DPT_CHECK_CUDA(cudaEventSynchronize(t1_.get()));
  float ms = 0;
  DPT_CHECK_CUDA(cudaEventElapsedTime(&ms, t0_.get(), t1_.get()));
  return ms;
}

namespace {
struct ScratchRegistry {
  std::mutex m;
  std::set<Scratch*> all;
  int graphs = 0;  // captured step graphs alive, process-wide
};
ScratchRegistry& scratch_registry() {
  static auto* r = new ScratchRegistry;  // never destroyed: backends may outlive static destruction
  return *r;
}
}  // namespace

Scratch::Scratch() {
  ScratchRegistry& r = scratch_registry();
  std::lock_guard<std::mutex> lock(r.m);
  r.all.insert(this);
}

Scratch::~Scratch() {
  ScratchRegistry& r = scratch_registry();
  std::lock_guard<std::mutex> lock(r.m);
  r.all.erase(this);
}

Scratch& Scratch::operator=(Scratch&& o) noexcept {
  if (this == &o) return *this;
  if (p_) {
    recount(p_.get(), MemKind::retired);
    retired_.push_back(std::move(p_));
  }
  for (DevPtr& r : o.retired_) retired_.push_back(std::move(r));
  o.retired_.clear();
  p_ = std::move(o.p_);
  cap_ = o.cap_;
  need_ = o.need_;
  o.cap_ = 0;
  o.need_ = 0;
  return *this;
}

void count_graphs(int delta) {
  ScratchRegistry& r = scratch_registry();
  std::lock_guard<std::mutex> lock(r.m);
  r.graphs += delta;
}

namespace {
thread_local int timing_depth = 0;  // StartupTiming guards alive on this thread
}  // namespace

StartupTiming::StartupTiming() { ++timing_depth; }
StartupTiming::~StartupTiming() { --timing_depth; }

// Retired buffers are kept for work already queued (cudaFree waits for it) and for captured
// graphs (which hold their addresses): with no graph alive, none is needed, and a buffer larger
// than its need can be made again at that size. Capture starts after the eager step, whose
// growing requests retire most of them (resnet50's first step outgrows some buffers several
// times over) and whose start-up timing sizes some beyond the step's need.
void trim_scratch() {
  ScratchRegistry& r = scratch_registry();
  std::lock_guard<std::mutex> lock(r.m);
  if (r.graphs > 0) return;
  for (Scratch* sc : r.all) {
    sc->retired_.clear();
    sc->trim();
  }
}

void Scratch::trim() {
  if (cap_ <= need_) return;
  p_.reset();  // cudaFree waits for the queued work that may read it
  cap_ = 0;
  if (need_ == 0) return;
  p_ = dev_alloc(need_, MemKind::scratch);
  cap_ = need_;
}

void* Scratch::get(size_t bytes, cudaStream_t s) {
  (void)s;
  if (timing_depth == 0) need_ = std::max(need_, bytes);
  if (bytes > cap_) {
    if (p_) {
      recount(p_.get(), MemKind::retired);
      retired_.push_back(std::move(p_));
    }
    cap_ = 0;
    p_ = dev_alloc(bytes, MemKind::scratch);
    cap_ = bytes;
  }
  return p_.get();
}

UploadRing::UploadRing() {
  for (int k = 0; k < kSlots; ++k) {
    void* p = nullptr;
    DPT_CHECK_CUDA(cudaMallocHost(&p, kSlotBytes));
    host_[k].reset(p);
    done_[k] = make_event();
  }
}

void UploadRing::upload(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  for (size_t off = 0; off < bytes; off += kSlotBytes) {
    const size_t len = std::min(kSlotBytes, bytes - off);
    const int k = next_;
    next_ = (next_ + 1) % kSlots;
    DPT_CHECK_CUDA(cudaEventSynchronize(done_[k].get()));  // never-recorded: returns at once
    std::memcpy(host_[k].get(), static_cast<const char*>(src) + off, len);
    DPT_CHECK_CUDA(cudaMemcpyAsync(static_cast<char*>(dst) + off, host_[k].get(), len,
                                   cudaMemcpyHostToDevice, s));
    DPT_CHECK_CUDA(cudaEventRecord(done_[k].get(), s));
  }
}

void* CudaBackendImpl::alloc_bytes(size_t bytes) {
  void* p = counted_malloc(bytes, MemKind::buffer);
  if (p) allocs_[reinterpret_cast<uintptr_t>(p)] = bytes;
  return p;
}

// Managed memory that prefers the device (where its pages are made when first touched) and is
// mapped there: a float tensor kept in bf16 only (the hints) holds no memory. Counted in
// DeviceMemory::lazy (and now / peak), the device's use in in_use. Plain device memory where the
// device cannot take managed memory concurrently with the host, or with DPT_LAZY_ACTS=0.
void* CudaBackendImpl::alloc_lazy(size_t bytes) {
  if (!lazy_acts_ || !bytes) return alloc_bytes(bytes);
  void* p = nullptr;
  DPT_CHECK_CUDA(cudaMallocManaged(&p, bytes, cudaMemAttachGlobal));
  cudaMemLocation here{};
  here.type = cudaMemLocationTypeDevice;
  here.id = dev_;
  DPT_CHECK_CUDA(cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, here));
  DPT_CHECK_CUDA(cudaMemAdvise(p, bytes, cudaMemAdviseSetAccessedBy, here));
  count(p, bytes, true, MemKind::buffer);
  allocs_[reinterpret_cast<uintptr_t>(p)] = bytes;
  return p;
}

// cudaFree waits for the device, so no stream can still be using p afterwards.
void CudaBackendImpl::free_bytes(void* p) noexcept {
  if (!p) return;
  forget(p);
  const cudaError_t rc = counted_free(p);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    try { log::warn(std::string("cudaFree failed: ") + cudaGetErrorString(rc)); } catch (...) {}
  }
}

void CudaBackendImpl::upload(void* dst, const void* src, size_t bytes) {
  note_write(dst, bytes);
  ring_->upload(dst, src, bytes, stream_.get());
}

// Ordered after everything on the compute stream. A collective's result is covered once
// Comm::synchronize() has made the compute stream wait for the comm stream.
void CudaBackendImpl::download(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DPT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_.get()));
  DPT_CHECK_CUDA(cudaStreamSynchronize(stream_.get()));
}

bool CudaBackendImpl::pin_host(void* p, size_t bytes) {
  if (!p || bytes == 0) return false;
  if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess) return true;
  cudaGetLastError();  // not pinned (a locked-memory limit, say): the copies stay pageable
  return false;
}

void CudaBackendImpl::unpin_host(void* p) noexcept {
  if (p && cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

// A source kept in bf16 only (a gradient of the residual stream) is copied as it is, into dst's
// twin, and dst is bf16 only too; floats are written from it where dst has no twin.
void CudaBackendImpl::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (bytes % sizeof(float) == 0) {
    const size_t n = bytes / sizeof(float);
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<float*>(dst);
    if (const void* s16 = only_copy(s, n)) {
      note_write(dst, bytes);
      if (void* d16 = twin_slot(d, n)) {
        DPT_CHECK_CUDA(cudaMemcpyAsync(d16, s16, n * 2, cudaMemcpyDeviceToDevice, stream_.get()));
        made_only_twin(d, n);
        return;
      }
    }
    floats_of(s, n);
  }
  note_write(dst, bytes);
  DPT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_.get()));
}

void CudaBackendImpl::fill(float* p, size_t n, float v) {
  note_write(p, n * sizeof(float));
  cuda::fill(p, n, v, lane());
}

void CudaBackendImpl::scale(float* p, size_t n, float a) {
  note_write(p, n * sizeof(float));
  cuda::scale(p, n, a, stream_.get());
}

}  // namespace dpt::cuda_impl
