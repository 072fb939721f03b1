// The CUDA backend's convolutional-network ops against the CPU backend (the oracle), op by op,
// on random data, in fp32, TF32 and bf16. Every test skips where no CUDA device is visible.
//
// Tolerances (relative error ‖gpu − cpu‖₂ / ‖cpu‖₂ of a whole output):
//   exact      im2col, the layout transposes, dropout, augmentation and max pooling copy or
//              select values; col2im, pooling's backward and avg pooling add the same terms in
//              the same order as the CPU (a gather in increasing output order, the CPU's scatter
//              order) with IEEE adds and __fdiv_rn, so they must agree bit for bit. (The inputs
//              are O(1): no denormals, which --use_fast_math would flush.)
//   1e-5       elementwise activations: fast-math expf/erff differ from glibc by a few ulp.
//   fp32 1e-5, tf32 5e-3, bf16 2e-2   convolutions (cuDNN; fp32 without its FFT and Winograd
//              algorithms): summation order, TF32's 10 and bf16's 7 mantissa bits.
//   bf16 1e-3  against the CPU fed with the same inputs rounded to bf16, its outputs rounded to
//              bf16 as cuDNN's are (kBf16Out); a stale bf16 copy of an input shows near 1e-2.
// Outputs are poisoned with NaN on the GPU first, so an element the GPU forgets fails.
#include <gtest/gtest.h>

#include <array>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dpt/augment.hpp"
#include "dpt/backend.hpp"
#include "dpt/data.hpp"
#include "gpu_util.hpp"

namespace {
using namespace dpt;
using namespace dpt::gpu_test;

const char* pname(Precision p) {
  return p == Precision::fp32 ? "fp32" : p == Precision::tf32 ? "tf32" : "bf16";
}
// Round to nearest even bf16, kept in a float: the CUDA kernels' conversion, bit for bit.
float bf16_round(float f) { return bf16_value(bf16_bits(f)); }
std::vector<float> bf16_round(std::vector<float> v) {
  for (auto& x : v) x = bf16_round(x);
  return v;
}

// cuDNN's bf16 outputs against the CPU's on the same bf16 inputs, rounded to bf16: where the two
// summation orders put a value on either side of a rounding boundary they differ by one bf16 ulp
// (2^-8 relative), in few elements; a stale bf16 copy of an input shows near 1e-2.
constexpr double kBf16Out = 1e-3;

ConvGeom geom(int batch, int c, int h, int w, int out, int k, int stride, int pad) {
  ConvGeom g;
  g.batch = batch; g.c = c; g.h = h; g.w = w; g.out = out; g.k = k; g.stride = stride; g.pad = pad;
  return g;
}

// inputs/cnn.ini's two convolutions, the large CNN's (3x64x64 input, 128/256 channels) at a
// small batch, odd sizes and channel counts (the scalar kernel paths), stride 2, k = 1 and 5, and
// more than 65535 output rows (the grid-stride loops).
const ConvGeom kConvs[] = {
    geom(16, 1, 28, 28, 32, 3, 1, 1),  geom(16, 32, 14, 14, 64, 3, 1, 1),
    geom(2, 3, 64, 64, 128, 3, 1, 1),  geom(2, 128, 32, 32, 256, 3, 1, 1),
    geom(3, 5, 9, 11, 7, 3, 2, 0),     geom(2, 4, 8, 8, 6, 1, 1, 0),
    geom(2, 6, 10, 9, 8, 5, 2, 2),     geom(96, 1, 28, 28, 8, 3, 1, 1),
    geom(2, 3, 32, 32, 16, 7, 2, 3),  // ResNet's stem (7x7 stride 2 on 3 channels)
};

std::string what(const ConvGeom& g) {
  return "batch " + std::to_string(g.batch) + " " + std::to_string(g.c) + "x" + std::to_string(g.h) +
         "x" + std::to_string(g.w) + " -> " + std::to_string(g.out) + " k" + std::to_string(g.k) +
         " s" + std::to_string(g.stride) + " p" + std::to_string(g.pad);
}

struct ConvData {
  std::vector<float> x, w, b;
  ConvData(const ConvGeom& g, uint64_t seed)
      : x(uniform(size_t(g.batch) * g.h * g.w * g.c, seed)),
        w(uniform(size_t(g.out) * g.cols(), seed + 1, -1.f / std::sqrt(float(g.cols())),
                  1.f / std::sqrt(float(g.cols())))),
        b(uniform(size_t(g.out), seed + 2, -0.5f, 0.5f)) {}
};

// Batch norm's whole backward pass over (rows, c) with a fused ReLU's mask (relu_out): its sums,
// its parameter gradients (written), its input gradient over dy.
void bn_backward_pass(Backend& g, float* dy, const float* x, int64_t rows, int c, const float* mean,
                      const float* invstd, const float* w, const float* relu_out, double* sums, float* dw,
                      float* db) {
  g.bn_backward_sums(dy, x, rows, c, mean, sums, relu_out);
  g.bn_param_grads(sums, invstd, c, dw, db, false);
  g.bn_backward(dy, x, dy, rows, c, sums, mean, invstd, w, relu_out);
}

// gpu_with_hints under bf16 with every convolution on cuDNN's paths (DPT_NARROW_CONV=0): a
// narrow convolution's hinted form takes its bias and ReLU in the GEMM's epilogue, rounded once
// where the unhinted form rounds twice (NarrowConvolutionsMatchTheCpu holds it to the CPU).
std::unique_ptr<Backend> cudnn_with_hints() {
  const ScopedEnv env({{"DPT_NARROW_CONV", "0"}});
  return gpu_with_hints(Precision::bf16);
}

}  // namespace

TEST(CudaConv, Im2colAndCol2imAreExact) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu();
  for (const ConvGeom& c : kConvs) {
    const ConvData d(c, 10);
    const size_t nc = size_t(c.rows()) * c.cols();
    std::vector<float> cols(nc), dx(d.x.size());
    cpu->im2col(d.x.data(), c, cols.data());
    auto gx = put(*g, d.x);
    auto gcols = poisoned(*g, nc);
    g->im2col(gx.data(), c, gcols.data());
    EXPECT_EQ(get(*g, gcols), cols) << "im2col " << what(c);

    const std::vector<float> dcols = uniform(nc, 11);
    cpu->col2im(dcols.data(), c, dx.data());
    auto gd = put(*g, dcols);
    auto gdx = poisoned(*g, d.x.size());
    g->col2im(gd.data(), c, gdx.data());
    EXPECT_EQ(get(*g, gdx), dx) << "col2im " << what(c);
  }
}

