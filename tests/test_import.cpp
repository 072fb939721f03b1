// Users' own arrays as a user brings them: `dpdata npy` on .npy files written byte for byte as
// numpy writes them (checked against np.save where /usr/bin/python3 has numpy, and format
// versions 2.0 and 3.0 written by numpy itself), `dpdata csv` on CSV files, each broken input
// refused with a message naming the file and what is wrong and exit code 2, nothing written; and
// an imported file that dptrain trains on.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "dpt/data.hpp"

namespace fs = std::filesystem;

namespace {

using cli::Outcome;

Outcome sh(const std::string& cmd) { return cli::sh(cmd, 60); }
std::string dpdata(const std::string& args) { return std::string(DPT_BINARY_DIR) + "/dpdata " + args; }

// The header numpy's format 1.0 writes: the dict, spaces up to a multiple of 64 bytes for the
// whole prefix, then '\n'.
std::string npy_v1(const std::string& dict) {
  std::string h = dict;
  h += std::string((64 - (10 + h.size() + 1) % 64) % 64, ' ') + "\n";
  std::string out("\x93NUMPY\x01\x00", 8);
  out += char(h.size() & 0xff);
  out += char(h.size() >> 8);
  return out + h;
}

std::string dict(const std::string& descr, const std::vector<uint64_t>& shape, bool fortran = false) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  s += shape.size() == 1 ? ",)" : ")";
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': " + s + ", }";
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

class Import : public ::testing::Test {
 protected:
  static fs::path dir;
  static void SetUpTestSuite() {
    dir = fs::temp_directory_path() / ("dpt-import-" + std::to_string(::getpid()));
    fs::create_directories(dir);
  }
  static void TearDownTestSuite() { fs::remove_all(dir); }

