// Decoding one image file (JPEG through libjpeg, PNG through libpng) to 8-bit gray or RGB
// pixels, and the pixel operations of `dpdata images` after it: PIL's BILINEAR resize (its
// antialiasing support and fixed-point rounding), torchvision's center crop, PIL's 'L'
// conversion. Private to src/data/. Knows nothing of folders or HDF5.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dpt::image {

// h × w × c bytes, rows top to bottom, channels interleaved; c = 1 (gray) or 3 (RGB).
struct Image {
  int w = 0, h = 0, c = 0;
  std::vector<uint8_t> px;
};

struct DecodeOptions {
  // JPEG only: decode at the smallest libjpeg scale M/8 whose shorter side is still >= this
  // (0: full size, as PIL decodes).
  int min_short = 0;
  bool exif_transpose = false;     // apply the EXIF orientation (JPEG), as PIL's exif_transpose
  uint64_t max_pixels = 89478485;  // refuse larger images from their header (PIL's limit)
};

// Decodes the file at path (JPEG or PNG, told by its first bytes) into out: gray stays gray,
// everything else becomes RGB (alpha dropped, palette expanded, CMYK converted, 16 bits to 8 by
// the high byte). Returns "" on success, else the reason the file was not decoded ("truncated
// JPEG (premature end of data)"). Never throws for a bad file.
std::string decode_file(const std::string& path, const DecodeOptions& o, Image& out);

// The EXIF orientation (1-8) an APP1 segment's bytes give; 1 when absent or unreadable.
int exif_orientation(const uint8_t* app1, size_t size);
// Returns the image turned as PIL's ImageOps.exif_transpose turns an image of that orientation.
Image oriented(const Image& in, int orientation);

// PIL's Image.resize(size, BILINEAR) for 8-bit images, bit for bit.
Image resize_bilinear(const Image& in, int w, int h);
// PIL's convert('L') of RGB: (R·19595 + G·38470 + B·7471 + 2^15) >> 16. Gray is returned as is.
Image to_gray(const Image& in);
// Keeps the few large buffers each image passes through (the file's bytes, its pixels, the
// resize's passes: 0.1-1 MB each) on the heap for reuse: with glibc's defaults each one is a
// fresh mmap, zeroed page by page and unmapped again (2,000 500x375 JPEGs to 256 on 2 threads:
// 12.8 s with the defaults, 6.9 s with this). Process-wide; called before decoding starts.
void keep_buffers_on_heap();

// torchvision's Resize(s) (shorter side to s, longer to int(s · long / short)) then
// CenterCrop(s) on a PIL image, written channels first (c × s × s) into out.
void resize_crop_chw(const Image& in, int s, uint8_t* out);

}  // namespace dpt::image
