// libFuzzer target: parses arbitrary bytes as a safetensors file. The only exception allowed
// out of the parser is InputError; anything else (another exception, a sanitizer report, a
// crash) is a finding. Files that parse must survive an encode / parse round trip unchanged.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "models/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  lipcert::SafetensorsFile file;
  try {
    file = lipcert::ParseSafetensors(bytes, "fuzz");
  } catch (const lipcert::InputError&) {
    return 0;
  }
  for (const auto& [name, t] : file.tensors)
    if (t.shape.size() == 2) (void)lipcert::TensorAsMatrix(t, "fuzz", name);
  const std::string again = lipcert::EncodeSafetensors(file.tensors, file.metadata);
  const lipcert::SafetensorsFile back = lipcert::ParseSafetensors(again, "round trip");
  if (back.metadata != file.metadata || back.tensors.size() != file.tensors.size()) std::abort();
  for (const auto& [name, t] : file.tensors) {
    const lipcert::Tensor& u = back.tensors.at(name);
    if (u.dtype != t.dtype || u.shape != t.shape || u.values != t.values) std::abort();
  }
  return 0;
}
