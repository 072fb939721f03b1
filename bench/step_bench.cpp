// bench-step: time dptrain's own training loop (Trainer::run, the product path: data gather
// on the device, forward, loss, backward with the bucketed gradient allreduce, optimizer) on a
// synthetic dataset already resident on the device, and report ms per step and model TFLOP/s.
//
//   mpirun -np 1 ./build/bench-step --layers 784,1024,1024,10 --batch 256 --precision tf32
//   mpirun -np 2 ./build/bench-step --layers 784,4096,4096,4096,4096,10 --batch 4096 --precision bf16 \
//       --shard-optimizer true --grad-dtype bf16 --nccl-max-ctas 8
//   mpirun -np 1 ./build/bench-step --layers "conv(32,3,pad=1) relu maxpool(2) flatten linear(10)" \
//       --input 1,28,28 --batch 256 --precision bf16
//
// --layers takes either form of model.layers; a layer list runs on synthetic images of --input
// (C,H,W). Model TFLOP/s = 6 × the forward multiply-adds per sample (a weight once per sample for
// a Linear layer, once per output pixel for a conv) × samples/s: the forward pass and the two
// backward GEMMs, as for the MLP (6 × parameters).
//
// Warm-up is separated by difference: after one untimed run, a run of W steps and a run of W+S
// steps, each in a fresh Trainer; (t(W+S) − t(W)) / S is the steady-state step time. Repeated
// --repeat times; the median and the spread are printed, slowest rank's time taken (MPI_MAX).
//
// Memory, less the resident synthetic dataset: on a GPU `peak_mib` is the device memory in use
// (the driver's count, cudaMemGetInfo) at the end of each run's steps, its most over the runs,
// less what was in use before the first (the CUDA context, library handles): the model,
// activations and their bf16 copies, gradients, optimizer state, the batch, workspaces, the
// libraries' own memory. `allocated_mib` is the most bytes dptrain had allocated at once, of
// which lazy memory (Backend::alloc_lazy: activations' floats, backed only where written) may
// hold less. Where the backend has no driver count (cpu) `peak_mib` is the allocated peak.
// bench/torch_cnn.py's `peak_mib` is PyTorch's max_memory_allocated() for its step.
//
// --account true then prints where the step's time goes, op by op, against each op's floor
// (step_account.hpp): --account-steps S steps timed after --account-warmup W.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "dpt/app.hpp"
#include "dpt/check.hpp"
#include "dpt/data.hpp"
#include "dpt/log.hpp"
#include "dpt/nn.hpp"
#include "dpt/train.hpp"
#include "step_account.hpp"
#ifdef DPT_HAVE_CUDA
#include "dpt/cuda_backend.hpp"
#endif

using namespace dpt;

namespace {

struct Args {
  std::string layers = "784,1024,1024,10", precision = "fp32", optimizer = "nesterov";
  std::string device = "auto", comm = "auto", input = "1,28,28";
  int batch = 256, warmup = 200, steps = 2000, repeat = 3;
  // The gradient path (train.shard_optimizer, comm.grad_dtype, comm.nccl_max_ctas, comm.bucket_mb).
  std::string shard = "false", grad_dtype = "fp32";
  std::string conv_tuning = "time";  // device.conv_tuning: heuristic skips cuDNN's timed search
  std::string recompute = "auto";    // device.recompute
  int nccl_max_ctas = 0;
  double bucket_mb = 25;
  std::string account = "false";
  int account_warmup = 10, account_steps = 20;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--layers") a.layers = v;
    else if (k == "--precision") a.precision = v;
    else if (k == "--optimizer") a.optimizer = v;
    else if (k == "--device") a.device = v;
    else if (k == "--comm") a.comm = v;
    else if (k == "--input") a.input = v;
    else if (k == "--batch") a.batch = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--repeat") a.repeat = std::stoi(v);
    else if (k == "--shard-optimizer") a.shard = v;
    else if (k == "--grad-dtype") a.grad_dtype = v;
    else if (k == "--nccl-max-ctas") a.nccl_max_ctas = std::stoi(v);
    else if (k == "--bucket-mb") a.bucket_mb = std::stod(v);
    else if (k == "--conv-tuning") a.conv_tuning = v;
    else if (k == "--recompute") a.recompute = v;
    else if (k == "--account") a.account = v;
    else if (k == "--account-warmup") a.account_warmup = std::stoi(v);
    else if (k == "--account-steps") a.account_steps = std::stoi(v);
    else throw InputError("bench-step: unknown option " + k);
  }
  if (a.shard != "true" && a.shard != "false") throw InputError("bench-step: --shard-optimizer " + a.shard + ": true or false");
  if (a.account != "true" && a.account != "false") throw InputError("bench-step: --account " + a.account + ": true or false");
  if (a.account_warmup < 0 || a.account_steps < 1)
    throw InputError("bench-step: --account-warmup must be >= 0 and --account-steps >= 1");
  return a;
}

