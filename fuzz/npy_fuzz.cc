// libFuzzer target: parses arbitrary bytes as a .npy file (centres come from these). Only
// InputError may escape the parser; a parsed array must match its shape.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "models/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const lipcert::Tensor t = lipcert::ParseNpy(bytes, "fuzz");
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= uint64_t(d);
    if (n != t.values.size()) std::abort();
  } catch (const lipcert::InputError&) {
  }
  return 0;
}
