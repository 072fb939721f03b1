// bench-scaling's settings: dptrain's sections go through dptrain's own option table; the
// sweep's sections are a small key table here, with the same error style (key, value, file).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "dpt/scaling.hpp"
#include "dpt/version.hpp"
#include "dpt/check.hpp"
#include "dpt/nn.hpp"

namespace dpt::scaling {
namespace {

const char* kOwnSections[] = {"scaling", "allreduce", "buckets", "grid", "predict", "ddp", "report", "cpu"};

bool own_section(const std::string& s) {
  for (const char* o : kOwnSections)
    if (s == o) return true;
  return false;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") + 1 - b);
}

std::vector<std::string> split(const std::string& s, const std::string& seps) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : s) {
    if (seps.find(ch) != std::string::npos) {
      if (!trim(cur).empty()) out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!trim(cur).empty()) out.push_back(trim(cur));
  return out;
}

using KV = std::vector<std::pair<std::string, std::string>>;

// Splits the INI text: dptrain's sections stay as text for its parser, ours become key/values
// ("section.key"), [cpu]'s keys go to `cpu`.
void split_ini(const std::string& text, const std::string& file, std::string& dptrain_text, KV& own,
               KV& cpu) {
  std::istringstream in(text);
  std::string line, section;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const std::string t = trim(line);
    if (!t.empty() && t[0] == '[') {
      section = trim(t.substr(1, t.find(']') - 1));
      if (!own_section(section)) dptrain_text += line + "\n";
      continue;
    }
    if (!own_section(section)) {
      dptrain_text += line + "\n";
      continue;
    }
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    const auto eq = t.find('=');
    if (eq == std::string::npos)
      throw InputError(file + ":" + std::to_string(lineno) + ": expected key = value, got '" + t + "'");
    const std::string key = trim(t.substr(0, eq)), value = trim(t.substr(eq + 1));
    if (section == "cpu") cpu.push_back({key, value});
    else own.push_back({section + "." + key, value});
  }
}

[[noreturn]] void bad(const std::string& key, const std::string& value, const std::string& where,
                      const std::string& why) {
  throw InputError("bench-scaling: " + key + " = '" + value + "' (" + where + "): " + why);
}

int to_int(const std::string& k, const std::string& v, const std::string& w, int lo) {
  try {
    size_t used = 0;
    const long x = std::stol(v, &used);
    if (used != v.size() || x < lo || x > (1L << 30)) throw 0;
    return int(x);
  } catch (...) {
    bad(k, v, w, "expected an integer ≥ " + std::to_string(lo));
  }
}

// `expected`: what the message says a value must be (default: a number ≥ lo).
double to_double(const std::string& k, const std::string& v, const std::string& w, double lo,
                 const std::string& expected = "") {
  try {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used != v.size() || !(x >= lo) || x > 1e15) throw 0;
    return x;
  } catch (...) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", lo);
    bad(k, v, w, "expected " + (expected.empty() ? "a number ≥ " + std::string(b) : expected));
  }
}

template <class T, class F> std::vector<T> to_list(const std::string& v, F conv) {
  std::vector<T> out;
  for (auto& item : split(v, ", ")) out.push_back(conv(item));
  return out;
}

// Every sweep key: name, meaning (for --help), and how it is stored.
struct Key {
  const char* name;
  const char* help;
  std::function<void(Settings&, const std::string& key, const std::string& value, const std::string& where)> set;
};