Config make_config(const Args& a) {
  Config c;
  if (is_layer_list(a.layers)) {
    c.layers.clear();
    c.layer_list = layer_list_text(parse_layer_list(a.layers));
  } else {
    c.layers = parse_layers(a.layers);
  }
  c.train_file = "(synthetic)";
  c.batch_per_rank = a.batch;
  c.optimizer = a.optimizer;
  c.lr = 0.01;
  c.momentum = 0.9;
  c.precision = a.precision;
  c.shuffle = false;
  c.epochs = 1000000;
  c.log_every = 1 << 30;
  c.progress = false;
  c.resume = "none";
  c.device_type = a.device;
  c.comm_backend = a.comm;
  c.shard_optimizer = a.shard == "true";
  c.grad_dtype = a.grad_dtype;
  c.nccl_max_ctas = a.nccl_max_ctas;
  c.bucket_mb = a.bucket_mb;
  c.conv_tuning = a.conv_tuning;
  c.recompute = a.recompute;
  c.source = "bench-step's command line";
  validate(c);  // names the option's key and value when it is wrong
  return c;
}

// The loop's seconds (the slowest rank's); most: the device memory in use at the end of a run's
// steps (DeviceMemory::in_use) and the lazy bytes then, at the run with the most in use so far.
double loop_seconds(Config c, int64_t steps, Runtime& rt, const Dataset& ds, DeviceMemory& most) {
  c.steps = steps;
  Trainer t(c, *rt.backend, *rt.comm, &ds, nullptr);
  double s = t.run().seconds;
  const DeviceMemory m = rt.backend->device_memory();
  if (m.in_use >= most.in_use) most = m;
  DPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, rt.comm->mpi()));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  MpiSession mpi(argc, argv);
  try {
    const Args a = parse(argc, argv);
    Config cfg = make_config(a);
    Runtime rt;
    make_backend_for(cfg, MPI_COMM_WORLD, rt);
    make_comm_for(cfg, MPI_COMM_WORLD, rt);
    // The model's shapes: an MLP on its first width, a layer list on --input images.
    const bool list = !cfg.layer_list.empty();
    const std::vector<int> in = parse_input_shape(a.input);
    const TensorShape input = list ? TensorShape::image(in[0], in[1], in[2]) : TensorShape::features(cfg.layers.front());
    const ModelPlan plan = plan_model(list ? parse_layer_list(cfg.layer_list) : mlp_layer_list(cfg.layers, Act::relu), input, 0);
    const int classes = int(plan.output().c);
    // Enough rows for 64 distinct batches per rank; the loop wraps around epochs.
    Dataset ds = synth_blobs(int64_t(a.batch) * mpi.size() * 64, int(input.size()), classes, 1.f, 7);
    if (list) ds.sample_shape = {in[0], in[1], in[2]};
    double params = 0;  // forward multiply-adds per sample (with the biases' adds)
    for (const PlannedLayer& l : plan.layers)
      params += double(l.weights + l.biases) * double(l.spec.kind == LayerKind::conv ? l.out.h * l.out.w : 1);
    // One untimed run first: the first Trainer of a process pays one-time costs (the dataset's
    // upload to the device, library handles, NCCL's lazy set-up) that would skew a difference.
    rt.backend->reset_memory_peak();
    const DeviceMemory mem0 = rt.backend->device_memory();
    DeviceMemory most;
    loop_seconds(cfg, a.warmup, rt, ds, most);
    std::vector<double> ms;
    for (int r = 0; r < a.repeat; ++r) {
      const double t0 = loop_seconds(cfg, a.warmup, rt, ds, most);
      const double t1 = loop_seconds(cfg, a.warmup + a.steps, rt, ds, most);
      ms.push_back((t1 - t0) / a.steps * 1e3);
    }
    std::sort(ms.begin(), ms.end());
    // The resident dataset (features and labels, where the backend copied it) is not the step's.
    const DeviceMemory mem = rt.backend->device_memory();
    // (It stays allocated after the Trainers; a backend that streamed it holds less than that.)
    const double data_bytes = double(ds.n) * double(ds.dim) * (ds.is_u8 ? 1 : 4) + double(ds.n) * 4;
    const double on_device =
        !rt.backend->host_addressable() && double(mem.now - mem0.now) >= data_bytes ? data_bytes : 0.0;
    const double allocated_mib = (double(mem.peak) - on_device) / double(1 << 20);
    const double peak_mib =
        most.in_use ? (double(most.in_use) - double(mem0.in_use) - on_device) / double(1 << 20) : allocated_mib;
    int fused = -1;  // hidden layers through cuBLASLt's ReLU epilogues (-1: not the cuda backend)
#ifdef DPT_HAVE_CUDA
    if (CudaBackend* cb = as_cuda(*rt.backend)) fused = cb->fused_layers();
#endif
    const double med = ms[ms.size() / 2];
    const double samples = double(a.batch) * mpi.size() / (med * 1e-3);
    const double tflops = 6.0 * double(params) * samples / 1e12;
    char buf[1024];
    std::snprintf(buf, sizeof buf,
                  "bench-step layers=%s batch/rank=%d ranks=%d precision=%s optimizer=%s backend=%s "
                  "transport=%s shard_optimizer=%s grad_dtype=%s nccl_max_ctas=%d bucket_mb=%g: %.4f ms/step "
                  "(min %.4f, max %.4f over %d), %.0f samples/s, %.1f model TFLOP/s, %d hidden layers fused, "
                  "peak memory %.1f MiB (allocated %.1f MiB, %.1f MiB of it lazy)",
                  a.layers.c_str(), a.batch, mpi.size(), a.precision.c_str(), a.optimizer.c_str(),
                  rt.backend->name().c_str(), rt.comm->name().c_str(), a.shard.c_str(), a.grad_dtype.c_str(),
                  a.nccl_max_ctas, a.bucket_mb, med, ms.front(), ms.back(), a.repeat, samples, tflops, fused,
                  peak_mib, allocated_mib, double(most.lazy) / double(1 << 20));
    log::info(buf);
    if (most.buffers + most.copies + most.shadows + most.scratch + most.retired > 0) {
      // What the backend's allocations held at the end of the run with the most device memory in
      // use (its Trainer still there): the resident dataset is under other.
      const auto mib = [](size_t b) { return double(b) / double(1 << 20); };
      const size_t known = most.buffers + most.copies + most.shadows + most.scratch + most.retired;
      std::snprintf(buf, sizeof buf,
                    "bench-step memory held at the peak: buffers %.1f MiB (%.1f MiB of them lazy, backed where written), "
                    "bf16 copies %.1f MiB, parameter shadows %.1f MiB, scratch %.1f MiB, retired scratch %.1f MiB, "
                    "other %.1f MiB; device memory in use %.1f MiB",
                    mib(most.buffers), mib(most.lazy), mib(most.copies), mib(most.shadows), mib(most.scratch),
                    mib(most.retired), mib(most.now > known ? most.now - known : 0),
                    mib(most.in_use > mem0.in_use ? most.in_use - mem0.in_use : 0));
      log::info(buf);
    }
    std::snprintf(buf, sizeof buf,
                  "{\"bench\": \"step\", \"layers\": \"%s\", \"batch_per_rank\": %d, \"ranks\": %d, "
                  "\"precision\": \"%s\", \"optimizer\": \"%s\", \"backend\": \"%s\", \"transport\": \"%s\", "
                  "\"shard_optimizer\": %s, \"grad_dtype\": \"%s\", \"nccl_max_ctas\": %d, \"bucket_mb\": %g, "
                  "\"ms_per_step\": %.5f, \"ms_min\": %.5f, \"ms_max\": %.5f, \"samples_per_s\": %.1f, "
                  "\"model_tflops\": %.2f, \"fused_layers\": %d, \"peak_mib\": %.1f, \"allocated_mib\": %.1f}",
                  a.layers.c_str(), a.batch, mpi.size(), a.precision.c_str(), a.optimizer.c_str(),
                  rt.backend->name().c_str(), rt.comm->name().c_str(), a.shard.c_str(), a.grad_dtype.c_str(),
                  a.nccl_max_ctas, a.bucket_mb, med, ms.front(), ms.back(), samples, tflops, fused, peak_mib,
                  allocated_mib);
    log::info(buf);
    if (a.account == "true") {
      bench::AccountArgs aa;
      aa.warmup = a.account_warmup;
      aa.steps = a.account_steps;
      aa.graph_ms = med;
      aa.label = a.layers;
      bench::print_account(cfg, rt, ds, aa);
    }
    return 0;
  } catch (const std::exception& e) {
    return fail_run(e, MPI_COMM_WORLD);
  }
}
