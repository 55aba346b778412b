// Per-head factor bounds: the softmax ranges of a cover contain the probabilities at the
// extreme points of the set and are first-order tight.
#include <gtest/gtest.h>

#include "certify/head_factors.h"

#include "models/forward.h"
#include "tests/certify/test_util.h"

namespace lipcert {
namespace {

using namespace testing_util;

// Gradient of log P^h_ij at x by central differences (double; only a direction to probe).
Eigen::MatrixXd LogProbabilityGradient(const AttentionLayer& L, const Eigen::MatrixXd& x, int h, int i, int j) {
  Eigen::MatrixXd g(x.rows(), x.cols());
  const double step = 1e-6;
  for (Eigen::Index r = 0; r < x.rows(); ++r)
    for (Eigen::Index c = 0; c < x.cols(); ++c) {
      Eigen::MatrixXd a = x, b = x;
      a(r, c) += step;
      b(r, c) -= step;
      g(r, c) = (std::log(Evaluate<double>(L, a).heads[h].p(i, j)) - std::log(Evaluate<double>(L, b).heads[h].p(i, j))) /
                (2 * step);
    }
  return g;
}

// The softmax ranges of a ball (tangent-plane bounds intersected with the logit box) contain
// the probabilities, evaluated in MPFR, at the points that push each P_ij hardest: along
// +-grad log P_ij, along random directions, and with the whole radius on two tokens.
TEST(HeadFactorsTest, BallProbabilityRangesContainExtremePoints) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(20261203);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const int cases = int(150 * TestScale());
  int checked = 0;
  for (int t = 0; t < cases; ++t) {
    const AttentionLayer L = RandomLayer(rng);
    InputSet set = RandomSet(rng, std::uniform_int_distribution<int>(1, 4)(rng), L.d_model);
    set.kind = SetKind::kBall;
    const int n = set.tokens();
    std::vector<Eigen::MatrixXd> points;
    for (int s = 0; s < 4; ++s) points.push_back(SamplePoint(rng, set, true));
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        Eigen::MatrixXd d = Eigen::MatrixXd::Zero(n, L.d_model);
        for (int c = 0; c < L.d_model; ++c) d(a, c) = gauss(rng), d(b, c) += gauss(rng);
        if (d.norm() > 0) points.push_back(set.Project(set.center + d * (set.radius / d.norm())));
      }
    for (int h = 0; h < L.heads; ++h) {
      const IntervalMatrix r = AttentionProbabilityEnclosure(L, CoverOf(set), h);
      const Eigen::MatrixXd r_lo = r.Lower(), r_hi = r.Upper();
      std::vector<Eigen::MatrixXd> probe = points;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < (L.causal ? i + 1 : n); ++j) {
          const Eigen::MatrixXd g = LogProbabilityGradient(L, set.center, h, i, j);
          if (g.norm() == 0 || !std::isfinite(g.norm())) continue;
          for (double sign : {1.0, -1.0}) probe.push_back(set.Project(set.center + sign * set.radius / g.norm() * g));
        }
      for (const Eigen::MatrixXd& x : probe) {
        const MpMat p = Evaluate<mpfr::mpreal>(L, ToMp(x)).heads[h].p;
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < n; ++j) {
            const double v = p(i, j).toDouble();
            ASSERT_LE(v, r_hi(i, j) * (1 + 1e-12)) << "case " << t << " head " << h << " (" << i << "," << j << ")";
            ASSERT_GE(v, r_lo(i, j) * (1 - 1e-12)) << "case " << t << " head " << h << " (" << i << "," << j << ")";
          }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, cases * 4);
}

// Without LayerNorm the tangent-plane bound is exact to first order: at a small ball the
// certified growth log(hi / P0) is within 2% of the growth reached along grad log P_ij.
TEST(HeadFactorsTest, BallProbabilityRangesAreFirstOrderTight) {
  std::mt19937_64 rng(31);
  int checked = 0;
  for (int t = 0; t < 200 && checked < 100; ++t) {
    AttentionLayer L = RandomLayer(rng);
    L.layer_norm.reset();
    InputSet set = RandomSet(rng, std::uniform_int_distribution<int>(2, 4)(rng), L.d_model);
    set.kind = SetKind::kBall;
    set.radius = 1e-5;
    const int n = set.tokens();
    const Eigen::MatrixXd r_hi = AttentionProbabilityEnclosure(L, CoverOf(set), 0).Upper();
    const Eigen::MatrixXd p0 = Evaluate<double>(L, set.center).heads[0].p;
    for (int i = 1; i < n; ++i) {
      const int j = 0;
      const Eigen::MatrixXd g = LogProbabilityGradient(L, set.center, 0, i, j);
      if (g.norm() < 1e-3) continue;
      const Eigen::MatrixXd x = set.center + set.radius / g.norm() * g;
      const double reached = std::log(Evaluate<double>(L, x).heads[0].p(i, j) / p0(i, j));
      const double certified = std::log(r_hi(i, j) / p0(i, j));
      EXPECT_GE(certified, reached * (1 - 1e-6)) << "case " << t;
      EXPECT_LE(certified, 1.02 * reached) << "case " << t << " (" << i << "," << j << ") kind "
                                          << AttentionKindToString(L.kind);
      ++checked;
    }
  }
  EXPECT_GE(checked, 50);
}

}  // namespace
}  // namespace lipcert
