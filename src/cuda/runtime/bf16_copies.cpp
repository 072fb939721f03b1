// bf16 precision's derived copies of fp32 data: the weight shadow of a registered parameter
// arena and the activations' twins, and the bookkeeping that drops or marks them stale when
// their fp32 source is written (the scheme is described at the top of cuda_backend.cpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <iterator>
#include <string>

#include "backend_impl.hpp"
#include "dpt/check.hpp"
#include "conv/cudnn_kernels.cuh"
#include "kernels.cuh"

namespace dpt::cuda_impl {

void CudaBackendImpl::register_parameters(float* p, size_t n) {
  if (precision_ != Precision::bf16 || !p || n == 0) return;
  for (auto it = shadows_.begin(); it != shadows_.end();)
    it = overlaps(it->p, it->n * sizeof(float), p, n * sizeof(float)) ? shadows_.erase(it) : it + 1;
  Shadow sh;
  sh.p = p;
  sh.n = n;
  sh.w16 = dev_alloc(n * 2, MemKind::shadow);
  sh.dirty = true;  // filled from the fp32 arena before its first use
  shadows_.push_back(std::move(sh));
}

void CudaBackendImpl::note_device_write(const void* p, size_t bytes) { note_write(p, bytes); }

uint16_t* CudaBackendImpl::param_shadow(const float* p, size_t n) {
  for (Shadow& sh : shadows_)
    if (p >= sh.p && p + n <= sh.p + sh.n) return static_cast<uint16_t*>(sh.w16.get()) + (p - sh.p);
  return nullptr;
}

// Written by an all-gather of the shadow itself: nothing derived from it to drop, and it must
// not be refreshed from the fp32 arena (stale there outside this rank's shards).
void CudaBackendImpl::note_shadow_write(const float* p, size_t n) { (void)p; (void)n; }

// Host-side bookkeeping of a write to [p, p + bytes): copies derived from it are dropped
// (twins) or marked stale (weight shadows). Every op that writes backend memory calls it for
// its outputs before it enqueues; the NCCL transport calls note_device_write.
void CudaBackendImpl::note_write(const void* p, size_t bytes) {
  if (!p || bytes == 0) return;
  for (Shadow& sh : shadows_)
    if (overlaps(sh.p, sh.n * sizeof(float), p, bytes)) sh.dirty = true;
  for (auto& t : twins_)
    if (t.second.valid && overlaps(t.first, t.second.valid * sizeof(float), p, bytes)) {
      t.second.valid = 0;
      t.second.only = false;
      t.second.pre_act = false;
    }
  for (auto& d : deferred_)
    if (d.second.live && overlaps(d.first, d.second.n * sizeof(float), p, bytes)) d.second.live = false;
}

// The optimizer writes p, s1, s2. When [p, p + n) lies in a registered arena it also writes the
// shadow's slice (returned), which then stays as fresh as it was; otherwise the arena is noted.
void* CudaBackendImpl::note_update(float* p, float* s1, float* s2, size_t n) {
  void* p16 = nullptr;
  for (Shadow& sh : shadows_)
    if (p >= sh.p && p + n <= sh.p + sh.n && n)
      p16 = static_cast<uint16_t*>(sh.w16.get()) + (p - sh.p);
  if (p16) {
    for (auto& t : twins_)
      if (t.second.valid && overlaps(t.first, t.second.valid * sizeof(float), p, n * sizeof(float))) {
        t.second.valid = 0;
        t.second.only = false;
      }
  } else {
    note_write(p, n * sizeof(float));
  }
  if (s1) note_write(s1, n * sizeof(float));
  if (s2) note_write(s2, n * sizeof(float));
  return p16;
}

// free_bytes(p): drop what the backend derived from the allocation at p.
void CudaBackendImpl::forget(void* p) noexcept {
  auto it = allocs_.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocs_.end()) return;
  const size_t bytes = it->second;
  allocs_.erase(it);
  for (auto t = twins_.begin(); t != twins_.end();)
    t = overlaps(t->first, 1, p, bytes) ? twins_.erase(t) : std::next(t);
  for (auto d = deferred_.begin(); d != deferred_.end();)
    d = overlaps(d->first, 1, p, bytes) ? deferred_.erase(d) : std::next(d);
  for (auto sh = shadows_.begin(); sh != shadows_.end();)
    sh = overlaps(sh->p, 1, p, bytes) ? shadows_.erase(sh) : sh + 1;
  for (auto f = fusions_.begin(); f != fusions_.end();)
    f = overlaps(f->first, 1, p, bytes) ? fusions_.erase(f) : std::next(f);
  // The model's hints on the allocation end with it (a later one at the same address has none).
  for (std::set<const float*>* hinted : {&bn_inputs_, &bf16_readers_})
    for (auto h = hinted->begin(); h != hinted->end();)
      h = overlaps(*h, 1, p, bytes) ? hinted->erase(h) : std::next(h);
  for (auto h = grad_uses_.begin(); h != grad_uses_.end();)
    h = overlaps(h->first, 1, p, bytes) ? grad_uses_.erase(h) : std::next(h);
  for (auto h = relu_pools_.begin(); h != relu_pools_.end();)
    h = overlaps(h->first, 1, p, bytes) || overlaps(h->second, 1, p, bytes) ? relu_pools_.erase(h) : std::next(h);
  if (premasked_ && overlaps(premasked_, 1, p, bytes)) premasked_ = nullptr;
}

