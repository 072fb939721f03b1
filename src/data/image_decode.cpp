// JPEG (libjpeg's jpeglib.h API) and PNG (libpng) files to 8-bit gray or RGB pixels. Both
// libraries report a fatal error by calling a handler that must not return; ours longjmp back
// to the function that set the jump, which then frees the decoder and returns the message, so a
// broken file is a reason string and never an exit() or a crash. Nothing with a destructor is
// created between a setjmp and the library calls that may jump to it.
#include "image_decode.hpp"

#include <fcntl.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

namespace dpt::image {
namespace {

std::string too_many_pixels(uint64_t w, uint64_t h, uint64_t max) {
  return std::to_string(w) + " x " + std::to_string(h) + " = " + std::to_string(w * h) +
         " pixels, more than --max-pixels " + std::to_string(max) + " (decompression bomb?); not decoded";
}

// ---------------------------------------------------------------- JPEG

struct JpegError {
  jpeg_error_mgr mgr;  // first: libjpeg hands back a pointer to it
  jmp_buf jump;
  char msg[JMSG_LENGTH_MAX];
  bool eof;  // "Premature end of JPEG file": libjpeg pads with gray and goes on
};

void jpeg_fail(j_common_ptr c) {
  JpegError* e = reinterpret_cast<JpegError*>(c->err);
  c->err->format_message(c, e->msg);
  longjmp(e->jump, 1);
}

// Warnings: a truncated file counts as broken (PIL: "image file is truncated"); the others
// ("Corrupt JPEG data: N extraneous bytes before marker") decode as libjpeg and PIL decode them.
void jpeg_message(j_common_ptr c, int level) {
  if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) reinterpret_cast<JpegError*>(c->err)->eof = true;
}

// Adobe's CMYK JPEGs (Photoshop's, and every one with an Adobe APP14 marker) store the inks
// inverted. RGB as Pillow's cmyk2rgb makes it from ink amounts.
void cmyk_row_to_rgb(const uint8_t* in, int w, bool inverted, uint8_t* out) {
  auto muldiv255 = [](int a, int b) { const int t = a * b + 128; return ((t >> 8) + t) >> 8; };
  for (int x = 0; x < w; ++x, in += 4, out += 3) {
    const int k = inverted ? 255 - in[3] : in[3];
    const int nk = 255 - k;
    for (int ch = 0; ch < 3; ++ch) {
      const int ink = inverted ? 255 - in[ch] : in[ch];
      const int v = nk - muldiv255(ink, nk);
      out[ch] = uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
    }
  }
}

// Picks libjpeg's DCT-domain scale M/8: the smallest whose output keeps the shorter side >= min_short.
void choose_scale(jpeg_decompress_struct& d, int min_short) {
  if (min_short <= 0) return;
  for (unsigned m = 1; m <= 8; ++m) {
    d.scale_num = m;
    d.scale_denom = 8;
    jpeg_calc_output_dimensions(&d);
    if (int(std::min(d.output_width, d.output_height)) >= min_short) return;
  }
}

std::string decode_jpeg(const uint8_t* data, size_t size, const DecodeOptions& o, Image& img, int& orientation) {
  jpeg_decompress_struct d;
  JpegError err;
  std::memset(&err, 0, sizeof err);
  std::vector<uint8_t> cmyk;  // declared before the jump: nothing is constructed after it
  d.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.mgr.emit_message = jpeg_message;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&d);
    return std::string("corrupt JPEG: ") + err.msg;
  }
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, data, static_cast<unsigned long>(size));
  if (o.exif_transpose) jpeg_save_markers(&d, JPEG_APP0 + 1, 0xffff);
  jpeg_read_header(&d, TRUE);
  if (uint64_t(d.image_width) * d.image_height > o.max_pixels) {
    const std::string why = too_many_pixels(d.image_width, d.image_height, o.max_pixels);
    jpeg_destroy_decompress(&d);
    return why;
  }
  // The saved markers live in the image's memory pool, which jpeg_finish_decompress frees.
  for (jpeg_saved_marker_ptr m = d.marker_list; m; m = m->next)
    if (m->marker == JPEG_APP0 + 1 && orientation == 1) orientation = exif_orientation(m->data, m->data_length);
  const bool cmyk_in = d.jpeg_color_space == JCS_CMYK || d.jpeg_color_space == JCS_YCCK;
  d.out_color_space = d.jpeg_color_space == JCS_GRAYSCALE ? JCS_GRAYSCALE : cmyk_in ? JCS_CMYK : JCS_RGB;
  choose_scale(d, o.min_short);
  jpeg_start_decompress(&d);
  img.w = int(d.output_width);
  img.h = int(d.output_height);
  img.c = d.out_color_space == JCS_GRAYSCALE ? 1 : 3;
  img.px.resize(size_t(img.w) * size_t(img.h) * size_t(img.c));
  if (cmyk_in) cmyk.resize(size_t(img.w) * 4);
  while (d.output_scanline < d.output_height) {
    uint8_t* row = &img.px[size_t(d.output_scanline) * size_t(img.w) * size_t(img.c)];
    JSAMPROW target = cmyk_in ? cmyk.data() : row;
    jpeg_read_scanlines(&d, &target, 1);
    if (cmyk_in) cmyk_row_to_rgb(cmyk.data(), img.w, d.saw_Adobe_marker, row);
  }
  jpeg_finish_decompress(&d);
  const bool eof = err.eof;
  jpeg_destroy_decompress(&d);
  return eof ? "truncated JPEG (premature end of data)" : "";
}

