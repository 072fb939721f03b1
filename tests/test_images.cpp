// `dpdata images` as a user runs it, on trees that tests/images_tree.py writes with PIL: every
// bad-file kind skipped with its reason in the report and the good files written with their
// labels, --strict stopping at the first bad file with no output, the stratified validation
// split, --val-folder's class check, and output that does not depend on the thread count.
// resize_crop_chw (which resizes only what the crop keeps) against the whole resize_bilinear then
// the crop, whose bytes images_torchvision checks against PIL.
// Pixels against torchvision and PIL: tests/images_torchvision_check.py (ctest images_torchvision).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "../src/data/image_decode.hpp"
#include "cli_util.hpp"
#include "dpt/data.hpp"

namespace fs = std::filesystem;

namespace {

using cli::Outcome;

std::string dpdata(const std::string& args) { return std::string(DPT_BINARY_DIR) + "/dpdata images " + args; }

class Images : public ::testing::Test {
 protected:
  static fs::path dir;
  static bool have_pil;
  static void SetUpTestSuite() {
    dir = fs::temp_directory_path() / ("dpt-images-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    have_pil = cli::sh("/usr/bin/python3 -c 'import PIL, numpy'", 60).code == 0;
  }
  static void TearDownTestSuite() {
    cli::sh("chmod -R u+rwx '" + dir.string() + "'", 60);
    fs::remove_all(dir);
  }
  void SetUp() override {
    if (!have_pil) GTEST_SKIP() << "/usr/bin/python3 has no PIL or numpy (python3-pil, python3-numpy)";
  }

  static std::string path(const std::string& name) { return (dir / name).string(); }
  // Writes tests/images_tree.py's tree of that kind under dir/name (once).
  static std::string tree(const std::string& kind, const std::string& name, const std::string& extra = "") {
    if (!fs::exists(path(name))) {
      Outcome r = cli::sh("/usr/bin/python3 " + std::string(DPT_SOURCE_DIR) + "/tests/images_tree.py " + kind + " '" +
                              path(name) + "' " + extra, 300);
      EXPECT_EQ(r.code, 0) << r.out;
    }
    return path(name);
  }
  static Outcome run(const std::string& args) { return cli::sh(dpdata(args), 300); }
  static std::string slurp(const std::string& p) { return cli::slurp(p); }
  static bool no_temporaries() {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().find(".tmp.") != std::string::npos) return false;
    return true;
  }
};
fs::path Images::dir;
bool Images::have_pil = false;

bool has(const std::string& text, const std::string& word) { return text.find(word) != std::string::npos; }

// The report's line for the file whose path ends with `tail`, or "".
std::string report_line(const std::string& report, const std::string& tail) {
  size_t at = 0;
  while (at < report.size()) {
    const size_t end = report.find('\n', at);
    const std::string line = report.substr(at, end - at);
    const size_t tab = line.find('\t');
    if (tab != std::string::npos && tab >= tail.size() && line.compare(tab - tail.size(), tail.size(), tail) == 0)
      return line;
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return "";
}

}  // namespace

// Every bad kind is skipped with its reason; the good files are written, in order, with labels.
TEST_F(Images, BadFilesAreSkippedAndReported) {
  const std::string t = tree("bad", "bad");
  const std::string out = path("bad.h5");
  Outcome r = run("--folder " + t + " --out " + out + " --size 24 --threads 2");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string rep = slurp(out + ".skipped.txt");
  const struct { const char* file; const char* reason; } kinds[] = {
      {"bad/trunc.jpg", "truncated JPEG (premature end of data)"},
      {"bad/zero.png", "empty file (0 bytes)"},
      {"bad/corrupt.jpg", "corrupt JPEG"},
      {"bad/crc.png", "corrupt PNG: IHDR: CRC error"},
      {"bad/text.jpg", "not a JPEG or PNG file"},
      {"bad/bomb.png", "30000 x 30000 = 900000000 pixels, more than --max-pixels 89478485"},
      {"bad/notes.txt", "not .jpg, .jpeg or .png"},
      {"/empty", "class 'empty' (index 2) has no .jpg, .jpeg or .png file: it keeps its index"},
      {"zoo/sub/loop", "symlink loop"},
      {"/stray.png", "not in a class folder"},
  };
  for (const auto& k : kinds) EXPECT_TRUE(has(report_line(rep, k.file), k.reason)) << k.file << " in:\n" << rep;
  // A file chmod 000 cannot be read, except by root, who reads everything.
  const bool root = ::geteuid() == 0;
  if (root) std::printf("[ note ] running as root: bad/locked.png (chmod 000) is readable, so it is imported\n");
  else EXPECT_TRUE(has(report_line(rep, "bad/locked.png"), "cannot open: Permission denied")) << rep;
  EXPECT_TRUE(has(r.out, "skipped " + std::to_string(root ? 8 : 9) + " of 15 files and reported 2 folder(s)")) << r.out;

  const dpt::Dataset ds = dpt::load_dataset(out);
  // Apple/a.png, Apple/b.jpg; bad/[locked.png,] ok.png; zoo/caf\xe9.png, zoo/x.png, zoo/sub/y.png
  std::vector<int32_t> want{0, 0, 1, 3, 3, 3};
  if (root) want.insert(want.begin() + 2, 1);
  EXPECT_EQ(ds.labels, want);
  EXPECT_EQ(ds.num_classes, 4);
  EXPECT_EQ(ds.class_names, (std::vector<std::string>{"Apple", "bad", "empty", "zoo"}));
  EXPECT_EQ(ds.sample_shape, (std::vector<int64_t>{3, 24, 24}));
  EXPECT_FLOAT_EQ(ds.scale, 1.f / 255.f);
  Outcome info = cli::sh(std::string(DPT_BINARY_DIR) + "/dpdata info " + out, 60);
  EXPECT_TRUE(has(info.out, "Apple") && has(info.out, "zoo")) << info.out;
}

// --strict: exit 2 naming the first bad file and its reason, no output file, no temporary.
TEST_F(Images, StrictStopsAtTheFirstBadFile) {
  const std::string t = tree("bad", "bad");
  const std::string out = path("strict.h5");
  Outcome r = run("--folder " + t + " --out " + out + " --size 24 --strict");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "dpdata: '" + t + "/empty': class 'empty' (index 2) has no")) << r.out;
  // Through a CSV whose first bad row is the truncated JPEG.
  std::ofstream(path("strict.csv")) << "path,label\nApple/a.png,fruit\nbad/ok.png,fruit\nbad/trunc.jpg,fruit\n"
                                    << "bad/zero.png,fruit\n";
  r = run("--csv " + path("strict.csv") + " --root " + t + " --out " + out + " --size 24 --strict");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "dpdata: '" + t + "/bad/trunc.jpg': truncated JPEG (premature end of data) (--strict)"))
      << r.out;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(no_temporaries());
}

