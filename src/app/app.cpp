#include "dpt/app.hpp"

#include <hdf5.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "dpt/check.hpp"
#include "dpt/cpu_threads.hpp"
#include "dpt/log.hpp"
#include "dpt/timing.hpp"
#include "dpt/watchdog.hpp"

namespace dpt {

MpiSession::MpiSession(int& argc, char**& argv) {
  int provided = 0;
  {
    timing::Scope timed(timing::Phase::mpi_init);
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  }
  // Errors come back as codes that DPT_CHECK_MPI turns into messages, not as MPI's own abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  set_where(rank_, host);
  log::set_rank(rank_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

MpiSession::~MpiSession() { finalize(); }

// MPI_Finalize waits for every rank: a rank stuck elsewhere makes it a hang the watchdog ends.
void MpiSession::finalize() {
  if (finalized_) return;
  finalized_ = true;
  {
    watchdog::Phase phase("waiting in MPI_Finalize");
    MPI_Finalize();
  }
  watchdog::stop();
}

bool cut_enabled(const char* env) {
  const char* v = std::getenv(env);
  return !(v && std::string(v) == "0");
}

void end_process(int rc) {
  if (!cut_enabled("DPT_FAST_EXIT")) return;
  std::fflush(nullptr);
  std::_Exit(rc);
}

EarlyDriverInit::EarlyDriverInit() {
  if (!cuda_compiled() || !cut_enabled("DPT_EARLY_CUDA")) return;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    const char* v = std::getenv(name);
    char* end = nullptr;
    const long r = v && *v ? std::strtol(v, &end, 10) : -1;
    if (v && *v && *end == '\0' && r >= 0 && r < 1 << 20) {
      hint_ = int(r);
      break;
    }
  }
  const int hint = hint_;
  try {
    thread_ = std::thread([hint] { cuda_early_init(hint); });
  } catch (const std::system_error&) {
    hint_ = -1;  // no thread to be had: the backend initialises the driver itself, as before
  }
}

void EarlyDriverInit::join() {
  if (thread_.joinable()) thread_.join();
}

void EarlyDriverInit::check(int local_rank) const {
  if (hint_ >= 0 && hint_ != local_rank && cuda_device_count() > 0)
    log::warn("the launcher's local rank " + std::to_string(hint_) + " is not MPI's (" +
              std::to_string(local_rank) + "): a CUDA context was made at start-up on a GPU this "
              "rank may not use; set DPT_EARLY_CUDA=0");
}

DataLoader::DataLoader(const Config& cfg, MPI_Comm c, bool with_train) {
  int rank = 0, world = 1;
  MPI_Comm_rank(c, &rank);
  MPI_Comm_size(c, &world);
  // cfg outlives the loader (main's Invocation); the thread reads files only: no MPI, no
  // watchdog phase (the main thread marks its wait instead).
  read_ = [&cfg, rank, world, with_train] {
    timing::Scope timed(timing::Phase::data_load);
    return load_run_data(cfg, rank, world, with_train);
  };
  if (!cut_enabled("DPT_LOAD_THREAD")) return;
  try {
    pending_ = std::async(std::launch::async, read_);
  } catch (const std::system_error&) {
    // no thread to be had: get() reads them
  }
}

RunData DataLoader::get() {
  timing::Scope timed(timing::Phase::data_wait);
  return pending_.valid() ? pending_.get() : read_();
}

int stage(MPI_Comm c, const std::function<void()>& f) {
  std::string msg;
  const int code = run_captured(f, msg);
  if (all_ok(c, code == 0, msg)) return 0;
  int worst = 0;
  watchdog::Phase phase("waiting for every rank's verdict");
  MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, c);
  return worst;
}

Invocation read_invocation(MPI_Comm c, int argc, char** argv) {
  int rank = 0;
  MPI_Comm_rank(c, &rank);
  const std::string path = find_config_path(argc, argv);
  std::string text, err;
  if (rank == 0 && !path.empty()) {
    // At most 16 MiB + 1 bytes are read, whatever the path is (a pipe, /dev/zero).
    constexpr size_t kMax = 16u << 20;
    std::error_code ec;
    std::ifstream in;
    if (std::filesystem::is_directory(path, ec)) err = "config file " + path + " is a directory";
    else if (in.open(path, std::ios::binary), !in) err = "cannot read config file " + path;
    if (err.empty()) {
      text.resize(kMax + 1);
      in.read(text.data(), std::streamsize(text.size()));
      text.resize(size_t(in.gcount()));
      if (in.bad()) err = "cannot read config file " + path;
      if (text.size() > kMax) err = "config file " + path + " is larger than 16 MiB";
    }
  }
  bcast_string(c, err);
  if (!err.empty()) throw InputError(err);
  bcast_string(c, text);
  return parse_invocation(argc, argv, path, text, !has_flag(argc, argv, "--eval") && !has_flag(argc, argv, "--predict"));
}

namespace {
// Ranks on this node whose CPU affinity mask is this rank's (itself included): ranks bound to
// cores of their own count 1; unbound ranks share the whole machine's mask.
int ranks_sharing_my_cpus(MPI_Comm c) {
  watchdog::Phase phase("waiting in allgather of CPU masks");
  MPI_Comm local;
  DPT_CHECK_MPI(MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
  int n = 1;
  MPI_Comm_size(local, &n);
  std::vector<unsigned char> mine = affinity_mask_bytes();
  mine.resize(sizeof(cpu_set_t));  // an unknown mask compares as empty, alike on every rank
  std::vector<unsigned char> all(mine.size() * size_t(n));
  const int rc = MPI_Allgather(mine.data(), int(mine.size()), MPI_BYTE, all.data(), int(mine.size()),
                               MPI_BYTE, local);
  MPI_Comm_free(&local);
  DPT_CHECK_MPI(rc);
  int same = 0;
  for (int r = 0; r < n; ++r) same += std::equal(mine.begin(), mine.end(), all.begin() + long(r) * long(mine.size()));
  return std::max(1, same);
}
}  // namespace

void make_backend_for(const Config& cfg, MPI_Comm c, Runtime& rt) {
  rt.node = node_info(c);
  BackendOptions opt;
  opt.type = cfg.device_type;
  opt.precision = parse_precision(cfg.precision);
  opt.local_rank = rt.node.local_rank;
  opt.local_size = rt.node.local_size;
  opt.conv_heuristic = cfg.conv_tuning == "heuristic";
  opt.conv_workspace_bytes = size_t(cfg.conv_workspace_mb) << 20;
  const int gpus = cfg.device_type == "cpu" ? 0 : cuda_device_count();
  if (gpus == 0) {  // the cpu backend: threads from the allocation
    ThreadSources ts = read_thread_sources(cfg.threads);
    ts.sharing_mask = ranks_sharing_my_cpus(c);
    const ThreadChoice tc = choose_cpu_threads(ts);
    opt.threads = tc.threads;
    opt.threads_source = tc.source;
  }
  // More ranks on the node than GPUs visible to each: ranks take GPU local_rank % gpus. That is
  // one GPU each when every rank sees only its own (--gpus-per-task), and ranks sharing GPUs
  // (the MPS layout) otherwise; make_comm_for tells the two apart.
  if (gpus > 0 && rt.node.local_size > gpus) opt.share_gpus = true;
  if (gpus == 0 && opt.precision != Precision::fp32)
    throw InputError("train.precision = " + cfg.precision + " needs a GPU (the cpu backend is fp32)");
  rt.backend = make_backend(opt);
}

void make_comm_for(const Config& cfg, MPI_Comm c, Runtime& rt) {
  std::string kind = cfg.comm_backend;
  // NCCL needs one GPU per rank; ranks sharing a GPU go through MPI. With comm.backend = nccl
  // the NCCL transport itself refuses a shared GPU with a message naming the ranks.
  if (kind == "auto" && rt.backend->name() == "cuda" && ranks_share_a_gpu(c, *rt.backend)) kind = "mpi";
  // One rank on a GPU has nothing to reduce: no NCCL communicator (DPT_ONE_RANK_COMM=0: NCCL).
  int size = 1;
  MPI_Comm_size(c, &size);
  if (kind == "auto" && size == 1 && rt.backend->name() == "cuda" && cut_enabled("DPT_ONE_RANK_COMM")) {
    rt.comm = make_self_comm(c, *rt.backend);
    return;
  }
  CommOptions co;
  co.nccl_max_ctas = cfg.nccl_max_ctas;
  rt.comm = make_comm(kind, c, *rt.backend, co);
}

void print_banner(const Config& cfg, const Runtime& rt, MPI_Comm c) {
  // Every rank's device line, gathered so rank 0 can show the whole job.
  std::string mine = rt.node.host + " local rank " + std::to_string(rt.node.local_rank) + ": " +
                     rt.backend->describe();
  int size = 1, rank = 0;
  MPI_Comm_size(c, &size);
  MPI_Comm_rank(c, &rank);
  std::vector<std::string> lines;
  for (int r = 0; r < size; ++r) {
    std::string s = mine;
    bcast_string(c, s, r);
    lines.push_back(s);
  }
  if (rank != 0) return;
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  std::ostringstream os;
  os << "dptrain: " << size << " rank(s), backend " << rt.backend->name() << ", transport "
     << rt.comm->describe() << "\n";
  os << "HDF5 " << maj << "." << min << "." << rel << "\n";
  for (int r = 0; r < size; ++r) {
    if (r > 0 && lines[size_t(r)] == lines[size_t(r - 1)].substr(0)) continue;
    os << "  rank " << r << ": " << lines[size_t(r)] << "\n";
  }
  os << "resolved configuration (" << cfg.source << "):\n" << cfg.resolved;
  log::info(os.str());
}

int fail_run(const std::exception& e, MPI_Comm c) {
  const auto* err = dynamic_cast<const Error*>(&e);
  const int code = err ? err->code() : kExitRuntime;
  int rank = 0;
  MPI_Comm_rank(c, &rank);
  if (err && err->collective()) {
    if (rank == 0) std::fprintf(stderr, "dptrain: %s\n", e.what());
    return code;
  }
  log::error(e.what());
  MPI_Abort(MPI_COMM_WORLD, code);
  return code;
}

}  // namespace dpt
