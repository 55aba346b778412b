#include "models/random_layer.h"

#include <cmath>

namespace lipcert {

AttentionLayer RandomAttentionLayer(const RandomLayerSpec& s, std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  auto rnd = [&](int r, int c, double scale) {
    Eigen::MatrixXd m(r, c);
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < c; ++j) m(i, j) = scale * nd(rng);
    return m;
  };
  AttentionLayer L;
  L.kind = s.kind;
  L.d_model = s.d;
  L.heads = s.heads;
  L.head_dim_qk = s.dk;
  L.head_dim_v = s.dk;
  L.causal = s.causal;
  const int hd = s.heads * s.dk;
  L.wq = rnd(hd, s.d, s.qk_scale / std::sqrt(double(s.d)));
  L.wk = s.kind == AttentionKind::kL2 ? L.wq : rnd(hd, s.d, s.qk_scale / std::sqrt(double(s.d)));
  L.wv = rnd(hd, s.d, 1 / std::sqrt(double(s.d)));
  L.wo = rnd(s.d, hd, 1 / std::sqrt(double(hd)));
  if (s.biases) {
    if (s.kind == AttentionKind::kDot) {
      L.bq = rnd(hd, 1, s.bias_scale);
      L.bk = rnd(hd, 1, s.bias_scale);
    }
    L.bv = rnd(hd, 1, s.bias_scale);
    L.bo = rnd(s.d, 1, s.bias_scale);
  }
  if (s.layer_norm) {
    LayerNormParams ln;
    ln.gamma = (Eigen::VectorXd::Ones(s.d) + rnd(s.d, 1, s.ln_scale)).eval();
    ln.beta = rnd(s.d, 1, s.ln_scale);
    L.layer_norm = ln;
  }
  return L;
}

}  // namespace lipcert