// Nothing readable: exit 2, a clear message, no output file.
TEST_F(Images, AllBadIsAnError) {
  const std::string t = tree("bad", "bad");
  std::ofstream(path("allbad.csv")) << "path,label\n" << t << "/bad/zero.png,0\n" << t << "/bad/text.jpg,1\n";
  const std::string out = path("allbad.h5");
  Outcome r = run("--csv " + path("allbad.csv") + " --out " + out);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "dpdata: no image could be read for '" + out + "'")) << r.out;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(no_temporaries());
}

// The rows do not depend on the number of decoding threads (JPEGs through the DCT scaling too).
TEST_F(Images, ThreadsGiveTheSameBits) {
  const std::string t = tree("count", "count", "24");
  ASSERT_EQ(run("--folder " + t + " --out " + path("t1.h5") + " --size 64 --threads 1").code, 0);
  ASSERT_EQ(run("--folder " + t + " --out " + path("t3.h5") + " --size 64 --threads 3").code, 0);
  const dpt::Dataset a = dpt::load_dataset(path("t1.h5")), b = dpt::load_dataset(path("t3.h5"));
  EXPECT_EQ(a.n, 24);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_TRUE(a.u8 == b.u8);
}

// Files skipped between rows that span several chunks (512 x 512 rows: 10 to a chunk, written
// straight to their chunks' places in the file): the rows after a skipped file move up, the
// extent is cut to the rows written, and the rows and labels are those of the same tree without
// the bad files.
TEST_F(Images, SkippedFilesLeaveNoGapAcrossChunks) {
  const std::string t = tree("count", "count", "24");
  const std::string bad = path("count-bad");
  if (!fs::exists(bad)) {
    fs::copy(t, bad, fs::copy_options::recursive);
    std::ofstream(bad + "/c0/img00000b.jpg") << "not a JPEG";           // after the first row
    std::ofstream(bad + "/c1/img00005b.jpg") << "not a JPEG either";    // in the second chunk
    std::ofstream(bad + "/c2/img00002b.png");                           // empty
    std::ofstream(bad + "/c3/img00023b.png");                           // the last file
  }
  ASSERT_EQ(run("--folder " + t + " --out " + path("clean.h5") + " --size 512 --threads 2").code, 0);
  Outcome r = run("--folder " + bad + " --out " + path("gaps.h5") + " --size 512 --threads 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "skipped 4 of 28 files")) << r.out;
  const dpt::Dataset a = dpt::load_dataset(path("clean.h5")), b = dpt::load_dataset(path("gaps.h5"));
  EXPECT_EQ(a.n, 24);
  EXPECT_EQ(b.n, 24);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_TRUE(a.u8 == b.u8) << "rows differ from the import without the bad files";
  Outcome v = cli::sh(std::string(DPT_BINARY_DIR) + "/dpdata validate " + path("gaps.h5"), 120);
  EXPECT_EQ(v.code, 0) << v.out;
}

// --direct-io off writes every row through the page cache, auto with O_DIRECT where the file
// system takes it (probed here by opening a file with O_DIRECT): the same rows either way, and
// the log says how many bytes took each path. 24 rows of 512 x 512 x 3, 10 to a chunk.
TEST_F(Images, DirectAndPageCacheWritesGiveTheSameRows) {
  const std::string t = tree("count", "count", "24");
  Outcome cached = run("--folder " + t + " --out " + path("cached.h5") + " --size 512 --threads 2 --direct-io off");
  ASSERT_EQ(cached.code, 0) << cached.out;
  EXPECT_TRUE(has(cached.out, "pixels: 0.0 MB written with O_DIRECT, 18.9 MB through the page cache")) << cached.out;
  Outcome dflt = run("--folder " + t + " --out " + path("direct.h5") + " --size 512 --threads 2");
  ASSERT_EQ(dflt.code, 0) << dflt.out;
  const std::string probe = path("direct-probe");
  std::ofstream(probe) << "x";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
  const bool takes_direct = fd >= 0;
  if (takes_direct) ::close(fd);
  EXPECT_TRUE(has(dflt.out, takes_direct ? "pixels: 18.9 MB written with O_DIRECT, 0.0 MB through the page cache"
                                         : "pixels: 0.0 MB written with O_DIRECT, 18.9 MB through the page cache"))
      << dflt.out;
  const dpt::Dataset a = dpt::load_dataset(path("cached.h5")), b = dpt::load_dataset(path("direct.h5"));
  EXPECT_EQ(a.n, 24);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_TRUE(a.u8 == b.u8) << "rows written with O_DIRECT differ from those written through the page cache";
  Outcome bad = run("--folder " + t + " --out " + path("never.h5") + " --direct-io sometimes");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_TRUE(has(bad.out, "--direct-io must be auto or off, not 'sometimes'")) << bad.out;
  EXPECT_FALSE(fs::exists(path("never.h5")));
}

// round(0.2 n) of each class (at least 1 of a class of 2 or more, none of a class of 1), the same
// files for the same seed, the rows of each file in sorted order, the class names in both.
TEST_F(Images, ValFractionIsStratifiedAndSeeded) {
  const std::string t = tree("strata", "strata");  // classes of 10, 5, 1, 2 files
  auto split = [&](const std::string& name, int seed) {
    Outcome r = run("--folder " + t + " --out " + path(name + "-train.h5") + " --val-fraction 0.2 --val-out " +
                    path(name + "-val.h5") + " --seed " + std::to_string(seed) + " --size 8");
    EXPECT_EQ(r.code, 0) << r.out;
    return std::pair{dpt::load_dataset(path(name + "-train.h5")), dpt::load_dataset(path(name + "-val.h5"))};
  };
  const auto [tr, va] = split("s1", 5);
  EXPECT_EQ(va.labels, (std::vector<int32_t>{0, 0, 1, 3}));
  EXPECT_EQ(tr.labels, (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 3}));
  EXPECT_EQ(va.class_names, tr.class_names);
  EXPECT_EQ(va.num_classes, 4);
  const auto [tr2, va2] = split("s2", 5);
  EXPECT_TRUE(va.u8 == va2.u8 && tr.u8 == tr2.u8) << "same seed, other files";
  bool differs = false;
  for (int seed = 6; seed < 12 && !differs; ++seed) differs = !(split("s3", seed).second.u8 == va.u8);
  EXPECT_TRUE(differs) << "no other seed chose other files";
}

