// What every part of the data layer shares: the error for a broken dataset file, HDF5's quiet
// mode, overflow-checked sizes and the memory cap.
#include "internal.hpp"

#include <unistd.h>

#include <algorithm>

#include "dpt/check.hpp"

namespace dpt::data_internal {

// Users see our messages, not HDF5's stack dumps; the stack is still walked for the detail.
void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw InputError("dataset file '" + path + "': " + what);
}

// a × b in uint64; false when it overflows (hostile dimensions are chosen to wrap).
bool mul_ok(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

// The most bytes a dataset may ask for: 64 GiB or 3/4 of physical memory, whichever is less,
// so a hostile header cannot make us allocate ourselves into the OOM killer.
uint64_t memory_cap() {
  uint64_t cap = uint64_t(64) << 30;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) cap = std::min(cap, uint64_t(pages) * uint64_t(page) / 4 * 3);
  return cap;
}

}  // namespace dpt::data_internal
