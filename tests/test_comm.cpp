// The MPI transport's typed collectives on element counts, against values every rank can
// compute for itself (rank-dependent inputs, exact integer-valued floats so sums are exact);
// the one-rank transport against the MPI transport.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/check.hpp"
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

// In place, as the sharded optimizer calls it: recv is this rank's own block of send; and recv
// inside send at another rank's block (through the transport's temporary).
TEST(MpiTransport, ReduceScatterInPlaceAndAliased) {
  auto c = world();
  const int W = c->size(), r = c->rank();
  const size_t per = 1031;
  for (int at : {r, (r + 1) % W}) {
    std::vector<float> send(per * size_t(W));
    for (size_t i = 0; i < send.size(); ++i) send[i] = value<float>(r, i);
    c->reduce_scatter(send.data(), send.data() + size_t(at) * per, per, DType::f32, RedOp::sum);
    for (size_t j = 0; j < per; ++j) {
      float want = 0;
      for (int k = 0; k < W; ++k) want += value<float>(k, size_t(r) * per + j);
      ASSERT_EQ(send[size_t(at) * per + j], want) << "block " << at << " element " << j;
    }
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

// The one-rank transport against the MPI transport over the same one-rank communicator
// (MPI_COMM_SELF, on every rank of this test): each collective, in and out of place, gives MPI's
// bits; a communicator of more ranks is refused.
TEST(SelfTransport, MatchesMpiOnOneRank) {
  BackendOptions opt;
  opt.type = "cpu";
  opt.threads = 1;
  auto be = make_cpu_backend(opt);
  auto self = make_self_comm(MPI_COMM_SELF, *be);
  auto mpi = make_mpi_comm(MPI_COMM_SELF, nullptr);
  EXPECT_EQ(self->size(), 1);
  EXPECT_TRUE(self->capturable());
  const size_t n = 1001;
  std::vector<float> src(n);
  for (size_t i = 0; i < n; ++i) src[i] = value<float>(self->rank(), i) * 0.37f;
  for (RedOp op : {RedOp::sum, RedOp::max, RedOp::min}) {
    std::vector<float> a(n, -1.f), b(n, -2.f), ia = src, ib = src;
    self->allreduce(src.data(), a.data(), n, DType::f32, op);
    mpi->allreduce(src.data(), b.data(), n, DType::f32, op);
    EXPECT_EQ(a, b) << "out of place, op " << int(op);
    self->allreduce(ia.data(), ia.data(), n, DType::f32, op);
    mpi->allreduce(ib.data(), ib.data(), n, DType::f32, op);
    EXPECT_EQ(ia, ib) << "in place, op " << int(op);
  }
  std::vector<int64_t> s64(77), a64(77), b64(77);
  for (size_t i = 0; i < s64.size(); ++i) s64[i] = value<int64_t>(0, i);
  self->reduce_scatter(s64.data(), a64.data(), s64.size(), DType::i64, RedOp::sum);
  mpi->reduce_scatter(s64.data(), b64.data(), s64.size(), DType::i64, RedOp::sum);
  EXPECT_EQ(a64, b64);
  std::fill(a64.begin(), a64.end(), 0);
  std::fill(b64.begin(), b64.end(), 0);
  self->allgather(s64.data(), a64.data(), s64.size(), DType::i64);
  mpi->allgather(s64.data(), b64.data(), s64.size(), DType::i64);
  EXPECT_EQ(a64, b64);
  std::vector<float> x = src, y = src;
  self->broadcast(x.data(), n, 0);
  mpi->broadcast(y.data(), n, 0);
  EXPECT_EQ(x, y);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) EXPECT_THROW(make_self_comm(MPI_COMM_WORLD, *be), Error);
}
