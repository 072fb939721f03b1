// Helpers of the data-layer tests (test_data, test_data_order): a temporary directory, a raw
// HDF5 writer that can produce valid files in h5py's style or break one field at a time, and a
// small dataset with known contents.
#pragma once
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "dpt/data.hpp"

namespace dpt::data_test {

namespace fs = std::filesystem;

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

inline uint64_t product(const std::vector<hsize_t>& d) {
  uint64_t p = 1;
  for (hsize_t x : d) p *= x;
  return p;
}

inline void scalar_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* v) {
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(a, 0) << name;
  ASSERT_GE(H5Awrite(a, mem_type, v), 0) << name;
  H5Aclose(a);
  H5Sclose(space);
}

inline void write_features(hid_t f, const Spec& s) {
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

inline void write_labels(hid_t f, const Spec& s) {
  hid_t space = H5Screate_simple(int(s.label_dims.size()), s.label_dims.data(), nullptr);
  hid_t d = H5Dcreate2(f, "labels", s.label_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(d, 0) << "creating /labels";
  std::vector<int64_t> v(product(s.label_dims));
  for (size_t i = 0; i < v.size(); ++i) v[i] = s.label_values[i % s.label_values.size()];
  ASSERT_GE(H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
  H5Dclose(d);
  H5Sclose(space);
}

inline void write_spec(const std::string& path, const Spec& s) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0) << path;
  if (s.features) write_features(f, s);
  if (s.labels) write_labels(f, s);
  if (s.num_classes)
    scalar_attr(f, "num_classes", s.num_classes_type, H5T_NATIVE_INT64, &s.num_classes_value);
  H5Fclose(f);
}

inline dpt::Dataset small_dataset(bool u8, int64_t n, std::vector<int64_t> shape, int classes) {
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

}  // namespace dpt::data_test
