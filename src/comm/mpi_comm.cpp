// The MPI transport, the transport choice, and the small host-side MPI helpers.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/check.hpp"
#include "dpt/comm.hpp"
#include "dpt/log.hpp"
#include "dpt/watchdog.hpp"

namespace dpt {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::f64: case DType::i64: return 8;
    case DType::bf16: return 2;
    default: return 1;
  }
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::bf16: return MPI_UINT16_T;  // the bits; sums go through bf16_sum below
  }
  throw Error("mpi: unknown DType");
}

namespace {
// bf16 sum as NCCL does it: each partial sum formed in fp32 from the two bf16 values and
// rounded to bf16 (nearest even).
extern "C" void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = bf16_bits(bf16_value(a[i]) + bf16_value(b[i]));
}
}  // namespace

static MPI_Op mpi_op(RedOp op, DType t) {
  if (t == DType::bf16) {
    if (op != RedOp::sum) throw Error("the MPI transport reduces bf16 by sum only");
    static MPI_Op sum = [] {
      MPI_Op o = MPI_OP_NULL;
      DPT_CHECK_MPI(MPI_Op_create(&bf16_sum, /*commute=*/1, &o));
      return o;
    }();
    return sum;
  }
  return op == RedOp::sum ? MPI_SUM : op == RedOp::max ? MPI_MAX : MPI_MIN;
}

Comm::Comm(MPI_Comm c) : mpi_(c) {
  DPT_CHECK_MPI(MPI_Comm_rank(c, &rank_));
  DPT_CHECK_MPI(MPI_Comm_size(c, &size_));
}

namespace {

// Blocking MPI collectives. With a device backend, buffers are staged through host vectors:
// download waits for the compute that produced them, upload feeds the compute that follows.
class MpiComm final : public Comm {
 public:
  MpiComm(MPI_Comm c, Backend* staging) : Comm(c), staging_(staging) {}
  std::string name() const override { return "mpi"; }
  std::string describe() const override {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    std::string s(v, size_t(len));
    auto nl = s.find_first_of("\n,");
    return "mpi (" + s.substr(0, nl) + (staging_ ? ", host-staged" : "") + ")";
  }

  // Each collective is a watchdog phase: a rank that never arrives turns into exit 4, not a hang.
  void allreduce(const void* send, void* recv, size_t count, DType t, RedOp op) override {
    watchdog::Phase phase("waiting in allreduce");
    if (!staging_) {
      const void* s = send == recv ? MPI_IN_PLACE : send;
      DPT_CHECK_MPI(MPI_Allreduce(s, recv, int_count(count), mpi_type(t), mpi_op(op, t), mpi_));
      return;
    }
    auto& h = host(0, count * dtype_size(t));
    staging_->download(h.data(), send, h.size());
    DPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, h.data(), int_count(count), mpi_type(t), mpi_op(op, t), mpi_));
    staging_->upload(recv, h.data(), h.size());
  }

  void broadcast(void* buf, size_t count, DType t, int root) override {
    watchdog::Phase phase("waiting in broadcast");
    if (!staging_) {
      DPT_CHECK_MPI(MPI_Bcast(buf, int_count(count), mpi_type(t), root, mpi_));
      return;
    }
    auto& h = host(0, count * dtype_size(t));
    if (rank_ == root) staging_->download(h.data(), buf, h.size());
    DPT_CHECK_MPI(MPI_Bcast(h.data(), int_count(count), mpi_type(t), root, mpi_));
    staging_->upload(buf, h.data(), h.size());
  }

  void reduce_scatter(const void* send, void* recv, size_t count, DType t, RedOp op) override {
    watchdog::Phase phase("waiting in reduce_scatter");
    const size_t bytes = count * dtype_size(t);
    if (!staging_) {
      reduce_blocks(send, recv, count, t, op);
      return;
    }
    auto& hs = host(0, bytes * size_t(size_));
    auto& hr = host(1, bytes);
    staging_->download(hs.data(), send, hs.size());
    reduce_blocks(hs.data(), hr.data(), count, t, op);
    staging_->upload(recv, hr.data(), bytes);
  }

  // A reduce-scatter as one MPI_Reduce per rank's block (root: that rank), not
  // MPI_Reduce_scatter_block: Open MPI 4.1's takes 20x as long from a few MB on (2 ranks, 16 MB
  // in all: 78 ms against 3.6 ms; 4 MB: 17.7 against 0.55 ms). recv may be this rank's own block
  // of send (in place, as NCCL allows) or lie elsewhere in it (through a temporary).
  void reduce_blocks(const void* send, void* recv, size_t count, DType t, RedOp op) {
    const size_t bytes = count * dtype_size(t);
    const char* s0 = static_cast<const char*>(send);
    char* r0 = static_cast<char*>(recv);
    const bool own = r0 == s0 + bytes * size_t(rank_);
    const bool alias = !own && r0 >= s0 && r0 < s0 + bytes * size_t(size_);
    void* out = alias ? static_cast<void*>(host(2, bytes).data()) : recv;
    for (int k = 0; k < size_; ++k) {
      const void* block = s0 + bytes * size_t(k);
      if (k == rank_)
        DPT_CHECK_MPI(MPI_Reduce(own ? MPI_IN_PLACE : block, out, int_count(count), mpi_type(t), mpi_op(op, t), k, mpi_));
      else
        DPT_CHECK_MPI(MPI_Reduce(block, nullptr, int_count(count), mpi_type(t), mpi_op(op, t), k, mpi_));
    }
    if (alias) std::memcpy(recv, out, bytes);
  }

  void allgather(const void* send, void* recv, size_t count, DType t) override {
    watchdog::Phase phase("waiting in allgather");
    const size_t bytes = count * dtype_size(t);
    if (!staging_) {
      // In place: this rank's part already sits at its place in recv.
      const bool in_place = send == static_cast<const char*>(recv) + bytes * size_t(rank_);
      DPT_CHECK_MPI(MPI_Allgather(in_place ? MPI_IN_PLACE : send, int_count(count), mpi_type(t), recv,
                                  int_count(count), mpi_type(t), mpi_));
      return;
    }
    auto& hs = host(0, bytes);
    auto& hr = host(1, bytes * size_t(size_));
    staging_->download(hs.data(), send, bytes);
    DPT_CHECK_MPI(MPI_Allgather(hs.data(), int_count(count), mpi_type(t), hr.data(), int_count(count), mpi_type(t), mpi_));
    staging_->upload(recv, hr.data(), hr.size());
  }

 private:
  Backend* staging_;
  std::vector<char> host_[3];  // staging (send, receive), and the reduce-scatter's temporary

  std::vector<char>& host(int i, size_t bytes) {
    host_[i].resize(bytes);
    return host_[i];
  }
  static int int_count(size_t n) {
    if (n > size_t(INT32_MAX)) throw Error("MPI message of " + std::to_string(n) + " elements exceeds int range");
    return int(n);
  }
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(MPI_Comm c, Backend* staging) {
  return std::make_unique<MpiComm>(c, staging);
}

