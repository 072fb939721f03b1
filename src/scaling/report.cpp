// bench-scaling's report: the fixed-width table (nccl-tests style, with a units row), the CSV
// escaping, the machine it ran on, and the findings in sentences. The records (JSON), the
// Markdown page and the plots are records.cpp's.
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <hdf5.h>
#include <map>
#include <set>
#include <sstream>

#include "dpt/scaling.hpp"
#include "dpt/check.hpp"

namespace dpt::scaling {
namespace fs = std::filesystem;

Cell num(double v) {
  Cell c;
  c.is_num = true;
  c.empty = !std::isfinite(v);
  c.num = v;
  return c;
}
Cell txt(const std::string& s) {
  Cell c;
  c.empty = false;
  c.text = s;
  return c;
}
Cell none() { return Cell{}; }

const Cell* Table::at(size_t row, const std::string& key) const {
  static const Cell blank;
  for (size_t j = 0; j < cols.size(); ++j)
    if (cols[j].key == key) return j < rows[row].size() ? &rows[row][j] : &blank;
  return &blank;
}

namespace {

std::string shown(const Cell& c, const Column& col) {
  if (c.empty) return "-";
  if (!c.is_num) return c.text;
  char buf[64];
  std::snprintf(buf, sizeof buf, col.fmt.empty() ? "%.6g" : col.fmt.c_str(), c.num);
  return buf;
}

std::string raw(const Cell& c) {
  if (c.empty) return "";
  if (!c.is_num) return c.text;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", c.num);
  return buf;
}

}  // namespace

std::string format_table(const Table& t) {
  std::vector<size_t> w(t.cols.size());
  for (size_t j = 0; j < t.cols.size(); ++j) {
    w[j] = std::max(t.cols[j].head.size(), t.cols[j].unit.empty() ? 0 : t.cols[j].unit.size() + 2);
    for (auto& r : t.rows) w[j] = std::max(w[j], shown(r[j], t.cols[j]).size());
  }
  std::ostringstream os;
  auto line = [&](auto get) {
    std::string s = "#";
    for (size_t j = 0; j < t.cols.size(); ++j) {
      const std::string v = get(j);
      const bool left = t.cols[j].fmt.empty();
      s += "  " + (left ? v + std::string(w[j] - v.size(), ' ') : std::string(w[j] - v.size(), ' ') + v);
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    os << s << "\n";
  };
  os << "# " << t.title << "\n";
  line([&](size_t j) { return t.cols[j].head; });
  line([&](size_t j) { return t.cols[j].unit.empty() ? std::string() : "(" + t.cols[j].unit + ")"; });
  for (auto& r : t.rows) {
    std::string s = " ";
    for (size_t j = 0; j < t.cols.size(); ++j) {
      const std::string v = shown(r[j], t.cols[j]);
      s += "  " + (t.cols[j].fmt.empty() ? v + std::string(w[j] - v.size(), ' ') : std::string(w[j] - v.size(), ' ') + v);
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    os << s << "\n";
  }
  if (t.rows.empty()) os << "   (no rows)\n";
  for (auto& n : t.notes) os << "#   " << n << "\n";
  return os.str();
}

std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

// ---------------------------------------------------------------------------------------------
// The machine.

namespace {

std::string run_cmd(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>/dev/null").c_str(), "r");
  if (!p) return "";
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) out += buf;
  const int rc = pclose(p);
  if (rc != 0) return "";
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string first_line_with(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l.find(key) != std::string::npos) {
      auto c = l.find(':');
      return c == std::string::npos ? l : l.substr(l.find_first_not_of(" \t", c + 1));
    }
  return "";
}

}  // namespace

std::string load_average() {
  std::ifstream la("/proc/loadavg");
  std::string load;
  std::getline(la, load);
  return load;
}

Machine describe_machine(const Context& cx, const std::string& comm_describe) {
  Machine m;
  auto add = [&](const std::string& k, const std::string& v) { m.facts.push_back({k, v.empty() ? "-" : v}); };
  // Every rank's device line, so a mixed job shows.
  std::vector<std::string> devices;
  std::string mine = cx.be->describe();
  for (int r = 0; r < cx.size; ++r) {
    std::string s = mine;
    bcast_string(cx.world, s, r);
    devices.push_back(s);
  }
  if (cx.rank != 0) return m;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  utsname u{};
  uname(&u);
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  const std::string lscpu = run_cmd("lscpu");
  add("date", date);
  add("host", host);
  add("kernel", std::string(u.sysname) + " " + u.release + " " + u.machine);
  add("cpu", first_line_with(lscpu, "Model name"));
  add("cpu cores (online)", std::to_string(sysconf(_SC_NPROCESSORS_ONLN)));
  add("ranks (world)", std::to_string(cx.size));
  add("backend", cx.backend_name);
  add("transport", comm_describe);
  add("math mode", cx.s->base.precision);
  std::set<std::string> seen;
  for (int r = 0; r < cx.size; ++r)
    if (seen.insert(devices[size_t(r)]).second) add("device (rank " + std::to_string(r) + ")", devices[size_t(r)]);
  const std::string gpus = run_cmd("nvidia-smi -L");
  add("GPUs", gpus.empty() ? "no GPU (nvidia-smi absent or found none)" : gpus);
  add("GPU topology", gpus.empty() ? "no GPU" : run_cmd("nvidia-smi topo -m"));
  add("driver / CUDA", gpus.empty() ? "no GPU" : first_line_with(run_cmd("nvidia-smi"), "CUDA Version"));
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(v, &len);
  std::string mpi(v, size_t(len));
  add("MPI", mpi.substr(0, mpi.find_first_of("\n,")));
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  add("HDF5", std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel));
  add("git commit", run_cmd("git rev-parse --short HEAD") + (run_cmd("git status --porcelain").empty() ? "" : " (with local changes)"));
  add("load average at start", load_average());
  return m;
}

// ---------------------------------------------------------------------------------------------
// Findings.

namespace {
const Table* find(const Report& r, const std::string& name);
std::string f3(const char* fmt, double v) {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}
}  // namespace

std::vector<std::string> findings(const Report& r) {
  std::vector<std::string> out;
  if (const Table* sc = find(r, "scaling")) {
    std::map<std::string, size_t> top;  // model/mode/variant -> row of the largest n
    for (size_t i = 0; i < sc->rows.size(); ++i) {
      const std::string k = sc->at(i, "model")->text + " " + sc->at(i, "mode")->text + " " + sc->at(i, "variant")->text;
      if (!top.count(k) || sc->at(i, "ranks")->num > sc->at(top[k], "ranks")->num) top[k] = i;
    }
    for (auto& [k, i] : top)
      if (sc->at(i, "ranks")->num > 1)
        out.push_back(k + " scaling at " + raw(*sc->at(i, "ranks")) + " ranks: efficiency " +
                      f3("%.2f", sc->at(i, "efficiency")->num) + " (" + f3("%.2f", sc->at(i, "efficiency_vs_best1")->num) +
                      " against the fastest 1-rank variant), " + f3("%.0f", sc->at(i, "samples_per_s")->num) +
                      " samples/s; limiting factor: " + sc->at(i, "limit")->text + "; exposed communication " +
                      f3("%.3f", sc->at(i, "exposed_comm_ms")->num) + " ms, " + f3("%.0f", sc->at(i, "exposed_comm_pct")->num) +
                      "% of the step.");
  }
  if (const Table* p = find(r, "ddp_peer"))
    for (size_t i = 0; i < p->rows.size(); ++i)
      if (p->at(i, "strongest")->text == "*" && !p->at(i, "ratio")->empty)
        out.push_back("PyTorch, " + p->at(i, "model")->text + " " + p->at(i, "mode")->text + " on " + raw(*p->at(i, "ranks")) +
                      " rank(s): strongest " + p->at(i, "peer")->text + " " + f3("%.3f", p->at(i, "peer_step_ms")->num) +
                      " ms per step (efficiency " + f3("%.2f", p->at(i, "peer_efficiency")->num) + "); dptrain " +
                      p->at(i, "ours_variant")->text + " " + f3("%.3f", p->at(i, "ours_step_ms")->num) + " ms (efficiency " +
                      f3("%.2f", p->at(i, "ours_efficiency")->num) + "): " + f3("%.3f", p->at(i, "ratio")->num) +
                      "x PyTorch's step.");
  for (const char* name : {"allreduce", "reduce_scatter", "all_gather"}) {
    const Table* ar = find(r, name);
    if (!ar || ar->rows.empty()) continue;
    size_t best = 0;
    double wrong = 0;
    for (size_t i = 0; i < ar->rows.size(); ++i) {
      wrong += ar->at(i, "wrong")->num;
      if (ar->at(i, "busbw_gbs")->num > ar->at(best, "busbw_gbs")->num) best = i;
    }
    out.push_back(std::string(name) + ": peak busbw " + f3("%.2f", ar->at(best, "busbw_gbs")->num) + " GB/s at " +
                  f3("%.0f", ar->at(best, "bytes")->num) + " B on " + raw(*ar->at(best, "ranks")) + " ranks; " +
                  f3("%.0f", wrong) + " wrong elements in all.");
  }
  if (const Table* bk = find(r, "buckets"))
    for (size_t i = 0; i < bk->rows.size(); ++i)
      if (bk->at(i, "best")->text == "*")
        out.push_back("best bucket for " + bk->at(i, "model")->text + " on " + raw(*bk->at(i, "ranks")) + " ranks: " +
                      raw(*bk->at(i, "bucket_mb")) + " MB (" + raw(*bk->at(i, "buckets")) + " allreduce(s) per step).");
  if (const Table* g = find(r, "grid"); g && !g->rows.empty()) {
    size_t acc = 0, fast = g->rows.size();
    for (size_t i = 0; i < g->rows.size(); ++i) {
      if (g->at(i, "final_accuracy")->num > g->at(acc, "final_accuracy")->num) acc = i;
      if (!g->at(i, "time_to_target_s")->empty &&
          (fast == g->rows.size() || g->at(i, "time_to_target_s")->num < g->at(fast, "time_to_target_s")->num))
        fast = i;
    }
    auto name = [&](size_t i) { return g->at(i, "variant")->text + " at global batch " + raw(*g->at(i, "global_batch")); };
    out.push_back("grid: best final accuracy " + f3("%.4f", g->at(acc, "final_accuracy")->num) + " with " + name(acc) + ".");
    if (fast < g->rows.size())
      out.push_back("grid: fastest to the target accuracy on one rank: " + name(fast) + ", " +
                    f3("%.2f", g->at(fast, "time_to_target_s")->num) + " s of training.");
  }
  if (const Table* c = find(r, "critical"))
    for (size_t i = 0; i < c->rows.size(); ++i)
      if (!c->at(i, "largest_batch_2x")->empty)
        out.push_back("critical batch: " + c->at(i, "variant")->text + " reaches the target within 2x the epochs of "
                      "global batch " + raw(*c->at(i, "smallest_batch")) + " up to global batch " +
                      raw(*c->at(i, "largest_batch_2x")) + " (" + f3("%.2f", c->at(i, "epochs_at_smallest")->num) +
                      " -> " + f3("%.2f", c->at(i, "epochs_at_largest")->num) + " epochs).");
  if (const Table* t = find(r, "tta"))
    for (size_t i = 0; i < t->rows.size(); ++i)
      if (t->at(i, "best")->text == "*")
        out.push_back("time to target on " + raw(*t->at(i, "ranks")) + " rank(s): fastest with " + t->at(i, "variant")->text +
                      " at global batch " + raw(*t->at(i, "global_batch")) + ", " + f3("%.3f", t->at(i, "predicted_s")->num) +
                      " s predicted (" + t->at(i, "step_source")->text + " step)" +
                      (t->at(i, "speedup")->empty ? "" : ", " + f3("%.2f", t->at(i, "speedup")->num) + "x its 1-rank time") +
                      (t->at(i, "measured_s")->empty ? "" : "; measured " + f3("%.3f", t->at(i, "measured_s")->num) + " s") + ".");
  if (const Table* c = find(r, "check"))
    for (size_t i = 0; i < c->rows.size(); ++i)
      out.push_back("check on " + raw(*c->at(i, "ranks")) + " rank(s), " + c->at(i, "variant")->text + " at global batch " +
                    raw(*c->at(i, "global_batch")) + ": time to target " +
                    (c->at(i, "measured_s")->empty ? c->at(i, "status")->text
                                                   : f3("%.3f", c->at(i, "measured_s")->num) + " s measured vs " +
                                                         f3("%.3f", c->at(i, "predicted_s")->num) + " s predicted (" +
                                                         f3("%+.1f", c->at(i, "error_pct")->num) + "%)") + ".");
  return out;
}

namespace {

const Table* find(const Report& r, const std::string& name) {
  for (auto& t : r.tables)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace

}  // namespace dpt::scaling
