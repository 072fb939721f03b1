// Which GPU each rank uses, seen by all ranks: the (host, PCI bus id) table that decides
// between NCCL (one GPU per rank) and the MPI transport (ranks sharing GPUs).
#include <mpi.h>

#include <cstring>
#include <vector>

#include "dpt/comm.hpp"
#include "dpt/cuda_backend.hpp"
#include "dpt/cuda_check.hpp"

namespace dpt {

bool ranks_share_a_gpu(MPI_Comm c, Backend& backend) {
  CudaBackend* be = as_cuda(backend);
  int size = 0;
  DPT_CHECK_MPI(MPI_Comm_size(c, &size));
  struct Where { char host[MPI_MAX_PROCESSOR_NAME]; char bus[32]; };
  Where me{};
  int len = 0;
  DPT_CHECK_MPI(MPI_Get_processor_name(me.host, &len));
  if (be) DPT_CHECK_CUDA(cudaDeviceGetPCIBusId(me.bus, sizeof me.bus, be->device()));
  std::vector<Where> all(static_cast<size_t>(size));
  // Every rank calls this and scans the same table, so every rank decides alike.
  DPT_CHECK_MPI(MPI_Allgather(&me, int(sizeof(Where)), MPI_BYTE, all.data(), int(sizeof(Where)),
                              MPI_BYTE, c));
  for (size_t i = 0; i < all.size(); ++i)
    for (size_t j = i + 1; j < all.size(); ++j)
      if (all[i].bus[0] && std::strcmp(all[i].host, all[j].host) == 0 &&
          std::strcmp(all[i].bus, all[j].bus) == 0)
        return true;
  return false;
}

}  // namespace dpt