#ifndef DPT_HAVE_CUDA
std::unique_ptr<Comm> make_nccl_comm(MPI_Comm, Backend&, const CommOptions&) {
  throw InputError("comm.backend = nccl, but this dptrain was built without CUDA and NCCL");
}
#endif

std::unique_ptr<Comm> make_comm(const std::string& kind, MPI_Comm c, Backend& be, const CommOptions& opt) {
  const bool cuda = be.name() == "cuda";
  if (kind == "nccl" && !cuda)
    throw InputError("comm.backend = nccl needs the cuda backend (no GPU in use on this rank)");
#ifdef DPT_HAVE_CUDA
  if (cuda && (kind == "nccl" || kind == "auto")) return make_nccl_comm(c, be, opt);
#else
  (void)opt;
#endif
  return make_mpi_comm(c, be.host_addressable() ? nullptr : &be);
}

bool all_ok(MPI_Comm c, bool ok, const std::string& msg) {
  watchdog::Phase phase("waiting for every rank's verdict");
  int mine = ok ? 1 : 0, all = 0, rank = 0, size = 1;
  MPI_Comm_rank(c, &rank);
  MPI_Comm_size(c, &size);
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, c);
  if (all) return true;
  // Gather every rank's message on rank 0 so one place names every rank that failed.
  int len = ok ? 0 : int(msg.size());
  std::vector<int> lens(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, c);
  int total = 0;
  for (int i = 0; i < size; ++i) { displs[size_t(i)] = total; total += lens[size_t(i)]; }
  std::string all_msgs(size_t(std::max(total, 1)), '\0');
  MPI_Gatherv(msg.data(), len, MPI_CHAR, all_msgs.data(), lens.data(), displs.data(), MPI_CHAR, 0, c);
  if (rank == 0) {
    // Identical messages from every rank are printed once.
    std::vector<std::string> seen;
    for (int i = 0; i < size; ++i) {
      if (!lens[size_t(i)]) continue;
      std::string m = all_msgs.substr(size_t(displs[size_t(i)]), size_t(lens[size_t(i)]));
      if (std::find(seen.begin(), seen.end(), m) != seen.end()) continue;
      seen.push_back(m);
      std::fprintf(stderr, "dptrain: %s%s\n", size > 1 ? ("rank " + std::to_string(i) + ": ").c_str() : "", m.c_str());
    }
    std::fflush(stderr);
  }
  return false;
}

NodeInfo node_info(MPI_Comm c) {
  watchdog::Phase phase("waiting in MPI_Comm_split_type");
  NodeInfo info;
  MPI_Comm local;
  DPT_CHECK_MPI(MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
  DPT_CHECK_MPI(MPI_Comm_rank(local, &info.local_rank));
  DPT_CHECK_MPI(MPI_Comm_size(local, &info.local_size));
  MPI_Comm_free(&local);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  info.host = host;
  return info;
}

void bcast_string(MPI_Comm c, std::string& s, int root) {
  watchdog::Phase phase("waiting in broadcast");
  uint64_t n = s.size();
  DPT_CHECK_MPI(MPI_Bcast(&n, 1, MPI_UINT64_T, root, c));
  s.resize(n);
  if (n) DPT_CHECK_MPI(MPI_Bcast(s.data(), int(n), MPI_CHAR, root, c));
}

}  // namespace dpt
