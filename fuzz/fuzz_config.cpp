// libFuzzer: the config parser (Boost.Program_options INI + our validation) on arbitrary text.
// InputError is the expected answer; a crash, a sanitizer report or another exception is a bug.
#include <cstdint>
#include <string>

#include "dpt/check.hpp"
#include "dpt/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const char* argv[] = {"dptrain", "--config", "fuzz.ini"};
  try {
    dpt::Invocation inv = dpt::parse_invocation(3, argv, "fuzz.ini", text);
    // An accepted config must survive its own round trip (what checkpoints store).
    dpt::parse_invocation(3, argv, "fuzz.ini", inv.cfg.resolved);
  } catch (const dpt::Error&) {
  }
  return 0;
}
