// Data layer: HDF5 round trips, files in h5py's style written with the raw C API, a corpus of
// malformed files (each must give InputError naming the dataset and the problem, never a crash),
// idx import and the synthetic generators. The data order and partial reads: test_data_order.cpp.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "dpt/check.hpp"
#include "dpt/data.hpp"
#include "data_util.hpp"

namespace {
using namespace dpt::data_test;

// Loading (and probing) must throw InputError whose message names the file and every word.
void expect_rejected(const std::string& path, const std::vector<std::string>& words) {
  for (int probe = 0; probe < 2; ++probe) {
    try {
      if (probe) dpt::probe_dataset(path);
      else dpt::load_dataset(path);
      ADD_FAILURE() << path << " loaded; expected an error mentioning " << words[0];
    } catch (const dpt::InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
      for (const auto& w : words)
        EXPECT_NE(msg.find(w), std::string::npos) << "message lacks '" << w << "': " << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << path << ": expected InputError, got: " << e.what();
    }
  }
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<char>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(b.data(), std::streamsize(b.size()));
}

// ---------------------------------------------------------------- round trips

TEST(DataFile, RoundTripU8AndGather) {
  TempDir tmp;
  const auto ds = small_dataset(true, 37, {1, 3, 13}, 5);  // dim 39: vector body and a tail
  const std::string p = tmp.file("u8.h5");
  dpt::write_dataset(p, ds);
  for (const auto& e : fs::directory_iterator(tmp.path()))
    EXPECT_EQ(e.path().filename(), "u8.h5") << "left a temporary file behind";
  const auto back = dpt::load_dataset(p);
  EXPECT_EQ(back.n, 37);
  EXPECT_EQ(back.dim, 39);
  EXPECT_EQ(back.sample_shape, (std::vector<int64_t>{1, 3, 13}));
  EXPECT_TRUE(back.is_u8);
  EXPECT_EQ(back.u8, ds.u8);
  EXPECT_EQ(back.labels, ds.labels);
  EXPECT_EQ(back.num_classes, 5);
  EXPECT_EQ(back.scale, 0.25f);
  EXPECT_EQ(back.offset, -3.f);
  const auto info = dpt::probe_dataset(p);
  EXPECT_EQ(info.feature_type, "uint8");
  EXPECT_EQ(info.label_type, "int32");

  const int64_t rows[] = {36, 0, 5};
  std::vector<float> x(3 * 39);
  std::vector<int32_t> y(3);
  back.gather(rows, 3, x.data(), y.data());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(y[size_t(i)], ds.labels[size_t(rows[i])]);
    for (int j = 0; j < 39; ++j)
      EXPECT_FLOAT_EQ(x[size_t(i * 39 + j)], float(ds.u8[size_t(rows[i] * 39 + j)]) * 0.25f - 3.f);
  }
  const int64_t bad_row = 37;
  EXPECT_THROW(back.gather(&bad_row, 1, x.data(), y.data()), dpt::Error);
}

TEST(DataFile, RoundTripF32WithScaleOffset) {
  TempDir tmp;
  const auto ds = small_dataset(false, 20, {40}, 3);
  const std::string p = tmp.file("f32.h5");
  dpt::write_dataset(p, ds);
  dpt::write_dataset(p, ds);  // overwriting an existing file goes through the same rename
  const auto back = dpt::load_dataset(p);
  EXPECT_FALSE(back.is_u8);
  EXPECT_EQ(back.f32, ds.f32);
  EXPECT_EQ(back.sample_shape, std::vector<int64_t>{40});
  const int64_t rows[] = {19, 3};
  std::vector<float> x(2 * 40);
  std::vector<int32_t> y(2);
  back.gather(rows, 2, x.data(), y.data());
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 40; ++j)
      EXPECT_FLOAT_EQ(x[size_t(i * 40 + j)], ds.f32[size_t(rows[i] * 40 + j)] * 0.25f - 3.f);
}

