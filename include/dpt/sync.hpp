// Gradient synchronisation for train.sync = gradients, and the optimizer step it drives: the
// arena laid out in buckets (last layer first), each bucket's reduction started on the
// communication stream as soon as its gradients are final, gradients on the wire in fp32 or
// bf16, and each bucket's update run as soon as its gradients are reduced and the backward pass
// has stopped reading its parameters (overlapped with the rest of the backward pass), where the
// non-finite policy allows it. With train.shard_optimizer (ZeRO stage 1) each rank holds the
// optimizer state of its shard of every bucket only: the bucket's weight gradients are
// reduce-scattered, the rank updates its shard, and the updated weights (their bf16 copy in bf16
// runs) are all-gathered. Knows how no layer computes: it works on arena ranges.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dpt/backend.hpp"
#include "dpt/comm.hpp"
#include "dpt/nn.hpp"

namespace dpt {

class Optimizer;

// One bucket: a weight range of the arena (whole consecutive layers, or a row piece of one large
// layer) padded to a multiple of kShardGranule × world when sharded, and the biases of its layers
// (a range of the bias region, after all the weights). Sharded, rank r owns the weight chunk
// [w_begin + r·chunk, + chunk) and all of the bucket's biases (replicated: few, and every rank
// then reads exact fp32 biases whatever the precision).
struct Bucket {
  size_t w_begin = 0, w_end = 0;  // padded weight range
  size_t b_begin = 0, b_end = 0;  // bias range (may be empty)
  std::vector<std::pair<size_t, size_t>> real;  // the ranges holding parameters (no padding)
  size_t elements = 0;  // Σ of real
  int layer_lo = 0, layer_hi = 0;  // layers it holds (a piece: lo == hi)
  size_t chunk = 0;     // sharded: (w_end − w_begin) / world; else w_end − w_begin
  size_t state_w = 0, state_b = 0;  // where this rank's optimizer state of the chunk / biases is
};

struct BucketPlan {
  ArenaLayout layout;
  std::vector<Bucket> buckets;  // in reduction order: the last layer first
  size_t state_size = 0;        // optimizer-state elements per rank
  int world = 1, rank = 0;
  bool sharded = false;
  static constexpr size_t kShardGranule = 64;  // elements: 256-byte aligned chunks
  // This rank's weight chunk of bucket b (the whole weight range when not sharded).
  size_t own_w(const Bucket& b) const { return sharded ? b.w_begin + size_t(rank) * b.chunk : b.w_begin; }
};

// The buckets of an MLP of these widths: consecutive whole layers, last first, each at least
// bucket_mb of weights (the last bucket may be smaller); with split_large, a layer of at least
// twice bucket_mb is cut into row pieces of about bucket_mb, one bucket each, so its first
// pieces are reduced while the rest of its weight gradient is computed. Every layer's weights
// start 256-byte aligned. Sharded: every bucket padded to a multiple of kShardGranule × world.
BucketPlan plan_buckets(const std::vector<int>& widths, double bucket_mb, int world, int rank,
                        bool shard, bool split_large);
// The same for any model's conv and linear layers (Model::param_shapes()); only layers marked
// splittable are cut into row pieces.
BucketPlan plan_buckets(const std::vector<ParamShape>& layers, double bucket_mb, int world, int rank,
                        bool shard, bool split_large);

// Bytes a rank holds, for the start-up report.
struct MemoryUse {
  size_t params = 0, grads = 0, optimizer = 0, comm = 0;
};

class GradSync {
 public:
  // grad_bf16: comm.grad_dtype = bf16. eager: update each bucket as soon as it can (policy
  // stop); otherwise all reductions, then the check of every reduced gradient, then the update.
  GradSync(const BucketPlan& plan, Backend& be, Comm& comm, MLP& model, Optimizer& opt,
           bool grad_bf16, bool eager);
  ~GradSync();

  // The hooks of the step's last backward pass, and its end: what the hooks left to do, then
  // every lane and the communication joined back into the main lane. ctl and lr are the
  // Trainer's device-side step control and learning-rate table.
  PassHooks hooks(StepCtl* ctl, const float* lr_table);
  void finish();

  // Host copies of arenas this rank holds sharded, made whole (collective over the ranks):
  // the parameters (the fp32 master: outside its chunks a rank's arena may be stale in bf16),
  // and an optimizer-state array (this rank's compact layout) in the arena's layout. Written into
  // out; unsharded, into the memory out already holds when it has the arena's size.
  void gather_params(std::vector<float>& out);
  void gather_state(const float* state, std::vector<float>& out);
  // The inverse for a resume: this rank's compact state from a whole arena-layout array.
  void scatter_state(const std::vector<float>& whole, float* state);

  MemoryUse memory() const;
  const BucketPlan& plan() const { return plan_; }
  // Gradient bytes each step's reductions hand to the transport (the payload, not NCCL's own
  // traffic): all of every bucket, or with frozen = true what trains while the optimizer holds
  // train.freeze's tensors frozen (unsharded; a sharded run reduces everything). 0 on one rank.
  size_t wire_bytes(bool frozen) const;

 private:
  void on_final(size_t begin, size_t end);
  void on_released(size_t begin, size_t end);
  void reduce(size_t b);
  void update(size_t b);
  void unwire(size_t b, bool check);
  void gather(size_t b);
  void update_layerwise_sharded();
  void plan_open_ranges();
  std::vector<float> compact_of_arena(const std::vector<float>& arena) const;
  std::vector<float> arena_of_compacts(const std::vector<float>& all) const;

  const BucketPlan& plan_;
  Backend& be_;
  Comm& comm_;
  MLP& model_;
  Optimizer& opt_;
  bool bf16_wire_, eager_, side_;
  int world_;
  Buffer<uint16_t> wire_;  // the gradient arena in bf16 (comm.grad_dtype = bf16)
  std::vector<size_t> final_, released_;
  std::vector<char> reduced_, updated_;
  StepCtl* ctl_ = nullptr;
  const float* lr_ = nullptr;
  // Per bucket, the ranges that train.freeze leaves open (plan_open_ranges); empty where nothing
  // in the bucket is frozen.
  std::vector<std::vector<std::pair<size_t, size_t>>> open_;
};

}  // namespace dpt
