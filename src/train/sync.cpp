#include "dpt/sync.hpp"

#include <algorithm>
#include <numeric>

#include "dpt/check.hpp"
#include "dpt/optim.hpp"
#include "dpt/watchdog.hpp"

namespace dpt {
namespace {

size_t round_up(size_t v, size_t m) { return m <= 1 ? v : (v + m - 1) / m * m; }

size_t overlap(size_t a0, size_t a1, size_t b0, size_t b1) {
  const size_t lo = std::max(a0, b0), hi = std::min(a1, b1);
  return hi > lo ? hi - lo : 0;
}

// Whole layers [lo, hi], or rows [r0, r1) of layer lo == hi.
struct Part {
  int lo, hi;
  int r0 = -1, r1 = -1;
  bool piece() const { return r0 >= 0; }
};

// The bucket structure, last layer first (see plan_buckets).
std::vector<Part> parts_of(const std::vector<ParamShape>& layers, size_t cap, size_t grain, bool split,
                           std::vector<int>& piece_rows) {
  const int L = int(layers.size());
  auto nw = [&](int i) { return size_t(layers[size_t(i)].in) * size_t(layers[size_t(i)].out); };
  std::vector<Part> parts;
  piece_rows.assign(size_t(L), 0);
  int hi = L - 1;
  size_t acc = 0;
  for (int i = L - 1; i >= 0; --i) {
    if (split && layers[size_t(i)].splittable && nw(i) >= 2 * cap) {
      if (hi > i) parts.push_back({i + 1, hi});
      hi = i - 1;
      acc = 0;
      const size_t in = size_t(layers[size_t(i)].in), out = size_t(layers[size_t(i)].out);
      // Rows per piece: a multiple of m, so every piece starts aligned and spans whole grains.
      const size_t m = grain / std::gcd(in, grain);
      const size_t k = (nw(i) + cap - 1) / cap;
      const size_t rows = std::min(out, round_up((out + k - 1) / k, m));
      piece_rows[size_t(i)] = int(rows);
      for (size_t r0 = 0; r0 < out; r0 += rows) parts.push_back({i, i, int(r0), int(std::min(out, r0 + rows))});
      continue;
    }
    acc += nw(i) + size_t(layers[size_t(i)].out);
    if (acc >= cap || i == 0) {
      parts.push_back({i, hi});
      hi = i - 1;
      acc = 0;
    }
  }
  return parts;
}

}  // namespace

BucketPlan plan_buckets(const std::vector<int>& widths, double bucket_mb, int world, int rank,
                        bool shard, bool split_large) {
  return plan_buckets(mlp_param_shapes(widths), bucket_mb, world, rank, shard, split_large);
}

BucketPlan plan_buckets(const std::vector<ParamShape>& layers, double bucket_mb, int world, int rank,
                        bool shard, bool split_large) {
  BucketPlan P;
  P.world = world;
  P.rank = rank;
  P.sharded = shard && world > 1;
  const int L = int(layers.size());
  if (L < 1) throw Error("plan_buckets: no layers");
  auto in_of = [&](int i) { return size_t(layers[size_t(i)].in); };
  auto out_of = [&](int i) { return size_t(layers[size_t(i)].out); };
  const size_t cap = std::max<size_t>(1, size_t(bucket_mb * 1024 * 1024 / sizeof(float)));
  constexpr size_t kAlign = BucketPlan::kShardGranule;  // every layer's weights 256-byte aligned
  const size_t grain = P.sharded ? kAlign * size_t(world) : kAlign;
  auto nw = [&](int i) { return in_of(i) * out_of(i); };
  // Row pieces cut at the same rows sharded or not (whole grains of every rank's chunk), so both
  // give cuBLAS the same GEMMs and differ only in the order of their sums.
  const std::vector<Part> parts = parts_of(layers, cap, kAlign * size_t(world), split_large, P.layout.piece_rows);

  // Offsets, layer 0 first: each bucket's weight range is padded (at a layer boundary, never
  // inside a layer) to a multiple of the grain when sharded.
  std::vector<int> top(size_t(L), 0), lo_of(size_t(L), 0);  // layer ends a bucket / its group's lowest layer
  for (const Part& p : parts) {
    top[size_t(p.hi)] = 1;
    for (int i = p.lo; i <= p.hi; ++i) lo_of[size_t(i)] = p.lo;
  }
  P.layout.w_off.assign(size_t(L), 0);
  P.layout.b_off.assign(size_t(L), 0);
  std::vector<size_t> w_end(size_t(L), 0);  // padded end of the bucket a layer tops
  size_t cursor = 0;
  for (int i = 0; i < L; ++i) {
    P.layout.w_off[size_t(i)] = round_up(cursor, kAlign);
    cursor = P.layout.w_off[size_t(i)] + nw(i);
    if (!top[size_t(i)] || !P.sharded) {
      w_end[size_t(i)] = cursor;
      continue;
    }
    const int rows = P.layout.piece_rows[size_t(i)];
    const size_t start = rows > 0
        ? P.layout.w_off[size_t(i)] + (out_of(i) - 1) / size_t(rows) * size_t(rows) * in_of(i)
        : P.layout.w_off[size_t(lo_of[size_t(i)])];
    cursor = start + round_up(cursor - start, grain);
    w_end[size_t(i)] = cursor;
  }
  size_t b = round_up(cursor, kAlign);
  for (int i = 0; i < L; ++i) {
    P.layout.b_off[size_t(i)] = b;
    b += out_of(i);
  }
  P.layout.total = round_up(b, kAlign);

  // The buckets, in reduction order; a piece's bucket carries its layer's biases when it is the
  // layer's first (the bias gradient is final before any weight-gradient piece).
  size_t state = 0;
  for (const Part& p : parts) {
    Bucket k;
    k.layer_lo = p.lo;
    k.layer_hi = p.hi;
    if (p.piece()) {
      const size_t in = in_of(p.lo), out = out_of(p.lo);
      const size_t w0 = P.layout.w_off[size_t(p.lo)];
      k.w_begin = w0 + size_t(p.r0) * in;
      k.w_end = size_t(p.r1) == out ? std::max(w0 + out * in, w_end[size_t(p.lo)]) : w0 + size_t(p.r1) * in;
      k.real.push_back({k.w_begin, w0 + size_t(p.r1) * in});
      if (p.r0 == 0) {
        k.b_begin = P.layout.b_off[size_t(p.lo)];
        k.b_end = k.b_begin + out;
      }
    } else {
      k.w_begin = P.layout.w_off[size_t(p.lo)];
      k.w_end = std::max(P.layout.w_off[size_t(p.hi)] + nw(p.hi), w_end[size_t(p.hi)]);
      for (int i = p.lo; i <= p.hi; ++i) k.real.push_back({P.layout.w_off[size_t(i)], P.layout.w_off[size_t(i)] + nw(i)});
      k.b_begin = P.layout.b_off[size_t(p.lo)];
      k.b_end = P.layout.b_off[size_t(p.hi)] + out_of(p.hi);
    }
    if (k.b_end > k.b_begin) k.real.push_back({k.b_begin, k.b_end});
    for (auto& r : k.real) k.elements += r.second - r.first;
    const size_t wlen = k.w_end - k.w_begin;
    if (P.sharded && wlen % size_t(world) != 0)
      throw Error("plan_buckets: a sharded bucket of " + std::to_string(wlen) + " elements does not split over " +
                  std::to_string(world) + " ranks");
    k.chunk = P.sharded ? wlen / size_t(world) : wlen;
    if (P.sharded) {
      k.state_w = state;
      state += k.chunk;
      k.state_b = state;
      state += k.b_end - k.b_begin;
    } else {
      k.state_w = k.w_begin;
      k.state_b = k.b_begin;
    }
    P.buckets.push_back(std::move(k));
  }
  P.state_size = P.sharded ? state : P.layout.total;
  return P;
}

// ---------------------------------------------------------------------------------------------

GradSync::GradSync(const BucketPlan& plan, Backend& be, Comm& comm, MLP& model, Optimizer& opt,
                   bool grad_bf16, bool eager)
    : plan_(plan), be_(be), comm_(comm), model_(model), opt_(opt), bf16_wire_(grad_bf16 && comm.size() > 1),
      eager_(eager), world_(comm.size()) {
  if (model.num_params() != plan.layout.total)
    throw Error("GradSync: the model's arena (" + std::to_string(model.num_params()) +
                " elements) is not the plan's (" + std::to_string(plan.layout.total) + ")");
  if (opt.size() != plan.state_size)
    throw Error("GradSync: the optimizer holds " + std::to_string(opt.size()) + " elements of state, the plan " +
                std::to_string(plan.state_size));
  // The side lane is the communication stream: it overlaps the backward pass where collectives
  // are enqueued on the device (NCCL) or there are none. The host-staged MPI transport waits for
  // the main lane in every collective, so its updates stay on the main lane.
  side_ = comm.capturable() || world_ == 1;
  if (bf16_wire_) {
    wire_ = Buffer<uint16_t>(be, plan.layout.total);
    std::vector<uint16_t> zeros(plan.layout.total, 0);  // padding stays zero
    be.upload(wire_.data(), zeros.data(), zeros.size() * sizeof(uint16_t));
  }
  plan_open_ranges();
  const size_t n = plan.buckets.size();
  final_.assign(n, 0);
  released_.assign(n, 0);
  reduced_.assign(n, 0);
  updated_.assign(n, 0);
}

GradSync::~GradSync() = default;

PassHooks GradSync::hooks(StepCtl* ctl, const float* lr_table) {
  ctl_ = ctl;
  lr_ = lr_table;
  std::fill(final_.begin(), final_.end(), 0);
  std::fill(released_.begin(), released_.end(), 0);
  std::fill(reduced_.begin(), reduced_.end(), 0);
  std::fill(updated_.begin(), updated_.end(), 0);
  PassHooks h;
  h.grads_final = [this](size_t b, size_t e) { on_final(b, e); };
  h.params_released = [this](size_t b, size_t e) { on_released(b, e); };
  return h;
}

void GradSync::on_final(size_t begin, size_t end) {
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const Bucket& k = plan_.buckets[b];
    for (auto& r : k.real) final_[b] += overlap(begin, end, r.first, r.second);
    if (!reduced_[b] && final_[b] == k.elements) reduce(b);
  }
}

