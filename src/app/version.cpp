#include "dpt/version.hpp"

#ifndef DPT_VERSION
#define DPT_VERSION "unknown"
#endif
#ifndef DPT_GIT
#define DPT_GIT "unknown"
#endif

namespace dpt {

std::string version_line(const std::string& program) {
  return program + " " DPT_VERSION " (git " DPT_GIT ")";
}

}  // namespace dpt