  static std::string path(const std::string& name) { return (dir / name).string(); }
  static std::string put(const std::string& name, const std::string& bytes) {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  template <class T>
  static std::string npy(const std::string& name, const std::string& descr, const std::vector<uint64_t>& shape,
                         const std::vector<T>& data, bool fortran = false) {
    return put(name, npy_v1(dict(descr, shape, fortran)) + bytes_of(data));
  }
  // Runs a numpy script in dir; false when /usr/bin/python3 has no numpy.
  static bool python(const std::string& script) {
    if (sh("/usr/bin/python3 -c 'import numpy'").code != 0) return false;
    put("script.py", "import numpy as np\nimport numpy.lib.format as fmt\n" + script);
    Outcome r = cli::sh("/usr/bin/python3 script.py", 60, dir.string());
    EXPECT_EQ(r.code, 0) << r.out;
    return r.code == 0;
  }

  // Bad input: exit 2, every word in the message, no crash, no file written.
  void expect_refused(const std::string& args, const std::vector<std::string>& words) {
    fs::remove(path("out.h5"));
    Outcome r = sh(dpdata(args + " " + path("out.h5")));
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    for (const auto& w : words) EXPECT_NE(r.out.find(w), std::string::npos) << "missing '" << w << "' in:\n" << r.out;
    EXPECT_EQ(r.out.find("Segmentation"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(path("out.h5"))) << args;
    for (const auto& e : fs::directory_iterator(dir))
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
};
fs::path Import::dir;

std::vector<float> arange_f32(size_t n, float step, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(i) * step + start;
  return v;
}

}  // namespace

// The C++ writer above is numpy's format 1.0 to the byte (checked against np.save), and files
// np.save and numpy's writer of versions 2.0 and 3.0 produce import with their values.
TEST_F(Import, NumpyWrittenFilesImport) {
  const auto x = arange_f32(6 * 4, 0.5f, -3.f);
  std::vector<int64_t> y{0, 1, 2, 0, 1, 2};
  npy("ours_x.npy", "<f4", {6, 4}, x);
  npy("ours_y.npy", "<i8", {6}, y);
  if (!python("x = (np.arange(24, dtype=np.float32) * 0.5 - 3).reshape(6, 4); y = np.arange(6) % 3\n"
              "np.save('np_x.npy', x); np.save('np_y.npy', y)\n"
              "for v in (2, 3):\n"
              "    with open(f'v{v}_x.npy', 'wb') as f: fmt.write_array(f, x, version=(v, 0))\n"))
    GTEST_SKIP() << "/usr/bin/python3 has no numpy";
  auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_EQ(slurp(path("ours_x.npy")), slurp(path("np_x.npy")));
  EXPECT_EQ(slurp(path("ours_y.npy")), slurp(path("np_y.npy")));
  for (const char* features : {"np_x.npy", "v2_x.npy", "v3_x.npy"}) {
    fs::remove(path("np.h5"));
    Outcome r = sh(dpdata("npy " + path(features) + " " + path("np_y.npy") + " " + path("np.h5")));
    ASSERT_EQ(r.code, 0) << features << "\n" << r.out;
    EXPECT_NE(r.out.find("num_classes = 3 (the largest label + 1"), std::string::npos) << r.out;
    const dpt::Dataset ds = dpt::load_dataset(path("np.h5"));
    EXPECT_EQ(ds.n, 6);
    EXPECT_EQ(ds.sample_shape, std::vector<int64_t>{4});
    EXPECT_FALSE(ds.is_u8);
    EXPECT_EQ(ds.f32, x) << features;
    EXPECT_EQ(ds.labels, (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
  }
}

// float64 features are narrowed to float32, with a line saying so; --num-classes is kept.
TEST_F(Import, Float64FeaturesAreNarrowed) {
  std::vector<double> x(5 * 3);
  for (size_t i = 0; i < x.size(); ++i) x[i] = double(i) * 0.1 - 0.7;
  npy("f64_x.npy", "<f8", {5, 3}, x);
  npy("f64_y.npy", "|u1", {5}, std::vector<uint8_t>{1, 0, 1, 0, 1});
  Outcome r = sh(dpdata("npy " + path("f64_x.npy") + " " + path("f64_y.npy") + " " + path("f64.h5") +
                        " --num-classes 4"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("float64 features narrowed to float32"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("largest label + 1"), std::string::npos) << r.out;
  const dpt::Dataset ds = dpt::load_dataset(path("f64.h5"));
  ASSERT_EQ(ds.f32.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(ds.f32[i], float(x[i])) << i;
  EXPECT_EQ(ds.num_classes, 4);
  EXPECT_EQ(ds.labels, (std::vector<int32_t>{1, 0, 1, 0, 1}));
}

// uint8 N x C x H x W images stay uint8, read as value / 255; N x H x W x C ones are refused
// with the way out, and --channels-last transposes them.
TEST_F(Import, Uint8ImagesChannelsFirstOrTransposed) {
  const uint64_t n = 4, c = 3, h = 2, w = 5;
  std::vector<uint8_t> nchw(n * c * h * w), nhwc(nchw.size());
  for (size_t i = 0; i < nchw.size(); ++i) nchw[i] = uint8_t(i * 7 % 256);
  for (uint64_t a = 0; a < n; ++a)
    for (uint64_t ch = 0; ch < c; ++ch)
      for (uint64_t y = 0; y < h; ++y)
        for (uint64_t x = 0; x < w; ++x) nhwc[((a * h + y) * w + x) * c + ch] = nchw[((a * c + ch) * h + y) * w + x];
  npy("img_nchw.npy", "|u1", {n, c, h, w}, nchw);
  npy("img_nhwc.npy", "|u1", {n, h, w, c}, nhwc);
  npy("img_y.npy", "<i2", {n}, std::vector<int16_t>{0, 1, 2, 1});
  const std::string y = path("img_y.npy");
  for (const std::string& args : {"npy " + path("img_nchw.npy") + " " + y + " " + path("a.h5"),
                                  "npy " + path("img_nhwc.npy") + " " + y + " " + path("b.h5") + " --channels-last"}) {
    Outcome r = sh(dpdata(args));
    ASSERT_EQ(r.code, 0) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("uint8 features stored as they are, read as value / 255"), std::string::npos) << r.out;
  }
  for (const char* f : {"a.h5", "b.h5"}) {
    const dpt::Dataset ds = dpt::load_dataset(path(f));
    EXPECT_TRUE(ds.is_u8) << f;
    EXPECT_EQ(ds.sample_shape, (std::vector<int64_t>{3, 2, 5})) << f;
    EXPECT_EQ(ds.u8, nchw) << f;
    EXPECT_FLOAT_EQ(ds.scale, 1.f / 255.f);
  }
  expect_refused("npy " + path("img_nhwc.npy") + " " + y,
                 {"img_nhwc.npy", "(4, 2, 5, 3) looks like N x H x W x C", "--channels-last"});
}

// Every way a .npy pair can be wrong: exit 2, the file and the problem named, nothing written.
TEST_F(Import, BadNpyInputsAreRefusedByName) {
  const std::vector<float> x6 = arange_f32(6 * 2, 1.f, 0.f);
  const std::string x = npy("x.npy", "<f4", {6, 2}, x6), y = npy("y.npy", "<i8", {6}, std::vector<int64_t>(6, 1));
  const std::vector<uint8_t> six(6 * 8, 0);
  const struct { std::string args; std::vector<std::string> words; } cases[] = {
      {"npy " + npy("fortran.npy", "<f4", {6, 2}, x6, true) + " " + y, {"fortran.npy", "Fortran", "np.ascontiguousarray"}},
      {"npy " + npy("big.npy", ">f4", {6, 2}, x6) + " " + y, {"big.npy", "big-endian", "x.astype('<f4')"}},
      {"npy " + npy("obj.npy", "|O", {6, 2}, six) + " " + y, {"obj.npy", "Python objects", "does not unpickle"}},
      {"npy " + put("rec.npy", npy_v1("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }") +
                                   std::string(24, '\0')) + " " + y, {"rec.npy", "structured"}},
      {"npy " + npy("f16.npy", "<f2", {6, 2}, std::vector<uint16_t>(12)) + " " + y, {"f16.npy", "float16", "uint8, float32"}},
      {"npy " + npy("x1.npy", "<f4", {12}, x6) + " " + y, {"x1.npy", "shape (12,)", "x.reshape(-1, 1)"}},
      {"npy " + x + " " + npy("yu64.npy", "<u8", {6}, std::vector<uint64_t>(6)), {"yu64.npy", "uint64", "int64"}},
      {"npy " + x + " " + npy("yf.npy", "<f8", {6}, std::vector<double>(6)), {"yf.npy", "float64", "y.astype(np.int64)"}},
      {"npy " + x + " " + npy("ycol.npy", "<i8", {6, 1}, std::vector<int64_t>(6)), {"ycol.npy", "(6, 1)", "y.reshape(-1)"}},
      {"npy " + x + " " + npy("y5.npy", "<i8", {5}, std::vector<int64_t>(5)), {"x.npy' has 6 rows", "y5.npy' has 5 labels"}},
      {"npy " + x + " " + npy("yneg.npy", "<i4", {6}, std::vector<int32_t>{0, 1, -1, 0, 1, 0}),
       {"yneg.npy", "row 2 has label -1"}},
      {"npy " + x + " " + npy("y9.npy", "<i8", {6}, std::vector<int64_t>{0, 1, 9, 0, 1, 0}) + " --num-classes 3",
       {"labels file '" + path("y9.npy") + "': row 2 has label 9, outside [0, num_classes = 3)"}},
      {"npy " + x + " " + y + " --num-classes 0", {"--num-classes: 0 is outside [1, 1000000]"}},
      {"npy " + put("short.npy", npy_v1(dict("<f4", {6, 2})) + bytes_of(x6).substr(0, 40)) + " " + y,
       {"short.npy", "holds 40 bytes of data", "needs 48 bytes", "truncated"}},
      {"npy " + put("twice.npy", npy_v1(dict("<f4", {6, 2})) + bytes_of(x6) + npy_v1(dict("<f4", {6, 2})) +
                                     bytes_of(x6)) + " " + y, {"twice.npy", "after its array", "one array per file"}},
      {"npy " + put("hdr.npy", npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (6, 2 }") + bytes_of(x6)) +
           " " + y, {"hdr.npy", "the header is not a dict as numpy writes it", "'shape': (6, 2 }"}},
      {"npy " + put("key.npy", npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (6, 2), 'extra': 1}") +
                                   bytes_of(x6)) + " " + y, {"key.npy", "'extra'"}},
      {"npy " + put("nokey.npy", npy_v1("{'descr': '<f4', 'shape': (6, 2)}") + bytes_of(x6)) + " " + y,
       {"nokey.npy", "no 'fortran_order' key"}},
      {"npy " + put("v4.npy", "\x93NUMPY\x04" + std::string(40, '\0')) + " " + y, {"v4.npy", "version 4.0"}},
      {"npy " + put("txt.npy", "1,2,3\n4,5,6\n") + " " + y, {"txt.npy", "is not a .npy file"}},
      {"npy " + put("z.npy", std::string("PK\x03\x04", 4) + std::string(40, '\0')) + " " + y, {"z.npy", ".npz archive"}},
      {"npy " + path("missing.npy") + " " + y, {"missing.npy", "cannot open"}},
  };
  for (const auto& c : cases) expect_refused(c.args, c.words);
}

// A label column in the middle, by name and by index; CRLF, a byte-order mark, quotes, a blank
// line, spaces around numbers, no newline at the end.
TEST_F(Import, CsvLabelColumnInTheMiddle) {
  const std::string csv = put("mid.csv", "\xEF\xBB\xBF" "a,\"b\",label,c\r\n1.5,2,0,3\r\n\r\n\"4\", -5e-1 ,2,6\r\n7,8,1,9");
  for (const std::string& label : {"label", "2"}) {
    fs::remove(path("mid.h5"));
    Outcome r = sh(dpdata("csv " + csv + " " + path("mid.h5") + " --label " + label));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("label column 'label' (column 2), 3 feature columns"), std::string::npos) << r.out;
    const dpt::Dataset ds = dpt::load_dataset(path("mid.h5"));
    EXPECT_EQ(ds.n, 3);
    EXPECT_EQ(ds.f32, (std::vector<float>{1.5f, 2, 3, 4, -0.5f, 6, 7, 8, 9}));
    EXPECT_EQ(ds.labels, (std::vector<int32_t>{0, 2, 1}));
    EXPECT_EQ(ds.num_classes, 3);
  }
}

// Class names are numbered in sorted order and kept as the root attribute class_names.
TEST_F(Import, CsvClassNamesAreNumberedAndKept) {
  const std::string csv = put("iris.csv", "x,species,y\n1,virginica,2\n3,setosa,4\n5,\"versicolor\",6\n7,setosa,8\n");
  Outcome r = sh(dpdata("csv " + csv + " " + path("iris.h5") + " --label species"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("0 = setosa, 1 = versicolor, 2 = virginica"), std::string::npos) << r.out;
  const dpt::Dataset ds = dpt::load_dataset(path("iris.h5"));
  EXPECT_EQ(ds.labels, (std::vector<int32_t>{2, 0, 1, 0}));
  EXPECT_EQ(ds.num_classes, 3);
  hid_t f = H5Fopen(path("iris.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t a = H5Aopen(f, "class_names", H5P_DEFAULT);
  ASSERT_GE(a, 0) << "no class_names attribute";
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  char* names[3] = {};
  ASSERT_GE(H5Aread(a, t, names), 0);
  EXPECT_STREQ(names[0], "setosa");
  EXPECT_STREQ(names[1], "versicolor");
  EXPECT_STREQ(names[2], "virginica");
  for (char* n : names) H5free_memory(n);
  H5Tclose(t), H5Aclose(a), H5Fclose(f);
}

// dpdata fashion-mnist writes the set's class names (torchvision's FashionMNIST.classes).
TEST_F(Import, FashionMnistCarriesItsClassNames) {
  const std::string src = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(src + "/t10k-labels-idx1-ubyte.gz")) GTEST_SKIP() << src << " is missing (dataset-fashion-mnist)";
  Outcome r = sh(std::string(DPT_BINARY_DIR) + "/dpdata fashion-mnist --out-dir " + path("fm"));
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* part : {"train", "test"}) {
    const dpt::Dataset ds = dpt::load_dataset(path("fm/fashion-mnist-" + std::string(part) + ".h5"));
    EXPECT_EQ(ds.class_names, (std::vector<std::string>{"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                                                        "Shirt", "Sneaker", "Bag", "Ankle boot"}))
        << part;
  }
}

// A file from elsewhere (h5py) whose class_names hold a line break is refused by name when read:
// a checkpoint, which carries the names one per line, would split it in two.
TEST_F(Import, AClassNameWithALineBreakIsRefusedWhenRead) {
  const std::string csv = put("lb.csv", "x,species\n1,setosa\n3,virginica\n");
  ASSERT_EQ(sh(dpdata("csv " + csv + " " + path("lb.h5") + " --label species")).code, 0);
  hid_t f = H5Fopen(path("lb.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Adelete(f, "class_names"), 0);
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  const hsize_t two = 2;
  hid_t sp = H5Screate_simple(1, &two, nullptr);
  hid_t a = H5Acreate2(f, "class_names", t, sp, H5P_DEFAULT, H5P_DEFAULT);
  const char* names[2] = {"setosa", "virginica\nvirginiana"};
  ASSERT_GE(H5Awrite(a, t, names), 0);
  H5Aclose(a), H5Sclose(sp), H5Tclose(t), H5Fclose(f);
  Outcome r = sh(std::string(DPT_BINARY_DIR) + "/dpdata info " + path("lb.h5"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("dataset file '" + path("lb.h5") + "': root attribute 'class_names': class name "
                       "'virginica\\nvirginiana' (class 1) holds a line break"),
            std::string::npos)
      << r.out;
}

// Every way a CSV file can be wrong: exit 2, the line and column named, nothing written.
TEST_F(Import, BadCsvInputsAreRefusedByName) {
  const struct { std::string name, text, args; std::vector<std::string> words; } cases[] = {
      {"word.csv", "x,y,label\n1,2,0\n3,abc,1\n", "--label label", {"word.csv", "line 3, column 'y' (column 1): 'abc' is not a number"}},
      {"hole.csv", "x,y,label\n1,2,0\n,4,1\n", "--label label", {"line 3, column 'x' (column 0): empty cell"}},
      {"nan.csv", "x,y,label\n1,nan,0\n", "--label label", {"line 2, column 'y' (column 1): 'nan' is not a finite number"}},
      {"ragged.csv", "x,y,label\n1,2,0\n3,4\n", "--label label", {"ragged.csv", "line 3 has 2 fields but the header has 3"}},
      {"quote.csv", "x,y,label\n1,2,0\n\"3,4,1\n", "--label label", {"line 3: a quote opened here is never closed"}},
      {"after.csv", "x,y,label\n\"1\"2,3,0\n", "--label label", {"line 2: text after a closing quote"}},
      {"nolabel.csv", "x,y,label\n1,2,0\n", "--label target", {"no column named 'target'", "x, y, label"}},
      {"two.csv", "x,label,label\n1,2,0\n", "--label label", {"2 columns are named 'label'"}},
      {"float.csv", "x,label\n1,0\n2,1.5\n", "--label label", {"line 3: label '1.5' is not an integer"}},
      {"mixed.csv", "x,label\n1,0\n2,cat\n", "--label label", {"line 3: label 'cat' is a name but line 2's label '0'"}},
      {"neg.csv", "x,label\n1,0\n2,-1\n", "--label label", {"label column 'label' (column 1): line 3 has label -1"}},
      {"range.csv", "x,label\n1,0\n2,5\n", "--label label --num-classes 3",
       {"label column 'label' (column 1): line 3 has label 5, outside [0, num_classes = 3)"}},
      {"index.csv", ",x,label\n0,1,0\n", "--label label", {"column 0 of the header (line 1) has no name", "index=False"}},
      {"semi.csv", "x;y;label\n1;2;0\n", "--label label", {"the header has one column", "';'"}},
      {"header.csv", "x,label\n", "--label label", {"header.csv", "no data rows"}},
      {"empty.csv", "", "--label label", {"empty.csv", "is empty"}},
      {"break.csv", "x,label\n1,c\n2,\"a\nb\"\n", "--label label",
       {"label column 'label' (column 1): class name 'a\\nb' (class 0) holds a line break", "rename it"}},
  };
  for (const auto& c : cases) expect_refused("csv " + put(c.name, c.text) + " " + c.args, c.words);
  expect_refused("csv " + path("none.csv") + " --label label", {"none.csv", "cannot open"});
}

// An output path that names an input is refused before anything is read or replaced.
TEST_F(Import, OutputMayNotReplaceAnInput) {
  const std::string csv = put("keep.csv", "x,label\n1,0\n");
  Outcome r = sh(dpdata("csv " + csv + " " + csv + " --label label"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("is the input"), std::string::npos) << r.out;
  std::ifstream f(csv);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), {}), "x,label\n1,0\n");
}

// Imported files train: two well-separated classes from .npy and from CSV, a few steps each on
// two ranks, every step's loss finite.
TEST_F(Import, ImportedFilesTrain) {
  const uint64_t n = 200, d = 6;
  std::vector<float> x(n * d);
  std::vector<int32_t> y(n);
  std::string csv = "f0,f1,f2,cls,f3,f4,f5\n";
  for (uint64_t i = 0; i < n; ++i) {
    y[i] = int32_t(i % 2);
    std::vector<std::string> cells;
    for (uint64_t j = 0; j < d; ++j) {
      x[i * d + j] = float(y[i] ? 1 : -1) + 0.01f * float((i * 7 + j * 3) % 11);
      cells.push_back(std::to_string(x[i * d + j]));
    }
    cells.insert(cells.begin() + 3, y[i] ? "dog" : "cat");
    for (size_t j = 0; j < cells.size(); ++j) csv += cells[j] + (j + 1 < cells.size() ? "," : "\n");
  }
  npy("train_x.npy", "<f4", {n, d}, x);
  npy("train_y.npy", "<i4", {n}, y);
  put("train.csv", csv);
  const std::pair<std::string, std::string> imports[] = {
      {"npy " + path("train_x.npy") + " " + path("train_y.npy") + " " + path("npy.h5"), path("npy.h5")},
      {"csv " + path("train.csv") + " " + path("csv.h5") + " --label cls", path("csv.h5")}};
  for (const auto& [args, out] : imports) {
    Outcome r = sh(dpdata(args));
    ASSERT_EQ(r.code, 0) << r.out;
    const std::string metrics = out + ".jsonl";
    r = sh(cli::mpirun(2) + DPT_BINARY_DIR + "/dptrain --data.train " + out + " --data.test " + out +
           " --model.layers 6,16,2 --train.batch_per_rank 20 --train.epochs 1 --train.steps 5 --train.optimizer adam"
           " --train.lr 0.01 --log.every_steps 1 --log.metrics " + metrics);
    ASSERT_EQ(r.code, 0) << out << "\n" << r.out;
    std::ifstream m(metrics);
    int steps = 0;
    for (std::string line; std::getline(m, line);) {
      const auto at = line.find("\"loss\": ");
      if (line.find("\"samples_per_s\"") == std::string::npos || at == std::string::npos) continue;
      ++steps;
      EXPECT_TRUE(std::isfinite(std::stod(line.substr(at + 8)))) << line;
    }
    EXPECT_EQ(steps, 5) << out;
  }
}

// Class names give labels their meaning: a test set (or a checkpoint) that numbers its classes
// otherwise than the training set is refused by name on every rank, before any step; a test set
// whose names are the start of the training set's, or one without names, is taken, and --eval
// names a nameless test set's classes by the checkpoint's.
TEST_F(Import, TrainAndTestSetsMustNumberClassesAlike) {
  auto csv = [&](const std::string& name, const std::vector<std::string>& kinds) {
    std::string text = "x,y,kind\n";
    for (size_t i = 0; i < 40; ++i) {
      const std::string& k = kinds[i % kinds.size()];
      const double v = k == "dog" ? 1 : -1;
      text += std::to_string(v + 0.01 * double(i % 7)) + "," + std::to_string(v) + "," + k + "\n";
    }
    fs::remove(path(name + ".h5"));
    Outcome r = sh(dpdata("csv " + put(name + ".csv", text) + " " + path(name + ".h5") + " --label kind"));
    EXPECT_EQ(r.code, 0) << r.out;
    return path(name + ".h5");
  };
  const std::string train = csv("pets", {"cat", "dog"}), other = csv("farm", {"cat", "cow", "dog"}),
                    start = csv("cats", {"cat"});
  std::vector<float> x(40 * 2);
  std::vector<int32_t> y(40);
  for (size_t i = 0; i < 40; ++i) y[i] = int32_t(i % 2), x[2 * i] = x[2 * i + 1] = y[i] ? 1.f : -1.f;
  npy("bare_x.npy", "<f4", {40, 2}, x);
  npy("bare_y.npy", "<i4", {40}, y);
  ASSERT_EQ(sh(dpdata("npy " + path("bare_x.npy") + " " + path("bare_y.npy") + " " + path("bare.h5"))).code, 0);
  const std::string bare = path("bare.h5");

  const std::string ck = path("classes-ck");
  auto train_on = [&](const std::string& test) {
    fs::remove_all(ck);
    return sh(cli::mpirun(2) + DPT_BINARY_DIR + "/dptrain --data.train " + train + " --data.test " + test +
              " --model.layers 2,8,3 --train.batch_per_rank 10 --train.epochs 1 --train.steps 2 --checkpoint.dir " +
              ck + " --log.metrics " + path("classes.jsonl"));
  };
  Outcome r = train_on(other);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("data.test (" + other + ") names class 1 'cow', data.train (" + train + ") names it 'dog'"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("--val-folder"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 1"), std::string::npos) << "refused before any step:\n" << r.out;
  EXPECT_EQ(r.out.find("Segmentation"), std::string::npos) << r.out;

  r = train_on(start);
  ASSERT_EQ(r.code, 0) << r.out;
  std::string checkpoint;
  for (const auto& e : fs::directory_iterator(ck))
    if (e.path().extension() == ".h5") checkpoint = e.path().string();
  ASSERT_FALSE(checkpoint.empty()) << "no checkpoint in " << ck << "\n" << r.out;

  r = sh(cli::mpirun(2) + DPT_BINARY_DIR + "/dptrain --eval --checkpoint " + checkpoint + " --data.test " + other);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("data.test (" + other + ") names class 1 'cow', the checkpoint (" + checkpoint +
                       ") names it 'dog'"),
            std::string::npos)
      << r.out;

  r = sh(cli::mpirun(2) + DPT_BINARY_DIR + "/dptrain --eval --checkpoint " + checkpoint + " --data.test " + bare);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("accuracy  name"), std::string::npos) << "the table names classes:\n" << r.out;
  for (const char* row : {" 0           20 ", " 1           20 "})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  EXPECT_NE(r.out.find("  cat\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  dog\n"), std::string::npos) << r.out;
}

// --eval on more than 100 classes shows the 100 with the lowest accuracy, lowest first, and what
// the rest reach. 150 classes of 4 rows: classes below 100 one-hot (learnt), 100-119 one-hot in
// half their rows and zero in the rest, 120-149 zero (the model cannot tell them apart).
TEST_F(Import, EvalOfManyClassesShowsTheLowestAccuracyFirst) {
  const uint64_t k = 150, n = 4 * k;
  std::vector<float> x(n * k, 0.f);
  std::vector<int32_t> y(n);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t c = i % k, copy = i / k;
    y[i] = int32_t(c);
    if (c < 100 || (c < 120 && copy < 2)) x[i * k + c] = 1.f;
  }
  npy("many_x.npy", "<f4", {n, k}, x);
  npy("many_y.npy", "<i4", {n}, y);
  const std::string data = path("many.h5"), ck = path("many-ck");
  ASSERT_EQ(sh(dpdata("npy " + path("many_x.npy") + " " + path("many_y.npy") + " " + data)).code, 0);
  fs::remove_all(ck);
  Outcome r = sh(cli::mpirun(2) + DPT_BINARY_DIR + "/dptrain --data.train " + data + " --data.test " + data +
                 " --model.layers 150,150 --train.batch_per_rank 50 --train.epochs 20 --train.optimizer adam"
                 " --train.lr 0.05 --checkpoint.dir " + ck + " --log.metrics " + path("many.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::string checkpoint;
  for (const auto& e : fs::directory_iterator(ck))
    if (e.path().extension() == ".h5" && e.path().string() > checkpoint) checkpoint = e.path().string();
  ASSERT_FALSE(checkpoint.empty()) << r.out;
  r = sh(cli::mpirun(2) + DPT_BINARY_DIR + "/dptrain --eval --checkpoint " + checkpoint);
  ASSERT_EQ(r.code, 0) << r.out;
  const size_t head = r.out.find("the 100 of 150 classes with the lowest accuracy, lowest first:\n");
  ASSERT_NE(head, std::string::npos) << r.out;
  std::istringstream lines(r.out.substr(head));
  std::string line;
  std::getline(lines, line);
  std::getline(lines, line);  // the column heads
  std::vector<std::pair<int, double>> rows;
  while (rows.size() < 100 && std::getline(lines, line)) {
    int c = -1;
    long long count = 0, correct = 0;
    double acc = -1;
    ASSERT_EQ(std::sscanf(line.c_str(), "%d %lld %lld %lf", &c, &count, &correct, &acc), 4) << line;
    EXPECT_EQ(count, 4) << line;
    EXPECT_NEAR(acc, double(correct) / 4, 1e-9) << line;
    rows.emplace_back(c, acc);
  }
  ASSERT_EQ(rows.size(), 100u) << r.out;
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_LE(rows[i - 1].second, rows[i].second) << "row " << i << "\n" << r.out;
  // Zero rows all get one answer: at most one of the 30 zero classes is right.
  EXPECT_GE(rows.front().first, 100) << r.out;
  EXPECT_EQ(rows.front().second, 0.0) << r.out;
  int zero_classes_shown = 0;
  for (const auto& [c, acc] : rows) zero_classes_shown += c >= 120;
  EXPECT_GE(zero_classes_shown, 29) << r.out;
  std::getline(lines, line);
  double rest = -1;
  ASSERT_EQ(std::sscanf(line.c_str(), "  (50 more classes, each at accuracy %lf or more)", &rest), 1) << line;
  EXPECT_GE(rest, rows.back().second) << line;
}
