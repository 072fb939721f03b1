// Helpers of the in-process multi-rank training tests (test_parallel, test_shard, test_parallel_cnn,
// test_parallel_resnet): fixed synthetic datasets, a small config, runs on the first n ranks of
// the world with rank 0's outcome broadcast to every rank, and comparisons; temp_dir serves
// test_gpu_train_cnn's checkpoints too.
#pragma once
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/comm.hpp"
#include "dpt/data.hpp"
#include "dpt/train.hpp"

namespace dpt::testing {

inline int world_rank() { int r; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
inline int world_size() { int s; MPI_Comm_size(MPI_COMM_WORLD, &s); return s; }

inline const Dataset& blobs() {
  static Dataset ds = synth_blobs(640, 12, 4, 0.8f, 99);
  return ds;
}

// 480 two-channel 6x6 images of 4 classes (the layer-list tests: test_parallel_cnn, _resnet).
inline const Dataset& small_images() {
  static Dataset ds = [] {
    Dataset d = synth_blobs(480, 2 * 6 * 6, 4, 0.8f, 17);
    d.sample_shape = {2, 6, 6};
    return d;
  }();
  return ds;
}

inline Config base_config() {
  Config c;
  c.layers = {12, 16, 8, 4};
  c.activation = "tanh";
  c.train_file = "(memory)";
  c.epochs = 3;
  c.optimizer = "nesterov";
  c.lr = 0.05;
  c.momentum = 0.9;
  c.seed = 5;
  c.shuffle = true;
  c.log_every = 1;
  c.progress = false;
  c.threads = 1;
  c.resume = "none";
  return c;
}

struct Outcome {
  std::vector<double> losses;
  std::vector<float> params;                // packed order (MLP::packed)
  std::vector<std::vector<float>> state;    // optimizer state arrays, packed order
  int64_t steps = 0;
};

inline void bcast_vec(std::vector<double>& v) {
  uint64_t n = v.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  v.resize(n);
  MPI_Bcast(v.data(), int(n), MPI_DOUBLE, 0, MPI_COMM_WORLD);
}
inline void bcast_vec(std::vector<float>& v) {
  uint64_t n = v.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  v.resize(n);
  MPI_Bcast(v.data(), int(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
}

// Runs f(backend, comm) on the first `ranks` ranks of the world (CPU backend, one BLAS thread,
// MPI transport over a sub-communicator); the other ranks skip it.
template <class F> void on_first(int ranks, F&& f) {
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < ranks ? 0 : MPI_UNDEFINED, world_rank(), &sub);
  if (sub == MPI_COMM_NULL) return;
  BackendOptions bo;
  bo.type = "cpu";
  bo.threads = 1;
  auto be = make_backend(bo);
  auto comm = make_comm("mpi", sub, *be);
  f(*be, *comm);
  comm.reset();
  MPI_Comm_free(&sub);
}

// Trains cfg on the first `ranks` ranks (on `data`, blobs() by default); every world rank gets
// rank 0's outcome.
inline Outcome train_on(int ranks, const Config& cfg, const Dataset* data = nullptr) {
  Outcome out;
  on_first(ranks, [&](Backend& be, Comm& comm) {
    Trainer t(cfg, be, comm, data ? data : &blobs(), nullptr);
    TrainResult r = t.run();
    out.losses = r.losses;
    out.params = t.model().packed(t.params_host());  // comparable across arena layouts
    for (auto& s : t.optimizer().state()) out.state.push_back(t.model().packed(t.state_host(s.data)));
    out.steps = r.steps;
  });
  bcast_vec(out.losses);
  bcast_vec(out.params);
  uint64_t ns = out.state.size();
  MPI_Bcast(&ns, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  out.state.resize(ns);
  for (auto& v : out.state) bcast_vec(v);
  MPI_Bcast(&out.steps, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  return out;
}

inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return worst / scale;
}

inline std::string temp_dir(const std::string& tag) {
  std::string d;
  if (world_rank() == 0) {
    d = (std::filesystem::temp_directory_path() / ("dpt-" + tag + "-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(d);
  }
  bcast_string(MPI_COMM_WORLD, d);
  return d;
}

}  // namespace dpt::testing
