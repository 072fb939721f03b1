#include "dpt/log.hpp"

#include <cstdio>
#include <ctime>

#include "dpt/check.hpp"

namespace dpt::log {
namespace {
int g_rank = 0;
bool g_quiet = false;
}  // namespace

void set_rank(int rank) { g_rank = rank; }
int rank() { return g_rank; }
void set_quiet(bool quiet) { g_quiet = quiet; }

void info(const std::string& msg) {
  if (g_rank != 0 || g_quiet) return;
  std::fprintf(stdout, "%s\n", msg.c_str());
  std::fflush(stdout);
}

void warn(const std::string& msg) {
  std::fprintf(stderr, "dptrain warning (%s): %s\n", where().c_str(), msg.c_str());
  std::fflush(stderr);
}

void error(const std::string& msg) {
  std::fprintf(stderr, "dptrain error (%s): %s\n", where().c_str(), msg.c_str());
  std::fflush(stderr);
}

std::string utc_time(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

}  // namespace dpt::log