void GradSync::on_released(size_t begin, size_t end) {
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const Bucket& k = plan_.buckets[b];
    for (auto& r : k.real) released_[b] += overlap(begin, end, r.first, r.second);
    if (eager_ && reduced_[b] && !updated_[b] && released_[b] == k.elements) update(b);
  }
}

// The bucket's reduction, on the communication stream: the weights reduce-scattered (sharded)
// or all-reduced, the biases all-reduced, in bf16 when asked (NCCL sums bf16 natively; the MPI
// transport's sum rounds each partial sum to bf16 the same way).
void GradSync::reduce(size_t b) {
  reduced_[b] = 1;
  if (world_ == 1) return;
  const Bucket& k = plan_.buckets[b];
  float* g = model_.grads();
  const size_t wlen = k.w_end - k.w_begin, blen = k.b_end - k.b_begin;
  if (bf16_wire_) {
    if (side_) be_.side_wait();
    SideLane lane(be_, side_);
    be_.to_bf16(g + k.w_begin, wire_.data() + k.w_begin, wlen);
    if (blen) be_.to_bf16(g + k.b_begin, wire_.data() + k.b_begin, blen);
  }
  void* base = bf16_wire_ ? static_cast<void*>(wire_.data()) : static_cast<void*>(g);
  const DType t = bf16_wire_ ? DType::bf16 : DType::f32;
  const size_t es = dtype_size(t);
  auto at = [&](size_t off) { return static_cast<char*>(base) + off * es; };
  comm_.group_begin();  // NCCL: the weights' and the biases' collectives in one launch
  if (opt_.frozen() && !open_[b].empty() && !plan_.sharded) {
    // train.freeze: only what trains goes on the wire (frozen gradients are never read).
    for (const auto& [lo, hi] : open_[b])
      if (hi > lo) comm_.allreduce(at(lo), at(lo), hi - lo, t, RedOp::sum);
  } else if (plan_.sharded)
    comm_.reduce_scatter(at(k.w_begin), at(plan_.own_w(k)), k.chunk, t, RedOp::sum);
  else
    comm_.allreduce(at(k.w_begin), at(k.w_begin), wlen, t, RedOp::sum);
  if (blen) comm_.allreduce(at(k.b_begin), at(k.b_begin), blen, t, RedOp::sum);
  comm_.group_end();
}

