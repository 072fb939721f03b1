// Check macros for CUDA, cuBLAS and NCCL calls and kernel launches, in the style of
// DPT_CHECK_MPI (check.hpp): a failed call throws dpt::Error naming rank, host, file:line, the
// call and the library's message. Include only from CUDA translation units (src/cuda/).
#pragma once
#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <string>

#include "dpt/check.hpp"

namespace dpt {
// ncclGetErrorString + ncclGetLastError; defined in src/cuda/comm/nccl_comm.cpp so that this header
// does not need nccl.h (rc is an ncclResult_t).
std::string nccl_error_string(int rc);
}  // namespace dpt

#define DPT_CHECK_CUDA(call)                                                                 \
  do {                                                                                       \
    cudaError_t dpt_rc_ = (call);                                                            \
    if (dpt_rc_ != cudaSuccess)                                                              \
      ::dpt::throw_call_error("CUDA", #call, cudaGetErrorString(dpt_rc_), __FILE__, __LINE__); \
  } while (0)

#define DPT_CHECK_CUBLAS(call)                                                          \
  do {                                                                                  \
    cublasStatus_t dpt_rc_ = (call);                                                    \
    if (dpt_rc_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::dpt::throw_call_error("cuBLAS", #call, cublasGetStatusString(dpt_rc_), __FILE__, \
                              __LINE__);                                                \
  } while (0)

#define DPT_CHECK_NCCL(call)                                                              \
  do {                                                                                    \
    int dpt_rc_ = static_cast<int>(call);                                                 \
    if (dpt_rc_ != 0)                                                                     \
      ::dpt::throw_call_error("NCCL", #call, ::dpt::nccl_error_string(dpt_rc_), __FILE__, \
                              __LINE__);                                                  \
  } while (0)

// After every kernel launch: catches bad launch configurations at once (execution errors
// surface at the next synchronising call, which is checked too).
#define DPT_CHECK_LAUNCH(kernel)                                                        \
  do {                                                                                  \
    cudaError_t dpt_rc_ = cudaGetLastError();                                           \
    if (dpt_rc_ != cudaSuccess)                                                         \
      ::dpt::throw_call_error("CUDA", "launch of " kernel, cudaGetErrorString(dpt_rc_), \
                              __FILE__, __LINE__);                                      \
  } while (0)
