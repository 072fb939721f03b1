// The whole training step on the GPU against the CPU backend: the same config trained on
// `cuda` (one GPU per rank with NCCL, or ranks sharing a GPU over the MPI transport) and on
// `cpu` gives the same loss curve and final parameters. Skips where no GPU is visible.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "dpt/app.hpp"
#include "dpt/backend.hpp"
#include "dpt/comm.hpp"
#include "dpt/data.hpp"
#include "dpt/train.hpp"
#ifdef DPT_HAVE_CUDA
#include "dpt/cuda_backend.hpp"
#endif
#include "gpu_util.hpp"

using namespace dpt;

namespace {

struct Outcome {
  std::vector<double> losses;
  std::vector<float> params;
  bool graph = false;
  EvalResult eval;
};

Config config(const std::string& device, const std::string& transport) {
  Config c;
  c.layers = {24, 64, 32, 6};
  c.activation = "gelu";
  c.train_file = "(memory)";
  c.epochs = 2;
  c.batch_per_rank = 16;
  c.optimizer = "adamw";
  c.lr = 0.005;
  c.weight_decay = 0.01;
  c.schedule = "cosine";
  c.warmup_steps = 5;
  c.seed = 11;
  c.log_every = 1;
  c.progress = false;
  c.resume = "none";
  c.device_type = device;
  c.comm_backend = transport;
  c.threads = 1;
  return c;
}

// fused (CUDA builds): set to the hidden layers the backend ran through the fused bf16 path in
// its last forward (-1 for another backend).
Outcome train(const Config& c, int* fused = nullptr) {
  static Dataset ds = synth_blobs(1024, 24, 6, 0.7f, 5);
  Runtime rt;
  make_backend_for(c, MPI_COMM_WORLD, rt);
  make_comm_for(c, MPI_COMM_WORLD, rt);
  Trainer t(c, *rt.backend, *rt.comm, &ds, nullptr);
  TrainResult r = t.run();
  if (fused) {
    *fused = -1;
#ifdef DPT_HAVE_CUDA
    if (CudaBackend* cb = as_cuda(*rt.backend)) *fused = cb->fused_layers();
#endif
  }
  return {r.losses, t.model().packed(t.params_host()), r.graph};
}

int world_size() { int s; MPI_Comm_size(MPI_COMM_WORLD, &s); return s; }

// fp32 on both sides; cuBLAS and OpenBLAS sum each dot product in another order, so losses
// drift apart by float32 rounding amplified over 64 steps of AdamW: 2e-4 relative on the loss
// and 1e-3 of the largest weight cover that with margin, while a wrong batch, learning rate or
// missing gradient bucket moves them by 1e-2 and more within a few steps.
void expect_same(const Outcome& gpu, const Outcome& cpu) {
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (size_t s = 0; s < cpu.losses.size(); ++s)
    ASSERT_NEAR(gpu.losses[s], cpu.losses[s], 2e-4 * std::fabs(cpu.losses[s])) << "step " << s + 1;
  double worst = 0, scale = 1e-12;
  for (size_t i = 0; i < cpu.params.size(); ++i) {
    worst = std::max(worst, std::fabs(double(gpu.params[i]) - cpu.params[i]));
    scale = std::max(scale, std::fabs(double(cpu.params[i])));
  }
  EXPECT_LT(worst / scale, 1e-3);
}

}  // namespace

TEST(GpuTraining, SameCurveAsTheCpuBackend) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  const int ranks = world_size();
  // One GPU per rank: NCCL, and the step replayed as a CUDA graph. More ranks than GPUs:
  // ranks share GPUs over the MPI transport (the MPS layout).
  const bool shared = cuda_device_count() < ranks;
  Outcome gpu = train(config("cuda", shared ? "mpi" : "nccl"));
  Outcome cpu = train(config("cpu", "mpi"));
  expect_same(gpu, cpu);
  if (!shared || ranks == 1) {
    EXPECT_TRUE(gpu.graph) << "the step was not captured as a graph";
  }
}

