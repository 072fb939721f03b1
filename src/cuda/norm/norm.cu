// The CUDA backend's kernels for residual networks beside batch norm (bn.cu): the residual sum,
// global average pooling, padded max/avg pooling and its gather-form backward, and the
// label-smoothed softmax cross-entropy. Kernels first, launchers after. Channel tiles:
// channel_tiles.cuh.
//
// Determinism. A reduction runs in a fixed order; backward passes of pooling are gathers (one
// thread per input element), never atomics.
//
// Fast math. The build compiles CUDA with --use_fast_math: single-precision division, sqrt, exp
// and log become approximate, denormals flush to zero, and nvcc contracts a·b + c into an FMA.
// Double precision is untouched; the elementwise passes use __fmul_rn / __fadd_rn / __fsub_rn /
// __fdiv_rn (never contracted, IEEE-rounded) in the CPU's operation order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "channel_tiles.cuh"
#include "device_util.cuh"
#include "dpt/cuda_check.hpp"
#include "norm_kernels.cuh"

namespace dpt::cuda {
namespace {

// Pooling indexes pixels in 32 bits (Div): they and the grid-stride loop's last step fit in 2^31.
constexpr int64_t kMaxPoolPixels = (int64_t(1) << 31) - kPassBlocks * kThreads;

// ============================== kernels ==============================

__global__ void add_kernel(const float* x, float* y, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void add4_kernel(const float4* x, float4* y, size_t n4) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    const float4 a = x[i];
    float4 v = y[i];
    v.x += a.x; v.y += a.y; v.z += a.z; v.w += a.w;
    y[i] = v;
  }
}

// y = body + shortcut, max(y, 0) with relu: y unless nullptr, and its bf16 copy into y16 unless
// nullptr. body and shortcut each float or bf16 (a copy that is the tensor's only one).
__device__ __forceinline__ float sum_act(float a, float b, bool relu) {
  const float v = a + b;
  return relu ? (v > 0.f ? v : 0.f) : v;
}

template <class TA, class TB>
__global__ void residual_sum_kernel(const TA* __restrict__ a, const TB* __restrict__ b, float* __restrict__ y,
                                    __nv_bfloat16* __restrict__ y16, size_t n, bool relu) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = sum_act(ld(a, i), ld(b, i), relu);
    if (y) y[i] = v;
    if (y16) y16[i] = __float2bfloat16_rn(v);
  }
}

template <class TA, class TB>
__global__ void residual_sum4_kernel(const TA* __restrict__ a, const TB* __restrict__ b, float4* __restrict__ y,
                                     __nv_bfloat162* __restrict__ y16, size_t n4, bool relu) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    const float4 p = ld4(a, i), q = ld4(b, i);
    const float4 v = {sum_act(p.x, q.x, relu), sum_act(p.y, q.y, relu), sum_act(p.z, q.z, relu),
                      sum_act(p.w, q.w, relu)};
    if (y) y[i] = v;
    if (y16) {
      y16[2 * i] = __floats2bfloat162_rn(v.x, v.y);
      y16[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
    }
  }
}

// residual_backward: d = d where the mask (float, or bf16 with M16) > 0, else 0; keep = d. keep
// may be the float mask: each element is read before it is written, by the same thread.
template <bool M16> __device__ __forceinline__ float mask_at(const void* mask, size_t i) {
  if constexpr (M16) return __bfloat162float(static_cast<const __nv_bfloat16*>(mask)[i]);
  else return static_cast<const float*>(mask)[i];
}

// d16 (unless nullptr): the masked d written there in bf16 instead of over d's floats.
template <bool M16>
__global__ void residual_bwd_kernel(float* d, const void* mask, float* keep, __nv_bfloat16* d16, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = mask_at<M16>(mask, i) > 0.f ? d[i] : 0.f;
    if (d16) d16[i] = __float2bfloat16_rn(v);
    else d[i] = v;
    keep[i] = v;
  }
}

template <bool M16>
__global__ void residual_bwd4_kernel(float4* d, const void* mask, float4* keep, __nv_bfloat162* d16, size_t n4) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    float4 m;
    if constexpr (M16) m = ld4(static_cast<const __nv_bfloat16*>(mask), i);
    else m = ld4(static_cast<const float*>(mask), i);
    float4 v = d[i];
    v.x = m.x > 0.f ? v.x : 0.f;
    v.y = m.y > 0.f ? v.y : 0.f;
    v.z = m.z > 0.f ? v.z : 0.f;
    v.w = m.w > 0.f ? v.w : 0.f;
    if (d16) {
      d16[2 * i] = __floats2bfloat162_rn(v.x, v.y);
      d16[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
    } else {
      d[i] = v;
    }
    keep[i] = v;
  }
}

