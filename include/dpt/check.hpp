// Error reporting: one exception type and one family of check macros for MPI and HDF5 (CUDA,
// cuBLAS and NCCL have theirs in cuda_check.hpp). A failed check throws dpt::Error carrying rank,
// host, file:line, the call and the library's message; apps turn it into a non-zero exit on
// every rank (collectively during set-up, by MPI_Abort once ranks may be inside a collective).
#pragma once
#include <functional>
#include <stdexcept>
#include <string>

namespace dpt {

// Exit codes a batch script can act on.
enum ExitCode : int {
  kExitOk = 0,
  kExitUsage = 2,      // bad config, bad command line, bad input file
  kExitRuntime = 3,    // a library call failed during the run
  kExitTimeout = 4,    // a collective passed its deadline (watchdog)
  kExitNonFinite = 5,  // loss or gradients became NaN/Inf and policy is to stop
  kExitSignal = 6,     // stopped by SIGTERM/SIGUSR1 after a clean checkpoint (requeue me)
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, int code = kExitRuntime, bool collective = false)
      : std::runtime_error(what), code_(code), collective_(collective) {}
  int code() const noexcept { return code_; }
  // True when every rank raises this error at the same point of the program (a decision they
  // share), so they can exit together without MPI_Abort.
  bool collective() const noexcept { return collective_; }

 private:
  int code_;
  bool collective_;
};

// Bad user input (config, command line, dataset, checkpoint): exit code kExitUsage.
class InputError : public Error {
 public:
  explicit InputError(const std::string& what, bool collective = false)
      : Error(what, kExitUsage, collective) {}
};

// "rank 3 on node12" — filled in once MPI is up.
std::string where();
void set_where(int rank, const std::string& host);

// Runs f; returns 0, or the exit code of what it threw (kExitRuntime for a non-dpt exception)
// with its message in msg. For code that must report a failure to the other ranks rather than
// unwind past a collective.
int run_captured(const std::function<void()>& f, std::string& msg);

[[noreturn]] void throw_call_error(const char* lib, const char* call, const std::string& msg,
                                   const char* file, int line);

std::string mpi_error_string(int code);
std::string hdf5_error_string();

}  // namespace dpt

#define DPT_CHECK_MPI(call)                                                             \
  do {                                                                                  \
    int dpt_rc_ = (call);                                                               \
    if (dpt_rc_ != 0)                                                                   \
      ::dpt::throw_call_error("MPI", #call, ::dpt::mpi_error_string(dpt_rc_), __FILE__, \
                              __LINE__);                                                \
  } while (0)

// HDF5 calls return a negative value (or an invalid hid_t) on failure.
#define DPT_CHECK_H5(call)                                                                    \
  do {                                                                                        \
    if ((call) < 0)                                                                           \
      ::dpt::throw_call_error("HDF5", #call, ::dpt::hdf5_error_string(), __FILE__, __LINE__); \
  } while (0)

#define DPT_REQUIRE(cond, msg)                     \
  do {                                             \
    if (!(cond)) throw ::dpt::InputError(msg);     \
  } while (0)
