// Per-head factor bounds: the softmax ranges of a cover contain the probabilities at the
// extreme points of the set and are first-order tight.
#include <gtest/gtest.h>

#include "certify/head_factors.h"

#include "certify/centre_norm.h"
#include "certify/input_set.h"
#include "certify/layer_norm_cover.h"
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
TEST(HeadFactorsLongTest, BallProbabilityRangesContainExtremePoints) {
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

// A random layer without LayerNorm, its query and key weights scaled by 1 to 4 for sharp
// softmax rows (l2: wk == wq).
AttentionLayer SharpLayerWithoutLayerNorm(std::mt19937_64& rng) {
  AttentionLayer L = RandomLayer(rng);
  L.layer_norm.reset();
  const double sharp = 1.0 + 3.0 * std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  L.wq *= sharp;
  L.wk *= sharp;
  return L;
}

// Points of the set: samples inside and on the boundary, and the whole radius on one token.
std::vector<Eigen::MatrixXd> CoverPoints(std::mt19937_64& rng, const InputSet& set, int samples) {
  std::normal_distribution<double> gauss(0.0, 1.0);
  std::vector<Eigen::MatrixXd> points;
  for (int s = 0; s < samples; ++s) points.push_back(SamplePoint(rng, set, s % 2 == 0));
  for (int a = 0; a < set.tokens(); ++a) {
    Eigen::MatrixXd d = Eigen::MatrixXd::Zero(set.tokens(), set.width());
    for (int c = 0; c < set.width(); ++c) d(a, c) = gauss(rng);
    points.push_back(set.Project(set.center + d * (set.radius / d.norm())));
  }
  return points;
}

// The factor bounds a_sup and b_sup (anchored at the centre's softmax weights, or the mean
// distances) hold at points of the set: ||sum_k P_ik (u_j - u_k)|| <= a_sup(i, j) and the
// same for the query's spread b (twice it for l2), with P in MPFR and u, b at the point.
TEST(HeadFactorsTest, ValueAndQuerySpreadsHoldOverTheSet) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(20261205);
  const int cases = int(60 * TestScale());
  int checked = 0, dot = 0, l2 = 0;
  for (int t = 0; t < cases; ++t) {
    const AttentionLayer L = SharpLayerWithoutLayerNorm(rng);
    InputSet set = RandomSet(rng, std::uniform_int_distribution<int>(2, 4)(rng), L.d_model);
    const int n = set.tokens();
    const MhaInput in = MhaInputOver(L, CoverOf(set), NormKind::kL2);
    (L.kind == AttentionKind::kDot ? dot : l2) += 1;
    for (int h = 0; h < L.heads; ++h) {
      const HeadGeometry G = HeadGeometryAt(L, h, in.zc, NormKind::kL2);
      const FactorBounds F = HeadFactorBounds(G, in.rho_z, in.joint_z, L.causal);
      for (const Eigen::MatrixXd& x : CoverPoints(rng, set, 4)) {
        const HeadGeometry at = HeadGeometryAt(L, h, x, NormKind::kL2);
        const MpMat p = Evaluate<mpfr::mpreal>(L, ToMp(x)).heads[h].p;
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < (L.causal ? i + 1 : n); ++j) {
            Eigen::VectorXd a = Eigen::VectorXd::Zero(L.d_model), b = Eigen::VectorXd::Zero(at.b.mid.cols());
            for (int k = 0; k < n; ++k) {
              a += p(i, k).toDouble() * (at.u.mid.row(j) - at.u.mid.row(k)).transpose();
              b += p(i, k).toDouble() * (at.b.mid.row(j) - at.b.mid.row(k)).transpose();
            }
            const double b_scale = G.dot ? 1.0 : 2.0;
            ASSERT_LE(a.norm(), F.a_sup(i, j) * (1 + 1e-9) + 1e-12) << "case " << t << " head " << h << " (" << i << "," << j << ")";
            ASSERT_LE(b_scale * b.norm(), F.b_sup(i, j) * (1 + 1e-9) + 1e-12) << "case " << t << " head " << h;
            ++checked;
          }
      }
    }
  }
  EXPECT_GT(checked, cases * 4);
  EXPECT_GT(dot, 0);
  EXPECT_GT(l2, 0);
}

