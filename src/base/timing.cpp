#include "dpt/timing.hpp"

#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "dpt/log.hpp"

namespace dpt::timing {
namespace {

constexpr int kCount = int(Phase::count);
double g_sec[kCount] = {};
double g_start = 0;  // now() at start()

double& at(Phase p) { return g_sec[int(p)]; }

// The top-level phases, one after the other on the main thread.
constexpr Phase kSerial[] = {Phase::to_main, Phase::mpi_init, Phase::config,    Phase::backend,
                             Phase::comm,    Phase::data_wait, Phase::model,    Phase::first_rows,
                             Phase::loop,    Phase::around};

}  // namespace

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double since_process_start() {
  // Field 22 of /proc/self/stat: the start time in clock ticks after boot; the command name
  // (field 2) may hold spaces, so fields are counted after its closing parenthesis.
  std::ifstream in("/proc/self/stat");
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(s.substr(close + 2));
  std::string field;
  unsigned long long ticks = 0;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) ticks = std::stoull(field);
  timespec boot{};
  clock_gettime(CLOCK_BOOTTIME, &boot);
  const double up = double(boot.tv_sec) + double(boot.tv_nsec) * 1e-9;
  const double since = up - double(ticks) / double(sysconf(_SC_CLK_TCK));
  return since > 0 ? since : 0;
}

void start() {
  at(Phase::to_main) = since_process_start();
  g_start = now();
}

void add(Phase p, double seconds) { at(p) += seconds; }
double get(Phase p) { return at(p); }

Scope::Scope(Phase p) : p_(p), t0_(now()) {}
Scope::~Scope() { at(p_) += now() - t0_; }

namespace {

std::string row(const char* name, double s, const std::string& note = "") {
  char buf[160];
  std::snprintf(buf, sizeof buf, "  %-26s %7.3f", name, s);
  return std::string(buf) + (note.empty() ? "" : "  " + note) + "\n";
}

std::string secs(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

}  // namespace

void report(MPI_Comm c, bool print) {
  // What the marked phases leave out of this rank's time so far (banner, verdicts, summary).
  const double total = at(Phase::to_main) + (now() - g_start);
  double marked = 0;
  for (Phase p : kSerial) marked += at(p);
  at(Phase::other) = total - marked;
  double mx[kCount + 1];
  for (int i = 0; i < kCount; ++i) mx[i] = g_sec[i];
  mx[kCount] = total;
  MPI_Allreduce(MPI_IN_PLACE, mx, kCount + 1, MPI_DOUBLE, MPI_MAX, c);
  if (!print) return;
  auto m = [&](Phase p) { return mx[int(p)]; };
  std::string s = "timing (log.timing): seconds, the slowest rank's\n";
  s += row("process start to main", m(Phase::to_main), "shared libraries loaded, static constructors");
  s += row("MPI_Init", m(Phase::mpi_init));
  s += row("configuration", m(Phase::config), "read, broadcast, parsed");
  s += row("backend", m(Phase::backend), "device, CUDA context, streams, cuBLAS/cuBLASLt handles (cpu: OpenBLAS)");
  s += row("transport", m(Phase::comm), "NCCL communicator, or MPI");
  s += row("datasets (wait)", m(Phase::data_wait),
           "the wait once backend and transport are up; reading them (data.read = shard: the file's "
           "layout and the test rows) took " + secs(m(Phase::data_load)));
  s += row("model", m(Phase::model), "built, initialised or read, broadcast");
  s += row("first epoch's rows", m(Phase::first_rows),
           "data.read = shard: read before the first step (each later epoch's while the one before trains)");
  s += row("training loop", m(Phase::loop),
           "first two steps " + secs(m(Phase::first_steps)) + " (GEMM plans, graph capture), evaluations " +
               secs(m(Phase::eval)) + ", periodic checkpoints " + secs(m(Phase::checkpoint)));
  s += row("around the loop", m(Phase::around),
           "first epoch's order, dataset to the device, last device wait, final checkpoint " +
               secs(m(Phase::final_ckpt)));
  s += row("other", m(Phase::other), "banner, verdicts, summary");
  s += row("process start to here", mx[kCount]);
  log::info(s.substr(0, s.size() - 1));
}

void report_exit(bool print, double shutdown_s) {
  if (!print) return;
  const double total = at(Phase::to_main) + (now() - g_start);
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "timing: shut-down %.3f s (frees, MPI_Finalize); process start to the end of main %.3f s",
                shutdown_s, total);
  log::info(buf);
}

}  // namespace dpt::timing
