// A probe of augment.hpp's resized crops for tests/torch_transform_check.py, which compares it
// with torchvision's transforms:
//   transform_probe draws H W N SCALE RATIO FLIP    N windows of an H x W image, one per row
//                                                   (seed 1, epoch 0, rows 0..N-1), as
//                                                   "top left height width flip" lines
//   transform_probe crop IN OUT C H W OH OW TOP LEFT WH WW FLIP [MEAN STD]
//                                                   IN: C·H·W float32 values; OUT: C·OH·OW
//   transform_probe center H W SIZE RATIO           evaluation's window "top left height width"
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "dpt/augment.hpp"

using namespace dpt;

int main(int argc, char** argv) {
  const std::vector<std::string> a(argv + 1, argv + argc);
  try {
    if (a.size() == 7 && a[0] == "draws") {
      const ImageTransform t = parse_transform(a[6] == "1" ? "random_resized_crop,flip" : "random_resized_crop", 0,
                                               a[4], a[5], 0.875, "", "");
      const int h = std::stoi(a[1]), w = std::stoi(a[2]);
      for (int64_t r = 0; r < std::stoll(a[3]); ++r) {
        const Window x = unpack_window(window_draw(t, h, w, 1, 0, r));
        std::printf("%d %d %d %d %d\n", x.top, x.left, x.h, x.w, int(x.flip));
      }
      return 0;
    }
    if ((a.size() == 13 || a.size() == 15) && a[0] == "crop") {
      const int c = std::stoi(a[3]), h = std::stoi(a[4]), w = std::stoi(a[5]), oh = std::stoi(a[6]),
                ow = std::stoi(a[7]);
      std::vector<float> in(size_t(c) * h * w), out(size_t(c) * oh * ow);
      std::ifstream f(a[1], std::ios::binary);
      f.read(reinterpret_cast<char*>(in.data()), std::streamsize(in.size() * sizeof(float)));
      if (!f) throw std::runtime_error("cannot read " + a[1]);
      ImageTransform t;
      if (a.size() == 15) t = parse_transform("none", 0, "0.08,1", "0.75,1.3333333333333333", 0.875, a[13], a[14]);
      const int64_t win = pack_window(std::stoi(a[8]), std::stoi(a[9]), std::stoi(a[10]), std::stoi(a[11]), a[12] == "1");
      resized_crop_image(in.data(), out.data(), c, h, w, oh, ow, win, t.mean.empty() ? nullptr : t.mean.data(),
                         t.std.empty() ? nullptr : t.std.data());
      std::ofstream o(a[2], std::ios::binary);
      o.write(reinterpret_cast<const char*>(out.data()), std::streamsize(out.size() * sizeof(float)));
      return o ? 0 : 1;
    }
    if (a.size() == 5 && a[0] == "center") {
      const ImageTransform t =
          parse_transform("none", std::stoi(a[3]), "0.08,1", "0.75,1.3333333333333333", std::stod(a[4]), "", "");
      const Window x = unpack_window(center_window(t, std::stoi(a[1]), std::stoi(a[2])));
      std::printf("%d %d %d %d\n", x.top, x.left, x.h, x.w);
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "transform_probe: " << e.what() << "\n";
    return 2;
  }
  std::cerr << "usage: see tests/transform_probe.cpp\n";
  return 2;
}