TEST(CudaConv, ForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  for (Precision p : kPrecisions) {
    auto g = gpu(p);
    for (const ConvGeom& c : kConvs)
      for (Act act : {Act::none, Act::relu, Act::tanh})
        for (int path = 0; path < 4; ++path) {
          const bool acc = path % 2, cudnn = path >= 2;  // cuDNN (or a 1x1 GEMM): no columns
          const std::string label = std::string(pname(p)) + " " + act_name(act) + " " + what(c) +
                                    (acc ? " accumulate" : "") + (cudnn ? " cuDNN" : " im2col");
          const ConvData d(c, 20 + uint64_t(c.out));
          const size_t n = size_t(c.rows()) * c.out, nc = size_t(c.rows()) * c.cols();
          std::vector<float> cols(nc), z(n), a(n);
          cpu->conv_forward(d.x.data(), d.w.data(), d.b.data(), cols.data(), z.data(), a.data(), c, act);
          auto gx = put(*g, d.x), gw = put(*g, d.w), gb = put(*g, d.b);
          auto gcols = poisoned(*g, nc), gz = poisoned(*g, n), ga = poisoned(*g, n);
          float* gc = cudnn ? nullptr : gcols.data();
          g->conv_forward(gx.data(), gw.data(), gb.data(), gc, gz.data(), ga.data(), c, act);
          // bf16 on cuDNN with a ReLU: z is not written (the ReLU's backward reads a, > 0
          // exactly where z > 0); a 1x1 stride-1 convolution is a GEMM that writes both.
          const bool no_z = p == Precision::bf16 && act == Act::relu && cudnn && !(c.k == 1 && c.stride == 1 && c.pad == 0);
          if (no_z) EXPECT_TRUE(std::isnan(get(*g, gz)[0]) && std::isnan(get(*g, gz)[n - 1])) << "z written " << label;
          else EXPECT_LE(rel_err(get(*g, gz), z), tolerance(p)) << "z " << label;
          EXPECT_LE(rel_err(get(*g, ga), a), tolerance(p)) << "a " << label;

          // Backward from the GPU's own forward (its columns, z and a), against the CPU's from
          // the same z and a: a ReLU mask taken from the CPU's z would flip wherever TF32/bf16
          // moved z across 0, an error of the whole upstream gradient there, not the GEMMs'.
          const std::vector<float> ag = get(*g, ga), zg = no_z ? ag : get(*g, gz);
          const std::vector<float> da = uniform(n, 30);
          const std::vector<float> dw0 = uniform(d.w.size(), 31), db0 = uniform(d.b.size(), 32);
          std::vector<float> cda = da, cdw = acc ? dw0 : std::vector<float>(dw0.size(), 0.f);
          std::vector<float> cdb = acc ? db0 : std::vector<float>(db0.size(), 0.f), cdx(d.x.size());
          cpu->conv_backward(d.x.data(), d.w.data(), zg.data(), ag.data(), cda.data(), cols.data(), c, act,
                             cdw.data(), cdb.data(), cdx.data(), acc);
          auto gda = put(*g, da);
          Buffer<float> gdw = acc ? put(*g, dw0) : poisoned(*g, dw0.size());
          Buffer<float> gdb = acc ? put(*g, db0) : poisoned(*g, db0.size());
          auto gdx = poisoned(*g, d.x.size());
          g->conv_backward(gx.data(), gw.data(), gz.data(), ga.data(), gda.data(), gc, c, act,
                           gdw.data(), gdb.data(), gdx.data(), acc);
          EXPECT_LE(rel_err(get(*g, gdb), cdb), tolerance(p)) << "db " << label;
          EXPECT_LE(rel_err(get(*g, gdw), cdw), tolerance(p)) << "dw " << label;
          EXPECT_LE(rel_err(get(*g, gdx), cdx), tolerance(p)) << "dx " << label;
          if (act == Act::none || acc) continue;
          // The model lets a overwrite z for relu and tanh (they differentiate from a): the
          // same bits as with z apart.
          auto gza = poisoned(*g, n);
          g->conv_forward(gx.data(), gw.data(), gb.data(), gc, gza.data(), gza.data(), c, act);
          EXPECT_EQ(get(*g, gza), get(*g, ga)) << "a in place of z " << label;
          auto gda2 = put(*g, da);
          auto gdw2 = poisoned(*g, dw0.size()), gdb2 = poisoned(*g, db0.size()), gdx2 = poisoned(*g, d.x.size());
          g->conv_backward(gx.data(), gw.data(), gza.data(), gza.data(), gda2.data(), gc, c, act, gdw2.data(),
                           gdb2.data(), gdx2.data(), false);
          EXPECT_EQ(get(*g, gdw2), get(*g, gdw)) << "dw, a in place of z " << label;
          EXPECT_EQ(get(*g, gdx2), get(*g, gdx)) << "dx, a in place of z " << label;
        }
  }
}

// bf16 against the CPU on bf16-rounded inputs: the GEMMs must read bf16 copies of this forward's
// columns and these weights. A second forward with other data through the same buffers checks
// that the columns' bf16 copy follows it; im2col (fp32 columns) and then a plain Linear GEMM on
// them checks that an fp32 write drops the bf16 copy.
TEST(CudaConv, Bf16ColumnsFollowEveryWrite) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu(Precision::bf16);
  for (const ConvGeom& c : {kConvs[1], kConvs[4], kConvs[6]}) {
    const size_t n = size_t(c.rows()) * c.out, nc = size_t(c.rows()) * c.cols();
    auto gcols = poisoned(*g, nc), gz = poisoned(*g, n), ga = poisoned(*g, n);
    auto gw = poisoned(*g, size_t(c.out) * c.cols()), gb = poisoned(*g, size_t(c.out));
    auto gx = poisoned(*g, size_t(c.batch) * c.h * c.w * c.c);
    // Rounds 0, 1: im2col's columns (the GEMMs' fp32 outputs: 1e-4); 2, 3: cuDNN (no columns).
    for (uint64_t round = 0; round < 4; ++round) {
      const bool cudnn = round >= 2;
      float* gc = cudnn ? nullptr : gcols.data();
      const double tol = cudnn ? kBf16Out : 1e-4;
      auto out16 = [&](const std::vector<float>& v) { return cudnn ? bf16_round(v) : v; };
      const std::string label = what(c) + " round " + std::to_string(round) + (cudnn ? " cuDNN" : " im2col");
      const ConvData d(c, 40 + 10 * (round % 2));
      const auto xr = bf16_round(d.x), wr = bf16_round(d.w);
      // cuDNN's bf16 convolutions write bf16 (as PyTorch's autocast does): the oracle is the
      // CPU's convolution rounded to bf16, then the bias added in fp32.
      std::vector<float> cols(nc), z(n), a(n), nob(d.b.size(), 0.f);
      cpu->conv_forward(xr.data(), wr.data(), nob.data(), cols.data(), z.data(), a.data(), c, Act::none);
      for (size_t i = 0; i < n; ++i) z[i] = (cudnn ? bf16_round(z[i]) : z[i]) + d.b[i % size_t(c.out)];
      a = z;
      g->upload(gx.data(), d.x.data(), d.x.size() * 4);
      g->upload(gw.data(), d.w.data(), d.w.size() * 4);
      g->upload(gb.data(), d.b.data(), d.b.size() * 4);
      g->conv_forward(gx.data(), gw.data(), gb.data(), gc, gz.data(), ga.data(), c, Act::none);
      EXPECT_LE(rel_err(get(*g, gz), z), tol) << "z " << label;

      const auto da = bf16_round(uniform(n, 50 + round));  // act none: dz = da, rounded alike
      std::vector<float> cda = da, cdw(d.w.size()), cdb(d.b.size()), cdx(d.x.size());
      cpu->conv_backward(xr.data(), wr.data(), z.data(), a.data(), cda.data(), cols.data(), c, Act::none,
                         cdw.data(), cdb.data(), cdx.data(), false);
      auto gda = put(*g, da);
      auto gdw = poisoned(*g, cdw.size()), gdb = poisoned(*g, cdb.size()), gdx = poisoned(*g, cdx.size());
      g->conv_backward(gx.data(), gw.data(), gz.data(), ga.data(), gda.data(), gc, c, Act::none,
                       gdw.data(), gdb.data(), gdx.data(), false);
      EXPECT_LE(rel_err(get(*g, gdw), out16(cdw)), tol) << "dw " << label;
      EXPECT_LE(rel_err(get(*g, gdb), cdb), 1e-5) << "db " << label;
      EXPECT_LE(rel_err(get(*g, gdx), out16(cdx)), tol) << "dx " << label;
    }
    // fp32 columns written by im2col, then a Linear GEMM on them: bf16 of these columns.
    const ConvData d(c, 70);
    auto gx2 = put(*g, d.x);
    g->im2col(gx2.data(), c, gcols.data());
    std::vector<float> cols(nc), z(n), a(n);
    cpu->im2col(d.x.data(), c, cols.data());
    const auto colsr = bf16_round(cols), wr = bf16_round(d.w);
    g->upload(gw.data(), d.w.data(), d.w.size() * 4);
    g->upload(gb.data(), d.b.data(), d.b.size() * 4);
    cpu->linear_forward(colsr.data(), wr.data(), d.b.data(), z.data(), a.data(), c.rows(), c.cols(), c.out, Act::none);
    g->linear_forward(gcols.data(), gw.data(), gb.data(), gz.data(), ga.data(), c.rows(), c.cols(), c.out, Act::none);
    EXPECT_LE(rel_err(get(*g, gz), z), 1e-4) << "im2col then linear_forward " << what(c);
  }
}

