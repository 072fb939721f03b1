// Data layer: HDF5 round trips, files in h5py's style written with the raw C API, a corpus of
// malformed files (each must give InputError naming the dataset and the problem, never a crash),
// the data order contract of DESIGN.md, idx import and the synthetic generators.
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

namespace fs = std::filesystem;

namespace {

// A fresh directory under /tmp, removed with everything in it when the test ends.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/dpt_test_data.XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (!d) throw std::runtime_error("mkdtemp failed");
    path_ = d;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---------------------------------------------------------------- raw HDF5 writer

// What a file holds, valid by default (int64 labels and uint8 features, as h5py writes them);
// each malformed-file test changes one field.
struct Spec {
  bool features = true;
  hid_t feature_type = H5T_STD_U8LE;
  std::vector<hsize_t> feature_dims{8, 4};
  bool write_feature_data = true;     // false: declare the dims, store nothing
  std::vector<hsize_t> chunk;         // empty: contiguous
  bool gzip = false;
  bool labels = true;
  hid_t label_type = H5T_STD_I64LE;
  std::vector<hsize_t> label_dims{8};
  std::vector<int64_t> label_values{0, 1, 2, 0, 1, 2, 0, 1};
  bool num_classes = true;
  hid_t num_classes_type = H5T_STD_I64LE;
  int64_t num_classes_value = 3;
  bool scale_offset = false;
  double scale = 0.5, offset = -1.0;
};

uint64_t product(const std::vector<hsize_t>& d) {
  uint64_t p = 1;
  for (hsize_t x : d) p *= x;
  return p;
}

void scalar_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* v) {
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(a, 0) << name;
  ASSERT_GE(H5Awrite(a, mem_type, v), 0) << name;
  H5Aclose(a);
  H5Sclose(space);
}