// bf16 reduced gradients back into the fp32 arena (this rank's chunk and the biases), with the
// non-finite check of what was reduced folded in when check.
void GradSync::unwire(size_t b, bool check) {
  const Bucket& k = plan_.buckets[b];
  float* g = model_.grads();
  const size_t own = plan_.own_w(k);
  be_.from_bf16(wire_.data() + own, g + own, k.chunk, check ? ctl_ : nullptr);
  if (k.b_end > k.b_begin)
    be_.from_bf16(wire_.data() + k.b_begin, g + k.b_begin, k.b_end - k.b_begin, check ? ctl_ : nullptr);
}

// Bucket b's update as soon as it is reduced and released (eager: policy stop, the check folded
// into a pass that reads the gradients anyway), then, sharded, the all-gather of its weights.
void GradSync::update(size_t b) {
  updated_[b] = 1;
  const Bucket& k = plan_.buckets[b];
  if (side_) be_.side_wait();  // the backward pass's last read of these parameters is enqueued
  SideLane lane(be_, side_);
  float* p = model_.params();
  float* g = model_.grads();
  const bool folded = bf16_wire_;
  if (bf16_wire_) unwire(b, true);
  const size_t own = plan_.own_w(k);
  opt_.step_at(p + own, g + own, k.state_w, k.chunk, lr_, ctl_, !folded, own);
  opt_.step_at(p + k.b_begin, g + k.b_begin, k.state_b, k.b_end - k.b_begin, lr_, ctl_, !folded, k.b_begin);
  if (plan_.sharded) gather(b);
}

