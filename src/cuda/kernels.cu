// The CUDA backend's own kernels: elementwise (fill, scale, bias + activation and its
// derivative, bf16 conversion), reductions (bias gradient, softmax cross-entropy, finiteness),
// the fused optimizer update and the dataset row gather. Kernels first, launchers after.
//
// The build compiles CUDA with --use_fast_math. Where that would cost accuracy against the CPU
// backend we avoid the affected intrinsic: tanhf becomes tanh.approx (relative error ~5e-4), so
// tanh is computed from expm1f; the gather uses __fmul_rn/__fadd_rn so that it rounds exactly
// like the host's raw × scale + offset.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "dpt/cuda_check.hpp"
#include "kernels.cuh"

namespace dpt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

// ============================== kernels ==============================

__global__ void fill_kernel(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

__global__ void scale_kernel(float* p, size_t n, float a) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] *= a;
}

__device__ __forceinline__ float tanh_accurate(float z) {
  const float az = fabsf(z);
  if (az > 9.f) return copysignf(1.f, z);  // tanh(9) rounds to 1 in fp32
  const float e = expm1f(2.f * az);         // accurate near 0, where 1 − 2/(e^2z + 1) cancels
  return copysignf(e / (e + 2.f), z);
}

__device__ __forceinline__ float act_fwd(float z, Act act) {
  switch (act) {
    case Act::relu: return z > 0.f ? z : 0.f;
    case Act::tanh: return tanh_accurate(z);
    case Act::sigmoid: return 1.f / (1.f + expf(-z));
    case Act::gelu: return 0.5f * z * (1.f + erff(z * kInvSqrt2));  // exact GELU (torch default)
    default: return z;
  }
}

// d act / d z, from z and a = act(z) (the same choices as the CPU backend).
__device__ __forceinline__ float act_grad(float z, float a, Act act) {
  switch (act) {
    case Act::relu: return z > 0.f ? 1.f : 0.f;
    case Act::tanh: return 1.f - a * a;
    case Act::sigmoid: return a * (1.f - a);
    case Act::gelu:
      return 0.5f * (1.f + erff(z * kInvSqrt2)) + z * kInvSqrt2Pi * expf(-0.5f * z * z);
    default: return 1.f;
  }
}

__global__ void bias_act_kernel(float* z, float* a, const float* b, size_t n, int out, Act act) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    float v = z[i];
    if (b) v += b[i % size_t(out)];
    z[i] = v;
    a[i] = act_fwd(v, act);
  }
}

__global__ void act_backward_kernel(float* da, const float* z, const float* a, size_t n,
                                    Act act) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    // relu and gelu read z only, tanh and sigmoid a only: do not touch the other.
    const float zi = (act == Act::relu || act == Act::gelu) ? z[i] : 0.f;
    const float ai = (act == Act::tanh || act == Act::sigmoid) ? a[i] : 0.f;
    da[i] *= act_grad(zi, ai, act);
  }
}

// Block (32, 8): 32 adjacent columns, 8 row groups; shared-memory combine in a fixed order.
__global__ void bias_grad_kernel(const float* dz, float* db, int batch, int out, bool accumulate) {
  __shared__ float part[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float s = 0.f;
  if (col < out)
    for (int r = threadIdx.y; r < batch; r += 8) s += dz[size_t(r) * out + col];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < out) {
    float t = 0.f;
    for (int k = 0; k < 8; ++k) t += part[k][threadIdx.x];
    db[col] = accumulate ? db[col] + t : t;
  }
}

__global__ void to_bf16_kernel(const float* src, __nv_bfloat16* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16_rn(src[i]);
}

// One warp per row. Ties in the argmax go to the lowest index, as in the CPU backend.
__global__ void softmax_xent_rows(const float* logits, const int32_t* labels, int batch,
                                  int classes, float grad_scale, float* dlogits, float* row_loss,
                                  int* row_ok) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= batch) return;  // whole warps leave together: the shuffles below stay full-warp
  const float* l = logits + size_t(warp) * classes;
  float m = -INFINITY;
  int arg = classes;
  for (int j = lane; j < classes; j += 32)
    if (l[j] > m || arg == classes) { m = l[j]; arg = j; }
  for (int off = 16; off > 0; off /= 2) {
    const float om = __shfl_xor_sync(0xffffffffu, m, off);
    const int oa = __shfl_xor_sync(0xffffffffu, arg, off);
    if (oa < classes && (arg == classes || om > m || (om == m && oa < arg))) { m = om; arg = oa; }
  }
  float sum = 0.f;
  for (int j = lane; j < classes; j += 32) sum += expf(l[j] - m);
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const int y = labels[warp];
  const bool valid = y >= 0 && y < classes;
  if (lane == 0) {
    row_loss[warp] = valid ? logf(sum) - (l[y] - m) : NAN;
    row_ok[warp] = valid && arg == y;
  }
  if (dlogits) {
    float* d = dlogits + size_t(warp) * classes;
    const float inv = 1.f / sum;
    for (int j = lane; j < classes; j += 32)
      d[j] = expf(l[j] - m) * inv * grad_scale - (j == y ? grad_scale : 0.f);
  }
}