TEST(CudaConv, PoolingIsExact) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu();
  auto pg = [](int batch, int c, int h, int w, int k, int s) {
    PoolGeom p;
    p.batch = batch; p.c = c; p.h = h; p.w = w; p.k = k; p.stride = s;
    return p;
  };
  for (const PoolGeom& p : {pg(16, 32, 28, 28, 2, 2), pg(16, 64, 14, 14, 2, 2), pg(3, 5, 9, 11, 3, 2),
                            pg(2, 4, 7, 7, 3, 1), pg(100, 1, 28, 28, 2, 2), pg(2, 8, 5, 5, 5, 5)})
    for (bool max : {true, false}) {
      const std::string label = std::string(max ? "max " : "avg ") + std::to_string(p.c) + "x" +
                                std::to_string(p.h) + "x" + std::to_string(p.w) + " k" +
                                std::to_string(p.k) + " s" + std::to_string(p.stride);
      const size_t nin = size_t(p.batch) * p.h * p.w * p.c, nout = size_t(p.batch) * p.oh() * p.ow() * p.c;
      // Coarse values: many ties, so the first-maximum rule is exercised.
      std::vector<float> x = uniform(nin, 60);
      for (auto& v : x) v = std::round(v * 4.f) / 4.f;
      std::vector<float> y(nout), dx(nin);
      std::vector<uint8_t> arg(nout);
      cpu->pool_forward(x.data(), y.data(), max ? arg.data() : nullptr, p, max);
      auto gx = put(*g, x);
      auto gy = poisoned(*g, nout);
      Buffer<uint8_t> garg(*g, max ? nout : 0);
      g->pool_forward(gx.data(), gy.data(), max ? garg.data() : nullptr, p, max);
      EXPECT_EQ(get(*g, gy), y) << label;
      if (max) EXPECT_EQ(get(*g, garg), arg) << label;

      const std::vector<float> dy = uniform(nout, 61);
      cpu->pool_backward(dy.data(), max ? arg.data() : nullptr, dx.data(), p, max);
      auto gdy = put(*g, dy);
      auto gdx = poisoned(*g, nin);
      g->pool_backward(gdy.data(), max ? garg.data() : nullptr, gdx.data(), p, max);
      EXPECT_EQ(get(*g, gdx), dx) << label;
    }
}

TEST(CudaConv, ActivationsLayoutDropoutAugment) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  auto g = gpu();
  const size_t n = 100003;  // not a multiple of anything
  const std::vector<float> z = uniform(n, 70, -3.f, 3.f), r = uniform(n, 71);
  for (Act act : {Act::none, Act::relu, Act::tanh, Act::sigmoid, Act::gelu}) {
    std::vector<float> a(n), d = r;
    cpu->act_forward(z.data(), a.data(), n, act);
    cpu->act_backward(d.data(), z.data(), a.data(), n, act);
    auto gz = put(*g, z), gr = put(*g, r);
    auto ga = poisoned(*g, n);
    g->act_forward(gz.data(), ga.data(), n, act);
    auto gca = put(*g, a);  // the backward from the CPU's a, so only the backward is compared
    g->act_backward(gr.data(), gz.data(), gca.data(), n, act);
    EXPECT_LE(rel_err(get(*g, ga), a), 1e-5) << "forward " << act_name(act);
    EXPECT_LE(rel_err(get(*g, gr), d), 1e-5) << "backward " << act_name(act);
  }

  // Layouts: 64 channels (tiles), and an image's 1 or 3 channels or one pixel (a few rows: one
  // thread per column).
  for (const auto& [batch, c, hw] : {std::array<int, 3>{37, 64, 49}, {5, 3, 1000}, {4, 1, 784}, {6, 100, 1}}) {
    const std::vector<float> x = uniform(size_t(batch) * c * hw, 72);
    std::vector<float> t(x.size()), u(x.size());
    cpu->nhwc_to_nchw(x.data(), t.data(), batch, c, hw);
    cpu->nchw_to_nhwc(x.data(), u.data(), batch, c, hw);
    auto gx = put(*g, x);
    auto gt = poisoned(*g, x.size()), gu = poisoned(*g, x.size());
    g->nhwc_to_nchw(gx.data(), gt.data(), batch, c, hw);
    g->nchw_to_nhwc(gx.data(), gu.data(), batch, c, hw);
    EXPECT_EQ(get(*g, gt), t) << "to NCHW, c " << c << " hw " << hw;
    EXPECT_EQ(get(*g, gu), u) << "to NHWC, c " << c << " hw " << hw;
  }

  // Dropout: the mask from the step in device memory, an image (NHWC) and flat features.
  const int batch = 37;
  const std::vector<float> x = uniform(size_t(batch) * 64 * 49, 72);
  auto gx = put(*g, x);
  StepCtl ctl;
  ctl.step = 41;
  ctl.cursor = 5;
  auto gctl = put(*g, std::vector<StepCtl>{ctl});
  for (int hwd : {1, 7}) {
    DropoutArgs dr;
    dr.p = 0.4;
    dr.seed = 3;
    dr.layer = 9;
    dr.first = 128;
    dr.c = int(x.size() / batch) / (hwd * hwd);
    dr.h = dr.w = hwd;
    std::vector<float> y(x.size());
    cpu->dropout(x.data(), y.data(), batch, dr, &ctl);
    auto gy = poisoned(*g, x.size());
    g->dropout(gx.data(), gy.data(), batch, dr, gctl.data());
    EXPECT_EQ(get(*g, gy), y) << "dropout h = w = " << hwd;
  }

  // Augmentation: draws at ctl->cursor + offset on the device.
  const int ab = 9, ac = 3, ah = 12, aw = 10, pad = 4;
  const std::vector<float> img = uniform(size_t(ab) * ac * ah * aw, 73);
  std::vector<int32_t> draws(64);
  const AugmentSpec spec = parse_augment("crop,flip", pad);
  for (size_t i = 0; i < draws.size(); ++i) draws[i] = augment_draw(spec, 1, 2, int64_t(i) * 7);
  std::vector<float> out(img.size());
  cpu->augment(img.data(), out.data(), ab, ac, ah, aw, pad, draws.data(), &ctl, 3);
  auto gimg = put(*g, img);
  auto gdraws = put(*g, draws);
  auto gout = poisoned(*g, img.size());
  g->augment(gimg.data(), gout.data(), ab, ac, ah, aw, pad, gdraws.data(), gctl.data(), 3);
  EXPECT_EQ(get(*g, gout), out);

  // Resized crops: random_resized_crop's windows (shrunk and enlarged, flipped) at ctl->cursor +
  // offset, and a fixed center window, normalised; the same float operations in the same order
  // as the CPU's reference, so the same bits.
  const int rb = 9, rc = 3, rh = 40, rw = 52;
  const std::vector<float> rimg = uniform(size_t(rb) * rc * rh * rw, 79);
  ImageTransform t = parse_transform("random_resized_crop,flip", 24, "0.08,1", "0.75,1.3333333333333333", 0.875,
                                     "0.4,0.5,0.6", "0.2,0.25,0.3");
  std::vector<int64_t> windows(64);
  for (size_t i = 0; i < windows.size(); ++i) windows[i] = window_draw(t, rh, rw, 1, 2, int64_t(i) * 5);
  windows[8] = pack_window(1, 2, 39, 50, true);  // sample 0 (cursor 5 + offset 3): near-whole, flipped
  const std::vector<float> norm = {0.4f, 0.5f, 0.6f, 0.2f, 0.25f, 0.3f};
  auto grimg = put(*g, rimg);
  auto gwin = put(*g, windows);
  auto gnorm = put(*g, norm);
  for (const int side : {24, 64}) {  // shrinking and enlarging
    const size_t n_out = size_t(rb) * rc * side * side;
    std::vector<float> rout(n_out);
    cpu->resized_crop(rimg.data(), rout.data(), rb, rc, rh, rw, side, side, windows.data(), &ctl, 3, 0, norm.data());
    auto grout = poisoned(*g, n_out);
    g->resized_crop(grimg.data(), grout.data(), rb, rc, rh, rw, side, side, gwin.data(), gctl.data(), 3, 0, gnorm.data());
    EXPECT_EQ(get(*g, grout), rout) << "random windows to " << side;
    const int64_t center = center_window(t, rh, rw);
    cpu->resized_crop(rimg.data(), rout.data(), rb, rc, rh, rw, side, side, nullptr, nullptr, 0, center, nullptr);
    g->resized_crop(grimg.data(), grout.data(), rb, rc, rh, rw, side, side, nullptr, nullptr, 0, center, nullptr);
    EXPECT_EQ(get(*g, grout), rout) << "center window to " << side;
  }
}

