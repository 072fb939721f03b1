// Helpers of the tests that hold the CUDA backend against the CPU backend (test_gpu,
// test_gpu_bf16, test_gpu_conv): random inputs, device buffers filled from and read back to host
// vectors, NaN-poisoned outputs (a kernel that skips an element shows), the relative error, a CUDA
// backend of a precision and that precision's tolerance, one Linear layer's shape and inputs.
// A build or machine without a GPU skips.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/data.hpp"

#define SKIP_WITHOUT_GPU() \
  if (dpt::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible"

namespace dpt::gpu_test {

inline const float kNaN = std::numeric_limits<float>::quiet_NaN();
inline const Precision kPrecisions[] = {Precision::fp32, Precision::tf32, Precision::bf16};

inline double tolerance(Precision p) {
  return p == Precision::fp32 ? 1e-5 : p == Precision::tf32 ? 5e-3 : 2e-2;
}

inline std::vector<float> uniform(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  SplitMix64 g(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = lo + float(g.uniform()) * (hi - lo);
  return v;
}

template <class T> Buffer<T> put(Backend& be, const std::vector<T>& v) {
  Buffer<T> b(be, v.size());
  if (!v.empty()) be.upload(b.data(), v.data(), v.size() * sizeof(T));
  return b;
}

template <class T> std::vector<T> get(Backend& be, const Buffer<T>& b) {
  std::vector<T> v(b.size());
  if (!v.empty()) be.download(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

inline Buffer<float> poisoned(Backend& be, size_t n) {
  Buffer<float> b(be, n);
  be.fill(b.data(), n, kNaN);
  return b;
}

// Batch norm's sums for c channels (2c + 1 doubles), all NaN.
inline Buffer<double> poisoned_sums(Backend& be, int c) {
  return put(be, std::vector<double>(2 * size_t(c) + 1, std::numeric_limits<double>::quiet_NaN()));
}

// ‖got − want‖ / ‖want‖ (absolute when want is 0); infinity if got holds a NaN or Inf.
inline double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double d = 0, w = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    d += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    w += double(want[i]) * want[i];
  }
  return w > 0 ? std::sqrt(d / w) : std::sqrt(d);
}

inline std::unique_ptr<Backend> gpu(Precision p = Precision::fp32) {
  BackendOptions o;
  o.type = "cuda";
  o.precision = p;
  return make_cuda_backend(o);
}

// Sets environment variables for its lifetime (a backend reads its DPT_* switches when made);
// the environment is as it was afterwards.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [name, value] : vars) {
      const char* v = std::getenv(name);
      saved_.push_back({name, v ? v : "", v != nullptr});
      setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    for (const Saved& s : saved_) {
      if (s.had) setenv(s.name, s.value.c_str(), 1);
      else unsetenv(s.name);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  struct Saved {
    const char* name;
    std::string value;
    bool had;
  };
  std::vector<Saved> saved_;
};

// A GPU backend that takes the model's bf16 hints (note_grad_use, note_bf16_readers) and defers
// batch norm's affine pass into the residual sum (bn_train_deferred) whatever the environment
// says (DPT_BF16_GRADS=0, DPT_BF16_ACTS=0 or DPT_DEFER_BN=0 there would turn them off): for the
// tests of those paths themselves. The environment is as it was afterwards.
inline std::unique_ptr<Backend> gpu_with_hints(Precision p) {
  const ScopedEnv env({{"DPT_BF16_GRADS", "1"}, {"DPT_BF16_ACTS", "1"}, {"DPT_DEFER_BN", "1"}});
  return gpu(p);
}

struct Shape { int batch, in, out; };

inline std::string label(Precision p, Act a, const Shape& s) {
  const char* pn = p == Precision::fp32 ? "fp32" : p == Precision::tf32 ? "tf32" : "bf16";
  return std::string(pn) + " " + act_name(a) + " batch " + std::to_string(s.batch) + " in " +
         std::to_string(s.in) + " out " + std::to_string(s.out);
}

// Inputs of one Linear layer; weights scaled by 1/√in like nn.Linear's init, so z stays O(1)
// and tanh/sigmoid are not saturated.
struct LayerData {
  std::vector<float> x, w, b;
  LayerData(const Shape& s, uint64_t seed)
      : x(uniform(size_t(s.batch) * s.in, seed)),
        w(uniform(size_t(s.out) * s.in, seed + 1, -1.f / std::sqrt(float(s.in)),
                  1.f / std::sqrt(float(s.in)))),
        b(uniform(size_t(s.out), seed + 2, -0.5f, 0.5f)) {}
};

}  // namespace dpt::gpu_test