// y[n][j] = float(Σ_p x[n][p][j] / hw), one thread per (sample, channel), summed in double in p
// order: the CPU's sums, bit for bit.
__global__ void gap_fwd_kernel(const float* __restrict__ x, float* __restrict__ y, int batch, int hw, int c) {
  const int j = channel();
  if (j >= c) return;
  for (int64_t n = first_row(); n < batch; n += row_step()) {
    const float* xn = x + size_t(n) * size_t(hw) * size_t(c) + size_t(j);
    double acc = 0.0;
    for (int p = 0; p < hw; ++p) acc += xn[size_t(p) * size_t(c)];
    y[size_t(n) * size_t(c) + size_t(j)] = float(acc / hw);
  }
}

// dx[n][p][j] = dy[n][j]·inv, inv = 1/hw rounded on the host as the CPU's.
__global__ void gap_bwd_kernel(const float* __restrict__ dy, float* __restrict__ dx, int batch, int hw, int c,
                               float inv) {
  const int j = channel();
  if (j >= c) return;
  for (int64_t n = first_row(); n < batch; n += row_step()) {
    const float v = dy[size_t(n) * size_t(c) + size_t(j)] * inv;
    float* dn = dx + size_t(n) * size_t(hw) * size_t(c) + size_t(j);
    for (int p = 0; p < hw; ++p) dn[size_t(p) * size_t(c)] = v;
  }
}

// A bit test, immune to fast math's assumption that NaNs do not occur.
__device__ __forceinline__ bool is_nan(float v) { return (__float_as_uint(v) & 0x7fffffffu) > 0x7f800000u; }

// The pooling kernels take one thread per pixel and channel, pixels indexed in 32 bits.
//
// Forward: one output pixel (n, oh, ow). The window's taps inside the input, in row-major order
// (padding skipped: PyTorch's clipped window, the same as padding with −inf for max). Max: the
// first maximum, a NaN replaces it, argmax = the tap kh·k + kw. Avg: summed from the first valid
// tap, divided by k² (the padding's zeros counted, count_include_pad). A window with no valid tap
// (pad >= k, which PyTorch refuses) gives max −inf, argmax 255 (no tap: store_args); avg 0.
// V consecutive channels (1, or 4 in one 16-byte access).
template <int V, class T> __device__ __forceinline__ void ldv(const T* p, size_t i, T (&v)[V]) {
  if constexpr (V == 4) {
    static_assert(sizeof(T) == 4, "four 4-byte values");
    const float4 f = *reinterpret_cast<const float4*>(p + i);
    const T* t = reinterpret_cast<const T*>(&f);
    for (int k = 0; k < 4; ++k) v[k] = t[k];
  } else {
    for (int k = 0; k < V; ++k) v[k] = p[i + k];
  }
}
template <int V, class T> __device__ __forceinline__ void stv(T* p, size_t i, const T (&v)[V]) {
  if constexpr (V == 4) {
    float4 f;
    T* t = reinterpret_cast<T*>(&f);
    for (int k = 0; k < 4; ++k) t[k] = v[k];
    *reinterpret_cast<float4*>(p + i) = f;
  } else {
    for (int k = 0; k < V; ++k) p[i + k] = v[k];
  }
}

// V consecutive values from element i (a multiple of V), widened to float on load (one, or four
// in one 16-byte float or 8-byte bf16 access) and rounded to the type on store.
template <int V, class T> __device__ __forceinline__ void ldf(const T* p, size_t i, float (&v)[V]) {
  if constexpr (V == 4) {
    const float4 f = ld4(p, i / 4);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    v[0] = ld(p, i);
  }
}
template <int V, class T> __device__ __forceinline__ void stf(T* p, size_t i, const float (&v)[V]) {
  if constexpr (V == 4 && std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
  } else if constexpr (V == 4) {
    uint2 u;
    *reinterpret_cast<__nv_bfloat162*>(&u.x) = __floats2bfloat162_rn(v[0], v[1]);
    *reinterpret_cast<__nv_bfloat162*>(&u.y) = __floats2bfloat162_rn(v[2], v[3]);
    *reinterpret_cast<uint2*>(p + i) = u;
  } else {
    st(p, i, v[0]);
  }
}

