// The NCCL transport: typed collectives on device buffers, enqueued on the CUDA backend's
// communication stream.
//
// Stream ordering. Every collective first makes the comm stream wait for an event recorded on
// the compute stream, so it sees everything the backend has queued so far (e.g. the gradients
// of the layer just finished). synchronize() records an event on the comm stream and makes the
// compute stream wait for it: the host never blocks there, but every later backend op (and any
// download, which waits for the compute stream) sees the collectives' results.
//
// Errors. A failed NCCL call or an asynchronous error reported by ncclCommGetAsyncError aborts
// the communicator (so no rank is left waiting inside it) and then throws.
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "dpt/comm.hpp"
#include "dpt/cuda_backend.hpp"
#include "dpt/cuda_check.hpp"

namespace dpt {

std::string nccl_error_string(int rc) {
  std::string msg = ncclGetErrorString(static_cast<ncclResult_t>(rc));
  const char* last = ncclGetLastError(nullptr);
  if (last && *last) msg += std::string(" (") + last + ")";
  return msg;
}

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
    case DType::bf16: return ncclBfloat16;
  }
  throw Error("nccl: unknown DType");
}

ncclRedOp_t nccl_op(RedOp op) {
  switch (op) {
    case RedOp::sum: return ncclSum;
    case RedOp::max: return ncclMax;
    case RedOp::min: return ncclMin;
  }
  throw Error("nccl: unknown RedOp");
}

// Two ranks of one communicator on the same GPU make ncclCommInitRank fail ("invalid usage") or
// hang, depending on the version. Every rank gathers (host, PCI bus id) of all ranks and scans
// the same table, so all ranks reach the same verdict and throw together, before NCCL is called.
void refuse_shared_gpus(MPI_Comm c, int device) {
  struct Where { char host[MPI_MAX_PROCESSOR_NAME]; char bus[32]; };
  Where me{};
  int len = 0;
  DPT_CHECK_MPI(MPI_Get_processor_name(me.host, &len));
  DPT_CHECK_CUDA(cudaDeviceGetPCIBusId(me.bus, sizeof me.bus, device));
  int size = 0;
  DPT_CHECK_MPI(MPI_Comm_size(c, &size));
  std::vector<Where> all(static_cast<size_t>(size));
  DPT_CHECK_MPI(MPI_Allgather(&me, int(sizeof(Where)), MPI_BYTE, all.data(), int(sizeof(Where)),
                              MPI_BYTE, c));
  for (int i = 0; i < size; ++i)
    for (int j = i + 1; j < size; ++j)
      if (std::strcmp(all[i].host, all[j].host) == 0 && std::strcmp(all[i].bus, all[j].bus) == 0)
        throw InputError("NCCL cannot run two ranks on one GPU (ranks " + std::to_string(i) +
                         " and " + std::to_string(j) + " both on GPU " + all[i].bus + " on host " +
                         all[i].host + "); start one rank per GPU or use comm.backend = mpi");
}