// ---------------------------------------------------------------- PNG

struct PngSource {
  const uint8_t* data;
  size_t size, at;
  char msg[256];
};

void png_fail(png_structp p, png_const_charp what) {
  PngSource* s = static_cast<PngSource*>(png_get_error_ptr(p));
  std::snprintf(s->msg, sizeof s->msg, "%s", what);
  png_longjmp(p, 1);
}

void png_warn(png_structp, png_const_charp) {}

void png_read_mem(png_structp p, png_bytep out, size_t n) {
  PngSource* s = static_cast<PngSource*>(png_get_io_ptr(p));
  if (n > s->size - s->at) png_error(p, "truncated PNG (file ends inside the image data)");
  std::memcpy(out, s->data + s->at, n);
  s->at += n;
}

// To 8-bit gray or RGB: palettes expanded, 1/2/4-bit gray scaled to 0-255, 16 bits to their
// high byte, alpha and tRNS dropped (PIL's convert('RGB') drops them too).
void png_transforms(png_structp p, png_infop info) {
  const int type = png_get_color_type(p, info), depth = png_get_bit_depth(p, info);
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(p);
  if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(p);
  if (depth == 16) png_set_strip_16(p);
  // png_set_palette_to_rgb also turns a palette's tRNS into an alpha channel: dropped with the rest.
  if ((type & PNG_COLOR_MASK_ALPHA) || png_get_valid(p, info, PNG_INFO_tRNS)) png_set_strip_alpha(p);
  png_set_interlace_handling(p);
  png_read_update_info(p, info);
}

std::string decode_png(const uint8_t* data, size_t size, const DecodeOptions& o, Image& img) {
  PngSource src{data, size, 0, {0}};
  std::vector<png_bytep> rows;  // before the jump
  png_structp p = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_fail, png_warn);
  if (!p) return "cannot start libpng";
  png_infop info = png_create_info_struct(p);
  if (!info || setjmp(png_jmpbuf(p))) {
    const std::string why = std::string("corrupt PNG: ") + (info ? src.msg : "out of memory");
    png_destroy_read_struct(&p, &info, nullptr);
    return why;
  }
  png_set_read_fn(p, &src, png_read_mem);
  png_set_user_limits(p, 0x7fffffff, 0x7fffffff);  // our --max-pixels decides, not libpng's 1M x 1M
  png_read_info(p, info);
  const uint64_t w = png_get_image_width(p, info), h = png_get_image_height(p, info);
  if (w * h > o.max_pixels) {
    png_destroy_read_struct(&p, &info, nullptr);
    return too_many_pixels(w, h, o.max_pixels);
  }
  png_transforms(p, info);
  img.w = int(w);
  img.h = int(h);
  img.c = png_get_channels(p, info);
  if ((img.c != 1 && img.c != 3) || png_get_rowbytes(p, info) != w * size_t(img.c)) png_error(p, "unexpected layout");
  img.px.resize(size_t(w) * size_t(h) * size_t(img.c));
  rows.resize(size_t(h));
  for (size_t y = 0; y < size_t(h); ++y) rows[y] = &img.px[y * size_t(w) * size_t(img.c)];
  png_read_image(p, rows.data());
  png_destroy_read_struct(&p, &info, nullptr);
  return "";
}

