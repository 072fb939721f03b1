// The data order: SplitMix64, the epoch-seeded permutation (the same on every rank), and the
// positions of the epoch order one rank takes, micro-batch by micro-batch.
#include <algorithm>
#include <utility>

#include "dpt/data.hpp"

namespace dpt {

uint64_t SplitMix64::next() {
  uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Lemire's multiply-and-reject: unbiased, and almost never draws twice.
uint64_t SplitMix64::below(uint64_t n) {
  if (n == 0) return 0;
  unsigned __int128 m = (unsigned __int128)next() * n;
  uint64_t low = uint64_t(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = (unsigned __int128)next() * n;
      low = uint64_t(m);
    }
  }
  return uint64_t(m >> 64);
}

double SplitMix64::uniform() { return double(next() >> 11) * 0x1.0p-53; }

namespace {
uint64_t mix64(uint64_t z) { return SplitMix64(z).next(); }
}  // namespace

// The generator is seeded with mix64(seed ^ mix64(epoch)), so neighbouring seeds and epochs
// give unrelated streams; Fisher–Yates from the top: for i = n-1..1, swap(p[i], p[below(i+1)]).
std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(size_t(std::max<int64_t>(n, 0)));
  for (size_t i = 0; i < p.size(); ++i) p[i] = int64_t(i);
  if (!shuffle) return p;
  SplitMix64 rng(mix64(seed ^ mix64(uint64_t(epoch))));
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[size_t(i)], p[size_t(rng.below(uint64_t(i) + 1))]);
  return p;
}

std::vector<int64_t> rank_positions(int64_t n, const RankOrder& o) {
  const int64_t G = o.global_batch(), steps = G > 0 ? n / G : 0;
  std::vector<int64_t> pos;
  pos.reserve(size_t(steps * o.accumulate * o.batch));
  for (int64_t k = 0; k < steps; ++k)
    for (int a = 0; a < o.accumulate; ++a) {
      const int64_t p0 = batch_offset(k, a, o.rank, o.batch, o.world, o.accumulate);
      for (int j = 0; j < o.batch; ++j) pos.push_back(p0 + j);
    }
  return pos;
}

}  // namespace dpt
