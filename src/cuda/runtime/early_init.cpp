// Start-up: the CUDA driver, and where the launcher names this process's local rank the primary
// context of the GPU the backend will pick, made on a thread of its own while MPI starts.
#include <cuda_runtime.h>

#include "dpt/backend.hpp"

namespace dpt {

void cuda_early_init(int local_rank_hint) {
  const int gpus = cuda_device_count();  // initialises the driver
  if (gpus <= 0 || local_rank_hint < 0) return;
  // The backend's choice (pick_device): local rank r takes GPU r, or r mod GPUs when the node has
  // more ranks than GPUs visible.
  const int dev = local_rank_hint % gpus;
  if (cudaSetDevice(dev) == cudaSuccess) cudaFree(nullptr);  // creates the primary context
  cudaGetLastError();  // an error here is the backend's to report, when it makes the same calls
}

}  // namespace dpt
