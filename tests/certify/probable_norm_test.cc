// The probabilistic centre norm (certify/probable_norm.h): the theorem's eps as written,
// the bound above the MPFR-evaluated sigma_1 on random layers of every kind, close to it,
// and in the certificate beside (never as) the certified bound.
#include "certify/probable_norm.h"

#include <gtest/gtest.h>

#include <Eigen/SVD>
#include <cmath>
#include <random>

#include "certify/certify.h"
#include "tests/certify/test_util.h"

namespace lipcert {
namespace {

using testing_util::JacobianNormMp;
using testing_util::RandomLayer;
using testing_util::RandomLayerOptions;
using lipcert::testing::Count;

TEST(ProbableNormTest, EpsilonIsTheTheoremsAndRoundedUp) {
  // sqrt(eps) = ln(1.648 sqrt(n) / delta) / (2k - 1), in long double.
  struct Case {
    double n;
    int k;
    double delta;
  };
  int checked = 0;
  for (const Case c : {Case{98304, 200, 1e-6}, Case{3072, 50, 1e-9}, Case{24576, 300, 3e-9}, Case{16, 40, 0.01}}) {
    const long double root = std::log(1.648L * std::sqrt((long double)c.n) / c.delta) / (2.0L * c.k - 1);
    const long double exact = root * root;
    const double eps = KuczynskiWozniakowskiEpsilon(c.n, c.k, c.delta);
    EXPECT_GE((long double)eps, exact) << c.n << " " << c.k;
    EXPECT_LE((long double)eps, exact * (1 + 1e-12L)) << c.n << " " << c.k;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
  // Too few steps for the failure probability: no bound.
  EXPECT_EQ(KuczynskiWozniakowskiEpsilon(98304, 5, 1e-6), 1.0);
  EXPECT_EQ(KuczynskiWozniakowskiEpsilon(98304, 0, 1e-6), 1.0);
  // More steps, smaller eps; a larger failure probability, smaller eps.
  EXPECT_LT(KuczynskiWozniakowskiEpsilon(1e4, 100, 1e-6), KuczynskiWozniakowskiEpsilon(1e4, 50, 1e-6));
  EXPECT_LT(KuczynskiWozniakowskiEpsilon(1e4, 100, 1e-3), KuczynskiWozniakowskiEpsilon(1e4, 100, 1e-6));
}

TEST(ProbableNormTest, RefusesBadOptionsNamingTheField) {
  std::mt19937_64 rng(3);
  const AttentionLayer L = RandomLayer(rng);
  const Eigen::MatrixXd x = Eigen::MatrixXd::Random(3, L.d_model);
  ProbableNormOptions o;
  o.failure_probability = 0;
  try {
    ProbableJacobianNormUpper(L, x, o);
    FAIL() << "accepted failure_probability = 0";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("probabilistic.failure_probability"), std::string::npos);
  }
  o = {};
  o.max_krylov = 1;
  EXPECT_THROW(ProbableJacobianNormUpper(L, x, o), std::invalid_argument);
  EXPECT_THROW(ProbableJacobianNormUpper(L, Eigen::MatrixXd::Random(3, L.d_model + 1), {}), std::invalid_argument);
}

// On random layers (dot and L2, masks, biases, the LayerNorm sublayer) the bound is above
// sigma_1 of the MPFR Jacobian, and within the theorem's eps of it.
TEST(ProbableNormTest, DominatesTheMpfrNormAndIsClose) {
  mpfr::mpreal::set_default_prec(128);
  std::mt19937_64 rng(20261205);
  RandomLayerOptions lo;
  lo.max_tokens = 6;
  lo.max_width = 8;
  lo.max_heads = 3;
  lo.max_head_dim = 4;
  const int cases = int(Count(40));
  int checked = 0, with_layer_norm = 0;
  for (int t = 0; t < cases; ++t) {
    const AttentionLayer L = RandomLayer(rng, lo);
    const int n = std::uniform_int_distribution<int>(1, lo.max_tokens)(rng);
    const Eigen::MatrixXd x = 1.5 * Eigen::MatrixXd::Random(n, L.d_model);
    ProbableNormOptions o;
    o.seed = 1 + t;
    const ProbableUpperBound p = ProbableJacobianNormUpper(L, x, o);
    const double sigma = JacobianNormMp(L, x, NormKind::kL2);
    ASSERT_TRUE(std::isfinite(p.value)) << t;
    EXPECT_GE(p.value, sigma * (1 + 1e-12)) << "case " << t;
    EXPECT_LE(p.value, std::sqrt(1 + 1e-7) * sigma / std::sqrt(1 - p.epsilon) + 1e-12) << "case " << t;
    EXPECT_LE(p.ritz_sigma, sigma * (1 + 1e-9) + 1e-12) << "case " << t;
    EXPECT_GT(p.krylov_dim, 0);
    EXPECT_EQ(p.seed, uint64_t(1 + t));
    with_layer_norm += L.layer_norm.has_value();
    ++checked;
  }
  EXPECT_EQ(checked, cases);
  EXPECT_GT(with_layer_norm, 0);
}

// Larger layers: the Krylov space stays far below N*D, and the bound is still above the
// sigma_1 of the dense Jacobian and within 1% of it (the eps of 300 steps at this size).
TEST(ProbableNormTest, LargerLayersWithinOnePercent) {
  std::mt19937_64 rng(77);
  RandomLayerOptions lo;
  lo.max_tokens = 1;
  lo.max_width = 1;
  lo.max_heads = 1;
  lo.max_head_dim = 1;
  int checked = 0;
  for (int t = 0; t < int(Count(2)); ++t) {
    AttentionLayer L = RandomLayer(rng, lo);
    // 4 heads of 8 on D = 32, N = 12: N*D = 384.
    std::normal_distribution<double> g(0, 1 / std::sqrt(32.0));
    auto mat = [&](int r, int c) { return Eigen::MatrixXd(Eigen::MatrixXd::NullaryExpr(r, c, [&] { return g(rng); })); };
    L.d_model = 32;
    L.heads = 4;
    L.head_dim_qk = L.head_dim_v = 8;
    L.wq = mat(32, 32);
    L.wk = L.kind == AttentionKind::kL2 ? L.wq : mat(32, 32);
    L.wv = mat(32, 32);
    L.wo = mat(32, 32);
    L.bq.resize(0);
    L.bk.resize(0);
    L.bv.resize(0);
    L.bo.resize(0);
    L.layer_norm.reset();
    const Eigen::MatrixXd x = 2 * Eigen::MatrixXd::Random(12, 32);
    ProbableNormOptions o;
    o.seed = 11 + t;
    const ProbableUpperBound p = ProbableJacobianNormUpper(L, x, o);
    const Eigen::MatrixXd j = DenseJacobian<double>(L, x);  // 384 x 384: double suffices here
    const double sigma = Eigen::BDCSVD<Eigen::MatrixXd>(j).singularValues()(0);
    EXPECT_GE(p.value, sigma) << t;
    EXPECT_LE(p.value, 1.01 * sigma) << t;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

// In Certify: the probabilistic field sits beside the certified bound, between the witness
// and the certified bound, and the certified bound does not depend on it.
TEST(ProbableNormTest, CertificateCarriesItBesideTheCertifiedBound) {
  std::mt19937_64 rng(5);
  RandomLayerOptions lo;
  lo.max_tokens = 4;
  lo.max_width = 6;
  int checked = 0;
  for (int t = 0; t < int(Count(4)); ++t) {
    const AttentionLayer L = RandomLayer(rng, lo);
    InputSet set;
    set.kind = SetKind::kBall;
    set.center = Eigen::MatrixXd::Random(4, L.d_model);
    set.radius = t % 2 ? 1e-3 : 0.0;
    CertifyOptions o;
    o.time_limit_s = 2;
    o.probabilistic.seed = 9;
    const Certificate with = Certify(L, set, o, {});
    ASSERT_TRUE(with.probabilistic.has_value()) << t;
    const ProbabilisticBound& p = *with.probabilistic;
    EXPECT_LE(p.value, with.upper_bound.value()) << t;
    EXPECT_GE(p.value, with.lower_bound.value() * (1 - 1e-12)) << t;
    EXPECT_GE(p.value, JacobianNormMp(L, set.center, NormKind::kL2)) << t;
    const nlohmann::json j = ToJson(with);
    EXPECT_EQ(j["probabilistic"]["certified"], false);
    EXPECT_DOUBLE_EQ(j["probabilistic"]["confidence"].get<double>(), 1 - 1e-6);
    o.probabilistic.enabled = false;
    const Certificate without = Certify(L, set, o, {});
    EXPECT_FALSE(without.probabilistic.has_value());
    EXPECT_FALSE(ToJson(without).contains("probabilistic"));
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace lipcert
