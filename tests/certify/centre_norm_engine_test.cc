// The centre_norm engine's crude ||J_M(z0)|| for the pre-LN sublayer
// (CrudeMhaNormWhereNegligible, certify/centre_norm_engine.h).
#include "certify/centre_norm_engine.h"

#include <gtest/gtest.h>

#include <Eigen/SVD>
#include <cmath>
#include <random>

#include "certify/closed_form.h"
#include "certify/dense_jacobian.h"
#include "certify/token_cover.h"
#include "tests/certify/test_util.h"

namespace lipcert {
namespace {

using testing_util::MpMat;
using testing_util::TestScale;
using testing_util::ToMp;

// ||J_M(z0)||_p in MPFR (256 bits), J_M MHA's Jacobian (no LayerNorm, no residual) at the
// exact z0 = LN(x0); the norm taken in double (relative error ~1e-15).
double MhaNormAtLnOfCentreMp(const AttentionLayer& L, const Eigen::MatrixXd& x0, NormKind p) {
  AttentionLayer bare = L;
  bare.layer_norm.reset();
  detail::LayerNormState<mpfr::mpreal> st;
  const MpMat z0 = detail::LayerNormForward(*L.layer_norm, ToMp(x0), &st);
  const MpMat j = DenseJacobian<mpfr::mpreal>(bare, z0);
  Eigen::MatrixXd jd(j.rows(), j.cols());
  for (Eigen::Index r = 0; r < j.rows(); ++r)
    for (Eigen::Index c = 0; c < j.cols(); ++c) jd(r, c) = j(r, c).toDouble();
  if (p == NormKind::kLinf) return jd.cwiseAbs().rowwise().sum().maxCoeff();
  return Eigen::JacobiSVD<Eigen::MatrixXd>(jd).singularValues()(0);
}

// The point set {x0} of a random pre-LN dot-product sublayer: with the point set's own
// LayerNorm variation (the rounding of sigma) the crude bound applies, is Castin's closed
// form over the z-cover (times sqrt(N D) in the inf norm) and is >= the MPFR ||J_M(z0)||_p.
// It declines (+inf) once the variation times it passes kNegligibleLnVariation of the
// centre norm (just past the threshold, and over a ball of relative radius 1e-3 with that
// ball's own variation), and for causal or L2 attention whatever the variation.
TEST(CentreNormEngineTest, CrudeMhaNormBoundsTheMpfrNormWhereNegligibleAndDeclinesElsewhere) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(3601);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const int cases = int(40 * TestScale());
  int applied = 0, declined_past_threshold = 0, declined_on_ball = 0, declined_kind = 0;
  for (int t = 0; t < cases; ++t) {
    RandomLayerSpec spec;
    spec.kind = AttentionKind::kDot;
    spec.biases = t % 2 == 0;
    spec.layer_norm = true;
    spec.d = 2 + t % 4;
    spec.heads = 1 + t % 2;
    spec.dk = 1 + t % 3;
    spec.qk_scale = 0.5 + 0.5 * (t % 4);
    const AttentionLayer L = RandomAttentionLayer(spec, rng);
    const int n = 1 + t % 4;
    Eigen::MatrixXd x0(n, L.d_model);
    for (Eigen::Index e = 0; e < x0.size(); ++e) x0.data()[e] = 1.5 * gauss(rng);
    const TokenCover point{x0, Eigen::VectorXd::Zero(n), UpperBound(0.0)};
    for (NormKind p : {NormKind::kL2, NormKind::kLinf}) {
      SCOPED_TRACE("case " + std::to_string(t) + (p == NormKind::kL2 ? " norm 2" : " norm inf"));
      const MhaInput in = MhaInputOver(L, point, p);
      const double exact = MhaNormAtLnOfCentreMp(L, x0, p);
      ASSERT_GT(exact, 0);
      const double castin = CastinMhaUpperBound(L, TokenCover{in.zc, in.rho_z, UpperBound(in.joint_z), {}}).value();
      ASSERT_TRUE(std::isfinite(castin));
      const double expected = p == NormKind::kLinf ? MulUp(castin, SqrtUp(double(in.zc.size()))) : castin;
      // The engine's own inputs: delta_ln in the norm p, and a centre norm of the order of
      // ||J_M(z0)|| (the sublayer's is within a factor of it on these layers).
      const double ln_delta_p =
          p == NormKind::kLinf ? MulUp(SqrtUp(double(L.d_model)), in.delta_ln.maxCoeff()) : in.delta_ln.maxCoeff();
      const UpperBound centre_norm(exact);
      ASSERT_LE(MulUp(expected, ln_delta_p), kNegligibleLnVariation * exact)
          << "the point set's LayerNorm variation " << ln_delta_p << " is not negligible";
      const UpperBound crude = CrudeMhaNormWhereNegligible(L, in, p, ln_delta_p, centre_norm);
      EXPECT_EQ(crude.value(), expected);
      EXPECT_GE(crude.value(), exact);
      applied += std::isfinite(crude.value()) && crude.value() >= exact;

      // Twice the largest variation it takes: declined.
      const double past = 2 * kNegligibleLnVariation * exact / expected;
      EXPECT_EQ(CrudeMhaNormWhereNegligible(L, in, p, past, centre_norm).value(), kInf);
      declined_past_threshold += CrudeMhaNormWhereNegligible(L, in, p, past, centre_norm).value() == kInf;

      // A ball of relative radius 1e-3 about x0: its LayerNorm variation is far from negligible.
      InputSet ball;
      ball.kind = SetKind::kBall;
      ball.center = x0;
      ball.radius = 1e-3 * x0.norm();
      const MhaInput in_ball = MhaInputOver(L, CoverOf(ball), p);
      const double ball_delta_p = p == NormKind::kLinf
                                      ? MulUp(SqrtUp(double(L.d_model)), in_ball.delta_ln.maxCoeff())
                                      : in_ball.delta_ln.maxCoeff();
      const UpperBound on_ball = CrudeMhaNormWhereNegligible(L, in_ball, p, ball_delta_p, centre_norm);
      EXPECT_EQ(on_ball.value(), kInf) << "ball variation " << ball_delta_p;
      declined_on_ball += on_ball.value() == kInf;

      // Causal and L2 attention: Castin's bound does not apply, even with no variation at all.
      AttentionLayer causal = L;
      causal.causal = true;
      AttentionLayer l2 = L;
      l2.kind = AttentionKind::kL2;
      l2.wk = l2.wq;
      l2.bq.resize(0);
      l2.bk.resize(0);
      const UpperBound causal_crude = CrudeMhaNormWhereNegligible(causal, MhaInputOver(causal, point, p), p, 0.0, centre_norm);
      const UpperBound l2_crude = CrudeMhaNormWhereNegligible(l2, MhaInputOver(l2, point, p), p, 0.0, centre_norm);
      EXPECT_EQ(causal_crude.value(), kInf);
      EXPECT_EQ(l2_crude.value(), kInf);
      declined_kind += causal_crude.value() == kInf && l2_crude.value() == kInf;
    }
  }
  EXPECT_EQ(applied, 2 * cases);
  EXPECT_EQ(declined_past_threshold, 2 * cases);
  EXPECT_EQ(declined_on_ball, 2 * cases);
  EXPECT_EQ(declined_kind, 2 * cases);
}

}  // namespace
}  // namespace lipcert
