// Communication: one interface, two transports (`mpi` here, `nccl` in comm_nccl), typed
// collectives on element counts. Buffers live where the backend keeps them (host for cpu,
// device for cuda); a transport that cannot reach them stages through the host. Knows nothing
// of models.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace dpt {

class Backend;

enum class DType { f32, f64, i32, i64, u8, bf16 };
enum class RedOp { sum, max, min };

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }
size_t dtype_size(DType t);
MPI_Datatype mpi_type(DType t);

class Comm {
 public:
  virtual ~Comm() = default;
  virtual std::string name() const = 0;  // "mpi" | "nccl"
  virtual std::string describe() const = 0;  // library version for the banner
  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm mpi() const { return mpi_; }  // the host communicator under this one

  // Collectives on `count` elements of the buffer's type. In place where send == recv.
  // They are enqueued on the backend's communication stream (cuda) or complete on return (cpu).
  virtual void allreduce(const void* send, void* recv, size_t count, DType t, RedOp op) = 0;
  virtual void broadcast(void* buf, size_t count, DType t, int root) = 0;
  // recv gets count elements: this rank's slice of the reduction of size()*count elements.
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType t, RedOp op) = 0;
  // recv gets size()*count elements: every rank's count elements, in rank order.
  virtual void allgather(const void* send, void* recv, size_t count, DType t) = 0;
  // Collectives between group_begin() and group_end() may be launched as one (NCCL groups);
  // the MPI transport runs each as it comes.
  virtual void group_begin() {}
  virtual void group_end() {}
  // Wait until every collective enqueued so far is done (no-op for the blocking MPI transport).
  virtual void synchronize() {}
  // True when the collectives can be recorded into a CUDA graph (no host work inside them).
  virtual bool capturable() const { return false; }
  // Unblocks every rank's pending and future collectives on this communicator, from any thread
  // (the watchdog's, while the main thread waits). NCCL: ncclCommAbort. The MPI transport has
  // nothing of its own to abort: MPI_Abort, which follows, ends its collectives.
  virtual void abort() noexcept {}

  template <class T> void allreduce(T* buf, size_t count, RedOp op = RedOp::sum) {
    allreduce(buf, buf, count, dtype_of<T>(), op);
  }
  template <class T> void broadcast(T* buf, size_t count, int root = 0) {
    broadcast(buf, count, dtype_of<T>(), root);
  }

 protected:
  Comm(MPI_Comm c);
  MPI_Comm mpi_;
  int rank_ = 0, size_ = 1;
};

// Host-only MPI transport over `c` (not owned). When the backend keeps buffers on a device,
// pass it so the transport stages through host memory; nullptr means buffers are host memory.
std::unique_ptr<Comm> make_mpi_comm(MPI_Comm c, Backend* staging);

// Transport settings from the config.
struct CommOptions {
  int nccl_max_ctas = 0;  // NCCL: most CTAs (thread blocks, one SM each) per collective; 0 = NCCL's
};

// The NCCL transport over c (cuda builds only): id from rank 0 over MPI_Bcast.
std::unique_ptr<Comm> make_nccl_comm(MPI_Comm c, Backend& cuda_backend, const CommOptions& opt = {});

// The transport of a communicator of one rank (any backend): collectives are local copies on the
// backend, nothing is set up. comm.backend = auto takes it for one rank on a GPU (make_comm_for).
std::unique_ptr<Comm> make_self_comm(MPI_Comm c, Backend& backend);

// True on every rank when two ranks of c use one GPU (same host and PCI bus id); false with
// the cpu backend. Collective over c.
bool ranks_share_a_gpu(MPI_Comm c, Backend& backend);

// Picks the transport: "nccl" needs the cuda backend; "auto" takes nccl with cuda, mpi with cpu.
// Throws InputError when the choice is impossible (nccl asked without a GPU, or two ranks on
// one GPU).
std::unique_ptr<Comm> make_comm(const std::string& kind, MPI_Comm c, Backend& backend,
                                const CommOptions& opt = {});

// --- host-side helpers on plain MPI, used by set-up and apps (not the hot path) ---

// Every rank passes its own verdict; returns true on every rank if all were ok. Ranks that
// failed pass their message; rank 0 logs every failed rank's message.
bool all_ok(MPI_Comm c, bool ok, const std::string& msg);

// Local rank and local size on this node (MPI_Comm_split_type shared).
struct NodeInfo {
  int local_rank = 0, local_size = 1;
  std::string host;
};
NodeInfo node_info(MPI_Comm c);

// Broadcast a string from root.
void bcast_string(MPI_Comm c, std::string& s, int root = 0);

}  // namespace dpt
