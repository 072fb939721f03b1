// libFuzzer: the config parser (Boost.Program_options INI + our validation) on arbitrary text,
// and shape inference of the layer lists it accepts.
// InputError is the expected answer; a crash, a sanitizer report or another exception is a bug.
#include <cstdint>
#include <string>

#include "dpt/check.hpp"
#include "dpt/config.hpp"
#include "dpt/layer_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const char* argv[] = {"dptrain", "--config", "fuzz.ini"};
  try {
    dpt::Invocation inv = dpt::parse_invocation(3, argv, "fuzz.ini", text);
    // An accepted config must survive its own round trip (what checkpoints store).
    dpt::parse_invocation(3, argv, "fuzz.ini", inv.cfg.resolved);
    // Shape inference of an accepted layer list, as start-up runs it on Fashion-MNIST's shape.
    if (!inv.cfg.layer_list.empty())
      dpt::plan_model(dpt::parse_layer_list(inv.cfg.layer_list),
                      dpt::model_input_shape({1, 28, 28}, inv.cfg.input_shape, "fuzz.h5"), 10);
  } catch (const dpt::Error&) {
  }
  return 0;
}
