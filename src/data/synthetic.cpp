// The generators of `dpdata synth`: odd-even parity of random bits, and Gaussian blobs around
// random class centres; deterministic given the seed.
#include "internal.hpp"

#include <cmath>
#include <string>

#include "dpt/check.hpp"

namespace dpt {
using namespace data_internal;

namespace {
void require_size(int64_t n, int64_t dim, size_t elem, const char* who) {
  uint64_t bytes = 0;
  if (n < 1 || dim < 1 || !mul_ok(uint64_t(n), uint64_t(dim), bytes) ||
      !mul_ok(bytes, elem, bytes) || bytes > memory_cap())
    throw InputError(std::string(who) + ": n = " + std::to_string(n) + " and dim = " +
                     std::to_string(dim) + " must be >= 1 and fit in memory");
}
}  // namespace

// Label = parity of the number of ones (XOR of the bits), the Torch tutorial's "odd or even"
// read as a count; unlike the last bit of the encoded integer it needs every input and a hidden
// layer to learn.
Dataset synth_odd_even(int64_t n, int bits, uint64_t seed) {
  require_size(n, bits, sizeof(float), "synth odd-even");
  if (bits > 4096) throw InputError("synth odd-even: bits = " + std::to_string(bits) + " > 4096");
  Dataset ds;
  ds.path = "synth:odd-even";
  ds.n = n;
  ds.dim = bits;
  ds.sample_shape = {bits};
  ds.num_classes = 2;
  ds.is_u8 = false;
  ds.f32.resize(size_t(n) * size_t(bits));
  ds.labels.resize(size_t(n));
  SplitMix64 rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    int ones = 0;
    uint64_t word = 0;
    for (int j = 0; j < bits; ++j) {
      if (j % 64 == 0) word = rng.next();
      const int bit = int((word >> (j % 64)) & 1);
      ds.f32[size_t(i) * size_t(bits) + size_t(j)] = float(bit);
      ones += bit;
    }
    ds.labels[size_t(i)] = ones & 1;
  }
  return ds;
}

namespace {
// Box–Muller from SplitMix64: deterministic given libm's log/sqrt/cos (glibc is consistent).
struct Gauss {
  SplitMix64 rng;
  bool have = false;
  double spare = 0;
  double next() {
    if (have) { have = false; return spare; }
    const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();  // u1 in (0, 1]: log is finite
    const double r = std::sqrt(-2.0 * std::log(u1)), th = 6.283185307179586 * u2;
    spare = r * std::sin(th);
    have = true;
    return r * std::cos(th);
  }
};
}  // namespace

// Class centres uniform in [-1, 1]^dim, points = centre + spread·N(0, 1), classes drawn
// uniformly per row. With spread ~0.5 and dim >= 10 the task is learnable but not trivial.
Dataset synth_blobs(int64_t n, int dim, int classes, float spread, uint64_t seed) {
  require_size(n, dim, sizeof(float), "synth blobs");
  if (classes < 1 || classes > 1000000)
    throw InputError("synth blobs: classes = " + std::to_string(classes) + " outside [1, 1000000]");
  if (!(spread >= 0) || !std::isfinite(spread))
    throw InputError("synth blobs: spread must be finite and >= 0");
  Dataset ds;
  ds.path = "synth:blobs";
  ds.n = n;
  ds.dim = dim;
  ds.sample_shape = {dim};
  ds.num_classes = classes;
  ds.is_u8 = false;
  Gauss g{SplitMix64(seed)};
  std::vector<float> centres(size_t(classes) * size_t(dim));
  for (float& c : centres) c = float(2.0 * g.rng.uniform() - 1.0);
  ds.f32.resize(size_t(n) * size_t(dim));
  ds.labels.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const int c = int(g.rng.below(uint64_t(classes)));
    ds.labels[size_t(i)] = c;
    const float* centre = &centres[size_t(c) * size_t(dim)];
    float* row = &ds.f32[size_t(i) * size_t(dim)];
    for (int j = 0; j < dim; ++j) row[j] = centre[j] + spread * float(g.next());
  }
  return ds;
}

}  // namespace dpt
