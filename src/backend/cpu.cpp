// The CPU backend: OpenBLAS cblas for the GEMMs, oneDNN for convolutions (cpu_dnnl.cpp), plain
// loops for the elementwise work.
#include <cblas.h>
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>

#include "cpu_conv.hpp"
#include "cpu_dnnl.hpp"
#include "dpt/backend.hpp"
#include "dpt/check.hpp"
#include "dpt/timing.hpp"

#include "simd.hpp"

// The elementwise loops are DPT_SIMD (simd.hpp). __restrict: the arena, its gradients and the
// optimizer state never overlap.

namespace dpt {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

inline float act_fwd(Act act, float z) {
  switch (act) {
    case Act::relu: return z > 0.f ? z : 0.f;
    case Act::tanh: return std::tanh(z);
    case Act::sigmoid: return 1.f / (1.f + std::exp(-z));
    case Act::gelu: return 0.5f * z * (1.f + std::erf(z * kInvSqrt2));  // exact, as torch.nn.GELU
    default: return z;
  }
}

// d act / dz, from z (and a = act(z) where that is cheaper).
inline float act_grad(Act act, float z, float a) {
  switch (act) {
    case Act::relu: return z > 0.f ? 1.f : 0.f;
    case Act::tanh: return 1.f - a * a;
    case Act::sigmoid: return a * (1.f - a);
    case Act::gelu:
      return 0.5f * (1.f + std::erf(z * kInvSqrt2)) + z * kInvSqrt2Pi * std::exp(-0.5f * z * z);
    default: return 1.f;
  }
}

DPT_SIMD void relu_forward(const float* __restrict z, float* __restrict a, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = z[i] > 0.f ? z[i] : 0.f;
}

DPT_SIMD void relu_inplace(float* __restrict z, size_t n) {
  for (size_t i = 0; i < n; ++i) z[i] = z[i] > 0.f ? z[i] : 0.f;
}

// a = relu(z), in place when a == z (__restrict forbids relu_forward on one buffer).
void relu(const float* z, float* a, size_t n) {
  if (a == z) relu_inplace(a, n);
  else relu_forward(z, a, n);
}

DPT_SIMD void relu_backward(float* __restrict da, const float* __restrict z, size_t n) {
  for (size_t i = 0; i < n; ++i) da[i] = z[i] > 0.f ? da[i] : 0.f;
}

DPT_SIMD void broadcast_rows(float* __restrict z, const float* __restrict b, int rows, int cols) {
  if (!b) {  // no bias
    std::memset(z, 0, size_t(rows) * size_t(cols) * sizeof(float));
    return;
  }
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < cols; ++j) z[size_t(r) * cols + j] = b[j];
}

DPT_SIMD void column_sums(const float* __restrict dz, float* __restrict db, int rows, int cols,
                          bool accumulate) {
  if (!accumulate)
    for (int j = 0; j < cols; ++j) db[j] = 0.f;
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < cols; ++j) db[j] += dz[size_t(r) * cols + j];
}

// Exponent bits all ones: NaN or ±Inf. Branch-free so it vectorises.
DPT_SIMD bool any_nonfinite(const float* __restrict p, size_t n) {
  const uint32_t* u = reinterpret_cast<const uint32_t*>(p);
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad |= uint32_t((u[i] & 0x7f800000u) == 0x7f800000u);
  return bad != 0;
}

DPT_SIMD void sgd(float* __restrict p, const float* __restrict g, size_t n, float lr, float wd) {
  for (size_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
}

// torch.optim.SGD, dampening 0: the buffer starts at zero, so step 1 gives m = g.
DPT_SIMD void momentum_sgd(float* __restrict p, const float* __restrict g, float* __restrict m,
                           size_t n, float lr, float mom, float wd, bool nesterov) {
  if (nesterov) {
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i] + wd * p[i];
      m[i] = mom * m[i] + gi;
      p[i] -= lr * (gi + mom * m[i]);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      m[i] = mom * m[i] + g[i] + wd * p[i];
      p[i] -= lr * m[i];
    }
  }
}