// K > 0: the window's size known at compile time (3: ResNet's stem), so the taps' loads unroll
// and are issued together (conv.cu's pool_fwd_kernel says why). The same arithmetic.
template <bool MAX, int V, int K, class TX, class TY>
__global__ void padded_pool_fwd_kernel(const TX* __restrict__ x, TY* __restrict__ y,
                                       uint8_t* __restrict__ argmax, PoolGeom g, Div plane, Div ow_n,
                                       int pixels) {
  const int j = channel() * V;
  if (j >= g.c) return;
  const int kk = K > 0 ? K : g.k;
  const float area = float(kk * kk);
  for (int p = int(first_row()); p < pixels; p += int(row_step())) {
    int q, ow;
    const int n = plane.divmod(p, q);
    const int oh = ow_n.divmod(q, ow);
    const int h0 = oh * g.stride - g.pad, w0 = ow * g.stride - g.pad;
    float best[V] = {};
    int idx[V];
    for (int k = 0; k < V; ++k) idx[k] = -1;
#pragma unroll(K > 0 ? K : 1)
    for (int kh = 0; kh < kk; ++kh) {
      const int ih = h0 + kh;
      if (ih < 0 || ih >= g.h) continue;
#pragma unroll(K > 0 ? K : 1)
      for (int kw = 0; kw < kk; ++kw) {
        const int iw = w0 + kw;
        if (iw < 0 || iw >= g.w) continue;
        float v[V];
        ldf<V>(x, ((size_t(n) * size_t(g.h) + size_t(ih)) * size_t(g.w) + size_t(iw)) * size_t(g.c) + size_t(j), v);
        const int tap = kh * kk + kw;
        for (int k = 0; k < V; ++k) {
          if (idx[k] < 0) {
            best[k] = v[k];
            idx[k] = tap;
          } else if (MAX) {
            if (v[k] > best[k] || is_nan(v[k])) {
              best[k] = v[k];
              idx[k] = tap;
            }
          } else {
            best[k] += v[k];
          }
        }
      }
    }
    const size_t o = size_t(p) * size_t(g.c) + size_t(j);
    if (MAX) {
      for (int k = 0; k < V; ++k) best[k] = idx[k] < 0 ? -INFINITY : best[k];
      store_args<V>(argmax, o, idx);
    } else {
      for (int k = 0; k < V; ++k) best[k] = __fdiv_rn(best[k], area);
    }
    stf<V>(y, o, best);
  }
}

// Backward: one input pixel (n, ih, iw), the sum over the windows holding it, oh then ow
// ascending (the CPU's scatter order, so the same sums bit for bit). Max: dy where the window's
// argmax is this element's tap; avg: dy / k².
template <bool MAX, int V, class TD, class TO>
__global__ void padded_pool_bwd_kernel(const TD* __restrict__ dy, const uint8_t* __restrict__ argmax,
                                       TO* __restrict__ dx, PoolGeom g, Div plane, Div w_n, Div st,
                                       int oh_n, int ow_n, int pixels) {
  const int j = channel() * V;
  if (j >= g.c) return;
  const float area = float(g.k * g.k);
  for (int p = int(first_row()); p < pixels; p += int(row_step())) {
    int q, iw;
    const int n = plane.divmod(p, q);
    const int ih = w_n.divmod(q, iw);
    // Window oh holds row ih when its tap kh = yh − oh·s lies in [0, k): yh − k < oh·s <= yh.
    const int yh = ih + g.pad, yw = iw + g.pad;
    const int oh0 = yh < g.k ? 0 : st.div(yh - g.k) + 1, oh1 = min(oh_n - 1, st.div(yh));
    const int ow0 = yw < g.k ? 0 : st.div(yw - g.k) + 1, ow1 = min(ow_n - 1, st.div(yw));
    float s[V] = {};
    for (int oh = oh0; oh <= oh1; ++oh)
      for (int ow = ow0; ow <= ow1; ++ow) {
        const size_t o = ((size_t(n) * size_t(oh_n) + size_t(oh)) * size_t(ow_n) + size_t(ow)) * size_t(g.c) + size_t(j);
        float d[V];
        ldf<V>(dy, o, d);
        if (MAX) {
          int am[V];
          load_args<V>(argmax, o, am);
          const int tap = (yh - oh * g.stride) * g.k + (yw - ow * g.stride);
          for (int k = 0; k < V; ++k)
            if (am[k] == tap) s[k] += d[k];
        } else {
          for (int k = 0; k < V; ++k) s[k] += __fdiv_rn(d[k], area);
        }
      }
    stf<V>(dx, size_t(p) * size_t(g.c) + size_t(j), s);
  }
}