// --val-folder must hold the same classes; a missing or extra one is named.
TEST_F(Images, ValFolderNeedsTheSameClasses) {
  const std::string t = tree("strata", "strata");
  fs::create_directories(path("val/a"));
  fs::create_directories(path("val/e"));
  fs::copy_file(t + "/a/00.png", path("val/a/00.png"), fs::copy_options::skip_existing);
  fs::copy_file(t + "/a/01.png", path("val/e/01.png"), fs::copy_options::skip_existing);
  Outcome r = run("--folder " + t + " --out " + path("vf.h5") + " --val-folder " + path("val") + " --val-out " +
                  path("vf-val.h5"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "missing 'b', 'c', 'd'; extra 'e'")) << r.out;
  EXPECT_FALSE(fs::exists(path("vf.h5")));
}

// A class name with a line break (a folder's or a CSV label's) is refused before any file is read:
// checkpoints carry the names one per line, so it would come back as two names.
TEST_F(Images, ClassNamesWithALineBreakAreRefused) {
  fs::create_directories(path("breaks/ok"));
  fs::create_directories(path("breaks/two\nlines"));
  Outcome r = run("--folder " + path("breaks") + " --out " + path("breaks.h5"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "image folder '" + path("breaks") + "': class name 'two\\nlines' (class 1) holds a line break"))
      << r.out;
  std::ofstream(path("breaks.csv")) << "path,label\nx.png,ok\ny.png,\"carriage\rreturn\"\n";
  r = run("--csv " + path("breaks.csv") + " --out " + path("breaks.h5"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "class name 'carriage\\rreturn' (class 0) holds a line break")) << r.out;
  EXPECT_FALSE(fs::exists(path("breaks.h5")));
  EXPECT_TRUE(no_temporaries());
}

