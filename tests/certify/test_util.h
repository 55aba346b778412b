// Shared helpers for the certify tests: random small layers and sets, and witnessed
// lower bounds evaluated in MPFR.
#pragma once

#include <mpreal.h>
#include <unsupported/Eigen/MPRealSupport>

#include <random>
#include <stdexcept>
#include <string>

#include "certify/input_set.h"
#include "models/forward.h"
#include "models/random_layer.h"
#include "tests/common/test_scale.h"

namespace lipcert {

template <>
struct ScalarToDouble<mpfr::mpreal> {
  static double Get(const mpfr::mpreal& v) { return v.toDouble(); }
};

namespace testing_util {

using ::lipcert::testing::TestScale;

struct RandomLayerOptions {
  int max_tokens = 4;    // for the caller's sets (RandomLayer does not read it)
  int max_width = 4;     // D uniform in [1, max_width]
  int max_heads = 2;
  int max_head_dim = 3;
  bool dot_only = false;     // dot-product attention; else dot or L2 on a coin
  bool layer_norm = true;    // a pre-LN on a coin (D >= 2); false: never
  // The weights are N(0, s^2 / D), s uniform in [min_scale, max_scale].
  double min_scale = 0.3, max_scale = 2.0;

  // "" when valid, else a message naming the field.
  std::string IsValid() const {
    if (max_width < 1) return "max_width must be >= 1";
    if (max_heads < 1) return "max_heads must be >= 1";
    if (max_head_dim < 1) return "max_head_dim must be >= 1";
    if (!(min_scale > 0 && min_scale <= max_scale)) return "min_scale must be in (0, max_scale]";
    return "";
  }
};

// A random small layer: causal and biases on a coin; with dot_only and !layer_norm it draws
// no coin for the kind or the LayerNorm (the same stream gives the same layer either way).
inline AttentionLayer RandomLayer(std::mt19937_64& rng, const RandomLayerOptions& o = {}) {
  if (const std::string why = o.IsValid(); !why.empty()) throw std::invalid_argument("RandomLayerOptions: " + why);
  std::uniform_int_distribution<int> coin(0, 1);
  std::uniform_real_distribution<double> scale_d(o.min_scale, o.max_scale);
  std::normal_distribution<double> gauss(0.0, 1.0);
  AttentionLayer L;
  L.kind = o.dot_only || coin(rng) ? AttentionKind::kDot : AttentionKind::kL2;
  L.d_model = std::uniform_int_distribution<int>(1, o.max_width)(rng);
  L.heads = std::uniform_int_distribution<int>(1, o.max_heads)(rng);
  L.head_dim_qk = std::uniform_int_distribution<int>(1, o.max_head_dim)(rng);
  L.head_dim_v = std::uniform_int_distribution<int>(1, o.max_head_dim)(rng);
  L.causal = coin(rng);
  const double s = scale_d(rng) / std::sqrt(double(L.d_model));
  auto mat = [&](int r, int c) {
    Eigen::MatrixXd m(r, c);
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < c; ++j) m(i, j) = s * gauss(rng);
    return m;
  };
  auto vec = [&](int n) { return Eigen::VectorXd(mat(n, 1)); };
  const int hq = L.heads * L.head_dim_qk, hv = L.heads * L.head_dim_v;
  L.wq = mat(hq, L.d_model);
  L.wk = L.kind == AttentionKind::kL2 ? L.wq : mat(hq, L.d_model);
  L.wv = mat(hv, L.d_model);
  L.wo = mat(L.d_model, hv);
  if (coin(rng)) {
    if (L.kind == AttentionKind::kDot) {
      L.bq = vec(hq);
      L.bk = vec(hq);
    }
    L.bv = vec(hv);
    L.bo = vec(L.d_model);
  }
  if (o.layer_norm && coin(rng) && L.d_model >= 2) {
    LayerNormParams ln;
    ln.gamma = vec(L.d_model) * 2;
    ln.beta = vec(L.d_model);
    ln.eps = 1e-5 * std::pow(10.0, std::uniform_int_distribution<int>(0, 4)(rng));
    L.layer_norm = ln;
  }
  return L;
}

// Case c of the post-LN property tests: a small random LN(X + MHA(X)) layer (dot or L2,
// causal or not, with or without biases).
inline AttentionLayer RandomPostLn(int c, std::mt19937_64& rng) {
  RandomLayerSpec spec;
  spec.kind = c % 2 ? AttentionKind::kL2 : AttentionKind::kDot;
  spec.causal = c % 3 == 1;
  spec.biases = c % 4 != 3;
  spec.layer_norm = true;
  spec.d = 3 + c % 3;
  spec.heads = 1 + c % 2;
  spec.dk = 2;
  spec.qk_scale = 1 + c % 3;
  AttentionLayer L = RandomAttentionLayer(spec, rng);
  L.post_layer_norm = L.layer_norm;
  L.layer_norm.reset();
  return L;
}

inline InputSet RandomSet(std::mt19937_64& rng, int tokens, int width) {
  std::normal_distribution<double> gauss(0.0, 1.0);
  InputSet s;
  s.kind = static_cast<SetKind>(std::uniform_int_distribution<int>(0, 2)(rng));
  s.center = Eigen::MatrixXd(tokens, width);
  const double c = std::uniform_real_distribution<double>(0.0, 2.0)(rng);
  for (int i = 0; i < tokens; ++i)
    for (int j = 0; j < width; ++j) s.center(i, j) = c * gauss(rng);
  s.radius = std::pow(10.0, std::uniform_real_distribution<double>(-3, 0)(rng));
  return s;
}

// A random point of the set; on its boundary when `boundary`.
inline Eigen::MatrixXd SamplePoint(std::mt19937_64& rng, const InputSet& s, bool boundary) {
  std::normal_distribution<double> gauss(0.0, 1.0);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  Eigen::MatrixXd d(s.tokens(), s.width());
  for (int i = 0; i < d.rows(); ++i)
    for (int j = 0; j < d.cols(); ++j) d(i, j) = gauss(rng);
  switch (s.kind) {
    case SetKind::kBall: d *= (boundary ? 1.0 : std::pow(unif(rng), 1.0 / d.size())) * s.radius / d.norm(); break;
    case SetKind::kTokens:
      for (int i = 0; i < d.rows(); ++i) d.row(i) *= (boundary ? 1.0 : unif(rng)) * s.radius / d.row(i).norm();
      break;
    case SetKind::kBox:
      for (int i = 0; i < d.rows(); ++i)
        for (int j = 0; j < d.cols(); ++j)
          d(i, j) = boundary ? (d(i, j) > 0 ? s.radius : -s.radius) : s.radius * (2 * unif(rng) - 1);
      break;
  }
  return s.Project(s.center + d);
}

using MpMat = Mat<mpfr::mpreal>;

inline MpMat ToMp(const Eigen::MatrixXd& m) { return m.cast<mpfr::mpreal>(); }

// ||J(X)||_p with J formed in MPFR and its norm taken in double (relative error ~1e-15).
inline double JacobianNormMp(const AttentionLayer& L, const Eigen::MatrixXd& x, NormKind p) {
  const MpMat j = DenseJacobian<mpfr::mpreal>(L, ToMp(x));
  Eigen::MatrixXd jd(j.rows(), j.cols());
  for (Eigen::Index r = 0; r < j.rows(); ++r)
    for (Eigen::Index c = 0; c < j.cols(); ++c) jd(r, c) = j(r, c).toDouble();
  if (p == NormKind::kLinf) return jd.cwiseAbs().rowwise().sum().maxCoeff();
  Eigen::JacobiSVD<Eigen::MatrixXd> svd(jd);
  return svd.singularValues()(0);
}

// ||f(X) - f(Y)||_p / ||X - Y||_p evaluated in MPFR (256 bits), rounded to double.
inline double DifferenceQuotientMp(const AttentionLayer& L, const Eigen::MatrixXd& x,
                                   const Eigen::MatrixXd& y, NormKind p) {
  const MpMat fx = Forward<mpfr::mpreal>(L, ToMp(x)), fy = Forward<mpfr::mpreal>(L, ToMp(y));
  const MpMat dx = ToMp(x) - ToMp(y), df = fx - fy;
  mpfr::mpreal num, den;
  if (p == NormKind::kL2) {
    num = mpfr::sqrt(df.squaredNorm());
    den = mpfr::sqrt(dx.squaredNorm());
  } else {
    num = df.cwiseAbs().maxCoeff();
    den = dx.cwiseAbs().maxCoeff();
  }
  return (num / den).toDouble();
}

}  // namespace testing_util
}  // namespace lipcert
