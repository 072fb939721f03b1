// Backend-independent pieces: names, the backend choice, the default batch loader.
#include "dpt/backend.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#include "dpt/check.hpp"
#include "dpt/comm.hpp"
#include "dpt/data.hpp"
#include "dpt/timing.hpp"

namespace dpt {

namespace {
[[noreturn]] void needs_resnet_ops() { throw InputError(kNeedsResnetOps); }
}  // namespace

void Backend::softmax_xent_smoothed(const float* logits, const int32_t* labels, int batch, int classes,
                                    float grad_scale, float* dlogits, float* stats, float eps) {
  if (eps != 0.f)
    throw InputError("train.label_smoothing is not built for the " + name() + " backend yet; use device.type = cpu");
  softmax_xent(logits, labels, batch, classes, grad_scale, dlogits, stats);
}

void Backend::bn_sums(const float*, int64_t, int, double*) { needs_resnet_ops(); }
void Backend::bn_forward(const float*, float*, int64_t, int, const double*, const float*, const float*, float,
                         float, float*, float*, float*, float*, bool) { needs_resnet_ops(); }
void Backend::bn_infer(const float*, float*, int64_t, int, const float*, const float*, const float*,
                       const float*, float, bool) { needs_resnet_ops(); }
void Backend::bn_backward_sums(const float*, const float*, int64_t, int, const float*, double*, const float*) {
  needs_resnet_ops();
}
void Backend::bn_param_grads(const double*, const float*, int, float*, float*, bool) { needs_resnet_ops(); }
void Backend::bn_backward(const float*, const float*, float*, int64_t, int, const double*, const float*,
                          const float*, const float*, const float*) { needs_resnet_ops(); }
void Backend::bn_train_forward(const float* x, float* y, int64_t rows, int c, double* sums, const float* w,
                               const float* b, float eps, float momentum, float* save_mean, float* save_invstd,
                               float* running_mean, float* running_var, bool relu) {
  bn_sums(x, rows, c, sums);
  bn_forward(x, y, rows, c, sums, w, b, eps, momentum, save_mean, save_invstd, running_mean, running_var, relu);
}
bool Backend::bn_train_deferred(const float*, float*, int64_t, int, double*, const float*, const float*, float, float,
                                float*, float*, float*, float*) {
  return false;
}
void Backend::bn_train_backward(const float* dy, const float* x, float* dx, int64_t rows, int c, double* sums,
                                const float* mean, const float* invstd, const float* w, const float* relu_out,
                                float* dw, float* db, bool accumulate) {
  bn_backward_sums(dy, x, rows, c, mean, sums, relu_out);
  bn_param_grads(sums, invstd, c, dw, db, accumulate);
  if (dx) bn_backward(dy, x, dx, rows, c, sums, mean, invstd, w, relu_out);
}
void Backend::add(const float*, float*, size_t) { needs_resnet_ops(); }
void Backend::residual_sum(const float*, const float*, float*, size_t, bool) { needs_resnet_ops(); }
void Backend::residual_backward(float* d, const float* y, float* keep, size_t n, bool relu) {
  if (relu) act_backward(d, y, y, n, Act::relu);
  copy(keep, d, n * sizeof(float));
}
bool Backend::residual_backward_keep(float* d, const float* y, float* keep, size_t n, bool relu) {
  residual_backward(d, y, keep, n, relu);
  return true;
}
void Backend::weight_to_nhwc(const float* w, float* wp, int rows, int c, int hw) {
  nchw_to_nhwc(w, wp, rows, c, hw);
}
void Backend::global_avgpool_forward(const float*, float*, int, int, int) { needs_resnet_ops(); }
void Backend::global_avgpool_backward(const float*, float*, int, int, int) { needs_resnet_ops(); }

Act parse_act(const std::string& s) {
  if (s == "relu") return Act::relu;
  if (s == "tanh") return Act::tanh;
  if (s == "sigmoid") return Act::sigmoid;
  if (s == "gelu") return Act::gelu;
  if (s == "none") return Act::none;
  throw InputError("unknown activation '" + s + "' (relu | tanh | sigmoid | gelu)");
}

const char* act_name(Act a) {
  switch (a) {
    case Act::relu: return "relu";
    case Act::tanh: return "tanh";
    case Act::sigmoid: return "sigmoid";
    case Act::gelu: return "gelu";
    default: return "none";
  }
}

Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::fp32;
  if (s == "tf32") return Precision::tf32;
  if (s == "bf16") return Precision::bf16;
  throw InputError("unknown precision '" + s + "' (fp32 | tf32 | bf16)");
}

