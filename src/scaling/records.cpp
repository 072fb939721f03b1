// bench-scaling's files: records.json written with nlohmann-json and read back to build
// report.md (so the page shows exactly what the records hold), records.csv, and the plots,
// drawn from records.json by bench/plot_scaling.py (matplotlib) when python3 has it.
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dpt/scaling.hpp"
#include "dpt/check.hpp"
#include "dpt/log.hpp"

namespace dpt::scaling {
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;  // keeps the tables' and the machine's order

std::string records_json(const Settings& s, const Report& r) {
  ojson j;
  j["bench"] = "scaling";
  j["command"] = s.command;
  j["config"] = s.source;
  j["seconds"] = r.seconds;
  j["status"] = r.status.empty() ? "complete" : r.status;
  j["machine"] = ojson::object();
  for (auto& [k, v] : r.machine.facts) j["machine"][k] = v;
  j["settings"] = r.settings;
  j["notes"] = r.notes;
  j["findings"] = r.findings;
  j["tables"] = ojson::object();
  for (const Table& t : r.tables) {
    ojson tj;
    tj["title"] = t.title;
    tj["units"] = ojson::object();
    tj["columns"] = ojson::array();
    for (const Column& c : t.cols) {
      tj["units"][c.key] = c.unit;
      tj["columns"].push_back({{"key", c.key}, {"head", c.head}, {"unit", c.unit}, {"fmt", c.fmt}});
    }
    tj["notes"] = t.notes;
    tj["rows"] = ojson::array();
    for (const auto& row : t.rows) {
      ojson rj = ojson::object();
      for (size_t k = 0; k < t.cols.size(); ++k) {
        const Cell& c = k < row.size() ? row[k] : Cell{};
        if (c.empty) rj[t.cols[k].key] = nullptr;
        else if (c.is_num) rj[t.cols[k].key] = c.num;
        else rj[t.cols[k].key] = c.text;
      }
      tj["rows"].push_back(std::move(rj));
    }
    j["tables"][t.name] = std::move(tj);
  }
  return j.dump(2) + "\n";
}

Report report_from_json(const std::string& text, std::string& command, std::string& config) {
  const ojson j = ojson::parse(text);
  Report r;
  command = j.at("command").get<std::string>();
  config = j.at("config").get<std::string>();
  r.seconds = j.at("seconds").get<double>();
  r.status = j.value("status", std::string("complete"));  // records from before the field: complete
  if (r.status == "complete") r.status.clear();
  for (auto& [k, v] : j.at("machine").items()) r.machine.facts.push_back({k, v.get<std::string>()});
  r.settings = j.at("settings").get<std::string>();
  r.notes = j.at("notes").get<std::vector<std::string>>();
  r.findings = j.at("findings").get<std::vector<std::string>>();
  for (auto& [name, tj] : j.at("tables").items()) {
    Table t{name, tj.at("title").get<std::string>(), {}, {}, tj.at("notes").get<std::vector<std::string>>()};
    for (auto& c : tj.at("columns"))
      t.cols.push_back({c.at("key").get<std::string>(), c.at("head").get<std::string>(), c.at("unit").get<std::string>(),
                        c.at("fmt").get<std::string>()});
    for (auto& rj : tj.at("rows")) {
      std::vector<Cell> row;
      for (const Column& c : t.cols) {
        const ojson& v = rj.at(c.key);
        row.push_back(v.is_null() ? none() : v.is_number() ? num(v.get<double>()) : txt(v.get<std::string>()));
      }
      t.rows.push_back(std::move(row));
    }
    r.tables.push_back(std::move(t));
  }
  return r;
}

std::vector<std::pair<std::string, std::string>> plot_list(const Report& r) {
  auto has = [&](const char* name) {
    for (auto& t : r.tables)
      if (t.name == name) return !t.rows.empty();
    return false;
  };
  std::vector<std::pair<std::string, std::string>> out;
  if (has("scaling")) {
    out.push_back({"efficiency-vs-ranks.svg", "Scaling efficiency vs ranks"});
    out.push_back({"throughput-vs-ranks.svg", "Throughput vs ranks"});
  }
  if (has("grid")) {
    out.push_back({"epochs-to-target-vs-batch.svg", "Epochs to the target accuracy vs global batch"});
    out.push_back({"accuracy-vs-batch.svg", "Final test accuracy vs global batch, per variant"});
    out.push_back({"throughput-vs-batch.svg", "Training throughput vs global batch"});
  }
  if (has("tta")) {
    out.push_back({"time-to-target-vs-ranks.svg", "Time to the target accuracy vs ranks (GPUs)"});
    out.push_back({"tta-speedup-vs-ranks.svg", "Time-to-target speed-up vs ranks (GPUs)"});
  }
  if (has("allreduce")) out.push_back({"busbw-vs-size.svg", "Allreduce bus bandwidth vs message size"});
  if (has("buckets")) out.push_back({"step-vs-bucket.svg", "Step time vs gradient bucket size"});
  return out;
}

namespace {

// Whole or not at all (a temporary file renamed over it): a run killed while writing its report
// leaves the previous one.
void write_file(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream f(tmp);
    f << text;
    f.flush();
    if (!f) throw Error("bench-scaling: cannot write " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, p, ec);
  if (ec) throw Error("bench-scaling: cannot rename " + tmp.string() + " to " + p.string() + ": " + ec.message());
}

std::string raw(const Cell& c) {
  if (c.empty) return "";
  if (!c.is_num) return c.text;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", c.num);
  return buf;
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

std::string md_of(const Report& r, const std::string& command, const std::string& config, const std::string& plots_note) {
  std::ostringstream o;
  std::string backend;
  for (auto& [k, v] : r.machine.facts)
    if (k == "backend") backend = v;
  o << "# bench-scaling report\n\n";
  if (!r.status.empty()) o << "> **Incomplete**: " << r.status << "\n\n";
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
  o << "Command: `" << command << "` (config " << config << "), " << std::lround(r.seconds) << " s in all.\n\n";
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
  if (!plots_note.empty()) o << "> " << plots_note << "\n\n";
  for (auto& [file, title] : plot_list(r)) o << "![" << title << "](" << file << ")\n\n";
  for (auto& t : r.tables) o << "## " << t.title << "\n\n```\n" << format_table(t) << "```\n\n";
  if (!r.notes.empty()) {
    o << "## Notes\n\n";
    for (auto& n : r.notes) o << "- " << n << "\n";
    o << "\n";
  }
  o << "## Settings\n\n```ini\n" << r.settings << "```\n\nRecords: `records.json` (every table with its columns, "
       "units and notes, the machine, the settings; the plots and this page are drawn from it), `records.csv` "
       "(one row per table row, column `table` says which).\n";
  return o.str();
}

// bench/plot_scaling.py: in the working folder's bench/, or in the bench/ of a folder above the
// executable (build/bench-scaling, build/tests/test_bench: the repository); DPT_PLOT_SCRIPT wins.
std::string plot_script() {
  if (const char* e = std::getenv("DPT_PLOT_SCRIPT")) return e;
  std::vector<fs::path> where{fs::current_path() / "bench"};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec)
    for (fs::path d = exe.parent_path(); d.has_relative_path(); d = d.parent_path()) where.push_back(d / "bench");
  for (const fs::path& d : where)
    if (fs::exists(d / "plot_scaling.py")) return (d / "plot_scaling.py").string();
  return "";
}

std::string quoted(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

// The first Python that has matplotlib: the one on PATH, else the system's (Debian's
// python3-matplotlib installs for /usr/bin/python3 only); "" when neither has it.
std::string python_with_matplotlib() {
  for (const char* py : {"python3", "/usr/bin/python3"})
    if (std::system((std::string(py) + " -c 'import matplotlib' > /dev/null 2>&1").c_str()) == 0) return py;
  return "";
}

std::string plot_command(const fs::path& dir) {
  const std::string script = plot_script();
  return "python3 " + (script.empty() ? std::string("bench/plot_scaling.py") : script) + " " + dir.string();
}

// Draws the plots; returns "" when they were drawn, else what to run to draw them.
std::string draw_plots(const Settings& s, const fs::path& dir) {
  const std::string script = plot_script();
  const std::string how = plot_command(dir);
  if (!s.plots) return "plots not drawn (report.plots = false); draw them with: " + how;
  if (script.empty()) return "plots not drawn: bench/plot_scaling.py not found; from the repository: " + how;
  const std::string py = python_with_matplotlib();
  if (py.empty())
    return "plots not drawn: no python3 with matplotlib here (Debian: python3-matplotlib); draw them with: " + how;
  const std::string cmd = py + " " + quoted(script) + " " + quoted(dir.string()) + " 2>&1";
  std::fflush(stdout);  // the tables first, then what the script prints
  if (std::system(cmd.c_str()) != 0) return "plots not drawn: " + how + " failed (see its output above)";
  return "";
}

// What the cut-short handler needs, in fixed buffers set while it is not armed: it only reads them.
struct CutShort {
  char from[2][4096], to[2][4096], message[2048];
  size_t message_len;
};
CutShort g_cut;
// 0: the signal's default action; 1 (armed): put the cut-short report in place first; 2 (held,
// while rank 0 writes a report): note the signal, act on it once the files are whole.
volatile std::sig_atomic_t g_cut_state = 0, g_cut_pending = 0;

extern "C" void on_cut_short_signal(int sig) {
  if (g_cut_state == 2) {
    g_cut_pending = sig;
    return;
  }
  if (g_cut_state == 1) {
    g_cut_state = 0;
    for (int i = 0; i < 2; ++i) (void)std::rename(g_cut.from[i], g_cut.to[i]);
    (void)!::write(2, g_cut.message, g_cut.message_len);
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void copy_to(char* buf, size_t size, const std::string& text) {
  std::snprintf(buf, size, "%s", text.c_str());
}

std::string joined(const std::vector<std::string>& v) {
  std::string o;
  for (const std::string& x : v) o += (o.empty() ? "" : ", ") + x;
  return o.empty() ? "none" : o;
}

}  // namespace

std::string running_status(const std::string& running, const std::vector<std::string>& done) {
  return "written when the " + running + " section started, with the sections finished before it (" + joined(done) +
         "). A run still going replaces this page when it moves on; one that ended leaving it was killed during the " +
         running + " section without a chance to say so (SIGKILL, a lost node).";
}

std::string cut_short_status(const std::string& running, const std::vector<std::string>& done) {
  return "cut short by a signal (Ctrl-C, SIGTERM, SIGUSR1: a time limit sends one) during the " + running +
         " section. The tables are the sections finished before it (" + joined(done) + "); the " + running +
         " section and those after it did not finish. Plots were not drawn.";
}

void install_cut_short_handlers() {
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) std::signal(sig, on_cut_short_signal);
}

void write_partial_report(const Settings& s, Report r, const std::string& running, const std::vector<std::string>& done) {
  const fs::path dir(s.out_dir);
  g_cut_state = 2;
  fs::create_directories(dir);
  const std::string how = plot_command(dir);
  std::string command, config;
  r.status = cut_short_status(running, done);
  const std::string cut_json = records_json(s, r);
  const Report cut = report_from_json(cut_json, command, config);
  write_file(dir / ".records.json.cut", cut_json);
  write_file(dir / ".report.md.cut", md_of(cut, command, config, "plots not drawn (the run was cut short); draw them with: " + how));
  r.status = running_status(running, done);
  const std::string json = records_json(s, r);
  const Report back = report_from_json(json, command, config);
  write_file(dir / "records.json", json);
  write_file(dir / "records.csv", csv_of(back));
  write_file(dir / "report.md", md_of(back, command, config, "plots are drawn when the run ends; for these tables: " + how));
  copy_to(g_cut.from[0], sizeof g_cut.from[0], (dir / ".records.json.cut").string());
  copy_to(g_cut.to[0], sizeof g_cut.to[0], (dir / "records.json").string());
  copy_to(g_cut.from[1], sizeof g_cut.from[1], (dir / ".report.md.cut").string());
  copy_to(g_cut.to[1], sizeof g_cut.to[1], (dir / "report.md").string());
  copy_to(g_cut.message, sizeof g_cut.message,
          "bench-scaling: cut short during the " + running + " section; " + (dir / "report.md").string() +
              " holds the sections finished before it (" + joined(done) + ")\n");
  g_cut.message_len = std::strlen(g_cut.message);
  g_cut_state = 1;
  if (g_cut_pending) std::raise(g_cut_pending);  // came while writing: this report is the one to keep
}

void begin_final_report(const Settings& s) {
  g_cut_state = 2;
  std::error_code ec;
  for (const char* f : {".records.json.cut", ".report.md.cut"}) fs::remove(fs::path(s.out_dir) / f, ec);
}

void end_final_report() {
  g_cut_state = 0;
  if (const int sig = g_cut_pending) {
    std::fprintf(stderr, "bench-scaling: stopped by signal %d after writing the whole report\n", sig);
    std::fflush(stderr);
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

std::vector<std::string> write_report(const Settings& s, const Report& r) {
  const fs::path dir(s.out_dir);
  fs::create_directories(dir);
  write_file(dir / "records.json", records_json(s, r));
  // The page and the plots come from the records as written, read back.
  std::ifstream in(dir / "records.json");
  std::ostringstream text;
  text << in.rdbuf();
  std::string command, config;
  const Report back = report_from_json(text.str(), command, config);
  write_file(dir / "records.csv", csv_of(back));
  const std::string note = draw_plots(s, dir);
  if (!note.empty()) log::warn(note);
  write_file(dir / "report.md", md_of(back, command, config, note));
  std::vector<std::string> files;
  for (const char* f : {"records.json", "records.csv", "report.md"}) files.push_back((dir / f).string());
  if (note.empty())
    for (auto& [file, title] : plot_list(back)) files.push_back((dir / file).string());
  return files;
}

}  // namespace dpt::scaling