void write_features(hid_t f, const Spec& s) {
  hid_t space = H5Screate_simple(int(s.feature_dims.size()), s.feature_dims.data(), nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (!s.chunk.empty()) ASSERT_GE(H5Pset_chunk(dcpl, int(s.chunk.size()), s.chunk.data()), 0);
  if (s.gzip) ASSERT_GE(H5Pset_deflate(dcpl, 6), 0);
  hid_t d = H5Dcreate2(f, "features", s.feature_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(d, 0) << "creating /features";
  if (s.write_feature_data) {
    std::vector<double> v(product(s.feature_dims));
    for (size_t i = 0; i < v.size(); ++i) v[i] = double(i % 251);
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
  }
  if (s.scale_offset) {
    scalar_attr(d, "scale", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &s.scale);
    scalar_attr(d, "offset", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &s.offset);
  }
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
}

void write_labels(hid_t f, const Spec& s) {
  hid_t space = H5Screate_simple(int(s.label_dims.size()), s.label_dims.data(), nullptr);
  hid_t d = H5Dcreate2(f, "labels", s.label_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(d, 0) << "creating /labels";
  std::vector<int64_t> v(product(s.label_dims));
  for (size_t i = 0; i < v.size(); ++i) v[i] = s.label_values[i % s.label_values.size()];
  ASSERT_GE(H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
  H5Dclose(d);
  H5Sclose(space);
}

void write_spec(const std::string& path, const Spec& s) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0) << path;
  if (s.features) write_features(f, s);
  if (s.labels) write_labels(f, s);
  if (s.num_classes)
    scalar_attr(f, "num_classes", s.num_classes_type, H5T_NATIVE_INT64, &s.num_classes_value);
  H5Fclose(f);
}

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

dpt::Dataset small_dataset(bool u8, int64_t n, std::vector<int64_t> shape, int classes) {
  dpt::Dataset ds;
  ds.n = n;
  ds.sample_shape = shape;
  ds.dim = std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<int64_t>());
  ds.num_classes = classes;
  ds.is_u8 = u8;
  ds.scale = 0.25f;
  ds.offset = -3.f;
  for (int64_t i = 0; i < n * ds.dim; ++i) {
    if (u8) ds.u8.push_back(uint8_t((i * 37) % 256));
    else ds.f32.push_back(float(i) * 0.125f - 7.f);
  }
  for (int64_t i = 0; i < n; ++i) ds.labels.push_back(int32_t((i * 7) % classes));
  return ds;
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
      {"features_f64", [](Spec& s) { s.feature_type = H5T_IEEE_F64LE; }, {"/features", "float64"}},
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

// ---------------------------------------------------------------- data order

TEST(DataOrder, SplitMix64MatchesTheReferenceStream) {
  dpt::SplitMix64 zero(0);
  EXPECT_EQ(zero.next(), 0xe220a8397b1dcdafULL);
  // Vigna's splitmix64.c, seed 1234567.
  dpt::SplitMix64 g(1234567);
  EXPECT_EQ(g.next(), 6457827717110365317ULL);
  EXPECT_EQ(g.next(), 3203168211198807973ULL);
  EXPECT_EQ(g.next(), 9817491932198370423ULL);
}

TEST(DataOrder, BelowIsInRangeAndRoughlyUniform) {
  dpt::SplitMix64 g(7);
  EXPECT_EQ(g.below(1), 0u);
  std::vector<int> count(3, 0);
  for (int i = 0; i < 30000; ++i) ++count[g.below(3)];
  for (int c : count) EXPECT_NEAR(c, 10000, 500);
  const uint64_t huge = (uint64_t(1) << 63) + 12345;
  for (int i = 0; i < 1000; ++i) EXPECT_LT(g.below(huge), huge);
  for (int i = 0; i < 1000; ++i) {
    const double u = g.uniform();
    EXPECT_TRUE(u >= 0.0 && u < 1.0);
  }
}

TEST(DataOrder, EpochOrderContract) {
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(dpt::epoch_order(1000, false, 42, 3), iota);
  const auto a = dpt::epoch_order(1000, true, 42, 3);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, iota) << "not a permutation";
  EXPECT_NE(a, iota);
  EXPECT_EQ(a, dpt::epoch_order(1000, true, 42, 3));
  EXPECT_NE(a, dpt::epoch_order(1000, true, 42, 4));
  EXPECT_NE(a, dpt::epoch_order(1000, true, 43, 3));
  EXPECT_TRUE(dpt::epoch_order(0, true, 1, 0).empty());
  EXPECT_EQ(dpt::epoch_order(1, true, 1, 0), std::vector<int64_t>{0});
}

// The order takes no rank and no world size; every rank of this launch must compute the same.
TEST(DataOrder, EpochOrderIsTheSameOnEveryRank) {
  const auto order = dpt::epoch_order(4096, true, 2024, 5);
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the permutation
  for (int64_t v : order) h = (h ^ uint64_t(v)) * 1099511628211ULL;
  uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi);
}

TEST(DataOrder, BatchOffsetCoversEachGlobalBatchOnce) {
  for (int b : {1, 3, 8})
    for (int world : {1, 2, 5})
      for (int acc : {1, 2, 4})
        for (int64_t k : {0, 1, 7}) {
          const int64_t G = int64_t(b) * world * acc;
          std::vector<int> seen(size_t(G), 0);
          for (int a = 0; a < acc; ++a)
            for (int r = 0; r < world; ++r) {
              const int64_t start = dpt::batch_offset(k, a, r, b, world, acc);
              ASSERT_EQ(start, k * G + int64_t(a) * b * world + int64_t(r) * b);
              for (int i = 0; i < b; ++i) {
                const int64_t row = start + i;
                ASSERT_TRUE(row >= k * G && row < (k + 1) * G);
                ++seen[size_t(row - k * G)];
              }
            }
          for (int s : seen) ASSERT_EQ(s, 1) << "b " << b << " W " << world << " A " << acc;
        }
  // DESIGN.md without accumulation: rank r takes kG + r·b … kG + (r+1)·b − 1.
  EXPECT_EQ(dpt::batch_offset(3, 0, 2, 16, 4, 1), 3 * 64 + 2 * 16);
}

