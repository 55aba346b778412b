// The attention's own displacement bound (certify/attention_displacement.h) and the post-LN
// cover of Y built on it (certify/post_ln_y_cover.h): each dominates MPFR evaluations of what it
// bounds at random points of the set and at points where one token takes the whole radius;
// the softmax total-variation bound is attained by its two-level extremal rows, the value
// path's bound by aligned moves, and the centred norm's lower bound comes within 0.8 of the
// sampled minimum, so each fails at 0.8 times its value.
#include "certify/attention_displacement.h"

#include <gtest/gtest.h>
#include <mpreal.h>

#include <random>
#include <unsupported/Eigen/MPRealSupport>

#include "certify/post_ln_y_cover.h"
#include "models/forward.h"
#include "tests/certify/test_util.h"
#include "tests/common/test_scale.h"

namespace lipcert {

namespace {

using mpfr::mpreal;
using M = Eigen::Matrix<mpreal, Eigen::Dynamic, Eigen::Dynamic>;
using testing_util::RandomPostLn;
using testing_util::RandomSet;
using testing_util::SamplePoint;

// Dominates values rounded to nearest from 256-bit MPFR.
constexpr double kSlack = 1 + 1e-13;

Eigen::MatrixXd MhaMp(const AttentionLayer& mha, const Eigen::MatrixXd& x) {
  const M out = Forward<mpreal>(mha, M(x.cast<mpreal>()));
  Eigen::MatrixXd d(out.rows(), out.cols());
  for (Eigen::Index r = 0; r < out.rows(); ++r)
    for (Eigen::Index k = 0; k < out.cols(); ++k) d(r, k) = out(r, k).toDouble();
  return d;
}

// Points of the set: random ones, on its boundary, and (balls) one token moved by the whole radius.
std::vector<Eigen::MatrixXd> PointsOf(std::mt19937_64& rng, const InputSet& set, int samples) {
  std::vector<Eigen::MatrixXd> pts;
  std::normal_distribution<double> gauss(0.0, 1.0);
  for (int s = 0; s < samples; ++s) {
    pts.push_back(SamplePoint(rng, set, s % 2 == 0));
    if (set.kind != SetKind::kBall) continue;
    Eigen::MatrixXd x = set.center;
    const int i = int(rng() % uint64_t(set.tokens()));
    Eigen::RowVectorXd step(set.width());
    for (int a = 0; a < set.width(); ++a) step(a) = gauss(rng);
    x.row(i) += set.radius * step / step.norm();
    pts.push_back(x);
  }
  return pts;
}

TEST(SoftmaxTotalVariation, DominatesRandomRowsAndItsExtremalRowAttainsIt) {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> gauss(0.0, 1.0);
  long checked = 0;
  for (long c = 0; c < testing::Count(400); ++c) {
    const int n = 2 + int(c % 5);
    Eigen::VectorXd s0(n), ds(n);
    for (int j = 0; j < n; ++j) s0(j) = 3 * gauss(rng), ds(j) = (1 + c % 4) * gauss(rng);
    const auto softmax = [](const Eigen::VectorXd& s) {
      const Eigen::VectorXd e = (s.array() - s.maxCoeff()).exp();
      return Eigen::VectorXd(e / e.sum());
    };
    const double tv = 0.5 * (softmax(s0 + ds) - softmax(s0)).cwiseAbs().sum();
    EXPECT_LE(tv, SoftmaxTotalVariationUp(ds.maxCoeff() - ds.minCoeff()) * kSlack) << "case " << c;
    ++checked;
  }
  EXPECT_EQ(checked, testing::Count(400));
  // Two groups, mass t = 1 / (1 + e^{w/2}) on the one whose logits rise by w: TV = tanh(w / 4).
  for (const double w : {0.01, 0.5, 2.0, 8.0}) {
    const double t = 1 / (1 + std::exp(w / 2));
    const double p_up = t * std::exp(w) / (t * std::exp(w) + 1 - t);
    const double tv = p_up - t;
    EXPECT_GE(tv, 0.999999 * SoftmaxTotalVariationUp(w)) << "w " << w;
  }
  EXPECT_EQ(SoftmaxTotalVariationUp(0.0), 0.0);
  EXPECT_EQ(SoftmaxTotalVariationUp(kInf), 1.0);
}

TEST(AttentionDisplacement, DominatesMpfrMovesAndMovesAlongDirections) {
  std::mt19937_64 rng(12);
  std::normal_distribution<double> gauss(0.0, 1.0);
  long checked = 0;
  double best = 0;  // the largest sampled move over its bound
  for (int c = 0; c < int(testing::Count(24)); ++c) {
    const AttentionLayer mha = RandomPostLn(c, rng).WithoutPostLayerNorm();
    const InputSet set = RandomSet(rng, 2 + c % 3, mha.d_model);
    const TokenCover cover = CoverOf(set);
    Eigen::MatrixXd w(set.tokens(), mha.d_model);
    for (Eigen::Index i = 0; i < w.rows(); ++i)
      for (Eigen::Index a = 0; a < w.cols(); ++a) w(i, a) = gauss(rng);
    const IntervalMatrix dirs = IntervalMatrix::Point(w);
    const AttentionDisplacement d = AttentionDisplacementOver(mha, cover, &dirs);
    const Eigen::MatrixXd m0 = MhaMp(mha, set.center);
    for (const Eigen::MatrixXd& x : PointsOf(rng, set, 12)) {
      const Eigen::MatrixXd dm = MhaMp(mha, x) - m0;
      for (Eigen::Index i = 0; i < dm.rows(); ++i) {
        EXPECT_LE(dm.row(i).norm(), d.norm(i) * kSlack) << "case " << c << " token " << i;
        EXPECT_LE(std::fabs(dm.row(i).dot(w.row(i))), d.along(i) * kSlack) << "case " << c << " token " << i;
        if (d.norm(i) > 0) best = std::max(best, dm.row(i).norm() / d.norm(i));
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
  EXPECT_GT(best, 0.05);  // not vacuous on these small layers
}

// Without logits (Wq = Wk = 0, no biases) the weights are uniform and fixed: every token moving
// by r along the value path's top singular vector moves each output by exactly ||Wo Wv|| r.
TEST(AttentionDisplacement, ValuePathIsAttainedByAlignedMoves) {
  std::mt19937_64 rng(13);
  long checked = 0;
  for (int c = 0; c < int(testing::Count(8)); ++c) {
    RandomLayerSpec spec;
    spec.d = 3 + c % 3;
    spec.heads = 1;
    spec.dk = 2;
    AttentionLayer mha = RandomAttentionLayer(spec, rng);
    mha.wq.setZero();
    mha.wk.setZero();
    const int n = 3;
    InputSet set;
    set.kind = SetKind::kTokens;
    set.center = Eigen::MatrixXd::Random(n, spec.d);
    set.radius = 0.3;
    const Eigen::VectorXd bound = AttentionDisplacementUp(mha, CoverOf(set));
    const Eigen::MatrixXd w = mha.wo * mha.wv;
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(w, Eigen::ComputeFullV);
    Eigen::MatrixXd x = set.center;
    for (int j = 0; j < n; ++j) x.row(j) += set.radius * svd.matrixV().col(0).transpose();
    const Eigen::MatrixXd dm = MhaMp(mha, x) - MhaMp(mha, set.center);
    for (int i = 0; i < n; ++i) {
      EXPECT_LE(dm.row(i).norm(), bound(i) * kSlack);
      EXPECT_GE(dm.row(i).norm(), 0.999999 * bound(i)) << "case " << c << " token " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * testing::Count(8));
}

TEST(PostLnYCover, CoversYAndBoundsEachTokensCentredNormFromBelow) {
  std::mt19937_64 rng(14);
  long checked = 0, helped = 0;
  double best = 0;  // the largest centred_lo over the sampled minimum
  for (int c = 0; c < int(testing::Count(24)); ++c) {
    const AttentionLayer L = RandomPostLn(c, rng);
    const AttentionLayer mha = L.WithoutPostLayerNorm();
    const InputSet set = RandomSet(rng, 2 + c % 3, L.d_model);
    const TokenCover cover = CoverOf(set);
    const TokenCover y = PostLnYCover(L, cover, Eigen::VectorXd::Constant(set.tokens(), kInf));
    ASSERT_EQ(y.centred_lo.size(), set.tokens());
    Eigen::VectorXd seen = Eigen::VectorXd::Constant(set.tokens(), kInf);
    for (const Eigen::MatrixXd& x : PointsOf(rng, set, 12)) {
      const Eigen::MatrixXd yx = x + MhaMp(mha, x);
      for (Eigen::Index i = 0; i < yx.rows(); ++i) {
        const Eigen::RowVectorXd ci = yx.row(i).array() - yx.row(i).mean();
        EXPECT_LE((yx.row(i) - y.center.row(i)).norm(), y.radius(i) * kSlack) << "case " << c << " token " << i;
        EXPECT_GE(ci.norm() * kSlack, y.centred_lo(i)) << "case " << c << " token " << i;
        seen(i) = std::min(seen(i), ci.norm());
        ++checked;
      }
    }
    for (Eigen::Index i = 0; i < set.tokens(); ++i) {
      const Eigen::RowVectorXd c0 = y.center.row(i).array() - y.center.row(i).mean();
      if (y.centred_lo(i) > c0.norm() - y.radius(i)) ++helped;
      if (seen(i) > 0) best = std::max(best, y.centred_lo(i) / seen(i));
    }
  }
  EXPECT_GT(checked, 100);
  EXPECT_GT(helped, 0);   // the sideways bound beats the ball's somewhere
  EXPECT_GT(best, 0.8);   // and 1.25 times it would fail
}

}  // namespace

}  // namespace lipcert
