// Human and JSON summaries of a loaded checkpoint (`lipcert inspect`).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "models/loader.h"

namespace lipcert {

// Per layer: kind, D, H, dk, dv, causal, LayerNorm, biases, and where each parameter came from.
std::string InspectText(const LoadedModel& model);

// {"path", "preset", "sha256", "layers": [{"index", "kind", "d_model", "heads", "head_dim_qk",
//  "head_dim_v", "causal", "layer_norm": null | {"eps"}, "biases": {"q", "k", "v", "o"},
//  "tensor_names": {...}}]}
nlohmann::json InspectJson(const LoadedModel& model);

}  // namespace lipcert
