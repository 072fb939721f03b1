#include "cpu_dnnl.hpp"

#include <dnnl.hpp>

#include <vector>

#include "cpu_conv.hpp"
#include "dpt/check.hpp"

namespace dpt::cpu {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

}  // namespace

struct DnnlConvs::State {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream st{eng};
};

// The user's layouts are plain: x (batch, c, h, w) as NHWC, z likewise, w (out, c, k, k) as
// OHWI (the arena's). The weights' layout is oneDNN's choice (`any`): with plain weights it
// falls back to its reference kernels, 25-250x slower here.
struct DnnlConvs::Plan {
  memory::desc x_md, z_md, w_md, b_md;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data data;
  dnnl::convolution_backward_weights filter;
  memory w_fwd, w_data, dw_blk;  // the weights in each primitive's layout (empty: the user's)
  dnnl::reorder to_fwd, to_data, from_dw;
  std::vector<float> zero_bias, dw_tmp, db_tmp;
};

DnnlConvs::DnnlConvs() : s_(std::make_unique<State>()) {}
DnnlConvs::~DnnlConvs() = default;

DnnlConvs::Plan& DnnlConvs::plan(const ConvGeom& g) {
  const Key key{g.batch, g.c, g.h, g.w, g.out, g.k, g.stride, g.pad};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto p = std::make_unique<Plan>();
  try {
    const memory::dims x{g.batch, g.c, g.h, g.w}, wd{g.out, g.c, g.k, g.k}, z{g.batch, g.out, g.oh(), g.ow()};
    const memory::dims strides{g.stride, g.stride}, pad{g.pad, g.pad};
    p->x_md = memory::desc(x, dt::f32, tag::nhwc);
    p->z_md = memory::desc(z, dt::f32, tag::nhwc);
    p->w_md = memory::desc(wd, dt::f32, tag::ohwi);
    p->b_md = memory::desc({g.out}, dt::f32, tag::x);
    const memory::desc w_any(wd, dt::f32, tag::any);
    const auto direct = dnnl::algorithm::convolution_direct;
    const dnnl::convolution_forward::primitive_desc fpd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, direct, p->x_md, w_any, p->b_md,
                                        p->z_md, strides, pad, pad),
        s_->eng);
    const dnnl::convolution_backward_data::primitive_desc dpd(
        dnnl::convolution_backward_data::desc(direct, p->x_md, w_any, p->z_md, strides, pad, pad), s_->eng, fpd);
    const dnnl::convolution_backward_weights::primitive_desc wpd(
        dnnl::convolution_backward_weights::desc(direct, p->x_md, w_any, p->b_md, p->z_md, strides, pad, pad),
        s_->eng, fpd);
    if (fpd.src_desc() != p->x_md || fpd.dst_desc() != p->z_md || dpd.diff_src_desc() != p->x_md ||
        wpd.diff_dst_desc() != p->z_md || wpd.diff_bias_desc() != p->b_md)
      throw Error("oneDNN wants another activation layout than NHWC for the convolution " + g.text());
    p->fwd = dnnl::convolution_forward(fpd);
    p->data = dnnl::convolution_backward_data(dpd);
    p->filter = dnnl::convolution_backward_weights(wpd);
    auto& eng = s_->eng;
    if (fpd.weights_desc() != p->w_md) {
      p->w_fwd = memory(fpd.weights_desc(), eng);
      p->to_fwd = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p->w_md, eng, fpd.weights_desc()));
    }
    if (dpd.weights_desc() != p->w_md) {
      p->w_data = memory(dpd.weights_desc(), eng);
      p->to_data = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p->w_md, eng, dpd.weights_desc()));
    }
    if (wpd.diff_weights_desc() != p->w_md) {
      p->dw_blk = memory(wpd.diff_weights_desc(), eng);
      p->from_dw = dnnl::reorder(dnnl::reorder::primitive_desc(eng, wpd.diff_weights_desc(), eng, p->w_md));
    }
  } catch (const dnnl::error& e) {
    throw Error("oneDNN cannot make the convolution " + g.text() + ": " + e.what());
  }
  p->zero_bias.assign(size_t(g.out), 0.f);
  return *plans_.emplace(key, std::move(p)).first->second;
}

void DnnlConvs::forward(const float* x, const float* w, const float* b, float* z, const ConvGeom& g) {
  Plan& p = plan(g);
  auto& eng = s_->eng;
  auto& st = s_->st;
  memory xm(p.x_md, eng, const_cast<float*>(x)), wm(p.w_md, eng, const_cast<float*>(w));
  memory bm(p.b_md, eng, const_cast<float*>(b ? b : p.zero_bias.data())), zm(p.z_md, eng, z);
  memory wk = wm;
  if (p.w_fwd) {
    p.to_fwd.execute(st, wm, p.w_fwd);
    wk = p.w_fwd;
  }
  p.fwd.execute(st, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wk}, {DNNL_ARG_BIAS, bm}, {DNNL_ARG_DST, zm}});
  st.wait();
}

void DnnlConvs::backward(const float* x, const float* w, const float* dz, float* dw, float* db, float* dx,
                         const ConvGeom& g, bool accumulate) {
  Plan& p = plan(g);
  auto& eng = s_->eng;
  auto& st = s_->st;
  const size_t nw = size_t(g.out) * size_t(g.cols()), nb = size_t(g.out);
  memory xm(p.x_md, eng, const_cast<float*>(x)), dzm(p.z_md, eng, const_cast<float*>(dz));
  // The gradients straight into dw and db, unless they are added to (or db is not wanted).
  if (accumulate) p.dw_tmp.resize(nw);
  if (accumulate || !db) p.db_tmp.resize(nb);
  float* dw_out = accumulate ? p.dw_tmp.data() : dw;
  float* db_out = accumulate || !db ? p.db_tmp.data() : db;
  memory dwm(p.w_md, eng, dw_out), dbm(p.b_md, eng, db_out);
  p.filter.execute(st, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_DIFF_DST, dzm}, {DNNL_ARG_DIFF_WEIGHTS, p.dw_blk ? p.dw_blk : dwm},
                        {DNNL_ARG_DIFF_BIAS, dbm}});
  if (p.dw_blk) p.from_dw.execute(st, p.dw_blk, dwm);
  if (dx) {
    memory wm(p.w_md, eng, const_cast<float*>(w)), dxm(p.x_md, eng, dx);
    memory wk = wm;
    if (p.w_data) {
      p.to_data.execute(st, wm, p.w_data);
      wk = p.w_data;
    }
    p.data.execute(st, {{DNNL_ARG_DIFF_DST, dzm}, {DNNL_ARG_WEIGHTS, wk}, {DNNL_ARG_DIFF_SRC, dxm}});
  }
  st.wait();
  if (accumulate) {
    add(p.dw_tmp.data(), dw, nw);  // cpu_bn.cpp's y += x
    if (db) add(p.db_tmp.data(), db, nb);
  }
}

}  // namespace dpt::cpu
