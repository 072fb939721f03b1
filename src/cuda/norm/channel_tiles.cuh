// The channel tiling shared by the CUDA backend's kernels over (rows, c) row-major matrices
// (norm.cu's and bn.cu's): an NHWC activation's pixels by its channels. A block is
// tc × lanes = 256 threads: threadIdx.x is a channel (or, in bn.cu's vector kernels, a group of
// eight channels) of a tile of tc (the smallest power of two covering the columns, at most 32),
// threadIdx.y one of lanes = 256 / tc rows, and blockIdx.y picks the tile. A warp reads
// consecutive channels of consecutive rows (coalesced for any c), and a thread keeps its
// channels throughout: no division by c. Include from .cu files only; everything here is
// internal to the including file.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "dpt/check.hpp"

namespace dpt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTileMax = 32;             // columns per tile at most: one warp's width
constexpr int kMaxTiles = 65535;         // gridDim.y
// A reduction's blocks, about 4 per SM of an H200: fewer blocks spread each block's closing tree
// (and its share of the totals) over more rows. resnet18(stem=small)'s bf16 step, measured as
// variants of one build in one run on the H200 (2026-12-02): 6.83 ms with 512 blocks, 7.30
// and 7.40 with 1,024, 7.41 with 2,048; loading rows ahead did not help (7.00 with two ahead
// and 1,024 blocks, 6.83 with two ahead in the forward sums and 512).
constexpr int64_t kReduceBlocks = 512;
constexpr int64_t kPassBlocks = 4096;    // an elementwise pass's blocks at most (grid-stride)

// Sums each of the N values over the block's row lanes (threadIdx.y), per channel lane
// (threadIdx.x), in a fixed tree order; the totals are valid in row lane 0. Every thread of the
// block calls it (it synchronises), once per kernel; blockDim.y is a power of two.
template <int N> __device__ void lane_sums(double (&v)[N]) {
  __shared__ double sh[N][kThreads];
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  for (int k = 0; k < N; ++k) sh[k][t] = v[k];
  for (int h = blockDim.y / 2; h > 0; h /= 2) {
    __syncthreads();
    if (threadIdx.y < h)
      for (int k = 0; k < N; ++k) sh[k][t] += sh[k][t + h * blockDim.x];
  }
  for (int k = 0; k < N; ++k) v[k] = sh[k][t];
}

// The first row of this thread in a pass over rows, and the step to its next one.
__device__ __forceinline__ int64_t first_row() { return int64_t(blockIdx.x) * blockDim.y + threadIdx.y; }
__device__ __forceinline__ int64_t row_step() { return int64_t(gridDim.x) * blockDim.y; }
__device__ __forceinline__ int channel() { return blockIdx.y * blockDim.x + threadIdx.x; }

// The channel tiling of `cols` columns.
struct Tiles {
  int tc = 1;             // channels per tile
  int lanes = kThreads;   // rows per block
  int count = 1;          // tiles
};

inline Tiles tiles_for(int64_t cols, const char* op) {
  Tiles t;
  while (t.tc < cols && t.tc < kTileMax) t.tc *= 2;
  t.lanes = kThreads / t.tc;
  const int64_t count = std::max<int64_t>(1, (cols + t.tc - 1) / t.tc);
  if (count > kMaxTiles)
    throw Error(std::string(op) + ": " + std::to_string(cols) + " channels exceed the grid's " +
                std::to_string(int64_t(kMaxTiles) * kTileMax));
  t.count = int(count);
  return t;
}

inline dim3 block_of(const Tiles& t) { return dim3(unsigned(t.tc), unsigned(t.lanes)); }

// A pass over `rows` rows: blockIdx.x grid-strides over the rows, blockIdx.y over the tiles.
inline dim3 pass_grid(const Tiles& t, int64_t rows) {
  const int64_t need = (rows + t.lanes - 1) / t.lanes;
  const int64_t most = std::max<int64_t>(1, kPassBlocks / t.count);
  return dim3(unsigned(std::clamp<int64_t>(need, 1, most)), unsigned(t.count));
}

// Blocks of kThreads for n elements, at most 32 per SM of an H200 (grid-stride beyond).
inline unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(std::max<size_t>(1, std::min<size_t>(blocks, 132 * 32)));
}

inline bool aligned16(const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; }

}  // namespace
}  // namespace dpt::cuda
