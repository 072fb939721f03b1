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

// ---- resized crops (data.augment = random_resized_crop, data.crop_size, data.mean/std) ----
// A window of a stored image resized to the model's input, torchvision's way: in training
// RandomResizedCrop (a window of random area and aspect ratio, then a horizontal flip), in
// evaluation a center window (Resize + CenterCrop, as a crop of ratio·shorter side resized to
// the output, FFCV's form of it), then per-channel (v − mean) / std in both.
struct ImageTransform {
  bool random_crop = false, flip = false;  // training draws: random_resized_crop[,flip]
  int size = 0;                            // output side (data.crop_size); 0 = the stored size
  double scale_lo = 0.08, scale_hi = 1.0;  // the window's area / the image's (data.crop_scale)
  double ratio_lo = 3.0 / 4.0, ratio_hi = 4.0 / 3.0;  // width / height (data.crop_ratio)
  double eval_ratio = 0.875;               // evaluation window side / shorter side (224/256)
  std::vector<float> mean, std;            // per channel; empty: no normalisation
  // Whether images pass through Backend::resized_crop at all (else the stored pixels are the
  // model's input, as before).
  bool any() const { return random_crop || size > 0 || !mean.empty(); }
  // The model's input side for a stored image of h × w.
  int out_h(int h) const { return size > 0 ? size : h; }
  int out_w(int w) const { return size > 0 ? size : w; }
};

// From data.augment, data.crop_size, data.crop_scale, data.crop_ratio, data.eval_crop_ratio,
// data.mean and data.std (comma-separated lists); throws InputError naming the key.
ImageTransform parse_transform(const std::string& augment, int crop_size, const std::string& crop_scale,
                               const std::string& crop_ratio, double eval_crop_ratio,
                               const std::string& mean, const std::string& std);

// A window packed in an int64: top, left, height, width (15 bits each) and bit 60 the flip.
inline int64_t pack_window(int top, int left, int h, int w, bool flip) {
  return int64_t(top) | (int64_t(left) << 15) | (int64_t(h) << 30) | (int64_t(w) << 45) | (int64_t(flip) << 60);
}
struct Window {
  int top, left, h, w;
  bool flip;
};
inline Window unpack_window(int64_t d) {
  return {int(d & 0x7FFF), int((d >> 15) & 0x7FFF), int((d >> 30) & 0x7FFF), int((d >> 45) & 0x7FFF),
          ((d >> 60) & 1) != 0};
}
constexpr int kMaxImageSide = 0x7FFF;  // the most a window's side or offset can hold

// torchvision's RandomResizedCrop.get_params for an h × w image (ten tries at a window of
// random area and log-uniform aspect ratio, else the center crop clamped to the ratio range),
// with a flip when t.flip, drawn as a pure function of (seed, epoch, row).
int64_t window_draw(const ImageTransform& t, int h, int w, uint64_t seed, int64_t epoch, int64_t row);
std::vector<int64_t> window_draws(const ImageTransform& t, int h, int w, uint64_t seed, int64_t epoch,
                                  const std::vector<int64_t>& rows);
// The evaluation window: the whole image when t.size is 0, else a square of side
// round(eval_ratio · min(h, w)) at torchvision's CenterCrop offsets.
int64_t center_window(const ImageTransform& t, int h, int w);

// Antialiased bilinear weights of one output coordinate o of `out`, reading an input span of
// `in` (PyTorch's interpolate(mode='bilinear', antialias=True), PIL's BILINEAR): taps
// [*first, *first + *count), weights normalised to sum 1, into wt (at most max_taps).
int resize_taps(int in, int out, int o, int* first, float* wt, int max_taps);
// The most taps resize_taps gives for this pair of sizes.
int resize_max_taps(int in, int out);

// The reference of Backend::resized_crop for one image (c, h, w) into (c, oh, ow): the window
// resized, flipped, normalised (mean, std: c values each, or nullptr). Used by the CPU backend
// and by tests.
void resized_crop_image(const float* in, float* out, int c, int h, int w, int oh, int ow, int64_t window,
                        const float* mean, const float* std);

}  // namespace dpt