// ValueQueryCovarianceUp bounds ||sum_k P_ik (u_k - ubar_i)(b_k - bbar_i)^T||_2 at points of
// the set (P in MPFR, dot layers with sharp rows, causal included; l2 heads get +inf). At the
// centre of a point set it is within 2x of the exact norm (Frobenius against spectral at rank
// <= 3), and it is below the magnitudes' sum sum_k P_ik ||a_ik|| ||b_ik|| on most rows.
TEST(HeadFactorsTest, ValueQueryCovarianceHoldsOverTheSet) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(20261206);
  const int cases = int(60 * TestScale());
  int checked = 0, tight = 0, below_sum = 0, rows = 0, l2 = 0;
  for (int t = 0; t < cases; ++t) {
    const AttentionLayer L = SharpLayerWithoutLayerNorm(rng);
    InputSet set = RandomSet(rng, std::uniform_int_distribution<int>(2, 4)(rng), L.d_model);
    if (t % 4 == 0) set.radius = 0;
    const int n = set.tokens();
    const MhaInput in = MhaInputOver(L, CoverOf(set), NormKind::kL2);
    for (int h = 0; h < L.heads; ++h) {
      const HeadGeometry G = HeadGeometryAt(L, h, in.zc, NormKind::kL2);
      const FactorBounds F = HeadFactorBounds(G, in.rho_z, in.joint_z, L.causal);
      if (L.kind != AttentionKind::kDot) {
        EXPECT_TRUE(std::isinf(ValueQueryCovarianceUp(G, F, in.rho_z, 0, L.causal ? 1 : n)));
        ++l2;
        continue;
      }
      Eigen::VectorXd bound(n);
      for (int i = 0; i < n; ++i) {
        const int len = L.causal ? i + 1 : n;
        bound(i) = ValueQueryCovarianceUp(G, F, in.rho_z, i, len);
        ASSERT_TRUE(std::isfinite(bound(i))) << "case " << t;
        Eigen::VectorXd ab(len);
        for (int j = 0; j < len; ++j) ab(j) = F.a_sup(i, j) * F.b_sup(i, j);
        below_sum += bound(i) < SimplexWeightedSumUp(F.p_hi.row(i).transpose(), ab, len);
        ++rows;
      }
      std::vector<Eigen::MatrixXd> points = CoverPoints(rng, set, 4);
      points.push_back(set.center);
      for (const Eigen::MatrixXd& x : points) {
        const HeadGeometry at = HeadGeometryAt(L, h, x, NormKind::kL2);
        const MpMat p = Evaluate<mpfr::mpreal>(L, ToMp(x)).heads[h].p;
        for (int i = 0; i < n; ++i) {
          const int len = L.causal ? i + 1 : n;
          Eigen::RowVectorXd ubar = Eigen::RowVectorXd::Zero(at.u.mid.cols()), bbar = Eigen::RowVectorXd::Zero(at.b.mid.cols());
          for (int k = 0; k < len; ++k) {
            ubar += p(i, k).toDouble() * at.u.mid.row(k);
            bbar += p(i, k).toDouble() * at.b.mid.row(k);
          }
          Eigen::MatrixXd c = Eigen::MatrixXd::Zero(at.u.mid.cols(), at.b.mid.cols());
          for (int k = 0; k < len; ++k)
            c += p(i, k).toDouble() * (at.u.mid.row(k) - ubar).transpose() * (at.b.mid.row(k) - bbar);
          const double exact = Eigen::JacobiSVD<Eigen::MatrixXd>(c).singularValues()(0);
          ASSERT_LE(exact, bound(i) * (1 + 1e-9) + 1e-12) << "case " << t << " head " << h << " row " << i;
          if (set.radius == 0) tight += bound(i) <= 2 * exact + 1e-9;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, cases);
  EXPECT_GT(l2, 0);
  EXPECT_GT(tight, checked / 40);    // the point sets' rows (a quarter of the cases, one point in five)
  EXPECT_GT(below_sum, rows / 4);
}

// d^2/ds^2 f(X + s U) at s = 0 in MPFR (256 bits): the central second difference with a step
// of 1e-20, whose truncation error (~1e-40) and rounding (2^-256 |f| / 1e-40) are far below
// the tolerances here.
Eigen::MatrixXd SecondDerivativeMp(const AttentionLayer& L, const Eigen::MatrixXd& x, const Eigen::MatrixXd& u) {
  const mpfr::mpreal step("1e-20");
  const MpMat xm = ToMp(x), um = ToMp(u);
  const MpMat f0 = Forward<mpfr::mpreal>(L, xm);
  const MpMat fp = Forward<mpfr::mpreal>(L, MpMat(xm + step * um)), fm = Forward<mpfr::mpreal>(L, MpMat(xm - step * um));
  const MpMat d2 = (fp - 2 * f0 + fm) / (step * step);
  Eigen::MatrixXd out(d2.rows(), d2.cols());
  for (Eigen::Index r = 0; r < d2.rows(); ++r)
    for (Eigen::Index c = 0; c < d2.cols(); ++c) out(r, c) = d2(r, c).toDouble();
  return out;
}

// Every head's geometry, factor bounds and split second-order terms of `layer` over the
// cover of `in`, as the engines build them: what the second-order tests start from.
struct SplitHeads {
  std::vector<HeadGeometry> geo;
  std::vector<FactorBounds> factors;
  std::vector<SecondOrderSplitHead> heads;
};

SplitHeads SplitHeadsOf(const AttentionLayer& layer, const MhaInput& in) {
  SplitHeads s;
  for (int h = 0; h < layer.heads; ++h) {
    s.geo.push_back(HeadGeometryAt(layer, h, in.zc, NormKind::kL2));
    s.factors.push_back(HeadFactorBounds(s.geo.back(), in.rho_z, in.joint_z, layer.causal));
    s.heads.push_back(SecondOrderSplitHeadUp(s.geo.back(), s.factors.back(), in.rho_z, layer.causal));
  }
  return s;
}

// The second derivative with the pair terms apart (SecondOrderSplitHeadUp), summed over
// heads, bounds ||d^2 f(X)[U, U]||_F for unit U at every point X of the set, dot and l2
// layers with sharp softmax rows, causal masks included: U random, on one token, and on
// two tokens (where the pair terms live). It is within 10x of a sampled direction on
// some point sets (radius 0), so it is not vacuous. The same with the moving token's own
// row as one form over the heads (OwnRowUp, as the engines use it), which
// is never above the plain bound and below it on some cases.
TEST(HeadFactorsTest, SplitSecondOrderBoundsTheSecondDerivative) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(20261206);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const int cases = int(50 * TestScale());
  int checked = 0, within_10x = 0, dot = 0, l2 = 0, causal = 0, refined = 0;
  for (int t = 0; t < cases; ++t) {
    const AttentionLayer L = SharpLayerWithoutLayerNorm(rng);
    InputSet set = RandomSet(rng, std::uniform_int_distribution<int>(2, 4)(rng), L.d_model);
    if (t % 4 == 0) set.radius = 0;
    const int n = set.tokens();
    (L.kind == AttentionKind::kDot ? dot : l2) += 1;
    causal += L.causal;
    const MhaInput in = MhaInputOver(L, CoverOf(set), NormKind::kL2);
    const auto [geo, factors, heads] = SplitHeadsOf(L, in);
    // With the moving token's own query spread as one form over the heads (the engines' way);
    // never above the plain one.
    const double plain = SecondOrderSplitColumnsUp(heads);
    const auto own_row = [&](int j, int threads) { return OwnRowUp(geo, factors, in.rho_z, L.causal, j, threads); };
    const double bound = SecondOrderSplitColumnsUp(heads, own_row);
    ASSERT_TRUE(std::isfinite(bound)) << "case " << t;
    // Two columns refined at a time: the same bound.
    EXPECT_EQ(SecondOrderSplitColumnsUp(heads, own_row, std::chrono::steady_clock::time_point::max(), 2), bound)
        << "case " << t;
    EXPECT_LE(bound, plain) << "case " << t;
    refined += bound < plain;
    std::vector<Eigen::MatrixXd> points = set.radius == 0 ? std::vector<Eigen::MatrixXd>{set.center} : CoverPoints(rng, set, 2);
    double best = 0;
    for (const Eigen::MatrixXd& x : points) {
      std::vector<Eigen::MatrixXd> dirs;
      for (int s = 0; s < 3; ++s) {
        Eigen::MatrixXd u(n, L.d_model);
        for (Eigen::Index e = 0; e < u.size(); ++e) u.data()[e] = gauss(rng);
        // s = 0: every token moves; s = 1: token a alone; s = 2: tokens a and b.
        const int a = int(rng() % n), b = (a + 1) % n;
        for (int r = 0; r < n; ++r)
          if ((s == 1 && r != a) || (s == 2 && r != a && r != b)) u.row(r).setZero();
        dirs.push_back(u / u.norm());
      }
      for (const Eigen::MatrixXd& u : dirs) {
        const double d2 = SecondDerivativeMp(L, x, u).norm();
        EXPECT_LE(d2 * (1 - 1e-9), bound + 1e-25) << "case " << t;  // 1e-25: the difference's rounding
        best = std::max(best, d2);
        ++checked;
      }
    }
    within_10x += set.radius == 0 && best * 10 >= bound;
  }
  EXPECT_GT(checked, cases * 3);
  EXPECT_GT(within_10x, 0);
  EXPECT_GT(dot, 0);
  EXPECT_GT(l2, 0);
  EXPECT_GT(causal, 0);
  EXPECT_GT(refined, 0);
}

// The heads apart (the engines' stacked route): with Wo = I the heads write to their own
// coordinates, so ||d^2 f|| <= ||Wo|| times the stacked bound of that layer
// (SecondOrderSplitColumnsUp(..., stacked = true), own rows refined by OwnRowUp there).
// Dot layers with sharp rows, values redrawn to fill D (H dv = D), causal masks included:
// above the MPFR second derivative of the layer itself at points of the set, the same for
// 1 and 2 threads, and below the summed bound on some cases.
TEST(HeadFactorsTest, StackedSecondOrderBoundsTheSecondDerivative) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(20261208);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const int cases = int(60 * TestScale());
  int checked = 0, below_summed = 0, causal = 0, layers = 0;
  double closest = kInf;  // the smallest bound / sampled worst
  for (int t = 0; t < cases; ++t) {
    AttentionLayer L = SharpLayerWithoutLayerNorm(rng);
    if (L.kind != AttentionKind::kDot || L.d_model % L.heads != 0) continue;
    // The value side redrawn with dv = D / H.
    const int d = L.d_model;
    L.head_dim_v = d / L.heads;
    L.wv = Eigen::MatrixXd(d, d);
    L.wo = Eigen::MatrixXd(d, d);
    // Wo scaled by 2 to 6: the factor ||Wo|| is well above the bound's slack.
    const double wo_scale = std::uniform_real_distribution<double>(2.0, 6.0)(rng);
    for (Eigen::Index e = 0; e < L.wv.size(); ++e) L.wv.data()[e] = gauss(rng) / std::sqrt(double(d));
    for (Eigen::Index e = 0; e < L.wo.size(); ++e) L.wo.data()[e] = wo_scale * gauss(rng) / std::sqrt(double(d));
    if (L.bv.size()) L.bv = 0.1 * Eigen::VectorXd::NullaryExpr(d, [&] { return gauss(rng); });
    ++layers;
    causal += L.causal;
    InputSet set = RandomSet(rng, std::uniform_int_distribution<int>(2, 4)(rng), d);
    if (t % 4 == 0) set.radius = 0;
    const int n = set.tokens();
    AttentionLayer own = L;
    own.wo = Eigen::MatrixXd::Identity(d, d);
    if (own.bo.size()) own.bo.setZero();
    const MhaInput in = MhaInputOver(L, CoverOf(set), NormKind::kL2);
    const auto [geo, factors, heads] = SplitHeadsOf(own, in);  // the heads apart (Wo = I)
    const std::vector<SecondOrderSplitHead> summed = SplitHeadsOf(L, in).heads;
    const double wo = NormL2UpperGram(L.wo, 1).value();
    const auto own_row = [&](int j, int threads) { return OwnRowUp(geo, factors, in.rho_z, L.causal, j, threads); };
    const auto never = std::chrono::steady_clock::time_point::max();
    const double stacked = SecondOrderSplitColumnsUp(heads, own_row, never, 1, true);
    ASSERT_TRUE(std::isfinite(stacked)) << "case " << t;
    EXPECT_EQ(SecondOrderSplitColumnsUp(heads, own_row, never, 2, true), stacked) << "case " << t;
    EXPECT_LE(stacked, SecondOrderSplitColumnsUp(heads, nullptr, never, 1, true)) << "case " << t;
    const double bound = MulUp(wo, stacked);
    below_summed += bound < SecondOrderSplitColumnsUp(summed);
    std::vector<Eigen::MatrixXd> points = set.radius == 0 ? std::vector<Eigen::MatrixXd>{set.center} : CoverPoints(rng, set, 2);
    double best = 0;
    for (const Eigen::MatrixXd& x : points)
      for (int k = 0; k < 3; ++k) {
        Eigen::MatrixXd u(n, d);
        for (Eigen::Index e = 0; e < u.size(); ++e) u.data()[e] = gauss(rng);
        const int a = int(rng() % n), b = (a + 1) % n;  // k = 0: all tokens; 1: token a; 2: tokens a and b
        for (int r = 0; r < n; ++r)
          if ((k == 1 && r != a) || (k == 2 && r != a && r != b)) u.row(r).setZero();
        u /= u.norm();
        const double d2 = SecondDerivativeMp(L, x, u).norm();
        EXPECT_LE(d2 * (1 - 1e-9), bound + 1e-25) << "case " << t;
        best = std::max(best, d2);
        ++checked;
      }
    closest = std::min(closest, bound / best);
  }
  RecordProperty("closest", std::to_string(closest));
  EXPECT_GT(layers, cases / 8);
  EXPECT_GT(checked, 3 * layers);
  EXPECT_GT(below_summed, 0);
  EXPECT_GT(causal, 0);
  EXPECT_LT(closest, 3.0);  // within 3x of a sampled direction somewhere: not vacuous
  RecordProperty("layers", std::to_string(layers));
  RecordProperty("below_summed", std::to_string(below_summed));
}

