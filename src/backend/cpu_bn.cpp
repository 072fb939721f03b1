// The CPU backend's batch norm, residual sums, global average and padded pooling. A batch-norm
// input is (rows, c) row-major (NHWC pixels, or flat features): per-channel sums run over rows
// with the channel innermost, in double (PyTorch's CPU kernels accumulate batch-norm statistics
// in double too).
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu_conv.hpp"
#include "simd.hpp"

namespace dpt::cpu {

DPT_SIMD void bn_sums(const float* x, int64_t rows, int c, double* sums) {
  double* __restrict s = sums;
  double* __restrict q = sums + c;
  for (int j = 0; j < c; ++j) s[j] = q[j] = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * c;
    for (int j = 0; j < c; ++j) {
      const double v = xr[j];
      s[j] += v;
      q[j] += v * v;
    }
  }
  sums[2 * c] = double(rows);
}

namespace {

// y = x·a + o per channel, then max(y, 0) with relu (act_forward's expression, the same bits as
// the two passes apart).
void affine_rows(const float* x, float* y, int64_t rows, int c, const float* a, const float* o, bool relu) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * c;
    float* __restrict yr = y + r * c;
    if (relu)
      for (int j = 0; j < c; ++j) {
        const float v = xr[j] * a[j] + o[j];
        yr[j] = v > 0.f ? v : 0.f;
      }
    else
      for (int j = 0; j < c; ++j) yr[j] = xr[j] * a[j] + o[j];
  }
}

// One row of bn_backward: o = k·d − off − m·(x − mean), d = dy, or dy where relu_out > 0 and 0
// elsewhere (relu_backward's expression). o may be dy. Two loops, so each vectorises.
DPT_SIMD void bn_backward_row(const float* dy, const float* x, const float* relu_out, float* o, int c,
                              const float* __restrict k, const float* __restrict m, const float* __restrict off,
                              const float* __restrict mean) {
  if (relu_out)
    for (int j = 0; j < c; ++j) {
      const float dv = dy[j];
      const float d = relu_out[j] > 0.f ? dv : 0.f;
      o[j] = k[j] * d - off[j] - m[j] * (x[j] - mean[j]);
    }
  else
    for (int j = 0; j < c; ++j) o[j] = k[j] * dy[j] - off[j] - m[j] * (x[j] - mean[j]);
}

}  // namespace

void bn_forward(const float* x, float* y, int64_t rows, int c, const double* sums, const float* w,
                const float* b, float eps, float momentum, float* save_mean, float* save_invstd,
                float* running_mean, float* running_var, bool relu) {
  const double n = sums[2 * c];
  std::vector<float> scale(static_cast<size_t>(c)), shift(static_cast<size_t>(c));
  for (int j = 0; j < c; ++j) {
    const double mean = sums[j] / n;
    const double var = std::max(0.0, sums[c + j] / n - mean * mean);
    const double invstd = 1.0 / std::sqrt(var + double(eps));
    save_mean[j] = float(mean);
    save_invstd[j] = float(invstd);
    scale[size_t(j)] = float(invstd * w[j]);
    shift[size_t(j)] = float(b[j] - mean * invstd * w[j]);
    if (running_mean) {
      const double unbiased = n > 1 ? var * n / (n - 1) : var;
      running_mean[j] = float(double(momentum) * mean + (1.0 - double(momentum)) * running_mean[j]);
      running_var[j] = float(double(momentum) * unbiased + (1.0 - double(momentum)) * running_var[j]);
    }
  }
  affine_rows(x, y, rows, c, scale.data(), shift.data(), relu);
}

void bn_infer(const float* x, float* y, int64_t rows, int c, const float* running_mean,
              const float* running_var, const float* w, const float* b, float eps, bool relu) {
  std::vector<float> scale(static_cast<size_t>(c)), shift(static_cast<size_t>(c));
  for (int j = 0; j < c; ++j) {
    const double invstd = 1.0 / std::sqrt(double(running_var[j]) + double(eps));
    scale[size_t(j)] = float(invstd * w[j]);
    shift[size_t(j)] = float(b[j] - running_mean[j] * invstd * w[j]);
  }
  affine_rows(x, y, rows, c, scale.data(), shift.data(), relu);
}

