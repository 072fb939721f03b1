// What the parts of the data layer (src/data/) share: HDF5 handles, the error for a broken
// dataset file, overflow-checked sizes and the memory cap, and a file opened and checked against
// the layout of DESIGN.md. Private to src/data/.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>

#include "dpt/data.hpp"
#include "dpt/h5.hpp"

namespace dpt::data_internal {

using Hid = H5Id;

// common.cpp
void quiet_hdf5();
[[noreturn]] void bad(const std::string& path, const std::string& what);
bool mul_ok(uint64_t a, uint64_t b, uint64_t& out);
uint64_t memory_cap();

// An open, checked file: handles stay open so the loader can read what the probe checked.
struct Opened {
  Hid file, features, labels;
  DatasetInfo info;
};

// validate.cpp: opens path and checks it against the layout (whole: all of it is to be read).
Opened open_checked(const std::string& path, bool whole = true);

// reader.cpp: a Dataset with info's shape and no rows yet.
Dataset empty_like(const std::string& path, const DatasetInfo& info);

}  // namespace dpt::data_internal