TEST(DataFile, WriteIntoMissingDirectoryFails) {
  TempDir tmp;
  EXPECT_THROW(dpt::write_dataset(tmp.file("no/such/dir/x.h5"), small_dataset(true, 2, {3}, 2)),
               dpt::Error);
}

TEST(DataFile, H5pyStyleChunkedGzipInt64Loads) {
  TempDir tmp;
  Spec s;
  s.feature_dims = {50, 1, 28, 28};
  s.chunk = {7, 1, 28, 28};  // edge chunk is partial, as h5py's auto-chunking often leaves it
  s.gzip = true;
  s.label_dims = {50};
  s.label_values = {9, 0, 3, 7};
  s.num_classes_value = 10;
  s.scale_offset = true;
  const std::string p = tmp.file("h5py.h5");
  write_spec(p, s);
  const auto ds = dpt::load_dataset(p);
  EXPECT_EQ(ds.n, 50);
  EXPECT_EQ(ds.dim, 784);
  EXPECT_EQ(ds.sample_shape, (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(ds.num_classes, 10);
  EXPECT_FLOAT_EQ(ds.scale, 0.5f);
  EXPECT_FLOAT_EQ(ds.offset, -1.f);
  EXPECT_EQ(dpt::probe_dataset(p).label_type, "int64");
  for (size_t i = 0; i < ds.u8.size(); i += 997) EXPECT_EQ(ds.u8[i], i % 251);
  EXPECT_EQ(ds.labels[5], 0);
  EXPECT_EQ(ds.labels[3], 7);
}

TEST(DataFile, BigEndianTypesLoad) {
  TempDir tmp;
  Spec s;
  s.feature_type = H5T_IEEE_F32BE;
  s.label_type = H5T_STD_I32BE;
  const std::string p = tmp.file("be.h5");
  write_spec(p, s);
  const auto ds = dpt::load_dataset(p);
  EXPECT_FALSE(ds.is_u8);
  EXPECT_EQ(ds.f32[5], 5.f);
  EXPECT_EQ(ds.labels[2], 2);
}

// Labels as numpy and torchvision often store them: 8- and 16-bit, signed or not, converted to
// int32 in memory; the range check stays, naming the row of a negative or too large label.
TEST(DataFile, NarrowAndUnsignedLabelTypesLoad) {
  TempDir tmp;
  const struct {
    hid_t type;
    const char* name;
  } types[] = {{H5T_STD_U8LE, "uint8"},   {H5T_STD_I8LE, "int8"},    {H5T_STD_I16LE, "int16"},
               {H5T_STD_U16LE, "uint16"}, {H5T_STD_I16BE, "int16"},  {H5T_STD_U32LE, "uint32"}};
  for (const auto& t : types) {
    SCOPED_TRACE(t.name);
    Spec s;
    s.label_type = t.type;
    const std::string p = tmp.file(std::string(t.name) + ".h5");
    write_spec(p, s);
    const auto ds = dpt::load_dataset(p);
    EXPECT_EQ(ds.labels, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 0, 1}));
    EXPECT_EQ(dpt::probe_dataset(p).label_type, t.name);
    const auto part = dpt::load_rows(p, {7, 2});
    EXPECT_EQ(part.labels, (std::vector<int32_t>{1, 2}));
    // 200 fits uint8 and int16 alike, and is outside [0, 3).
    s.label_values = {0, 1, 2, 0, 1, 2, 0, 1};
    s.label_values[6] = t.type == H5T_STD_I8LE ? 100 : 200;
    write_spec(p, s);
    expect_rejected(p, {"/labels", "row 6", s.label_values[6] == 100 ? "label 100" : "label 200",
                        "num_classes = 3"});
  }
  for (hid_t signed_type : {H5T_STD_I8LE, H5T_STD_I16LE}) {
    Spec s;
    s.label_type = signed_type;
    s.label_values = {0, 1, 2, 0, -5, 2, 0, 1};
    const std::string p = tmp.file("negative.h5");
    write_spec(p, s);
    expect_rejected(p, {"/labels", "row 4", "label -5"});
  }
  Spec wide;
  wide.label_type = H5T_STD_U64LE;  // HDF5 would clamp values above INT64_MAX: refused
  const std::string p = tmp.file("u64.h5");
  write_spec(p, wide);
  expect_rejected(p, {"/labels", "uint64", "integer"});
}