std::vector<Key> key_table() {
  auto I = [](int Settings::*m, int lo) {
    return [m, lo](Settings& s, const std::string& k, const std::string& v, const std::string& w) { s.*m = to_int(k, v, w, lo); };
  };
  auto D = [](double Settings::*m, double lo) {
    return [m, lo](Settings& s, const std::string& k, const std::string& v, const std::string& w) { s.*m = to_double(k, v, w, lo); };
  };
  auto budget = [](double Settings::*m) {
    return [m](Settings& s, const std::string& k, const std::string& v, const std::string& w) {
      s.*m = to_double(k, v, w, 0, "seconds ≥ 0 (0 turns the budget off)");
    };
  };
  return {
      {"scaling.models", "name:widths, e.g. 'default:784,256,128,10 wide:784,4096,4096,4096,10', or with layer lists "
                         "separated by ';': 'default:784,256,128,10; cnn@1,28,28:conv(32,3,pad=1) relu maxpool(2) flatten linear(10)'",
       [](Settings& s, const std::string&, const std::string& v, const std::string& w) {
         try {
           s.models = parse_models(v);
         } catch (const std::exception& e) {
           bad("scaling.models", v, w, e.what());
         }
       }},
      {"scaling.weak_batch_per_rank", "samples per rank in the weak-scaling and bucket rows", I(&Settings::weak_batch_per_rank, 1)},
      {"scaling.strong_global_batch", "global batch of the strong-scaling rows (split over the ranks)", I(&Settings::strong_global_batch, 1)},
      {"scaling.warmup_steps", "steps of the shorter run (their time is subtracted)", I(&Settings::warmup_steps, 1)},
      {"scaling.timed_steps", "extra steps of the longer run (step time = difference / timed_steps)", I(&Settings::timed_steps, 1)},
      {"scaling.timed_seconds", "time budget of a timing's longer run beyond the shorter: a row whose step is slow takes "
                                "min(timed_steps, max(min_timed_steps, ceil(timed_seconds / step))) timed steps, the step "
                                "probed first (0 = off: always timed_steps)", budget(&Settings::timed_seconds)},
      {"scaling.min_timed_steps", "fewest timed steps the time budget leaves a row (never more than timed_steps)",
       I(&Settings::min_timed_steps, 1)},
      {"scaling.warmup_seconds", "time budget of the shorter run: min(warmup_steps, max(5, ceil(warmup_seconds / step))) "
                                 "steps (0 = off: always warmup_steps)", budget(&Settings::warmup_seconds)},
      {"scaling.repeats", "repetitions of every timing (median, min, max)", I(&Settings::repeats, 1)},
      {"scaling.data_iters", "load_batch calls timed for the data share", I(&Settings::data_iters, 1)},
      {"scaling.latency_ms", "steps shorter than this are called launch/latency-bound", D(&Settings::latency_ms, 0)},
      {"scaling.max_ranks", "largest subset measured (0 = all ranks)", I(&Settings::max_ranks, 0)},
      {"scaling.variants",
       "gradient paths timed side by side: unsharded-fp32 unsharded-bf16 sharded-fp32 sharded-bf16 "
       "(train.shard_optimizer, comm.grad_dtype); unset = the config's own",
       [](Settings& s, const std::string&, const std::string& v, const std::string& w) {
         s.variants.clear();
         for (auto& item : split(v, ", ")) {
           const Variant x = parse_variant(item, w);
           if (std::find(s.variants.begin(), s.variants.end(), x) == s.variants.end()) s.variants.push_back(x);
         }
       }},
      {"allreduce.collectives", "collectives swept with the [allreduce] sizes: allreduce reduce_scatter all_gather",
       [](Settings& s, const std::string&, const std::string& v, const std::string& w) {
         s.collectives = to_list<Collective>(v, [&](const std::string& x) {
           for (Collective c : {Collective::allreduce, Collective::reduce_scatter, Collective::all_gather})
             if (collective_name(c) == x) return c;
           bad("allreduce.collectives", v, w, "collectives are allreduce, reduce_scatter, all_gather");
         });
       }},
      {"allreduce.min_bytes", "smallest message", D(&Settings::ar_min_bytes, 4)},
      {"allreduce.max_bytes", "largest message", D(&Settings::ar_max_bytes, 4)},
      {"allreduce.factor", "size step (×)", D(&Settings::ar_factor, 1.01)},
      {"allreduce.warmup", "untimed iterations per size", I(&Settings::ar_warmup, 0)},
      {"allreduce.iters", "timed iterations per size and repetition", I(&Settings::ar_iters, 1)},
      {"allreduce.repeats", "repetitions per size", I(&Settings::ar_repeats, 1)},
      {"buckets.sizes_mb", "gradient bucket sizes swept (MB)",
       [](Settings& s, const std::string&, const std::string& v, const std::string& w) {
         s.bucket_mb = to_list<double>(v, [&](const std::string& x) { return to_double("buckets.sizes_mb", x, w, 1e-6); });
       }},
      {"grid.enabled", "true/false: run the batch-size / learning-rate grid",
       [](Settings& s, const std::string&, const std::string& v, const std::string& w) {
         if (v != "true" && v != "false") bad("grid.enabled", v, w, "expected true or false");
         s.grid = v == "true";
       }},
      {"grid.global_batches", "global batches of the grid",
       [](Settings& s, const std::string&, const std::string& v, const std::string& w) {
         s.grid_batches = to_list<int>(v, [&](const std::string& x) { return to_int("grid.global_batches", x, w, 1); });
       }},
      {"grid.lr_rules", "lr_scaling rules of the grid (none, linear, sqrt)",
       [](Settings& s, const std::string&, const std::string& v, const std::string& w) {
         s.grid_rules = to_list<std::string>(v, [&](const std::string& x) {
           if (x != "none" && x != "linear" && x != "sqrt") bad("grid.lr_rules", v, w, "rules are none, linear, sqrt");
           return x;
         });
       }},
      {"grid.warmup", "warm-up settings of the grid (off, on)",
       [](Settings& s, const std::string&, const std::string& v, const std::string& w) {
         s.grid_warmup = to_list<int>(v, [&](const std::string& x) {
           if (x != "off" && x != "on") bad("grid.warmup", v, w, "values are off, on");
           return x == "on" ? 1 : 0;
         });
       }},
      {"grid.config", "dptrain INI giving the grid's model, data and optimizer (default: this file's sections)",
       [](Settings& s, const std::string&, const std::string& v, const std::string&) { s.grid_config = v; }},
      {"grid.optimizers", "optimizers of the grid with their base lr, e.g. 'nesterov:0.05 lars:2 lamb:0.01' "
                          "(default: [train]'s optimizer and lr)",
       [](Settings& s, const std::string&, const std::string& v, const std::string& w) {
         s.grid_optimizers = to_list<std::string>(v, [&](const std::string& x) {
           const auto c = x.find(':');
           if (c == std::string::npos) bad("grid.optimizers", v, w, "each entry is optimizer:lr, e.g. lamb:0.01");
           try {
             parse_optimizer(x.substr(0, c));
           } catch (const InputError& e) {
             bad("grid.optimizers", v, w, e.what());
           }
           to_double("grid.optimizers", x.substr(c + 1), w, 1e-12);
           return x;
         });
       }},
      {"grid.epochs", "training budget of every grid run, in epochs (fractions allowed)", D(&Settings::grid_epochs, 0.001)},
      {"grid.min_steps", "every grid run takes at least this many steps (large batches)", I(&Settings::grid_min_steps, 0)},
      {"grid.max_batch_per_rank", "largest batch a rank takes per micro-batch; beyond it train.accumulate",
       I(&Settings::grid_max_batch_per_rank, 1)},
      {"grid.check", "true/false: train the predicted fastest setting on every subset (measured time to target)",
       [](Settings& s, const std::string&, const std::string& v, const std::string& w) {
         if (v != "true" && v != "false") bad("grid.check", v, w, "expected true or false");
         s.grid_check = v == "true";
       }},
      {"grid.warmup_epochs", "length of the warm-up when on, in epochs", D(&Settings::warmup_epochs, 0)},
      {"grid.warmup_min_steps", "the warm-up, when on, lasts at least this many steps", I(&Settings::grid_warmup_min_steps, 0)},
      {"grid.target_accuracy", "test accuracy whose time-to-reach is reported", D(&Settings::target_accuracy, 0)},
      {"grid.evals_per_run", "evaluations per grid run", I(&Settings::grid_evals, 1)},
      {"predict.max_ranks", "largest rank count the alpha-beta model predicts", I(&Settings::predict_max_ranks, 1)},
      {"ddp.run", "PyTorch DDP peer: gpu (with the CUDA backend, where python imports torch), always (CPU ranks too, gloo), never",
       [](Settings& s, const std::string&, const std::string& v, const std::string& w) {
         if (v != "gpu" && v != "always" && v != "never") bad("ddp.run", v, w, "expected gpu, always or never");
         s.ddp_run = v;
       }},
      {"ddp.python", "python interpreter with torch (runs -m torch.distributed.run, i.e. torchrun)",
       [](Settings& s, const std::string&, const std::string& v, const std::string&) { s.ddp_python = v; }},
      {"ddp.torchrun_args", "arguments of python -m torch.distributed.run (torchrun) before --nproc_per_node",
       [](Settings& s, const std::string&, const std::string& v, const std::string&) { s.ddp_torchrun_args = v; }},
      {"ddp.script", "the peer's script",
       [](Settings& s, const std::string&, const std::string& v, const std::string&) { s.ddp_script = v; }},
      {"ddp.buckets_mb", "DDP bucket_cap_mb values swept (the best is the DDP row)",
       [](Settings& s, const std::string&, const std::string& v, const std::string& w) {
         s.ddp_buckets_mb = to_list<double>(v, [&](const std::string& x) { return to_double("ddp.buckets_mb", x, w, 1e-3); });
       }},
      {"ddp.compile", "torch.compile rows: none, model (the DDP model), step (the whole step), both",
       [](Settings& s, const std::string&, const std::string& v, const std::string& w) {
         if (v != "none" && v != "model" && v != "step" && v != "both") bad("ddp.compile", v, w, "expected none, model, step or both");
         s.ddp_compile = v;
       }},
      {"ddp.warmup", "untimed steps before each peer timing (compilation happens there)", I(&Settings::ddp_warmup, 1)},
      {"ddp.steps", "steps per timed window of the peer", I(&Settings::ddp_steps, 1)},
      {"ddp.repeats", "timed windows per peer row (median)", I(&Settings::ddp_repeats, 1)},
      {"ddp.timeout_s", "time limit of one torchrun launch", D(&Settings::ddp_timeout_s, 1)},
      {"report.out", "report folder (also --out); unset: ./scaling-report, in the current directory",
       [](Settings& s, const std::string&, const std::string& v, const std::string&) { s.out_dir = v; }},
      {"report.sections", "what runs: any of scaling, allreduce, buckets, grid (e.g. --report.sections grid)",
       [](Settings& s, const std::string&, const std::string& v, const std::string& w) {
         s.sections = to_list<std::string>(v, [&](const std::string& x) {
           if (x != "scaling" && x != "allreduce" && x != "buckets" && x != "grid")
             bad("report.sections", v, w, "sections are scaling, allreduce, buckets, grid");
           return x;
         });
       }},
      {"report.plots", "true/false: draw the plots with bench/plot_scaling.py (python3 + matplotlib)",
       [](Settings& s, const std::string&, const std::string& v, const std::string& w) {
         if (v != "true" && v != "false") bad("report.plots", v, w, "expected true or false");
         s.plots = v == "true";
       }},
  };
}

