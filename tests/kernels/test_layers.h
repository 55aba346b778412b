// Random attention layers and points for the kernels tests (every layer kind).
#pragma once

#include <Eigen/Dense>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "models/attention_layer.h"
#include "models/forward.h"

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

// Weights N(0,1)/sqrt(D) (like the torch baseline), biases N(0, 0.1^2), LayerNorm
// gamma = 1 + N(0, 0.1^2), beta = N(0, 0.1^2).
inline AttentionLayer RandomLayer(const LayerCase& c, int d, int heads, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  auto rnd = [&](int r, int k, double s) {
    Eigen::MatrixXd m(r, k);
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < k; ++j) m(i, j) = s * nd(rng);
    return m;
  };
  AttentionLayer L;
  L.kind = c.kind;
  L.d_model = d;
  L.heads = heads;
  L.head_dim_qk = d / heads;
  L.head_dim_v = d / heads;
  L.causal = c.causal;
  const double s = 1.0 / std::sqrt(double(d));
  L.wq = rnd(d, d, s);
  L.wk = c.kind == AttentionKind::kL2 ? L.wq : rnd(d, d, s);
  L.wv = rnd(d, d, s);
  L.wo = rnd(d, d, s);
  if (c.biases) {
    if (c.kind == AttentionKind::kDot) {
      L.bq = rnd(d, 1, 0.1);
      L.bk = rnd(d, 1, 0.1);
    }
    L.bv = rnd(d, 1, 0.1);
    L.bo = rnd(d, 1, 0.1);
  }
  if (c.layer_norm) {
    LayerNormParams ln;
    ln.gamma = Eigen::VectorXd::Ones(d) + rnd(d, 1, 0.1);
    ln.beta = rnd(d, 1, 0.1);
    L.layer_norm = ln;
  }
  return L;
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

inline int TestScale() {
  const char* s = std::getenv("LIPCERT_TEST_SCALE");
  const int v = s ? std::atoi(s) : 1;
  return v < 1 ? 1 : v;
}

}  // namespace lipcert::testing