// N x H x W x C (channels last) image files are refused with the layout dptrain wants and how to
// transpose; N x C x H x W files with C in {1, 3, 4}, or any whose second dimension is too, load.
TEST(DataFile, ChannelsLastImagesAreRefusedWithTheTranspose) {
  TempDir tmp;
  for (std::vector<hsize_t> nhwc : {std::vector<hsize_t>{6, 28, 28, 1}, std::vector<hsize_t>{6, 32, 32, 3},
                                    std::vector<hsize_t>{6, 8, 5, 4}}) {
    Spec s;
    s.feature_dims = nhwc;
    s.label_dims = {6};
    const std::string p = tmp.file("nhwc.h5");
    write_spec(p, s);
    const std::string want = "(6, " + std::to_string(nhwc[3]) + ", " + std::to_string(nhwc[1]) + ", " +
                             std::to_string(nhwc[2]) + ")";
    expect_rejected(p, {"/features", "channels last", "NHWC", "N x C x H x W", want, ".transpose(0, 3, 1, 2)",
                        "last dimension is 1, 3 or 4 and the second is not"});
    EXPECT_THROW(dpt::load_rows(p, {0}), dpt::InputError);
  }
  for (std::vector<hsize_t> nchw : {std::vector<hsize_t>{6, 1, 28, 28}, std::vector<hsize_t>{6, 3, 8, 4},
                                    std::vector<hsize_t>{6, 4, 4, 3}, std::vector<hsize_t>{6, 16, 8, 8},
                                    std::vector<hsize_t>{6, 28, 28}, std::vector<hsize_t>{6, 5, 5, 5, 3}}) {
    Spec s;
    s.feature_dims = nchw;
    s.label_dims = {6};
    const std::string p = tmp.file("nchw.h5");
    write_spec(p, s);
    EXPECT_NO_THROW(dpt::load_dataset(p)) << nchw[1] << " x " << nchw[2];
  }
}

// ---------------------------------------------------------------- malformed files

struct BadCase {
  const char* name;
  void (*mutate)(Spec&);
  std::vector<std::string> words;
};

