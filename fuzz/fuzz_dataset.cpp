// libFuzzer: the dataset reader on arbitrary bytes. The input is written to a file (HDF5 reads
// files) and loaded; a dpt::Error (InputError) is the expected answer to a broken file, anything
// else that escapes — a crash, a sanitizer report, another exception, a huge allocation — is a bug.
#include <unistd.h>

#include <hdf5.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dpt/check.hpp"
#include "dpt/data.hpp"
#include "fuzz_file.hpp"

// HDF5 keeps freed blocks on free lists that only grow; capped so that the process's size
// measures leaks, not the library's caching.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  H5set_free_list_limits(1 << 20, 1 << 18, 1 << 20, 1 << 18, 1 << 20, 1 << 18);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = dpt_fuzz::write_input("dataset", data, size);
  try {
    dpt::Dataset ds = dpt::load_dataset(path);
    // A file that loads must hold what it says: every row gathers, every label is in range.
    std::vector<float> x(size_t(ds.dim));
    int32_t y = 0;
    for (int64_t r = 0; r < ds.n; r += std::max<int64_t>(1, ds.n / 8)) {
      ds.gather(&r, 1, x.data(), &y);
      if (y < 0 || y >= ds.num_classes) __builtin_trap();
    }
  } catch (const dpt::Error&) {
  }
  // data.read = shard: the same file read a few rows at a time through hyperslab selections,
  // where the whole-file memory limit does not apply.
  try {
    dpt::RankOrder o;
    o.world = 2;
    o.rank = 1;
    o.batch = 3;
    dpt::TrainRows rows(path, o);
    // An epoch's order is a permutation of every row (8 bytes each, by design): a compressed
    // file of a few KiB may claim 10^8 rows, which the order would turn into GiB. Past 4M rows
    // the header check is all this harness runs (run.sh caps one allocation at 1 GiB).
    if (rows.file_rows() > (int64_t(1) << 22)) throw dpt::Error("too many rows for the harness");
    rows.start_epoch(0, /*read_next=*/false);
    const dpt::Dataset& d = rows.data();
    std::vector<float> x(size_t(d.dim));
    int32_t y = 0;
    for (int64_t r = 0; r < d.n; ++r) {
      d.gather(&r, 1, x.data(), &y);
      if (y < 0 || y >= d.num_classes) __builtin_trap();
    }
    const dpt::Dataset t = dpt::load_eval_shard(path, 1, 3);
    for (int32_t l : t.labels)
      if (l < 0 || l >= t.num_classes) __builtin_trap();
  } catch (const dpt::Error&) {
  }
  // Every HDF5 handle the reader opened is closed again, on the error paths too: a leak here
  // grows the metadata cache by every damaged file a long job skips.
  if (H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) != 0) {
    std::fprintf(stderr, "HDF5 handles left open: %zd\n", H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL));
    __builtin_trap();
  }
  return 0;
}
