// What train.cpp and train_state.cpp share: rank 0's work with every rank's verdict, and the
// text forms of shapes in messages. Private to the train layer.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "dpt/check.hpp"
#include "dpt/comm.hpp"
#include "dpt/log.hpp"
#include "dpt/watchdog.hpp"

namespace dpt {
namespace train_detail {

// Rank 0 runs f; every rank learns whether it worked and throws the same error if not, so
// no rank is left waiting in a collective.
// `what` names rank 0's work for the watchdog ("writing a checkpoint"); the others wait for it.
template <class F> void on_rank0(MPI_Comm c, int rank, const char* what, F&& f) {
  std::string msg;
  int code = 0;
  if (rank == 0) {
    watchdog::Phase phase(what);
    code = run_captured(f, msg);
  }
  {
    watchdog::Phase phase("waiting for rank 0's verdict");
    DPT_CHECK_MPI(MPI_Bcast(&code, 1, MPI_INT, 0, c));
  }
  if (code == 0) return;
  bcast_string(c, msg);
  throw Error(msg, code, /*collective=*/true);
}


// "1×28×28" (C,H,W) or "784" (features).
inline std::string shape_text(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "x" : "") + std::to_string(v[i]);
  return s.empty() ? "(none)" : s;
}

inline std::string layers_text(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// "2026-12-01T15:04:05Z"
inline std::string utc_now() { return log::utc_time("%Y-%m-%dT%H:%M:%SZ"); }

}  // namespace train_detail
}  // namespace dpt
