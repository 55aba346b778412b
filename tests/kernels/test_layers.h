// Random attention layers and points for the kernels tests (every layer kind).
#pragma once

#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/evaluator.h"
#include "models/attention_layer.h"
#include "models/forward.h"
#include "tests/common/random_layer.h"
#include "tests/common/test_scale.h"

namespace lipcert::testing {

struct LayerCase {
  std::string name;
  AttentionKind kind = AttentionKind::kDot;
  bool causal = false;
  bool biases = false;
  bool layer_norm = false;
};

inline std::vector<LayerCase> AllLayerCases() {
  return {
      {"dot", AttentionKind::kDot, false, false, false},
      {"l2", AttentionKind::kL2, false, false, false},
      {"causal_dot", AttentionKind::kDot, true, false, false},
      {"causal_l2", AttentionKind::kL2, true, false, false},
      {"biases_dot", AttentionKind::kDot, false, true, false},
      {"biases_l2", AttentionKind::kL2, false, true, false},  // bv, bo only
      {"layernorm_dot", AttentionKind::kDot, false, true, true},
      {"layernorm_l2_causal", AttentionKind::kL2, true, false, true},
  };
}

// One parameter of the evaluator suite: a layer case, a compute type and a back end.
struct EvaluatorCase {
  LayerCase c;
  DType dtype;
  Device device;
};

// Every layer case in both precisions on every back end this build has (the CUDA cases
// only with LIPCERT_HAVE_CUDA; they skip themselves when no device is present).
inline std::vector<EvaluatorCase> AllEvaluatorCases() {
  std::vector<Device> devices = {Device::kCpu};
#if defined(LIPCERT_HAVE_CUDA)
  devices.push_back(Device::kCuda);
#endif
  std::vector<EvaluatorCase> out;
  for (Device dev : devices)
    for (const auto& c : AllLayerCases())
      for (DType t : {DType::kF64, DType::kF32}) out.push_back({c, t, dev});
  return out;
}

inline std::string EvaluatorCaseName(const ::testing::TestParamInfo<EvaluatorCase>& info) {
  return std::string(DeviceToString(info.param.device)) + "_" + info.param.c.name + "_" +
         DTypeToString(info.param.dtype);
}

// gtest prints a parameter with this instead of its bytes.
inline void PrintTo(const EvaluatorCase& e, std::ostream* os) {
  *os << DeviceToString(e.device) << "_" << e.c.name << "_" << DTypeToString(e.dtype);
}

// Weights N(0,1)/sqrt(D) (like the torch baseline), dk = D / heads, biases N(0, 0.1^2),
// LayerNorm gamma = 1 + N(0, 0.1^2), beta = N(0, 0.1^2).
inline AttentionLayer RandomLayer(const LayerCase& c, int d, int heads, unsigned seed) {
  std::mt19937_64 rng(seed);
  return RandomLayer(RandomLayerSpec{c.kind, c.causal, c.biases, c.layer_norm, d, heads, d / heads, 1.0, 0.1, 0.1}, rng);
}

// `batch` points N(0, scale^2), flattened (b, i, a).
inline std::vector<double> RandomPoints(int batch, int n, int d, unsigned seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, scale);
  std::vector<double> x(size_t(batch) * n * d);
  for (double& v : x) v = nd(rng);
  return x;
}

inline Eigen::MatrixXd PointAt(const std::vector<double>& x, int b, int n, int d) {
  Eigen::MatrixXd m(n, d);
  for (int i = 0; i < n; ++i)
    for (int a = 0; a < d; ++a) m(i, a) = x[size_t(b) * n * d + size_t(i) * d + a];
  return m;
}

inline void SetPoint(std::vector<double>& x, int b, const Eigen::MatrixXd& m) {
  const int n = int(m.rows()), d = int(m.cols());
  for (int i = 0; i < n; ++i)
    for (int a = 0; a < d; ++a) x[size_t(b) * n * d + size_t(i) * d + a] = m(i, a);
}

}  // namespace lipcert::testing
