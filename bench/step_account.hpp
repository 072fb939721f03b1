// bench-step --account: where a training step's time goes, op by op, against each op's floor.
#pragma once
#include <string>

#include "dpt/app.hpp"
#include "dpt/config.hpp"
#include "dpt/data.hpp"

namespace dpt::bench {

struct AccountArgs {
  int warmup = 10, steps = 20;  // steps run untimed, then timed (each one enqueued op by op)
  double graph_ms = 0;          // the step as the product runs it (bench-step's median), for the summary
  std::string label;            // the model as the command line named it
};

// Runs a Trainer on cfg with a probe at every op (so every step is enqueued, not replayed),
// times each op between timing events on the backend's stream, measures the backend's GEMM and
// memory ceilings, and prints (rank 0) a table: each op's forward and backward time, achieved
// TFLOP/s or GB/s, its floor (flops at the GEMM ceiling or bytes at the memory ceiling,
// whichever is longer) and how far above it the op runs; then totals by kind and the step
// against the sum of floors, and one JSON line. Collective over the ranks of rt.
void print_account(const Config& cfg, Runtime& rt, const Dataset& ds, const AccountArgs& a);

}  // namespace dpt::bench