// The updated weights to every rank: the bf16 copy the GEMMs read where the backend keeps one
// (half the bytes; the fp32 master outside this rank's chunks is then stale, and only
// gather_params reads it), else the fp32 arena.
void GradSync::gather(size_t b) {
  const Bucket& k = plan_.buckets[b];
  float* p = model_.params();
  const size_t own = plan_.own_w(k);
  if (uint16_t* sh = be_.param_shadow(p, plan_.layout.total)) {
    comm_.allgather(sh + own, sh + k.w_begin, k.chunk, DType::bf16);
    be_.note_shadow_write(p + k.w_begin, k.w_end - k.w_begin);
  } else {
    comm_.allgather(p + own, p + k.w_begin, k.chunk, DType::f32);
  }
}

void GradSync::finish() {
  const size_t n = plan_.buckets.size();
  for (size_t b = 0; b < n; ++b)
    if (!reduced_[b]) throw Error("GradSync: bucket " + std::to_string(b) + " was never reported final");
  // One rank enqueues nothing on the communication stream but the side lane's work (joined by
  // main_wait); a wait for it would refer to work outside a step being captured.
  if (eager_) {
    for (size_t b = 0; b < n; ++b)
      if (!updated_[b]) update(b);
    if (side_) be_.main_wait();
    if (world_ > 1) comm_.synchronize();
    return;
  }
  // Every reduction, then the check of every reduced gradient (all ranks decide alike), then
  // the updates: a skipped step leaves parameters and state bitwise as they were.
  if (world_ > 1) comm_.synchronize();
  float* g = model_.grads();
  if (bf16_wire_) {
    for (size_t b = 0; b < n; ++b) unwire(b, true);
  } else if (!plan_.sharded) {
    be_.check_finite(g, plan_.layout.total, ctl_);
  } else {
    for (const Bucket& k : plan_.buckets) {
      be_.check_finite(g + plan_.own_w(k), k.chunk, ctl_);
      be_.check_finite(g + k.b_begin, k.b_end - k.b_begin, ctl_);
    }
  }
  if (plan_.sharded) {
    // Each rank checked its own chunks: one verdict for all.
    comm_.allreduce(&ctl_->bad, &ctl_->bad, 1, DType::i32, RedOp::max);
    comm_.synchronize();
  }
  float* p = model_.params();
  if (opt_.layerwise() && plan_.sharded) {
    update_layerwise_sharded();
  } else if (opt_.layerwise()) {
    opt_.step_at(p, g, 0, plan_.layout.total, lr_, ctl_, false);  // the state mirrors the arena
  } else {
    for (const Bucket& k : plan_.buckets) {
      const size_t own = plan_.own_w(k);
      opt_.step_at(p + own, g + own, k.state_w, k.chunk, lr_, ctl_, false, own);
      opt_.step_at(p + k.b_begin, g + k.b_begin, k.state_b, k.b_end - k.b_begin, lr_, ctl_, false, k.b_begin);
    }
  }
  if (plan_.sharded) {
    for (size_t b = 0; b < n; ++b) gather(b);
    comm_.synchronize();
  }
}

