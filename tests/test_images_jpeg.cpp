// `dpdata images --store jpeg` (docs/formats.md, "Photos: dpdata images"): the same rows as the
// raw import within JPEG's loss, tighter at higher quality; the same bytes for any thread count;
// every reader (all, shard, stream, JpegRows, evaluation) giving the same decoded rows bit for
// bit, and dptrain training alike on them; a damaged row or offsets table a clear error naming
// it, never a crash; --store/--quality's option errors.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "../src/data/internal.hpp"
#include "cli_util.hpp"
#include "dpt/check.hpp"
#include "dpt/data.hpp"

namespace fs = std::filesystem;

namespace {

using cli::Outcome;

class ImagesJpeg : public ::testing::Test {
 protected:
  static fs::path dir;
  static bool have_pil;
  static void SetUpTestSuite() {
    dir = fs::temp_directory_path() / ("dpt-images-jpeg-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    have_pil = cli::sh("/usr/bin/python3 -c 'import PIL, numpy'", 60).code == 0;
  }
  static void TearDownTestSuite() { fs::remove_all(dir); }
  void SetUp() override {
    if (!have_pil) GTEST_SKIP() << "/usr/bin/python3 has no PIL or numpy (python3-pil, python3-numpy)";
  }

  static std::string path(const std::string& name) { return (dir / name).string(); }
  // 24 500x375 JPEG photos in 4 classes (tests/images_tree.py count), written once.
  static std::string photos() {
    if (!fs::exists(path("count"))) {
      Outcome r = cli::sh("/usr/bin/python3 " + std::string(DPT_SOURCE_DIR) + "/tests/images_tree.py count '" +
                              path("count") + "' 24", 300);
      EXPECT_EQ(r.code, 0) << r.out;
    }
    return path("count");
  }
  static Outcome dpdata(const std::string& args) {
    return cli::sh(std::string(DPT_BINARY_DIR) + "/dpdata " + args, 300);
  }
  // dpdata images of the photos at --size `size` into dir/name (once); extra: more options.
  static std::string imported(const std::string& name, const std::string& extra, int size = 32) {
    const std::string out = path(name);
    if (!fs::exists(out)) {
      Outcome r = dpdata("images --folder " + photos() + " --out " + out + " --size " + std::to_string(size) + " " + extra);
      EXPECT_EQ(r.code, 0) << r.out;
    }
    return out;
  }
};
fs::path ImagesJpeg::dir;
bool ImagesJpeg::have_pil = false;

bool has(const std::string& text, const std::string& word) { return text.find(word) != std::string::npos; }

struct Diff {
  double mean = 0, luma = 0;  // mean |a - b| over every value, and over PIL's 'L' of RGB rows
  int max = 0;
};
Diff diff(const dpt::Dataset& a, const dpt::Dataset& b) {
  Diff d;
  for (size_t i = 0; i < a.u8.size(); ++i) {
    const int e = std::abs(int(a.u8[i]) - int(b.u8[i]));
    d.mean += e;
    d.max = std::max(d.max, e);
  }
  d.mean /= double(std::max<size_t>(a.u8.size(), 1));
  if (a.sample_shape[0] != 3) return d;
  const size_t plane = size_t(a.dim / 3);
  auto luma = [&](const dpt::Dataset& x, size_t row, size_t p) {
    const uint8_t* r = &x.u8[row * size_t(x.dim) + p];
    return (r[0] * 19595 + r[plane] * 38470 + r[2 * plane] * 7471 + (1 << 15)) >> 16;
  };
  for (size_t row = 0; row < size_t(a.n); ++row)
    for (size_t p = 0; p < plane; ++p) d.luma += std::abs(luma(a, row, p) - luma(b, row, p));
  d.luma /= double(size_t(a.n) * plane);
  return d;
}

// A whole 1-D dataset of the file, as bytes (uint8) or int64.
template <class T>
std::vector<T> read_1d(const std::string& file, const char* name, hid_t type) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  const hid_t s = H5Dget_space(d);
  std::vector<T> v(size_t(H5Sget_simple_extent_npoints(s)));
  H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Sclose(s);
  H5Dclose(d);
  H5Fclose(f);
  return v;
}

// Opens a copy of `src` named `name` read-write and hands its file id to `edit`.
template <class Edit>
std::string edited_copy(const std::string& src, const std::string& name, Edit edit) {
  const std::string out = (fs::path(src).parent_path() / name).string();
  fs::copy_file(src, out, fs::copy_options::overwrite_existing);
  const hid_t f = H5Fopen(out.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  EXPECT_GE(f, 0);
  edit(f);
  H5Fclose(f);
  return out;
}

void write_1d(hid_t f, const char* name, hid_t type, const void* data) {
  const hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  EXPECT_GE(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
  H5Dclose(d);
}

}  // namespace

// Same rows, labels and classes as the raw import; pixels within JPEG's loss, and closer at Q100
// than at Q50. tests/images_tree.py's photos carry colour stripes a few pixels wide at 64 x 64,
// which 4:2:0 chroma subsampling blurs at any quality (PIL's JPEG of the same crops: mean |diff|
// 4.3 at Q90, 4.0 at Q100); their luma survives. Measured here at 64, Q90: RGB mean |diff| 3.9,
// max 27, luma mean 0.9; gray mean 0.8, max 6.
TEST_F(ImagesJpeg, CloseToTheRawImport) {
  const std::string raw = imported("raw64.h5", "--threads 2", 64);
  const dpt::Dataset r = dpt::load_dataset(raw);
  double mean_at[3] = {0, 0, 0};
  int k = 0;
  for (int q : {50, 90, 100}) {
    const std::string f =
        imported("q" + std::to_string(q) + "-64.h5", "--threads 2 --store jpeg --quality " + std::to_string(q), 64);
    const dpt::DatasetInfo info = dpt::probe_dataset(f);
    EXPECT_EQ(info.encoding, "jpeg");
    EXPECT_EQ(info.jpeg_quality, q);
    const dpt::Dataset j = dpt::load_dataset(f);
    ASSERT_EQ(j.n, r.n);
    EXPECT_EQ(j.labels, r.labels);
    EXPECT_EQ(j.class_names, r.class_names);
    EXPECT_EQ(j.num_classes, r.num_classes);
    EXPECT_EQ(j.sample_shape, (std::vector<int64_t>{3, 64, 64}));
    EXPECT_EQ(j.dim, r.dim);
    EXPECT_TRUE(j.is_u8);
    EXPECT_FLOAT_EQ(j.scale, 1.f / 255.f);
    EXPECT_FLOAT_EQ(j.offset, 0.f);
    const Diff d = diff(j, r);
    std::printf("[ info ] quality %d: %.1f bytes per image (raw %lld), mean |diff| %.3f, max %d, luma mean %.3f\n", q,
                double(info.stored_bytes) / double(info.n), (long long)info.dim, d.mean, d.max, d.luma);
    mean_at[k++] = d.mean;
    if (q == 90) {
      EXPECT_LT(d.mean, 6.0);
      EXPECT_LT(d.max, 60);
      EXPECT_LT(d.luma, 2.0);
    }
  }
  EXPECT_LT(mean_at[2], mean_at[0]) << "quality 100 is not closer to the pixels than quality 50";
  EXPECT_LT(mean_at[2], mean_at[1]);
  // Gray: a one-channel JPEG, as close.
  const dpt::Dataset g = dpt::load_dataset(imported("gray-raw.h5", "--channels 1", 64));
  const std::string gj = imported("gray.h5", "--channels 1 --store jpeg", 64);
  const dpt::Dataset j = dpt::load_dataset(gj);
  EXPECT_EQ(j.sample_shape, (std::vector<int64_t>{1, 64, 64}));
  const Diff d = diff(j, g);
  std::printf("[ info ] gray quality 90: mean |diff| %.3f, max %d\n", d.mean, d.max);
  EXPECT_LT(d.mean, 2.0);
  EXPECT_LT(d.max, 30);
  // The validation output is stored the same way; info says how.
  Outcome v = dpdata("images --folder " + photos() + " --out " + path("split.h5") + " --val-fraction 0.25 --val-out " +
                     path("split-val.h5") + " --size 32 --store jpeg --quality 80");
  ASSERT_EQ(v.code, 0) << v.out;
  EXPECT_TRUE(has(v.out, "stored as JPEG at quality 80")) << v.out;
  EXPECT_EQ(dpt::probe_dataset(path("split-val.h5")).encoding, "jpeg");
  EXPECT_EQ(dpt::probe_dataset(path("split-val.h5")).jpeg_quality, 80);
  Outcome info = dpdata("info " + gj);
  EXPECT_EQ(info.code, 0) << info.out;
  EXPECT_TRUE(has(info.out, "pixels stored as JPEG (/jpeg, quality 90)")) << info.out;
}

// --threads 1 and 4 write the same bytes.
TEST_F(ImagesJpeg, ThreadsGiveTheSameBytes) {
  const std::string a = imported("t1.h5", "--threads 1 --store jpeg"), b = imported("t4.h5", "--threads 4 --store jpeg");
  const auto ja = read_1d<uint8_t>(a, "jpeg", H5T_NATIVE_UINT8), jb = read_1d<uint8_t>(b, "jpeg", H5T_NATIVE_UINT8);
  const auto oa = read_1d<int64_t>(a, "jpeg_offsets", H5T_NATIVE_INT64),
             ob = read_1d<int64_t>(b, "jpeg_offsets", H5T_NATIVE_INT64);
  EXPECT_EQ(oa.size(), 25u);
  EXPECT_GT(ja.size(), 24u * 300);
  EXPECT_TRUE(ja == jb);
  EXPECT_EQ(oa, ob);
  EXPECT_EQ(size_t(oa.back()), ja.size());
}

// load_dataset, load_rows (repeats, any order), read_rows, JpegRows (1 and 3 threads), the
// evaluation shards and TrainRows' stream give the same rows bit for bit.
TEST_F(ImagesJpeg, EveryReaderGivesTheSameRows) {
  using namespace dpt;
  const std::string f = imported("q90.h5", "--threads 2 --store jpeg --quality 90");
  const Dataset all = load_dataset(f);
  const size_t dim = size_t(all.dim);
  auto expect_rows = [&](const Dataset& d, const std::vector<int64_t>& rows, const char* what) {
    ASSERT_EQ(d.n, int64_t(rows.size())) << what;
    ASSERT_EQ(d.u8.size(), rows.size() * dim) << what;
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ(d.labels[i], all.labels[size_t(rows[i])]) << what << " row " << rows[i];
      EXPECT_EQ(0, std::memcmp(&d.u8[i * dim], &all.u8[size_t(rows[i]) * dim], dim)) << what << " row " << rows[i];
    }
  };
  const std::vector<int64_t> rows{17, 3, 3, 0, 23, 4, 5, 6, 17, 11, 12, 1};
  expect_rows(load_rows(f, rows), rows, "load_rows");
  data_internal::Opened o = data_internal::open_checked(f, /*whole=*/false);
  expect_rows(data_internal::read_rows(f, o, rows), rows, "read_rows");
  data_internal::JpegRows jr(f, o);
  ASSERT_TRUE(jr.ok());
  data_internal::RawRows rr(f, o);
  EXPECT_FALSE(rr.ok()) << "RawRows on a jpeg file";
  expect_rows(jr.read(rows, 1), rows, "JpegRows, 1 thread");
  expect_rows(jr.read(rows, 3), rows, "JpegRows, 3 threads");
  SplitMix64 g(5);
  std::vector<int64_t> random(40);
  for (int64_t& r : random) r = int64_t(g.below(uint64_t(all.n)));
  const Dataset a = jr.read(random, 4), b = data_internal::read_rows(f, o, random);
  EXPECT_TRUE(a.u8 == b.u8 && a.labels == b.labels) << "JpegRows against read_rows, random rows";
  expect_rows(a, random, "JpegRows, random rows");
  for (int r = 0; r < 3; ++r) {
    const Dataset e = load_eval_shard(f, r, 3);
    std::vector<int64_t> want;
    for (int64_t i = e.first_row; i < e.first_row + e.n; ++i) want.push_back(i);
    expect_rows(e, want, "load_eval_shard");
  }
  // data.read = stream: micro-batches of 4 rows, rank 1 of 2, two epochs, shuffled.
  RankOrder ro;
  ro.rank = 1;
  ro.world = 2;
  ro.batch = 4;
  TrainRows tr(f, ro, /*depth=*/2, /*epochs=*/2);
  for (int64_t e = 0; e < 2; ++e) {
    tr.start_epoch(e);
    const std::vector<int64_t> order = epoch_order(all.n, true, ro.seed, e);
    for (int64_t k = 0; k < all.n / ro.global_batch(); ++k) {
      const Dataset& d = tr.micro_batch(e, k, 0);
      const int64_t at = batch_offset(k, 0, ro.rank, ro.batch, ro.world, 1);
      expect_rows(d, std::vector<int64_t>(order.begin() + at, order.begin() + at + ro.batch), "stream");
    }
  }
}

// dptrain trains alike from all, shard and stream on a jpeg file (2 CPU ranks, the same losses).
TEST_F(ImagesJpeg, DptrainTrainsAlikeFromEveryRead) {
  const std::string f = imported("q90.h5", "--threads 2 --store jpeg --quality 90");
  std::vector<std::string> losses;
  for (const char* read : {"all", "shard", "stream"}) {
    const std::string m = path(std::string("m-") + read + ".jsonl");
    Outcome r = cli::sh(cli::mpirun(2) + DPT_BINARY_DIR + "/dptrain --data.train " + f + " --data.test " + f +
                            " --data.read " + read + " --model.layers 'conv(4,3,pad=1) relu maxpool(2) flatten linear(4)'"
                            " --train.epochs 2 --train.batch_per_rank 4 --train.optimizer adam --train.lr 0.01"
                            " --log.every_steps 1 --log.metrics " + m, 120);
    ASSERT_EQ(r.code, 0) << read << ":\n" << r.out;
    std::string text = cli::slurp(m), got;
    static const std::regex loss("\"loss\": [-0-9.e]+");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), loss); it != std::sregex_iterator(); ++it)
      got += it->str() + "\n";
    EXPECT_GE(std::count(got.begin(), got.end(), '\n'), 6) << text;
    losses.push_back(got);
  }
  EXPECT_EQ(losses[1], losses[0]) << "shard against all";
  EXPECT_EQ(losses[2], losses[0]) << "stream against all";
}