class NcclComm final : public Comm {
 public:
  NcclComm(MPI_Comm c, CudaBackend& be, const CommOptions& opt) : Comm(c), be_(be), max_ctas_(opt.nccl_max_ctas) {
    DPT_CHECK_CUDA(cudaSetDevice(be_.device()));
    // 0. Events ordering the compute and comm streams (RAII: freed if a step below throws).
    cudaEvent_t e = nullptr;
    DPT_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ready_.reset(e);
    DPT_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    done_.reset(e);
    // 1. Refuse two ranks on one GPU, on every rank alike.
    refuse_shared_gpus(c, be_.device());
    // 2. Rank 0 creates the unique id; it broadcasts the id with its own verdict, so that a
    //    failure there is an error on every rank instead of a hang in ncclCommInitRank.
    struct { int rc; ncclUniqueId id; } boot{};
    if (rank_ == 0) boot.rc = int(ncclGetUniqueId(&boot.id));
    DPT_CHECK_MPI(MPI_Bcast(&boot, int(sizeof boot), MPI_BYTE, 0, c));
    if (boot.rc != ncclSuccess)
      throw_call_error("NCCL", "ncclGetUniqueId (on rank 0)", nccl_error_string(boot.rc),
                       __FILE__, __LINE__);
    // 3. Every rank joins on its backend's device (collective: returns once all ranks joined).
    //    Last step, so that a constructed communicator is always owned by a constructed object.
    //    comm.nccl_max_ctas caps the thread blocks (one SM each) a collective takes from the
    //    GEMMs running beside it; 0 leaves NCCL's own choice.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    if (max_ctas_ > 0) {
      config.maxCTAs = max_ctas_;
    }
    DPT_CHECK_NCCL(ncclCommInitRankConfig(&comm_, size_, boot.id, rank_, &config));
  }

  // Never throws. A communicator torn down by an exception (or after an error) is aborted:
  // ncclCommDestroy would flush pending work and could wait forever for ranks that are gone.
  ~NcclComm() override {
    if (comm_ && !aborted_.load()) {
      if (failed_ || std::uncaught_exceptions() > 0) {
        ncclCommAbort(comm_);
      } else {
        cudaStreamSynchronize(be_.comm_stream());
        ncclCommDestroy(comm_);
      }
    }
  }

  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  std::string name() const override { return "nccl"; }
  bool capturable() const override { return true; }

  // The watchdog's thread, while the main thread may be blocked on this communicator's work:
  // ncclCommAbort makes the kernels return. Once only; the destructor then leaves comm_ alone.
  void abort() noexcept override {
    if (comm_ && !aborted_.exchange(true)) ncclCommAbort(comm_);
  }
  std::string describe() const override {
    int v = 0;
    ncclGetVersion(&v);  // 22803 -> 2.28.3 (NCCL >= 2.9 encoding)
    return "nccl " + std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." +
           std::to_string(v % 100) + (max_ctas_ > 0 ? " (at most " + std::to_string(max_ctas_) + " CTAs per collective)" : "");
  }

  void group_begin() override { check(ncclGroupStart(), "ncclGroupStart", __LINE__); }
  void group_end() override { check(ncclGroupEnd(), "ncclGroupEnd", __LINE__); }

  void allreduce(const void* send, void* recv, size_t count, DType t, RedOp op) override {
    cudaStream_t s = begin();
    be_.note_device_write(recv, count * dtype_size(t));
    check(ncclAllReduce(send, recv, count, nccl_type(t), nccl_op(op), comm_, s), "ncclAllReduce",
          __LINE__);
  }

  void broadcast(void* buf, size_t count, DType t, int root) override {
    cudaStream_t s = begin();
    be_.note_device_write(buf, count * dtype_size(t));
    check(ncclBroadcast(buf, buf, count, nccl_type(t), root, comm_, s), "ncclBroadcast",
          __LINE__);
  }

  // NCCL's recvcount is per rank, like ours: send holds size()*count elements.
  void reduce_scatter(const void* send, void* recv, size_t count, DType t, RedOp op) override {
    cudaStream_t s = begin();
    be_.note_device_write(recv, count * dtype_size(t));
    check(ncclReduceScatter(send, recv, count, nccl_type(t), nccl_op(op), comm_, s),
          "ncclReduceScatter", __LINE__);
  }

  // NCCL's sendcount is per rank, like ours: recv gets size()*count elements.
  void allgather(const void* send, void* recv, size_t count, DType t) override {
    cudaStream_t s = begin();
    be_.note_device_write(recv, count * size_t(size_) * dtype_size(t));
    check(ncclAllGather(send, recv, count, nccl_type(t), comm_, s), "ncclAllGather", __LINE__);
  }

  void synchronize() override {
    poll_async_error();
    DPT_CHECK_CUDA(cudaEventRecord(done_.get(), be_.comm_stream()));
    DPT_CHECK_CUDA(cudaStreamWaitEvent(be_.compute_stream(), done_.get(), 0));
  }

 private:
  // The comm stream waits (on the device) for all work queued on the compute stream so far.
  cudaStream_t begin() {
    DPT_CHECK_CUDA(cudaEventRecord(ready_.get(), be_.compute_stream()));
    DPT_CHECK_CUDA(cudaStreamWaitEvent(be_.comm_stream(), ready_.get(), 0));
    return be_.comm_stream();
  }

  void check(ncclResult_t rc, const char* call, int line) {
    if (rc == ncclSuccess) return;
    fail(call, std::string(ncclGetErrorString(rc)) + " (" + ncclGetLastError(comm_) + ")", line);
  }

  // A cheap host-side query; errors of collectives already running (a peer died, a network
  // failure) show up here rather than as a hang on the next wait.
  void poll_async_error() {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &async);
    if (rc != ncclSuccess) check(rc, "ncclCommGetAsyncError", __LINE__);
    if (async != ncclSuccess && async != ncclInProgress)
      fail("asynchronous NCCL error", std::string(ncclGetErrorString(async)) + " (" +
                                          ncclGetLastError(comm_) + ")",
           __LINE__);
  }

  [[noreturn]] void fail(const char* call, const std::string& msg, int line) {
    failed_ = true;
    if (comm_ && !aborted_.exchange(true)) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw_call_error("NCCL", call, msg, __FILE__, line);
  }

  CudaBackend& be_;
  int max_ctas_ = 0;
  ncclComm_t comm_ = nullptr;
  struct EventDel { void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); } };
  std::unique_ptr<CUevent_st, EventDel> ready_, done_;
  bool failed_ = false;
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(MPI_Comm c, Backend& backend, const CommOptions& opt) {
  CudaBackend* be = as_cuda(backend);
  if (!be) throw InputError("comm.backend = nccl needs the cuda backend (device.type = cuda)");
  return std::make_unique<NcclComm>(c, *be, opt);
}

}  // namespace dpt