// conv_cols times both paths on scratch buffers for a shape (conv_tuning = time) and keeps the
// faster: im2col's columns (rows·cols) or none (cuDNN); the same answer when asked again; a 1x1
// stride-1 convolution is a GEMM without columns; conv_tuning = heuristic never asks for columns.
// Then a forward and backward through whichever path it chose match the CPU.
TEST(CudaConv, ConvColsChoosesAPathByTiming) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend({});
  BackendOptions o;
  o.type = "cuda";
  o.precision = Precision::fp32;
  auto g = make_backend(o);
  o.conv_heuristic = true;
  auto h = make_backend(o);
  for (const ConvGeom& c : {kConvs[0], kConvs[1], kConvs[3], kConvs[5]}) {
    const size_t full = size_t(c.rows()) * c.cols(), got = g->conv_cols(c);
    if (c.k == 1 && c.stride == 1 && c.pad == 0) EXPECT_EQ(got, 0u) << what(c);
    else EXPECT_TRUE(got == 0 || got == full) << what(c) << ": " << got;
    EXPECT_EQ(g->conv_cols(c), got) << what(c);
    EXPECT_EQ(h->conv_cols(c), 0u) << what(c);
    const ConvData d(c, 90);
    const size_t n = size_t(c.rows()) * c.out;
    std::vector<float> cols(full), z(n), a(n);
    cpu->conv_forward(d.x.data(), d.w.data(), d.b.data(), cols.data(), z.data(), a.data(), c, Act::relu);
    auto gx = put(*g, d.x), gw = put(*g, d.w), gb = put(*g, d.b);
    Buffer<float> gcols(*g, got);
    auto gz = poisoned(*g, n);
    g->conv_forward(gx.data(), gw.data(), gb.data(), gcols.data(), gz.data(), gz.data(), c, Act::relu);
    EXPECT_LE(rel_err(get(*g, gz), a), tolerance(Precision::fp32)) << what(c) << (got ? " im2col" : " cuDNN");
    const std::vector<float> da = uniform(n, 91);
    std::vector<float> cda = da, cdw(d.w.size()), cdb(d.b.size()), cdx(d.x.size());
    const std::vector<float> ag = get(*g, gz);
    cpu->conv_backward(d.x.data(), d.w.data(), ag.data(), ag.data(), cda.data(), cols.data(), c, Act::relu,
                       cdw.data(), cdb.data(), cdx.data(), false);
    auto gda = put(*g, da);
    auto gdw = poisoned(*g, cdw.size()), gdb = poisoned(*g, cdb.size()), gdx = poisoned(*g, cdx.size());
    g->conv_backward(gx.data(), gw.data(), gz.data(), gz.data(), gda.data(), gcols.data(), c, Act::relu,
                     gdw.data(), gdb.data(), gdx.data(), false);
    EXPECT_LE(rel_err(get(*g, gdw), cdw), tolerance(Precision::fp32)) << "dw " << what(c);
    EXPECT_LE(rel_err(get(*g, gdx), cdx), tolerance(Precision::fp32)) << "dx " << what(c);
  }
}

