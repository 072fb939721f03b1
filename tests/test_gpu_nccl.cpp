// The NCCL transport against MPI (the oracle) on the same data, and NCCL's refusal of two ranks
// on one GPU. Run on 2 ranks; the first test needs a GPU per rank, the second exactly one GPU.
// Each rank's verdict is OR-ed by mpi_main.cpp, so all ranks fail together.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/check.hpp"
#include "dpt/comm.hpp"
#include "dpt/data.hpp"

namespace {
using namespace dpt;

int world_rank() { int r = 0; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
int world_size() { int s = 0; MPI_Comm_size(MPI_COMM_WORLD, &s); return s; }

std::unique_ptr<Backend> gpu_for_this_rank(bool share) {
  BackendOptions o;
  o.type = "cuda";
  const NodeInfo ni = node_info(MPI_COMM_WORLD);
  o.local_rank = ni.local_rank;
  o.local_size = ni.local_size;
  o.share_gpus = share;
  return make_cuda_backend(o);
}

template <class T> std::vector<T> random_vec(size_t n, uint64_t seed) {
  SplitMix64 g(seed);
  std::vector<T> v(n);
  for (auto& x : v) x = T(g.uniform() * 200.0 - 100.0);
  return v;
}

template <class T> std::vector<T> down(Backend& be, const Buffer<T>& b) {
  std::vector<T> v(b.size());
  be.download(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

template <class T> Buffer<T> up(Backend& be, const std::vector<T>& v) {
  Buffer<T> b(be, v.size());
  be.upload(b.data(), v.data(), v.size() * sizeof(T));
  return b;
}

// Float sums may be added in another order by NCCL's ring than by MPI; max, min, integer sums
// and data movement (broadcast, allgather) must match exactly.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * (1.0 + std::fabs(want[i]))) << what << " at " << i;
}

TEST(NcclVsMpi, Collectives) {
  const int size = world_size(), rank = world_rank();
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  if (cuda_device_count() < size)
    GTEST_SKIP() << "needs one GPU per rank (" << size << "), " << cuda_device_count() << " visible";
  auto be = gpu_for_this_rank(false);
  auto comm = make_nccl_comm(MPI_COMM_WORLD, *be);
  const size_t n = 1000003;  // odd, and large enough for NCCL to split into several chunks

  const auto f = random_vec<float>(n, 10 + uint64_t(rank));
  const auto i32 = random_vec<int32_t>(n, 20 + uint64_t(rank));
  for (RedOp op : {RedOp::sum, RedOp::max, RedOp::min}) {
    MPI_Op mop = op == RedOp::sum ? MPI_SUM : op == RedOp::max ? MPI_MAX : MPI_MIN;
    std::vector<float> want(n);
    MPI_Allreduce(f.data(), want.data(), int(n), MPI_FLOAT, mop, MPI_COMM_WORLD);
    auto d = up(*be, f);
    Buffer<float> r(*be, n);
    comm->allreduce(d.data(), r.data(), n, DType::f32, op);
    comm->allreduce(d.data(), d.data(), n, DType::f32, op);  // in place
    comm->synchronize();
    expect_close(down(*be, r), want, "allreduce f32");
    expect_close(down(*be, d), want, "allreduce f32 in place");

    std::vector<int32_t> wi(n);
    MPI_Allreduce(i32.data(), wi.data(), int(n), MPI_INT32_T, mop, MPI_COMM_WORLD);
    auto di = up(*be, i32);
    comm->allreduce(di.data(), di.data(), n, DType::i32, op);
    comm->synchronize();
    EXPECT_EQ(down(*be, di), wi) << "allreduce i32";
  }

  {  // broadcast from the last rank
    std::vector<float> want = f;
    MPI_Bcast(want.data(), int(n), MPI_FLOAT, size - 1, MPI_COMM_WORLD);
    auto d = up(*be, f);
    comm->broadcast(d.data(), n, DType::f32, size - 1);
    comm->synchronize();
    EXPECT_EQ(down(*be, d), want) << "broadcast";
  }
  {  // reduce_scatter: count elements per rank out of size*count
    const size_t count = 4099;
    const auto s = random_vec<float>(count * size_t(size), 30 + uint64_t(rank));
    std::vector<float> want(count);
    MPI_Reduce_scatter_block(s.data(), want.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    auto d = up(*be, s);
    Buffer<float> r(*be, count);
    comm->reduce_scatter(d.data(), r.data(), count, DType::f32, RedOp::sum);
    comm->synchronize();
    expect_close(down(*be, r), want, "reduce_scatter");
  }
  {  // allgather
    const size_t count = 4099;
    const auto s = random_vec<float>(count, 40 + uint64_t(rank));
    std::vector<float> want(count * size_t(size));
    MPI_Allgather(s.data(), int(count), MPI_FLOAT, want.data(), int(count), MPI_FLOAT, MPI_COMM_WORLD);
    auto d = up(*be, s);
    Buffer<float> r(*be, count * size_t(size));
    comm->allgather(d.data(), r.data(), count, DType::f32);
    comm->synchronize();
    EXPECT_EQ(down(*be, r), want) << "allgather";
  }
}

// NCCL refuses two ranks on one GPU; make_nccl_comm must say so with an InputError on every
// rank (not hang, not fail on one rank only).
TEST(NcclVsMpi, TwoRanksOnOneGpuIsAnInputError) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  if (cuda_device_count() != 1 || world_size() != 2)
    GTEST_SKIP() << "needs exactly 1 GPU and 2 ranks (" << cuda_device_count() << " GPUs, "
                 << world_size() << " ranks)";
  auto be = gpu_for_this_rank(true);  // both ranks on GPU 0
  try {
    make_nccl_comm(MPI_COMM_WORLD, *be);
    ADD_FAILURE() << "make_nccl_comm accepted two ranks on one GPU";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("comm.backend = mpi"), std::string::npos) << e.what();
  }
}

}  // namespace
