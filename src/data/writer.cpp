// Writing a dataset in the layout of DESIGN.md (dpdata): checked for consistency first, written
// to a temporary file, flushed, fsynced and renamed, so readers see the old file or the new one.
#include "internal.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "dpt/check.hpp"

namespace dpt {
using namespace data_internal;

namespace {

Hid created(hid_t id, Hid::Closer close, const std::string& path, const char* what) {
  if (id < 0) throw Error("writing '" + path + "': " + what + ": " + hdf5_error_string());
  return Hid(id, close);
}

void write_scalar_attr(const std::string& path, hid_t obj, const char* name, hid_t file_type,
                       hid_t mem_type, const void* value) {
  Hid space = created(H5Screate(H5S_SCALAR), H5Sclose, path, name);
  Hid a = created(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                  H5Aclose, path, name);
  if (H5Awrite(a.get(), mem_type, value) < 0)
    throw Error("writing '" + path + "': attribute " + name + ": " + hdf5_error_string());
}

// Features are written contiguous and uncompressed: every rank reads the whole file at start-up,
// and a plain read is many times faster than inflating (Fashion-MNIST: 47 MB read in tens of
// milliseconds, against about half a second per rank to inflate it). Files written by h5py with
// gzip still load.
Hid features_dcpl(const std::string& path, const Dataset&, const std::vector<hsize_t>&) {
  return created(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, path, "properties");
}

// Root attribute class_names: variable-length UTF-8 strings, name i for class i (h5py reads a
// list of str).
void write_class_names(const std::string& path, hid_t file, const std::vector<std::string>& names) {
  std::vector<const char*> ptrs;
  for (const std::string& n : names) ptrs.push_back(n.c_str());
  const hsize_t count = ptrs.size();
  Hid type = created(H5Tcopy(H5T_C_S1), H5Tclose, path, "class_names type");
  if (H5Tset_size(type.get(), H5T_VARIABLE) < 0 || H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0)
    throw Error("writing '" + path + "': class_names type: " + hdf5_error_string());
  Hid space = created(H5Screate_simple(1, &count, nullptr), H5Sclose, path, "class_names space");
  Hid a = created(H5Acreate2(file, "class_names", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                  path, "class_names");
  if (H5Awrite(a.get(), type.get(), ptrs.data()) < 0)
    throw Error("writing '" + path + "': attribute class_names: " + hdf5_error_string());
}

void check_writable(const std::string& path, const Dataset& ds) {
  int64_t shape_dim = 1;
  for (int64_t s : ds.sample_shape) shape_dim *= s;
  const size_t count = size_t(ds.n) * size_t(ds.dim);
  if (ds.n < 1 || ds.dim < 1 || (!ds.sample_shape.empty() && shape_dim != ds.dim) ||
      (ds.is_u8 ? ds.u8.size() : ds.f32.size()) != count || ds.labels.size() != size_t(ds.n) ||
      ds.num_classes < 1 || ds.class_names.size() > size_t(ds.num_classes))
    throw Error("writing '" + path + "': inconsistent dataset (n, dim, shape or sizes disagree)");
  for (size_t i = 0; i < ds.labels.size(); ++i)
    if (ds.labels[i] < 0 || ds.labels[i] >= ds.num_classes)
      throw Error("writing '" + path + "': label " + std::to_string(ds.labels[i]) + " of row " +
                  std::to_string(i) + " is outside [0, num_classes)");
}

void write_contents(const std::string& path, hid_t file, const Dataset& ds) {
  std::vector<hsize_t> dims{hsize_t(ds.n)};
  if (ds.sample_shape.empty()) dims.push_back(hsize_t(ds.dim));
  for (int64_t s : ds.sample_shape) dims.push_back(hsize_t(s));
  Hid fspace = created(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose, path,
                       "features space");
  Hid dcpl = features_dcpl(path, ds, dims);
  Hid feat = created(H5Dcreate2(file, "features", ds.is_u8 ? H5T_STD_U8LE : H5T_IEEE_F32LE,
                                fspace.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                     H5Dclose, path, "/features");
  const herr_t rc = ds.is_u8 ? H5Dwrite(feat.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL,
                                        H5P_DEFAULT, ds.u8.data())
                             : H5Dwrite(feat.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL,
                                        H5P_DEFAULT, ds.f32.data());
  if (rc < 0) throw Error("writing '" + path + "': /features: " + hdf5_error_string());
  write_scalar_attr(path, feat.get(), "scale", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, &ds.scale);
  write_scalar_attr(path, feat.get(), "offset", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, &ds.offset);

  const hsize_t n = hsize_t(ds.n);
  Hid lspace = created(H5Screate_simple(1, &n, nullptr), H5Sclose, path, "labels space");
  Hid lab = created(H5Dcreate2(file, "labels", H5T_STD_I32LE, lspace.get(), H5P_DEFAULT,
                               H5P_DEFAULT, H5P_DEFAULT),
                    H5Dclose, path, "/labels");
  if (H5Dwrite(lab.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, ds.labels.data()) < 0)
    throw Error("writing '" + path + "': /labels: " + hdf5_error_string());
  const int32_t nc = ds.num_classes;
  write_scalar_attr(path, file, "num_classes", H5T_STD_I32LE, H5T_NATIVE_INT32, &nc);
  if (!ds.class_names.empty()) write_class_names(path, file, ds.class_names);
}

void fsync_path(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error("writing '" + path + "': cannot reopen for fsync: " + std::strerror(errno));
  const int rc = fsync(fd);
  close(fd);
  if (rc != 0) throw Error("writing '" + path + "': fsync: " + std::strerror(errno));
}

}  // namespace

void write_dataset(const std::string& path, const Dataset& ds) {
  check_writable(path, ds);
  quiet_hdf5();
  // Same directory, so the rename is atomic: readers see the old file or the whole new one.
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  try {
    {
      Hid file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
      if (!file.ok())
        throw InputError("cannot create '" + tmp + "' (does the directory exist and is it "
                         "writable?): " + hdf5_error_string());
      write_contents(path, file.get(), ds);
      if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0)
        throw Error("writing '" + path + "': flush: " + hdf5_error_string());
    }
    fsync_path(tmp);
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error("writing '" + path + "': rename from " + tmp + ": " + std::strerror(errno));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

}  // namespace dpt
