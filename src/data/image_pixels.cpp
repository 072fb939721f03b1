// Pixel operations after decoding, written to give PIL's bytes (Pillow 9's Resample.c and
// Convert.c, which torchvision's transforms call on PIL images): the same coefficient formula in
// double, the same 22-bit fixed-point weights and rounding, the same order of passes (horizontal
// over only the rows the vertical pass reads, then vertical).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "image_decode.hpp"

namespace dpt::image {
namespace {

constexpr int kPrecision = 32 - 8 - 2;  // PIL's PRECISION_BITS for 8-bit images

// Per output pixel: the first input pixel, how many, and their fixed-point weights.
struct Coeffs {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> k;  // out × ksize
};

// PIL's precompute_coeffs with the bilinear (triangle) filter, support 1 scaled by the
// downscale factor (the antialiasing), then normalize_coeffs_8bpc.
Coeffs coeffs(int in_size, int out_size) {
  const float in0 = 0.f, in1 = float(in_size);
  const double scale = double(in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  Coeffs c;
  c.ksize = int(std::ceil(support)) * 2 + 1;
  c.first.resize(size_t(out_size));
  c.count.resize(size_t(out_size));
  c.k.assign(size_t(out_size) * size_t(c.ksize), 0);
  std::vector<double> w(size_t(c.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale, ss = 1.0 / filterscale;
    const int xmin = std::max(int(center - support + 0.5), 0);
    const int xmax = std::min(int(center + support + 0.5), in_size) - xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      double t = std::fabs((x + xmin - center + 0.5) * ss);
      w[size_t(x)] = t < 1.0 ? 1.0 - t : 0.0;
      ww += w[size_t(x)];
    }
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? w[size_t(x)] / ww : w[size_t(x)];
      c.k[size_t(xx) * size_t(c.ksize) + size_t(x)] =
          int32_t(v < 0 ? -0.5 + v * (1 << kPrecision) : 0.5 + v * (1 << kPrecision));
    }
    c.first[size_t(xx)] = xmin;
    c.count[size_t(xx)] = xmax;
  }
  return c;
}

inline uint8_t clip8(int32_t v) {
  if (v >= (1 << kPrecision << 8)) return 255;
  if (v <= 0) return 0;
  return uint8_t(v >> kPrecision);
}

// Rows [y0, y0 + out.h) of in, resampled along x.
void horizontal(const Image& in, int y0, const Coeffs& c, Image& out) {
  const int ch = in.c;
  for (int y = 0; y < out.h; ++y) {
    const uint8_t* src = &in.px[size_t(y + y0) * size_t(in.w) * size_t(ch)];
    uint8_t* dst = &out.px[size_t(y) * size_t(out.w) * size_t(ch)];
    for (int xx = 0; xx < out.w; ++xx) {
      const int32_t* k = &c.k[size_t(xx) * size_t(c.ksize)];
      const uint8_t* s = src + size_t(c.first[size_t(xx)]) * size_t(ch);
      for (int b = 0; b < ch; ++b) {
        int32_t acc = 1 << (kPrecision - 1);
        for (int x = 0; x < c.count[size_t(xx)]; ++x) acc += s[size_t(x) * size_t(ch) + size_t(b)] * k[x];
        dst[size_t(xx) * size_t(ch) + size_t(b)] = clip8(acc);
      }
    }
  }
}

// Along y; first[] already shifted to in's rows.
void vertical(const Image& in, const Coeffs& c, const std::vector<int>& first, Image& out) {
  const size_t row = size_t(in.w) * size_t(in.c);
  std::vector<int32_t> acc(row);
  for (int yy = 0; yy < out.h; ++yy) {
    std::fill(acc.begin(), acc.end(), 1 << (kPrecision - 1));
    const int32_t* k = &c.k[size_t(yy) * size_t(c.ksize)];
    for (int y = 0; y < c.count[size_t(yy)]; ++y) {
      const uint8_t* s = &in.px[size_t(first[size_t(yy)] + y) * row];
      const int32_t w = k[y];
      for (size_t i = 0; i < row; ++i) acc[i] += s[i] * w;
    }
    uint8_t* dst = &out.px[size_t(yy) * row];
    for (size_t i = 0; i < row; ++i) dst[i] = clip8(acc[i]);
  }
}

// torchvision's CenterCrop offset: int(round((d - s) / 2.0)), Python's round (half to even).
int crop_offset(int d, int s) {
  const int diff = d - s;
  if (diff % 2 == 0) return diff / 2;
  const int lo = diff / 2;  // (diff / 2.0) is lo + 0.5
  return lo % 2 == 0 ? lo : lo + 1;
}

// One output row of the vertical pass: out[i] = clip8(½ + Σ_t rows[t][i] · k[t]), the sum in
// int32 as PIL's. Built twice, for AVX2 and for any x86-64, and picked when the program loads:
// without SSE4.1 a 32-bit multiply of 4 lanes takes several instructions.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void vertical_row(const uint8_t* const* rows, const int32_t* k, int n, size_t len, uint8_t* out) {
  constexpr size_t kBlock = 512;
  int32_t acc[kBlock];
  for (size_t i0 = 0; i0 < len; i0 += kBlock) {
    const size_t m = std::min(kBlock, len - i0);
    for (size_t i = 0; i < m; ++i) acc[i] = 1 << (kPrecision - 1);
    for (int t = 0; t < n; ++t) {
      const uint8_t* r = rows[t] + i0;
      const int32_t w = k[t];
      for (size_t i = 0; i < m; ++i) acc[i] += r[i] * w;
    }
    for (size_t i = 0; i < m; ++i) {
      const int32_t v = acc[i] >> kPrecision;
      out[i0 + i] = uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
    }
  }
}

// The crop of resize_bilinear(in, w, h) at (left, top), s × s, written channels first: the same
// passes and the same integer arithmetic as resize_bilinear, computed only where the crop reads
// them (a horizontal output pixel depends only on its row's inputs, a vertical one only on its
// column's), so the bytes are the same. 500 × 375 to 256: a quarter of the columns are never
// made. C channels interleaved, fixed at compile time so the taps run in registers.
template <int C>
void crop_resized(const Image& in, int w, int h, int left, int top, int s, uint8_t* out) {
  const bool hpass = w != in.w, vpass = h != in.h;
  const Coeffs cv = vpass ? coeffs(in.h, h) : Coeffs(), chz = hpass ? coeffs(in.w, w) : Coeffs();
  // Input rows the crop needs: the vertical taps of output rows [top, top + s), or those rows.
  const int y0 = vpass ? cv.first[size_t(top)] : top;
  const int y1 = vpass ? cv.first[size_t(top + s - 1)] + cv.count[size_t(top + s - 1)] : top + s;
  const size_t stride = size_t(s) * C;  // bytes per row of the horizontal pass's output
  thread_local std::vector<uint8_t> tmp;
  const uint8_t* rows;  // row y of the (horizontally resized) crop columns: rows + (y - y0) * step
  size_t step;
  if (hpass) {
    tmp.resize(size_t(y1 - y0) * stride);
    const int ks = chz.ksize;
    for (int y = y0; y < y1; ++y) {
      const uint8_t* src = &in.px[size_t(y) * size_t(in.w) * C];
      uint8_t* dst = &tmp[size_t(y - y0) * stride];
      for (int x = 0; x < s; ++x) {
        const size_t xx = size_t(left + x);
        const int32_t* k = &chz.k[xx * size_t(ks)];
        const uint8_t* p = src + size_t(chz.first[xx]) * C;
        const int n = chz.count[xx];
        int32_t acc[C];
        for (int b = 0; b < C; ++b) acc[b] = 1 << (kPrecision - 1);
        for (int t = 0; t < n; ++t, p += C)
          for (int b = 0; b < C; ++b) acc[b] += p[b] * k[t];
        for (int b = 0; b < C; ++b) dst[size_t(x) * C + size_t(b)] = clip8(acc[b]);
      }
    }
    rows = tmp.data();
    step = stride;
  } else {
    rows = &in.px[(size_t(y0) * size_t(in.w) + size_t(left)) * C];
    step = size_t(in.w) * C;
  }
  const size_t plane = size_t(s) * size_t(s);
  thread_local std::vector<uint8_t> line;  // one output row, channels interleaved
  line.resize(stride);
  uint8_t* const ln = line.data();
  thread_local std::vector<const uint8_t*> tap_rows;  // a vertical tap per input row it reads
  tap_rows.resize(size_t(std::max(cv.ksize, 1)));
  const uint8_t** const taps = tap_rows.data();
  for (int y = 0; y < s; ++y) {
    const int yy = top + y;
    const uint8_t* src = rows + size_t(yy - y0) * step;  // no vertical pass: the row itself
    if (vpass) {
      const int n = cv.count[size_t(yy)];
      for (int t = 0; t < n; ++t) taps[t] = rows + size_t(cv.first[size_t(yy)] + t - y0) * step;
      vertical_row(taps, &cv.k[size_t(yy) * size_t(cv.ksize)], n, stride, ln);
      src = ln;
    }
    for (int b = 0; b < C; ++b) {
      uint8_t* dst = out + size_t(b) * plane + size_t(y) * size_t(s);
      for (int x = 0; x < s; ++x) dst[x] = src[size_t(x) * C + size_t(b)];
    }
  }
}

}  // namespace