// A rank streaming JPEG rows decodes them on the cores it may run on: bound to fewer than 4 of
// the node's (mpirun binds ranks to cores by default), the log says so and how to give it more;
// free to use all of them, it says nothing. Needs 2 cores (CI's machine has 2).
TEST_F(ImagesJpeg, StreamingOnFewCoresIsNamed) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs 2 cores, this machine has 1";
  const std::string f = imported("q90.h5", "--threads 2 --store jpeg --quality 90");
  auto train = [&](const std::string& prefix) {
    return cli::sh(prefix + DPT_BINARY_DIR + "/dptrain --data.train " + f + " --data.test " + f +
                       " --data.read stream --model.layers 'flatten linear(4)' --train.epochs 1"
                       " --train.batch_per_rank 4",
                   120);
  };
  Outcome r = train("taskset -c 0 ");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("holds JPEG rows, decoded on this rank's cores, and it may run on 1 of the node's " +
                       std::to_string(std::thread::hardware_concurrency())),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("mpirun --bind-to none"), std::string::npos) << r.out;
  r = train("");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("decoded on this rank's cores"), std::string::npos) << r.out;
}

// A row whose bytes are damaged: every reader names it (file, /jpeg row r, why), dpdata validate
// and dptrain exit 2; nothing crashes.
TEST_F(ImagesJpeg, ADamagedRowIsNamed) {
  const std::string f = imported("q90.h5", "--threads 2 --store jpeg --quality 90");
  const auto off = read_1d<int64_t>(f, "jpeg_offsets", H5T_NATIVE_INT64);
  auto damage = [&](const std::string& name, int64_t row, size_t at, size_t count) {
    return edited_copy(f, name, [&](hid_t h) {
      auto bytes = read_1d<uint8_t>(f, "jpeg", H5T_NATIVE_UINT8);
      for (size_t i = 0; i < count; ++i) bytes[size_t(off[size_t(row)]) + at + i] ^= 0xA5;
      write_1d(h, "jpeg", H5T_NATIVE_UINT8, bytes.data());
    });
  };
  // Row 7's first bytes (its SOI marker and header): not a JPEG.
  const std::string head = damage("bad-head.h5", 7, 0, 16);
  // Row 13's last bytes (its EOI marker): libjpeg warns of a premature end, an error here.
  const std::string tail = damage("bad-tail.h5", 13, size_t(off[14] - off[13]) - 2, 2);
  for (const auto& [file, row] : {std::pair{head, 7}, std::pair{tail, 13}}) {
    const std::string want = "dataset file '" + file + "': /jpeg row " + std::to_string(row) + ": corrupt JPEG data";
    try {
      dpt::load_dataset(file);
      ADD_FAILURE() << "load_dataset read " << file;
    } catch (const dpt::InputError& e) {
      EXPECT_TRUE(has(e.what(), want)) << e.what();
    }
    try {
      dpt::load_rows(file, {1, row, 2});
      ADD_FAILURE() << "load_rows read " << file;
    } catch (const dpt::InputError& e) {
      EXPECT_TRUE(has(e.what(), want)) << e.what();
    }
    dpt::data_internal::Opened o = dpt::data_internal::open_checked(file, false);
    dpt::data_internal::JpegRows jr(file, o);
    ASSERT_TRUE(jr.ok());
    try {
      jr.read({0, row, 3, row}, 2);
      ADD_FAILURE() << "JpegRows read " << file;
    } catch (const dpt::InputError& e) {
      EXPECT_TRUE(has(e.what(), want)) << e.what();
    }
    EXPECT_NO_THROW(jr.read({0, 1, 2}, 2)) << "the other rows still read";
    Outcome v = dpdata("validate " + file);
    EXPECT_EQ(v.code, 2) << v.out;
    EXPECT_TRUE(has(v.out, want)) << v.out;
  }
  for (const char* read : {"all", "stream"}) {
    Outcome r = cli::sh(cli::mpirun(2) + DPT_BINARY_DIR + "/dptrain --data.train " + head + " --data.read " + read +
                            " --model.layers 'conv(4,3,pad=1) relu maxpool(2) flatten linear(4)' --train.epochs 1"
                            " --train.batch_per_rank 4",
                        120);
    EXPECT_EQ(r.code, 2) << read << ":\n" << r.out;
    EXPECT_TRUE(has(r.out, "/jpeg row 7: corrupt JPEG data")) << read << ":\n" << r.out;
    EXPECT_FALSE(has(r.out, "Segmentation") || has(r.out, "HDF5-DIAG")) << r.out;
  }
}

