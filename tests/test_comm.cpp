// The MPI transport's typed collectives on element counts, against values every rank can
// compute for itself (rank-dependent inputs, exact integer-valued floats so sums are exact).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/comm.hpp"

using namespace dpt;

namespace {

std::unique_ptr<Comm> world() { return make_mpi_comm(MPI_COMM_WORLD, nullptr); }

template <class T> T value(int rank, size_t i) { return T(int64_t(rank + 1) * 1000 + int64_t(i % 97)); }

template <class T> void check_allreduce() {
  auto c = world();
  const int W = c->size(), r = c->rank();
  const size_t n = 1001;  // odd, not a multiple of the rank count
  for (RedOp op : {RedOp::sum, RedOp::max, RedOp::min}) {
    std::vector<T> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = value<T>(r, i);
    c->allreduce(v.data(), n, op);
    for (size_t i = 0; i < n; ++i) {
      T want = op == RedOp::sum ? T(0) : value<T>(0, i);
      for (int k = 0; k < W; ++k) {
        const T x = value<T>(k, i);
        if (op == RedOp::sum) want += x;
        else if (op == RedOp::max) want = std::max(want, x);
        else want = std::min(want, x);
      }
      ASSERT_EQ(v[i], want) << "op " << int(op) << " element " << i;
    }
  }
}

}  // namespace

TEST(MpiTransport, AllreduceFloat) { check_allreduce<float>(); }
TEST(MpiTransport, AllreduceDouble) { check_allreduce<double>(); }
TEST(MpiTransport, AllreduceInt32) { check_allreduce<int32_t>(); }
TEST(MpiTransport, AllreduceInt64) { check_allreduce<int64_t>(); }

TEST(MpiTransport, BroadcastFromEveryRoot) {
  auto c = world();
  for (int root = 0; root < c->size(); ++root) {
    std::vector<float> v(333, float(c->rank()));
    c->broadcast(v.data(), v.size(), root);
    for (float x : v) ASSERT_EQ(x, float(root));
  }
}

TEST(MpiTransport, ReduceScatterGivesEachRankItsSlice) {
  auto c = world();
  const int W = c->size(), r = c->rank();
  const size_t per = 257;
  std::vector<float> send(per * size_t(W)), recv(per);
  for (size_t i = 0; i < send.size(); ++i) send[i] = value<float>(r, i);
  c->reduce_scatter(send.data(), recv.data(), per, DType::f32, RedOp::sum);
  for (size_t j = 0; j < per; ++j) {
    float want = 0;
    for (int k = 0; k < W; ++k) want += value<float>(k, size_t(r) * per + j);
    ASSERT_EQ(recv[j], want) << j;
  }
}

TEST(MpiTransport, AllgatherInRankOrder) {
  auto c = world();
  const int W = c->size(), r = c->rank();
  const size_t per = 129;
  std::vector<int32_t> send(per), recv(per * size_t(W));
  for (size_t i = 0; i < per; ++i) send[i] = value<int32_t>(r, i);
  c->allgather(send.data(), recv.data(), per, DType::i32);
  for (int k = 0; k < W; ++k)
    for (size_t i = 0; i < per; ++i) ASSERT_EQ(recv[size_t(k) * per + i], value<int32_t>(k, i));
}

TEST(MpiTransport, AllOkAgreesOnEveryRank) {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  EXPECT_TRUE(all_ok(MPI_COMM_WORLD, true, ""));
  EXPECT_FALSE(all_ok(MPI_COMM_WORLD, r != 1, "rank 1 says no"));  // one rank's no is everyone's
}