// resize_crop_chw computes only the pixels its crop keeps; they must be resize_bilinear's bytes
// (the whole image resized, PIL's way, then torchvision's center crop) for gray and RGB, wide,
// tall and square images, shrunk, enlarged and with one side already at the size (no pass along
// it). Needs no PIL.
TEST(ResizeCrop, TheCropOfTheWholeResize) {
  std::mt19937 rng(7);
  int cases = 0;
  for (int c : {1, 3})
    for (int s : {1, 7, 32, 64})
      for (int trial = 0; trial < 24; ++trial) {
        dpt::image::Image im;
        im.c = c;
        std::uniform_int_distribution<int> side(1, 4 * s + 9);
        im.w = trial == 0 ? s : side(rng);
        im.h = trial == 1 ? s : trial == 2 ? im.w : trial == 3 ? 40 * s + 3 : side(rng);  // 3: 40x taps
        im.px.resize(size_t(im.w) * size_t(im.h) * size_t(c));
        for (uint8_t& v : im.px) v = uint8_t(rng());
        std::vector<uint8_t> fast(size_t(c) * size_t(s) * size_t(s), 0);
        dpt::image::resize_crop_chw(im, s, fast.data());
        // The reference: torchvision's Resize(s) sizes, resize_bilinear, CenterCrop's offsets.
        const bool wide = im.w > im.h;
        const int sh = wide ? im.h : im.w, lo = wide ? im.w : im.h;
        const int nl = int(double(int64_t(s) * lo) / sh);
        const int w = wide ? nl : s, h = wide ? s : nl;
        const dpt::image::Image r = dpt::image::resize_bilinear(im, w, h);
        auto offset = [](int d, int n) {  // int(round((d - n) / 2.0)), half to even
          const int diff = d - n, half = diff / 2;
          return diff % 2 == 0 ? half : half % 2 == 0 ? half : half + 1;
        };
        const int top = offset(h, s), left = offset(w, s);
        ASSERT_EQ(r.w, w);
        ASSERT_EQ(r.h, h);
        size_t differ = 0;
        for (int ch = 0; ch < c; ++ch)
          for (int y = 0; y < s; ++y)
            for (int x = 0; x < s; ++x)
              differ += fast[(size_t(ch) * size_t(s) + size_t(y)) * size_t(s) + size_t(x)] !=
                        r.px[(size_t(y + top) * size_t(w) + size_t(x + left)) * size_t(c) + size_t(ch)];
        EXPECT_EQ(differ, 0u) << im.w << " x " << im.h << " x " << c << " to " << s;
        ++cases;
      }
  EXPECT_EQ(cases, 2 * 4 * 24);
}
