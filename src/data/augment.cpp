#include "dpt/augment.hpp"

#include "dpt/check.hpp"
#include "dpt/data.hpp"

namespace dpt {

AugmentSpec parse_augment(const std::string& augment, int crop_padding) {
  AugmentSpec s;
  if (augment == "crop" || augment == "crop,flip") s.crop = true;
  if (augment == "flip" || augment == "crop,flip") s.flip = true;
  if (!s.any() && augment != "none")
    throw InputError("data.augment = '" + augment + "': expected none | flip | crop | crop,flip");
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

}  // namespace dpt
