// Rows to JPEG and back through libjpeg's jpeglib.h API (libjpeg-turbo). As in image_decode.cpp,
// libjpeg's fatal errors longjmp back to the function that set the jump, which cleans up and
// reports; nothing with a destructor is created between the setjmp and the calls that may jump.
// Warnings are recorded, never printed.
#include "jpeg_codec.hpp"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <thread>

#include <jpeglib.h>
#include <jerror.h>

#include "dpt/check.hpp"

namespace dpt::image {
namespace {

struct CodecError {
  jpeg_error_mgr mgr;  // first: libjpeg hands back a pointer to it
  jmp_buf jump;
  char msg[JMSG_LENGTH_MAX];
  char warning[JMSG_LENGTH_MAX];  // the first warning, "" if none
};

void codec_fail(j_common_ptr c) {
  CodecError* e = reinterpret_cast<CodecError*>(c->err);
  c->err->format_message(c, e->msg);
  longjmp(e->jump, 1);
}

void codec_message(j_common_ptr c, int level) {
  CodecError* e = reinterpret_cast<CodecError*>(c->err);
  if (level < 0 && e->warning[0] == 0) c->err->format_message(c, e->warning);
}

// A destination that grows a std::vector (no malloc'd buffer to free on an error path).
struct VectorDest {
  jpeg_destination_mgr mgr;  // first
  std::vector<uint8_t>* out;
};

void dest_init(j_compress_ptr c) {
  VectorDest* d = reinterpret_cast<VectorDest*>(c->dest);
  d->out->resize(std::max<size_t>(d->out->capacity(), 4096));
  d->mgr.next_output_byte = d->out->data();
  d->mgr.free_in_buffer = d->out->size();
}

boolean dest_grow(j_compress_ptr c) {
  VectorDest* d = reinterpret_cast<VectorDest*>(c->dest);
  const size_t used = d->out->size();  // the whole buffer is full when libjpeg calls this
  d->out->resize(used * 2);
  d->mgr.next_output_byte = d->out->data() + used;
  d->mgr.free_in_buffer = d->out->size() - used;
  return TRUE;
}

void dest_term(j_compress_ptr c) {
  VectorDest* d = reinterpret_cast<VectorDest*>(c->dest);
  d->out->resize(d->out->size() - d->mgr.free_in_buffer);
}

}  // namespace

void encode_jpeg_chw(const uint8_t* chw, int c, int h, int w, int quality, std::vector<uint8_t>& out) {
  jpeg_compress_struct j;
  CodecError err;
  std::memset(&err, 0, sizeof err);
  std::vector<uint8_t> line(size_t(w) * size_t(c));  // before the jump: nothing is constructed after it
  out.clear();
  VectorDest dest;
  dest.out = &out;
  dest.mgr.init_destination = dest_init;
  dest.mgr.empty_output_buffer = dest_grow;
  dest.mgr.term_destination = dest_term;
  j.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = codec_fail;
  err.mgr.emit_message = codec_message;
  if (setjmp(err.jump)) {
    jpeg_destroy_compress(&j);
    throw Error(std::string("JPEG encoder: ") + err.msg);
  }
  jpeg_create_compress(&j);
  j.dest = &dest.mgr;
  j.image_width = JDIMENSION(w);
  j.image_height = JDIMENSION(h);
  j.input_components = c;
  j.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&j);  // RGB: YCbCr with 2x2 luma sampling (4:2:0)
  jpeg_set_quality(&j, quality, TRUE);
  jpeg_start_compress(&j, TRUE);
  const size_t plane = size_t(h) * size_t(w);
  while (j.next_scanline < j.image_height) {
    const size_t y = j.next_scanline;
    for (int x = 0; x < w; ++x)
      for (int ch = 0; ch < c; ++ch) line[size_t(x) * size_t(c) + size_t(ch)] = chw[size_t(ch) * plane + y * size_t(w) + size_t(x)];
    JSAMPROW row = line.data();
    jpeg_write_scanlines(&j, &row, 1);
  }
  jpeg_finish_compress(&j);
  jpeg_destroy_compress(&j);
}

std::string decode_jpeg_chw(const uint8_t* data, size_t size, int c, int h, int w, uint8_t* out) {
  if (size == 0) return "no bytes (an empty row)";
  jpeg_decompress_struct d;
  CodecError err;
  std::memset(&err, 0, sizeof err);
  std::vector<uint8_t> line(size_t(w) * size_t(c));  // before the jump
  char got[128] = "";
  d.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = codec_fail;
  err.mgr.emit_message = codec_message;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&d);
    return std::string("corrupt JPEG data: ") + err.msg;
  }
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, data, static_cast<unsigned long>(size));
  jpeg_read_header(&d, TRUE);
  const int in_c = d.jpeg_color_space == JCS_GRAYSCALE ? 1 : d.num_components;
  if (in_c != c || d.image_width != JDIMENSION(w) || d.image_height != JDIMENSION(h)) {
    std::snprintf(got, sizeof got, "decodes to %d x %u x %u, expected %d x %d x %d", in_c, d.image_height,
                  d.image_width, c, h, w);
    jpeg_destroy_decompress(&d);
    return got;
  }
  d.out_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&d);
  const size_t plane = size_t(h) * size_t(w);
  while (d.output_scanline < d.output_height) {
    const size_t y = d.output_scanline;
    JSAMPROW row = line.data();
    jpeg_read_scanlines(&d, &row, 1);
    for (int x = 0; x < w; ++x)
      for (int ch = 0; ch < c; ++ch) out[size_t(ch) * plane + y * size_t(w) + size_t(x)] = line[size_t(x) * size_t(c) + size_t(ch)];
  }
  jpeg_finish_decompress(&d);
  jpeg_destroy_decompress(&d);
  if (err.warning[0]) return std::string("corrupt JPEG data: ") + err.warning;
  return "";
}

int64_t decode_jpeg_rows(const uint8_t* bytes, const std::vector<uint64_t>& start, int c, int h, int w,
                         uint8_t* out, std::string& why) {
  const int64_t n = int64_t(start.size()) - 1;
  if (n <= 0) return -1;
  const size_t row = size_t(c) * size_t(h) * size_t(w);
  const int T = int(std::clamp<int64_t>(std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), 16), 1, n));
  std::vector<int64_t> first_bad(static_cast<size_t>(T), -1);
  std::vector<std::string> reason(static_cast<size_t>(T));
  // Row i by thread i mod T; each stops at its first bad row, so the least of those is the
  // first bad row overall.
  auto work = [&](int t) {
    for (int64_t i = t; i < n; i += T) {
      std::string e = decode_jpeg_chw(bytes + start[size_t(i)], size_t(start[size_t(i) + 1] - start[size_t(i)]), c, h,
                                      w, out + size_t(i) * row);
      if (!e.empty()) {
        first_bad[size_t(t)] = i;
        reason[size_t(t)] = std::move(e);
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < T; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& p : pool) p.join();
  int64_t bad = -1;
  for (int t = 0; t < T; ++t)
    if (first_bad[size_t(t)] >= 0 && (bad < 0 || first_bad[size_t(t)] < bad)) {
      bad = first_bad[size_t(t)];
      why = reason[size_t(t)];
    }
  return bad;
}

}  // namespace dpt::image