// One block: strided per-thread sums, then a tree in shared memory. Same order every call.
__global__ void softmax_xent_total(const float* row_loss, const int* row_ok, int batch,
                                   float* stats) {
  __shared__ float sl[kThreads];
  __shared__ int sc[kThreads];
  float l = 0.f;
  int c = 0;
  for (int i = threadIdx.x; i < batch; i += kThreads) { l += row_loss[i]; c += row_ok[i]; }
  sl[threadIdx.x] = l;
  sc[threadIdx.x] = c;
  __syncthreads();
  for (int h = kThreads / 2; h > 0; h /= 2) {
    if (threadIdx.x < h) { sl[threadIdx.x] += sl[threadIdx.x + h]; sc[threadIdx.x] += sc[threadIdx.x + h]; }
    __syncthreads();
  }
  if (threadIdx.x == 0) { stats[0] += sl[0]; stats[1] += float(sc[0]); }
}

struct OptArgs {
  float lr, momentum, wd, b1, b2, eps;
  float step_size;  // lr / (1 − β1^t)
  float bc2_sqrt;   // sqrt(1 − β2^t)
  float shrink;     // 1 − lr·wd (adamw)
  // When ctl is set, lr and t come from the device (lr_table[ctl->step], ctl->updates + 1) and
  // the update is skipped when ctl->bad: the same step can then be replayed from a graph.
  const float* lr_table;
  const StepCtl* ctl;
};

// The step's hyper-parameters as read on the device; false when the step is to be skipped.
__device__ __forceinline__ bool resolve(OptArgs& h) {
  if (!h.ctl) return true;
  if (h.ctl->bad) return false;
  const float t = float(h.ctl->updates + 1);
  h.lr = h.lr_table[h.ctl->step];
  h.step_size = h.lr / (1.f - powf(h.b1, t));
  h.bc2_sqrt = sqrtf(1.f - powf(h.b2, t));
  h.shrink = 1.f - h.lr * h.wd;
  return true;
}

// torch.optim update of one element; m is momentum_buffer / exp_avg, v is exp_avg_sq.
template <OptKind K>
__device__ __forceinline__ void opt_one(float& p, float g, float& m, float& v, const OptArgs& h) {
  if constexpr (K == OptKind::sgd) {
    p -= h.lr * (g + h.wd * p);
  } else if constexpr (K == OptKind::momentum || K == OptKind::nesterov) {
    g += h.wd * p;
    m = h.momentum * m + g;  // dampening 0; the buffer starts at zero, so step 1 gives m = g
    p -= h.lr * (K == OptKind::nesterov ? g + h.momentum * m : m);
  } else {
    if constexpr (K == OptKind::adamw) p *= h.shrink;
    else g += h.wd * p;
    m = h.b1 * m + (1.f - h.b1) * g;
    v = h.b2 * v + (1.f - h.b2) * g * g;
    p -= h.step_size * m / (sqrtf(v) / h.bc2_sqrt + h.eps);
  }
}

template <OptKind K> __host__ __device__ constexpr bool uses_m() { return K != OptKind::sgd; }
template <OptKind K> __host__ __device__ constexpr bool uses_v() { return K == OptKind::adam || K == OptKind::adamw; }

// Vector part: 16-byte accesses over n4 float4s (only launched when every pointer is 16-byte
// aligned); the caller handles the n % 4 tail with the scalar kernel.
template <OptKind K>
__global__ void optimizer_vec4(float4* p, const float4* g, float4* s1, float4* s2, size_t n4,
                               OptArgs h) {
  if (!resolve(h)) return;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4;
       i += size_t(gridDim.x) * blockDim.x) {
    float4 P = p[i];
    const float4 G = g[i];
    float4 M = uses_m<K>() ? s1[i] : float4{};
    float4 V = uses_v<K>() ? s2[i] : float4{};
    opt_one<K>(P.x, G.x, M.x, V.x, h);
    opt_one<K>(P.y, G.y, M.y, V.y, h);
    opt_one<K>(P.z, G.z, M.z, V.z, h);
    opt_one<K>(P.w, G.w, M.w, V.w, h);
    p[i] = P;
    if (uses_m<K>()) s1[i] = M;
    if (uses_v<K>()) s2[i] = V;
  }
}

