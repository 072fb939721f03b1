// What the command-line tests share: a shell command run as a user would, in a given folder,
// under a hard time limit (timeout(1) exits 124 on a hang), with its output, exit code and wall
// time; and the mpirun prefix (as root: --allow-run-as-root; more ranks than cores allowed).
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace cli {

struct Outcome {
  int code = -1;
  std::string out;  // stdout and stderr together
  double seconds = 0;
};

inline Outcome sh(const std::string& cmd, int limit_s, const std::string& cwd = ".") {
  Outcome r;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string line = "cd '" + cwd + "' && timeout -k 5 " + std::to_string(limit_s) + " " + cmd + " 2>&1";
  FILE* p = popen(line.c_str(), "r");
  char buf[4096];
  while (p && fgets(buf, sizeof buf, p)) r.out += buf;
  const int status = p ? pclose(p) : -1;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// "mpirun -np N [--allow-run-as-root] --oversubscribe <opts> " (DPT_MPIEXEC from CMake).
inline std::string mpirun(int ranks, const std::string& opts = "--bind-to none") {
  return std::string(DPT_MPIEXEC) + " -np " + std::to_string(ranks) +
         (::geteuid() == 0 ? " --allow-run-as-root" : "") + " --oversubscribe " + opts + " ";
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// name -> bytes of every checkpoint file directly in a folder.
inline std::map<std::string, std::string> snapshot(const std::filesystem::path& d) {
  std::map<std::string, std::string> m;
  if (!std::filesystem::exists(d)) return m;
  for (const auto& e : std::filesystem::directory_iterator(d))
    if (e.is_regular_file() && e.path().extension() == ".h5") m[e.path().filename().string()] = slurp(e.path());
  return m;
}

}  // namespace cli
