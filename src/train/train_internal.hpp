// What train.cpp, train_state.cpp and eval.cpp share: rank 0's work with every rank's verdict, and the
// text forms of shapes in messages. Private to the train layer.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "dpt/augment.hpp"
#include "dpt/check.hpp"
#include "dpt/comm.hpp"
#include "dpt/config.hpp"
#include "dpt/layer_spec.hpp"
#include "dpt/nn.hpp"
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

// Host-side reduction of a few doubles over the ranks (metrics, verdicts): plain MPI, whatever
// the transport, since the values live on the host.
inline void host_sum(MPI_Comm c, double* v, int n) {
  watchdog::Phase phase("waiting in allreduce of metrics");
  DPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, c));
}

// inputs.cpp: the model cfg describes, on data whose samples have this shape (path names the
// data): the widths form checked against the data's width and classes; a layer list's shapes
// inferred.
ModelPlan model_plan(const Config& cfg, const std::vector<int64_t>& sample_shape, int64_t dim, int classes,
                     const std::string& path);
// inputs.cpp: the training images' shape for data.augment's pad-crop and flip: the model's input,
// else the data's (C, H, W), else model.input_shape.
TensorShape augment_shape(const Config& cfg, const ModelPlan& mp, const std::vector<int64_t>& sample_shape,
                          const std::string& path);
int64_t product(const std::vector<int64_t>& v);

// inputs.cpp: with resized crops (data.augment = random_resized_crop, data.crop_size, data.mean),
// the shape of the stored images (C, H, W: the data's, else model.input_shape's) into *stored,
// and the shape the model sees (C, crop, crop); else the data's own.
std::vector<int64_t> seen_shape(const ImageTransform& t, const Config& cfg, const std::vector<int64_t>& sample_shape,
                                const std::string& path, TensorShape* stored);

// "2026-12-01T15:04:05Z"
inline std::string utc_now() { return log::utc_time("%Y-%m-%dT%H:%M:%SZ"); }

}  // namespace train_detail
}  // namespace dpt