TEST(DataFile, MalformedFilesAreRejectedWithAReason) {
  const BadCase cases[] = {
      {"no_labels", [](Spec& s) { s.labels = false; }, {"/labels", "missing"}},
      {"no_features", [](Spec& s) { s.features = false; }, {"/features", "missing"}},
      {"labels_rank2", [](Spec& s) { s.label_dims = {8, 1}; }, {"/labels", "rank 2"}},
      {"features_rank1", [](Spec& s) { s.feature_dims = {8}; }, {"/features", "rank 1"}},
      {"features_f64", [](Spec& s) { s.feature_type = H5T_IEEE_F64LE; },
       {"/features", "float64", "x.astype(np.float32)", "uint8 with a scale attribute"}},
      {"features_i16", [](Spec& s) { s.feature_type = H5T_STD_I16LE; }, {"/features", "int16"}},
      {"labels_float", [](Spec& s) { s.label_type = H5T_IEEE_F32LE; }, {"/labels", "float32", "integer type"}},
      {"label_negative", [](Spec& s) { s.label_values = {0, 1, 2, -1}; },
       {"/labels", "row 3", "-1"}},
      {"label_too_big", [](Spec& s) { s.label_values = {0, 1, 2, 0, 1, 3}; },
       {"/labels", "row 5", "label 3"}},
      {"n_mismatch", [](Spec& s) { s.label_dims = {7}; }, {"/labels", "7 rows", "8"}},
      {"n_zero", [](Spec& s) { s.feature_dims = {0, 4}; s.label_dims = {0}; },
       {"/features", "N = 0"}},
      {"no_num_classes", [](Spec& s) { s.num_classes = false; }, {"num_classes", "missing"}},
      {"num_classes_zero", [](Spec& s) { s.num_classes_value = 0; }, {"num_classes", "outside"}},
      {"num_classes_huge", [](Spec& s) { s.num_classes_value = int64_t(1) << 40; },
       {"num_classes", "outside"}},
      {"num_classes_float", [](Spec& s) { s.num_classes_type = H5T_IEEE_F64LE; },
       {"num_classes", "float64"}},
      {"absurd_dims_no_storage",
       [](Spec& s) { s.feature_dims = {200000, 784}; s.write_feature_data = false; },
       {"/features", "bytes"}},
      {"absurd_dims_over_memory",
       [](Spec& s) { s.feature_dims = {hsize_t(1) << 36, 784}; s.write_feature_data = false; },
       {"/features", "memory"}},
      {"dims_overflow",
       [](Spec& s) {
         s.feature_dims = {hsize_t(1) << 40, hsize_t(1) << 40};
         s.chunk = {1, 1024};
         s.write_feature_data = false;
       },
       {"/features", "overflow"}},
      {"compressed_absurd",
       [](Spec& s) {
         s.feature_dims = {400000, 784};
         s.chunk = {1000, 784};
         s.gzip = true;
         s.write_feature_data = false;
       },
       {"/features", "compressed"}},
  };
  TempDir tmp;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Spec s;
    c.mutate(s);
    const std::string p = tmp.file(std::string(c.name) + ".h5");
    write_spec(p, s);
    expect_rejected(p, c.words);
  }
}

// A crafted chunk whose gzip stream is valid but shorter than the chunk: HDF5 1.10 would read
// past its buffer, so the loader must inflate and refuse it first.
TEST(DataFile, ChunkThatInflatesShortIsRejected) {
  TempDir tmp;
  Spec s;
  s.feature_dims = {8, 4};
  s.chunk = {8, 4};
  s.gzip = true;
  s.write_feature_data = false;
  const std::string p = tmp.file("short_chunk.h5");
  write_spec(p, s);
  std::vector<unsigned char> small(8, 1), packed(64);
  uLongf packed_len = packed.size();
  ASSERT_EQ(compress(packed.data(), &packed_len, small.data(), small.size()), Z_OK);
  hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, "features", H5P_DEFAULT);
  const hsize_t origin[2] = {0, 0};
  ASSERT_GE(H5Dwrite_chunk(d, H5P_DEFAULT, 0, origin, size_t(packed_len), packed.data()), 0);
  H5Dclose(d);
  H5Fclose(f);
  expect_rejected(p, {"/features", "chunk", "inflates to 8 of 32"});
}

TEST(DataFile, NotHdf5MissingAndEmptyFilesAreRejected) {
  TempDir tmp;
  const std::string text = tmp.file("notes.h5");
  write_bytes(text, std::vector<char>(4096, 'x'));
  expect_rejected(text, {"not an HDF5 file"});
  const std::string empty = tmp.file("empty.h5");
  write_bytes(empty, {});
  expect_rejected(empty, {"not an HDF5 file"});
  expect_rejected(tmp.file("missing.h5"), {"cannot open"});
  expect_rejected(tmp.path(), {"not a regular file"});
}

TEST(DataFile, TruncatedFileIsRejected) {
  TempDir tmp;
  for (bool u8 : {false, true}) {
    const std::string good = tmp.file("good.h5"), cut = tmp.file("cut.h5");
    dpt::write_dataset(good, small_dataset(u8, 3000, {64}, 4));
    auto bytes = read_bytes(good);
    bytes.resize(bytes.size() / 2);
    write_bytes(cut, bytes);
    expect_rejected(cut, {});
  }
}