// bf16: a convolution without bias or activation whose output only batch norm reads
// (note_bn_input) keeps its bf16 output and never writes the floats; batch norm reads the bf16
// tensor. Against the same backend without the hint (the output widened to floats first): on
// cuDNN the bf16 values are the same, so the sums, batch norm's output and its input gradient
// are the same bits; a 1x1 stride-1 convolution (a GEMM: a bf16 output against an fp32 one,
// every value within half a bf16 ulp) is within a bf16 ulp (2^-8) of it, without the ReLU (whose
// mask would flip where the rounding moves batch norm's output across 0). A later float write
// into the buffer ends it.
TEST(CudaConv, Bf16OutputKeptForBatchNorm) {
  SKIP_WITHOUT_GPU();
  auto g = gpu(Precision::bf16);
  for (const ConvGeom& c : {geom(8, 64, 14, 14, 64, 3, 1, 1), geom(8, 64, 14, 14, 256, 1, 1, 0),
                            geom(4, 3, 32, 32, 64, 7, 2, 3), geom(8, 64, 14, 14, 128, 1, 2, 0)}) {
    const std::string label = what(c);
    const bool gemm = c.k == 1 && c.stride == 1;
    const ConvData d(c, 90 + uint64_t(c.out));
    const size_t n = size_t(c.rows()) * c.out;
    const int64_t rows = c.rows();
    const std::vector<float> w1 = uniform(size_t(c.out), 91, 0.5f, 1.5f), b1 = uniform(size_t(c.out), 92);
    const std::vector<float> dy = uniform(n, 93);
    auto gx = put(*g, d.x), gw = put(*g, d.w), gbw = put(*g, w1), gbb = put(*g, b1);
    auto kept = poisoned(*g, n), plain = poisoned(*g, n);
    g->note_bn_input(kept.data());
    struct Out {
      std::vector<double> sums, bsums;
      std::vector<float> y, dx;
    };
    const bool relu = !gemm;
    auto run = [&](Buffer<float>& z) {
      g->conv_forward(gx.data(), gw.data(), nullptr, nullptr, z.data(), z.data(), c, Act::none);
      auto sums = poisoned_sums(*g, c.out), bsums = poisoned_sums(*g, c.out);
      auto y = poisoned(*g, n), mean = poisoned(*g, size_t(c.out)), inv = poisoned(*g, size_t(c.out));
      g->bn_sums(z.data(), rows, c.out, sums.data());
      g->bn_forward(z.data(), y.data(), rows, c.out, sums.data(), gbw.data(), gbb.data(), 1e-5f, 0.1f, mean.data(),
                    inv.data(), nullptr, nullptr, relu);
      auto d = put(*g, dy);
      const float* mask = relu ? y.data() : nullptr;
      g->bn_backward_sums(d.data(), z.data(), rows, c.out, mean.data(), bsums.data(), mask);
      g->bn_backward(d.data(), z.data(), d.data(), rows, c.out, bsums.data(), mean.data(), inv.data(), gbw.data(),
                     mask);
      return Out{get(*g, sums), get(*g, bsums), get(*g, y), get(*g, d)};
    };
    const Out a = run(kept), b = run(plain);
    if (gemm) {
      EXPECT_LE(rel_err(a.y, b.y), 1.0 / 256) << "y " << label;
      EXPECT_LE(rel_err(a.dx, b.dx), 1.0 / 256) << "dx " << label;
    } else {
      EXPECT_EQ(a.sums, b.sums) << "sums " << label;
      EXPECT_EQ(a.bsums, b.bsums) << "backward sums " << label;
      EXPECT_EQ(a.y, b.y) << "y " << label;
      EXPECT_EQ(a.dx, b.dx) << "dx " << label;
    }
    // The floats of the kept buffer were never written (still the poison), unlike the other's.
    const std::vector<float> kz = get(*g, kept), pz = get(*g, plain);
    EXPECT_TRUE(std::isnan(kz[0]) && std::isnan(kz[n - 1])) << "kept output's floats written, " << label;
    EXPECT_FALSE(std::isnan(pz[0])) << label;
    // A float write ends it: batch norm then reads the floats again.
    const std::vector<float> ones(n, 1.f);
    g->upload(kept.data(), ones.data(), n * sizeof(float));
    auto sums = poisoned_sums(*g, c.out);
    g->bn_sums(kept.data(), rows, c.out, sums.data());
    const std::vector<double> s = get(*g, sums);
    EXPECT_EQ(s[0], double(rows)) << "sums after a float write, " << label;
  }
}

// bf16 gradients between a convolution and batch norm (note_grad_use): batch norm → conv (no
// bias) → batch norm, forward, then backward with the model's hints (the lower batch norm's
// input gradient in bf16 only, the convolution's input gradient kept bf16 for the upper one)
// against the same backend without them (floats between the layers, converted to bf16 for the
// GEMMs and widened after). The convolution sees the same bf16 dz either way (round to nearest
// from the same floats), so its weight gradient is the same bits; cuDNN's bf16 input gradient
// read as it is gives what its widened copy gives: the same bits to the end. A 1x1 GEMM's input
// gradient written in bf16 (D in bf16) instead of fp32 is within its rounding of the other.
TEST(CudaConv, Bf16GradientsKeptBetweenConvAndBatchNorm) {
  SKIP_WITHOUT_GPU();
  auto g = gpu_with_hints(Precision::bf16);
  for (const ConvGeom& c : {geom(8, 64, 14, 14, 64, 3, 1, 1), geom(8, 64, 14, 14, 256, 1, 1, 0),
                            geom(8, 64, 14, 14, 128, 3, 2, 1)}) {
    const std::string label = what(c);
    const bool gemm = c.k == 1 && c.stride == 1;
    const ConvData d(c, 120 + uint64_t(c.out));
    const int64_t rin = int64_t(c.batch) * c.h * c.w, rout = c.rows();
    const size_t nin = size_t(rin) * c.c, nout = size_t(rout) * c.out;
    auto gx = put(*g, d.x), gw = put(*g, d.w);
    auto wa = put(*g, uniform(size_t(c.c), 121, 0.5f, 1.5f)), ba = put(*g, uniform(size_t(c.c), 122));
    auto wb = put(*g, uniform(size_t(c.out), 123, 0.5f, 1.5f)), bb = put(*g, uniform(size_t(c.out), 124));
    const std::vector<float> dy = uniform(nout, 125);
    auto ya = poisoned(*g, nin), z = poisoned(*g, nout), yb = poisoned(*g, nout);
    auto ma = poisoned(*g, size_t(c.c)), ia = poisoned(*g, size_t(c.c));
    auto mb = poisoned(*g, size_t(c.out)), ib = poisoned(*g, size_t(c.out));
    auto sa = poisoned_sums(*g, c.c), sb = poisoned_sums(*g, c.out);
    g->note_bn_input(z.data());
    g->bn_sums(gx.data(), rin, c.c, sa.data());
    g->bn_forward(gx.data(), ya.data(), rin, c.c, sa.data(), wa.data(), ba.data(), 1e-5f, 0.1f, ma.data(), ia.data(),
                  nullptr, nullptr, true);
    g->conv_forward(ya.data(), gw.data(), nullptr, nullptr, z.data(), z.data(), c, Act::none);
    g->bn_sums(z.data(), rout, c.out, sb.data());
    g->bn_forward(z.data(), yb.data(), rout, c.out, sb.data(), wb.data(), bb.data(), 1e-5f, 0.1f, mb.data(), ib.data(),
                  nullptr, nullptr, false);
    struct Out {
      std::vector<double> bsb, bsa;
      std::vector<float> dwb, dbb, dw, dwa, dba, dx;
    };
    auto run = [&](bool hints) {
      auto d1 = put(*g, dy), d2 = poisoned(*g, nin), dw = poisoned(*g, d.w.size()), db = poisoned(*g, size_t(c.out));
      auto dwb = poisoned(*g, size_t(c.out)), dbb = poisoned(*g, size_t(c.out));
      auto dwa = poisoned(*g, size_t(c.c)), dba = poisoned(*g, size_t(c.c));
      auto bsb = poisoned_sums(*g, c.out), bsa = poisoned_sums(*g, c.c);
      g->bn_backward_sums(d1.data(), z.data(), rout, c.out, mb.data(), bsb.data(), nullptr);
      g->bn_param_grads(bsb.data(), ib.data(), c.out, dwb.data(), dbb.data(), false);
      if (hints) g->note_grad_use(d1.data(), Backend::GradUse::conv);
      g->bn_backward(d1.data(), z.data(), d1.data(), rout, c.out, bsb.data(), mb.data(), ib.data(), wb.data(), nullptr);
      if (hints) g->note_grad_use(d2.data(), Backend::GradUse::bn);
      g->conv_backward(ya.data(), gw.data(), z.data(), z.data(), d1.data(), nullptr, c, Act::none, dw.data(),
                       db.data(), d2.data(), false);
      bn_backward_pass(*g, d2.data(), gx.data(), rin, c.c, ma.data(), ia.data(), wa.data(), ya.data(), bsa.data(),
                       dwa.data(), dba.data());
      if (hints) {  // the hinted gradients' floats were never written
        EXPECT_TRUE(std::isnan(get(*g, db)[0])) << "bias gradient written, " << label;
      }
      return Out{get(*g, bsb), get(*g, bsa), get(*g, dwb), get(*g, dbb), get(*g, dw),
                 get(*g, dwa), get(*g, dba), get(*g, d2)};
    };
    const Out a = run(false), b = run(true), a2 = run(false);
    EXPECT_EQ(a.dx, a2.dx) << "the plain path twice " << label;
    EXPECT_EQ(b.bsb, a.bsb) << label;
    EXPECT_EQ(b.dwb, a.dwb) << label;
    EXPECT_EQ(b.dbb, a.dbb) << label;
    EXPECT_EQ(b.dw, a.dw) << "conv dw " << label;
    if (gemm) {
      EXPECT_LE(rel_err(b.dx, a.dx), 1.0 / 128) << "dx " << label;
      EXPECT_LE(rel_err(b.dwa, a.dwa), 1.0 / 128) << "dw of the lower bn " << label;
      EXPECT_LE(rel_err(b.dba, a.dba), 1.0 / 128) << "db of the lower bn " << label;
    } else {
      EXPECT_EQ(b.bsa, a.bsa) << "lower bn's sums " << label;
      EXPECT_EQ(b.dwa, a.dwa) << label;
      EXPECT_EQ(b.dba, a.dba) << label;
      EXPECT_EQ(b.dx, a.dx) << "dx " << label;
    }
  }
}

