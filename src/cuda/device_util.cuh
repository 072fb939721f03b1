// Device helpers shared by the CUDA backend's kernel files (conv.cu, norm.cu, kernels.cu).
#pragma once
#include <cuda_runtime.h>

namespace dpt::cuda {

// Division by a divisor fixed for the launch, as a multiply-high and a shift (Granlund and
// Montgomery; the form CUTLASS's FastDivmod uses): exact for 0 <= n < 2^31, d >= 1. Splitting an
// element index into coordinates with it costs less than a hardware-emulated integer division,
// which would cost more than the memory-bound kernels' loads.
struct Div {
  int d = 1;
  unsigned mul = 0, shr = 0;
  Div() = default;
  explicit Div(int divisor) : d(divisor) {
    if (d == 1) return;
    int l = 0;  // ceil(log2 d)
    while ((1ll << l) < d) ++l;
    const unsigned p = 31u + unsigned(l);
    mul = unsigned(((1ull << p) + unsigned(d) - 1) / unsigned(d));
    shr = p - 32u;
  }
  __device__ __forceinline__ int div(int n) const { return d == 1 ? n : int(__umulhi(unsigned(n), mul) >> shr); }
  // n = q·d + r: q returned, r out.
  __device__ __forceinline__ int divmod(int n, int& r) const {
    const int q = div(n);
    r = n - q * d;
    return q;
  }
};

// The losses' totals, one block of THREADS threads: stats[0] += Σ row_loss, stats[1] += Σ row_ok,
// strided per-thread sums then a tree in shared memory, the same order every call. T is the
// per-row loss's type (float for the plain loss, double for the label-smoothed one).
template <class T, int THREADS>
__global__ void loss_totals(const T* __restrict__ row_loss, const int* __restrict__ row_ok, int batch,
                            float* __restrict__ stats) {
  __shared__ T sl[THREADS];
  __shared__ int sc[THREADS];
  T l = 0;
  int c = 0;
  for (int i = threadIdx.x; i < batch; i += THREADS) { l += row_loss[i]; c += row_ok[i]; }
  sl[threadIdx.x] = l;
  sc[threadIdx.x] = c;
  __syncthreads();
  for (int h = THREADS / 2; h > 0; h /= 2) {
    if (threadIdx.x < h) { sl[threadIdx.x] += sl[threadIdx.x + h]; sc[threadIdx.x] += sc[threadIdx.x + h]; }
    __syncthreads();
  }
  if (threadIdx.x == 0) { stats[0] += float(sl[0]); stats[1] += float(sc[0]); }
}

}  // namespace dpt::cuda