// A flipped byte anywhere must end in valid data or InputError; a crash fails the whole binary.
TEST(DataFile, BitFlippedFilesNeverCrash) {
  TempDir tmp;
  for (bool u8 : {false, true}) {  // contiguous float32, chunked gzip uint8
    const std::string good = tmp.file("good.h5"), bad = tmp.file("flipped.h5");
    dpt::write_dataset(good, small_dataset(u8, 500, {32}, 4));
    const auto bytes = read_bytes(good);
    int loaded = 0, rejected = 0;
    std::vector<size_t> positions{bytes.size() / 2, bytes.size() / 2 + 1};
    for (size_t p = 0; p < bytes.size(); p += bytes.size() / 97 + 1) positions.push_back(p);
    for (size_t pos : positions) {
      auto b = bytes;
      b[pos] = char(b[pos] ^ 0x5a);
      write_bytes(bad, b);
      try {
        const auto ds = dpt::load_dataset(bad);
        EXPECT_EQ(ds.labels.size(), size_t(ds.n));
        for (int32_t y : ds.labels) ASSERT_TRUE(y >= 0 && y < ds.num_classes);
        ++loaded;
      } catch (const dpt::InputError&) {
        ++rejected;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "flip at byte " << pos << ": not an InputError: " << e.what();
      }
    }
    EXPECT_GT(loaded + rejected, 90);
  }
}

// ---------------------------------------------------------------- idx import

std::vector<unsigned char> idx_header(uint32_t magic, std::vector<uint32_t> dims) {
  std::vector<unsigned char> h;
  auto be = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) h.push_back((unsigned char)(v >> s));
  };
  be(magic);
  for (uint32_t d : dims) be(d);
  return h;
}

void write_gz(const std::string& path, const std::vector<unsigned char>& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, b.data(), unsigned(b.size())), int(b.size()));
  gzclose(f);
}

void write_plain(const std::string& path, const std::vector<unsigned char>& b) {
  write_bytes(path, std::vector<char>(b.begin(), b.end()));
}

struct IdxFiles {
  std::vector<unsigned char> images, labels;
};

IdxFiles small_idx(uint32_t n = 5) {
  IdxFiles f{idx_header(0x803, {n, 3, 4}), idx_header(0x801, {n})};
  for (uint32_t i = 0; i < n * 12; ++i) f.images.push_back((unsigned char)(i * 11));
  for (uint32_t i = 0; i < n; ++i) f.labels.push_back((unsigned char)(9 - i % 10));
  return f;
}

TEST(Idx, ImportsGzAndPlainFiles) {
  TempDir tmp;
  const auto f = small_idx();
  write_gz(tmp.file("img.gz"), f.images);
  write_plain(tmp.file("lab"), f.labels);
  const auto ds = dpt::import_idx(tmp.file("img.gz"), tmp.file("lab"));
  EXPECT_EQ(ds.n, 5);
  EXPECT_EQ(ds.dim, 12);
  EXPECT_EQ(ds.sample_shape, (std::vector<int64_t>{1, 3, 4}));
  EXPECT_TRUE(ds.is_u8);
  EXPECT_EQ(ds.num_classes, 10);
  EXPECT_FLOAT_EQ(ds.scale, 1.f / 255.f);
  EXPECT_EQ(ds.u8, std::vector<uint8_t>(f.images.begin() + 16, f.images.end()));
  EXPECT_EQ(ds.labels, (std::vector<int32_t>{9, 8, 7, 6, 5}));
  dpt::write_dataset(tmp.file("idx.h5"), ds);
  EXPECT_EQ(dpt::load_dataset(tmp.file("idx.h5")).u8, ds.u8);
}

void expect_idx_rejected(const std::string& images, const std::string& labels,
                         const std::string& word) {
  try {
    dpt::import_idx(images, labels);
    ADD_FAILURE() << "imported; expected an error mentioning " << word;
  } catch (const dpt::InputError& e) {
    EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
  }
}

