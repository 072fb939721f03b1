// What the CUDA backend exposes beyond Backend, for the NCCL transport: the device and its two
// streams. Collectives run on comm_stream(); the compute stream and the comm stream are ordered
// against each other only by events (see src/cuda/comm/nccl_comm.cpp). Include only from CUDA
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

  // The model's parameter arena [p, p + n) (MLP's constructor; once Backend declares it, this
  // overrides it). With precision bf16 the backend keeps a bf16 shadow of the arena for the GEMMs:
  // optimizer_step(_at) writes it in the same pass as the fp32 update; every other write into
  // the arena marks it stale, and it is refreshed before its next use (see cuda_backend.cpp).
  // Other precisions: nothing. Without the call, bf16 GEMMs convert the weights on use.
  virtual void register_parameters(float* p, size_t n) = 0;
  // Tells the backend that [p, p + bytes) of its memory was written by someone else (the NCCL
  // transport's collectives), so that copies it derived from that memory are dropped.
  // Host-side bookkeeping only: enqueues nothing, allowed during graph capture.
  virtual void note_device_write(const void* p, size_t bytes) = 0;
  // How many hidden layers the last mlp_forward ran through cuBLASLt's fused ReLU epilogues
  // (0: the per-layer path), for tests and benchmarks.
  virtual int fused_layers() const = 0;
};

// The CudaBackend behind `be`, or nullptr when `be` is another backend.
inline CudaBackend* as_cuda(Backend& be) { return dynamic_cast<CudaBackend*>(&be); }

}  // namespace dpt