OptKind parse_optimizer(const std::string& s) {
  if (s == "sgd") return OptKind::sgd;
  if (s == "momentum") return OptKind::momentum;
  if (s == "nesterov") return OptKind::nesterov;
  if (s == "adam") return OptKind::adam;
  if (s == "adamw") return OptKind::adamw;
  if (s == "lars") return OptKind::lars;
  if (s == "lamb") return OptKind::lamb;
  throw InputError("unknown optimizer '" + s + "' (sgd | momentum | nesterov | adam | adamw | lars | lamb)");
}

AdamScalars adam_scalars(double lr, double beta1, double beta2, int64_t t) {
  AdamScalars a;
  a.one_minus_b1 = float(1.0 - beta1);
  a.one_minus_b2 = float(1.0 - beta2);
  a.step_size = float(lr / (1.0 - std::pow(beta1, double(t))));
  a.bc2_sqrt = float(std::sqrt(1.0 - std::pow(beta2, double(t))));
  return a;
}

void Backend::mlp_forward(const float* x, int batch, const std::vector<LinearArgs>& layers) {
  const float* in = x;
  for (const LinearArgs& l : layers) {
    linear_forward(in, l.w, l.b, l.z, l.a, batch, l.in, l.out, l.act);
    in = l.a;
  }
}

void Backend::mlp_backward(const float* x, int batch, const std::vector<LinearArgs>& layers,
                           float* d0, float* d1, bool accumulate, const PassHooks& hooks,
                           float* dx0) {
  // d0 holds dLoss/dlogits; each layer turns its d(output) into d(input) in the other buffer.
  // linear_backward makes a layer's gradients and its input gradient in one call, so both
  // reports follow it.
  float* d[2] = {d0, d1};
  int cur = 0;
  for (int i = int(layers.size()) - 1; i >= 0; --i) {
    const LinearArgs& l = layers[size_t(i)];
    const float* in = i == 0 ? x : layers[size_t(i) - 1].a;
    linear_backward(in, l.w, l.z, l.a, d[cur], batch, l.in, l.out, l.act, l.dw, l.db,
                    i == 0 ? dx0 : d[1 - cur], accumulate);
    const size_t nw = size_t(l.in) * size_t(l.out);
    if (hooks.grads_final) {
      hooks.grads_final(l.b_at, l.b_at + size_t(l.out));
      hooks.grads_final(l.w_at, l.w_at + nw);
    }
    if (hooks.params_released) {
      hooks.params_released(l.b_at, l.b_at + size_t(l.out));
      hooks.params_released(l.w_at, l.w_at + nw);
    }
    cur = 1 - cur;
  }
}

std::string ConvGeom::text() const {
  return std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w) + " -> " + std::to_string(out) +
         ", k" + std::to_string(k) + " s" + std::to_string(stride) + " p" + std::to_string(pad) + ", batch " +
         std::to_string(batch);
}

namespace {
// A 1x1 stride-1 convolution without padding: im2col would copy x unchanged.
bool pointwise(const ConvGeom& g) { return g.k == 1 && g.stride == 1 && g.pad == 0; }
void need_cols(const float* cols, const ConvGeom& g) {
  if (!cols && !pointwise(g))
    throw Error("conv: a " + std::to_string(g.k) + "x" + std::to_string(g.k) + " stride-" + std::to_string(g.stride) +
                " convolution needs its im2col columns (conv_cols)");
}
}  // namespace

size_t Backend::conv_cols(const ConvGeom& g, bool) {
  return pointwise(g) ? 0 : size_t(g.rows()) * size_t(g.cols());
}

// Without columns (a 1x1 stride-1 convolution) the input's pixels are the GEMM's rows.
void Backend::conv_forward(const float* x, const float* w, const float* b, float* cols, float* z,
                           float* a, const ConvGeom& g, Act act) {
  need_cols(cols, g);
  if (!cols) {
    linear_forward(x, w, b, z, a, g.rows(), g.c, g.out, act);
    return;
  }
  im2col(x, g, cols);
  linear_forward(cols, w, b, z, a, g.rows(), g.cols(), g.out, act);
}

// The input gradient's columns go into cols once the weight gradient has read it (both in
// linear_backward, in that order on one stream).
void Backend::conv_backward(const float* x, const float* w, const float* z, const float* a, float* da, float* cols,
                            const ConvGeom& g, Act act, float* dw, float* db, float* dx,
                            bool accumulate) {
  need_cols(cols, g);
  if (!cols) {
    linear_backward(x, w, z, a, da, g.rows(), g.c, g.out, act, dw, db, dx, accumulate);
    return;
  }
  linear_backward(cols, w, z, a, da, g.rows(), g.cols(), g.out, act, dw, db, dx ? cols : nullptr,
                  accumulate);
  if (dx) col2im(cols, g, dx);
}

uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float bf16_value(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

void Backend::load_batch(const Dataset& ds, const int64_t* rows, int count, float* x, int32_t* y) {
  if (host_addressable()) {
    ds.gather(rows, count, x, y);
    return;
  }
  std::vector<float> hx(size_t(count) * size_t(ds.dim));
  std::vector<int32_t> hy(static_cast<size_t>(count));
  ds.gather(rows, count, hx.data(), hy.data());
  upload(x, hx.data(), hx.size() * sizeof(float));
  upload(y, hy.data(), hy.size() * sizeof(int32_t));
}

void Backend::load_batch_at(const Dataset& ds, const int64_t* order, const StepCtl* ctl,
                            int64_t offset, int count, float* x, int32_t* y,
                            const int64_t* host_rows) {
  if (host_addressable()) {
    load_batch(ds, order + ctl->cursor + offset, count, x, y);
    return;
  }
  if (host_rows) {
    load_batch(ds, host_rows, count, x, y);
    return;
  }
  StepCtl c;  // the slow path of a device backend: read the cursor, then the rows
  download(&c, ctl, sizeof c);
  std::vector<int64_t> rows(static_cast<size_t>(count));
  download(rows.data(), order + c.cursor + offset, rows.size() * sizeof(int64_t));
  load_batch(ds, rows.data(), count, x, y);
}

void Backend::check_finite(const float* g, size_t n, StepCtl* ctl) {
  if (!host_addressable()) throw Error(name() + " backend: check_finite not implemented");
  if (!all_finite(g, n)) ctl->bad = 1;
}

void Backend::optimizer_step_at(float* p, const float* g, float* s1, float* s2, size_t n,
                                const OptimStep& h, const float* lr_table, StepCtl* ctl,
                                bool flag) {
  if (!host_addressable()) throw Error(name() + " backend: optimizer_step_at not implemented");
  if (ctl->bad) return;
  if (flag && !all_finite(g, n)) ctl->bad = 1;
  OptimStep at = h;
  at.lr = lr_table[ctl->step];
  at.t = ctl->updates + 1;
  optimizer_step(p, g, s1, s2, n, at);
}

void Backend::end_step(StepCtl* ctl, int64_t global_batch, bool sticky) {
  if (!host_addressable()) throw Error(name() + " backend: end_step not implemented");
  ++ctl->step;
  if (ctl->bad) {
    ++ctl->skipped;
    if (ctl->first_bad < 0) ctl->first_bad = ctl->step;
    if (!sticky) ctl->bad = 0;
  } else {
    ++ctl->updates;
  }
  ctl->cursor += global_batch;
}

namespace {
class PlainRunner final : public StepRunner {
 public:
  explicit PlainRunner(std::function<void()> f) : f_(std::move(f)) {}
  void run() override { f_(); }

 private:
  std::function<void()> f_;
};
}  // namespace

std::unique_ptr<StepRunner> Backend::make_runner(std::function<void()> step, bool) {
  return std::make_unique<PlainRunner>(std::move(step));
}

namespace {
// The host's clock: the backend's calls return when their work is done.
class HostMarks final : public TimeMarks {
 public:
  void mark() override { t_.push_back(timing::now()); }
  std::vector<double> seconds() override {
    std::vector<double> s(t_.size());
    for (size_t i = 0; i < t_.size(); ++i) s[i] = t_[i] - t_[0];
    return s;
  }

 private:
  std::vector<double> t_;
};
}  // namespace

std::unique_ptr<TimeMarks> Backend::time_marks() { return std::make_unique<HostMarks>(); }

Ceilings Backend::measure_ceilings() { return {}; }

#ifndef DPT_HAVE_CUDA
bool ranks_share_a_gpu(MPI_Comm, Backend&) { return false; }
int cuda_device_count() { return 0; }
void cuda_early_init(int) {}
bool cuda_compiled() { return false; }
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) {
  throw InputError("device.type = cuda, but this dptrain was built without CUDA");
}
#else
bool cuda_compiled() { return true; }
#endif

std::unique_ptr<Backend> make_backend(const BackendOptions& opt) {
  if (opt.type == "cpu") return make_cpu_backend(opt);
  const int gpus = cuda_device_count();
  if (opt.type == "cuda") {
    if (gpus == 0)
      throw InputError(cuda_compiled() ? "device.type = cuda, but no CUDA device is visible"
                                       : "device.type = cuda, but this dptrain was built without CUDA");
    return make_cuda_backend(opt);
  }
  if (gpus > 0) return make_cuda_backend(opt);
  return make_cpu_backend(opt);
}

}  // namespace dpt