// The moving token's own row as one form over the heads (OwnRowUp) bounds row j of
// d^2 f(X)[U, U] for U on token j alone, at points of the set, dot layers with sharp rows
// (causal included): U random, and U the top eigenvector of the stacked forms (the
// direction where the form is largest). The form is within 10x of the row's sampled
// worst on some cases, and below the heads' scalar lin(j, j) summed on some.
TEST(HeadFactorsTest, OwnRowFormBoundsTheMovingTokensRow) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(20261207);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const int cases = int(40 * TestScale());
  int checked = 0, within_10x = 0, causal = 0, below_scalar = 0, dot_cases = 0;
  for (int t = 0; t < cases; ++t) {
    AttentionLayer L = SharpLayerWithoutLayerNorm(rng);
    if (L.kind != AttentionKind::kDot) continue;  // l2 heads have no form (+inf)
    ++dot_cases;
    causal += L.causal;
    InputSet set = RandomSet(rng, std::uniform_int_distribution<int>(2, 4)(rng), L.d_model);
    if (t % 3 == 0) set.radius = 0;
    const int n = set.tokens();
    const MhaInput in = MhaInputOver(L, CoverOf(set), NormKind::kL2);
    const auto [geo, factors, heads] = SplitHeadsOf(L, in);
    Eigen::MatrixXd lin = Eigen::MatrixXd::Zero(n, n);
    for (const SecondOrderSplitHead& head : heads) lin += head.lin;
    const int j = int(rng() % n);
    const double bound = OwnRowUp(geo, factors, in.rho_z, L.causal, j, 1);
    ASSERT_TRUE(std::isfinite(bound)) << "case " << t;
    below_scalar += bound < lin(j, j);
    // The stacked forms' top direction.
    Eigen::MatrixXd gram = Eigen::MatrixXd::Zero(L.d_model, L.d_model);
    for (int h = 0; h < L.heads; ++h) {
      const OwnRowForm f = OwnRowFormUp(geo[h], factors[h], in.rho_z, L.causal, j);
      gram += f.rows.transpose() * f.rows + f.value_weight * geo[h].value_gram.mid + f.q_weight * geo[h].wq_gram.mid +
              f.k_weight * geo[h].wk_gram.mid;
    }
    const Eigen::VectorXd top = Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(gram).eigenvectors().col(L.d_model - 1);
    std::vector<Eigen::MatrixXd> points = set.radius == 0 ? std::vector<Eigen::MatrixXd>{set.center} : CoverPoints(rng, set, 2);
    double best = 0;
    for (const Eigen::MatrixXd& x : points)
      for (int s = 0; s < 3; ++s) {
        Eigen::MatrixXd u = Eigen::MatrixXd::Zero(n, L.d_model);
        if (s == 0) {
          u.row(j) = top.transpose();
        } else {
          for (int c = 0; c < L.d_model; ++c) u(j, c) = gauss(rng);
          u /= u.norm();
        }
        const double d2 = SecondDerivativeMp(L, x, u).row(j).norm();
        EXPECT_LE(d2 * (1 - 1e-9), bound + 1e-25) << "case " << t << " token " << j;
        best = std::max(best, d2);
        ++checked;
      }
    within_10x += best * 10 >= bound;
  }
  EXPECT_GT(dot_cases, cases / 4);
  EXPECT_GT(checked, dot_cases * 3);
  EXPECT_GT(within_10x, 0);
  EXPECT_GT(causal, 0);
  EXPECT_GT(below_scalar, 0);
}

}  // namespace
}  // namespace lipcert
