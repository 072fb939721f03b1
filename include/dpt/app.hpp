// What the executables share: MPI start-up and shutdown, set-up stages that fail on every rank
// together, the backend and transport chosen from the config, and the start-up banner.
#pragma once
#include <mpi.h>

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "dpt/backend.hpp"
#include "dpt/comm.hpp"
#include "dpt/config.hpp"
#include "dpt/train.hpp"

namespace dpt {

// MPI_Init_thread / MPI_Finalize, rank-aware logging, HDF5 error printing off.
class MpiSession {
 public:
  MpiSession(int& argc, char**& argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  // MPI_Finalize now (once; the destructor does it otherwise) and the watchdog stopped.
  void finalize();

 private:
  int rank_ = 0, size_ = 1;
  bool finalized_ = false;
};

// ---- start-up and shut-down cuts; each has an environment switch that restores the old path
// (=0), so that one call can time both ----

// True unless the environment variable is set to 0.
bool cut_enabled(const char* env);

// The CUDA driver initialised on a thread of its own while MPI starts, and, where the launcher
// names this process's local rank (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID),
// the primary context of the GPU that rank's backend will pick. check() warns when MPI's local
// rank turns out otherwise (a context was then made on another GPU). DPT_EARLY_CUDA=0: not.
// (With device.type = cpu on a GPU node the context is made all the same.)
class EarlyDriverInit {
 public:
  EarlyDriverInit();
  ~EarlyDriverInit() { join(); }
  EarlyDriverInit(const EarlyDriverInit&) = delete;
  EarlyDriverInit& operator=(const EarlyDriverInit&) = delete;
  void join();
  void check(int local_rank) const;

 private:
  std::thread thread_;
  int hint_ = -1;
};

// cfg's datasets for this rank, read on a thread of its own from construction (no MPI there)
// while the backend and transport start; get() waits and rethrows its error. Its time is
// timing's data_load. DPT_LOAD_THREAD=0: read in get() instead.
class DataLoader {
 public:
  DataLoader(const Config& cfg, MPI_Comm c, bool with_train);
  RunData get();

 private:
  std::future<RunData> pending_;
  std::function<RunData()> read_;
};

// After a successful run, the objects that hold device memory, handles and streams (the trainer,
// the backend) are left to the end of the process, which frees them all at once: freeing them
// one by one (every cudaFree waits for the device) only delays the exit. Never a transport (an
// NCCL communicator must be destroyed before the process ends) nor what owns a thread.
// DPT_FAST_EXIT=0: destroyed as before.
template <class T> void leave_to_exit(std::unique_ptr<T>& p) {
  if (cut_enabled("DPT_FAST_EXIT")) (void)p.release();
}
// After MPI_Finalize at the end of a successful run: stdout and stderr flushed, then _Exit(rc),
// so that the CUDA runtime's and the libraries' exit handlers, which would tear the device's
// context down piece by piece, leave it to the driver as the process ends. Returns (and the
// caller returns rc from main) when DPT_FAST_EXIT=0.
void end_process(int rc);

// Runs f on every rank; if any rank throws, every rank learns it (rank 0 prints each distinct
// message) and the result is the largest exit code, else 0. Only for code that every rank
// reaches with no collective that a failed rank could skip.
int stage(MPI_Comm c, const std::function<void()>& f);

// Reads the INI file on rank 0, broadcasts its text, parses on every rank.
Invocation read_invocation(MPI_Comm c, int argc, char** argv);

struct Runtime {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Comm> comm;
  NodeInfo node;
};

// Backend and transport from device.type / comm.backend, one GPU per local rank (several ranks
// per GPU only with the MPI transport). Run inside stage().
void make_backend_for(const Config& cfg, MPI_Comm c, Runtime& rt);
void make_comm_for(const Config& cfg, MPI_Comm c, Runtime& rt);

// Rank 0 prints the resolved config, backend, transport, ranks and devices, library versions.
void print_banner(const Config& cfg, const Runtime& rt, MPI_Comm c);

// Turns an error escaping the run phase into an exit: collective errors exit together (rank 0
// prints), any other error is printed by its rank and aborts every rank (MPI_Abort).
int fail_run(const std::exception& e, MPI_Comm c);

}  // namespace dpt