// torch.optim.Adam / AdamW (foreach=False formulas, amsgrad=False).
DPT_SIMD void adam_loop(float* __restrict p, const float* __restrict g, float* __restrict m,
                        float* __restrict v, size_t n, float b1, float b2, float omb1, float omb2,
                        float eps, float wd, float step, float bc2_sqrt, float shrink,
                        bool decoupled) {
  const float wd_l2 = decoupled ? 0.f : wd;
  const float keep = decoupled ? shrink : 1.f;
  for (size_t i = 0; i < n; ++i) {
    const float pi = p[i] * keep;
    const float gi = g[i] + wd_l2 * p[i];
    m[i] = b1 * m[i] + omb1 * gi;
    v[i] = b2 * v[i] + omb2 * gi * gi;
    p[i] = pi - step * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
  }
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& opt) {
    threads_ = opt.threads;
    source_ = opt.threads_source;
    if (threads_ <= 0) {
      int hw = int(std::max(1u, std::thread::hardware_concurrency()));
      threads_ = std::max(1, hw / std::max(1, opt.local_size));
      source_ = std::to_string(hw) + " cores / " + std::to_string(std::max(1, opt.local_size)) + " local ranks";
    }
    openblas_set_num_threads(threads_);
    omp_set_num_threads(threads_);  // oneDNN's pool (its OpenMP runtime)
    const char* conv = std::getenv("DPT_CONV");
    im2col_ = conv && std::string(conv) == "im2col";
  }

  std::string name() const override { return "cpu"; }
  std::string describe() const override {
    return "cpu, OpenBLAS " + std::string(openblas_get_config()) + ", " +
           std::to_string(threads_) + " BLAS thread(s) per rank" +
           (source_.empty() ? "" : " (" + source_ + ")") + ", convolutions " + conv_path() + ", fp32";
  }
  bool host_addressable() const override { return true; }

  // 64-byte alignment for vector loads (aligned_alloc needs a multiple of the alignment); the
  // size rides in the 64 bytes before the block, for device_memory().
  void* alloc_bytes(size_t bytes) override {
    char* p = static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64));
    if (!p) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
    std::memcpy(p, &bytes, sizeof bytes);
    const size_t now = now_.fetch_add(bytes) + bytes;
    for (size_t pk = peak_.load(); now > pk && !peak_.compare_exchange_weak(pk, now);) {
    }
    return p + 64;
  }
  void free_bytes(void* p) noexcept override {
    if (!p) return;
    char* b = static_cast<char*>(p) - 64;
    size_t bytes = 0;
    std::memcpy(&bytes, b, sizeof bytes);
    now_ -= bytes;
    std::free(b);
  }
  DeviceMemory device_memory() const override { return {now_.load(), peak_.load()}; }
  void reset_memory_peak() override { peak_ = now_.load(); }

  // A 2048³ sgemm and a 256 MiB memcpy, each the best of three.
  Ceilings measure_ceilings() override {
    const int n = 2048;
    const size_t mem = size_t(64) << 20;  // floats
    std::vector<float> a(size_t(n) * n, 1.f), b(size_t(n) * n, 0.5f), c(size_t(n) * n), x(mem, 1.f), y(mem);
    Ceilings r;
    for (int rep = 0; rep < 3; ++rep) {
      double t = timing::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
      r.gemm_flops = std::max(r.gemm_flops, 2.0 * n * n * double(n) / (timing::now() - t));
      t = timing::now();
      std::memcpy(y.data(), x.data(), mem * sizeof(float));
      r.mem_bytes = std::max(r.mem_bytes, 2.0 * double(mem * sizeof(float)) / (timing::now() - t));
    }
    r.gemm_what = "OpenBLAS sgemm 2048x2048x2048, fp32";
    r.mem_what = "memcpy of 256 MiB (bytes read + written)";
    return r;
  }
  void upload(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }
  void download(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }
  void copy(void* d, const void* s, size_t n) override { std::memmove(d, s, n); }
  void fill(float* p, size_t n, float v) override { std::fill(p, p + n, v); }
  void scale(float* p, size_t n, float a) override {
    for (size_t i = 0; i < n; ++i) p[i] *= a;
  }
  void synchronize() override {}

  void linear_forward(const float* x, const float* w, const float* b, float* z, float* a,
                      int batch, int in, int out, Act act) override {
    broadcast_rows(z, b, batch, out);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, out, in, 1.f, x, in, w, in, 1.f,
                z, out);
    if (act == Act::none) {
      if (a != z) std::memcpy(a, z, size_t(batch) * out * sizeof(float));
      return;
    }
    const size_t n = size_t(batch) * out;
    if (act == Act::relu) {
      relu(z, a, n);
      return;
    }
    for (size_t i = 0; i < n; ++i) a[i] = act_fwd(act, z[i]);
  }

  void linear_backward(const float* x, const float* w, const float* z, const float* a, float* da,
                       int batch, int in, int out, Act act, float* dw, float* db, float* dx,
                       bool accumulate) override {
    const size_t n = size_t(batch) * out;
    if (act == Act::relu)
      relu_backward(da, z, n);
    else if (act != Act::none)
      for (size_t i = 0; i < n; ++i) da[i] *= act_grad(act, z[i], a[i]);
    const float* dz = da;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, batch, 1.f, dz, out, x, in,
                accumulate ? 1.f : 0.f, dw, in);
    column_sums(dz, db, batch, out, accumulate);
    if (dx)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, in, out, 1.f, dz, out, w, in,
                  0.f, dx, in);
  }

  // ---- convolutional networks: oneDNN (cpu_dnnl.cpp), or with DPT_CONV=im2col (kept to
  // measure) and wherever a caller passes columns, im2col + the GEMMs; cpu_conv.cpp's loops ----
  size_t conv_cols(const ConvGeom& g, bool input_grad = true) override {
    return im2col_ ? Backend::conv_cols(g, input_grad) : 0;
  }
  void conv_forward(const float* x, const float* w, const float* b, float* cols, float* z, float* a,
                    const ConvGeom& g, Act act) override {
    if (cols || im2col_) {
      Backend::conv_forward(x, w, b, cols, z, a, g, act);
      return;
    }
    dnnl_.forward(x, w, b, z, g);
    act_forward(z, a, size_t(g.rows()) * size_t(g.out), act);
  }
  void conv_backward(const float* x, const float* w, const float* z, const float* a, float* da, float* cols,
                     const ConvGeom& g, Act act, float* dw, float* db, float* dx, bool accumulate) override {
    if (cols || im2col_) {
      Backend::conv_backward(x, w, z, a, da, cols, g, act, dw, db, dx, accumulate);
      return;
    }
    act_backward(da, z, a, size_t(g.rows()) * size_t(g.out), act);
    dnnl_.backward(x, w, da, dw, db, dx, g, accumulate);
  }
  void im2col(const float* x, const ConvGeom& g, float* cols) override { cpu::im2col(x, g, cols); }
  void col2im(const float* dcols, const ConvGeom& g, float* dx) override { cpu::col2im(dcols, g, dx); }
  void pool_forward(const float* x, float* y, uint8_t* argmax, const PoolGeom& g, bool max) override {
    cpu::pool_forward(x, y, argmax, g, max);
  }
  void pool_backward(const float* dy, const uint8_t* argmax, float* dx, const PoolGeom& g,
                     bool max) override {
    cpu::pool_backward(dy, argmax, dx, g, max);
  }
  void nhwc_to_nchw(const float* src, float* dst, int batch, int c, int hw) override {
    cpu::nhwc_to_nchw(src, dst, batch, c, hw);
  }
  void nchw_to_nhwc(const float* src, float* dst, int batch, int c, int hw) override {
    cpu::nchw_to_nhwc(src, dst, batch, c, hw);
  }
  void dropout(const float* x, float* y, int batch, const DropoutArgs& d, const StepCtl* ctl) override {
    cpu::dropout(x, y, batch, d, ctl ? ctl->step : 0);
  }
  void augment(const float* x, float* y, int batch, int c, int h, int w, int pad,
               const int32_t* draws, const StepCtl* ctl, int64_t offset) override {
    cpu::augment(x, y, batch, c, h, w, pad, draws, (ctl ? ctl->cursor : 0) + offset);
  }  void resized_crop(const float* x, float* y, int batch, int c, int h, int w, int oh, int ow,
                    const int64_t* draws, const StepCtl* ctl, int64_t offset, int64_t fixed,
                    const float* norm) override {
    cpu::resized_crop(x, y, batch, c, h, w, oh, ow, draws, (ctl ? ctl->cursor : 0) + offset, fixed, norm);
  }


  void act_forward(const float* z, float* a, size_t n, Act act) override {
    if (act == Act::relu) {
      relu(z, a, n);
    } else if (act == Act::none) {
      if (a != z) std::memcpy(a, z, n * sizeof(float));
    } else {
      for (size_t i = 0; i < n; ++i) a[i] = act_fwd(act, z[i]);
    }
  }
  void act_backward(float* da, const float* z, const float* a, size_t n, Act act) override {
    if (act == Act::relu)
      relu_backward(da, z, n);
    else if (act != Act::none)
      for (size_t i = 0; i < n; ++i) da[i] *= act_grad(act, z[i], a[i]);
  }

  bool has_resnet_ops() const override { return true; }
  void bn_sums(const float* x, int64_t rows, int c, double* sums) override { cpu::bn_sums(x, rows, c, sums); }
  void bn_forward(const float* x, float* y, int64_t rows, int c, const double* sums, const float* w,
                  const float* b, float eps, float momentum, float* save_mean, float* save_invstd,
                  float* running_mean, float* running_var, bool relu) override {
    cpu::bn_forward(x, y, rows, c, sums, w, b, eps, momentum, save_mean, save_invstd, running_mean, running_var, relu);
  }
  void bn_infer(const float* x, float* y, int64_t rows, int c, const float* running_mean,
                const float* running_var, const float* w, const float* b, float eps, bool relu) override {
    cpu::bn_infer(x, y, rows, c, running_mean, running_var, w, b, eps, relu);
  }
  void bn_backward_sums(const float* dy, const float* x, int64_t rows, int c, const float* mean,
                        double* sums, const float* relu_out) override {
    cpu::bn_backward_sums(dy, x, rows, c, mean, sums, relu_out);
  }
  void bn_param_grads(const double* sums, const float* invstd, int c, float* dw, float* db,
                      bool accumulate) override {
    cpu::bn_param_grads(sums, invstd, c, dw, db, accumulate);
  }
  void bn_backward(const float* dy, const float* x, float* dx, int64_t rows, int c, const double* sums,
                   const float* mean, const float* invstd, const float* w, const float* relu_out) override {
    cpu::bn_backward(dy, x, dx, rows, c, sums, mean, invstd, w, relu_out);
  }
  void add(const float* x, float* y, size_t n) override { cpu::add(x, y, n); }
  void residual_sum(const float* body, const float* shortcut, float* y, size_t n, bool relu) override {
    cpu::residual_sum(body, shortcut, y, n, relu);
  }
  void global_avgpool_forward(const float* x, float* y, int batch, int hw, int c) override {
    cpu::global_avgpool_forward(x, y, batch, hw, c);
  }
  void global_avgpool_backward(const float* dy, float* dx, int batch, int hw, int c) override {
    cpu::global_avgpool_backward(dy, dx, batch, hw, c);
  }

  // eps = 0 is the plain loss, bit for bit: the smoothing terms are exact zeros then.
  void softmax_xent(const float* logits, const int32_t* labels, int batch, int classes,
                    float grad_scale, float* dlogits, float* stats) override {
    softmax_xent_smoothed(logits, labels, batch, classes, grad_scale, dlogits, stats, 0.f);
  }

  void softmax_xent_smoothed(const float* logits, const int32_t* labels, int batch, int classes,
                             float grad_scale, float* dlogits, float* stats, float eps) override {
    double loss = 0;
    int correct = 0;
    for (int r = 0; r < batch; ++r) {
      const float* l = logits + size_t(r) * classes;
      int arg = 0;
      for (int j = 1; j < classes; ++j)
        if (l[j] > l[arg]) arg = j;
      const float m = l[arg];
      double sum = 0, all = 0;
      for (int j = 0; j < classes; ++j) {
        sum += std::exp(double(l[j] - m));
        all += double(l[j] - m);
      }
      const int y = labels[r];
      const double lse = std::log(sum);
      loss += (1.0 - eps) * (lse - double(l[y] - m)) + eps * (lse - all / classes);
      correct += (arg == y);
      if (dlogits) {
        float* d = dlogits + size_t(r) * classes;
        const float inv = float(1.0 / sum), off = float(double(eps) / classes) * grad_scale;
        for (int j = 0; j < classes; ++j) d[j] = std::exp(l[j] - m) * inv * grad_scale - off;
        d[y] -= (1.f - eps) * grad_scale;
      }
    }
    stats[0] += float(loss);
    stats[1] += float(correct);
  }

  void optimizer_step(float* p, const float* g, float* s1, float* s2, size_t n,
                      const OptimStep& h) override {
    switch (h.kind) {
      case OptKind::sgd: sgd(p, g, n, h.lr, h.weight_decay); return;
      case OptKind::momentum:
      case OptKind::nesterov:
        momentum_sgd(p, g, s1, n, h.lr, h.momentum, h.weight_decay, h.kind == OptKind::nesterov);
        return;
      case OptKind::adam:
      case OptKind::adamw: {
        const AdamScalars a = adam_scalars(h.lr, h.beta1, h.beta2, h.t);
        adam_loop(p, g, s1, s2, n, float(h.beta1), float(h.beta2), a.one_minus_b1, a.one_minus_b2,
                  h.eps, h.weight_decay, a.step_size, a.bc2_sqrt, 1.f - h.lr * h.weight_decay,
                  h.kind == OptKind::adamw);
        return;
      }
      case OptKind::lars:
      case OptKind::lamb:
        throw Error("optimizer_step: LARS and LAMB run through layer_sums / layer_apply");
    }
  }

  bool all_finite(const float* p, size_t n) override { return !any_nonfinite(p, n); }

  void to_bf16(const float* src, uint16_t* dst, size_t n) override {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_bits(src[i]);
  }
  void from_bf16(const uint16_t* src, float* dst, size_t n, StepCtl* ctl) override {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_value(src[i]);
    if (ctl && any_nonfinite(dst, n)) ctl->bad = 1;
  }

 private:
  std::string conv_path() const {
    if (im2col_) return "im2col + OpenBLAS (DPT_CONV=im2col)";
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  }

  int threads_ = 1;
  std::string source_;  // what decided threads_
  bool im2col_ = false;  // DPT_CONV=im2col
  cpu::DnnlConvs dnnl_;
  std::atomic<size_t> now_{0}, peak_{0};  // bytes allocated (alloc_bytes)
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& opt) {
  return std::make_unique<CpuBackend>(opt);
}

}  // namespace dpt
