#include "models/centre.h"

#include <cmath>

#include "models/npy.h"
#include "models/safetensors.h"

namespace lipcert {

namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

// (N, D) or (1, N, D) -> (N, D), checked.
Eigen::MatrixXd CentreFromTensor(const Tensor& t, const std::string& file, const std::string& field, int tokens,
                                 int d_model) {
  Tensor flat = t;
  if (t.shape.size() == 3 && t.shape[0] == 1) flat.shape = {t.shape[1], t.shape[2]};
  if (flat.shape.size() != 2)
    throw InputError(file, field, "expected shape (N, D) or (1, N, D), got " + ShapeText(t.shape));
  for (size_t i = 0; i < flat.values.size(); ++i)
    if (!std::isfinite(flat.values[i]))
      throw InputError(file, field, "non-finite value at flat index " + std::to_string(i));
  const int64_t n = flat.shape[0], d = flat.shape[1];
  if (n == 0) throw InputError(file, field, "the centre has no tokens (shape " + ShapeText(t.shape) + ")");
  if (d_model > 0 && d != d_model)
    throw InputError(file, field, "the centre has D = " + std::to_string(d) + " but the model has d_model = " +
                                      std::to_string(d_model));
  if (tokens > 0 && n != tokens)
    throw InputError(file, field, "the centre has N = " + std::to_string(n) + " tokens but " +
                                      std::to_string(tokens) + " were asked for");
  return TensorAsMatrix(flat, file, field);
}

}  // namespace

Eigen::MatrixXd LoadCentre(const std::string& spec, int tokens, int d_model) {
  if (spec == "zero") {
    if (tokens <= 0) throw InputError("centre", "tokens", "the zero centre needs a positive number of tokens");
    if (d_model <= 0) throw InputError("centre", "d_model", "the zero centre needs a positive d_model");
    return Eigen::MatrixXd::Zero(tokens, d_model);
  }
  if (EndsWith(spec, ".npy")) return CentreFromTensor(ReadNpy(spec), spec, "values", tokens, d_model);

  const std::string marker = ".safetensors";
  std::string file = spec, name;
  const size_t pos = spec.rfind(marker + ":");
  if (pos != std::string::npos) {
    file = spec.substr(0, pos + marker.size());
    name = spec.substr(pos + marker.size() + 1);
  } else if (!EndsWith(spec, marker)) {
    throw InputError(spec, "centre", "expected 'zero', a .npy file or 'file.safetensors:tensor'");
  }
  const SafetensorsFile f = ReadSafetensors(file);
  if (name.empty()) {
    if (f.tensors.size() != 1)
      throw InputError(file, "centre", "the file holds " + std::to_string(f.tensors.size()) +
                                           " tensors; name one as 'file.safetensors:tensor'");
    name = f.tensors.begin()->first;
  }
  const auto it = f.tensors.find(name);
  if (it == f.tensors.end()) throw InputError(file, name, "missing tensor");
  return CentreFromTensor(it->second, file, name, tokens, d_model);
}

}  // namespace lipcert
