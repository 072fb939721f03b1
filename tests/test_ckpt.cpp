// Checkpoint tests: bit-exact round trip, h5dump readability, rejection of truncated, bit-flipped,
// foreign and inconsistent files, atomic write under failure and under SIGKILL, the folder
// helpers, and the writer's thread (one write at a time, failures reported, none lost). The sample file left in the build folder is read by ckpt_h5py_check.py (h5py oracle).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dpt/check.hpp"
#include "dpt/ckpt.hpp"
#include "dpt/ckpt_folder.hpp"
#include "dpt/ckpt_writer.hpp"

namespace fs = std::filesystem;
using dpt::Checkpoint;
using dpt::Tensor;

namespace {

// Exactly representable values, so C++ and numpy agree bit for bit (ckpt_h5py_check.py has the
// same formula): the salt is crc32 of the name, so each tensor differs.
float pattern(const std::string& name, size_t k) {
  uint32_t salt = uint32_t(crc32(0L, reinterpret_cast<const Bytef*>(name.data()), uInt(name.size())));
  return float(int64_t((k * 7 + salt % 1001) % 1001) - 500) / 256.0f;
}

Tensor make_tensor(const std::string& name, std::vector<int64_t> shape) {
  Tensor t{name, shape, {}};
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  for (size_t k = 0; k < n; ++k) t.data.push_back(pattern(name, k));
  return t;
}

Checkpoint make_ckpt(std::vector<int> layers, int64_t step, bool adam = true) {
  Checkpoint ck;
  ck.step = step;
  ck.epoch = 3;
  ck.step_in_epoch = 17;
  ck.samples_seen = step * 256;
  ck.world_size = 4;
  ck.global_batch = 256;
  ck.seed = 0xfedcba9876543210ull;  // high bit set: catches a signed round trip
  ck.optimizer = adam ? "adam" : "sgd";
  ck.config = "[model]\nlayers = 5,4,3\n";
  for (int i = 0; i < 400; ++i) ck.config += "# padding line " + std::to_string(i) + " äöü\n";
  ck.layers = layers;
  std::vector<std::string> groups = {"model"};
  if (adam) groups = {"model", "optimizer/exp_avg", "optimizer/exp_avg_sq"};
  for (const auto& g : groups)
    for (size_t i = 0; i + 1 < layers.size(); ++i) {
      std::string fc = g + "/fc" + std::to_string(i);
      ck.tensors.push_back(make_tensor(fc + "/weight", {layers[i + 1], layers[i]}));
      ck.tensors.push_back(make_tensor(fc + "/bias", {layers[i + 1]}));
    }
  return ck;
}

// A fresh folder per test under the build tree.
std::string test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path d = fs::path(DPT_BINARY_DIR) / "test-ckpt-tmp" / info->name();
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}

// Runs f and returns the InputError message ("" and a failure if none is thrown).
template <class F>
std::string input_error(F f) {
  try {
    f();
  } catch (const dpt::InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InputError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected InputError, nothing thrown";
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void expect_same(const Checkpoint& a, const Checkpoint& b) {
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.step_in_epoch, b.step_in_epoch);
  EXPECT_EQ(a.samples_seen, b.samples_seen);
  EXPECT_EQ(a.world_size, b.world_size);
  EXPECT_EQ(a.global_batch, b.global_batch);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.config, b.config);
  EXPECT_EQ(a.layers, b.layers);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const Tensor& t : a.tensors) {
    const Tensor* u = b.find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(t.shape, u->shape) << t.name;
    ASSERT_EQ(t.data.size(), u->data.size()) << t.name;
    EXPECT_EQ(0, std::memcmp(t.data.data(), u->data.data(), t.data.size() * sizeof(float)))
        << t.name << " differs";
  }
}

// Opens a written checkpoint for surgery with the raw HDF5 API.
// Edits a checkpoint in place with the raw HDF5 API, then re-seals it (as a tool that edits
// checkpoints must), so that the reader's HDF5-level checks are what the test sees.
struct RawFile {
  std::string path;
  hid_t id;
  explicit RawFile(const std::string& p)
      : path(p), id(H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {}
  ~RawFile() {
    if (id >= 0) H5Fclose(id);
    dpt::seal_checkpoint(path);
  }
};

void set_int_attr(hid_t obj, const char* name, hid_t type, const void* values, hsize_t n) {
  H5Adelete(obj, name);
  hid_t space = n ? H5Screate_simple(1, &n, nullptr) : H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, type, values);
  H5Aclose(a);
  H5Sclose(space);
}

}  // namespace

