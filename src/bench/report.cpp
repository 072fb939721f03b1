// bench-scaling's report: the fixed-width table (nccl-tests style, with a units row), CSV and
// JSON records, the machine it ran on, and the Markdown page with its SVG plots.
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

#include "dpt/bench.hpp"
#include "dpt/check.hpp"

namespace dpt::bench {
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

std::string json_escape(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += char(c);
    else if (c == '\n') o += "\\n";
    else if (c == '\t') o += "\\t";
    else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else o += char(c);
  }
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
// SVG line chart.

namespace {

std::string esc_xml(const std::string& s) {
  std::string o;
  for (char c : s) o += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
  return o;
}

// 1, 2, 5 × 10^k steps covering [lo, hi] with about `want` ticks.
std::vector<double> nice_ticks(double lo, double hi, int want) {
  if (!(hi > lo)) hi = lo + 1;
  const double raw = (hi - lo) / want, mag = std::pow(10, std::floor(std::log10(raw)));
  const double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + 1e-9 * step; v += step) t.push_back(std::fabs(v) < 1e-12 * step ? 0 : v);
  return t;
}

std::string label(double v) {
  char b[32];
  const double a = std::fabs(v);
  if (a >= 1e9) std::snprintf(b, sizeof b, "%gG", v / 1e9);
  else if (a >= 1e6) std::snprintf(b, sizeof b, "%gM", v / 1e6);
  else if (a >= 1e4) std::snprintf(b, sizeof b, "%gk", v / 1e3);
  else std::snprintf(b, sizeof b, "%g", v);
  return b;
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

}  // namespace

std::string svg_chart(const Chart& c) {
  const double W = 720, H = 420, L = 80, R = 200, T = 40, B = 60;
  double x0 = INFINITY, x1 = -INFINITY, y0 = 0, y1 = -INFINITY;
  for (auto& s : c.series)
    for (auto [x, y] : s.pts) {
      if (!std::isfinite(x) || !std::isfinite(y) || (c.logx && x <= 0)) continue;
      const double xv = c.logx ? std::log2(x) : x;
      x0 = std::min(x0, xv), x1 = std::max(x1, xv), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << esc_xml(c.title) << "</text>\n";
  if (!std::isfinite(x0)) {
    o << "<text x=\"" << W / 2 << "\" y=\"" << H / 2 << "\" text-anchor=\"middle\">no data</text>\n</svg>\n";
    return o.str();
  }
  if (x1 == x0) x0 -= 1, x1 += 1;
  const std::vector<double> yt = nice_ticks(y0, y1 * 1.05, 6);
  y1 = std::max(y1, yt.back());
  y0 = std::min(y0, yt.front());
  auto px = [&](double x) { return L + (W - L - R) * ((c.logx ? std::log2(x) : x) - x0) / (x1 - x0); };
  auto py = [&](double y) { return H - B - (H - T - B) * (y - y0) / (y1 - y0); };
  o << "<g stroke=\"#ddd\">\n";
  for (double y : yt) o << "<line x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << py(y) << "\" y2=\"" << py(y) << "\"/>\n";
  o << "</g>\n<g text-anchor=\"end\">\n";
  for (double y : yt) o << "<text x=\"" << L - 6 << "\" y=\"" << py(y) + 4 << "\">" << label(y) << "</text>\n";
  o << "</g>\n<g text-anchor=\"middle\">\n";
  std::vector<double> xt;
  if (c.logx) {
    const int step = std::max(1, int(std::ceil((x1 - x0) / 10)));
    for (int e = int(std::ceil(x0)); e <= int(std::floor(x1)); e += step) xt.push_back(std::ldexp(1.0, e));
  } else {
    xt = nice_ticks(x0, x1, 8);
  }
  for (double x : xt)
    o << "<line x1=\"" << px(x) << "\" x2=\"" << px(x) << "\" y1=\"" << H - B << "\" y2=\"" << H - B + 5 << "\" stroke=\"black\"/>"
      << "<text x=\"" << px(x) << "\" y=\"" << H - B + 18 << "\">" << label(x) << "</text>\n";
  o << "</g>\n<path d=\"M" << L << " " << T << " V" << H - B << " H" << W - R << "\" fill=\"none\" stroke=\"black\"/>\n"
    << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 15 << "\" text-anchor=\"middle\">" << esc_xml(c.xlabel) << "</text>\n"
    << "<text transform=\"translate(18," << (T + H - B) / 2 << ") rotate(-90)\" text-anchor=\"middle\">" << esc_xml(c.ylabel) << "</text>\n";
  for (size_t i = 0; i < c.series.size(); ++i) {
    const Series& s = c.series[i];
    const char* col = kColors[i % 10];
    std::string d;
    for (auto [x, y] : s.pts) {
      if (!std::isfinite(x) || !std::isfinite(y) || (c.logx && x <= 0)) continue;
      char b[64];
      std::snprintf(b, sizeof b, "%s%.1f %.1f", d.empty() ? "M" : " L", px(x), py(y));
      d += b;
      o << "<circle cx=\"" << px(x) << "\" cy=\"" << py(y) << "\" r=\"3\" fill=\"" << col << "\"/>\n";
    }
    o << "<path d=\"" << d << "\" fill=\"none\" stroke=\"" << col << "\" stroke-width=\"2\""
      << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << "/>\n";
    const double ly = T + 10 + 18 * double(i);
    o << "<line x1=\"" << W - R + 12 << "\" x2=\"" << W - R + 36 << "\" y1=\"" << ly << "\" y2=\"" << ly << "\" stroke=\"" << col
      << "\" stroke-width=\"2\"" << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << "/><text x=\"" << W - R + 42 << "\" y=\""
      << ly + 4 << "\">" << esc_xml(s.name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
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
    auto name = [&](size_t i) {
      return "global batch " + raw(*g->at(i, "global_batch")) + ", lr rule " + g->at(i, "lr_scaling")->text +
             ", warm-up " + g->at(i, "warmup")->text;
    };
    out.push_back("grid: best final accuracy " + f3("%.4f", g->at(acc, "final_accuracy")->num) + " with " + name(acc) + ".");
    if (fast < g->rows.size())
      out.push_back("grid: fastest to the target accuracy: " + name(fast) + ", " +
                    f3("%.2f", g->at(fast, "time_to_target_s")->num) + " s of training.");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The files.

namespace {

const Table* find(const Report& r, const std::string& name) {
  for (auto& t : r.tables)
    if (t.name == name) return &t;
  return nullptr;
}

// One series per distinct value of `group` (rows filtered by `keep`), x and y from columns.
std::vector<Series> series_by(const Table& t, const std::string& group, const std::string& x, const std::string& y,
                              const std::function<bool(size_t)>& keep = {}, const std::string& prefix = "") {
  std::map<std::string, Series> by;
  std::vector<std::string> order;
  for (size_t i = 0; i < t.rows.size(); ++i) {
    if (keep && !keep(i)) continue;
    const Cell* gc = t.at(i, group);
    const std::string g = gc->is_num ? raw(*gc) : gc->text;
    if (!by.count(g)) order.push_back(g), by[g].name = prefix + g;
    by[g].pts.push_back({t.at(i, x)->num, t.at(i, y)->num});
  }
  std::vector<Series> out;
  for (auto& g : order) out.push_back(by[g]);
  return out;
}

std::vector<std::pair<std::string, Chart>> charts(const Report& r) {
  std::vector<std::pair<std::string, Chart>> out;
  if (const Table* sc = find(r, "scaling"); sc && !sc->rows.empty()) {
    Chart c{"Scaling efficiency vs ranks", "ranks", "efficiency = thr(n) / (n x thr(1))", true, {}};
    for (const char* mode : {"weak", "strong"}) {
      auto s = series_by(*sc, "model", "ranks", "efficiency", [&](size_t i) { return sc->at(i, "mode")->text == mode; },
                         std::string(mode) + " ");
      c.series.insert(c.series.end(), s.begin(), s.end());
    }
    if (const Table* p = find(r, "predict"); p && !p->rows.empty()) {
      auto s = series_by(*p, "model", "ranks", "predicted_eff", {}, "predicted weak ");
      for (auto& x : s) x.dashed = true;
      c.series.insert(c.series.end(), s.begin(), s.end());
    }
    out.push_back({"efficiency-vs-ranks.svg", c});
    Chart t{"Throughput vs ranks", "ranks", "samples/s", true, {}};
    for (const char* mode : {"weak", "strong"}) {
      auto s = series_by(*sc, "model", "ranks", "samples_per_s",
                         [&](size_t i) { return sc->at(i, "mode")->text == mode; }, std::string(mode) + " ");
      t.series.insert(t.series.end(), s.begin(), s.end());
    }
    out.push_back({"throughput-vs-ranks.svg", t});
  }
  if (const Table* g = find(r, "grid"); g && !g->rows.empty()) {
    auto group = [&](size_t i) { return g->at(i, "lr_scaling")->text + (g->at(i, "warmup")->text == "on" ? " + warm-up" : ""); };
    Chart a{"Final test accuracy vs global batch, per LR rule", "global batch (samples)", "test accuracy", true, {}};
    std::map<std::string, Series> by;
    std::vector<std::string> order;
    for (size_t i = 0; i < g->rows.size(); ++i) {
      const std::string k = group(i);
      if (!by.count(k)) order.push_back(k), by[k].name = k, by[k].dashed = g->at(i, "warmup")->text == "on";
      by[k].pts.push_back({g->at(i, "global_batch")->num, g->at(i, "final_accuracy")->num});
    }
    for (auto& k : order) a.series.push_back(by[k]);
    out.push_back({"accuracy-vs-batch.svg", a});
    Chart t{"Training throughput vs global batch", "global batch (samples)", "samples/s", true, {}};
    t.series = series_by(*g, "lr_scaling", "global_batch", "samples_per_s",
                         [&](size_t i) { return g->at(i, "warmup")->text == "off"; }, "lr rule ");
    out.push_back({"throughput-vs-batch.svg", t});
  }
  if (const Table* ar = find(r, "allreduce"); ar && !ar->rows.empty()) {
    Chart c{"Allreduce bus bandwidth vs message size", "message size (bytes)", "busbw (GB/s)", true, {}};
    c.series = series_by(*ar, "ranks", "bytes", "busbw_gbs", {}, "ranks ");
    out.push_back({"busbw-vs-size.svg", c});
  }
  if (const Table* b = find(r, "buckets"); b && !b->rows.empty()) {
    Chart c{"Step time vs gradient bucket size", "bucket size (MB)", "step (ms)", true, {}};
    std::map<std::string, Series> by;
    std::vector<std::string> order;
    for (size_t i = 0; i < b->rows.size(); ++i) {
      const std::string k = b->at(i, "model")->text + ", " + raw(*b->at(i, "ranks")) + " ranks";
      if (!by.count(k)) order.push_back(k), by[k].name = k;
      by[k].pts.push_back({b->at(i, "bucket_mb")->num, b->at(i, "step_ms")->num});
    }
    for (auto& k : order) c.series.push_back(by[k]);
    out.push_back({"step-vs-bucket.svg", c});
  }
  return out;
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream f(p);
  f << text;
  if (!f) throw Error("bench-scaling: cannot write " + p.string());
}

std::string csv_of(const Report& r) {
  // One file for every table: the union of their columns, `table` first, empty where a column
  // is not the row's table's.
  std::vector<std::string> keys{"table"};
  for (auto& t : r.tables)
    for (auto& c : t.cols)
      if (std::find(keys.begin(), keys.end(), c.key) == keys.end()) keys.push_back(c.key);
  std::ostringstream o;
  for (size_t k = 0; k < keys.size(); ++k) o << (k ? "," : "") << keys[k];
  o << "\n";
  for (auto& t : r.tables)
    for (size_t i = 0; i < t.rows.size(); ++i) {
      o << t.name;
      for (size_t k = 1; k < keys.size(); ++k) {
        bool has = false;
        for (auto& c : t.cols) has = has || c.key == keys[k];
        o << "," << (has ? csv_escape(raw(*t.at(i, keys[k]))) : "");
      }
      o << "\n";
    }
  return o.str();
}

std::string json_of(const Report& r, const Settings& s) {
  std::ostringstream o;
  o << "{\n  \"bench\": \"scaling\",\n  \"command\": " << json_escape(s.command) << ",\n  \"config\": " << json_escape(s.source)
    << ",\n  \"seconds\": " << r.seconds << ",\n  \"machine\": {";
  for (size_t i = 0; i < r.machine.facts.size(); ++i)
    o << (i ? "," : "") << "\n    " << json_escape(r.machine.facts[i].first) << ": " << json_escape(r.machine.facts[i].second);
  o << "\n  },\n  \"settings\": " << json_escape(r.settings) << ",\n  \"notes\": [";
  for (size_t i = 0; i < r.notes.size(); ++i) o << (i ? ", " : "") << json_escape(r.notes[i]);
  o << "],\n  \"findings\": [";
  for (size_t i = 0; i < r.findings.size(); ++i) o << (i ? ", " : "") << json_escape(r.findings[i]);
  o << "],\n  \"tables\": {";
  for (size_t ti = 0; ti < r.tables.size(); ++ti) {
    const Table& t = r.tables[ti];
    o << (ti ? "," : "") << "\n    " << json_escape(t.name) << ": {\"title\": " << json_escape(t.title) << ", \"units\": {";
    for (size_t j = 0; j < t.cols.size(); ++j) o << (j ? ", " : "") << json_escape(t.cols[j].key) << ": " << json_escape(t.cols[j].unit);
    o << "}, \"rows\": [";
    for (size_t i = 0; i < t.rows.size(); ++i) {
      o << (i ? "," : "") << "\n      {";
      for (size_t j = 0; j < t.cols.size(); ++j) {
        const Cell& c = t.rows[i][j];
        o << (j ? ", " : "") << json_escape(t.cols[j].key) << ": " << (c.empty ? "null" : c.is_num ? raw(c) : json_escape(c.text));
      }
      o << "}";
    }
    o << "]}";
  }
  o << "\n  }\n}\n";
  return o.str();
}

std::string md_of(const Report& r, const Settings& s, const std::vector<std::pair<std::string, Chart>>& ch) {
  std::ostringstream o;
  std::string backend;
  for (auto& [k, v] : r.machine.facts)
    if (k == "backend") backend = v;
  o << "# bench-scaling report\n\n";
  if (backend == "cpu")
    o << "> **CPU ranks**: these figures come from the CPU backend (OpenBLAS) over MPI, not from GPUs. "
         "Ranks stand in for GPUs: each rank owns a share of the cores and ranks outside a subset sleep.\n\n";
  // A busy machine: other processes took the cores the ranks were timed on.
  double load = 0, cores = 0;
  for (auto& [k, v] : r.machine.facts) {
    if (k.rfind("load average", 0) == 0) load = std::max(load, std::atof(v.c_str()));
    if (k == "cpu cores (online)") cores = std::atof(v.c_str());
  }
  if (cores > 0 && load > cores)
    o << "> **Busy machine**: the 1-minute load average reached " << load << " on " << cores
      << " cores while this ran, so other processes competed with the ranks; exposed communication "
         "then includes waiting for a descheduled peer. Compare these figures only with runs on a quiet machine.\n\n";
  o << "Command: `" << s.command << "` (config " << s.source << "), " << std::lround(r.seconds) << " s in all.\n\n";
  if (!r.findings.empty()) {
    o << "## Findings\n\n";
    for (auto& f : r.findings) o << "- " << f << "\n";
    o << "\n";
  }
  o << "## Machine\n\n| | |\n|---|---|\n";
  for (auto& [k, v] : r.machine.facts) {
    if (v.find('\n') != std::string::npos) continue;
    o << "| " << k << " | " << v << " |\n";
  }
  for (auto& [k, v] : r.machine.facts)
    if (v.find('\n') != std::string::npos) o << "\n" << k << ":\n\n```\n" << v << "\n```\n";
  o << "\n## Plots\n\n";
  for (auto& [file, c] : ch) o << "![" << c.title << "](" << file << ")\n\n";
  for (auto& t : r.tables) o << "## " << t.title << "\n\n```\n" << format_table(t) << "```\n\n";
  if (!r.notes.empty()) {
    o << "## Notes\n\n";
    for (auto& n : r.notes) o << "- " << n << "\n";
    o << "\n";
  }
  o << "## Settings\n\n```ini\n" << r.settings << "```\n\nRecords: `records.csv` (one row per table row, column `table` says which), "
       "`records.json` (the same, with units, machine and settings).\n";
  return o.str();
}

}  // namespace

std::vector<std::string> write_report(const Settings& s, const Report& r) {
  const fs::path dir(s.out_dir);
  fs::create_directories(dir);
  std::vector<std::string> files;
  const auto ch = charts(r);
  for (auto& [file, c] : ch) {
    write_file(dir / file, svg_chart(c));
    files.push_back((dir / file).string());
  }
  write_file(dir / "records.csv", csv_of(r));
  write_file(dir / "records.json", json_of(r, s));
  write_file(dir / "report.md", md_of(r, s, ch));
  for (const char* f : {"records.csv", "records.json", "report.md"}) files.push_back((dir / f).string());
  return files;
}

}  // namespace dpt::bench
