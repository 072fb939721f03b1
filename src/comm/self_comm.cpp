// The transport of a world of one rank: every collective is the identity, so an out-of-place one
// is a copy on the backend (the compute stream on a GPU, so it stays capturable) and an
// in-place one does nothing. Chosen by comm.backend = auto for one rank with the cuda backend,
// where it spares NCCL's communicator set-up (its topology probe, buffers and proxy thread).
#include <memory>
#include <string>

#include "dpt/backend.hpp"
#include "dpt/check.hpp"
#include "dpt/comm.hpp"

namespace dpt {
namespace {

class SelfComm final : public Comm {
 public:
  SelfComm(MPI_Comm c, Backend& be) : Comm(c), be_(be) {
    if (size_ != 1) throw Error("the one-rank transport on a communicator of " + std::to_string(size_) + " ranks");
  }
  std::string name() const override { return "self"; }
  std::string describe() const override { return "none (one rank: collectives are local copies)"; }
  bool capturable() const override { return true; }

  void allreduce(const void* send, void* recv, size_t count, DType t, RedOp) override {
    be_.copy(recv, send, count * dtype_size(t));
  }
  void broadcast(void*, size_t, DType, int root) override {
    if (root != 0) throw Error("broadcast from rank " + std::to_string(root) + " in a world of one");
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType t, RedOp) override {
    be_.copy(recv, send, count * dtype_size(t));
  }
  void allgather(const void* send, void* recv, size_t count, DType t) override {
    be_.copy(recv, send, count * dtype_size(t));
  }

 private:
  Backend& be_;
};

}  // namespace

std::unique_ptr<Comm> make_self_comm(MPI_Comm c, Backend& backend) {
  return std::make_unique<SelfComm>(c, backend);
}

}  // namespace dpt