// Offsets that do not describe /jpeg are refused when the file is opened, naming what is wrong.
TEST_F(ImagesJpeg, BadOffsetsAreRefusedAtOpen) {
  const std::string f = imported("q90.h5", "--threads 2 --store jpeg --quality 90");
  auto off = read_1d<int64_t>(f, "jpeg_offsets", H5T_NATIVE_INT64);
  auto with_offsets = [&](const std::string& name, std::vector<int64_t> v) {
    return edited_copy(f, name, [&](hid_t h) { write_1d(h, "jpeg_offsets", H5T_NATIVE_INT64, v.data()); });
  };
  std::vector<int64_t> swapped(off);
  std::swap(swapped[5], swapped[6]);
  std::vector<int64_t> short_end(off);
  short_end.back() -= 1;
  std::vector<int64_t> nonzero(off);
  nonzero[0] = 3;
  const std::string fewer = edited_copy(f, "fewer.h5", [&](hid_t h) {  // N entries instead of N + 1
    H5Ldelete(h, "jpeg_offsets", H5P_DEFAULT);
    const hsize_t n = off.size() - 1;
    const hid_t s = H5Screate_simple(1, &n, nullptr);
    const hid_t d = H5Dcreate2(h, "jpeg_offsets", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, off.data());
    H5Dclose(d);
    H5Sclose(s);
  });
  const std::pair<std::string, std::string> cases[] = {
      {with_offsets("swapped.h5", swapped), "/jpeg_offsets: entry 6 (" + std::to_string(off[5]) +
                                                ") is less than entry 5 (" + std::to_string(off[6]) + ")"},
      {with_offsets("short.h5", short_end), "/jpeg_offsets: the last entry is " + std::to_string(off.back() - 1) +
                                                " but /jpeg holds " + std::to_string(off.back()) + " bytes"},
      {with_offsets("nonzero.h5", nonzero), "/jpeg_offsets: entry 0 is 3; expected 0"},
      {fewer, "/jpeg_offsets: has 24 entries but /labels has 24 rows; expected 25 (N + 1)"},
  };
  for (const auto& [file, want] : cases) {
    try {
      dpt::probe_dataset(file);
      ADD_FAILURE() << "opened " << file;
    } catch (const dpt::InputError& e) {
      EXPECT_TRUE(has(e.what(), "dataset file '" + file + "': " + want)) << e.what();
    }
    Outcome v = dpdata("validate " + file);
    EXPECT_EQ(v.code, 2) << v.out;
    EXPECT_TRUE(has(v.out, want)) << v.out;
  }
}

