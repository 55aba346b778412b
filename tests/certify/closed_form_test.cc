// Closed-form bounds: the Lambert W upper bound, Kim et al.'s published l2 values and
// their l_inf bound on the tightness construction and on random L2 layers.
#include "certify/closed_form.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>

#include "tests/certify/test_util.h"

namespace lipcert {
namespace {

using testing_util::JacobianNormMp;
using testing_util::RandomLayer;
using testing_util::RandomLayerOptions;
using testing_util::TestScale;

TEST(ClosedFormTest, LambertW0UpperIsTightAndAbove) {
  for (double x : {0.0, 1e-300, 1e-8, 0.5, 1.0, 2.718281828459045, 10.0, 1e3, 1e300}) {
    const double w = LambertW0Upper(x);
    EXPECT_GE(w * std::exp(w), x * (1 - 1e-15));  // W0(x) <= w
    if (x > 0 && x < 1e300) {
      EXPECT_LE(w, std::nextafter(w, 0.0) + 1e-12 * w + 1e-300);
    }
  }
  EXPECT_NEAR(LambertW0Upper(1.0), 0.5671432904097838, 1e-14);
}

TEST(ClosedFormTest, KimBoundMatchesPublishedValuesForUnitWeights) {
  // D = H = 1, unit weights: the bound is sqrt(N) (4 W0((N-1)/e) + 1); attention-math.md
  // quotes 2.11, 5.40, 11.52, 18.68 at N = 2, 10, 100, 1000 for the per-token quantity.
  AttentionLayer L;
  L.kind = AttentionKind::kL2;
  L.d_model = L.heads = L.head_dim_qk = L.head_dim_v = 1;
  L.wq = L.wk = L.wv = L.wo = Eigen::MatrixXd::Ones(1, 1);
  for (auto [n, expected] : {std::pair{2, 2.11}, {10, 5.40}, {100, 11.52}, {1000, 18.68}}) {
    InputSet s;
    s.center = Eigen::MatrixXd::Zero(n, 1);
    s.radius = 1;
    const auto b = ClosedFormBounds(L, s, NormKind::kL2);
    ASSERT_EQ(b.size(), 1u);
    EXPECT_NEAR(b[0].upper.value() / std::sqrt(double(n)), expected, 0.01) << "N = " << n;
  }
}


AttentionLayer UnitL2Layer() {
  AttentionLayer L;
  L.kind = AttentionKind::kL2;
  L.d_model = L.heads = L.head_dim_qk = L.head_dim_v = 1;
  L.wq = L.wk = L.wv = L.wo = Eigen::MatrixXd::Ones(1, 1);
  return L;
}

double KimInfOf(const AttentionLayer& L, const InputSet& s) {
  for (const ClosedFormBound& b : ClosedFormBounds(L, s, NormKind::kLinf))
    if (b.name == "closed_form/kim_inf") return b.upper.value();
  ADD_FAILURE() << "no closed_form/kim_inf bound";
  return 0;
}

// Kim et al.'s tightness construction (D = H = 1, unit weights): x_1 = 0 and (N-1)/2
// tokens at each of +-sqrt(1 + W0((N-1)/e)), inside the tokens set around zero of that
// radius. The l_inf norm of the MPFR Jacobian there is the published witness, and the
// certified bound is the published 4 W0((N-1)/e) + 1.
TEST(ClosedFormTest, KimInfOnThePublishedTightnessConstruction) {
  mpfr::mpreal::set_default_prec(256);
  const AttentionLayer L = UnitL2Layer();
  int checked = 0;
  for (auto [n, witness, bound] : {std::tuple{11, 4.557, 5.627}, {101, 10.098, 11.544}}) {
    const double w = std::exp(std::log(double(n - 1)) - 1);  // (N-1)/e, W0 evaluated below
    const double radius = std::sqrt(1 + LambertW0Upper(w));
    InputSet s;
    s.kind = SetKind::kTokens;
    s.center = Eigen::MatrixXd::Zero(n, 1);
    s.radius = radius;
    Eigen::MatrixXd x = Eigen::MatrixXd::Zero(n, 1);
    for (int i = 1; i < n; ++i) x(i, 0) = (i % 2 ? 1 : -1) * radius * (1 - 1e-15);
    ASSERT_TRUE(s.Contains(x));
    const double j_inf = JacobianNormMp(L, x, NormKind::kLinf);
    const double b = KimInfOf(L, s);
    // The witnesses come from lipcert's search (4.557, 10.098); this exact
    // construction gives 4.5547 and 10.0938, within 0.05% of them.
    EXPECT_NEAR(j_inf, witness, 5e-4 * witness) << "N = " << n;
    EXPECT_NEAR(b, bound, 2e-3) << "N = " << n;
    EXPECT_LE(j_inf, b) << "N = " << n;
    // The published form 4 W0((N-1)/e) + 1 exactly (up to the rounding of W0).
    EXPECT_NEAR(b, 4 * LambertW0Upper(w) + 1, 1e-12 * b);
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

// Random L2 layers with every shape: the bound holds for every input, so it must
// dominate the MPFR Jacobian's l_inf norm at random points of any spread, including the
// construction's two-cluster points scaled through the query weights.
TEST(ClosedFormTest, KimInfDominatesMpfrJacobiansOfRandomL2Layers) {
  mpfr::mpreal::set_default_prec(128);
  std::mt19937_64 rng(1401);
  std::normal_distribution<double> gauss(0.0, 1.0);
  std::uniform_real_distribution<double> unif(-1.0, 1.0);
  const int cases = int(200 * TestScale());
  int checked = 0;
  double worst = 0;
  for (int t = 0; t < cases; ++t) {
    RandomLayerOptions o;
    o.max_tokens = 5;
    o.max_width = 3;
    o.max_heads = 2;
    o.max_head_dim = 3;
    AttentionLayer L = RandomLayer(rng, o);
    L.kind = AttentionKind::kL2;
    L.wk = L.wq;
    L.bq.resize(0);
    L.bk.resize(0);
    L.causal = false;
    L.layer_norm.reset();
    ASSERT_EQ(ValidateLayer(L), "");
    const int n = 1 + int(rng() % 5);
    InputSet s;
    s.center = Eigen::MatrixXd::Zero(n, L.d_model);
    s.radius = 1;
    const double bound = KimInfOf(L, s);
    for (int k = 0; k < 3; ++k) {
      const double spread = std::pow(10.0, unif(rng));
      Eigen::MatrixXd x(n, L.d_model);
      for (int i = 0; i < n; ++i)
        for (int a = 0; a < L.d_model; ++a) x(i, a) = spread * gauss(rng);
      const double j = JacobianNormMp(L, x, NormKind::kLinf);
      EXPECT_LE(j, bound) << "case " << t;
      worst = std::max(worst, j / bound);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * cases);
  EXPECT_GT(worst, 0.01);  // the witnesses are not vacuous
}

TEST(ClosedFormTest, KimInfIsOnlyForBareL2Attention) {
  AttentionLayer L = UnitL2Layer();
  InputSet s;
  s.center = Eigen::MatrixXd::Zero(3, 1);
  s.radius = 1;
  EXPECT_EQ(ClosedFormBounds(L, s, NormKind::kLinf).size(), 1u);
  L.causal = true;
  EXPECT_TRUE(ClosedFormBounds(L, s, NormKind::kLinf).empty());
  L.causal = false;
  L.kind = AttentionKind::kDot;
  EXPECT_TRUE(ClosedFormBounds(L, s, NormKind::kLinf).empty());
}

}  // namespace
}  // namespace lipcert
