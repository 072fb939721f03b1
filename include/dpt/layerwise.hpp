// The layer-wise optimizers' (LARS, LAMB) arithmetic of one tensor and one element, shared by
// the CPU loops (src/backend/layerwise.cpp) and the CUDA kernels (src/cuda/optim/layerwise.cu), so
// both backends follow the one set of formulas README.md states.
#pragma once
#include <cmath>

#ifdef __CUDACC__
#define DPT_HD __host__ __device__ __forceinline__
#else
#define DPT_HD inline
#endif

namespace dpt::layerwise {

// Trust ratio of one tensor from w2 = Σ w² and d2 = Σ d²: LARS r = η‖w‖ / (‖g‖ + λ‖w‖) (d = g),
// LAMB r = η‖w‖ / ‖u‖ (d = u); 1 where either norm is 0 (a zero tensor, or nothing to apply);
// at most clip when clip > 0.
DPT_HD float trust_ratio(float w2, float d2, float wd, float coeff, float clip, bool lars) {
  const float wn = sqrtf(w2), dn = sqrtf(d2);
  if (!(wn > 0.f) || !(dn > 0.f)) return 1.f;
  float r = coeff * wn / (lars ? dn + wd * wn : dn);
  if (clip > 0.f && r > clip) r = clip;
  return r;
}

// LAMB's update direction of one element, its moments already advanced:
// u = (m / bc1) / (√v / bc2_sqrt + ε) + λw, bc1 = 1 − β1^t, bc2_sqrt = √(1 − β2^t).
DPT_HD float lamb_dir(float m, float v, float p, float bc1, float bc2_sqrt, float eps, float wd) {
  return (m / bc1) / (sqrtf(v) / bc2_sqrt + eps) + wd * p;
}

}  // namespace dpt::layerwise