// A ReLU-fused batch norm's output that only the convolution above reads (note_bf16_readers):
// batch norm writes its bf16 copy only. The convolution takes that copy as its operand either
// way (written in the same pass as the floats, when the floats are written) and the ReLU's
// backward reads its mask from it: the convolution's output, its weight and input gradients
// and batch norm's backward are the same bits as with the floats written, which never are.
TEST(CudaConv, Bf16OnlyBatchNormOutputForTheConvolutionAbove) {
  SKIP_WITHOUT_GPU();
  auto g = gpu_with_hints(Precision::bf16);
  for (const ConvGeom& c : {geom(8, 64, 14, 14, 64, 3, 1, 1), geom(8, 64, 14, 14, 256, 1, 1, 0),
                            geom(8, 64, 14, 14, 128, 3, 2, 1), geom(4, 12, 9, 9, 16, 3, 1, 1)}) {
    const std::string label = what(c);
    const ConvData d(c, 130 + uint64_t(c.out));
    const int64_t rin = int64_t(c.batch) * c.h * c.w;
    const size_t nin = size_t(rin) * c.c, nout = size_t(c.rows()) * c.out;
    auto gx = put(*g, d.x), gw = put(*g, d.w);
    auto wa = put(*g, uniform(size_t(c.c), 131, 0.5f, 1.5f)), ba = put(*g, uniform(size_t(c.c), 132));
    const std::vector<float> dy = uniform(nout, 133);
    auto kept = poisoned(*g, nin), plain = poisoned(*g, nin);
    g->note_bf16_readers(kept.data());
    struct Out {
      std::vector<double> sums, bsums;
      std::vector<float> z, dw, db, dwa, dba, dx;
    };
    auto run = [&](Buffer<float>& ya) {
      auto sa = poisoned_sums(*g, c.c), bsa = poisoned_sums(*g, c.c);
      auto ma = poisoned(*g, size_t(c.c)), ia = poisoned(*g, size_t(c.c));
      auto z = poisoned(*g, nout), d1 = put(*g, dy), d2 = poisoned(*g, nin);
      auto dw = poisoned(*g, d.w.size()), db = poisoned(*g, size_t(c.out));
      auto dwa = poisoned(*g, size_t(c.c)), dba = poisoned(*g, size_t(c.c));
      g->bn_sums(gx.data(), rin, c.c, sa.data());
      g->bn_forward(gx.data(), ya.data(), rin, c.c, sa.data(), wa.data(), ba.data(), 1e-5f, 0.1f, ma.data(),
                    ia.data(), nullptr, nullptr, true);
      g->conv_forward(ya.data(), gw.data(), nullptr, nullptr, z.data(), z.data(), c, Act::none);
      g->conv_backward(ya.data(), gw.data(), z.data(), z.data(), d1.data(), nullptr, c, Act::none, dw.data(),
                       db.data(), d2.data(), false);
      bn_backward_pass(*g, d2.data(), gx.data(), rin, c.c, ma.data(), ia.data(), wa.data(), ya.data(), bsa.data(),
                       dwa.data(), dba.data());
      return Out{get(*g, sa), get(*g, bsa), get(*g, z), get(*g, dw), get(*g, db),
                 get(*g, dwa), get(*g, dba), get(*g, d2)};
    };
    const Out a = run(plain), b = run(kept);
    EXPECT_EQ(b.sums, a.sums) << label;
    EXPECT_EQ(b.z, a.z) << "conv output " << label;
    EXPECT_EQ(b.dw, a.dw) << "conv dw " << label;
    EXPECT_EQ(b.db, a.db) << "conv db " << label;
    EXPECT_EQ(b.bsums, a.bsums) << "bn backward sums " << label;
    EXPECT_EQ(b.dwa, a.dwa) << label;
    EXPECT_EQ(b.dba, a.dba) << label;
    EXPECT_EQ(b.dx, a.dx) << "dx " << label;
    const std::vector<float> ky = get(*g, kept), py = get(*g, plain);
    EXPECT_TRUE(std::isnan(ky[0]) && std::isnan(ky[nin - 1])) << "kept output's floats written, " << label;
    EXPECT_FALSE(std::isnan(py[0]) || std::isnan(py[nin - 1])) << label;
    // A reader of floats (im2col's columns) gets them widened from the copy, the same values.
    auto cols = poisoned(*g, size_t(c.rows()) * size_t(c.cols()));
    auto zk = poisoned(*g, nout), zp = poisoned(*g, nout);
    g->conv_forward(kept.data(), gw.data(), nullptr, cols.data(), zk.data(), zk.data(), c, Act::none);
    g->conv_forward(plain.data(), gw.data(), nullptr, cols.data(), zp.data(), zp.data(), c, Act::none);
    EXPECT_EQ(get(*g, zk), get(*g, zp)) << "im2col from the kept output " << label;
    EXPECT_EQ(get(*g, kept), bf16_round(py)) << "widened floats " << label;
  }
}