TEST(Idx, MalformedFilesAreRejected) {
  TempDir tmp;
  const auto good = small_idx();
  write_gz(tmp.file("img.gz"), good.images);
  write_gz(tmp.file("lab.gz"), good.labels);

  auto swapped = good;
  std::swap(swapped.images, swapped.labels);
  write_gz(tmp.file("magic.gz"), swapped.images);
  expect_idx_rejected(tmp.file("magic.gz"), tmp.file("lab.gz"), "bad magic");

  auto cut = good.images;
  cut.resize(cut.size() - 7);
  write_gz(tmp.file("cut.gz"), cut);
  expect_idx_rejected(tmp.file("cut.gz"), tmp.file("lab.gz"), "truncated");

  auto lab4 = small_idx(4).labels;
  write_gz(tmp.file("lab4.gz"), lab4);
  expect_idx_rejected(tmp.file("img.gz"), tmp.file("lab4.gz"), "4 labels");

  auto bad_label = good.labels;
  bad_label.back() = 10;
  write_gz(tmp.file("lab10.gz"), bad_label);
  expect_idx_rejected(tmp.file("img.gz"), tmp.file("lab10.gz"), "label 10");

  auto absurd = idx_header(0x803, {0xffffffffu, 0xffffffffu, 0xffffffffu});
  write_gz(tmp.file("absurd.gz"), absurd);
  expect_idx_rejected(tmp.file("absurd.gz"), tmp.file("lab.gz"), "absurd");

  auto gz = read_bytes(tmp.file("img.gz"));  // a gzip stream cut in the middle
  gz.resize(gz.size() / 2);
  write_bytes(tmp.file("cutgz.gz"), gz);
  EXPECT_THROW(dpt::import_idx(tmp.file("cutgz.gz"), tmp.file("lab.gz")), dpt::InputError);

  expect_idx_rejected(tmp.file("nope.gz"), tmp.file("lab.gz"), "cannot open");
}

// ---------------------------------------------------------------- generators

TEST(Synth, OddEvenIsDeterministicParity) {
  const auto a = dpt::synth_odd_even(300, 9, 5), b = dpt::synth_odd_even(300, 9, 5);
  EXPECT_EQ(a.f32, b.f32);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_NE(a.f32, dpt::synth_odd_even(300, 9, 6).f32);
  EXPECT_EQ(a.num_classes, 2);
  EXPECT_EQ(a.dim, 9);
  for (int64_t i = 0; i < a.n; ++i) {
    int ones = 0;
    for (int j = 0; j < 9; ++j) {
      const float v = a.f32[size_t(i * 9 + j)];
      ASSERT_TRUE(v == 0.f || v == 1.f);
      ones += int(v);
    }
    ASSERT_EQ(a.labels[size_t(i)], ones % 2);
  }
  EXPECT_THROW(dpt::synth_odd_even(0, 9, 1), dpt::InputError);
}

TEST(Synth, BlobsAreDeterministicAndLabelled) {
  const auto a = dpt::synth_blobs(2000, 6, 4, 0.1f, 11), b = dpt::synth_blobs(2000, 6, 4, 0.1f, 11);
  EXPECT_EQ(a.f32, b.f32);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_NE(a.f32, dpt::synth_blobs(2000, 6, 4, 0.1f, 12).f32);
  std::set<int32_t> classes(a.labels.begin(), a.labels.end());
  EXPECT_EQ(classes, (std::set<int32_t>{0, 1, 2, 3}));
  for (float v : a.f32) ASSERT_TRUE(std::abs(v) < 2.f);  // centres in [-1, 1], spread 0.1
  TempDir tmp;
  dpt::write_dataset(tmp.file("blobs.h5"), a);
  EXPECT_EQ(dpt::load_dataset(tmp.file("blobs.h5")).f32, a.f32);
  EXPECT_THROW(dpt::synth_blobs(10, 6, 0, 0.1f, 1), dpt::InputError);
}

}  // namespace