TEST(DataOrder, EvalShardsCoverEveryRowOnce) {
  for (int64_t n : {0, 1, 7, 100, 101, 10007})
    for (int world = 1; world <= 9; ++world) {
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        int64_t b = -1, e = -1;
        dpt::eval_shard(n, r, world, b, e);
        ASSERT_EQ(b, next);
        ASSERT_LE(e - b, n / world + 1);
        ASSERT_GE(e - b, n / world);
        next = e;
      }
      ASSERT_EQ(next, n);
    }
}

// ---------------------------------------------------------------- reading parts of a file

// Row i of `part` must be row rows[i] of `whole`, label and features.
void expect_rows(const dpt::Dataset& part, const dpt::Dataset& whole, const std::vector<int64_t>& rows) {
  ASSERT_EQ(part.n, int64_t(rows.size()));
  ASSERT_EQ(part.dim, whole.dim);
  ASSERT_EQ(part.is_u8, whole.is_u8);
  const size_t d = size_t(whole.dim);
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t r = size_t(rows[i]);
    ASSERT_EQ(part.labels[i], whole.labels[r]) << "row " << i << " (file row " << r << ")";
    if (whole.is_u8)
      ASSERT_TRUE(std::equal(&part.u8[i * d], &part.u8[i * d] + d, &whole.u8[r * d])) << "row " << i;
    else
      ASSERT_TRUE(std::equal(&part.f32[i * d], &part.f32[i * d] + d, &whole.f32[r * d])) << "row " << i;
  }
}

TEST(DataFile, LoadRowsReadsThoseRowsInTheOrderAsked) {
  TempDir tmp;
  for (bool u8 : {true, false}) {
    // 600 rows so that every other row is 300 runs: more than one group of runs per read.
    const auto ds = small_dataset(u8, 600, {1, 3, 5}, 7);
    const std::string p = tmp.file(u8 ? "u8.h5" : "f32.h5");
    dpt::write_dataset(p, ds);
    std::vector<int64_t> every_other;
    for (int64_t r = 598; r >= 0; r -= 2) every_other.push_back(r);
    const std::vector<std::vector<int64_t>> cases = {
        {36, 0, 5, 5, 599, 6, 7, 8, 1}, every_other, {}, {599}};
    for (const auto& rows : cases) {
      const auto part = dpt::load_rows(p, rows);
      expect_rows(part, ds, rows);
      EXPECT_EQ(part.sample_shape, (std::vector<int64_t>{1, 3, 5}));
      EXPECT_EQ(part.scale, ds.scale);
      EXPECT_EQ(part.offset, ds.offset);
      EXPECT_EQ(part.num_classes, 7);
      EXPECT_EQ(part.rows_in_file(), 600);
    }
    EXPECT_THROW(dpt::load_rows(p, {0, 600}), dpt::Error);
    EXPECT_THROW(dpt::load_rows(p, {-1}), dpt::Error);
  }
}

TEST(DataFile, LoadRowsReadsChunkedGzipFilesAsH5pyWritesThem) {
  TempDir tmp;
  Spec s;
  s.feature_dims = {50, 1, 28, 28};
  s.chunk = {7, 1, 28, 28};
  s.gzip = true;
  s.label_dims = {50};
  s.label_values = {9, 0, 3, 7};
  s.num_classes_value = 10;
  const std::string p = tmp.file("h5py.h5");
  write_spec(p, s);
  const auto whole = dpt::load_dataset(p);
  const std::vector<int64_t> rows = {49, 3, 4, 5, 20, 0};
  expect_rows(dpt::load_rows(p, rows), whole, rows);
}

