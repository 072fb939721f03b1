#include "dpt/augment.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <tuple>

#include "dpt/check.hpp"
#include "dpt/data.hpp"

namespace dpt {

AugmentSpec parse_augment(const std::string& augment, int crop_padding) {
  AugmentSpec s;
  // random_resized_crop's window and flip are ImageTransform's (below), not this op's.
  if (augment == "random_resized_crop" || augment == "random_resized_crop,flip") return s;
  if (augment == "crop" || augment == "crop,flip") s.crop = true;
  if (augment == "flip" || augment == "crop,flip") s.flip = true;
  if (!s.any() && augment != "none")
    throw InputError("data.augment = '" + augment + "': expected none | flip | crop | crop,flip | random_resized_crop | random_resized_crop,flip");
  if (crop_padding < 0 || crop_padding > 64)
    throw InputError("data.crop_padding = " + std::to_string(crop_padding) + ": must be in [0, 64]");
  s.pad = crop_padding;
  return s;
}

int32_t augment_draw(const AugmentSpec& spec, uint64_t seed, int64_t epoch, int64_t row) {
  // Three SplitMix64 steps mix seed, epoch and row into the stream's start, so neighbouring
  // rows and epochs draw unrelated values.
  uint64_t k = SplitMix64(seed ^ 0x6A09E667F3BCC909ull).next();
  k = SplitMix64(k ^ uint64_t(epoch)).next();
  SplitMix64 g(k ^ uint64_t(row));
  const bool flip = spec.flip && (g.next() >> 63) != 0;
  int dy = spec.pad, dx = spec.pad;
  if (spec.crop) {
    dy = int(g.below(uint64_t(2 * spec.pad + 1)));
    dx = int(g.below(uint64_t(2 * spec.pad + 1)));
  }
  return pack_draw(flip, dy, dx);
}

std::vector<int32_t> augment_draws(const AugmentSpec& spec, uint64_t seed, int64_t epoch,
                                   const std::vector<int64_t>& rows) {
  std::vector<int32_t> d(rows.size());
  for (size_t p = 0; p < rows.size(); ++p) d[p] = augment_draw(spec, seed, epoch, rows[p]);
  return d;
}

void augment_image(const float* in, float* out, int c, int h, int w, int pad, int32_t draw) {
  const bool flip = draw_flip(draw);
  const int oy = draw_dy(draw) - pad, ox = draw_dx(draw) - pad;  // window origin in the image
  for (int ch = 0; ch < c; ++ch)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        const int sy = y + oy, sx = (flip ? w - 1 - x : x) + ox;
        out[(size_t(ch) * h + y) * w + x] =
            sy >= 0 && sy < h && sx >= 0 && sx < w ? in[(size_t(ch) * h + sy) * w + sx] : 0.f;
      }
}

namespace {

std::vector<double> parse_numbers(const std::string& key, const std::string& text) {
  std::vector<double> v;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const char* b = item.c_str();
    char* e = nullptr;
    const double x = std::strtod(b, &e);
    while (e && (*e == ' ' || *e == '\t')) ++e;
    if (item.empty() || e == b || *e != '\0' || !std::isfinite(x))
      throw InputError(key + " = '" + text + "': '" + item + "' is not a number (a comma-separated list)");
    v.push_back(x);
  }
  return v;
}

std::pair<double, double> parse_range(const std::string& key, const std::string& text, double lo, double hi) {
  const std::vector<double> v = parse_numbers(key, text);
  if (v.size() != 2 || !(v[0] > lo) || !(v[1] <= hi) || !(v[0] <= v[1]))
    throw InputError(key + " = '" + text + "': expected two numbers a,b with " + std::to_string(lo).substr(0, 4) +
                     " < a <= b" + (std::isinf(hi) ? "" : " <= " + std::to_string(hi).substr(0, 4)));
  return {v[0], v[1]};
}

// Python's round(): halves to even (the default rounding mode).
int round_half_even(double x) { return int(std::nearbyint(x)); }

}  // namespace

ImageTransform parse_transform(const std::string& augment, int crop_size, const std::string& crop_scale,
                               const std::string& crop_ratio, double eval_crop_ratio,
                               const std::string& mean, const std::string& std) {
  ImageTransform t;
  t.random_crop = augment.rfind("random_resized_crop", 0) == 0;
  t.flip = augment == "random_resized_crop,flip";
  if (crop_size < 0 || crop_size > 4096)
    throw InputError("data.crop_size = " + std::to_string(crop_size) + ": must be in [1, 4096] (0: the stored size)");
  t.size = crop_size;
  std::tie(t.scale_lo, t.scale_hi) = parse_range("data.crop_scale", crop_scale, 0.0, 1.0);
  std::tie(t.ratio_lo, t.ratio_hi) = parse_range("data.crop_ratio", crop_ratio, 0.0, HUGE_VAL);
  if (!(eval_crop_ratio > 0 && eval_crop_ratio <= 1))
    throw InputError("data.eval_crop_ratio = " + std::to_string(eval_crop_ratio) + ": must be in (0, 1] (0.875: 224 of 256)");
  t.eval_ratio = eval_crop_ratio;
  for (const double x : parse_numbers("data.mean", mean)) t.mean.push_back(float(x));
  for (const double x : parse_numbers("data.std", std)) {
    if (!(x > 0)) throw InputError("data.std = '" + std + "': every value must be > 0");
    t.std.push_back(float(x));
  }
  if (t.mean.empty() != t.std.empty() || (!t.mean.empty() && t.mean.size() != t.std.size()))
    throw InputError("data.mean = '" + mean + "' and data.std = '" + std +
                     "': give both, one value per channel (e.g. 0.485,0.456,0.406 and 0.229,0.224,0.225)");
  return t;
}

