// Training-time data augmentation of images (data.augment, data.crop_padding): a random crop of
// the image padded with zeros, then a random horizontal flip, drawn per sample as a pure function
// of (seed, epoch, the sample's row in the file), so a run augments alike on any rank count and
// across a resume. The host draws an epoch's augmentations (one packed int32 per position of the
// epoch order); the backends apply them (Backend::augment). Knows nothing of models.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dpt {

struct AugmentSpec {
  bool crop = false, flip = false;
  int pad = 0;  // crop: zeros added on every side before a window of the original size is cut
  bool any() const { return crop || flip; }
};

// From data.augment (none | flip | crop | crop,flip) and data.crop_padding; throws InputError.
AugmentSpec parse_augment(const std::string& augment, int crop_padding);

// A draw packed in an int32: bit 0 flip; bits 1..8 the crop window's top row and bits 9..16 its
// left column in the padded image, each in [0, 2·pad] (pad, pad: the image itself).
inline int32_t pack_draw(bool flip, int dy, int dx) { return int32_t(flip) | (dy << 1) | (dx << 9); }
inline bool draw_flip(int32_t d) { return (d & 1) != 0; }
inline int draw_dy(int32_t d) { return (d >> 1) & 0xFF; }
inline int draw_dx(int32_t d) { return (d >> 9) & 0xFF; }

// One sample's draw: a pure function of (seed, epoch, row) under spec.
int32_t augment_draw(const AugmentSpec& spec, uint64_t seed, int64_t epoch, int64_t row);
// draws[p] = augment_draw(spec, seed, epoch, rows[p]): rows is the epoch's order (file rows by
// position).
std::vector<int32_t> augment_draws(const AugmentSpec& spec, uint64_t seed, int64_t epoch,
                                   const std::vector<int64_t>& rows);

// The reference of Backend::augment for one image (c, h, w) NCHW: out = the crop window of the
// padded image, flipped when the draw says so. Used by the CPU backend and by tests.
void augment_image(const float* in, float* out, int c, int h, int w, int pad, int32_t draw);

}  // namespace dpt