// Only the rows read are validated: a bad label elsewhere in the file goes unnoticed until a
// read includes it, and then the message names that file row.
TEST(DataFile, LoadRowsChecksTheLabelsItReads) {
  TempDir tmp;
  Spec s;
  s.label_values = {0, 1, 2, 0, 1, 7, 0, 1};  // row 5 has label 7, num_classes 3
  const std::string p = tmp.file("bad.h5");
  write_spec(p, s);
  EXPECT_NO_THROW(dpt::load_rows(p, {0, 1, 2, 6}));
  try {
    dpt::load_rows(p, {4, 5});
    FAIL() << "a label outside [0, num_classes) was accepted";
  } catch (const dpt::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("row 5 has label 7"), std::string::npos) << e.what();
  }
}

TEST(DataFile, EvalShardReadsOnlyThatRanksRows) {
  TempDir tmp;
  const auto ds = small_dataset(true, 101, {6}, 4);
  const std::string p = tmp.file("t.h5");
  dpt::write_dataset(p, ds);
  for (int world : {1, 3, 4}) {
    int64_t covered = 0;
    for (int r = 0; r < world; ++r) {
      const auto part = dpt::load_eval_shard(p, r, world);
      int64_t b = 0, e = 0;
      dpt::eval_shard(101, r, world, b, e);
      EXPECT_EQ(part.first_row, b);
      EXPECT_EQ(part.rows_in_file(), 101);
      std::vector<int64_t> rows(size_t(e - b));
      std::iota(rows.begin(), rows.end(), b);
      expect_rows(part, ds, rows);
      covered += part.n;
    }
    EXPECT_EQ(covered, 101);
  }
}

TEST(DataOrder, RankPositionsPartitionTheUsedPartOfAnEpoch) {
  for (int world : {1, 3})
    for (int acc : {1, 2})
      for (int b : {1, 4}) {
        const int64_t n = 103;
        const int64_t G = int64_t(b) * world * acc, used = n / G * G;
        std::vector<int> seen(size_t(n), 0);
        for (int r = 0; r < world; ++r) {
          dpt::RankOrder o;
          o.rank = r;
          o.world = world;
          o.batch = b;
          o.accumulate = acc;
          const auto pos = dpt::rank_positions(n, o);
          ASSERT_EQ(int64_t(pos.size()), used / world);
          // In the order the rank uses them: step k, micro-batch a, then b consecutive ones.
          for (size_t i = 0; i < pos.size(); ++i) {
            const int64_t mb = int64_t(i) / b, k = mb / acc, a = mb % acc;
            ASSERT_EQ(pos[i], dpt::batch_offset(k, int(a), r, b, world, acc) + int64_t(i) % b);
            ++seen[size_t(pos[i])];
          }
        }
        for (int64_t p = 0; p < n; ++p) ASSERT_EQ(seen[size_t(p)], p < used ? 1 : 0) << "position " << p;
      }
}

// data.read = shard: epoch by epoch, the rank holds exactly the rows its batches use, in use
// order, and the index leads every position it uses to the row the whole-file order names.
TEST(TrainRows, ShardHoldsTheRanksRowsOfEachEpoch) {
  TempDir tmp;
  const auto ds = small_dataset(true, 200, {5}, 3);
  const std::string p = tmp.file("train.h5");
  dpt::write_dataset(p, ds);
  for (bool shuffle : {true, false}) {
    for (int r = 0; r < 3; ++r) {
      dpt::RankOrder o;
      o.shuffle = shuffle;
      o.seed = 11;
      o.rank = r;
      o.world = 3;
      o.batch = 4;
      o.accumulate = 2;
      dpt::TrainRows whole(ds, o), shard(p, o);
      EXPECT_TRUE(shard.sharded());
      EXPECT_FALSE(whole.sharded());
      EXPECT_EQ(shard.file_rows(), 200);
      const auto pos = dpt::rank_positions(200, o);  // 8 steps × 24 = 192 positions, 64 each
      ASSERT_EQ(pos.size(), 64u);
      const dpt::Dataset* addr = &shard.data();
      uint64_t version = 0;
      // Epochs 0..3 in turn (each read ahead by the one before), then a jump back (a resume).
      for (int64_t e : {0, 1, 2, 3, 1}) {
        const auto order = whole.start_epoch(e);
        const auto index = shard.start_epoch(e);
        ASSERT_EQ(&shard.data(), addr) << "the epoch's rows must live in one object";
        ASSERT_EQ(shard.data().n, 64);
        EXPECT_TRUE(shard.data().version != version || !shuffle);
        version = shard.data().version;
        std::vector<int64_t> got, want;
        for (int64_t q : pos) {
          got.push_back(index[size_t(q)]);
          want.push_back(order[size_t(q)]);
        }
        // Position pos[i] is local row i: the shard is stored in use order.
        for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], int64_t(i));
        expect_rows(shard.data(), ds, want);
      }
      // Shuffled, every epoch start reads 64 rows; unshuffled, one read serves every epoch.
      EXPECT_EQ(shard.rows_read(), shuffle ? 5 * 64 : 64);
    }
  }
}