// The whole file, or the reason it cannot be read.
std::string read_all(const std::string& path, std::vector<uint8_t>& bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::string("cannot open: ") + std::strerror(errno);
  struct stat st {};
  std::string why;
  if (fstat(fd, &st) != 0) why = std::string("cannot stat: ") + std::strerror(errno);
  else if (!S_ISREG(st.st_mode)) why = "not a regular file";
  else if (st.st_size == 0) why = "empty file (0 bytes)";
  else {
    bytes.resize(size_t(st.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        why = std::string("read error: ") + (r < 0 ? std::strerror(errno) : "file shrank while read");
        break;
      }
      got += size_t(r);
    }
  }
  ::close(fd);
  return why;
}

std::string first_bytes(const std::vector<uint8_t>& b) {
  std::string s;
  char hex[4];
  for (size_t i = 0; i < std::min<size_t>(b.size(), 8); ++i) {
    std::snprintf(hex, sizeof hex, "%02x", b[i]);
    s += hex;
  }
  return s;
}

}  // namespace

std::string decode_file(const std::string& path, const DecodeOptions& o, Image& out) {
  std::vector<uint8_t> bytes;
  std::string why = read_all(path, bytes);
  if (!why.empty()) return why;
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  int orientation = 1;
  if (bytes.size() >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff)
    why = decode_jpeg(bytes.data(), bytes.size(), o, out, orientation);
  else if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0)
    why = decode_png(bytes.data(), bytes.size(), o, out);
  else
    return "not a JPEG or PNG file (first bytes " + first_bytes(bytes) + ")";
  if (why.empty() && orientation != 1) out = oriented(out, orientation);
  return why;
}

// APP1: "Exif\0\0", then a TIFF header (II*\0 little-endian or MM\0* big-endian) whose first
// IFD may hold tag 0x0112 (Orientation, a SHORT). Every offset is checked against the segment.
int exif_orientation(const uint8_t* a, size_t n) {
  if (n < 14 || std::memcmp(a, "Exif\0\0", 6) != 0) return 1;
  const uint8_t* t = a + 6;
  const size_t tn = n - 6;
  const bool le = t[0] == 'I' && t[1] == 'I';
  if (!le && !(t[0] == 'M' && t[1] == 'M')) return 1;
  auto u16 = [&](size_t at) { return le ? unsigned(t[at] | t[at + 1] << 8) : unsigned(t[at] << 8 | t[at + 1]); };
  auto u32 = [&](size_t at) {
    return le ? uint32_t(u16(at) | uint32_t(u16(at + 2)) << 16) : uint32_t(uint32_t(u16(at)) << 16 | u16(at + 2));
  };
  if (u16(2) != 42) return 1;
  const size_t ifd = u32(4);
  if (ifd > tn || tn - ifd < 2) return 1;
  const size_t count = u16(ifd);
  for (size_t i = 0; i < count; ++i) {
    const size_t e = ifd + 2 + 12 * i;
    if (e > tn || tn - e < 12) return 1;
    if (u16(e) == 0x0112 && u16(e + 2) == 3) {
      const unsigned v = u16(e + 8);
      return v >= 1 && v <= 8 ? int(v) : 1;
    }
  }
  return 1;
}

void keep_buffers_on_heap() {
  // Allocations below 256 MiB from the heap, and freed heap memory kept rather than trimmed.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace dpt::image