// Two convolutions, the lower with a bias and a fused ReLU (its output over z, as the model
// runs it), under bf16 with the model's hints
// (the lower's output in bf16 only: note_bf16_readers; the upper's input gradient kept in bf16
// for the lower's ReLU backward: GradUse::act) against the same backend without them (the
// lower's output in floats, converted for the upper; the upper's cuDNN bf16 input gradient
// widened, then masked by the ReLU). Every operand the GEMMs see is the same bf16 either way:
// the same bits for the outputs and the weight and input gradients; the lower's bias gradient
// adds the same values (to within the order of the sums). cuDNN's paths (cudnn_with_hints): the
// 3-channel lower convolution would otherwise run as columns and GEMMs whose hinted form rounds
// once where the unhinted form rounds twice.
TEST(CudaConv, Bf16BetweenConvolutionsWithReLU) {
  SKIP_WITHOUT_GPU();
  auto g = cudnn_with_hints();
  struct Pair {
    ConvGeom lo, up;
  };
  for (const Pair& pr : {Pair{geom(8, 16, 14, 14, 64, 3, 1, 1), geom(8, 64, 14, 14, 32, 3, 1, 1)},
                         Pair{geom(4, 3, 9, 9, 12, 3, 1, 1), geom(4, 12, 9, 9, 8, 3, 2, 1)}}) {
    const ConvGeom &lo = pr.lo, &up = pr.up;
    const std::string label = what(lo) + " then " + what(up);
    const ConvData dl(lo, 140 + uint64_t(lo.out)), du(up, 141 + uint64_t(up.out));
    const size_t n1 = size_t(lo.rows()) * lo.out, n2 = size_t(up.rows()) * up.out;
    auto gx = put(*g, dl.x), w1 = put(*g, dl.w), b1 = put(*g, dl.b), w2 = put(*g, du.w), b2 = put(*g, du.b);
    const std::vector<float> dy = uniform(n2, 142);
    auto kept = poisoned(*g, n1), plain = poisoned(*g, n1);
    g->note_bf16_readers(kept.data());
    struct Out {
      std::vector<float> y, dw2, db2, dw1, db1, dx;
    };
    auto run = [&](Buffer<float>& a1, bool hints) {
      auto z2 = poisoned(*g, n2), d2 = put(*g, dy), d1 = poisoned(*g, n1);
      auto dw2 = poisoned(*g, du.w.size()), db2 = poisoned(*g, du.b.size());
      auto dw1 = poisoned(*g, dl.w.size()), db1 = poisoned(*g, dl.b.size()), dx = poisoned(*g, dl.x.size());
      g->conv_forward(gx.data(), w1.data(), b1.data(), nullptr, a1.data(), a1.data(), lo, Act::relu);
      g->conv_forward(a1.data(), w2.data(), b2.data(), nullptr, z2.data(), z2.data(), up, Act::none);
      if (hints) g->note_grad_use(d1.data(), Backend::GradUse::act);
      g->conv_backward(a1.data(), w2.data(), z2.data(), z2.data(), d2.data(), nullptr, up, Act::none, dw2.data(),
                       db2.data(), d1.data(), false);
      if (hints) EXPECT_TRUE(std::isnan(get(*g, d1)[0])) << "kept input gradient's floats written, " << label;
      g->conv_backward(gx.data(), w1.data(), a1.data(), a1.data(), d1.data(), nullptr, lo, Act::relu, dw1.data(),
                       db1.data(), dx.data(), false);
      return Out{get(*g, z2), get(*g, dw2), get(*g, db2), get(*g, dw1), get(*g, db1), get(*g, dx)};
    };
    const Out a = run(plain, false), b = run(kept, true);
    EXPECT_EQ(b.y, a.y) << "upper output " << label;
    EXPECT_EQ(b.dw2, a.dw2) << label;
    EXPECT_EQ(b.db2, a.db2) << label;
    EXPECT_EQ(b.dw1, a.dw1) << "lower dw " << label;
    EXPECT_LE(rel_err(b.db1, a.db1), 1e-6) << "lower db " << label;
    EXPECT_EQ(b.dx, a.dx) << "dx " << label;
    EXPECT_TRUE(std::isnan(get(*g, kept)[0]) && std::isnan(get(*g, kept)[n1 - 1])) << "kept output's floats written, " << label;
    EXPECT_FALSE(std::isnan(get(*g, plain)[0])) << label;
  }
}