TEST(Ckpt, PathsAndFind) {
  EXPECT_EQ(dpt::checkpoint_path("runs/a", 42), "runs/a/ckpt-000000042.h5");
  EXPECT_EQ(dpt::checkpoint_path("runs/a/", 1234567890), "runs/a/ckpt-1234567890.h5");
  Checkpoint ck = make_ckpt({5, 4, 3}, 1);
  ASSERT_NE(ck.find("model/fc1/bias"), nullptr);
  EXPECT_EQ(ck.find("model/fc1/bias")->shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(ck.find("model/fc9/bias"), nullptr);
}

TEST(Ckpt, RoundTripIsBitExact) {
  std::string dir = test_dir() + "/not/yet/there";  // the writer creates folders
  Checkpoint ck = make_ckpt({7, 33, 5, 2}, 123);
  ck.tensors.push_back(make_tensor("optimizer/scalar_state", {}));  // 0-d free-form state
  ck.tensors[0].data[3] = -0.0f;  // sign of zero must survive
  std::string p = dpt::checkpoint_path(dir, ck.step);
  dpt::write_checkpoint(p, ck);
  Checkpoint back = dpt::read_checkpoint(p);
  expect_same(ck, back);
  EXPECT_TRUE(std::signbit(back.find(ck.tensors[0].name)->data[3]));
  EXPECT_TRUE(std::is_sorted(back.tensors.begin(), back.tensors.end(),
                             [](const Tensor& a, const Tensor& b) { return a.name < b.name; }));
  // Overwriting the same name replaces it atomically.
  ck.step_in_epoch = 99;
  dpt::write_checkpoint(p, ck);
  EXPECT_EQ(dpt::read_checkpoint(p).step_in_epoch, 99);
}

TEST(Ckpt, WritesSampleForPythonCheck) {
  // ckpt_h5py_check.py (ctest fixture ckpt_sample) reads this file and checks it with h5py.
  std::string p = std::string(DPT_BINARY_DIR) + "/test-ckpt-sample.h5";
  dpt::write_checkpoint(p, make_ckpt({5, 4, 3}, 7));
  expect_same(make_ckpt({5, 4, 3}, 7), dpt::read_checkpoint(p));
}

TEST(Ckpt, ReadableByH5dump) {
  if (std::system("command -v h5dump >/dev/null 2>&1") != 0) GTEST_SKIP() << "h5dump not installed";
  std::string p = test_dir() + "/c.h5";
  dpt::write_checkpoint(p, make_ckpt({5, 4, 3}, 7));
  std::string cmd = "h5dump -A '" + p + "' 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  int rc = pclose(f);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(contains(out, "\"dptrain-checkpoint\"")) << out.substr(0, 2000);
  EXPECT_TRUE(contains(out, "DATASET \"weight\"")) << out.substr(0, 2000);
  EXPECT_TRUE(contains(out, "checksum_crc32"));
}

TEST(Ckpt, RejectsMissingEmptyAndNonHdf5) {
  std::string dir = test_dir();
  EXPECT_TRUE(contains(input_error([&] { dpt::read_checkpoint(dir + "/nope.h5"); }), "not found"));
  write_bytes(dir + "/empty.h5", "");
  EXPECT_TRUE(contains(input_error([&] { dpt::read_checkpoint(dir + "/empty.h5"); }), "empty"));
  write_bytes(dir + "/text.h5", std::string(5000, 'x'));
  std::string msg = input_error([&] { dpt::read_checkpoint(dir + "/text.h5"); });
  EXPECT_TRUE(contains(msg, "not an HDF5 file")) << msg;
  EXPECT_TRUE(contains(msg, dir + "/text.h5")) << msg;
}

