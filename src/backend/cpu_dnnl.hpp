// The CPU backend's convolutions on oneDNN (Debian's libdnnl, the library PyTorch's CPU
// convolutions run on): NHWC activations, the arena's (out, k, k, c) weights reordered into the
// layout oneDNN's kernels want on every call and the weight gradient back. One plan (primitive
// descriptors, primitives, the reordered weights' buffers) per shape and batch, made on first
// use. Threads: oneDNN's OpenMP pool, sized by the backend (omp_set_num_threads).
#pragma once
#include <map>
#include <memory>
#include <tuple>

#include "dpt/backend.hpp"

namespace dpt::cpu {

class DnnlConvs {
 public:
  DnnlConvs();
  ~DnnlConvs();
  DnnlConvs(const DnnlConvs&) = delete;
  DnnlConvs& operator=(const DnnlConvs&) = delete;

  // z (rows, out) = conv(x) + b (b may be nullptr: no bias).
  void forward(const float* x, const float* w, const float* b, float* z, const ConvGeom& g);
  // From dz (rows, out): dw and db written or added to (accumulate), dx (unless nullptr) written.
  void backward(const float* x, const float* w, const float* dz, float* dw, float* db, float* dx,
                const ConvGeom& g, bool accumulate);

 private:
  struct Plan;
  using Key = std::tuple<int, int, int, int, int, int, int, int>;
  Plan& plan(const ConvGeom& g);
  struct State;
  std::unique_ptr<State> s_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace dpt::cpu
