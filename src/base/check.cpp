#include "dpt/check.hpp"

#include <hdf5.h>
#include <mpi.h>

#include <sstream>

#include "dpt/log.hpp"

namespace dpt {
namespace {
std::string g_where = "rank 0";
}

std::string where() { return g_where; }

void set_where(int rank, const std::string& host) {
  g_where = "rank " + std::to_string(rank) + " on " + host;
}

void throw_call_error(const char* lib, const char* call, const std::string& msg, const char* file,
                      int line) {
  std::ostringstream os;
  os << lib << " call failed on " << where() << " at " << file << ":" << line << ": " << call
     << ": " << msg;
  throw Error(os.str(), kExitRuntime);
}

int run_captured(const std::function<void()>& f, std::string& msg) {
  try {
    f();
  } catch (const Error& e) {
    msg = e.what();
    return e.code();
  } catch (const std::exception& e) {
    msg = e.what();
    return kExitRuntime;
  }
  return 0;
}

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, size_t(len));
}

namespace {
herr_t walk_cb(unsigned n, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n < 3) {  // the innermost few frames say what went wrong; the rest is the call path
    if (!out->empty()) *out += "; ";
    *out += e->desc ? e->desc : "?";
    if (e->func_name) *out += std::string(" (") + e->func_name + ")";
  }
  return 0;
}
}  // namespace

std::string hdf5_error_string() {
  std::string out;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_cb, &out);
  H5Eclear2(H5E_DEFAULT);
  return out.empty() ? "unknown HDF5 error" : out;
}

}  // namespace dpt