// One warp per row, softmax_xent_rows's structure (kernels.cu). The maximum and its first index
// as the CPU's (ties to the lowest index). exp, the sums and the loss in double, as the CPU sums;
// double is exact IEEE under fast math. The warp's sums are reduced by a fixed butterfly, then
// lane 0's are broadcast so that every lane uses the same values. dlogits: float(exp(double)),
// the correctly rounded expf of the CPU but for rare ties, then the CPU's float operations in its
// order, unfused.
__global__ void xent_smoothed_rows(const float* __restrict__ logits, const int32_t* __restrict__ labels,
                                   int batch, int classes, float grad_scale, float eps,
                                   float* __restrict__ dlogits, double* __restrict__ row_loss,
                                   int* __restrict__ row_ok) {
  const int warp = int((blockIdx.x * size_t(blockDim.x) + threadIdx.x) / 32);
  const int lane = threadIdx.x % 32;
  if (warp >= batch) return;  // whole warps leave together: the shuffles below stay full-warp
  const float* l = logits + size_t(warp) * size_t(classes);
  float m = -INFINITY;
  int arg = classes;
  for (int j = lane; j < classes; j += 32)
    if (l[j] > m || arg == classes) { m = l[j]; arg = j; }
  for (int off = 16; off > 0; off /= 2) {
    const float om = __shfl_xor_sync(0xffffffffu, m, off);
    const int oa = __shfl_xor_sync(0xffffffffu, arg, off);
    if (oa < classes && (arg == classes || om > m || (om == m && oa < arg))) { m = om; arg = oa; }
  }
  double sum = 0.0, all = 0.0;
  for (int j = lane; j < classes; j += 32) {
    const double z = double(l[j] - m);
    sum += exp(z);
    all += z;
  }
  for (int off = 16; off > 0; off /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, off);
    all += __shfl_xor_sync(0xffffffffu, all, off);
  }
  sum = __shfl_sync(0xffffffffu, sum, 0);
  all = __shfl_sync(0xffffffffu, all, 0);
  const int y = labels[warp];
  const bool valid = y >= 0 && y < classes;
  if (lane == 0) {
    const double lse = log(sum);
    row_loss[warp] = valid ? (1.0 - eps) * (lse - double(l[y] - m)) + eps * (lse - all / classes) : double(NAN);
    row_ok[warp] = valid && arg == y;
  }
  if (dlogits) {
    float* d = dlogits + size_t(warp) * size_t(classes);
    const float inv = float(1.0 / sum);
    const float off = __fmul_rn(float(double(eps) / classes), grad_scale);
    const float hit = __fmul_rn(1.f - eps, grad_scale);
    for (int j = lane; j < classes; j += 32) {
      const float e = float(exp(double(l[j] - m)));
      float v = __fsub_rn(__fmul_rn(__fmul_rn(e, inv), grad_scale), off);
      if (j == y) v = __fsub_rn(v, hit);
      d[j] = v;
    }
  }
}

// ---- the residual gradient stream with bf16 operands (sum_io, residual_backward_io) ----
// Eight values per thread where every pointer is 16-byte aligned (ld8 / st8), one at a time in
// the tail; each operand bf16 or float as its type says.

// out = a + b.
template <class TA, class TB, class TO>
__global__ void sum_io_kernel(const TA* a, const TB* b, TO* out, size_t n, bool by8) {
  const size_t step = size_t(gridDim.x) * blockDim.x;
  if (by8) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n / 8; i += step) {
      float x[8], y[8];
      ld8(a, i * 8, x);
      ld8(b, i * 8, y);
      for (int k = 0; k < 8; ++k) x[k] = x[k] + y[k];
      st8(out, i * 8, x);
    }
  }
  for (size_t i = (by8 ? n / 8 * 8 : 0) + blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += step)
    st(out, i, ld(a, i) + ld(b, i));
}

