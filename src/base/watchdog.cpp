#include "dpt/watchdog.hpp"

#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "dpt/check.hpp"
#include "dpt/comm.hpp"

namespace dpt {
namespace watchdog {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// The phase stack. Only the main thread writes; the watchdog thread reads. A slot is written
// before the depth that publishes it; `gen` changes on every push, pop and restart, so the
// watchdog fires only when it sees the same expired phase twice (no verdict on a torn read).
constexpr int kDepth = 8;
struct Slot {
  std::atomic<const char*> what{nullptr};
  std::atomic<int64_t> step{-1};
  std::atomic<int64_t> since{0};
};
Slot g_slot[kDepth];
std::atomic<int> g_depth{0};
std::atomic<uint64_t> g_gen{0};

std::atomic<int64_t> g_timeout_ns{300'000'000'000};
std::atomic<Comm*> g_comm{nullptr};
std::atomic<bool> g_stop{false};
std::thread g_thread;
std::once_flag g_started;
std::string g_where;

std::string label(int i) {
  const char* w = g_slot[i].what.load(std::memory_order_relaxed);
  const int64_t st = g_slot[i].step.load(std::memory_order_relaxed);
  std::string s = w ? w : "?";
  if (st == 0) s += ", start-up";
  if (st > 0) s += ", step " + std::to_string(st);
  return s;
}

// "waiting in allreduce, step 7 (inside computing, step 7)"
std::string describe_stack(int depth) {
  std::string s = label(depth - 1);
  if (depth == 1) return s;
  s += " (inside ";
  for (int i = depth - 2; i >= 0; --i) s += label(i) + (i ? ", inside " : ")");
  return s;
}

// The last resort: the line, the communicator's abort (bounded: a broken NCCL may not return),
// then MPI_Abort, which ends every rank of the job.
[[noreturn]] void expire(int depth, double waited) {
  const double limit = double(g_timeout_ns.load()) * 1e-9;
  std::fprintf(stderr,
               "dptrain watchdog (%s): %s for %.1f s, past comm.timeout_s = %g; aborting every "
               "rank (exit %d)\n",
               g_where.c_str(), describe_stack(depth).c_str(), waited, limit, kExitTimeout);
  std::fflush(stderr);
  if (Comm* c = g_comm.load()) {
    std::atomic<bool> done{false};
    std::thread([c, &done] { c->abort(); done = true; }).detach();
    for (int i = 0; i < 50 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // Ranks whose deadline falls within the next moment report too before the job goes down, so
  // the log holds the rank that is behind and the ones waiting for it.
  std::this_thread::sleep_for(std::chrono::duration<double>(std::min(1.0, limit / 2)));
  // MPI_Abort from this thread is outside MPI_THREAD_FUNNELED's letter; Open MPI's abort only
  // messages its daemon and exits, and it is the one call that ends the other ranks too.
  MPI_Abort(MPI_COMM_WORLD, kExitTimeout);
  std::_Exit(kExitTimeout);
}

void watch() {
  uint64_t seen_gen = ~uint64_t(0);
  while (!g_stop.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const int depth = g_depth.load(std::memory_order_acquire);
    if (depth <= 0) continue;
    const uint64_t gen = g_gen.load(std::memory_order_acquire);
    const int64_t since = g_slot[depth - 1].since.load(std::memory_order_relaxed);
    const int64_t waited = now_ns() - since;
    if (waited <= g_timeout_ns.load(std::memory_order_relaxed)) {
      seen_gen = ~uint64_t(0);
      continue;
    }
    if (gen == seen_gen && g_depth.load(std::memory_order_acquire) == depth) expire(depth, double(waited) * 1e-9);
    seen_gen = gen;  // confirm on the next tick
  }
}

}  // namespace

void start(double timeout_s) {
  set_timeout(timeout_s);
  std::call_once(g_started, [] {
    g_where = where();
    g_thread = std::thread(watch);
  });
}

void set_timeout(double timeout_s) {
  g_timeout_ns = int64_t(std::max(0.001, timeout_s) * 1e9);
}

void set_comm(Comm* comm) { g_comm = comm; }

void stop() {
  g_stop = true;
  if (g_thread.joinable()) g_thread.join();
}

Phase::Phase(const char* what, int64_t step) noexcept : depth_(g_depth.load(std::memory_order_relaxed)) {
  if (depth_ >= kDepth) return;  // deeper than anyone marks; the enclosing phase stays timed
  if (step < 0 && depth_ > 0) step = g_slot[depth_ - 1].step.load(std::memory_order_relaxed);
  Slot& s = g_slot[depth_];
  s.what.store(what, std::memory_order_relaxed);
  s.step.store(step, std::memory_order_relaxed);
  s.since.store(now_ns(), std::memory_order_relaxed);
  g_gen.fetch_add(1, std::memory_order_relaxed);
  g_depth.store(depth_ + 1, std::memory_order_release);
}

Phase::~Phase() {
  if (depth_ >= kDepth) return;
  g_gen.fetch_add(1, std::memory_order_relaxed);
  g_depth.store(depth_, std::memory_order_release);
}

void Phase::restart() noexcept {
  if (depth_ >= kDepth) return;
  g_slot[depth_].since.store(now_ns(), std::memory_order_relaxed);
  g_gen.fetch_add(1, std::memory_order_release);
}

}  // namespace watchdog

// ---------------------------------------------------------------------------------------------

namespace fault {
namespace detail {
int64_t g_from = INT64_MAX;
}  // namespace detail

namespace {
enum class Kind { none, sleep, delay, exit, throw_, kill, abort, nan, ckpt };
Kind g_kind = Kind::none;
double g_seconds = 0;
int g_code = 1;
int64_t g_step = -1;

[[noreturn]] void malformed(const std::string& v, const std::string& why) {
  throw InputError("DPT_FAULT='" + v + "' (a test hook): " + why +
                   "; expected rank=<r|*>,step=<s>,kind=sleep:S|delay:S|exit[:code]|throw|kill|abort|nan|ckpt");
}
}  // namespace

void init(int rank) {
  const char* env = std::getenv("DPT_FAULT");
  if (!env || !*env) return;
  const std::string v = env;
  std::string r = "*", kind;
  int64_t step = -1;
  size_t pos = 0;
  while (pos <= v.size()) {
    const size_t end = std::min(v.find(',', pos), v.size());
    const std::string item = v.substr(pos, end - pos);
    const size_t eq = item.find('=');
    if (eq == std::string::npos) malformed(v, "'" + item + "' is not key=value");
    const std::string key = item.substr(0, eq), val = item.substr(eq + 1);
    try {
      if (key == "rank") r = val;
      else if (key == "step") step = std::stoll(val);
      else if (key == "kind") kind = val;
      else malformed(v, "unknown key '" + key + "'");
    } catch (const std::logic_error&) {
      malformed(v, "bad number '" + val + "'");
    }
    pos = end + 1;
  }
  if (step < 0) malformed(v, "step is missing or negative");
  const std::string name = kind.substr(0, kind.find(':'));
  const std::string arg = kind.find(':') == std::string::npos ? "" : kind.substr(kind.find(':') + 1);
  try {
    if (name == "sleep" || name == "delay") {
      g_kind = name == "sleep" ? Kind::sleep : Kind::delay;
      g_seconds = std::stod(arg);
    } else if (name == "exit") {
      g_kind = Kind::exit;
      g_code = arg.empty() ? 1 : std::stoi(arg);
    } else if (name == "throw") g_kind = Kind::throw_;
    else if (name == "kill") g_kind = Kind::kill;
    else if (name == "abort") g_kind = Kind::abort;
    else if (name == "nan") g_kind = Kind::nan;
    else if (name == "ckpt") g_kind = Kind::ckpt;
    else malformed(v, "unknown kind '" + kind + "'");
  } catch (const std::logic_error&) {
    malformed(v, "bad argument in '" + kind + "'");
  }
  if (r != "*" && r != std::to_string(rank)) return;  // parsed on every rank, armed on one
  g_step = step;
  detail::g_from = step;
}

bool any() { return detail::g_from != INT64_MAX; }

void disarm() {
  detail::g_from = INT64_MAX;
  g_kind = Kind::none;
  g_step = -1;
}

void checkpoint_write(int64_t step, const std::string& path) {
  if (g_kind != Kind::ckpt || step != g_step) return;
  throw Error("cannot write checkpoint " + path + ": DPT_FAULT: injected failure of the write of step " +
              std::to_string(step));
}

bool detail::fire(int64_t step) {
  if (g_kind == Kind::ckpt) return false;  // fires in checkpoint_write, not in a step
  if (g_kind == Kind::delay) {
    std::this_thread::sleep_for(std::chrono::duration<double>(g_seconds));
    return false;
  }
  if (step != g_step) return false;
  std::fprintf(stderr, "dptrain (%s): DPT_FAULT fires at step %lld\n", where().c_str(),
               static_cast<long long>(step));
  std::fflush(stderr);
  switch (g_kind) {
    case Kind::sleep: std::this_thread::sleep_for(std::chrono::duration<double>(g_seconds)); return false;
    case Kind::exit: std::_Exit(g_code);
    case Kind::throw_: throw Error("DPT_FAULT: injected error on " + where() + " at step " + std::to_string(step));
    case Kind::kill: std::raise(SIGKILL); return false;
    case Kind::abort: std::abort();
    case Kind::nan: return true;
    default: return false;
  }
}

}  // namespace fault
}  // namespace dpt