// LARS and LAMB inside the captured step graph: per-tensor sums and the update on the device,
// lr and the skip read from the step control; the same curve as the CPU backend.
TEST(GpuTraining, LarsAndLambTrainTheCpuCurveInTheGraph) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  const bool shared = cuda_device_count() < world_size();
  for (const char* opt : {"lars", "lamb"}) {
    Config gc = config("cuda", shared ? "mpi" : "nccl"), cc = config("cpu", "mpi");
    for (Config* c : {&gc, &cc}) {
      c->optimizer = opt;
      c->lr = std::string(opt) == "lars" ? 0.2 : 0.005;
      c->trust_coefficient = std::string(opt) == "lars" ? 0.02 : 0.0;
    }
    Outcome gpu = train(gc);
    expect_same(gpu, train(cc));
    if (!shared || world_size() == 1) EXPECT_TRUE(gpu.graph) << opt << ": the step was not captured";
  }
}

// One rank, comm.backend = auto: the one-rank transport (no NCCL communicator), the step still
// captured as a graph, and the same bits as the same run over NCCL (one rank has nothing to
// reduce: the transports differ only in what they set up).
TEST(GpuTraining, OneRankWithoutNcclGivesNcclsBits) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  if (world_size() != 1) GTEST_SKIP() << "one-rank test";
  Runtime rt;
  const Config c = config("cuda", "auto");
  make_backend_for(c, MPI_COMM_WORLD, rt);
  make_comm_for(c, MPI_COMM_WORLD, rt);
  EXPECT_EQ(rt.comm->name(), "self");
  rt.comm.reset();
  rt.backend.reset();
  Outcome self = train(c);
  Outcome nccl = train(config("cuda", "nccl"));
  EXPECT_TRUE(self.graph) << "the step was not captured as a graph";
  ASSERT_EQ(self.losses, nccl.losses);
  ASSERT_EQ(self.params, nccl.params);
  expect_same(self, train(config("cpu", "mpi")));
}

namespace {

using gpu_test::ScopedEnv;  // the backend reads DPT_STREAM_DATA and DPT_LT_FUSE when made

// Trains from files the way dptrain reads them (data.read = all or shard), with a test set.
Outcome train_files(const Config& c) {
  Runtime rt;
  make_backend_for(c, MPI_COMM_WORLD, rt);
  make_comm_for(c, MPI_COMM_WORLD, rt);
  RunData d = load_run_data(c, *rt.comm, true);
  auto t = make_trainer(c, *rt.backend, *rt.comm, d);
  TrainResult r = t->run();
  return {r.losses, t->model().packed(t->params_host()), r.graph, r.last_eval};
}

void expect_bitwise(const Outcome& a, const Outcome& b, const std::string& what) {
  EXPECT_EQ(a.losses, b.losses) << what;
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float))) << what;
  EXPECT_EQ(a.eval.loss, b.eval.loss) << what;
  EXPECT_EQ(a.eval.accuracy, b.eval.accuracy) << what;
  EXPECT_EQ(a.eval.n, b.eval.n) << what;
}

}  // namespace