void apply(Settings& s, const KV& kv, const std::string& where) {
  static const std::vector<Key> keys = key_table();
  for (auto& [k, v] : kv) {
    auto it = std::find_if(keys.begin(), keys.end(), [&](const Key& key) { return k == key.name; });
    if (it == keys.end()) bad(k, v, where, "unknown key (bench-scaling --help lists them)");
    if (v.empty()) bad(k, v, where, "empty value");
    it->set(s, k, v, where);
  }
}

// Every argument is an option: --name value, --name=value, or one of the flags below. A stray
// word (`bench-scaling bench/scaling.ini`) would otherwise run the built-in defaults, or fail
// deep in Boost with no hint; named here, with --config FILE when it names a file.
void refuse_positionals(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h" || a == "--eval" || a == "--version") continue;
    if (a.size() > 1 && a[0] == '-') {
      if (a.find('=') == std::string::npos) ++i;  // its value
      continue;
    }
    std::string msg = "bench-scaling: unexpected argument '" + a +
                      "': every argument is an option (--config FILE, --out DIR, --section.key value; see --help)";
    std::error_code ec;
    if (std::filesystem::is_regular_file(a, ec)) msg += "; to read '" + a + "' as the configuration: --config " + a;
    throw InputError(msg);
  }
}

// Per-process storage of the overrides until finalize_settings (the file's and the CLI's).
struct Pending {
  KV file, cpu, cli;
};
Pending& pending() {
  static Pending p;
  return p;
}

}  // namespace