TEST(Ckpt, RejectsTruncatedFiles) {
  std::string dir = test_dir();
  std::string p = dir + "/full.h5";
  dpt::write_checkpoint(p, make_ckpt({50, 40, 30}, 7));
  std::string bytes = read_bytes(p);
  const size_t n = bytes.size();
  for (size_t cut : {size_t(1), size_t(8), size_t(100), size_t(600), size_t(2000), n / 4, n / 2,
                     3 * n / 4, n - 100, n - 1}) {
    std::string q = dir + "/cut-" + std::to_string(cut) + ".h5";
    write_bytes(q, bytes.substr(0, cut));
    std::string msg = input_error([&] { dpt::read_checkpoint(q); });
    EXPECT_TRUE(contains(msg, q)) << "cut at " << cut << ": " << msg;
  }
}

TEST(Ckpt, BitFlipsInDataFailTheChecksum) {
  std::string dir = test_dir();
  std::string p = dir + "/c.h5";
  dpt::write_checkpoint(p, make_ckpt({50, 40, 30}, 7));
  haddr_t offset;
  {
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "model/fc0/weight", H5P_DEFAULT);
    offset = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
  }
  ASSERT_NE(offset, HADDR_UNDEF);
  std::string bytes = read_bytes(p);
  for (size_t k : {size_t(0), size_t(1), size_t(777), size_t(40 * 50 * 4 - 1)}) {
    std::string flipped = bytes;
    flipped[offset + k] ^= char(1 << (k % 8));
    std::string q = dir + "/flip-" + std::to_string(k) + ".h5";
    write_bytes(q, flipped);
    std::string msg = input_error([&] { dpt::read_checkpoint(q); });
    EXPECT_TRUE(contains(msg, "checksum")) << msg;
  }
}

TEST(Ckpt, RejectsForeignHdf5) {
  std::string dir = test_dir();
  std::string p = dir + "/dataset.h5";
  {  // a dataset file in the data layout: valid HDF5, not a checkpoint
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t dims[2] = {4, 3};
    hid_t s = H5Screate_simple(2, dims, nullptr);
    hid_t d = H5Dcreate2(f, "features", H5T_NATIVE_FLOAT, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(d);
    H5Sclose(s);
    H5Fclose(f);
  }
  std::string msg = input_error([&] { dpt::read_checkpoint(p); });
  EXPECT_TRUE(contains(msg, "format")) << msg;
  EXPECT_TRUE(contains(msg, "not a dptrain checkpoint")) << msg;

  std::string q = dir + "/other.h5";
  dpt::write_checkpoint(q, make_ckpt({5, 4, 3}, 1));
  {
    RawFile f(q);
    H5Adelete(f.id, "format");
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, 9);  // fixed-length, as other tools write it
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f.id, "format", t, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, "otherfmt");
    H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
  }
  msg = input_error([&] { dpt::read_checkpoint(q); });
  EXPECT_TRUE(contains(msg, "format = \"otherfmt\"")) << msg;
}

// An edit that does not re-seal the file is damage as far as the reader knows, and it is
// caught before HDF5 parses the file.
TEST(Ckpt, UnsealedEditIsRejectedBeforeHdf5Reads) {
  std::string p = test_dir() + "/unsealed.h5";
  dpt::write_checkpoint(p, make_ckpt({5, 4, 3}, 1));
  {
    hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Adelete(f, "samples_seen");
    H5Fclose(f);
  }
  std::string msg = input_error([&] { dpt::read_checkpoint(p); });
  EXPECT_TRUE(contains(msg, "file checksum mismatch")) << msg;
}

