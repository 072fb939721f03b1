// Dropout's mask as a pure function of (seed, layer, step, sample position, element): a
// counter-based hash (SplitMix64's finaliser), the same bits on the host and on a GPU, so the
// mask does not depend on which rank computes a sample or on a resume, and a reference (the
// PyTorch cross-check) can recompute it. Header-only; compiled by the host compiler and nvcc.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define DPT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DPT_HOST_DEVICE inline
#endif

namespace dpt {

DPT_HOST_DEVICE uint64_t dropout_mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

// The key of one sample's mask: layer = the dropout layer's position in the model's list,
// step = optimizer steps taken before this one, position = the sample's place in the global batch.
DPT_HOST_DEVICE uint64_t dropout_key(uint64_t seed, int layer, int64_t step, int64_t position) {
  uint64_t k = dropout_mix(seed ^ (0x9E3779B97F4A7C15ull * uint64_t(layer + 1)));
  k = dropout_mix(k ^ uint64_t(step));
  return dropout_mix(k ^ (uint64_t(position) * 0xD1B54A32D192ED03ull));
}

// threshold = floor(p · 2^32): element e is dropped with probability threshold / 2^32.
DPT_HOST_DEVICE uint32_t dropout_threshold(double p) { return uint32_t(p * 4294967296.0); }

DPT_HOST_DEVICE bool dropout_keep(uint64_t key, int64_t element, uint32_t threshold) {
  return uint32_t(dropout_mix(key ^ uint64_t(element)) >> 32) >= threshold;
}

}  // namespace dpt
