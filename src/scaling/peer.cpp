// The PyTorch DDP peer: rank 0 runs bench/torch_ddp.py under torchrun (`python3 -m
// torch.distributed.run --standalone`) for 1 GPU and for the GPUs of its host, with the scaling
// rows' model, batch per GPU, precision and optimizer, while the other ranks sleep; its rows are
// then set beside dptrain's fastest variant with the ratio of step times.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "dpt/scaling.hpp"
#include "dpt/check.hpp"
#include "dpt/log.hpp"

namespace dpt::scaling {
namespace {

namespace fs = std::filesystem;

// --- the script's JSON line: flat objects written by Python's json.dumps ----------------------

// Where the value of "key" starts in obj (after the colon and blanks), or npos.
size_t value_at(const std::string& obj, const std::string& key) {
  const auto p = obj.find("\"" + key + "\":");
  if (p == std::string::npos) return p;
  return obj.find_first_not_of(" ", p + key.size() + 3);
}

double json_num(const std::string& obj, const std::string& key) {
  const size_t p = value_at(obj, key);
  if (p == std::string::npos || obj.compare(p, 4, "null") == 0) return NAN;
  char* end = nullptr;
  const double v = std::strtod(obj.c_str() + p, &end);
  return end == obj.c_str() + p ? NAN : v;
}

std::string json_str(const std::string& obj, const std::string& key) {
  size_t p = value_at(obj, key);
  if (p == std::string::npos || obj[p] != '"') return "";
  std::string out;
  for (++p; p < obj.size() && obj[p] != '"'; ++p) {
    if (obj[p] == '\\' && p + 1 < obj.size()) ++p;
    out += obj[p];
  }
  return out;
}

bool json_true(const std::string& obj, const std::string& key) {
  const size_t p = value_at(obj, key);
  return p != std::string::npos && obj.compare(p, 4, "true") == 0;
}

// The {...} objects of the list that follows "key": [ (flat: no braces inside).
std::vector<std::string> json_objects(const std::string& text, const std::string& key) {
  std::vector<std::string> out;
  size_t p = value_at(text, key);
  if (p == std::string::npos || text[p] != '[') return out;
  bool quoted = false;
  size_t start = std::string::npos;
  for (++p; p < text.size(); ++p) {
    const char c = text[p];
    if (quoted) {
      if (c == '\\') ++p;
      else if (c == '"') quoted = false;
    } else if (c == '"') {
      quoted = true;
    } else if (c == '{') {
      start = p;
    } else if (c == '}' && start != std::string::npos) {
      out.push_back(text.substr(start, p + 1 - start));
      start = std::string::npos;
    } else if (c == ']' && start == std::string::npos) {
      break;
    }
  }
  return out;
}

std::string quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

std::string run_capture(const std::string& cmd, int& rc) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) {
    rc = -1;
    return out;
  }
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) out += buf;
  const int status = pclose(p);
  rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return out;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string list(const std::vector<double>& v) {
  std::string o;
  for (size_t i = 0; i < v.size(); ++i) o += (i ? "," : "") + fmt("%g", v[i]);
  return o;
}

std::string layers_text(const std::vector<int>& l) {
  std::string o;
  for (size_t i = 0; i < l.size(); ++i) o += (i ? "," : "") + std::to_string(l[i]);
  return o;
}

// torch_ddp.py's error when torch_cnn.build cannot build a layer list (it knows no bn, res(...) or
// avgpool(global)).
constexpr const char* kCannotBuild = "torch_cnn.build cannot build";

// The model's arguments: MLP widths as they are; a layer list (its normalised text, a preset such
// as "resnet50(classes=10)" as written) quoted as one shell word, with its images' shape.
std::string model_args(const ModelSpec& m) {
  if (!m.is_list()) return "--layers " + layers_text(m.layers);
  std::string shape;
  for (size_t i = 0; i < m.input.size(); ++i) shape += (i ? "," : "") + std::to_string(m.input[i]);
  return "--layers " + quote(m.list) + " --input " + shape;
}