TEST(Ckpt, RejectsBadVersionMissingAttributesAndShapes) {
  std::string dir = test_dir();
  auto fresh = [&](const std::string& name) {
    std::string p = dir + "/" + name;
    dpt::write_checkpoint(p, make_ckpt({5, 4, 3}, 1));
    return p;
  };
  std::string p = fresh("version.h5");
  { RawFile f(p); int v = 99; set_int_attr(f.id, "version", H5T_NATIVE_INT, &v, 0); }
  std::string msg = input_error([&] { dpt::read_checkpoint(p); });
  EXPECT_TRUE(contains(msg, "version 99 is not supported")) << msg;

  p = fresh("missing.h5");
  { RawFile f(p); H5Adelete(f.id, "samples_seen"); }
  msg = input_error([&] { dpt::read_checkpoint(p); });
  EXPECT_TRUE(contains(msg, "missing attribute 'samples_seen'")) << msg;

  p = fresh("layers.h5");
  { RawFile f(p); int l[3] = {5, 6, 3}; set_int_attr(f.id, "layers", H5T_NATIVE_INT, l, 3); }
  msg = input_error([&] { dpt::read_checkpoint(p); });
  EXPECT_TRUE(contains(msg, "model/fc0/bias has shape (4) but layers require (6)")) << msg;

  p = fresh("absurd.h5");  // a layers attribute that would ask for petabytes
  { RawFile f(p); int l[3] = {1 << 25, 1 << 25, 3}; set_int_attr(f.id, "layers", H5T_NATIVE_INT, l, 3); }
  msg = input_error([&] { dpt::read_checkpoint(p); });
  EXPECT_TRUE(contains(msg, "but layers require")) << msg;

  p = fresh("extra.h5");  // a model tensor that no layer explains
  {
    RawFile f(p);
    hsize_t n = 3;
    hid_t s = H5Screate_simple(1, &n, nullptr);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t d = H5Dcreate2(f.id, "model/fc7/bias", H5T_NATIVE_FLOAT, s, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(d);
    H5Pclose(lcpl);
    H5Sclose(s);
  }
  msg = input_error([&] { dpt::read_checkpoint(p); });
  EXPECT_TRUE(contains(msg, "fc7")) << msg;
}

TEST(Ckpt, WriterRejectsInconsistentCheckpoints) {
  std::string dir = test_dir();
  Checkpoint ck = make_ckpt({5, 4, 3}, 1);
  ck.tensors[0].data.pop_back();
  EXPECT_THROW(dpt::write_checkpoint(dir + "/a.h5", ck), dpt::Error);
  ck = make_ckpt({5, 4, 3}, 1);
  ck.layers = {5, 4, 4};
  EXPECT_THROW(dpt::write_checkpoint(dir + "/b.h5", ck), dpt::Error);
  EXPECT_TRUE(dpt::list_checkpoints(dir).empty());
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(Ckpt, FailedWriteLeavesNothingBehind) {
  std::string dir = test_dir();
  // Tests run as root, so permissions cannot block a write; a regular file in the way can.
  write_bytes(dir + "/blocker", "x");
  std::string p = dpt::checkpoint_path(dir + "/blocker/sub", 1);
  try {
    dpt::write_checkpoint(p, make_ckpt({5, 4, 3}, 1));
    ADD_FAILURE() << "no exception";
  } catch (const dpt::Error& e) {
    EXPECT_TRUE(contains(e.what(), p)) << e.what();
  }
  EXPECT_FALSE(fs::exists(p));

  // A failure halfway through HDF5 (a dataset where a group must go) removes the temporary
  // file and leaves the previous checkpoint under the final name untouched.
  p = dpt::checkpoint_path(dir, 5);
  Checkpoint good = make_ckpt({5, 4, 3}, 5);
  dpt::write_checkpoint(p, good);
  Checkpoint bad = make_ckpt({5, 4, 3}, 6);
  bad.tensors.push_back(make_tensor("optimizer/x", {2}));
  bad.tensors.push_back(make_tensor("optimizer/x/y", {2}));
  EXPECT_THROW(dpt::write_checkpoint(p, bad), dpt::Error);
  expect_same(good, dpt::read_checkpoint(p));
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 2u) << "temporary file left behind";
}

TEST(Ckpt, ListPruneAndFallBackPastDamage) {
  std::string dir = test_dir();
  EXPECT_EQ(dpt::find_latest_valid(dir + "/missing"), "");
  EXPECT_TRUE(dpt::list_checkpoints(dir + "/missing").empty());
  for (int64_t s : {10, 20, 30, 1000000000}) {
    Checkpoint ck = make_ckpt({5, 4, 3}, s);
    ck.run_id = "r1";
    dpt::write_checkpoint(dpt::checkpoint_path(dir, s), ck);
  }
  write_bytes(dir + "/.ckpt-000000040.h5.tmp.123", "partial");
  write_bytes(dir + "/ckpt-latest.h5", "not ours");
  write_bytes(dir + "/notes.txt", "x");
  std::vector<std::string> want = {dpt::checkpoint_path(dir, 1000000000), dpt::checkpoint_path(dir, 30),
                                   dpt::checkpoint_path(dir, 20), dpt::checkpoint_path(dir, 10)};
  EXPECT_EQ(dpt::list_checkpoints(dir), want);
  EXPECT_EQ(dpt::find_latest_valid(dir), want[0]);

  // Newest two damaged (truncated, then bit-flipped tail): fall back to step 20.
  std::string b = read_bytes(want[0]);
  write_bytes(want[0], b.substr(0, b.size() / 2));
  write_bytes(want[1], "garbage");
  EXPECT_EQ(dpt::find_latest_valid(dir), want[2]);
  // The checkpoint it validated comes back with the path (resume reads it once, not twice).
  dpt::Checkpoint found;
  EXPECT_EQ(dpt::find_latest_valid(dir, &found), want[2]);
  EXPECT_EQ(found.step, 20);
  EXPECT_EQ(found.layers, (std::vector<int>{5, 4, 3}));

  // A temporary file from a save killed long ago goes; a fresh one may be a save in progress.
  write_bytes(dir + "/.ckpt-000000050.h5.tmp.99", "old partial");
  fs::last_write_time(dir + "/.ckpt-000000050.h5.tmp.99",
                      fs::file_time_type::clock::now() - std::chrono::hours(2));
  // keep = 1 of run r1: step 10 goes; the two damaged files name no owner and stay.
  dpt::prune_checkpoints(dir, 1, "r1");
  EXPECT_FALSE(fs::exists(dir + "/.ckpt-000000050.h5.tmp.99"));
  EXPECT_TRUE(fs::exists(dir + "/.ckpt-000000040.h5.tmp.123"));
  EXPECT_EQ(dpt::list_checkpoints(dir), std::vector<std::string>(want.begin(), want.begin() + 3));
  dpt::prune_checkpoints(dir, 0, "r1");  // keep all
  EXPECT_EQ(dpt::list_checkpoints(dir).size(), 3u);

  write_bytes(want[2], "");
  EXPECT_EQ(dpt::find_latest_valid(dir), "");
  EXPECT_TRUE(fs::exists(dir + "/.ckpt-000000040.h5.tmp.123"));
}

// kill -9 during save: a child writes a large checkpoint and is killed at offsets spread over
// the time one save takes. Whatever the moment, every ckpt-*.h5 must be valid and the newest
// valid one is the new step if its rename happened, else the previous one.
TEST(Ckpt, SigkillDuringSaveNeverLeavesADamagedCheckpoint) {
  std::string dir = test_dir();
  const std::vector<int> layers = {1024, 2048, 2048, 10};  // ~25 MB of model + ~25 MB state
  Checkpoint ck = make_ckpt(layers, 1, false);
  for (const Tensor& t : make_ckpt(layers, 1, true).tensors)
    if (t.name.rfind("optimizer/exp_avg/", 0) == 0) ck.tensors.push_back(t);
  auto t0 = std::chrono::steady_clock::now();
  dpt::write_checkpoint(dpt::checkpoint_path(dir, 1), ck);
  double save_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

  int64_t latest = 1, killed = 0;
  for (int k = 0; k < 10; ++k) {
    ck.step = latest + 1;
    std::string next = dpt::checkpoint_path(dir, ck.step);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // child: no gtest, no MPI, no atexit handlers
      try {
        dpt::write_checkpoint(next, ck);
      } catch (...) {
        _exit(1);
      }
      _exit(0);
    }
    // Offsets spread over one save; the last one is long enough for the save to finish.
    double delay_us = k < 9 ? save_us * k / 8.0 + 50 * k : 3 * save_us + 200000;
    usleep(useconds_t(delay_us));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) ++killed;
    if (WIFEXITED(status)) {
      EXPECT_EQ(WEXITSTATUS(status), 0);
    }
    for (const std::string& p : dpt::list_checkpoints(dir))
      EXPECT_NO_THROW(dpt::read_checkpoint(p)) << "offset " << k << ": " << p;
    std::string want = fs::exists(next) ? next : dpt::checkpoint_path(dir, latest);
    EXPECT_EQ(dpt::find_latest_valid(dir), want) << "offset " << k;
    if (fs::exists(next)) latest = ck.step;
  }
  std::printf("save takes %.0f us; %lld of 10 children killed mid-save, newest step %lld\n",
              save_us, (long long)killed, (long long)latest);
}