int64_t window_draw(const ImageTransform& t, int h, int w, uint64_t seed, int64_t epoch, int64_t row) {
  // Its own stream (another salt than augment_draw's) from (seed, epoch, row).
  uint64_t k = SplitMix64(seed ^ 0xBB67AE8584CAA73Bull).next();
  k = SplitMix64(k ^ uint64_t(epoch)).next();
  SplitMix64 g(k ^ uint64_t(row));
  const double area = double(h) * double(w);
  const double lr0 = std::log(t.ratio_lo), lr1 = std::log(t.ratio_hi);
  int top = 0, left = 0, ch = h, cw = w;
  bool found = false;
  for (int attempt = 0; attempt < 10 && !found; ++attempt) {
    const double target = area * (t.scale_lo + (t.scale_hi - t.scale_lo) * g.uniform());
    const double aspect = std::exp(lr0 + (lr1 - lr0) * g.uniform());
    const int ww = round_half_even(std::sqrt(target * aspect));
    const int hh = round_half_even(std::sqrt(target / aspect));
    if (ww > 0 && ww <= w && hh > 0 && hh <= h) {
      top = int(g.below(uint64_t(h - hh + 1)));
      left = int(g.below(uint64_t(w - ww + 1)));
      ch = hh;
      cw = ww;
      found = true;
    }
  }
  if (!found) {  // torchvision's fallback: the central crop, clamped to the ratio range
    const double in_ratio = double(w) / double(h);
    if (in_ratio < t.ratio_lo) {
      cw = w;
      ch = round_half_even(cw / t.ratio_lo);
    } else if (in_ratio > t.ratio_hi) {
      ch = h;
      cw = round_half_even(ch * t.ratio_hi);
    }
    top = (h - ch) / 2;
    left = (w - cw) / 2;
  }
  const bool flip = t.flip && (g.next() >> 63) != 0;
  return pack_window(top, left, ch, cw, flip);
}

std::vector<int64_t> window_draws(const ImageTransform& t, int h, int w, uint64_t seed, int64_t epoch,
                                  const std::vector<int64_t>& rows) {
  std::vector<int64_t> d(rows.size());
  for (size_t p = 0; p < rows.size(); ++p) d[p] = window_draw(t, h, w, seed, epoch, rows[p]);
  return d;
}

int64_t center_window(const ImageTransform& t, int h, int w) {
  if (t.size == 0) return pack_window(0, 0, h, w, false);
  const int side = std::max(1, round_half_even(t.eval_ratio * std::min(h, w)));
  // CenterCrop's offsets: int(round((h - side) / 2.0)).
  return pack_window(round_half_even((h - side) / 2.0), round_half_even((w - side) / 2.0), side, side, false);
}

// PyTorch's _compute_indices_min_size_weights_aa for the bilinear filter: the support widens by
// the scale when shrinking (antialiasing); taps start at trunc(center - support + 0.5).
int resize_taps(int in, int out, int o, int* first, float* wt, int max_taps) {
  const float scale = float(in) / float(out);
  const float support = scale >= 1.f ? scale : 1.f;
  const float invscale = scale >= 1.f ? 1.f / scale : 1.f;
  const float center = scale * (float(o) + 0.5f);
  const int lo = std::max(int(center - support + 0.5f), 0);
  const int n = std::min(std::min(int(center + support + 0.5f), in) - lo, max_taps);
  float total = 0.f;
  for (int j = 0; j < n; ++j) {
    const float x = (float(j + lo) - center + 0.5f) * invscale;
    wt[j] = std::max(0.f, 1.f - std::fabs(x));
    total += wt[j];
  }
  if (total != 0.f)
    for (int j = 0; j < n; ++j) wt[j] /= total;
  *first = lo;
  return n;
}

int resize_max_taps(int in, int out) {
  const double scale = double(in) / double(out);
  return int(std::ceil(scale >= 1 ? scale : 1.0)) * 2 + 1;
}

void resized_crop_image(const float* in, float* out, int c, int h, int w, int oh, int ow, int64_t window,
                        const float* mean, const float* std) {
  const Window win = unpack_window(window);
  const int ky = resize_max_taps(win.h, oh), kx = resize_max_taps(win.w, ow);
  std::vector<float> wy(static_cast<size_t>(ky));
  std::vector<int> x0(static_cast<size_t>(ow)), nx(static_cast<size_t>(ow));
  std::vector<float> wxs(static_cast<size_t>(ow) * static_cast<size_t>(kx));
  for (int x = 0; x < ow; ++x) nx[size_t(x)] = resize_taps(win.w, ow, x, &x0[size_t(x)], &wxs[size_t(x) * kx], kx);
  for (int y = 0; y < oh; ++y) {
    int y0 = 0;
    const int ny = resize_taps(win.h, oh, y, &y0, wy.data(), ky);
    for (int x = 0; x < ow; ++x) {
      const int ox = win.flip ? ow - 1 - x : x;  // the flip after the resize: column ox's value
      const float* wxx = &wxs[size_t(ox) * kx];
      for (int ch = 0; ch < c; ++ch) {
        const float* plane = in + (size_t(ch) * h + win.top) * w + win.left;
        float v = 0.f;
        for (int a = 0; a < ny; ++a) {
          const float* row = plane + size_t(y0 + a) * w + x0[size_t(ox)];
          float r = 0.f;
          for (int b = 0; b < nx[size_t(ox)]; ++b) r += wxx[b] * row[b];
          v += wy[size_t(a)] * r;
        }
        if (mean) v = (v - mean[ch]) / std[ch];
        out[(size_t(ch) * oh + y) * ow + x] = v;
      }
    }
  }
}

}  // namespace dpt