// The twin buffer of p for n elements, created on first use (never while a graph is being
// captured: then nullptr); nullptr where p is not in an allocation of this backend.
void* CudaBackendImpl::twin_slot(const float* p, size_t n) {
  if (n == 0) return nullptr;
  auto it = twins_.find(p);
  if (it == twins_.end()) {
    const auto key = reinterpret_cast<uintptr_t>(p);
    auto al = allocs_.upper_bound(key);
    if (al == allocs_.begin()) return nullptr;
    --al;
    if (key >= al->first + al->second || capturing()) return nullptr;
    Twin t;
    t.cap = (al->first + al->second - key) / sizeof(float);
    t.buf = dev_alloc(t.cap * 2, MemKind::copy);
    it = twins_.emplace(p, std::move(t)).first;
  }
  return it->second.cap >= n ? it->second.buf.get() : nullptr;
}

// A twin that holds a convolution's output before bias and ReLU (note_relu_pool) is its
// pooling's alone: any other reader would take it for the activation.
namespace {
void no_pre_act(bool pre_act) {
  if (pre_act) throw Error("a convolution's bf16 output before bias and ReLU read as its activation");
}
}  // namespace

// p's bf16 twin when it holds p's current n values, else nullptr.
const void* CudaBackendImpl::valid_twin(const float* p, size_t n) const {
  auto it = twins_.find(p);
  if (it == twins_.end() || it->second.valid < n) return nullptr;
  no_pre_act(it->second.pre_act);
  return it->second.buf.get();
}

// note_relu_pool: whether a is the ReLU output a max pooling's hint names.
bool CudaBackendImpl::relu_pool_input(const float* a) const {
  for (const auto& e : relu_pools_)
    if (e.second == a) return true;
  return false;
}

// a's twin where it holds the convolution's n values before bias and ReLU (*bias: the bias, or
// nullptr), else nullptr.
const void* CudaBackendImpl::pre_act_twin(const float* a, size_t n, const float** bias) const {
  auto it = twins_.find(a);
  if (it == twins_.end() || !it->second.pre_act || it->second.valid < n) return nullptr;
  *bias = it->second.pre_bias;
  return it->second.buf.get();
}

// bf16: where the model said z is read by batch norm only (note_bn_input), the twin slot that
// a convolution writes its bf16 output into instead of z's floats; nullptr otherwise. Call after
// z's note_write, then made_only_twin once the output is enqueued.
void* CudaBackendImpl::only_twin(const float* z, size_t n) {
  return bf16() && bn_inputs_.count(z) ? twin_slot(z, n) : nullptr;
}

void CudaBackendImpl::made_only_twin(const float* z, size_t n) {
  Twin& t = twins_[z];
  t.valid = n;
  t.only = true;
}

// The hint note_grad_use gave for the next write of dx, taken (it holds for one write), if any.
std::optional<Backend::GradUse> CudaBackendImpl::take_grad_use(const float* dx) {
  auto it = grad_uses_.find(dx);
  if (it == grad_uses_.end()) return std::nullopt;
  const GradUse use = it->second;
  grad_uses_.erase(it);
  return use;
}

// The same, true when it was one of `uses`.
bool CudaBackendImpl::take_grad_use(const float* dx, std::initializer_list<GradUse> uses) {
  const std::optional<GradUse> use = take_grad_use(dx);
  return use && std::find(uses.begin(), uses.end(), *use) != uses.end();
}

// p's bf16 twin where that is p's only copy (its floats never written: made_only_twin), else
// nullptr; throws when it holds fewer than the reader's n values.
const void* CudaBackendImpl::only_copy(const float* p, size_t n) const {
  auto it = twins_.find(p);
  if (it == twins_.end() || !it->second.only) return nullptr;
  no_pre_act(it->second.pre_act);
  if (it->second.valid < n)
    throw Error("a bf16-only tensor holds fewer values (" + std::to_string(it->second.valid) + ") than its reader's (" +
                std::to_string(n) + ")");
  return it->second.buf.get();
}

// Where p's bf16 twin is its only copy, the floats [p, p + n) written from it (for a reader of
// floats; the twin stays valid).
void CudaBackendImpl::floats_of(const float* p, size_t n) {
  const void* t = only_copy(p, n);
  if (!t) return;
  cuda::widen_bf16(t, const_cast<float*>(p), n, false, stream_.get());
  twins_[p].only = false;
}

// The bf16 operand for fp32 data [p, p + n): the weight shadow's slice when p lies in a
// registered arena (refreshed first if stale); else p's twin when it is valid; else p is
// converted into its twin (kept for later uses until p is written) or, failing that, into
// `fallback`.
const void* CudaBackendImpl::as_bf16(const float* p, size_t n, Scratch& fallback) {
  cudaStream_t s = stream_.get();
  for (Shadow& sh : shadows_)
    if (p >= sh.p && p + n <= sh.p + sh.n) {
      if (sh.dirty) {
        cuda::to_bf16(sh.p, sh.w16.get(), sh.n, s);
        sh.dirty = false;
      }
      return static_cast<const uint16_t*>(sh.w16.get()) + (p - sh.p);
    }
  if (const void* t = valid_twin(p, n)) return t;
  if (void* t = twin_slot(p, n)) {
    cuda::to_bf16(p, t, n, s);
    twins_[p].valid = n;
    return t;
  }
  void* f = fallback.get(n * 2, s);
  cuda::to_bf16(p, f, n, s);
  return f;
}

}  // namespace dpt::cuda_impl