// A convolution with a bias and a fused ReLU, max pooling (2x2, no padding), a convolution: under
// bf16 with the model's hints (the lower's ReLU output and the pooled output in bf16 only:
// note_bf16_readers; the upper's input gradient kept in bf16 for the pooling: GradUse::pool; the
// pooling's input gradient in bf16 only for the lower's ReLU backward: GradUse::act) against the
// same backend without them. Max pooling of the bf16 values picks the CPU's argmax over the
// lower's float output rounded to bf16; the pooled values, so the upper's output and weight
// gradient, are the same bits either way (rounding to bf16 keeps the order of values). Where two
// values of a window round to the same bf16, the hinted pooling picks the first, so the
// backward pass is compared against the unhinted one routed by the hinted argmax: the same bits
// for the lower's weight and input gradients, its bias gradient to within the order of the sums.
// With note_relu_pool too (the lower's output kept before bias and ReLU, which the pooling
// applies forward and backward): every output and gradient the same bits as with the hints alone.
// cuDNN's paths (cudnn_with_hints), as in Bf16BetweenConvolutionsWithReLU.
TEST(CudaConv, Bf16PoolingBetweenConvolutions) {
  SKIP_WITHOUT_GPU();
  auto g = cudnn_with_hints();
  auto cpu = make_cpu_backend({});
  struct Case {
    ConvGeom lo, up;
  };
  for (const Case& cs : {Case{geom(8, 16, 16, 16, 64, 3, 1, 1), geom(8, 64, 8, 8, 32, 3, 1, 1)},
                         Case{geom(4, 3, 10, 10, 12, 3, 1, 1), geom(4, 12, 5, 5, 8, 3, 1, 1)}}) {
    const ConvGeom &lo = cs.lo, &up = cs.up;
    const std::string label = what(lo) + " pooled, then " + what(up);
    PoolGeom pg;
    pg.batch = lo.batch; pg.c = lo.out; pg.h = lo.oh(); pg.w = lo.ow(); pg.k = 2; pg.stride = 2;
    ASSERT_EQ(pg.oh(), up.h);
    const ConvData dl(lo, 150 + uint64_t(lo.out)), du(up, 151 + uint64_t(up.out));
    const size_t n1 = size_t(lo.rows()) * lo.out, np = size_t(pg.batch) * pg.oh() * pg.ow() * pg.c;
    const size_t n2 = size_t(up.rows()) * up.out;
    auto gx = put(*g, dl.x), w1 = put(*g, dl.w), b1 = put(*g, dl.b), w2 = put(*g, du.w), b2 = put(*g, du.b);
    const std::vector<float> dy = uniform(n2, 152);
    auto a_kept = poisoned(*g, n1), a_plain = poisoned(*g, n1), p_kept = poisoned(*g, np), p_plain = poisoned(*g, np);
    g->note_bf16_readers(a_kept.data());
    g->note_bf16_readers(p_kept.data());
    auto arg_kept = put(*g, std::vector<uint8_t>(np, 0xf9)), arg_plain = put(*g, std::vector<uint8_t>(np, 0xf9));
    auto a_fused = poisoned(*g, n1), p_fused = poisoned(*g, np);
    auto arg_fused = put(*g, std::vector<uint8_t>(np, 0xf9));
    g->note_bf16_readers(a_fused.data());
    g->note_bf16_readers(p_fused.data());
    g->note_relu_pool(a_fused.data(), arg_fused.data());
    struct Out {
      std::vector<float> y, dw2, db2, dw1, db1, dx;
    };
    // The backward pass routes through `route` (an argmax), hinted or not.
    auto run = [&](Buffer<float>& a1, Buffer<float>& p, Buffer<uint8_t>& arg, const Buffer<uint8_t>& route,
                   bool hints) {
      auto z2 = poisoned(*g, n2), d2 = put(*g, dy), dp = poisoned(*g, np), d1 = poisoned(*g, n1);
      auto dw2 = poisoned(*g, du.w.size()), db2 = poisoned(*g, du.b.size());
      auto dw1 = poisoned(*g, dl.w.size()), db1 = poisoned(*g, dl.b.size()), dx = poisoned(*g, dl.x.size());
      g->conv_forward(gx.data(), w1.data(), b1.data(), nullptr, a1.data(), a1.data(), lo, Act::relu);
      g->pool_forward(a1.data(), p.data(), arg.data(), pg, true);
      g->conv_forward(p.data(), w2.data(), b2.data(), nullptr, z2.data(), z2.data(), up, Act::none);
      if (hints) g->note_grad_use(dp.data(), Backend::GradUse::pool);
      g->conv_backward(p.data(), w2.data(), z2.data(), z2.data(), d2.data(), nullptr, up, Act::none, dw2.data(),
                       db2.data(), dp.data(), false);
      if (hints) g->note_grad_use(d1.data(), Backend::GradUse::act);
      g->pool_backward(dp.data(), route.data(), d1.data(), pg, true);
      if (hints) {
        EXPECT_TRUE(std::isnan(get(*g, dp)[0])) << "kept pooled gradient's floats written, " << label;
        EXPECT_TRUE(std::isnan(get(*g, d1)[0])) << "kept pooling input gradient's floats written, " << label;
      }
      g->conv_backward(gx.data(), w1.data(), a1.data(), a1.data(), d1.data(), nullptr, lo, Act::relu, dw1.data(),
                       db1.data(), dx.data(), false);
      return Out{get(*g, z2), get(*g, dw2), get(*g, db2), get(*g, dw1), get(*g, db1), get(*g, dx)};
    };
    const Out b = run(a_kept, p_kept, arg_kept, arg_kept, true);
    const Out a = run(a_plain, p_plain, arg_plain, arg_kept, false);
    const Out c = run(a_fused, p_fused, arg_fused, arg_fused, true);
    EXPECT_EQ(get(*g, arg_fused), get(*g, arg_kept)) << "argmax, ReLU in the pooling, " << label;
    EXPECT_EQ(c.y, b.y) << "upper output, ReLU in the pooling, " << label;
    EXPECT_EQ(c.dw2, b.dw2) << "ReLU in the pooling, " << label;
    EXPECT_EQ(c.dw1, b.dw1) << "lower dw, ReLU in the pooling, " << label;
    EXPECT_EQ(c.db1, b.db1) << "lower db, ReLU in the pooling, " << label;
    EXPECT_EQ(c.dx, b.dx) << "dx, ReLU in the pooling, " << label;
    EXPECT_TRUE(std::isnan(get(*g, a_fused)[0]) && std::isnan(get(*g, a_fused)[n1 - 1]))
        << "ReLU output's floats written, ReLU in the pooling, " << label;

    // The hinted argmax: the CPU's over the lower's float output rounded to bf16.
    const std::vector<float> a16 = bf16_round(get(*g, a_plain));
    std::vector<float> want_p(np);
    std::vector<uint8_t> want_arg(np);
    cpu->pool_forward(a16.data(), want_p.data(), want_arg.data(), pg, true);
    EXPECT_EQ(get(*g, arg_kept), want_arg) << "argmax over the bf16 values, " << label;
    EXPECT_EQ(b.y, a.y) << "upper output " << label;
    EXPECT_EQ(b.dw2, a.dw2) << label;
    EXPECT_EQ(b.db2, a.db2) << label;
    EXPECT_EQ(b.dw1, a.dw1) << "lower dw " << label;
    EXPECT_LE(rel_err(b.db1, a.db1), 1e-6) << "lower db " << label;
    EXPECT_EQ(b.dx, a.dx) << "dx " << label;
    EXPECT_TRUE(std::isnan(get(*g, a_kept)[0]) && std::isnan(get(*g, a_kept)[n1 - 1]))
        << "kept ReLU output's floats written, " << label;
    EXPECT_TRUE(std::isnan(get(*g, p_kept)[0]) && std::isnan(get(*g, p_kept)[np - 1]))
        << "kept pooled output's floats written, " << label;
    EXPECT_FALSE(std::isnan(get(*g, p_plain)[0])) << label;
  }
}

// note_relu_pool's hint ends with its buffers (as every hint does, Backend's free): a later
// buffer at the same address (the next Trainer's model, as bench-step builds them one after the
// other on one backend) is an ordinary ReLU output that a convolution reads. Before, the stale
// hint kept that output before bias and ReLU, and the convolution above refused to read it.
TEST(CudaConv, ReluPoolHintEndsWithItsBuffers) {
  SKIP_WITHOUT_GPU();
  auto g = gpu_with_hints(Precision::bf16);
  const ConvGeom lo = geom(4, 8, 8, 8, 16, 3, 1, 1), up = geom(4, 16, 8, 8, 8, 3, 1, 1);
  const ConvData dl(lo, 160), du(up, 161);
  const size_t n1 = size_t(lo.rows()) * lo.out, n2 = size_t(up.rows()) * up.out;
  auto gx = put(*g, dl.x), w1 = put(*g, dl.w), b1 = put(*g, dl.b), w2 = put(*g, du.w), b2 = put(*g, du.b);
  const float* old_a = nullptr;
  {
    auto a = poisoned(*g, n1);
    auto arg = put(*g, std::vector<uint8_t>(n1 / 4, 0xf9));
    g->note_relu_pool(a.data(), arg.data());
    old_a = a.data();
  }
  auto a = poisoned(*g, n1);  // most often at old_a again
  auto z2 = poisoned(*g, n2);
  g->conv_forward(gx.data(), w1.data(), b1.data(), nullptr, a.data(), a.data(), lo, Act::relu);
  EXPECT_NO_THROW(g->conv_forward(a.data(), w2.data(), b2.data(), nullptr, z2.data(), z2.data(), up, Act::none))
      << (a.data() == old_a ? "at the freed buffer's address" : "at another address");
  EXPECT_FALSE(std::isnan(get(*g, a)[0])) << "the ReLU output's floats";
  std::printf("ReluPoolHintEndsWithItsBuffers: the new buffer %s the freed one's address\n",
              a.data() == old_a ? "took" : "did not take");
}