template <OptKind K>
__global__ void optimizer_scalar(float* p, const float* g, float* s1, float* s2, size_t n,
                                 OptArgs h) {
  if (!resolve(h)) return;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    float m = uses_m<K>() ? s1[i] : 0.f, v = uses_v<K>() ? s2[i] : 0.f;
    opt_one<K>(p[i], g[i], m, v, h);
    if (uses_m<K>()) s1[i] = m;
    if (uses_v<K>()) s2[i] = v;
  }
}

// Bit test rather than isfinite(): immune to any fast-math assumption that NaNs do not occur.
__global__ void nonfinite_kernel(const float* p, size_t n, int* flag) {
  bool bad = false;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    bad |= (__float_as_uint(p[i]) & 0x7f800000u) == 0x7f800000u;
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

// One block per output row (grid-stride over rows), threads over the row's dim values.
// Rows are rows[base + i], base = ctl->cursor + first when ctl is set (the replayable step),
// else first.
template <class T>
__global__ void gather_kernel(const T* feat, const int32_t* labels, const int64_t* rows,
                              const StepCtl* ctl, int64_t first, int count, int64_t dim,
                              float scale, float offset, float* x, int32_t* y) {
  const int64_t base = (ctl ? ctl->cursor : 0) + first;
  for (int i = blockIdx.x; i < count; i += gridDim.x) {
    const int64_t r = rows[base + i];
    const T* src = feat + r * dim;
    float* dst = x + int64_t(i) * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
      dst[j] = __fadd_rn(__fmul_rn(float(src[j]), scale), offset);  // no FMA: as on the host
    if (threadIdx.x == 0) y[i] = labels[r];
  }
}

__global__ void end_step_kernel(StepCtl* c, int64_t global_batch, bool sticky) {
  ++c->step;
  if (c->bad) {
    ++c->skipped;
    if (c->first_bad < 0) c->first_bad = c->step;
    if (!sticky) c->bad = 0;
  } else {
    ++c->updates;
  }
  c->cursor += global_batch;
}

// ============================== launchers ==============================

// Grid for a grid-stride loop over n elements: enough blocks to fill the GPU several times.
unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(std::min<size_t>(blocks, 132 * 32));
}

template <OptKind K>
void optimizer_launch(float* p, const float* g, float* s1, float* s2, size_t n, const OptArgs& a,
                      cudaStream_t s) {
  auto aligned = [](const void* q) { return q == nullptr || reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  size_t done = 0;
  if (aligned(p) && aligned(g) && aligned(s1) && aligned(s2) && n >= 4) {
    const size_t n4 = n / 4;
    optimizer_vec4<K><<<grid_for(n4), kThreads, 0, s>>>(
        reinterpret_cast<float4*>(p), reinterpret_cast<const float4*>(g),
        reinterpret_cast<float4*>(s1), reinterpret_cast<float4*>(s2), n4, a);
    DPT_CHECK_LAUNCH("optimizer_vec4");
    done = n4 * 4;
  }
  if (done < n) {
    optimizer_scalar<K><<<grid_for(n - done), kThreads, 0, s>>>(
        p + done, g + done, s1 ? s1 + done : nullptr, s2 ? s2 + done : nullptr, n - done, a);
    DPT_CHECK_LAUNCH("optimizer_scalar");
  }
}

}  // namespace

void fill(float* p, size_t n, float v, cudaStream_t s) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, s>>>(p, n, v);
  DPT_CHECK_LAUNCH("fill_kernel");
}

void scale(float* p, size_t n, float a, cudaStream_t s) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, s>>>(p, n, a);
  DPT_CHECK_LAUNCH("scale_kernel");
}

void bias_act_forward(float* z, float* a, const float* b, int batch, int out, Act act,
                      cudaStream_t s) {
  const size_t n = size_t(batch) * size_t(out);
  if (n == 0) return;
  bias_act_kernel<<<grid_for(n), kThreads, 0, s>>>(z, a, b, n, out, act);
  DPT_CHECK_LAUNCH("bias_act_kernel");
}

void act_backward(float* da, const float* z, const float* a, size_t n, Act act, cudaStream_t s) {
  if (n == 0 || act == Act::none) return;
  act_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(da, z, a, n, act);
  DPT_CHECK_LAUNCH("act_backward_kernel");
}

