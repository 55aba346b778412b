// The heads factored on the pre-LN sublayer X + MHA(LN(X)) (certify/centre/factored_heads.cc):
// the route forced at small sizes (dense_limit = 0, no super-blocks) against the MPFR Jacobian.
#include <gtest/gtest.h>

#include <Eigen/SVD>
#include <algorithm>
#include <cmath>
#include <random>

#include "certify/centre_norm.h"
#include "certify/jacobian_bounds.h"
#include "models/random_layer.h"
#include "tests/certify/test_util.h"

namespace lipcert {
namespace {

using testing_util::MpMat;
using testing_util::RandomLayer;
using testing_util::RandomLayerOptions;
using testing_util::TestScale;
using testing_util::ToMp;

double Sigma1(const MpMat& m) {
  Eigen::MatrixXd d(m.rows(), m.cols());
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index c = 0; c < m.cols(); ++c) d(r, c) = m(r, c).toDouble();
  return Eigen::BDCSVD<Eigen::MatrixXd>(d).singularValues()(0);
}

// A random dot-product layer with a LayerNorm in front (gamma about 1 with a spread, or the
// test util's wider draw; beta about 0): masks and biases as RandomLayer draws them.
AttentionLayer RandomPreLnLayer(std::mt19937_64& rng) {
  RandomLayerOptions lo;
  lo.max_width = 6;
  lo.max_heads = 3;
  AttentionLayer L;
  do L = RandomLayer(rng, lo);
  while (L.kind != AttentionKind::kDot || L.d_model < 2);
  std::normal_distribution<double> gauss(0.0, 1.0);
  if (!L.layer_norm || rng() % 2 == 0) {
    LayerNormParams ln;
    ln.gamma = Eigen::VectorXd(L.d_model);
    ln.beta = Eigen::VectorXd(L.d_model);
    for (int a = 0; a < L.d_model; ++a) {
      ln.gamma(a) = 1.0 + 0.3 * gauss(rng);
      ln.beta(a) = 0.1 * gauss(rng);
    }
    L.layer_norm = ln;
  }
  return L;
}

// The pre-LN route (the heads factored with the LayerNorm's Jacobian folded into the tokens'
// factors, plus 1 for the identity) is at or above sigma_1 of the MPFR Jacobian of the whole
// sublayer (and of J - I with exclude_residual) on random layers: causal and not, biases,
// D <= 6, up to 3 heads, N = 1 to 6, centres of scale 0.3, 1 and 3 (the LayerNorm's 1/sigma
// large and small). The folded term is not vacuous: 0.8 times it falls below the truth
// in some cases (with the identity: 1 + 0.8 (bound - 1)).
TEST(PreLnFactoredTest, DominatesTheMpfrNormOfTheSublayer) {
  mpfr::mpreal::set_default_prec(128);
  std::mt19937_64 rng(3607);
  const int cases = int(300 * TestScale());
  int checked = 0, residual = 0, causal = 0, too_big_at_08 = 0, too_big_at_08_residual = 0;
  double closest = kInf;
  std::normal_distribution<double> gauss(0.0, 1.0);
  for (int t = 0; t < cases; ++t) {
    const AttentionLayer L = RandomPreLnLayer(rng);
    const int n = 1 + int(rng() % 6);
    const double scale = t % 3 == 0 ? 0.3 : t % 3 == 1 ? 1.0 : 3.0;
    Eigen::MatrixXd x0(n, L.d_model);
    for (int i = 0; i < n; ++i)
      for (int a = 0; a < L.d_model; ++a) x0(i, a) = scale * gauss(rng);
    CentreNormOptions o;
    o.dense_limit = 0;
    o.super_blocks = false;
    o.exclude_residual = rng() % 3 == 0;
    ASSERT_TRUE(FactoredHeadsApply(L, o));
    MpMat j = DenseJacobian<mpfr::mpreal>(L, ToMp(x0));
    if (o.exclude_residual)
      for (Eigen::Index r = 0; r < j.rows(); ++r) j(r, r) -= 1;
    const double sigma = Sigma1(j);
    CentreNormReport rep;
    const double bound = CentreJacobianNormUpperBound(L, x0, o, &rep).value();
    ASSERT_EQ(rep.method, "factored_heads") << "case " << t;
    ASSERT_TRUE(std::isfinite(bound)) << "case " << t;
    EXPECT_EQ(bound, rep.factored) << "case " << t;
    EXPECT_GE(bound, sigma * (1 - 1e-13)) << "case " << t;
    if (std::isfinite(rep.factored_crossed)) {
      EXPECT_GE(rep.factored_crossed, sigma * (1 - 1e-13)) << "case " << t;
    }
    const double part = o.exclude_residual ? bound : bound - 1;  // the folded ||J_M C||
    if (o.exclude_residual) {
      too_big_at_08_residual += 0.8 * part < sigma;
      ++residual;
    } else {
      EXPECT_GE(bound, 1.0) << "case " << t;
      too_big_at_08 += 1 + 0.8 * part < sigma;
    }
    causal += L.causal;
    closest = std::min(closest, bound / sigma);
    ++checked;
  }
  EXPECT_EQ(checked, cases);
  EXPECT_GT(residual, cases / 6);
  EXPECT_GT(causal, cases / 4);
  EXPECT_GT(too_big_at_08, 0);
  EXPECT_GT(too_big_at_08_residual, 0);
  RecordProperty("closest_ratio", std::to_string(closest));
}

}  // namespace
}  // namespace lipcert
