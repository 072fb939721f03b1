// The watchdog turns a hang into a failure: one thread per rank watches the phase the main
// thread has marked (an RAII Phase: what it is doing, the step, when it began — a few relaxed
// atomics, no lock, no allocation). When the innermost phase has lasted longer than
// comm.timeout_s, the thread prints one line naming this rank, its host, the phase, the step and
// the seconds waited, aborts the communicator (NCCL), and ends every rank with
// MPI_Abort(kExitTimeout). Every rank reports its own state, so the job log names the rank that
// is behind ("computing step 7") and what the others wait in ("waiting in allreduce, step 7").
// Also holds the fault-injection hook the fault tests drive (DPT_FAULT). Knows nothing of
// training.
#pragma once
#include <cstdint>
#include <string>

namespace dpt {

class Comm;

namespace watchdog {

// Starts the thread (once per process; later calls only change the deadline). A phase without a
// deadline is never timed: outside every Phase nothing is.
void start(double timeout_s);
void set_timeout(double timeout_s);
// The communicator to abort before MPI_Abort (NCCL: ncclCommAbort); nullptr to forget it.
void set_comm(Comm* comm);
// Joins the thread; the end of a run.
void stop();

// Marks a blocking point for as long as it lives. `what` is a string literal that reads in the
// timeout line, e.g. "computing step", "waiting in allreduce"; step < 0 takes the enclosing
// phase's step. Nested phases form a short stack; the innermost one is timed.
class Phase {
 public:
  explicit Phase(const char* what, int64_t step = -1) noexcept;
  ~Phase();
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;
  // Starts the clock again: a long phase made of many bounded pieces (evaluation chunks).
  void restart() noexcept;

 private:
  int depth_;
};

}  // namespace watchdog

// ---- fault injection: a test hook, never set in production ----
// DPT_FAULT="rank=1,step=5,kind=sleep:60" is read once at start-up (watchdog::start). rank is a
// rank or *, step is the 1-based step the fault fires in (0 = at start-up, after the config).
// kinds: sleep:S (stall S seconds inside the step, before its reduction), delay:S (every step
// from `step` on takes S seconds longer: slows a run down for signal tests), exit[:code]
// (_exit without MPI_Finalize), throw (an error on this rank only), kill (SIGKILL to itself),
// abort (SIGABRT), nan (NaN in this rank's gradients before the reduction), ckpt (the write of
// the checkpoint of step `step` fails, where the file is written: rank 0, on the writer's thread
// with checkpoint.background).
namespace fault {

namespace detail {
extern int64_t g_from;  // first step a fault of this rank fires in; INT64_MAX when none
bool fire(int64_t step);
}  // namespace detail

void init(int rank);  // parses DPT_FAULT; throws InputError on a malformed value
// Inside step `step` (1-based; 0 = start-up): fires this rank's fault, if due. Returns true when
// the caller should poison this step's gradients. One compare when no fault is set.
inline bool in_step(int64_t step) { return step >= detail::g_from && detail::fire(step); }
// Where a checkpoint's file is written: throws the injected failure for the checkpoint of step
// `step` (at `path`), if due.
void checkpoint_write(int64_t step, const std::string& path);
// True when this rank has a fault that must see every step run on the host (no graph replay).
bool any();
// No fault from now on (in-process tests that arm one with init()).
void disarm();

}  // namespace fault
}  // namespace dpt