// The torchrun command of one peer run (a shell command: run_capture runs it with popen).
std::string peer_command(const Settings& s, const ModelSpec& m, int procs, int batch, bool gpu, const std::string& json) {
  const Config& c = s.base;
  std::ostringstream o;
  o << "timeout -k 10 " << fmt("%.0f", s.ddp_timeout_s) << " " << quote(s.ddp_python) << " -m torch.distributed.run "
    << s.ddp_torchrun_args << " --nproc_per_node=" << procs << " " << quote(s.ddp_script)
    << " " << model_args(m) << " --activation " << c.activation << " --batch " << batch
    << " --precision " << c.precision << " --optimizer " << c.optimizer << " --lr 0.001 --momentum "
    << fmt("%g", c.momentum) << " --weight-decay " << fmt("%g", c.weight_decay) << " --buckets "
    << list(s.ddp_buckets_mb) << " --compile " << s.ddp_compile << " --warmup " << s.ddp_warmup << " --steps "
    << s.ddp_steps << " --repeat " << s.ddp_repeats << " --device " << (gpu ? "cuda" : "cpu") << " --unpin --json-out " << quote(json);
  return o.str();
}

// "torch <version> <cuda devices>" when the interpreter imports torch and torch.distributed.
bool probe_torch(const std::string& python, std::string& version, int& devices, std::string& why) {
  int rc = 0;
  const std::string out = run_capture(
      quote(python) + " -c \"import torch, torch.distributed; "
                      "print('torch', torch.__version__, torch.cuda.device_count() if torch.cuda.is_available() else 0)\"",
      rc);
  const auto p = out.rfind("torch ");
  if (rc != 0 || p == std::string::npos) {
    why = python + " cannot import torch and torch.distributed (exit " + std::to_string(rc) + ")";
    return false;
  }
  std::istringstream in(out.substr(p + 6));
  in >> version >> devices;
  return true;
}

// One torchrun launch: its output logged in logs/, its rows read from the JSON file the script
// rewrites after every row (so a launch stopped by ddp.timeout_s keeps what it finished).
PeerRun launch(const Settings& s, const ModelSpec& m, int procs, int batch, bool gpu, const fs::path& logs) {
  const fs::path file = logs / (m.name + "-n" + std::to_string(procs) + "-b" + std::to_string(batch) + ".log");
  fs::path json = file;
  json.replace_extension(".json");
  fs::remove(json);
  const std::string cmd = peer_command(s, m, procs, batch, gpu, json.string());
  log::info("ddp peer: " + cmd);
  int rc = 0;
  const std::string out = run_capture(cmd, rc);
  std::ofstream(file) << "$ " << cmd << "\n" << out << "\nexit " << rc << "\n";
  std::ifstream jf(json);
  std::ostringstream js;
  if (jf) js << jf.rdbuf();
  PeerRun run = parse_peer_output(js.str().empty() ? out : js.str());
  run.model = m.name;
  run.command = cmd;
  run.ranks = procs;
  run.batch_per_rank = batch;
  if (rc != 0 && run.error.empty())
    run.error = "torchrun exited " + std::to_string(rc) + (rc == 124 ? " (ddp.timeout_s)" : "") + ", see " + file.string();
  return run;
}

