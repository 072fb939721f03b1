// Launchers of the layer-wise optimizers' kernels (LARS, LAMB; defined in layerwise.cu): the two
// passes of Backend::layer_sums / layer_apply over a range [lo, lo + n) of the arena, whose
// pointers address the range's first element. Every launcher enqueues on `s`, returns at once
// and checks its launches; nothing reads device memory on the host, so a step graph holds them.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "dpt/backend.hpp"

namespace dpt::cuda {

// Floats of scratch that layer_sums needs for the per-block partial sums of this range.
size_t layer_partial_floats(const std::vector<TensorSeg>& segs, size_t lo, size_t n);

// sums (2 × segs.size()) = per segment Σ w², Σ d² over its part of the range (0 outside it):
// blocks of fixed slices write `partial`, one pass adds each tensor's slices in order
// (deterministic). LAMB advances s1, s2 over the range here. Nothing when ctl && ctl->bad.
void layer_sums(const float* p, const float* g, float* s1, float* s2, size_t lo, size_t n,
                const std::vector<TensorSeg>& segs, const OptimStep& h, const float* lr_table,
                const StepCtl* ctl, float* sums, float* partial, cudaStream_t s);

// The update of the range with each tensor's trust ratio from `sums`; p16 (the range's bf16
// shadow), when set, receives bf16(p) in the same pass.
void layer_apply(float* p, const float* g, float* s1, float* s2, size_t lo, size_t n,
                 const std::vector<TensorSeg>& segs, const float* sums, const OptimStep& h,
                 const float* lr_table, const StepCtl* ctl, void* p16, cudaStream_t s);

}  // namespace dpt::cuda
