// Images for `dptrain --predict`: files and folders (walked recursively, sorted, .jpg/.jpeg/.png)
// decoded and brought to the evaluation's stored size as `dpdata images` does (shorter side to S
// with PIL's BILINEAR, center crop S x S), one rank's share of them in memory.
#include <algorithm>
#include <filesystem>
#include <system_error>

#include "dpt/check.hpp"
#include "dpt/data.hpp"
#include "image_decode.hpp"
#include "image_list.hpp"

namespace dpt {
namespace fs = std::filesystem;

namespace {
bool image_extension(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return e == ".jpg" || e == ".jpeg" || e == ".png";
}
}  // namespace

std::vector<std::string> list_image_files(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    std::error_code ec;
    const fs::file_status st = fs::status(p, ec);
    if (ec || !fs::exists(st)) throw InputError("--predict " + image::printable(p) + ": no such file or folder");
    if (!fs::is_directory(st)) {
      files.push_back(p);
      continue;
    }
    // Symbolic links are not followed into folders: a loop cannot be walked forever.
    std::vector<std::string> found;
    fs::recursive_directory_iterator it(p, fs::directory_options::skip_permission_denied, ec), end;
    if (ec) throw InputError("--predict " + image::printable(p) + ": cannot read the folder: " + ec.message());
    for (; it != end; it.increment(ec)) {
      if (ec) throw InputError("--predict " + image::printable(p) + ": " + ec.message());
      std::error_code e2;
      if (it->is_regular_file(e2) && image_extension(it->path())) found.push_back(it->path().string());
    }
    std::sort(found.begin(), found.end());
    if (found.empty()) throw InputError("--predict " + image::printable(p) + ": no .jpg, .jpeg or .png file in the folder");
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

Dataset predict_images(const std::vector<std::string>& files, int64_t begin, int64_t end, int channels, int side,
                       int num_classes, std::vector<std::string>& problems) {
  if (channels != 1 && channels != 3)
    throw InputError("--predict: the model takes " + std::to_string(channels) + " channels; images give 1 or 3");
  Dataset ds;
  ds.path = "(--predict images)";
  ds.sample_shape = {channels, side, side};
  ds.dim = int64_t(channels) * side * side;
  ds.num_classes = num_classes;
  ds.is_u8 = true;
  ds.scale = 1.f / 255.f;
  ds.first_row = begin;
  ds.file_rows = int64_t(files.size());
  ds.n = end - begin;
  ds.u8.assign(size_t(ds.n) * size_t(ds.dim), 0);
  ds.labels.assign(size_t(ds.n), 0);
  problems.assign(size_t(ds.n), "");
  image::keep_buffers_on_heap();
  image::DecodeOptions o;
  o.min_short = side;
  for (int64_t i = begin; i < end; ++i) {
    image::Image im;
    std::string why = image::decode_file(files[size_t(i)], o, im);
    if (!why.empty()) {
      problems[size_t(i - begin)] = why;
      continue;
    }
    if (channels == 1) {
      im = image::to_gray(im);
    } else if (im.c == 1) {  // gray to RGB: PIL's convert('RGB') repeats the value
      image::Image rgb;
      rgb.w = im.w;
      rgb.h = im.h;
      rgb.c = 3;
      rgb.px.resize(im.px.size() * 3);
      for (size_t p = 0; p < im.px.size(); ++p) rgb.px[3 * p] = rgb.px[3 * p + 1] = rgb.px[3 * p + 2] = im.px[p];
      im = std::move(rgb);
    }
    image::resize_crop_chw(im, side, &ds.u8[size_t(i - begin) * size_t(ds.dim)]);
  }
  return ds;
}

}  // namespace dpt
