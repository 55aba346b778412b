#include "models/inspect.h"

#include <sstream>

namespace lipcert {

namespace {

std::string Biases(const AttentionLayer& L) {
  std::string s;
  if (L.bq.size()) s += " q";
  if (L.bk.size()) s += " k";
  if (L.bv.size()) s += " v";
  if (L.bo.size()) s += " o";
  return s.empty() ? "none" : s.substr(1);
}

}  // namespace

std::string InspectText(const LoadedModel& model) {
  std::ostringstream os;
  os << "file:    " << model.path << "\n"
     << "preset:  " << model.preset << "\n"
     << "sha256:  " << model.sha256 << "\n"
     << "layers:  " << model.layers.size() << "\n";
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const AttentionLayer& L = model.layers[i];
    os << "layer " << model.layer_indices[i] << ": " << AttentionKindToString(L.kind) << " attention, D = " << L.d_model
       << ", H = " << L.heads << ", dk = " << L.head_dim_qk << ", dv = " << L.head_dim_v
       << ", causal: " << (L.causal ? "yes" : "no") << ", LayerNorm: ";
    if (L.layer_norm) os << "yes (eps " << L.layer_norm->eps << ", sublayer X + MHA(LN(X)))";
    else os << "no";
    os << ", biases: " << Biases(L) << "\n";
    for (const auto& [param, source] : L.tensor_names) os << "  " << param << " <- " << source << "\n";
  }
  return os.str();
}

nlohmann::json InspectJson(const LoadedModel& model) {
  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const AttentionLayer& L = model.layers[i];
    layers.push_back({{"index", model.layer_indices[i]},
                      {"kind", AttentionKindToString(L.kind)},
                      {"d_model", L.d_model},
                      {"heads", L.heads},
                      {"head_dim_qk", L.head_dim_qk},
                      {"head_dim_v", L.head_dim_v},
                      {"causal", L.causal},
                      {"layer_norm", L.layer_norm ? nlohmann::json{{"eps", L.layer_norm->eps}} : nlohmann::json()},
                      {"biases", {{"q", L.bq.size() > 0}, {"k", L.bk.size() > 0}, {"v", L.bv.size() > 0},
                                  {"o", L.bo.size() > 0}}},
                      {"tensor_names", L.tensor_names}});
  }
  return {{"path", model.path}, {"preset", model.preset}, {"sha256", model.sha256}, {"layers", layers}};
}

}  // namespace lipcert
