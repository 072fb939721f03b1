// Convolutional networks on the CUDA backend: conv.cu's kernels (im2col / col2im, pooling,
// activations, NHWC <-> NCHW, dropout, augmentation). Convolutions go through cuDNN
// (cudnn_conv.cpp); with DPT_CONV=im2col, as im2col and linear.cpp's GEMMs (kept to measure).
#include "backend_impl.hpp"
#include "conv_kernels.cuh"
#include "data/transform.cuh"
#include "dpt/check.hpp"
#include "cudnn_kernels.cuh"
#include "norm/norm_kernels.cuh"
#include "kernels.cuh"

namespace dpt::cuda_impl {

// ---- convolutional networks: conv.cu's kernels; the GEMMs are linear_forward/backward's ----
void CudaBackendImpl::im2col(const float* x, const ConvGeom& g, float* cols) {
  note_write(cols, size_t(g.rows()) * size_t(g.cols()) * sizeof(float));
  cuda::im2col(x, g, cols, false, stream_.get());
}

// bf16: the columns go straight into the bf16 twin of cols (never written in fp32), which
// linear_forward and then conv_backward's linear_backward take as their input operand.
void CudaBackendImpl::conv_forward(const float* x, const float* w, const float* b, float* cols, float* z, float* a,
                                   const ConvGeom& g, Act act) {
  if (!cols) {  // cuDNN, or a GEMM without columns (conv_cols)
    cudnn_conv_forward(x, w, b, z, a, g, act);
    return;
  }
  floats_of(x, size_t(g.batch) * g.h * g.w * g.c);  // im2col reads floats (an input kept in bf16 only)
  const size_t n = size_t(g.rows()) * size_t(g.cols());
  void* c16 = bf16() ? twin_slot(cols, n) : nullptr;
  if (!c16) {
    Backend::conv_forward(x, w, b, cols, z, a, g, act);
    return;
  }
  note_write(cols, n * sizeof(float));
  cuda::im2col(x, g, c16, true, stream_.get());
  twins_[cols].valid = n;
  linear_fwd(cols, w, b, z, a, g.rows(), g.cols(), g.out, act, false);
}

void CudaBackendImpl::col2im(const float* dcols, const ConvGeom& g, float* dx) {
  note_write(dx, size_t(g.batch) * g.h * g.w * g.c * sizeof(float));
  cuda::col2im(dcols, g, dx, stream_.get());
}

// bf16: x may be a convolution's or a batch norm's ReLU output kept in bf16 only
// (note_bf16_readers), read as it is; y is written in bf16 only where only bf16 readers take it
// (a convolution above, or a residual block's first ops).
void CudaBackendImpl::pool_forward(const float* x, float* y, uint8_t* argmax, const PoolGeom& g, bool max) {
  const size_t ni = size_t(g.batch) * g.h * g.w * g.c, n = size_t(g.batch) * g.oh() * g.ow() * g.c;
  const float* bias = nullptr;
  const void* pre = max && !g.pad ? pre_act_twin(x, ni, &bias) : nullptr;  // note_relu_pool
  const void* x16 = pre ? nullptr : only_copy(x, ni);
  note_write(y, n * sizeof(float));
  if (max) note_write(argmax, n);
  bool only = false;
  void* y16 = out_twin(y, n, false, only);
  void* out = only ? y16 : static_cast<void*>(y);
  if (g.pad)  // norm.cu; x and y each as it is kept (ResNet's stem: bf16 only both)
    cuda::padded_pool_forward({x16 ? x16 : x, x16 != nullptr}, out, only, argmax, g, max, stream_.get());
  else if (pre)
    cuda::pool_forward_relu(pre, bias, out, only, argmax, g, stream_.get());
  else
    cuda::pool_forward(x16 ? x16 : x, x16 != nullptr, out, only, argmax, g, max, stream_.get());
  wrote_twin(y, n, y16, only);
}

// bf16: dy may be kept in bf16 only (the convolution above's input gradient, or a residual
// block's input gradient: GradUse::pool); dx is written in bf16 only where only the ReLU
// backward of the convolution below (GradUse::act, unpadded pools) or the batch norm below
// (GradUse::bn) reads it.
void CudaBackendImpl::pool_backward(const float* dy, const uint8_t* argmax, float* dx, const PoolGeom& g,
                                    bool max) {
  const size_t ni = size_t(g.batch) * g.h * g.w * g.c, n = size_t(g.batch) * g.oh() * g.ow() * g.c;
  const std::optional<GradUse> use = take_grad_use(dx);
  const bool to_act = use == GradUse::act && bf16() && !g.pad, to_bn = use == GradUse::bn && bf16();
  const void* dy16 = only_copy(dy, n);
  note_write(dx, ni * sizeof(float));
  if (g.pad) {  // norm.cu; dx in bf16 only where only the batch norm below reads it
    void* dx16 = to_bn ? twin_slot(dx, ni) : nullptr;
    cuda::padded_pool_backward({dy16 ? dy16 : dy, dy16 != nullptr}, argmax, dx16 ? dx16 : static_cast<void*>(dx),
                               dx16 != nullptr, g, max, stream_.get());
    if (dx16) made_only_twin(dx, ni);
    return;
  }
  // note_relu_pool: the convolution's ReLU backward here too, from its pre-activation (the
  // convolution's backward then adds up the bias gradient alone: premasked_).
  auto rp = max ? relu_pools_.find(argmax) : relu_pools_.end();
  const float* bias = nullptr;
  const void* pre = rp != relu_pools_.end() ? pre_act_twin(rp->second, ni, &bias) : nullptr;
  void* dx16 = to_act || to_bn || pre ? twin_slot(dx, ni) : nullptr;
  if (pre && dx16) {
    cuda::pool_backward_relu(dy16 ? dy16 : dy, dy16 != nullptr, argmax, pre, bias, dx16, g, stream_.get());
    premasked_ = dx;
  } else {
    if (pre) throw Error("pooling backward: no bf16 buffer for the masked gradient of a ReLU kept before bias");
    cuda::pool_backward(dy16 ? dy16 : dy, dy16 != nullptr, argmax, dx16 ? dx16 : dx, dx16 != nullptr, g, max,
                        stream_.get());
  }
  if (dx16) made_only_twin(dx, ni);
}

// bf16: a ReLU's output is most often a convolution's input (ResNet's blocks): its bf16 twin is
// written in the same pass, so that convolution does not convert it.
void CudaBackendImpl::act_forward(const float* z, float* a, size_t n, Act act) {
  note_write(a, n * sizeof(float));
  if (bf16() && act == Act::relu && a != z && !im2col_convs_)
    if (void* a16 = twin_slot(a, n)) {
      cuda::act_forward_twin(z, a, a16, n, act, stream_.get());
      twins_[a].valid = n;
      return;
    }
  cuda::act_forward(z, a, n, act, stream_.get());
}

void CudaBackendImpl::act_backward(float* da, const float* z, const float* a, size_t n, Act act) {
  note_write(da, n * sizeof(float));
  cuda::act_backward(da, z, a, n, act, stream_.get());
}

void CudaBackendImpl::nhwc_to_nchw(const float* src, float* dst, int batch, int c, int hw) {
  note_write(dst, size_t(batch) * c * hw * sizeof(float));
  cuda::batched_transpose(src, dst, batch, hw, c, stream_.get());
}

// bf16, where only bf16 readers take dst (note_bf16_readers: the model's input, made NHWC for
// the first convolution): dst written in bf16 only, into its twin, as that convolution would
// have rounded it.
void CudaBackendImpl::nchw_to_nhwc(const float* src, float* dst, int batch, int c, int hw) {
  const size_t n = size_t(batch) * c * hw;
  bool only = false;
  void* d16 = out_twin(dst, n, false, only);
  note_write(dst, n * sizeof(float));
  if (d16 && only) {
    cuda::batched_transpose_to_bf16(src, d16, batch, c, hw, stream_.get());
    made_only_twin(dst, n);
    return;
  }
  cuda::batched_transpose(src, dst, batch, c, hw, stream_.get());
}

// bf16: from the weight shadow (as_bf16), into wp's twin alone: the GEMMs read that (as_bf16
// finds it), and the shadow is current where the fp32 master may not be (the sharded
// optimizer's all-gather writes the shadow only).
void CudaBackendImpl::weight_to_nhwc(const float* w, float* wp, int rows, int c, int hw) {
  const size_t n = size_t(rows) * size_t(c) * size_t(hw);
  if (!bf16()) {
    nchw_to_nhwc(w, wp, rows, c, hw);
    return;
  }
  const void* w16 = as_bf16(w, n, bf16_a_);
  note_write(wp, n * sizeof(float));
  void* t = twin_slot(wp, n);
  if (!t)
    throw Error("weight_to_nhwc: no bf16 copy for a Linear layer's reordered weight (first met while a step is "
                "being captured)");
  cuda::batched_transpose_bf16(w16, t, rows, c, hw, stream_.get());
  made_only_twin(wp, n);
}

void CudaBackendImpl::dropout(const float* x, float* y, int batch, const DropoutArgs& d, const StepCtl* ctl) {
  note_write(y, size_t(batch) * d.c * d.h * d.w * sizeof(float));
  cuda::dropout(x, y, batch, d, ctl, stream_.get());
}

void CudaBackendImpl::augment(const float* x, float* y, int batch, int c, int h, int w, int pad,
                              const int32_t* draws, const StepCtl* ctl, int64_t offset) {
  note_write(y, size_t(batch) * c * h * w * sizeof(float));
  cuda::augment(x, y, batch, c, h, w, pad, draws, ctl, offset, stream_.get());
}

void CudaBackendImpl::resized_crop(const float* x, float* y, int batch, int c, int h, int w, int oh, int ow,
                                   const int64_t* draws, const StepCtl* ctl, int64_t offset, int64_t fixed,
                                   const float* norm) {
  note_write(y, size_t(batch) * c * oh * ow * sizeof(float));
  cuda::resized_crop(x, y, batch, c, h, w, oh, ow, draws, ctl, offset, fixed, norm, stream_.get());
}

}  // namespace dpt::cuda_impl