std::string peer_name(const PeerRow& r) {
  const std::string kind = r.kind == "eager"          ? "eager"
                           : r.kind == "compile-step" ? "torch.compile, whole step"
                                                      : "torch.compile, model";
  if (!r.ddp) return "1 process, " + kind;
  return "DDP bucket " + fmt("%g", r.bucket_mb) + " MB, " + kind;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

PeerRun parse_peer_output(const std::string& output) {
  PeerRun run;
  std::istringstream in(output);
  std::string line;
  for (std::string l; std::getline(in, l);)  // the last such line (a launcher may prefix it)
    if (const auto p = l.find("{\"bench\": \"torch-ddp\""); p != std::string::npos) line = l.substr(p);
  if (line.empty()) {
    run.error = "no {\"bench\": \"torch-ddp\", ...} line in the output";
    return run;
  }
  run.torch_version = json_str(line, "torch");
  run.ranks = int(json_num(line, "world_size"));
  run.batch_per_rank = int(json_num(line, "batch_per_gpu"));
  run.error = json_str(line, "error");
  if (json_true(line, "partial")) run.error = "cut short: only the rows finished before the time limit";
  for (const std::string& o : json_objects(line, "rows")) {
    PeerRow r;
    r.kind = json_str(o, "kind");
    r.ddp = json_true(o, "ddp");
    r.bucket_mb = r.ddp ? json_num(o, "bucket_mb") : 0;
    r.ms = json_num(o, "ms_per_step");
    r.ms_min = json_num(o, "ms_min");
    r.ms_max = json_num(o, "ms_max");
    r.error = json_str(o, "error");
    run.rows.push_back(r);
  }
  if (run.rows.empty() && run.error.empty()) run.error = "no rows in the torch-ddp line";
  return run;
}

std::vector<PeerRun> run_ddp_peer(Context& cx, std::vector<std::string>& notes,
                                  const std::function<void(const std::vector<PeerRun>&)>& done) {
  const Settings& s = *cx.s;
  std::vector<PeerRun> runs;
  const bool gpu = cx.backend_name == "cuda";
  int local0 = cx.node.local_size;  // ranks on rank 0's host: the GPUs this launch uses there
  DPT_CHECK_MPI(MPI_Bcast(&local0, 1, MPI_INT, 0, cx.world));
  if (s.ddp_run == "never" || (s.ddp_run == "gpu" && !gpu)) {
    notes.push_back(s.ddp_run == "never" ? "PyTorch DDP peer: not run (ddp.run = never)."
                                         : "PyTorch DDP peer: skipped, no GPU in use (backend " + cx.backend_name +
                                               "); ddp.run = always runs it on CPU ranks over gloo.");
    return runs;
  }
  if (cx.rank == 0) {
    std::string version, why;
    int devices = 0;
    if (!fs::exists(s.ddp_script)) {
      notes.push_back("PyTorch DDP peer: skipped, " + s.ddp_script + " not found (run from the repository root).");
    } else if (!probe_torch(s.ddp_python, version, devices, why)) {
      notes.push_back("PyTorch DDP peer: skipped, " + why + ".");
    } else if (gpu && devices < 1) {
      notes.push_back("PyTorch DDP peer: skipped, torch " + version + " sees no CUDA device.");
    } else {
      // One process per GPU (NCCL refuses two on one); the largest power of two, as our subsets.
      const int top = subset_sizes(std::min(local0, gpu ? devices : local0), s.max_ranks).back();
      const fs::path logs = fs::path(s.out_dir) / "ddp-peer";
      fs::create_directories(logs);
      std::vector<int> procs{1};
      if (top > 1) procs.push_back(top);
      if (cx.size > local0)
        notes.push_back("PyTorch DDP peer: on rank 0's host only (" + std::to_string(top) + " GPU(s)); torchrun --standalone spans one host.");
      std::map<std::tuple<std::string, int, int>, bool> ran;
      // Weak first, then strong (at 1 GPU its own batch): what a time limit cuts is the least needed.
      for (const ModelSpec& m : s.models) {
        bool unbuildable = false;  // a layer list torch_cnn.build does not know: one launch says so
        for (bool weak : {true, false})
          for (int k : procs) {
            if (unbuildable || (!weak && s.strong_batch(m) % k != 0)) continue;
            const int b = weak ? s.weak_batch(m) : s.strong_batch(m) / k;
            if (ran[{m.name, k, b}]) continue;
            ran[{m.name, k, b}] = true;
            PeerRun run = launch(s, m, k, b, gpu, logs);
            unbuildable = run.rows.empty() && run.error.rfind(kCannotBuild, 0) == 0;
            if (!run.error.empty())
              notes.push_back("PyTorch DDP peer, " + m.name + " on " + std::to_string(k) + ": " + run.error +
                              (unbuildable ? " (not run again)" : ""));
            runs.push_back(run);
            if (done) done(runs);
          }
      }
      notes.push_back("PyTorch DDP peer: torch " + version + ", logs in " + logs.string() + ".");
    }
  }
  idle_barrier(cx.world);
  return runs;
}

// ---------------------------------------------------------------------------------------------

Table peer_table(const Settings& s, const Table& sc, const std::vector<PeerRun>& runs) {
  Table t{"ddp_peer", "PyTorch DDP beside dptrain (same model, batch per GPU, precision, optimizer)",
          {{"model", "model", "", ""},
           {"mode", "mode", "", ""},
           {"ranks", "ranks", "", "%.0f"},
           {"batch_per_rank", "b/rank", "samples", "%.0f"},
           {"peer", "PyTorch", "", ""},
           {"peer_step_ms", "step", "ms", "%.3f"},
           {"peer_min_ms", "min", "ms", "%.3f"},
           {"peer_max_ms", "max", "ms", "%.3f"},
           {"peer_efficiency", "eff", "", "%.3f"},
           {"strongest", "best", "", ""},
           {"ours_variant", "dptrain", "fastest variant", ""},
           {"ours_step_ms", "step", "ms", "%.3f"},
           {"ours_efficiency", "eff", "", "%.3f"},
           {"ratio", "ratio", "ours/peer", "%.3f"},
           {"note", "note", "", ""}},
          {},
          {}};
  auto run_for = [&](const std::string& model, int n, int b) -> const PeerRun* {
    for (auto& r : runs)
      if (r.model == model && r.ranks == n && r.batch_per_rank == b) return &r;
    return nullptr;
  };
  // dptrain's fastest variant for a model, mode and rank count (row index, or npos).
  auto ours = [&](const std::string& model, const std::string& mode, int n) {
    size_t best = std::string::npos;
    for (size_t i = 0; i < sc.rows.size(); ++i)
      if (sc.at(i, "model")->text == model && sc.at(i, "mode")->text == mode && int(sc.at(i, "ranks")->num) == n &&
          !sc.at(i, "step_ms")->empty && (best == std::string::npos || sc.at(i, "step_ms")->num < sc.at(best, "step_ms")->num))
        best = i;
    return best;
  };
  for (const ModelSpec& m : s.models)
    for (const char* mode : {"weak", "strong"}) {
      const bool weak = mode[0] == 'w';
      std::vector<int> ns;
      for (auto& r : runs)
        if (r.model == m.name && std::find(ns.begin(), ns.end(), r.ranks) == ns.end()) ns.push_back(r.ranks);
      std::sort(ns.begin(), ns.end());
      auto batch = [&](int n) { return weak ? s.weak_batch(m) : s.strong_batch(m) / n; };
      const PeerRun* one = run_for(m.name, 1, batch(1));
      for (int n : ns) {
        if (!weak && s.strong_batch(m) % n != 0) continue;
        const int b = batch(n);
        const PeerRun* run = run_for(m.name, n, b);
        if (!run) continue;
        const size_t o = ours(m.name, mode, n);
        const size_t first = t.rows.size();
        for (const PeerRow& r : run->rows) {
          double eff = NAN;  // against the same kind on one process
          for (const PeerRow& q : one ? one->rows : std::vector<PeerRow>{})
            if (q.kind == r.kind && q.ms > 0 && r.ms > 0) eff = efficiency(double(b) * n / r.ms, n, double(batch(1)) / q.ms);
          const bool has_ours = o != std::string::npos;
          t.rows.push_back({txt(m.name), txt(mode), num(n), num(b), txt(peer_name(r)), num(r.ms), num(r.ms_min),
                            num(r.ms_max), num(eff), txt(""), has_ours ? txt(sc.at(o, "variant")->text) : none(),
                            has_ours ? num(sc.at(o, "step_ms")->num) : none(),
                            has_ours ? num(sc.at(o, "efficiency")->num) : none(),
                            has_ours && r.ms > 0 ? num(sc.at(o, "step_ms")->num / r.ms) : none(), txt(r.error)});
        }
        size_t best = std::string::npos;
        for (size_t i = first; i < t.rows.size(); ++i)
          if (!t.rows[i][5].empty && (best == std::string::npos || t.rows[i][5].num < t.rows[best][5].num)) best = i;
        if (best != std::string::npos) t.rows[best][9] = txt("*");
      }
    }
  t.notes = {
      "PyTorch: bench/torch_ddp.py under torchrun, one process per GPU; zero_grad(set_to_none=True), the model's forward "
      "(bf16: autocast), cross-entropy, backward, optimizer step; DDP with gradient_as_bucket_view=True and each bucket_cap_mb "
      "of ddp.buckets_mb; torch.compile rows compile the DDP model (PyTorch's DDPOptimizer splits it at bucket boundaries) or "
      "the whole step. Data: one fixed batch on the GPU (dptrain gathers a new batch each step).",
      "model: MLP widths as nn.Linear layers; a layer list as bench/torch_cnn.py's build makes it (nn.Sequential of "
      "conv, pooling, activations, flatten, linear, dropout; a preset resnet18/34/50 as torchvision's ResNet, "
      "stem=small: a 3x3 stride-1 conv, no max pool), model and images in channels_last; a list it cannot build is "
      "named in the notes.",
      "step: the slowest process's median over ddp.repeats windows of ddp.steps steps after ddp.warmup steps (CUDA events; "
      "wall time on CPU processes).",
      "eff: the peer's throughput(n) / (n x throughput(1)) of the same kind (eager or compiled) on 1 process; best (*): "
      "the fastest peer row for that model, mode and n.",
      "dptrain: the fastest variant of the scaling table at the same model, mode and n; ratio = dptrain step / peer step "
      "(below 1: dptrain is faster)."};
  return t;
}

}  // namespace dpt::scaling
