// bench-kernels: the memory-bound passes of a training step on the backend, alone, at the wide
// MLP's size, with the bandwidth each reaches against a device-to-device copy of the same bytes
// (the achievable ceiling): the fused optimizer (Nesterov, with the bf16 weight copy) and the
// non-finite check of the gradients. Prints one JSON object per pass.
//
//   mpirun -np 1 ./build/bench/bench-kernels --params 53600000 --reps 50
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "dpt/app.hpp"
#include "dpt/backend.hpp"
#include "dpt/check.hpp"
#include "dpt/config.hpp"
#include "dpt/log.hpp"

using namespace dpt;

namespace {

double time_ms(Backend& be, int reps, const std::function<void()>& f) {
  f();
  be.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) f();
  be.synchronize();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count() / reps;
}

void report(const char* pass, double ms, double bytes) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "{\"bench\": \"kernel\", \"pass\": \"%s\", \"ms\": %.4f, \"GB\": %.3f, \"TB_per_s\": %.2f}",
                pass, ms, bytes / 1e9, bytes / (ms * 1e-3) / 1e12);
  log::info(buf);
}

}  // namespace

int main(int argc, char** argv) {
  MpiSession mpi(argc, argv);
  try {
    size_t n = 53600000;
    int reps = 50;
    std::string precision = "bf16";
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--params") n = size_t(std::stoll(v));
      else if (k == "--reps") reps = std::stoi(v);
      else if (k == "--precision") precision = v;
      else throw InputError("bench-kernels: unknown option " + k);
    }
    BackendOptions o;
    o.type = "cuda";
    o.precision = parse_precision(precision);
    auto be = make_backend(o);
    Buffer<float> p(*be, n), g(*be, n), m(*be, n), big(*be, n * 11 / 2);
    be->register_parameters(p.data(), n);
    be->fill(p.data(), n, 0.01f);
    be->fill(g.data(), n, 0.001f);
    be->fill(m.data(), n, 0.f);
    be->fill(big.data(), big.size(), 1.f);
    // A copy moving 22 bytes per parameter (11 read, 11 written), the optimizer's traffic.
    const size_t half = big.size() / 2 * sizeof(float);
    report("copy (d2d, same bytes as the optimizer)",
           time_ms(*be, reps, [&] { be->copy(big.data() + big.size() / 2, big.data(), half); }), 2.0 * half);
    OptimStep h;
    h.kind = OptKind::nesterov;
    h.lr = 1e-4f;
    h.momentum = 0.9f;
    report("optimizer nesterov + bf16 copy", time_ms(*be, reps, [&] {
             be->optimizer_step(p.data(), g.data(), m.data(), nullptr, n, h);
           }), double(n) * (o.precision == Precision::bf16 ? 22 : 20));
    Buffer<StepCtl> ctl(*be, 1);
    StepCtl c0;
    be->upload(ctl.data(), &c0, sizeof c0);
    report("non-finite check", time_ms(*be, reps, [&] { be->check_finite(g.data(), n, ctl.data()); }),
           double(n) * 4);
    return 0;
  } catch (const std::exception& e) {
    return fail_run(e, MPI_COMM_WORLD);
  }
}
