// Where a run's wall time goes, phase by phase, from the kernel starting the process to the end
// of main: start-up (process start to main, MPI_Init, configuration, backend, transport, data,
// model), the training loop and what it holds (the first steps, evaluations, checkpoints), the
// work around the loop, and the shut-down. Each rank keeps its own seconds in a small table (no
// MPI until report()); rank 0 prints the slowest rank's when log.timing = true. Knows nothing
// of training: callers mark their phases.
#pragma once
#include <mpi.h>

namespace dpt::timing {

enum class Phase {
  // One after the other on the main thread; with `other` they add up to the run's time.
  to_main,     // exec to main(): the shared libraries (cuBLAS, NCCL) loaded, static constructors
  mpi_init,    // MPI_Init_thread
  config,      // the configuration read on rank 0, broadcast and parsed
  backend,     // the device picked, CUDA context, streams, cuBLAS/cuBLASLt handles (or OpenBLAS)
  comm,        // the transport: NCCL's communicator (none for one rank), or MPI
  data_wait,   // the main thread's wait for the datasets once backend and transport are up
  model,       // the model and optimizer built, initialised (or read) and broadcast
  first_rows,  // data.read = shard: the first epoch's training rows, read before its first step
  loop,        // the training loop (Trainer::run's own clock)
  around,      // Trainer::run outside its loop: learning rates, the first epoch's order and the
               // dataset's copy to the device, the last device wait, the final checkpoint
  // Parts of the phases above, or beside them.
  data_load,   // reading the datasets (on a thread of its own, while the backend starts)
  first_steps, // inside the loop: the first two steps on the host (GEMM plans, graph capture)
  eval,        // evaluations (inside the loop)
  checkpoint,  // periodic checkpoints (inside the loop)
  final_ckpt,  // the checkpoint written after the loop (part of `around`)
  other,       // the rest of the run: banner, verdicts, the summary (computed by report())
  count
};

// Seconds since the kernel started this process (10 ms resolution: /proc/self/stat).
double since_process_start();

// Records the process start → main phase and starts the run's clock: first thing in main.
void start();

// Adds seconds to a phase.
void add(Phase p, double seconds);
double get(Phase p);

// Times its own lifetime into a phase.
class Scope {
 public:
  explicit Scope(Phase p);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Phase p_;
  double t0_;
};

// Seconds on a monotonic clock (for callers timing a phase by hand).
double now();

// Collective over c: every phase's maximum over the ranks; rank 0 prints the table when print
// is true. Called at the end of the run, before the shut-down.
void report(MPI_Comm c, bool print);

// After MPI_Finalize, rank 0 alone: the shut-down's seconds (destructors, MPI_Finalize) and the
// time from process start to here.
void report_exit(bool print, double shutdown_s);

}  // namespace dpt::timing
