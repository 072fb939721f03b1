// Shared by the residual-network GPU tests (test_gpu_resnet, test_gpu_residual): batch-norm
// shapes and data, bf16 rounding, a tensor's values as the backend's add reads them, and a
// bitwise comparison.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/data.hpp"
#include "gpu_util.hpp"

namespace dpt::gpu_test {

struct BnShape {
  int64_t rows;
  int c;
};

inline std::string what(const BnShape& s) {
  return "rows " + std::to_string(s.rows) + " c " + std::to_string(s.c);
}

// x (rows, c) with channel j scaled by 0.5 + 0.1·(j % 13) and shifted by 0.2·(j % 5) − 0.3 around
// uniform [−0.5, 1.5); parameters and running stats near their usual values.
struct BnData {
  std::vector<float> x, dy, w, b, rmean, rvar;
  BnData(const BnShape& s, uint64_t seed)
      : x(uniform(size_t(s.rows) * s.c, seed, -0.5f, 1.5f)),
        dy(uniform(size_t(s.rows) * s.c, seed + 1)),
        w(uniform(size_t(s.c), seed + 2, 0.5f, 1.5f)),
        b(uniform(size_t(s.c), seed + 3, -0.5f, 0.5f)),
        rmean(uniform(size_t(s.c), seed + 4, -0.2f, 0.2f)),
        rvar(uniform(size_t(s.c), seed + 5, 0.5f, 2.f)) {
    for (size_t i = 0; i < x.size(); ++i) {
      const int j = int(i % size_t(s.c));
      x[i] = x[i] * (0.5f + 0.1f * float(j % 13)) + 0.2f * float(j % 5) - 0.3f;
    }
  }
};

// Batch norm's input-gradient pass (its sums, then dx into a fresh buffer) from dy, read back:
// two ways of feeding it compared bit for bit. relu_out: the fused ReLU's mask, or nullptr.
struct BnBackwardOut {
  std::vector<double> sums;
  std::vector<float> dx;
};
inline BnBackwardOut bn_backward_out(Backend& g, const float* dy, const float* x, const BnShape& s, const float* mean,
                                     const float* invstd, const float* w, const float* relu_out) {
  auto bs = poisoned_sums(g, s.c);
  auto dx = poisoned(g, size_t(s.rows) * size_t(s.c));
  g.bn_backward_sums(dy, x, s.rows, s.c, mean, bs.data(), relu_out);
  g.bn_backward(dy, x, dx.data(), s.rows, s.c, bs.data(), mean, invstd, w, relu_out);
  return {get(g, bs), get(g, dx)};
}

// Each value rounded to bf16 (nearest even), kept in a float.
inline std::vector<float> rounded16(std::vector<float> v) {
  for (float& x : v) x = bf16_value(bf16_bits(x));
  return v;
}

// A tensor's values as the backend's add reads them (a bf16-only tensor's from its bf16 copy),
// added to zeros: the values, widened to floats.
inline std::vector<float> widened(Backend& g, const Buffer<float>& t) {
  auto zeros = put(g, std::vector<float>(t.size(), 0.f));
  g.add(t.data(), zeros.data(), t.size());
  return get(g, zeros);
}

template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace dpt::gpu_test