std::vector<ModelSpec> parse_models(const std::string& value) {
  // With a layer list among them (its layers are separated by spaces; every valid list has a
  // '(', its linear(N) at least) models are separated by ';'; otherwise by whitespace or ';', as
  // the widths-only form always was.
  std::vector<ModelSpec> out;
  const bool semis = value.find_first_of(";(") != std::string::npos;
  for (const std::string& item : split(value, semis ? ";" : " \t;")) {
    const auto c = item.find(':');
    if (c == std::string::npos || c == 0) throw InputError("'" + item + "': each model is name:w0,w1,... or name@C,H,W:layer list");
    ModelSpec m;
    std::string head = trim(item.substr(0, c));
    const std::string body = trim(item.substr(c + 1));
    const auto slash = head.find('/');
    if (slash != std::string::npos) {  // its own batches: /W or /W,S
      const std::string b = head.substr(slash + 1);
      head = head.substr(0, slash);
      std::vector<int> v;
      bool ok = true;
      for (const std::string& tok : split(b, ",")) {
        size_t pos = 0;
        long x = 0;
        try {
          x = std::stol(tok, &pos);
        } catch (const std::exception&) {
          pos = 0;
        }
        ok = ok && pos > 0 && pos == tok.size() && x >= 1 && x <= (1 << 24);
        v.push_back(int(ok ? x : 0));
      }
      if (!ok || v.empty() || v.size() > 2 || b.empty() || b.front() == ',' || b.back() == ',' || b.find(",,") != std::string::npos)
        throw InputError("'" + item + "': a model's own batches are /W or /W,S (positive integers: the weak batch per rank, the strong global batch), not /" + b);
      m.weak_batch = v[0];
      m.strong_batch = v.size() == 2 ? v[1] : 0;
    }
    const auto at = head.find('@');
    if (at != std::string::npos) {
      m.input = parse_input_shape(head.substr(at + 1));
      head = head.substr(0, at);
    }
    m.name = head;
    if (m.name.empty() || m.name.find_first_of(" \t") != std::string::npos)
      throw InputError("'" + item + "': a model's name is one word before ':'");
    for (const ModelSpec& o : out)
      if (o.name == m.name) throw InputError("model " + m.name + " named twice");
    if (is_layer_list(body)) {
      if (m.input.size() != 3) throw InputError("model " + m.name + ": a layer list needs the images' shape: " + m.name + "@C,H,W:" + body);
      m.list = layer_list_text(parse_layer_list(body));
    } else {
      if (!m.input.empty()) throw InputError("model " + m.name + ": @C,H,W belongs to layer lists; widths give their own input");
      m.layers = parse_layers(body);
    }
    try {
      (void)model_plan(m);  // every shape checked now, before anything is measured
    } catch (const std::exception& e) {
      throw InputError("model " + m.name + ": " + e.what());
    }
    out.push_back(m);
  }
  if (out.empty()) throw InputError("at least one model");
  return out;
}