// A layer list's checkpoint: `model` and `input_shape` instead of `layers`, conv tensors of
// rank 4, all checked against the list planned on that input.
TEST(Ckpt, LayerListRoundTripAndShapeChecks) {
  std::string dir = test_dir();
  Checkpoint ck = make_ckpt({5, 4, 3}, 9);
  ck.layers.clear();
  ck.model = "conv(4,3,stride=1,pad=1) relu maxpool(2,stride=2) flatten linear(3)";
  ck.input_shape = {2, 4, 4};
  ck.tensors.clear();
  for (std::string g : {"model", "optimizer/exp_avg", "optimizer/exp_avg_sq"}) {
    ck.tensors.push_back(make_tensor(g + "/conv0/weight", {4, 2, 3, 3}));
    ck.tensors.push_back(make_tensor(g + "/conv0/bias", {4}));
    ck.tensors.push_back(make_tensor(g + "/fc0/weight", {3, 16}));
    ck.tensors.push_back(make_tensor(g + "/fc0/bias", {3}));
  }
  const std::string p = dir + "/cnn.h5";
  dpt::write_checkpoint(p, ck);
  Checkpoint back = dpt::read_checkpoint(p);
  EXPECT_EQ(back.model, ck.model);
  EXPECT_EQ(back.input_shape, ck.input_shape);
  EXPECT_TRUE(back.layers.empty());
  ASSERT_EQ(back.tensors.size(), ck.tensors.size());
  const Tensor* w = back.find("model/conv0/weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{4, 2, 3, 3}));
  EXPECT_EQ(w->data, ck.find("model/conv0/weight")->data);

  // The writer refuses what the reader would: a wrong conv shape, a missing tensor, a layer the
  // model lacks, an unusable list or input shape.
  auto refused = [&](Checkpoint bad) {
    try {
      dpt::write_checkpoint(dir + "/bad.h5", bad);
    } catch (const dpt::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  Checkpoint bad = ck;
  bad.tensors[0] = make_tensor("model/conv0/weight", {4, 2, 5, 5});
  EXPECT_TRUE(contains(refused(bad), "model/conv0/weight has shape (4, 2, 5, 5) but the model requires (4, 2, 3, 3)"));
  bad = ck;
  bad.tensors.erase(bad.tensors.begin() + 1);
  EXPECT_TRUE(contains(refused(bad), "model/conv0/bias is missing"));
  bad = ck;
  bad.tensors.push_back(make_tensor("model/conv1/bias", {4}));
  EXPECT_TRUE(contains(refused(bad), "names layer conv1, which the model does not have"));
  bad = ck;
  bad.model = "conv(4,9) flatten linear(3)";
  EXPECT_TRUE(contains(refused(bad), "model attribute: layer 1"));
  bad = ck;
  bad.input_shape = {2, 4};
  EXPECT_TRUE(contains(refused(bad), "input_shape has 2 entries"));

  // The same checks on read: a file whose model attribute was edited (and re-sealed).
  const std::string q = dir + "/edited.h5";
  dpt::write_checkpoint(q, ck);
  {
    hid_t f = H5Fopen(q.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Adelete(f, "model");
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, "model", t, s, H5P_DEFAULT, H5P_DEFAULT);
    const char* text = "conv(4,5,stride=1,pad=1) relu maxpool(2,stride=2) flatten linear(3)";
    H5Awrite(a, t, &text);
    H5Aclose(a), H5Sclose(s), H5Tclose(t), H5Fclose(f);
  }
  dpt::seal_checkpoint(q);
  const std::string msg = input_error([&] { dpt::read_checkpoint(q); });
  EXPECT_TRUE(contains(msg, "model/conv0/weight has shape (4, 2, 3, 3) but the model requires (4, 2, 5, 5)")) << msg;
}

// A run prunes and overwrites only its own checkpoints, and a fresh run does not start in a
// folder holding another run's: the folder of two runs that share a checkpoint.dir.
TEST(CkptFolder, PruneAndOverwriteOnlyOwn) {
  std::string dir = test_dir();
  auto put = [&](int64_t step, const std::string& run) {
    Checkpoint ck = make_ckpt({5, 4, 3}, step);
    ck.run_id = run;
    dpt::write_checkpoint(dpt::checkpoint_path(dir, step), ck);
  };
  for (int64_t s : {100, 200, 300}) put(s, "first");
  for (int64_t s : {10, 20, 30, 40}) put(s, "second");
  put(5, "");  // a checkpoint of an older version: no owner
  EXPECT_EQ(dpt::read_checkpoint_run_id(dpt::checkpoint_path(dir, 10)), "second");
  EXPECT_EQ(dpt::read_checkpoint(dpt::checkpoint_path(dir, 10)).run_id, "second");
  EXPECT_EQ(dpt::read_checkpoint_run_id(dpt::checkpoint_path(dir, 5)), "");
  dpt::prune_checkpoints(dir, 3, "second");
  std::vector<std::string> want;
  for (int64_t s : {300, 200, 100, 40, 30, 20, 5}) want.push_back(dpt::checkpoint_path(dir, s));
  EXPECT_EQ(dpt::list_checkpoints(dir), want) << "the second run pruned only its own step 10";
  dpt::prune_checkpoints(dir, 1, "first");
  EXPECT_FALSE(fs::exists(dpt::checkpoint_path(dir, 100)));
  EXPECT_FALSE(fs::exists(dpt::checkpoint_path(dir, 200)));
  EXPECT_TRUE(fs::exists(dpt::checkpoint_path(dir, 300)));
  EXPECT_TRUE(fs::exists(dpt::checkpoint_path(dir, 20)));
  EXPECT_TRUE(fs::exists(dpt::checkpoint_path(dir, 5)));

  EXPECT_NO_THROW(dpt::check_may_write(dpt::checkpoint_path(dir, 40), "second"));  // its own
  EXPECT_NO_THROW(dpt::check_may_write(dpt::checkpoint_path(dir, 50), "second"));  // new
  try {
    dpt::check_may_write(dpt::checkpoint_path(dir, 300), "second");
    ADD_FAILURE() << "overwrite of another run's checkpoint allowed";
  } catch (const dpt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("run first"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dpt::check_may_write(dpt::checkpoint_path(dir, 5), "second"), dpt::Error);
}

TEST(CkptFolder, FreshRunStopsOrSetsAside) {
  std::string dir = test_dir();
  // An empty or missing folder: a fresh run claims it with a new id.
  const dpt::FolderClaim empty = dpt::claim_checkpoint_folder(dir + "/none", "", "", false);
  EXPECT_EQ(empty.run_id.size(), 16u);
  EXPECT_NE(empty.run_id, dpt::claim_checkpoint_folder(dir + "/none", "", "", false).run_id);
  for (int64_t s : {100, 200, 300}) {
    Checkpoint ck = make_ckpt({5, 4, 3}, s);
    ck.run_id = "first";
    dpt::write_checkpoint(dpt::checkpoint_path(dir, s), ck);
  }
  const auto before = dpt::list_checkpoints(dir);
  try {
    dpt::claim_checkpoint_folder(dir, "", "", false);
    ADD_FAILURE() << "a fresh run claimed a folder holding another run's checkpoints";
  } catch (const dpt::InputError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.code(), dpt::kExitUsage);
    for (const char* w : {"--checkpoint.dir", "--checkpoint.resume auto", "--checkpoint.start_over true",
                          "ckpt-000000100.h5 .. ckpt-000000300.h5 (3 files)"})
      EXPECT_NE(m.find(w), std::string::npos) << w << " not in: " << m;
    EXPECT_NE(m.find(dir), std::string::npos) << m;
  }
  EXPECT_EQ(dpt::list_checkpoints(dir), before) << "a refused start touched the folder";

  // Resuming one of them continues its run and leaves the others be.
  const dpt::FolderClaim resumed = dpt::claim_checkpoint_folder(dir, before[0], "first", false);
  EXPECT_EQ(resumed.run_id, "first");
  EXPECT_EQ(resumed.others, 0u);

  // start_over: moved, not deleted, bit for bit.
  const std::string bytes = read_bytes(before[0]);
  const dpt::FolderClaim over = dpt::claim_checkpoint_folder(dir, "", "", true);
  EXPECT_TRUE(dpt::list_checkpoints(dir).empty());
  ASSERT_FALSE(over.set_aside.empty());
  EXPECT_EQ(fs::path(over.set_aside).parent_path(), fs::path(dir));
  EXPECT_EQ(fs::path(over.set_aside).filename().string().rfind("set-aside-", 0), 0u) << over.set_aside;
  EXPECT_EQ(dpt::list_checkpoints(over.set_aside).size(), 3u);
  EXPECT_EQ(read_bytes(over.set_aside + "/ckpt-000000300.h5"), bytes);
  EXPECT_NE(over.run_id, "first");
}

// ---- CheckpointWriter: a checkpoint's write on a thread of its own ----

// One write at a time, in order, off the caller's thread; a write's failure comes back once,
// from the next start() (which then does not run its own write) or from wait().
TEST(CheckpointWriter, OneAtATimeInOrderAndFailuresComeBackOnce) {
  dpt::CheckpointWriter w(true);
  ASSERT_EQ(w.background(), dpt::hdf5_threadsafe());
  if (!w.background()) GTEST_SKIP() << "this HDF5 is not thread-safe: writes run on the caller's thread";
  std::atomic<int> running{0}, most{0};
  std::vector<int> order;
  std::mutex m;
  const auto caller = std::this_thread::get_id();
  for (int k = 0; k < 4; ++k)
    w.start([&, k] {
      EXPECT_NE(std::this_thread::get_id(), caller);
      const int now = ++running;
      most = std::max(most.load(), now);
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      {
        std::lock_guard<std::mutex> g(m);
        order.push_back(k);
      }
      --running;
    });
  w.wait();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(most.load(), 1);

  w.start([] { throw dpt::Error("disk full", dpt::kExitRuntime); });
  bool ran = false;
  try {
    w.start([&] { ran = true; });
    ADD_FAILURE() << "no exception";
  } catch (const dpt::Error& e) {
    EXPECT_STREQ(e.what(), "disk full");
    EXPECT_EQ(e.code(), dpt::kExitRuntime);
  }
  EXPECT_FALSE(ran);
  EXPECT_NO_THROW(w.wait());  // reported once
  w.start([] { throw std::runtime_error("not a dpt error"); });
  EXPECT_THROW(w.wait(), std::runtime_error);
  EXPECT_NO_THROW(w.wait());
}

// start() returns while the write goes on, and the destructor waits for it: a checkpoint in
// flight when its writer goes (a run stopping on an error) reaches the disk whole.
TEST(CheckpointWriter, ReturnsAtOnceAndTheDestructorFinishesTheWrite) {
  const std::string p = dpt::checkpoint_path(test_dir(), 9);
  const Checkpoint ck = make_ckpt({5, 4, 3}, 9);
  std::atomic<bool> release{false};
  {
    dpt::CheckpointWriter w(true);
    if (!w.background()) GTEST_SKIP() << "this HDF5 is not thread-safe";
    w.start([&] {
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      dpt::write_checkpoint(p, ck);
    });
    EXPECT_FALSE(fs::exists(p));  // start() came back before the write
    release = true;
  }
  expect_same(ck, dpt::read_checkpoint(p));
}

// background = false: the write runs inside start(), on the caller's thread, and throws there.
TEST(CheckpointWriter, OnTheCallersThreadWhenNotInTheBackground) {
  dpt::CheckpointWriter w(false);
  EXPECT_FALSE(w.background());
  std::thread::id on;
  w.start([&] { on = std::this_thread::get_id(); });
  EXPECT_EQ(on, std::this_thread::get_id());
  EXPECT_THROW(w.start([] { throw dpt::Error("disk full"); }), dpt::Error);
  EXPECT_NO_THROW(w.wait());
}
