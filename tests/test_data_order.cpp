// Data order: the contract of DESIGN.md (SplitMix64, the epoch permutation, batch offsets,
// evaluation shards, each rank's positions), reading only given rows of a file (load_rows,
// load_eval_shard), and TrainRows (data.read = shard: each epoch's rows of a rank, read ahead).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
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

}  // namespace