void bias_grad(const float* dz, float* db, int batch, int out, bool accumulate, cudaStream_t s) {
  if (out == 0) return;
  bias_grad_kernel<<<unsigned((out + 31) / 32), dim3(32, 8), 0, s>>>(dz, db, batch, out,
                                                                     accumulate);
  DPT_CHECK_LAUNCH("bias_grad_kernel");
}

void to_bf16(const float* src, void* dst, size_t n, cudaStream_t s) {
  if (n == 0) return;
  to_bf16_kernel<<<grid_for(n), kThreads, 0, s>>>(src, static_cast<__nv_bfloat16*>(dst), n);
  DPT_CHECK_LAUNCH("to_bf16_kernel");
}

void softmax_xent(const float* logits, const int32_t* labels, int batch, int classes,
                  float grad_scale, float* dlogits, float* row_loss, int* row_ok, float* stats,
                  cudaStream_t s) {
  if (batch == 0) return;
  const int rows_per_block = kThreads / 32;
  softmax_xent_rows<<<unsigned((batch + rows_per_block - 1) / rows_per_block), kThreads, 0, s>>>(
      logits, labels, batch, classes, grad_scale, dlogits, row_loss, row_ok);
  DPT_CHECK_LAUNCH("softmax_xent_rows");
  if (stats) {
    softmax_xent_total<<<1, kThreads, 0, s>>>(row_loss, row_ok, batch, stats);
    DPT_CHECK_LAUNCH("softmax_xent_total");
  }
}

void optimizer_step(float* p, const float* g, float* s1, float* s2, size_t n, const OptimStep& h,
                    cudaStream_t s, const float* lr_table, const StepCtl* ctl) {
  if (n == 0) return;
  OptArgs a{};
  a.lr_table = lr_table;
  a.ctl = ctl;
  a.lr = h.lr;
  a.momentum = h.momentum;
  a.wd = h.weight_decay;
  a.b1 = h.beta1;
  a.b2 = h.beta2;
  a.eps = h.eps;
  // Bias corrections in float, the same expressions as the CPU backend.
  a.step_size = h.lr / (1.f - std::pow(h.beta1, float(h.t)));
  a.bc2_sqrt = std::sqrt(1.f - std::pow(h.beta2, float(h.t)));
  a.shrink = 1.f - h.lr * h.weight_decay;
  switch (h.kind) {
    case OptKind::sgd: optimizer_launch<OptKind::sgd>(p, g, nullptr, nullptr, n, a, s); return;
    case OptKind::momentum: optimizer_launch<OptKind::momentum>(p, g, s1, nullptr, n, a, s); return;
    case OptKind::nesterov: optimizer_launch<OptKind::nesterov>(p, g, s1, nullptr, n, a, s); return;
    case OptKind::adam: optimizer_launch<OptKind::adam>(p, g, s1, s2, n, a, s); return;
    case OptKind::adamw: optimizer_launch<OptKind::adamw>(p, g, s1, s2, n, a, s); return;
  }
}

void flag_nonfinite(const float* p, size_t n, int* flag, cudaStream_t s) {
  if (n == 0) return;
  nonfinite_kernel<<<grid_for(n), kThreads, 0, s>>>(p, n, flag);
  DPT_CHECK_LAUNCH("nonfinite_kernel");
}

void gather_rows(const void* feat, bool is_u8, const int32_t* labels, const int64_t* rows,
                 int count, int64_t dim, float scale, float offset, float* x, int32_t* y,
                 cudaStream_t s, const StepCtl* ctl, int64_t first) {
  if (count == 0) return;
  const unsigned grid = unsigned(std::min(count, 65535));
  if (is_u8)
    gather_kernel<uint8_t><<<grid, kThreads, 0, s>>>(static_cast<const uint8_t*>(feat), labels,
                                                     rows, ctl, first, count, dim, scale, offset, x, y);
  else
    gather_kernel<float><<<grid, kThreads, 0, s>>>(static_cast<const float*>(feat), labels, rows,
                                                   ctl, first, count, dim, scale, offset, x, y);
  DPT_CHECK_LAUNCH("gather_kernel");
}

void end_step(StepCtl* ctl, int64_t global_batch, bool sticky, cudaStream_t s) {
  end_step_kernel<<<1, 1, 0, s>>>(ctl, global_batch, sticky);
  DPT_CHECK_LAUNCH("end_step_kernel");
}

}  // namespace dpt::cuda
