// Launcher of Backend::resized_crop on the GPU (transform.cu); pointers are device memory.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "dpt/backend.hpp"

namespace dpt::cuda {

void resized_crop(const float* x, float* y, int batch, int c, int h, int w, int oh, int ow, const int64_t* draws,
                  const StepCtl* ctl, int64_t offset, int64_t fixed, const float* norm, cudaStream_t s);

}  // namespace dpt::cuda