// Bytes this process has read through read(2)/pread(2) so far (Linux /proc/self/io).
long long bytes_read() {
  std::ifstream f("/proc/self/io");
  std::string key;
  long long v = 0;
  while (f >> key >> v)
    if (key == "rchar:") return v;
  return -1;
}

// A rank reads its rows and little else: not the whole file, and not the neighbours of each row
// (HDF5's sieve buffer would read 64 KiB around every scattered row).
TEST(TrainRows, AShardReadsAboutItsOwnBytesOfTheFile) {
  TempDir tmp;
  const auto ds = small_dataset(true, 4000, {1000}, 5);  // 4 MB of features
  const std::string p = tmp.file("big.h5");
  dpt::write_dataset(p, ds);
  dpt::RankOrder o;
  o.world = 8;
  o.rank = 3;
  o.batch = 10;
  dpt::TrainRows rows(p, o);
  const long long before = bytes_read();
  ASSERT_GE(before, 0) << "no /proc/self/io";
  rows.start_epoch(0, /*read_next=*/false);
  const long long read = bytes_read() - before;
  const long long mine = rows.data().n * (1000 + 4);  // 500 rows of features and labels
  EXPECT_EQ(rows.data().n, 500);
  EXPECT_GE(read, mine);
  EXPECT_LT(read, mine + mine / 5 + (64 << 10)) << "read " << read << " bytes for " << mine;
}

TEST(TrainRows, AReadErrorSurfacesAtTheEpochThatNeedsTheRow) {
  TempDir tmp;
  Spec s;
  s.feature_dims = {64, 4};
  s.label_dims = {64};
  s.label_values.assign(64, 1);
  s.label_values[37] = 9;  // num_classes 3
  const std::string p = tmp.file("bad.h5");
  write_spec(p, s);
  dpt::RankOrder o;
  o.shuffle = false;
  o.world = 1;
  o.batch = 8;
  dpt::TrainRows rows(p, o);  // the header is fine: nothing is read yet
  try {
    rows.start_epoch(0);
    FAIL() << "a label outside [0, num_classes) was accepted";
  } catch (const dpt::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("row 37 has label 9"), std::string::npos) << e.what();
  }
  // The same through the background read: epoch 1 is read ahead while epoch 0 is in use.
  o.shuffle = true;
  o.batch = 4;
  o.world = 2;
  o.rank = 1;
  dpt::TrainRows ahead(p, o);
  int failures = 0;
  for (int64_t e = 0; e < 6; ++e) {
    try {
      ahead.start_epoch(e);
    } catch (const dpt::InputError& err) {
      EXPECT_NE(std::string(err.what()).find("row 37 has label 9"), std::string::npos) << err.what();
      ++failures;
    }
  }
  EXPECT_GT(failures, 0) << "row 37 is rank 1's in some epoch of six";
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