// LARS and LAMB on a sharded arena: a weight tensor's norms need every piece of it, which lie in
// every rank's chunks of one or more buckets (a large layer is cut into several). So the sums of
// this rank's chunks of every bucket are added into one buffer, summed over the ranks, and only
// then is anything updated. The biases, whole on every rank, are summed after that sum over the
// ranks (their entries are still zero there) and need none of their own.
void GradSync::update_layerwise_sharded() {
  float* p = model_.params();
  float* g = model_.grads();
  opt_.clear_layer_sums();
  for (const Bucket& k : plan_.buckets) {
    const size_t own = plan_.own_w(k);
    opt_.layer_sums_at(p + own, g + own, own, k.state_w, k.chunk, lr_, ctl_);
  }
  comm_.allreduce(opt_.layer_sums(), opt_.layer_sums(), 2 * opt_.tensors().size(), DType::f32, RedOp::sum);
  comm_.synchronize();
  for (const Bucket& k : plan_.buckets)
    if (k.b_end > k.b_begin)
      opt_.layer_sums_at(p + k.b_begin, g + k.b_begin, k.b_begin, k.state_b, k.b_end - k.b_begin, lr_, ctl_);
  for (const Bucket& k : plan_.buckets) {
    const size_t own = plan_.own_w(k);
    opt_.layer_apply_at(p + own, g + own, own, k.state_w, k.chunk, lr_, ctl_);
    if (k.b_end > k.b_begin)
      opt_.layer_apply_at(p + k.b_begin, g + k.b_begin, k.b_begin, k.state_b, k.b_end - k.b_begin, lr_, ctl_);
  }
}

// ---------------------------------------------------------------------------------------------

std::vector<float> GradSync::compact_of_arena(const std::vector<float>& arena) const {
  std::vector<float> out(plan_.state_size);
  for (const Bucket& k : plan_.buckets) {
    const size_t own = plan_.own_w(k);
    std::copy(arena.begin() + long(own), arena.begin() + long(own + k.chunk), out.begin() + long(k.state_w));
    std::copy(arena.begin() + long(k.b_begin), arena.begin() + long(k.b_end), out.begin() + long(k.state_b));
  }
  return out;
}

std::vector<float> GradSync::arena_of_compacts(const std::vector<float>& all) const {
  std::vector<float> out(plan_.layout.total, 0.f);
  const size_t S = plan_.state_size;
  for (int r = 0; r < world_; ++r)
    for (const Bucket& k : plan_.buckets) {
      const auto src = all.begin() + long(size_t(r) * S + k.state_w);
      std::copy(src, src + long(k.chunk), out.begin() + long(k.w_begin + size_t(r) * k.chunk));
      if (r == 0) {
        const auto bs = all.begin() + long(k.state_b);
        std::copy(bs, bs + long(k.b_end - k.b_begin), out.begin() + long(k.b_begin));
      }
    }
  return out;
}

