// The fuzz input as a file: one per process and target, rewritten for every input.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace dpt_fuzz {
inline std::string write_input(const char* target, const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/dpt-fuzz-" + std::string(target) + "-" + std::to_string(::getpid()) + ".h5";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) __builtin_trap();
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}
}  // namespace dpt_fuzz