// Where the rows come from (all of the file resident on the GPU, this rank's shard refreshed on
// the GPU each epoch under a replayed graph, data.read = stream's micro-batches staged into slots
// on the GPU, or the file or shard streamed through pinned buffers) must not
// change a bit of the result: the same kernels run on the same rows in the same order.
TEST(GpuTraining, ShardedAndStreamedDataGiveTheResidentBits) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  if (world_size() > cuda_device_count()) GTEST_SKIP() << "one GPU per rank needed";
  // One folder for all ranks: named by rank 0's process id (each rank's own would differ, and
  // the other ranks would not find rank 0's files).
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  long pid = long(::getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  const std::string dir = (std::filesystem::temp_directory_path() / ("dpt-gpu-data-" + std::to_string(pid))).string();
  if (rank == 0) {
    std::filesystem::create_directories(dir);
    write_dataset(dir + "/train.h5", synth_blobs(1000, 24, 6, 0.7f, 5));
    write_dataset(dir + "/test.h5", synth_blobs(333, 24, 6, 0.7f, 6));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  Config c = config("cuda", "auto");
  c.train_file = dir + "/train.h5";
  c.test_file = dir + "/test.h5";
  c.epochs = 3;  // the shard changes twice under the captured graph
  c.accumulate = 2;
  const Outcome resident = train_files(c);
  EXPECT_TRUE(resident.graph);
  EXPECT_EQ(resident.eval.n, 333);
  Config s = c;
  s.data_read = "shard";
  const Outcome shard = train_files(s);
  EXPECT_TRUE(shard.graph) << "a resident shard keeps the captured step";
  expect_bitwise(shard, resident, "data.read = shard, resident on the GPU");
  // data.read = stream: each step's micro-batches staged into two steps' slots on the device,
  // the step captured and replayed over them; read ahead by 8 micro-batches, and by 1.
  Config st = c;
  st.data_read = "stream";
  const Outcome stream = train_files(st);
  EXPECT_TRUE(stream.graph) << "data.read = stream keeps the captured step";
  expect_bitwise(stream, resident, "data.read = stream");
  st.stream_batches = 1;
  expect_bitwise(train_files(st), resident, "data.read = stream, 1 micro-batch ahead");
  {
    const ScopedEnv env({{"DPT_STREAM_DATA", "1"}});
    const Outcome streamed = train_files(c);
    EXPECT_FALSE(streamed.graph);
    expect_bitwise(streamed, resident, "whole file streamed");
    const Outcome streamed_shard = train_files(s);
    expect_bitwise(streamed_shard, resident, "shard streamed");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
}

#ifdef DPT_HAVE_CUDA
// bf16 with hidden ReLU layers takes the fused path (bf16 activations only, ReLU in the GEMM's
// epilogue): the same curve as the per-layer bf16 path (DPT_LT_FUSE=0), which differs only in
// the bias's rounding to bf16 and the bias gradient's summation, and, looser (bf16 against
// fp32), as the CPU backend. Gradient accumulation 2: the bias gradient is added as well as
// written. The worst deviations are printed.
TEST(GpuTraining, FusedBf16ReluTrainsThePerLayerCurve) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  // More ranks than GPUs: they share GPUs over the MPI transport, as in the test above.
  const bool shared = cuda_device_count() < world_size();
  Config c = config("cuda", shared ? "mpi" : "nccl");
  c.layers = {24, 128, 256, 6};
  c.activation = "relu";
  c.optimizer = "nesterov";
  c.lr = 0.05;
  c.accumulate = 2;
  c.precision = "bf16";
  auto run = [&](const Config& cfg, const char* fuse, int* fused) {
    const ScopedEnv env({{"DPT_LT_FUSE", fuse}});
    return train(cfg, fused);
  };
  int fused = -1, per_layer_fused = -1;
  const Outcome f = run(c, "1", &fused), p = run(c, "0", &per_layer_fused);
  Config cc = c;
  cc.device_type = "cpu";
  cc.comm_backend = "mpi";
  cc.precision = "fp32";
  const Outcome cpu = run(cc, "1", nullptr);
  EXPECT_EQ(fused, 2);
  EXPECT_EQ(per_layer_fused, 0);
  if (!shared || world_size() == 1) EXPECT_TRUE(f.graph);
  ASSERT_EQ(f.losses.size(), p.losses.size());
  ASSERT_EQ(f.losses.size(), cpu.losses.size());
  double worst_p = 0, worst_cpu = 0, worst_w = 0, scale = 1e-12;
  for (size_t s = 0; s < f.losses.size(); ++s) {
    worst_p = std::max(worst_p, std::fabs(f.losses[s] - p.losses[s]) / p.losses[s]);
    worst_cpu = std::max(worst_cpu, std::fabs(f.losses[s] - cpu.losses[s]) / cpu.losses[s]);
  }
  for (size_t i = 0; i < p.params.size(); ++i) {
    worst_w = std::max(worst_w, std::fabs(double(f.params[i]) - p.params[i]));
    scale = std::max(scale, std::fabs(double(p.params[i])));
  }
  std::printf("[ bf16     ] fused vs per-layer: loss %.3g, weights %.3g of the largest; vs cpu fp32: loss %.3g\n",
              worst_p, worst_w / scale, worst_cpu);
  EXPECT_LT(worst_p, 1e-2);
  EXPECT_LT(worst_w / scale, 1e-2);
  EXPECT_LT(worst_cpu, 5e-2);
}
#endif

namespace {
// The largest |a − b| over the largest |b|, and the largest relative loss difference.
double weights_off(const Outcome& a, const Outcome& b) {
  double worst = 0, scale = 1e-12;
  for (size_t i = 0; i < b.params.size(); ++i) {
    worst = std::max(worst, std::fabs(double(a.params[i]) - b.params[i]));
    scale = std::max(scale, std::fabs(double(b.params[i])));
  }
  return worst / scale;
}
double loss_off(const Outcome& a, const Outcome& b) {
  double worst = 0;
  for (size_t s = 0; s < b.losses.size(); ++s) worst = std::max(worst, std::fabs(a.losses[s] - b.losses[s]) / b.losses[s]);
  return worst;
}
}  // namespace

// The gradient sync's variants on the GPU (issue: sharded optimizer, bf16 wire, updates on the
// communication stream as soon as a bucket is reduced). Tiny buckets: several per step, and the
// first layer's weight gradient in row pieces. On one GPU per rank with NCCL (and one rank: the
// eager update alone), or ranks sharing GPUs over the MPI transport.
// - sharded (fp32 wire) and unsharded follow the CPU backend's curve within expect_same's
//   tolerances (the CPU run unsharded);
// - the eager update (on_nonfinite = stop) and the update after the backward pass (skip) are the
//   same kernels on the same data: bitwise;
// - bf16 on the wire: within 1% of the fp32 wire's loss, and not identical to it (with 2+ ranks);
// - bf16 precision, sharded (the bf16 weight copy is what is all-gathered) against unsharded:
//   the same arithmetic but for the weight gradient's row pieces, cut at other rows (the shard
//   grain), which cuBLAS may compute with other GEMM algorithms: 1e-4 (seen: 1e-6 on 2 ranks
//   sharing an H200).
TEST(GpuTraining, ShardedBf16WireAndEagerUpdatesFollowTheCpuCurve) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  const bool shared = cuda_device_count() < world_size();
  Config c = config("cuda", shared ? "mpi" : "nccl");
  c.bucket_mb = 0.002;
  c.accumulate = 2;
  Config cc = c;
  cc.device_type = "cpu";
  cc.comm_backend = "mpi";
  const Outcome cpu = train(cc);
  Config sh = c;
  sh.shard_optimizer = true;
  const Outcome plain = train(c), sharded = train(sh);
  expect_same(plain, cpu);
  expect_same(sharded, cpu);
  if (!shared || world_size() == 1) EXPECT_TRUE(sharded.graph);
  for (const Config* base : {&c, &sh}) {
    Config skip = *base;
    skip.on_nonfinite = "skip";
    const Outcome a = train(*base), b = train(skip);
    expect_bitwise(a, b, base->shard_optimizer ? "sharded: eager against after-backward update"
                                               : "eager against after-backward update");
  }
  Config wire = sh;
  wire.grad_dtype = "bf16";
  const Outcome w = train(wire);
  std::printf("[ sync     ] sharded vs cpu: loss %.3g, weights %.3g; bf16 wire vs fp32 wire: loss %.3g, weights %.3g\n",
              loss_off(sharded, cpu), weights_off(sharded, cpu), loss_off(w, sharded), weights_off(w, sharded));
  EXPECT_LT(loss_off(w, sharded), 1e-2);
  if (world_size() > 1) EXPECT_GT(weights_off(w, sharded), 0.0) << "bf16 was not on the wire";
  Config b16 = c;
  b16.precision = "bf16";
  b16.activation = "relu";
  Config b16s = b16;
  b16s.shard_optimizer = true;
  const Outcome u = train(b16), s = train(b16s);
  std::printf("[ sync     ] bf16 precision, sharded vs unsharded: loss %.3g, weights %.3g\n", loss_off(s, u), weights_off(s, u));
  EXPECT_LT(loss_off(s, u), 1e-4);
  EXPECT_LT(weights_off(s, u), 1e-4);
}