Settings read_settings(MPI_Comm c, int argc, char** argv) {
  int rank = 0;
  MPI_Comm_rank(c, &rank);
  refuse_positionals(argc, argv);
  Settings s;
  s.models = {{"default", {784, 256, 128, 10}}, {"wide", {784, 4096, 4096, 4096, 10}}};
  for (int i = 0; i < argc; ++i) s.command += (i ? " " : "") + std::string(argv[i]);
  const std::string path = find_config_path(argc, argv);
  s.source = path.empty() ? "(built-in defaults)" : path;
  std::string text, err;
  if (rank == 0 && !path.empty()) {
    std::ifstream in(path);
    if (!in) err = "cannot read config file " + path;
    std::ostringstream os;
    os << in.rdbuf();
    text = os.str();
  }
  bcast_string(c, err);
  if (!err.empty()) throw InputError(err);
  bcast_string(c, text);

  std::string dptrain_text;
  Pending& p = pending();
  p = Pending{};
  split_ini(text, s.source, dptrain_text, p.file, p.cpu);
  // Our command-line keys come out; the rest is dptrain's (--train.lr 0.1 etc.).
  std::vector<const char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto dot = a.find('.');
    const bool ours = a == "--out" || (a.rfind("--", 0) == 0 && dot != std::string::npos && own_section(a.substr(2, dot - 2)));
    if (!ours) {
      rest.push_back(argv[i]);
      continue;
    }
    if (i + 1 >= argc) throw InputError("bench-scaling: " + a + " needs a value");
    p.cli.push_back({a == "--out" ? "report.out" : a.substr(2), argv[++i]});
  }
  Invocation inv = parse_invocation(int(rest.size()), rest.data(), path, dptrain_text, false);
  if (inv.version) {  // printed as the help text is
    s.help = version_line("bench-scaling");
    return s;
  }
  if (inv.help) {
    s.help = "Usage: bench-scaling --config FILE [--out DIR] [--section.key value ...]\n" + settings_help() +
             "\ndptrain's keys (sections [model] [data] [train] [comm] [device]):\n" + inv.help_text;
    return s;
  }
  s.base = inv.cfg;
  if (s.base.train_file.empty()) s.base.train_file = "data/fashion-mnist-train.h5";
  if (s.base.test_file.empty()) s.base.test_file = "data/fashion-mnist-test.h5";
  validate(s.base);
  apply(s, p.file, s.source);
  apply(s, p.cli, "command line");  // checked now; applied again after [cpu]
  s.grid_base = s.base;
  if (!s.grid_config.empty()) {
    // The grid's own dptrain file (e.g. a CNN's), with the same command-line overrides.
    std::string gtext, gerr;
    if (rank == 0) {
      std::ifstream in(s.grid_config);
      if (!in) gerr = "bench-scaling: grid.config = '" + s.grid_config + "': cannot read the file";
      std::ostringstream os;
      os << in.rdbuf();
      gtext = os.str();
    }
    bcast_string(c, gerr);
    if (!gerr.empty()) throw InputError(gerr);
    bcast_string(c, gtext);
    s.grid_base = parse_invocation(int(rest.size()), rest.data(), s.grid_config, gtext, false).cfg;
    if (s.grid_base.train_file.empty()) s.grid_base.train_file = s.base.train_file;
    if (s.grid_base.test_file.empty()) s.grid_base.test_file = s.base.test_file;
    validate(s.grid_base);
  }
  return s;
}