// v = mask > 0 ? d : 0, written to out (unless nullptr) and keep. out may be d and keep the mask
// (same type): each element is read before it is written, by the same thread.
template <class TD, class TM, class TO, class TK>
__global__ void residual_bwd_io_kernel(const TD* d, const TM* mask, TO* out, TK* keep, size_t n, bool by8) {
  const size_t step = size_t(gridDim.x) * blockDim.x;
  if (by8) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n / 8; i += step) {
      float v[8], m[8];
      ld8(d, i * 8, v);
      ld8(mask, i * 8, m);
      for (int k = 0; k < 8; ++k) v[k] = m[k] > 0.f ? v[k] : 0.f;
      if (out) st8(out, i * 8, v);
      st8(keep, i * 8, v);
    }
  }
  for (size_t i = (by8 ? n / 8 * 8 : 0) + blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += step) {
    const float v = ld(mask, i) > 0.f ? ld(d, i) : 0.f;
    if (out) st(out, i, v);
    st(keep, i, v);
  }
}

// f called with p as a pointer to its type: bf16 or float.
template <class F> void as_typed(const void* p, bool b16, F&& f) {
  if (b16) f(static_cast<const __nv_bfloat16*>(p));
  else f(static_cast<const float*>(p));
}
template <class F> void as_typed_out(void* p, bool b16, F&& f) {
  if (b16) f(static_cast<__nv_bfloat16*>(p));
  else f(static_cast<float*>(p));
}

// ============================== launchers ==============================

}  // namespace

void sum_io(Operand a, Operand b, void* out, bool out_bf16, size_t n, cudaStream_t s) {
  if (n == 0) return;
  const bool by8 = aligned16(a.p) && aligned16(b.p) && aligned16(out);
  as_typed(a.p, a.bf16, [&](auto* pa) {
    as_typed(b.p, b.bf16, [&](auto* pb) {
      as_typed_out(out, out_bf16, [&](auto* po) {
        sum_io_kernel<<<grid_for(by8 ? n / 8 + 1 : n), kThreads, 0, s>>>(pa, pb, po, n, by8);
        DPT_CHECK_LAUNCH("sum_io_kernel");
      });
    });
  });
}

void residual_backward_io(Operand d, Operand mask, void* out, bool out_bf16, void* keep, bool keep_bf16, size_t n,
                          cudaStream_t s) {
  if (n == 0) return;
  const bool by8 = aligned16(d.p) && aligned16(mask.p) && aligned16(out) && aligned16(keep);
  as_typed(d.p, d.bf16, [&](auto* pd) {
    as_typed(mask.p, mask.bf16, [&](auto* pm) {
      as_typed_out(out, out_bf16, [&](auto* po) {
        as_typed_out(keep, keep_bf16, [&](auto* pk) {
          residual_bwd_io_kernel<<<grid_for(by8 ? n / 8 + 1 : n), kThreads, 0, s>>>(pd, pm, po, pk, n, by8);
          DPT_CHECK_LAUNCH("residual_bwd_io_kernel");
        });
      });
    });
  });
}

void add(const float* x, float* y, size_t n, cudaStream_t s) {
  size_t done = 0;
  if (aligned16(x) && aligned16(y) && n >= 4) {
    add4_kernel<<<grid_for(n / 4), kThreads, 0, s>>>(reinterpret_cast<const float4*>(x),
                                                     reinterpret_cast<float4*>(y), n / 4);
    DPT_CHECK_LAUNCH("add4_kernel");
    done = n / 4 * 4;
  }
  if (done < n) {
    add_kernel<<<grid_for(n - done), kThreads, 0, s>>>(x + done, y + done, n - done);
    DPT_CHECK_LAUNCH("add_kernel");
  }
}

