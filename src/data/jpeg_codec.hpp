// A dataset row (C x H x W uint8, channels first) to a JPEG and back, for `dpdata images
// --store jpeg` and the readers of such a file (/jpeg, /jpeg_offsets: docs/formats.md). The same
// bytes decode to the same pixels on every thread and every reader: one libjpeg, one setting.
// Private to src/data/.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dpt::image {

// libjpeg's jpeg_set_defaults + jpeg_set_quality(quality, TRUE): c = 3 an RGB (YCbCr 4:2:0, as
// PIL's default) JPEG, c = 1 a grayscale one. `chw` is c planes of h x w; `out` is replaced.
// Throws Error only for a libjpeg failure (out of memory).
void encode_jpeg_chw(const uint8_t* chw, int c, int h, int w, int quality, std::vector<uint8_t>& out);

// Decodes a JPEG that must be c x h x w (c = 3: RGB, 1: gray) into c planes at `out`: libjpeg's
// defaults (JDCT_ISLOW, fancy upsampling). Returns "" or what is wrong ("corrupt JPEG data: ...",
// "decodes to 3 x 32 x 30, expected 3 x 32 x 32"); never throws for bad bytes, prints nothing.
// Any libjpeg warning (a truncated or damaged stream) counts as an error: the importer's
// encoder never writes a stream that warns.
std::string decode_jpeg_chw(const uint8_t* data, size_t size, int c, int h, int w, uint8_t* out);

// Decodes rows [0, n) on up to min(hardware threads, 16) threads: row i's bytes are
// bytes[start[i], start[i + 1]) and its pixels go to out + i * c*h*w. Returns the first row (in
// i) that did not decode, with its reason in `why`, or -1.
int64_t decode_jpeg_rows(const uint8_t* bytes, const std::vector<uint64_t>& start, int c, int h, int w,
                         uint8_t* out, std::string& why);

}  // namespace dpt::image
