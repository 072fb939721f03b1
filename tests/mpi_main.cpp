// main() for every test binary: MPI up, HDF5's own error printing off, a watchdog that turns a
// hang into a failure on every rank, gtest output from rank 0 only (other ranks print their
// failures), and one verdict for all ranks: a logical OR of the failures, so all fail together.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "dpt/check.hpp"
#include "dpt/log.hpp"

namespace {
std::atomic<bool> g_done{false};

void watchdog(double seconds, int rank) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!g_done.load()) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "test watchdog: rank %d still running after %.0f s; aborting all ranks\n",
                   rank, seconds);
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 124);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  dpt::set_where(rank, host);
  dpt::log::set_rank(rank);
  dpt::log::set_quiet(true);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);

  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  // The ctest timeout kills mpirun; this fires first so the message names the hang.
  const char* t = std::getenv("DPT_TEST_TIMEOUT");
  double limit = t ? std::atof(t) * 0.9 : 270.0;
  std::thread dog(watchdog, limit, rank);

  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  if (failed) std::fprintf(stderr, "rank %d of %d: tests failed\n", rank, size);
  g_done = true;
  dog.join();
  MPI_Finalize();
  return any_failed;
}