// As add: float4 where every pointer allows (the bf16 copy's 8 bytes per four), the rest one by one.
void residual_sum(Operand body, Operand shortcut, float* y, void* y16, size_t n, bool relu, cudaStream_t s) {
  auto* o16 = static_cast<__nv_bfloat16*>(y16);
  auto run = [&](auto* a, auto* b) {
    // Four at a time where every pointer allows it (8 bytes per four in bf16), the rest one by one.
    auto fits = [](const auto* p) {
      return reinterpret_cast<uintptr_t>(p) % (sizeof(*p) == 2 ? 8 : 16) == 0;
    };
    size_t done = 0;
    if (fits(a) && fits(b) && aligned16(y) && reinterpret_cast<uintptr_t>(y16) % 8 == 0 && n >= 4) {
      residual_sum4_kernel<<<grid_for(n / 4), kThreads, 0, s>>>(a, b, reinterpret_cast<float4*>(y),
                                                                 reinterpret_cast<__nv_bfloat162*>(o16), n / 4, relu);
      DPT_CHECK_LAUNCH("residual_sum4_kernel");
      done = n / 4 * 4;
    }
    if (done < n) {
      residual_sum_kernel<<<grid_for(n - done), kThreads, 0, s>>>(a + done, b + done, y ? y + done : nullptr,
                                                                  o16 ? o16 + done : nullptr, n - done, relu);
      DPT_CHECK_LAUNCH("residual_sum_kernel");
    }
  };
  auto f32 = [](const void* p) { return static_cast<const float*>(p); };
  auto b16 = [](const void* p) { return static_cast<const __nv_bfloat16*>(p); };
  if (!body.bf16 && !shortcut.bf16) run(f32(body.p), f32(shortcut.p));
  else if (body.bf16 && !shortcut.bf16) run(b16(body.p), f32(shortcut.p));
  else if (!body.bf16) run(f32(body.p), b16(shortcut.p));
  else run(b16(body.p), b16(shortcut.p));
}

// As add: four at a time where every pointer allows (the bf16 mask's 8 bytes per four), the rest
// one by one.
void residual_backward(float* d, const void* mask, bool mask_bf16, float* keep, void* d16, size_t n, cudaStream_t s) {
  size_t done = 0;
  auto* o16 = static_cast<__nv_bfloat16*>(d16);
  auto run = [&](auto m16) {
    constexpr bool M16 = decltype(m16)::value;
    if (aligned16(d) && aligned16(keep) && reinterpret_cast<uintptr_t>(mask) % (M16 ? 8 : 16) == 0 &&
        reinterpret_cast<uintptr_t>(d16) % 8 == 0 && n >= 4) {
      residual_bwd4_kernel<M16><<<grid_for(n / 4), kThreads, 0, s>>>(reinterpret_cast<float4*>(d), mask,
                                                                      reinterpret_cast<float4*>(keep),
                                                                      reinterpret_cast<__nv_bfloat162*>(o16), n / 4);
      DPT_CHECK_LAUNCH("residual_bwd4_kernel");
      done = n / 4 * 4;
    }
    if (done < n) {
      const void* mrest = static_cast<const char*>(mask) + done * (M16 ? 2 : 4);
      residual_bwd_kernel<M16><<<grid_for(n - done), kThreads, 0, s>>>(d + done, mrest, keep + done,
                                                                       o16 ? o16 + done : nullptr, n - done);
      DPT_CHECK_LAUNCH("residual_bwd_kernel");
    }
  };
  if (mask_bf16) run(std::true_type{});
  else run(std::false_type{});
}

void global_avgpool_forward(const float* x, float* y, int batch, int hw, int c, cudaStream_t s) {
  if (batch <= 0 || c <= 0) return;
  const Tiles t = tiles_for(c, "global_avgpool_forward");
  gap_fwd_kernel<<<pass_grid(t, batch), block_of(t), 0, s>>>(x, y, batch, hw, c);
  DPT_CHECK_LAUNCH("gap_fwd_kernel");
}

void global_avgpool_backward(const float* dy, float* dx, int batch, int hw, int c, cudaStream_t s) {
  if (batch <= 0 || c <= 0 || hw <= 0) return;
  const Tiles t = tiles_for(c, "global_avgpool_backward");
  gap_bwd_kernel<<<pass_grid(t, batch), block_of(t), 0, s>>>(dy, dx, batch, hw, c, 1.f / float(hw));
  DPT_CHECK_LAUNCH("gap_bwd_kernel");
}

// f(MAX, V), both compile-time constants: max or avg pooling, four channels per thread or one.
template <class F> void pool_variant(bool max, bool v4, F&& f) {
  using One = std::integral_constant<int, 1>;
  using Four = std::integral_constant<int, 4>;
  if (max) v4 ? f(std::true_type{}, Four{}) : f(std::true_type{}, One{});
  else v4 ? f(std::false_type{}, Four{}) : f(std::false_type{}, One{});
}