Image resize_bilinear(const Image& in, int w, int h) {
  if (in.w == w && in.h == h) return in;
  const Coeffs ch = coeffs(in.w, w), cv = coeffs(in.h, h);
  const int y_first = cv.first[0];
  const int y_last = cv.first[size_t(h - 1)] + cv.count[size_t(h - 1)];
  Image tmp;
  const Image* src = &in;
  std::vector<int> first = cv.first;
  if (w != in.w) {
    for (int& f : first) f -= y_first;
    tmp.w = w;
    tmp.h = y_last - y_first;
    tmp.c = in.c;
    tmp.px.resize(size_t(tmp.w) * size_t(tmp.h) * size_t(tmp.c));
    horizontal(in, y_first, ch, tmp);
    src = &tmp;
  }
  if (h == in.h) return tmp;  // PIL skips the vertical pass when the height stays
  Image out;
  out.w = w;
  out.h = h;
  out.c = in.c;
  out.px.resize(size_t(w) * size_t(h) * size_t(in.c));
  vertical(*src, cv, first, out);
  return out;
}

Image to_gray(const Image& in) {
  if (in.c == 1) return in;
  Image out;
  out.w = in.w;
  out.h = in.h;
  out.c = 1;
  out.px.resize(size_t(in.w) * size_t(in.h));
  for (size_t i = 0; i < out.px.size(); ++i) {
    const uint8_t* p = &in.px[i * 3];
    out.px[i] = uint8_t((p[0] * 19595 + p[1] * 38470 + p[2] * 7471 + 0x8000) >> 16);
  }
  return out;
}