DPT_SIMD void bn_backward_sums(const float* dy, const float* x, int64_t rows, int c, const float* mean,
                               double* sums, const float* relu_out) {
  double* __restrict s = sums;
  double* __restrict q = sums + c;
  for (int j = 0; j < c; ++j) s[j] = q[j] = 0;
  // With relu_out, each row's masked dy first (relu_backward's expression) into a row of
  // scratch: the select and the double sums each vectorise apart, not together.
  std::vector<float> row(relu_out ? size_t(c) : 0);
  float* __restrict t = row.data();
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict d = dy + r * c;
    const float* __restrict xr = x + r * c;
    if (relu_out) {
      const float* __restrict a = relu_out + r * c;
      for (int j = 0; j < c; ++j) t[j] = a[j] > 0.f ? d[j] : 0.f;
      d = t;
    }
    for (int j = 0; j < c; ++j) {
      s[j] += d[j];
      q[j] += double(d[j]) * (double(xr[j]) - double(mean[j]));
    }
  }
  sums[2 * c] = double(rows);
}

void bn_param_grads(const double* sums, const float* invstd, int c, float* dw, float* db, bool accumulate) {
  for (int j = 0; j < c; ++j) {
    const float gw = float(sums[c + j] * invstd[j]), gb = float(sums[j]);
    dw[j] = accumulate ? dw[j] + gw : gw;
    db[j] = accumulate ? db[j] + gb : gb;
  }
}

void bn_backward(const float* dy, const float* x, float* dx, int64_t rows, int c, const double* sums,
                 const float* mean, const float* invstd, const float* w, const float* relu_out) {
  // dx = k·dy − k·Σdy/n − k·invstd²·Σdy(x−mean)/n·(x − mean), k = w·invstd.
  const double n = sums[2 * c];
  std::vector<float> k(static_cast<size_t>(c)), m(static_cast<size_t>(c)), off(static_cast<size_t>(c));
  for (int j = 0; j < c; ++j) {
    const double kj = double(w[j]) * invstd[j];
    k[size_t(j)] = float(kj);
    m[size_t(j)] = float(kj * double(invstd[j]) * invstd[j] * sums[c + j] / n);
    off[size_t(j)] = float(kj * sums[j] / n);
  }
  for (int64_t r = 0; r < rows; ++r)
    bn_backward_row(dy + r * c, x + r * c, relu_out ? relu_out + r * c : nullptr, dx + r * c, c, k.data(), m.data(),
                    off.data(), mean);
}

DPT_SIMD void add(const float* x, float* y, size_t n) {
  const float* __restrict a = x;
  float* __restrict b = y;
  for (size_t i = 0; i < n; ++i) b[i] += a[i];
}

DPT_SIMD void residual_sum(const float* body, const float* shortcut, float* y, size_t n, bool relu) {
  const float* __restrict a = body;
  const float* __restrict b = shortcut;
  float* __restrict o = y;
  if (relu)
    for (size_t i = 0; i < n; ++i) {
      const float v = a[i] + b[i];
      o[i] = v > 0.f ? v : 0.f;
    }
  else
    for (size_t i = 0; i < n; ++i) o[i] = a[i] + b[i];
}

void global_avgpool_forward(const float* x, float* y, int batch, int hw, int c) {
  std::vector<double> acc(static_cast<size_t>(c));
  for (int n = 0; n < batch; ++n) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int p = 0; p < hw; ++p) {
      const float* xr = x + (size_t(n) * hw + p) * c;
      for (int j = 0; j < c; ++j) acc[size_t(j)] += xr[j];
    }
    for (int j = 0; j < c; ++j) y[size_t(n) * c + j] = float(acc[size_t(j)] / hw);
  }
}

DPT_SIMD void global_avgpool_backward(const float* dy, float* dx, int batch, int hw, int c) {
  const float inv = 1.f / float(hw);
  for (int n = 0; n < batch; ++n)
    for (int p = 0; p < hw; ++p) {
      const float* __restrict d = dy + size_t(n) * c;
      float* __restrict o = dx + (size_t(n) * hw + p) * c;
      for (int j = 0; j < c; ++j) o[j] = d[j] * inv;
    }
}

}  // namespace dpt::cpu