// Four channels per thread where c and every pointer allow (the ResNet stem's 64 channels).
void padded_pool_forward(Operand x, void* y, bool y_bf16, uint8_t* argmax, const PoolGeom& g, bool max,
                         cudaStream_t s) {
  if (g.batch <= 0 || g.c <= 0 || g.oh() <= 0 || g.ow() <= 0) return;
  const bool v4 = g.c % 4 == 0 && aligned16(x.p) && aligned16(y) && (!max || aligned16(argmax));
  const Tiles t = tiles_for(v4 ? g.c / 4 : g.c, "padded_pool_forward");
  const int64_t pixels = int64_t(g.batch) * g.oh() * g.ow();
  if (pixels >= kMaxPoolPixels) throw Error("padded_pool_forward: " + std::to_string(pixels) + " output pixels exceed 2^31");
  const dim3 grid = pass_grid(t, pixels), block = block_of(t);
  const Div plane(g.oh() * g.ow()), ow_n(g.ow());
  as_typed(x.p, x.bf16, [&](auto* px) {
    as_typed_out(y, y_bf16, [&](auto* py) {
      pool_variant(max, v4, [&](auto mx, auto vv) {
        constexpr bool MAX = decltype(mx)::value;
        constexpr int V = decltype(vv)::value;
        if (g.k == 3)
          padded_pool_fwd_kernel<MAX, V, 3><<<grid, block, 0, s>>>(px, py, MAX ? argmax : nullptr, g, plane, ow_n,
                                                                   int(pixels));
        else
          padded_pool_fwd_kernel<MAX, V, 0><<<grid, block, 0, s>>>(px, py, MAX ? argmax : nullptr, g, plane, ow_n,
                                                                   int(pixels));
      });
    });
  });
  DPT_CHECK_LAUNCH("padded_pool_fwd_kernel");
}

void padded_pool_backward(Operand dy, const uint8_t* argmax, void* dx, bool dx_bf16, const PoolGeom& g, bool max,
                          cudaStream_t s) {
  if (g.batch <= 0 || g.c <= 0 || g.h <= 0 || g.w <= 0) return;
  const bool v4 = g.c % 4 == 0 && aligned16(dy.p) && aligned16(dx) && (!max || aligned16(argmax));
  const Tiles t = tiles_for(v4 ? g.c / 4 : g.c, "padded_pool_backward");
  const int64_t pixels = int64_t(g.batch) * g.h * g.w;
  if (pixels >= kMaxPoolPixels) throw Error("padded_pool_backward: " + std::to_string(pixels) + " input pixels exceed 2^31");
  const dim3 grid = pass_grid(t, pixels), block = block_of(t);
  const Div plane(g.h * g.w), w_n(g.w), st(g.stride);
  as_typed(dy.p, dy.bf16, [&](auto* pd) {
    as_typed_out(dx, dx_bf16, [&](auto* po) {
      pool_variant(max, v4, [&](auto mx, auto vv) {
        constexpr bool MAX = decltype(mx)::value;
        constexpr int V = decltype(vv)::value;
        padded_pool_bwd_kernel<MAX, V><<<grid, block, 0, s>>>(pd, MAX ? argmax : nullptr, po, g, plane, w_n, st,
                                                              g.oh(), g.ow(), int(pixels));
      });
    });
  });
  DPT_CHECK_LAUNCH("padded_pool_bwd_kernel");
}

void softmax_xent_smoothed(const float* logits, const int32_t* labels, int batch, int classes,
                           float grad_scale, float eps, float* dlogits, double* row_loss,
                           int* row_ok, float* stats, cudaStream_t s) {
  if (batch <= 0) return;
  const int rows_per_block = kThreads / 32;
  xent_smoothed_rows<<<unsigned((batch + rows_per_block - 1) / rows_per_block), kThreads, 0, s>>>(
      logits, labels, batch, classes, grad_scale, eps, dlogits, row_loss, row_ok);
  DPT_CHECK_LAUNCH("xent_smoothed_rows");
  if (stats) {
    loss_totals<double, kThreads><<<1, kThreads, 0, s>>>(row_loss, row_ok, batch, stats);
    DPT_CHECK_LAUNCH("loss_totals");
  }
}

}  // namespace dpt::cuda