// bench-scaling: scaling efficiency over rank counts, bucket sizes and batch/LR settings.
// Not implemented yet: it says so and exits non-zero, so no script mistakes it for a result.
#include <cstdio>

#include "dpt/app.hpp"
#include "dpt/log.hpp"

int main(int argc, char** argv) {
  dpt::MpiSession mpi(argc, argv);
  dpt::log::info("bench-scaling: not implemented yet (tracked as its own issue); nothing was measured");
  return 1;
}
