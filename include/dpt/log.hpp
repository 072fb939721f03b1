// Rank-aware logging: `info` prints on rank 0 only, `warn`/`error` on any rank with its
// rank and host in front. Knows nothing of MPI beyond the rank it is told at start-up.
#pragma once
#include <string>

namespace dpt::log {

void set_rank(int rank);
int rank();
void set_quiet(bool quiet);  // tests: silence info()

void info(const std::string& msg);   // rank 0 only, stdout
void warn(const std::string& msg);   // any rank, stderr, prefixed with where()
void error(const std::string& msg);  // any rank, stderr, prefixed with where()

// The current UTC time in strftime's `format` ("%Y-%m-%dT%H:%M:%SZ" for the metrics' start
// records, "%Y%m%dT%H%M%SZ" for folder names).
std::string utc_time(const char* format);

}  // namespace dpt::log