namespace {
std::vector<float> allgather_host(MPI_Comm c, const std::vector<float>& mine, int world) {
  watchdog::Phase phase("gathering the sharded state");
  if (mine.size() > size_t(INT32_MAX)) throw Error("sharded state too large for one MPI_Allgather");
  std::vector<float> all(mine.size() * size_t(world));
  DPT_CHECK_MPI(MPI_Allgather(mine.data(), int(mine.size()), MPI_FLOAT, all.data(), int(mine.size()),
                              MPI_FLOAT, c));
  return all;
}
}  // namespace

void GradSync::gather_params(std::vector<float>& out) {
  out.resize(plan_.layout.total);
  be_.download(out.data(), model_.params(), out.size() * sizeof(float));
  if (plan_.sharded) out = arena_of_compacts(allgather_host(comm_.mpi(), compact_of_arena(out), world_));
}

void GradSync::gather_state(const float* state, std::vector<float>& out) {
  out.resize(plan_.state_size);
  be_.download(out.data(), state, out.size() * sizeof(float));
  if (plan_.sharded) out = arena_of_compacts(allgather_host(comm_.mpi(), out, world_));
}

void GradSync::scatter_state(const std::vector<float>& whole, float* state) {
  if (whole.size() != plan_.layout.total) throw Error("scatter_state: not an arena-sized array");
  const std::vector<float> mine = plan_.sharded ? compact_of_arena(whole) : whole;
  be_.upload(state, mine.data(), mine.size() * sizeof(float));
}

// Per bucket where any tensor is frozen, the ranges of its trainable tensors (adjacent ones
// joined): not the frozen tensors, not the arena's gaps between tensors, which no update reads.
// reduce() sends only these while the optimizer holds the freeze.
void GradSync::plan_open_ranges() {
  std::vector<std::pair<size_t, size_t>> trainable;
  bool any_frozen = false;
  for (const TensorSeg& t : opt_.tensors()) {
    if (t.end <= t.begin) continue;
    if (t.frozen)
      any_frozen = true;
    else
      trainable.push_back({t.begin, t.end});
  }
  open_.assign(plan_.buckets.size(), {});
  if (!any_frozen) return;
  std::sort(trainable.begin(), trainable.end());
  auto intersect = [&](size_t lo, size_t hi, std::vector<std::pair<size_t, size_t>>& out) {
    for (const auto& [tb, te] : trainable) {
      const size_t b = std::max(lo, tb), e = std::min(hi, te);
      if (b >= e) continue;
      if (!out.empty() && out.back().second == b)
        out.back().second = e;  // adjacent tensors: one range
      else
        out.push_back({b, e});
    }
  };
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const Bucket& k = plan_.buckets[b];
    std::vector<std::pair<size_t, size_t>> open;
    intersect(k.w_begin, k.w_end, open);
    intersect(k.b_begin, k.b_end, open);
    size_t n = 0;
    for (const auto& r : open) n += r.second - r.first;
    // A marker for "send nothing": an empty range, so open_[b] is not empty.
    if (n == 0) open = {{k.w_begin, k.w_begin}};
    if (n < (k.w_end - k.w_begin) + (k.b_end - k.b_begin)) open_[b] = std::move(open);
  }
}

size_t GradSync::wire_bytes(bool frozen) const {
  if (world_ == 1) return 0;
  size_t n = 0;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const Bucket& k = plan_.buckets[b];
    if (frozen && !open_[b].empty() && !plan_.sharded)
      for (const auto& [lo, hi] : open_[b]) n += hi - lo;
    else
      n += (k.w_end - k.w_begin) + (k.b_end - k.b_begin);
  }
  return n * (bf16_wire_ ? 2 : 4);
}

MemoryUse GradSync::memory() const {
  MemoryUse m;
  const size_t n = plan_.layout.total;
  m.params = n * sizeof(float) + (be_.param_shadow(model_.params(), n) ? n * 2 : 0);
  m.grads = n * sizeof(float);
  m.optimizer = opt_.state_arrays() * plan_.state_size * sizeof(float);
  m.comm = wire_.size() * sizeof(uint16_t);
  return m;
}

}  // namespace dpt