bool Settings::section(const std::string& name) const {
  return std::find(sections.begin(), sections.end(), name) != sections.end();
}

void finalize_settings(Settings& s, bool cpu_backend) {
  Pending& p = pending();
  if (cpu_backend) apply(s, p.cpu, s.source + " [cpu]");
  apply(s, p.cli, "command line");
  if (s.out_dir.empty()) s.out_dir = kDefaultOutDir;
  if (s.ar_max_bytes < s.ar_min_bytes)
    bad("allreduce.max_bytes", std::to_string(s.ar_max_bytes), s.source, "smaller than allreduce.min_bytes");
}

std::vector<Variant> variants_of(const Settings& s) {
  return s.variants.empty() ? std::vector<Variant>{variant_of(s.base)} : s.variants;
}

std::string settings_text(const Settings& s) {
  std::ostringstream os;
  auto list = [](auto& v) {
    std::ostringstream o;
    for (size_t i = 0; i < v.size(); ++i) o << (i ? "," : "") << v[i];
    return o.str();
  };
  os << "[scaling]\nmodels =";
  bool lists = false;
  for (auto& m : s.models) lists = lists || m.is_list();
  for (size_t i = 0; i < s.models.size(); ++i) os << (i && lists ? "; " : " ") << s.models[i].text();
  os << "\nweak_batch_per_rank = " << s.weak_batch_per_rank << "\nstrong_global_batch = " << s.strong_global_batch
     << "\nwarmup_steps = " << s.warmup_steps << "\ntimed_steps = " << s.timed_steps
     << "\ntimed_seconds = " << s.timed_seconds << "\nmin_timed_steps = " << s.min_timed_steps
     << "\nwarmup_seconds = " << s.warmup_seconds << "\nrepeats = " << s.repeats
     << "\ndata_iters = " << s.data_iters << "\nlatency_ms = " << s.latency_ms << "\nmax_ranks = " << s.max_ranks
     << "\nvariants =";
  for (auto& v : variants_of(s)) os << " " << v.name();
  os << "\n[allreduce]\ncollectives =";
  for (Collective c : s.collectives) os << " " << collective_name(c);
  os << "\nmin_bytes = " << s.ar_min_bytes << "\nmax_bytes = " << s.ar_max_bytes
     << "\nfactor = " << s.ar_factor << "\nwarmup = " << s.ar_warmup << "\niters = " << s.ar_iters
     << "\nrepeats = " << s.ar_repeats << "\n[buckets]\nsizes_mb = " << list(s.bucket_mb)
     << "\n[grid]\nenabled = " << (s.grid ? "true" : "false") << "\nconfig = " << s.grid_config
     << "\noptimizers =";
  for (auto& o : s.grid_optimizers) os << " " << o;
  os << "\nglobal_batches = " << list(s.grid_batches) << "\nlr_rules = " << list(s.grid_rules) << "\nwarmup =";
  for (int w : s.grid_warmup) os << (w ? " on" : " off");
  os << "\nepochs = " << s.grid_epochs << "\nmin_steps = " << s.grid_min_steps
     << "\nmax_batch_per_rank = " << s.grid_max_batch_per_rank << "\nwarmup_epochs = " << s.warmup_epochs
     << "\nwarmup_min_steps = " << s.grid_warmup_min_steps
     << "\ntarget_accuracy = " << s.target_accuracy << "\nevals_per_run = " << s.grid_evals
     << "\ncheck = " << (s.grid_check ? "true" : "false")
     << "\n[predict]\nmax_ranks = " << s.predict_max_ranks << "\n[ddp]\nrun = " << s.ddp_run
     << "\npython = " << s.ddp_python << "\ntorchrun_args = " << s.ddp_torchrun_args << "\nscript = " << s.ddp_script << "\nbuckets_mb = " << list(s.ddp_buckets_mb)
     << "\ncompile = " << s.ddp_compile << "\nwarmup = " << s.ddp_warmup << "\nsteps = " << s.ddp_steps
     << "\nrepeats = " << s.ddp_repeats << "\ntimeout_s = " << s.ddp_timeout_s << "\n[report]\nout = " << s.out_dir
     << "\nsections = " << list(s.sections) << "\nplots = " << (s.plots ? "true" : "false") << "\n";
  return os.str();
}

std::string settings_help() {
  std::ostringstream os;
  os << "bench-scaling sweep keys (INI sections, or --section.key value; [cpu] section.key = value\n"
        "overrides apply on the CPU backend; --out DIR is report.out):\n";
  for (auto& k : key_table()) os << "  --" << k.name << "  " << k.help << "\n";
  return os.str();
}

}  // namespace dpt::scaling
