// The version every executable prints for --version.
#pragma once
#include <string>

namespace dpt {

// "<program> <version> (git <commit the build was configured at>)"
std::string version_line(const std::string& program);

}  // namespace dpt
