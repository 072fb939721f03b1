// The activations and their derivatives as device functions, shared by the Linear layer's
// epilogues (kernels.cu) and the elementwise passes of convolutional networks (conv.cu).
// Built with --use_fast_math: tanhf would become tanh.approx (relative error ~5e-4), so tanh is
// computed from expm1f.
#pragma once
#include <cuda_runtime.h>

#include "dpt/backend.hpp"

namespace dpt::cuda {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

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

}  // namespace dpt::cuda
