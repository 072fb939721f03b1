// What the layer tests share (test_layers, test_resnet): the message of an expected InputError,
// seeded uniform values, a dot product in double, and central differences against an analytic
// gradient.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dpt/check.hpp"
#include "dpt/data.hpp"  // SplitMix64

namespace layer_util {

// The InputError f throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dpt::InputError& e) {
    return e.what();
  }
  return "";
}

inline std::vector<float> rnd(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  dpt::SplitMix64 g(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = lo + float(g.uniform()) * (hi - lo);
  return v;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// Central differences of loss() against the analytic gradient at every stride-th element of v
// (float32 values, losses summed in double): h = 1e-2 keeps truncation O(h²) and rounding
// ~1e-7/h under the tolerance of 2e-3 + 2%.
inline void expect_fd(float* v, size_t n, const float* analytic, const std::function<double()>& loss,
                      const std::string& label, size_t stride = 1) {
  const float h = 1e-2f;
  for (size_t i = 0; i < n; i += stride) {
    const float keep = v[i];
    v[i] = keep + h;
    const double up = loss();
    v[i] = keep - h;
    const double down = loss();
    v[i] = keep;
    const double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(analytic[i], numeric, 2e-3 + 0.02 * std::fabs(numeric)) << label << " element " << i;
  }
}

inline void expect_fd(std::vector<float>& v, const std::vector<float>& analytic,
                      const std::function<double()>& loss, const std::string& label) {
  ASSERT_EQ(v.size(), analytic.size()) << label;
  expect_fd(v.data(), v.size(), analytic.data(), loss, label);
}

}  // namespace layer_util