// --quality goes with --store jpeg and lies in [1, 100]; --store is raw or jpeg: exit 2, no file.
TEST_F(ImagesJpeg, OptionErrors) {
  const std::string out = path("never.h5");
  const std::pair<std::string, std::string> cases[] = {
      {"--quality 80", "--quality goes with --store jpeg"},
      {"--store raw --quality 80", "--quality goes with --store jpeg"},
      {"--store jpeg --quality 0", "--quality 0 is outside [1, 100]"},
      {"--store jpeg --quality 101", "--quality 101 is outside [1, 100]"},
      {"--store png", "--store must be raw"},
  };
  for (const auto& [args, want] : cases) {
    Outcome r = dpdata("images --folder " + photos() + " --out " + out + " --size 32 " + args);
    EXPECT_EQ(r.code, 2) << args << ":\n" << r.out;
    EXPECT_TRUE(has(r.out, want)) << args << ":\n" << r.out;
    EXPECT_FALSE(fs::exists(out));
  }
}

// Bytes per image and decode time per image of 256 x 256 JPEGs (printed, not asserted).
TEST_F(ImagesJpeg, Measure) {
  const std::string f = path("m256.h5");
  Outcome r = dpdata("images --folder " + photos() + " --out " + f + " --size 256 --store jpeg");
  ASSERT_EQ(r.code, 0) << r.out;
  dpt::data_internal::Opened o = dpt::data_internal::open_checked(f, false);
  dpt::data_internal::JpegRows jr(f, o);
  std::vector<int64_t> rows;
  for (int rep = 0; rep < 4; ++rep)
    for (int64_t i = 0; i < o.info.n; ++i) rows.push_back(i);
  dpt::Dataset d;
  jr.read(rows, 1, d);  // warm: the file in the page cache, d's memory touched
  auto t0 = std::chrono::steady_clock::now();
  jr.read(rows, 1, d);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t0 = std::chrono::steady_clock::now();
  jr.read(rows, 2, d);
  const double s2 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ info ] 256x256 quality 90: %.0f bytes per image; JpegRows reads and decodes %.2f ms per image on 1 "
              "thread, %.2f ms on 2\n",
              double(o.info.stored_bytes) / double(o.info.n), 1e3 * s / double(rows.size()),
              1e3 * s2 / double(rows.size()));
  EXPECT_EQ(d.n, int64_t(rows.size()));
}

