// What the CUDA backend exposes beyond Backend, for the NCCL transport: the device and its two
// streams. Collectives run on comm_stream(); the compute stream and the comm stream are ordered
// against each other only by events (see src/cuda/nccl_comm.cpp). Include only from CUDA
// translation units (src/cuda/).
#pragma once
#include <cuda_runtime_api.h>

#include "dpt/backend.hpp"

namespace dpt {

class CudaBackend : public Backend {
 public:
  virtual int device() const = 0;                 // CUDA ordinal (within CUDA_VISIBLE_DEVICES)
  virtual cudaStream_t compute_stream() const = 0;  // every Backend op runs here, in order
  virtual cudaStream_t comm_stream() const = 0;     // collectives; higher priority
};

// The CudaBackend behind `be`, or nullptr when `be` is another backend.
inline CudaBackend* as_cuda(Backend& be) { return dynamic_cast<CudaBackend*>(&be); }

}  // namespace dpt
