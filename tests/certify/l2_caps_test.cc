// The radius-free bounds of L2 heads, checked in MPFR at inputs of every scale.
#include <gtest/gtest.h>

#include "certify/l2_caps.h"

#include "certify/search.h"
#include "models/forward.h"
#include "tests/certify/test_util.h"

namespace lipcert {
namespace {

using namespace testing_util;

// The radius-free bounds of L2 heads hold at points of every scale: in MPFR, the attention
// blocks P_ij a_ij g_ij^T, the diagonal terms E_i and the row sums stay below them, from
// inputs much smaller to much larger than the distance where exp(-d^2 / sqrt(dk)) d^2 peaks.
TEST(L2CapsLongTest, L2CapsHoldAtEveryScale) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(20261205);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const int cases = int(60 * TestScale());
  double worst = 0;
  int checked = 0;
  for (int t = 0; t < 20 * cases && checked < cases; ++t) {
    AttentionLayer L = RandomLayer(rng);
    if (L.kind != AttentionKind::kL2) continue;
    const int n = std::uniform_int_distribution<int>(2, 4)(rng), d = L.d_model;
    for (int s = 0; s < 12; ++s) {
      const double scale = std::pow(10.0, -1.5 + 3.0 * s / 11);
      Eigen::MatrixXd x(n, d);
      for (int a = 0; a < n; ++a)
        for (int c = 0; c < d; ++c) x(a, c) = scale * gauss(rng);
      const LayerState<mpfr::mpreal> st = Evaluate<mpfr::mpreal>(L, ToMp(x));
      for (int h = 0; h < L.heads; ++h) {
        const detail::HeadState<mpfr::mpreal>& hs = st.heads[h];
        const MpMat wq = ToMp(L.wq_head(h));
        const MpMat u = hs.v * ToMp(L.wo_head(h)).transpose();  // output-space values
        const mpfr::mpreal inv = 1 / mpfr::sqrt(mpfr::mpreal(L.head_dim_qk));
        for (int i = 0; i < n; ++i) {
          const int len = L.causal ? i + 1 : n;
          const L2BlockCaps caps = L2AttentionCaps(L, h, len);
          Vec<mpfr::mpreal> ubar = Vec<mpfr::mpreal>::Zero(d), qbar = Vec<mpfr::mpreal>::Zero(L.head_dim_qk);
          for (int k = 0; k < len; ++k) {
            ubar += hs.p(i, k) * u.row(k).transpose();
            qbar += hs.p(i, k) * hs.q.row(k).transpose();
          }
          mpfr::mpreal row = 0;
          Eigen::MatrixXd e = Eigen::MatrixXd::Zero(d, d);
          for (int j = 0; j < len; ++j) {
            const Vec<mpfr::mpreal> a = u.row(j).transpose() - ubar;
            const Vec<mpfr::mpreal> g = 2 * inv * wq.transpose() * (hs.q.row(i) - hs.q.row(j)).transpose();
            const Vec<mpfr::mpreal> b = 2 * inv * wq.transpose() * (hs.q.row(j).transpose() - qbar);
            const mpfr::mpreal block = hs.p(i, j) * mpfr::sqrt(a.squaredNorm()) * mpfr::sqrt(g.squaredNorm());
            ASSERT_LE(block.toDouble(), caps.block.value()) << "case " << t << " head " << h << " (" << i << "," << j << ")";
            worst = std::max(worst, block.toDouble() / caps.block.value());
            row += block;
            for (int r = 0; r < d; ++r)
              for (int c = 0; c < d; ++c) e(r, c) += (hs.p(i, j) * a(r) * b(c)).toDouble();
          }
          ASSERT_LE(row.toDouble(), caps.row_sum.value()) << "case " << t << " head " << h << " row " << i;
          Eigen::JacobiSVD<Eigen::MatrixXd> svd(e);
          ASSERT_LE(svd.singularValues()(0), caps.diagonal.value() * (1 + 1e-12)) << "case " << t << " head " << h << " row " << i;
        }
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, cases);  // about half the random layers are l2
  std::printf("L2 caps: largest block / cap reached %.3g\n", worst);
  EXPECT_GT(worst, 0.01);  // the scales sweep through the peak: the caps are not vacuous
}

// The operator bound for every input holds, in MPFR, at inputs of every scale, on the
// structured inputs where the caps' inequalities are tight (every query at the distance where
// P d^2 peaks from one key, on one line and spread over orthogonal directions), and at the
// lower-bound search's witnesses on sets of radius 10 to 1000; at one token it is exact
// for one head (J = V Wq, P = 1, no logit path).
TEST(L2CapsTest, L2OperatorCapHoldsForEveryInput) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(20261208);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const int cases = int(40 * TestScale());
  double worst = 0;
  int checked = 0, exact = 0;
  for (int t = 0; t < 20 * cases && checked < cases; ++t) {
    RandomLayerOptions lo;
    lo.max_width = 5;
    AttentionLayer L = RandomLayer(rng, lo);
    if (L.kind != AttentionKind::kL2) continue;
    L.layer_norm.reset();
    const int n = std::uniform_int_distribution<int>(1, 5)(rng), d = L.d_model;
    const double cap = L2AttentionOperatorCap(L, n).total.value();
    ASSERT_TRUE(std::isfinite(cap));
    auto check = [&](const Eigen::MatrixXd& x, const char* what) {
      const double j = JacobianNormMp(L, x, NormKind::kL2);
      ASSERT_GE(cap, j * (1 - 1e-12)) << "case " << t << ", " << what;
      if (n > 1) worst = std::max(worst, j / cap);
    };
    for (int s = 0; s < 8; ++s) {  // random inputs from 10^-1.5 to 10^1.5
      Eigen::MatrixXd x(n, d);
      for (int a = 0; a < n; ++a)
        for (int c = 0; c < d; ++c) x(a, c) = std::pow(10.0, -1.5 + 3.0 * s / 7) * gauss(rng);
      check(x, "random");
    }
    // Key 0 at the origin, the other tokens where P d^2 peaks along head 0's top input
    // direction (alternating sides) and along orthogonal input directions.
    const Eigen::JacobiSVD<Eigen::MatrixXd> svd(L.wq_head(0), Eigen::ComputeFullV);
    const double t_peak = 1 + 0.2785, c = std::sqrt(double(L.head_dim_qk));
    for (double stretch : {0.5, 1.0, 2.0}) {
      Eigen::MatrixXd line = Eigen::MatrixXd::Zero(n, d), star = Eigen::MatrixXd::Zero(n, d);
      const double r = stretch * std::sqrt(t_peak * c) / std::max(svd.singularValues()(0), 1e-3);
      for (int a = 1; a < n; ++a) {
        line.row(a) = (a % 2 ? r : -r) * svd.matrixV().col(0).transpose();
        star.row(a) = (a % 2 ? r : -r) * svd.matrixV().col((a / 2) % d).transpose();
      }
      check(line, "line");
      check(star, "star");
    }
    InputSet set;
    set.kind = SetKind::kTokens;
    set.center = Eigen::MatrixXd::Zero(n, d);
    SearchOptions so;
    so.starts = 6;
    so.max_steps = 60;
    so.max_rounds = 1;
    so.threads = 1;
    for (double radius : {10.0, 1000.0}) {
      set.radius = radius;
      so.seed = 7 + t;
      const double w = SearchLowerBound(L, set, so).best.lower_bound.value();
      ASSERT_GE(cap, w) << "case " << t << ", searched witness at radius " << radius;
      if (n > 1) worst = std::max(worst, w / cap);
    }
    if (n == 1 && L.heads == 1) {  // P = 1: the bound is ||V Wq|| itself, up to rounding
      EXPECT_LE(cap, JacobianNormMp(L, Eigen::MatrixXd::Zero(1, d), NormKind::kL2) * (1 + 1e-9)) << "case " << t;
      ++exact;
    }
    ++checked;
  }
  EXPECT_EQ(checked, cases);
  EXPECT_GT(exact, 0);
  std::printf("L2 operator cap: largest witness / cap at two or more tokens %.3g\n", worst);
  EXPECT_GT(worst, 0.05);  // not vacuous
}

TEST(L2CapsTest, DotLayerIsRefused) {
  AttentionLayer L;
  L.kind = AttentionKind::kDot;
  EXPECT_THROW(L2AttentionCaps(L, 0, 1), std::invalid_argument);
  EXPECT_THROW(L2AttentionOperatorCap(L, 1), std::invalid_argument);
}

}  // namespace
}  // namespace lipcert