// A jpeg file written by another tool: /jpeg contiguous (JpegRows reads it at its offset), in
// 1000-byte chunks (rows span two or more chunks), or deflate-compressed in chunks (JpegRows
// declines; read_rows and the stream read through HDF5).
TEST_F(ImagesJpeg, OtherLayoutsOfJpegRead) {
  using namespace dpt;
  const std::string f = imported("q90.h5", "--threads 2 --store jpeg --quality 90");
  const Dataset all = load_dataset(f);
  const auto bytes = read_1d<uint8_t>(f, "jpeg", H5T_NATIVE_UINT8);
  const auto off = read_1d<int64_t>(f, "jpeg_offsets", H5T_NATIVE_INT64);
  for (const char* layout : {"contiguous", "chunked", "deflate"}) {
    const bool deflate = layout == std::string("deflate");
    const std::string out = path(std::string(layout) + ".h5");
    const hid_t h = H5Fcreate(out.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t n = bytes.size(), no = off.size(), nl = all.labels.size(), three = 3, chunk = 1000;
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (layout != std::string("contiguous")) H5Pset_chunk(dcpl, 1, &chunk);
    if (deflate) H5Pset_deflate(dcpl, 4);
    hid_t s = H5Screate_simple(1, &n, nullptr);
    const hid_t d = H5Dcreate2(h, "jpeg", H5T_STD_U8LE, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data());
    H5Sclose(s);
    s = H5Screate_simple(1, &three, nullptr);
    const int64_t shape[3] = {3, 32, 32};
    hid_t a = H5Acreate2(d, "shape", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, shape);
    H5Aclose(a);
    H5Sclose(s);
    s = H5Screate(H5S_SCALAR);
    const float scale = 1.f / 255.f;
    a = H5Acreate2(d, "scale", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_FLOAT, &scale);
    H5Aclose(a);
    const int32_t classes = all.num_classes;
    a = H5Acreate2(h, "num_classes", H5T_STD_I32LE, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT32, &classes);
    H5Aclose(a);
    H5Sclose(s);
    H5Dclose(d);
    H5Pclose(dcpl);
    s = H5Screate_simple(1, &no, nullptr);
    hid_t o = H5Dcreate2(h, "jpeg_offsets", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(o, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, off.data());
    H5Dclose(o);
    H5Sclose(s);
    s = H5Screate_simple(1, &nl, nullptr);
    o = H5Dcreate2(h, "labels", H5T_STD_I32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(o, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, all.labels.data());
    H5Dclose(o);
    H5Sclose(s);
    H5Fclose(h);

    const Dataset again = load_dataset(out);
    EXPECT_TRUE(again.u8 == all.u8 && again.labels == all.labels) << out;
    const std::vector<int64_t> rows{5, 0, 23, 5, 9, 1, 2, 3, 4, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22};
    data_internal::Opened op = data_internal::open_checked(out, false);
    const Dataset via_hdf5 = data_internal::read_rows(out, op, rows);
    data_internal::JpegRows jr(out, op);
    EXPECT_EQ(jr.ok(), !deflate) << out;
    if (jr.ok()) {
      const Dataset via_pread = jr.read(rows, 2);
      EXPECT_TRUE(via_pread.u8 == via_hdf5.u8 && via_pread.labels == via_hdf5.labels) << out;
    }
    for (size_t i = 0; i < rows.size(); ++i)
      EXPECT_EQ(0, std::memcmp(&via_hdf5.u8[i * size_t(all.dim)], &all.u8[size_t(rows[i]) * size_t(all.dim)],
                               size_t(all.dim)))
          << out << " row " << rows[i];
    RankOrder ro;
    ro.batch = 4;
    TrainRows tr(out, ro, 2, 1);
    tr.start_epoch(0);
    const std::vector<int64_t> order = epoch_order(all.n, true, ro.seed, 0);
    const Dataset& mb = tr.micro_batch(0, 1, 0);
    for (size_t i = 0; i < 4; ++i)
      EXPECT_EQ(0, std::memcmp(&mb.u8[i * size_t(all.dim)], &all.u8[size_t(order[4 + i]) * size_t(all.dim)],
                               size_t(all.dim)))
          << out << " stream row " << order[4 + i];
  }
}