Image oriented(const Image& in, int o) {
  if (o < 2 || o > 8) return in;
  const bool swap = o >= 5;
  Image out;
  out.w = swap ? in.h : in.w;
  out.h = swap ? in.w : in.h;
  out.c = in.c;
  out.px.resize(in.px.size());
  const int W = in.w, H = in.h;
  for (int y = 0; y < out.h; ++y)
    for (int x = 0; x < out.w; ++x) {
      int sx = x, sy = y;
      switch (o) {
        case 2: sx = W - 1 - x; break;                   // FLIP_LEFT_RIGHT
        case 3: sx = W - 1 - x; sy = H - 1 - y; break;   // ROTATE_180
        case 4: sy = H - 1 - y; break;                   // FLIP_TOP_BOTTOM
        case 5: sx = y; sy = x; break;                   // TRANSPOSE
        case 6: sx = y; sy = H - 1 - x; break;           // ROTATE_270
        case 7: sx = W - 1 - y; sy = H - 1 - x; break;   // TRANSVERSE
        default: sx = W - 1 - y; sy = x; break;          // 8: ROTATE_90
      }
      std::memcpy(&out.px[(size_t(y) * size_t(out.w) + size_t(x)) * size_t(in.c)],
                  &in.px[(size_t(sy) * size_t(W) + size_t(sx)) * size_t(in.c)], size_t(in.c));
    }
  return out;
}

void resize_crop_chw(const Image& in, int s, uint8_t* out) {
  const bool wide = in.w > in.h;
  const int shorter = wide ? in.h : in.w, longer = wide ? in.w : in.h;
  const int new_long = int(double(int64_t(s) * longer) / shorter);
  const int w = wide ? new_long : s, h = wide ? s : new_long;
  const int top = crop_offset(h, s), left = crop_offset(w, s);
  switch (in.c) {
    case 1: crop_resized<1>(in, w, h, left, top, s, out); break;
    case 3: crop_resized<3>(in, w, h, left, top, s, out); break;
    default: {  // not made by the decoders; the plain way
      const Image r = resize_bilinear(in, w, h);
      for (int ch = 0; ch < r.c; ++ch)
        for (int y = 0; y < s; ++y)
          for (int x = 0; x < s; ++x)
            out[(size_t(ch) * size_t(s) + size_t(y)) * size_t(s) + size_t(x)] =
                r.px[(size_t(y + top) * size_t(r.w) + size_t(x + left)) * size_t(r.c) + size_t(ch)];
    }
  }
}

}  // namespace dpt::image
