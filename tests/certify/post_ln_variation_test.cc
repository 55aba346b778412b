// The post-LN sublayer's own variation (certify/post_ln_variation.h): the bound dominates MPFR
// Jacobian norms of LN(X + MHA(X)) at random and searched points of the set (norms 2 and inf),
// each of its terms dominates the quantity it bounds, and each fails its check at 0.8 times its
// value (the centre and ||D_i(yc_i)|| are exact; the LayerNorm variation is attained where the
// ball reaches a constant row); the inf norm at a point is exact from both sides.
#include "certify/post_ln_variation.h"

#include <gtest/gtest.h>
#include <mpreal.h>

#include <random>
#include <unsupported/Eigen/MPRealSupport>

#include "certify/centred_engine.h"
#include "certify/pipeline.h"
#include "certify/post_layer_norm.h"
#include "certify/post_ln_inf.h"
#include "certify/search.h"
#include "models/forward.h"
#include "models/random_layer.h"
#include "tests/certify/test_util.h"
#include "tests/common/test_scale.h"

namespace lipcert {

namespace {

using mpfr::mpreal;
using M = Eigen::Matrix<mpreal, Eigen::Dynamic, Eigen::Dynamic>;

using testing_util::RandomPostLn;

Eigen::MatrixXd ToDouble(const M& m) {
  Eigen::MatrixXd d(m.rows(), m.cols());
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index k = 0; k < m.cols(); ++k) d(r, k) = m(r, k).toDouble();
  return d;
}

// J of the layer at x, formed in MPFR (256 bits), rounded to double.
Eigen::MatrixXd JacobianMp(const AttentionLayer& L, const Eigen::MatrixXd& x) {
  return ToDouble(DenseJacobian<mpreal>(L, M(x.cast<mpreal>())));
}
double Sigma1(const Eigen::MatrixXd& j) { return Eigen::JacobiSVD<Eigen::MatrixXd>(j).singularValues()(0); }
double RowSumMax(const Eigen::MatrixXd& j) { return j.cwiseAbs().rowwise().sum().maxCoeff(); }
double NormOf(const Eigen::MatrixXd& j, NormKind p) { return p == NormKind::kL2 ? Sigma1(j) : RowSumMax(j); }

// J_LN(y) for one row, in MPFR: diag(gamma) (I - 11^T/D - yhat yhat^T / D) / sigma.
Eigen::MatrixXd LayerNormJacobianMp(const LayerNormParams& ln, const Eigen::RowVectorXd& y) {
  const int d = int(y.size());
  mpreal mean = 0;
  for (int a = 0; a < d; ++a) mean += mpreal(y(a));
  mean /= d;
  std::vector<mpreal> c(d);
  mpreal var = 0;
  for (int a = 0; a < d; ++a) c[a] = mpreal(y(a)) - mean, var += c[a] * c[a];
  const mpreal sigma = mpfr::sqrt(var / d + mpreal(ln.eps));
  M j(d, d);
  for (int a = 0; a < d; ++a)
    for (int b = 0; b < d; ++b)
      j(a, b) = mpreal(ln.gamma(a)) * ((a == b ? mpreal(1) : mpreal(0)) - mpreal(1) / d - c[a] * c[b] / (sigma * sigma * d)) / sigma;
  return ToDouble(j);
}

Eigen::MatrixXd RandomPointIn(const InputSet& set, std::mt19937_64& rng, double fraction) {
  std::normal_distribution<double> g;
  Eigen::MatrixXd dx = Eigen::MatrixXd::NullaryExpr(set.center.rows(), set.center.cols(), [&] { return g(rng); });
  return set.Project(set.center + set.radius * fraction * dx / dx.norm());
}

// The variation's inputs for the layer over the set, filled as the candidate fills them, with
// MHA's pieces from its centre_norm engine.
PostLnVariationInputs InputsFor(const AttentionLayer& L, const InputSet& set, NormKind p, long dense_limit = 1L << 30) {
  const TokenCover cover = CoverOf(set);
  const AttentionLayer mha = L.WithoutPostLayerNorm();
  const MhaPieces m2 = MhaPiecesOver(mha, cover, NormKind::kL2, 1);
  const MhaPieces mp = p == NormKind::kL2 ? m2 : MhaPiecesOver(mha, cover, p, 1);
  const UpperBound centre_l2 =
      p == NormKind::kL2 ? PostLnCentreBound(L, set.center, BoundOptions{}).terms.at(0).value : UpperBound(kInf);
  return PostLnVariationInputsFor(L, set, p, m2, mp, centre_l2, 1, std::chrono::steady_clock::time_point::max(),
                                  dense_limit);
}

struct SetCase {
  AttentionLayer layer;
  InputSet set;
};
SetCase RandomSetCase(long c, std::mt19937_64& rng, double log10_lo, double log10_hi) {
  std::normal_distribution<double> g;
  SetCase s;
  s.layer = RandomPostLn(int(c), rng);
  s.set.center = Eigen::MatrixXd::NullaryExpr(2 + c % 3, s.layer.d_model, [&] { return 2 * g(rng); });
  s.set.radius = std::pow(10.0, std::uniform_real_distribution<double>(log10_lo, log10_hi)(rng));
  return s;
}

// The bound dominates ||J_f(X)||_p (MPFR) at the centre, at random points inside and on the
// sphere, and each of its three terms dominates what it bounds there:
//   centre >= ||J_f(X0)|| up to the enclosure of Y0 (1e-6 relative),
//   max_i ||D_i(yc_i)|| V_M >= ||D(Yc)(J_M(X) - J_M(X0))||,
//   max_i delta_i (1 + U_M) >= ||(D(Y) - D(Yc))(I + J_M(X))||.
TEST(PostLnVariation, BoundAndTermsDominateMpfrAtRandomPoints) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(3601);
  const long cases = testing::Count(24);
  long checked = 0, points = 0;
  for (long c = 0; c < cases; ++c) {
    const NormKind p = c % 3 == 2 ? NormKind::kLinf : NormKind::kL2;
    const SetCase s = RandomSetCase(c, rng, -4, -1);
    const AttentionLayer& L = s.layer;
    const AttentionLayer mha = L.WithoutPostLayerNorm();
    const PostLnVariationInputs in = InputsFor(L, s.set, p);
    PostLnVariationReport rep;
    const EngineBound b = PostLnVariationBound(L, CoverOf(s.set), in, DefaultExpBackend(), &rep);
    ASSERT_TRUE(std::isfinite(b.upper.value())) << "case " << c << ": " << b.note;
    ASSERT_EQ(b.terms.size(), 3u);
    const int n = int(s.set.center.rows()), d = L.d_model;
    // D(Yc) and J_M(X0) in MPFR.
    Eigen::MatrixXd dyc = Eigen::MatrixXd::Zero(n * d, n * d);
    for (int i = 0; i < n; ++i)
      dyc.block(i * d, i * d, d, d) = LayerNormJacobianMp(*L.post_layer_norm, rep.y_cover.center.row(i));
    const Eigen::MatrixXd jm0 = JacobianMp(mha, s.set.center);
    const Eigen::MatrixXd eye = Eigen::MatrixXd::Identity(n * d, n * d);
    const double centre_true = NormOf(JacobianMp(L, s.set.center), p);
    EXPECT_GE(b.terms[0].value.value(), centre_true * (1 - 1e-6)) << "case " << c;
    for (int k = 0; k < 8; ++k) {
      const Eigen::MatrixXd x = k == 0 ? s.set.center : RandomPointIn(s.set, rng, k % 2 ? 1.0 : 0.5);
      const Eigen::MatrixXd jf = JacobianMp(L, x);
      EXPECT_LE(NormOf(jf, p), b.upper.value()) << "case " << c << " point " << k;
      const Eigen::MatrixXd jm = JacobianMp(mha, x);
      EXPECT_LE(NormOf(dyc * (jm - jm0), p), b.terms[1].value.value() * (1 + 1e-9)) << "case " << c << " point " << k;
      // D(Y) - D(Yc), the blocks at y = x + M(x).
      const Eigen::MatrixXd y = x + ToDouble(Forward<mpreal>(mha, M(x.cast<mpreal>())));
      Eigen::MatrixXd dy = Eigen::MatrixXd::Zero(n * d, n * d);
      for (int i = 0; i < n; ++i) dy.block(i * d, i * d, d, d) = LayerNormJacobianMp(*L.post_layer_norm, y.row(i));
      EXPECT_LE(NormOf((dy - dyc) * (eye + jm), p), b.terms[2].value.value() * (1 + 1e-9)) << "case " << c << " point " << k;
      ++points;
    }
    ++checked;
  }
  EXPECT_EQ(checked, cases);
  EXPECT_EQ(points, 8 * cases);
}

// The mutation checks: each term at 0.8 times its value fails the check above somewhere.
//   centre: 0.8 x centre < ||J_f(X0)||;
//   the MHA variation's factor max_i ||D_i(yc_i)|| is sigma_1 of the MPFR block to 1e-9, so
//     0.8 of it is below the block's norm;
//   the LayerNorm variation: on a ball around yc that reaches the constant row (c = 0), the
//     MPFR ||J_LN(y) - J_LN(yc)|| there is above 0.8 x LayerNormVariationUp.
TEST(PostLnVariation, EachTermFailsAtFourFifths) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(3602);
  const long cases = testing::Count(12);
  long centre_fails = 0, factor_fails = 0, ln_fails = 0;
  for (long c = 0; c < cases; ++c) {
    const SetCase s = RandomSetCase(c, rng, -3, -2);
    const AttentionLayer& L = s.layer;
    const PostLnVariationInputs in = InputsFor(L, s.set, NormKind::kL2);
    PostLnVariationReport rep;
    const EngineBound b = PostLnVariationBound(L, CoverOf(s.set), in, DefaultExpBackend(), &rep);
    ASSERT_TRUE(std::isfinite(b.upper.value()));
    if (0.8 * b.terms[0].value.value() < Sigma1(JacobianMp(L, s.set.center))) ++centre_fails;
    double block_max = 0;
    for (Eigen::Index i = 0; i < rep.y_cover.center.rows(); ++i)
      block_max = std::max(block_max, Sigma1(LayerNormJacobianMp(*L.post_layer_norm, rep.y_cover.center.row(i))));
    EXPECT_GE(rep.ln_centre.maxCoeff(), block_max);
    EXPECT_LE(rep.ln_centre.maxCoeff(), block_max * (1 + 1e-9));
    if (0.8 * rep.ln_centre.maxCoeff() < block_max) ++factor_fails;
    // A row yc and a ball through its constant projection: y = mean(yc) 1 is at distance ||c0||.
    const Eigen::RowVectorXd yc = rep.y_cover.center.row(0);
    const double s0 = (yc.array() - yc.mean()).matrix().norm();
    const double rho = s0 * 1.0000001;
    const double up = LayerNormVariationUp(*L.post_layer_norm, yc, rho);
    const Eigen::RowVectorXd flat = Eigen::RowVectorXd::Constant(yc.size(), yc.mean());
    const double at_flat = Sigma1(LayerNormJacobianMp(*L.post_layer_norm, flat) - LayerNormJacobianMp(*L.post_layer_norm, yc));
    EXPECT_LE(at_flat, up) << "case " << c;
    if (at_flat > 0.8 * up) ++ln_fails;
  }
  EXPECT_EQ(centre_fails, cases);
  EXPECT_EQ(factor_fails, cases);
  EXPECT_GT(ln_fails, cases / 2);
}

// A post-LN layer whose Wo is D x D (heads * dv = D), so that the heads before Wo apply.
AttentionLayer RandomSquareWoPostLn(long c, std::mt19937_64& rng) {
  RandomLayerSpec spec;
  spec.kind = c % 2 ? AttentionKind::kL2 : AttentionKind::kDot;
  spec.causal = c % 3 == 1;
  spec.biases = c % 4 != 3;
  spec.layer_norm = true;
  spec.heads = 1 + c % 2;
  spec.dk = 2 + (c / 2) % 2;
  spec.d = spec.heads * spec.dk;
  spec.qk_scale = 1 + c % 3;
  AttentionLayer L = RandomAttentionLayer(spec, rng);
  L.post_layer_norm = L.layer_norm;
  L.layer_norm.reset();
  // gamma far from uniform, as trained LayerNorms are: the factor D_i Wo then differs from
  // ||D_i|| ||Wo||.
  std::normal_distribution<double> g;
  for (Eigen::Index a = 0; a < L.post_layer_norm->gamma.size(); ++a)
    L.post_layer_norm->gamma(a) = std::exp(1.5 * g(rng));
  return L;
}

// A square-Wo post-LN layer and a ball around 2 + c % 3 Gaussian tokens of radius 10^U(lo, hi).
SetCase RandomSquareWoSetCase(long c, std::mt19937_64& rng, double log10_lo, double log10_hi) {
  std::normal_distribution<double> g;
  SetCase s;
  s.layer = RandomSquareWoPostLn(c, rng);
  s.set.center = Eigen::MatrixXd::NullaryExpr(2 + c % 3, s.layer.d_model, [&] { return 2 * g(rng); });
  s.set.radius = std::pow(10.0, std::uniform_real_distribution<double>(log10_lo, log10_hi)(rng));
  return s;
}

// The MHA variation through the heads before Wo, scale x V_H with scale = max_i ||D_i(yc_i) Wo|| / w_i
// and V_H >= sup ||diag(w)(J_H(X) - J_H(X0))|| (norm 2: w_i = ||D_i Wo|| / max_k ||D_k Wo||):
//   the identity D(Yc)(J_M(X) - J_M(X0)) = blockdiag(D_i(yc_i) Wo)(J_H(X) - J_H(X0)) in MPFR,
//   V_H >= ||diag(w)(J_H(X) - J_H(X0))|| and the term >= ||D(Yc)(J_M(X) - J_M(X0))|| at random points;
//   the factor: ||D_i Wo|| certified within 1e-9 (and 1e-12 absolute) of MPFR and scale within 1e-9 of the largest,
//   so 0.8 x scale is below it in every case; the term: at 0.8 x (V_H's own looseness divided
//   out, V_H / the largest witnessed ||diag(w)(J_H(X) - J_H(X0))||) it is below the witnessed
//   ||D(Yc)(J_M(X) - J_M(X0))|| in at least one case.
TEST(PostLnVariation, HeadsBeforeWoTermDominatesMpfrAndIsTight) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(3608);
  const long cases = testing::Count(16);
  long checked = 0, points = 0, factor_fails = 0, term_fails = 0, heads_won = 0;
  for (long c = 0; c < cases; ++c) {
    const NormKind p = c % 4 == 3 ? NormKind::kLinf : NormKind::kL2;
    const SetCase s = RandomSquareWoSetCase(c, rng, -4, -2);
    const AttentionLayer& L = s.layer;
    const InputSet& set = s.set;
    const AttentionLayer mha = L.WithoutPostLayerNorm(), heads = HeadsBeforeWo(mha);
    const PostLnVariationInputs in = InputsFor(L, set, p);
    ASSERT_TRUE(std::isfinite(in.heads_variation.value())) << "case " << c;
    const int n = int(set.center.rows()), d = L.d_model;
    ASSERT_EQ(in.heads_row_weights.size(), p == NormKind::kL2 ? n : 0) << "case " << c;
    const Eigen::VectorXd w = in.heads_row_weights.size() ? in.heads_row_weights : Eigen::VectorXd::Ones(n);
    PostLnVariationReport rep;
    const EngineBound b = PostLnVariationBound(L, CoverOf(set), in, DefaultExpBackend(), &rep);
    ASSERT_TRUE(std::isfinite(b.upper.value())) << "case " << c << ": " << b.note;
    ASSERT_TRUE(std::isfinite(rep.through_heads)) << "case " << c;
    EXPECT_EQ(b.terms.at(1).value.value(), std::min(rep.through_mha, rep.through_heads));
    if (rep.through_heads < rep.through_mha) ++heads_won;
    Eigen::MatrixXd dyc = Eigen::MatrixXd::Zero(n * d, n * d), dwo = dyc, wrows = dyc;
    double factor_max = 0;
    for (int i = 0; i < n; ++i) {
      const Eigen::MatrixXd di = LayerNormJacobianMp(*L.post_layer_norm, rep.y_cover.center.row(i));
      dyc.block(i * d, i * d, d, d) = di;
      dwo.block(i * d, i * d, d, d) = di * L.wo;  // rounded: compared at 1e-9 below
      wrows.block(i * d, i * d, d, d) = w(i) * Eigen::MatrixXd::Identity(d, d);
      const double f = NormOf(di * L.wo, p);
      factor_max = std::max(factor_max, f);
      EXPECT_GE(rep.ln_wo(i), f * (1 - 1e-12)) << "case " << c;
      EXPECT_LE(rep.ln_wo(i), f * (1 + 1e-9) + 1e-12) << "case " << c;  // the certificate's absolute floor
    }
    const double scale = rep.through_heads / in.heads_variation.value();
    EXPECT_LE(scale, factor_max * (1 + 1e-9) + 1e-12) << "case " << c;
    if (0.8 * scale < factor_max) ++factor_fails;
    const Eigen::MatrixXd jm0 = JacobianMp(mha, set.center), jh0 = JacobianMp(heads, set.center);
    double seen_heads = 0, seen_term = 0;
    for (int k = 0; k < 8; ++k) {
      const Eigen::MatrixXd x = RandomPointIn(set, rng, k % 2 ? 1.0 : 0.5);
      const Eigen::MatrixXd dm = dyc * (JacobianMp(mha, x) - jm0), dh = JacobianMp(heads, x) - jh0;
      EXPECT_LE((dm - dwo * dh).norm(), 1e-9 * (dm.norm() + 1e-300) + 1e-14) << "case " << c << " point " << k;
      const double weighted = NormOf(wrows * dh, p);
      seen_heads = std::max(seen_heads, weighted);
      seen_term = std::max(seen_term, NormOf(dm, p));
      EXPECT_LE(weighted, in.heads_variation.value() * (1 + 1e-9)) << "case " << c << " point " << k;
      EXPECT_LE(NormOf(dm, p), rep.through_heads * (1 + 1e-9)) << "case " << c << " point " << k;
      ++points;
    }
    if (seen_heads > 0 && 0.8 * scale * seen_heads < seen_term) ++term_fails;
    ++checked;
  }
  EXPECT_EQ(checked, cases);
  EXPECT_EQ(points, 8 * cases);
  EXPECT_EQ(factor_fails, cases);
  EXPECT_GT(term_fails, 0);
  std::printf("heads before Wo: the smaller MHA term in %ld of %ld cases; the term's 0.8 fails in %ld\n", heads_won,
              cases, term_fails);
}

// The LayerNorm term token by token (norm 2): weights w in [0, 1] with max 1, and at random
// points of the set
//   ln_rows_centre >= ||diag(w)(I + J_M(X0))||, ln_rows_variation >= ||diag(w)(J_M(X) - J_M(X0))||,
//   mha_row_variation_l2(i) >= ||J_{M,i}(X) - J_{M,i}(X0)|| (token i's own variation),
//   the term >= ||(D(Y) - D(Yc))(I + J_M(X))|| (MPFR), and without a certified centre the
//   bound's crude centre >= ||J_f(X0)|| and the bound >= ||J_f(X)||;
// the route wins against max_i delta_i (1 + U_M) in some case, and its weighted centre fails at
// 0.8 times its value against the MPFR norm in some case.
TEST(PostLnVariation, LayerNormTermTokenByTokenDominatesMpfr) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(3609);
  const long cases = testing::Count(16);
  long checked = 0, points = 0, rows_won = 0, centre_fails = 0;
  for (long c = 0; c < cases; ++c) {
    const SetCase s = RandomSetCase(c, rng, -3, -1);
    const AttentionLayer& L = s.layer;
    const AttentionLayer mha = L.WithoutPostLayerNorm();
    const PostLnVariationInputs in = InputsFor(L, s.set, NormKind::kL2);
    const int n = int(s.set.center.rows()), d = L.d_model;
    ASSERT_EQ(in.ln_row_weights.size(), n) << "case " << c;
    ASSERT_EQ(in.mha_row_variation_l2.size(), n) << "case " << c;
    EXPECT_EQ(in.ln_row_weights.maxCoeff(), 1.0) << "case " << c;
    EXPECT_GE(in.ln_row_weights.minCoeff(), 0.0) << "case " << c;
    PostLnVariationReport rep;
    const EngineBound b = PostLnVariationBound(L, CoverOf(s.set), in, DefaultExpBackend(), &rep);
    ASSERT_TRUE(std::isfinite(rep.ln_rows)) << "case " << c << ": " << b.note;
    EXPECT_EQ(b.terms.at(2).value.value(), std::min(rep.ln_whole, rep.ln_rows)) << "case " << c;
    if (rep.ln_rows < rep.ln_whole) ++rows_won;
    Eigen::MatrixXd wrows = Eigen::MatrixXd::Zero(n * d, n * d), dyc = wrows;
    for (int i = 0; i < n; ++i) {
      wrows.block(i * d, i * d, d, d) = in.ln_row_weights(i) * Eigen::MatrixXd::Identity(d, d);
      dyc.block(i * d, i * d, d, d) = LayerNormJacobianMp(*L.post_layer_norm, rep.y_cover.center.row(i));
    }
    const Eigen::MatrixXd eye = Eigen::MatrixXd::Identity(n * d, n * d), jm0 = JacobianMp(mha, s.set.center);
    // Without the certified centre (post_ln_centre timed out), the crude one: above the exact
    // ||J_f(X0)|| and the bound above the MPFR norm at the points below.
    PostLnVariationInputs no_centre = in;
    no_centre.centre = UpperBound(kInf);
    const EngineBound crude = PostLnVariationBound(L, CoverOf(s.set), no_centre);
    ASSERT_TRUE(std::isfinite(crude.upper.value())) << "case " << c << ": " << crude.note;
    EXPECT_GE(crude.terms.at(0).value.value(), Sigma1(JacobianMp(L, s.set.center)) * (1 - 1e-6)) << "case " << c;
    const double centre_exact = Sigma1(wrows * (eye + jm0));
    EXPECT_GE(in.ln_rows_centre.value(), centre_exact * (1 - 1e-12)) << "case " << c;
    if (0.8 * in.ln_rows_centre.value() < centre_exact) ++centre_fails;
    for (int k = 0; k < 8; ++k) {
      const Eigen::MatrixXd x = RandomPointIn(s.set, rng, k % 2 ? 1.0 : 0.5);
      const Eigen::MatrixXd jm = JacobianMp(mha, x), dj = jm - jm0;
      EXPECT_LE(Sigma1(wrows * dj), in.ln_rows_variation.value() * (1 + 1e-9)) << "case " << c << " point " << k;
      for (int i = 0; i < n; ++i)
        EXPECT_LE(Sigma1(dj.middleRows(i * d, d)), in.mha_row_variation_l2(i) * (1 + 1e-9))
            << "case " << c << " point " << k << " token " << i;
      const Eigen::MatrixXd y = x + ToDouble(Forward<mpreal>(mha, M(x.cast<mpreal>())));
      Eigen::MatrixXd dy = Eigen::MatrixXd::Zero(n * d, n * d);
      for (int i = 0; i < n; ++i) dy.block(i * d, i * d, d, d) = LayerNormJacobianMp(*L.post_layer_norm, y.row(i));
      EXPECT_LE(Sigma1((dy - dyc) * (eye + jm)), b.terms[2].value.value() * (1 + 1e-9)) << "case " << c << " point " << k;
      EXPECT_LE(Sigma1(JacobianMp(L, x)), crude.upper.value()) << "case " << c << " point " << k;
      ++points;
    }
    ++checked;
  }
  EXPECT_EQ(checked, cases);
  EXPECT_EQ(points, 8 * cases);
  EXPECT_GT(rows_won, 0);
  EXPECT_GT(centre_fails, 0);
  std::printf("LN term token by token: smaller in %ld of %ld cases; its centre's 0.8 fails in %ld\n", rows_won, cases,
              centre_fails);
}

// The enclosure's width in LayerNormMhaRowsInfUp: with D_i enclosed around a zero midpoint
// (radius |D_i|), W_i = 0 and each entry is ||rad(D_i Wo)||_inf V_H alone; it still dominates
// the MPFR ||D_i(J_{M,i}(X) - J_{M,i}(X0))||_inf at random points (without the width term the
// entries would be 0), as do the entries from a tight enclosure of D_i.
TEST(PostLnVariation, InfRowsThroughDiWoCarryTheEnclosureWidth) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(3614);
  const long cases = testing::Count(8);
  long checked = 0;
  for (long c = 0; c < cases; ++c) {
    const SetCase s = RandomSquareWoSetCase(c, rng, -3, -1);
    const AttentionLayer& L = s.layer;
    const InputSet& set = s.set;
    const AttentionLayer mha = L.WithoutPostLayerNorm();
    const PostLnVariationInputs in = InputsFor(L, set, NormKind::kLinf);
    ASSERT_TRUE(std::isfinite(in.heads_variation.value())) << "case " << c;
    const int n = int(set.center.rows()), d = L.d_model;
    std::vector<IntervalMatrix> wide, tight;
    std::vector<Eigen::MatrixXd> exact_d;
    for (int i = 0; i < n; ++i) {
      exact_d.push_back(LayerNormJacobianMp(*L.post_layer_norm, in.ln_mha_rows_y.row(i)));
      const Eigen::MatrixXd m = exact_d.back();
      wide.push_back(IntervalMatrix(Eigen::MatrixXd::Zero(d, d), (m.cwiseAbs() * (1 + 1e-9)).array() + 1e-300));
      tight.push_back(IntervalMatrix(m, (m.cwiseAbs() * 1e-9).array() + 1e-300));
    }
    const Eigen::VectorXd all = Eigen::VectorXd::Constant(n, 1e300);
    const auto forever = std::chrono::steady_clock::time_point::max();
    const LayerNormMhaRowsInf w = LayerNormMhaRowsInfUp(mha, CoverOf(set), wide, in.heads_variation, all, 1, forever);
    const LayerNormMhaRowsInf t = LayerNormMhaRowsInfUp(mha, CoverOf(set), tight, in.heads_variation, all, 1, forever);
    ASSERT_EQ(w.computed, n) << "case " << c;
    ASSERT_EQ(t.computed, n) << "case " << c;
    const Eigen::MatrixXd jm0 = JacobianMp(mha, set.center);
    for (int k = 0; k < 4; ++k) {
      const Eigen::MatrixXd dj = JacobianMp(mha, RandomPointIn(set, rng, k % 2 ? 1.0 : 0.5)) - jm0;
      for (int i = 0; i < n; ++i) {
        const double exact = RowSumMax(exact_d[size_t(i)] * dj.middleRows(i * d, d));
        EXPECT_LE(exact, w.upper(i) * (1 + 1e-9)) << "case " << c << " point " << k << " token " << i;
        EXPECT_LE(exact, t.upper(i) * (1 + 1e-9) + 1e-300) << "case " << c << " point " << k << " token " << i;
      }
    }
    for (int i = 0; i < n; ++i) EXPECT_GT(w.upper(i), 0.0) << "case " << c << " token " << i;
    ++checked;
  }
  EXPECT_EQ(checked, cases);
}

// Above the dense size (no row blocks of J_M(X0), no inf enclosure) and without a certified
// centre, the crude centre from MHA's own certified centre, in norm p: above the MPFR
// ||J_f(X0)||_p, within 1e-3 of it where MHA barely moves (Wo scaled by 1e-6: ||J_f(X0)||_p
// is then max_k ||D_k(yc_k)||_p up to about 1e-6, so 0.8 of it, or a factor on it, fails),
// and the bound above the MPFR ||J_f(X)||_p at random points of the set.
void CheckCrudeCentreAboveTheDenseSize(NormKind p, std::mt19937_64& rng) {
  mpfr::mpreal::set_default_prec(256);
  const long cases = testing::Count(10);
  long points = 0;
  for (long c = 0; c < cases; ++c) {
    const SetCase s = RandomSetCase(c, rng, -3, -1);
    const auto crude = [&](const AttentionLayer& layer) {
      PostLnVariationInputs in = InputsFor(layer, s.set, p, /*dense_limit=*/0);
      EXPECT_EQ(in.mha_row_centre_l2.size(), 0) << "case " << c;
      EXPECT_TRUE(std::isfinite((p == NormKind::kL2 ? in.mha_l2_centre : in.mha_centre).value())) << "case " << c;
      in.centre = UpperBound(kInf);  // (the inf norm has none above the dense size)
      const EngineBound b = PostLnVariationBound(layer, CoverOf(s.set), in);
      EXPECT_NE(b.terms.at(0).name.find("crude"), std::string::npos) << "case " << c;
      return b;
    };
    const AttentionLayer& L = s.layer;
    const EngineBound b = crude(L);
    ASSERT_TRUE(std::isfinite(b.upper.value())) << "case " << c << ": " << b.note;
    EXPECT_GE(b.terms.at(0).value.value(), NormOf(JacobianMp(L, s.set.center), p) * (1 - 1e-6)) << "case " << c;
    for (int k = 0; k < 6; ++k) {
      EXPECT_LE(NormOf(JacobianMp(L, RandomPointIn(s.set, rng, k % 2 ? 1.0 : 0.5)), p), b.upper.value())
          << "case " << c << " point " << k;
      ++points;
    }
    AttentionLayer quiet = L;
    quiet.wo *= 1e-6;
    const EngineBound q = crude(quiet);
    const double exact = NormOf(JacobianMp(quiet, s.set.center), p);
    EXPECT_GE(q.terms.at(0).value.value(), exact * (1 - 1e-6)) << "case " << c;
    EXPECT_LE(q.terms.at(0).value.value(), exact * (1 + 1e-3)) << "case " << c;
  }
  EXPECT_EQ(points, 6 * cases);
}

// Norm 2: max_k ||D_k|| ||diag(w)(I + J_M(X0))|| with MHA's certified ||J_M(X0)||_2.
TEST(PostLnVariation, CrudeCentreFromMhaCentreAboveTheDenseSize) {
  std::mt19937_64 rng(3613);
  CheckCrudeCentreAboveTheDenseSize(NormKind::kL2, rng);
}

// Inf: max_i ||D_i(yc_i)||_inf (1 + ||J_M(X0)||_inf) (CrudeInfCentreUp).
TEST(PostLnVariation, CrudeInfCentreAboveTheDenseSize) {
  std::mt19937_64 rng(3617);
  CheckCrudeCentreAboveTheDenseSize(NormKind::kLinf, rng);
}

// The inf norm token by token: the rows of J_M(X0) (certified above the MPFR largest row sum of
// each token's rows and within 1e-6 of it, so 0.8 of each fails), each token's variation at
// most the whole and above the MPFR ||J_{M,i}(X) - J_{M,i}(X0)||_inf at random points, and
// the bound's two variation terms token by token never above the whole ones.
TEST(PostLnVariation, InfNormTokenByTokenDominatesMpfr) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(3610);
  const long cases = testing::Count(12);
  long points = 0, smaller = 0, via_l2 = 0;
  for (long c = 0; c < cases; ++c) {
    const SetCase s = RandomSetCase(c, rng, -3, -1);
    const AttentionLayer& L = s.layer;
    const AttentionLayer mha = L.WithoutPostLayerNorm();
    const PostLnVariationInputs in = InputsFor(L, s.set, NormKind::kLinf);
    const int n = int(s.set.center.rows()), d = L.d_model;
    ASSERT_EQ(in.mha_row_centre_inf.size(), n) << "case " << c;
    ASSERT_EQ(in.mha_row_variation_inf.size(), n) << "case " << c;
    const Eigen::MatrixXd jm0 = JacobianMp(mha, s.set.center);
    for (int i = 0; i < n; ++i) {
      const double exact = RowSumMax(jm0.middleRows(i * d, d));
      EXPECT_GE(in.mha_row_centre_inf(i), exact) << "case " << c << " token " << i;
      EXPECT_LE(in.mha_row_centre_inf(i), exact * (1 + 1e-6) + 1e-12) << "case " << c << " token " << i;
      EXPECT_LE(in.mha_row_variation_inf(i), in.mha_variation.value()) << "case " << c << " token " << i;
    }
    for (int k = 0; k < 6; ++k) {
      const Eigen::MatrixXd dj = JacobianMp(mha, RandomPointIn(s.set, rng, k % 2 ? 1.0 : 0.5)) - jm0;
      for (int i = 0; i < n; ++i)
        EXPECT_LE(RowSumMax(dj.middleRows(i * d, d)), in.mha_row_variation_inf(i) * (1 + 1e-9))
            << "case " << c << " point " << k << " token " << i;
      ++points;
    }
    PostLnVariationInputs whole = in;
    whole.mha_row_centre_inf.resize(0);
    whole.mha_row_variation_inf.resize(0);
    const EngineBound by_rows = PostLnVariationBound(L, CoverOf(s.set), in);
    const EngineBound b = PostLnVariationBound(L, CoverOf(s.set), whole);
    ASSERT_TRUE(std::isfinite(by_rows.upper.value())) << "case " << c << ": " << by_rows.note;
    EXPECT_LE(by_rows.terms.at(1).value.value(), b.terms.at(1).value.value()) << "case " << c;
    EXPECT_LE(by_rows.terms.at(2).value.value(), b.terms.at(2).value.value()) << "case " << c;
    if (by_rows.upper.value() < b.upper.value()) ++smaller;
    if (by_rows.terms[2].name.find("sqrt(ND)") != std::string::npos) ++via_l2;
  }
  EXPECT_EQ(points, 6 * cases);
  EXPECT_GT(smaller, 0);
  EXPECT_GT(via_l2, 0);  // the LN term through norm 2 (checked against MPFR by BoundAndTermsDominateMpfrAtRandomPoints)
}

// The inf norm's MHA term through D_i Wo (LayerNormMhaRowsInfUp): each computed token's entry
// dominates the MPFR ||D_i(yc_i)(J_{M,i}(X) - J_{M,i}(X0))||_inf at random points of the set; the
// bound takes the smaller of it and ||D_i||_inf min(V_M, v_i), never more than without it and
// less in some case, and only at the entries' own Y centre; the largest observed fraction of an
// entry is printed (the inf variation's first-order routes, not a sup search).
TEST(PostLnVariation, InfRowsThroughDiWoDominateMpfr) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(3611);
  const long cases = testing::Count(12);
  long entries = 0, points = 0, smaller = 0;
  double best = 0;
  for (long c = 0; c < cases; ++c) {
    const SetCase s = RandomSquareWoSetCase(c, rng, -4, -2);
    const AttentionLayer& L = s.layer;
    const InputSet& set = s.set;
    const AttentionLayer mha = L.WithoutPostLayerNorm();
    const PostLnVariationInputs in = InputsFor(L, set, NormKind::kLinf);
    const int n = int(set.center.rows()), d = L.d_model;
    ASSERT_EQ(in.ln_mha_rows_inf.size(), n) << "case " << c;
    PostLnVariationReport rep;
    const EngineBound b = PostLnVariationBound(L, CoverOf(set), in, DefaultExpBackend(), &rep);
    ASSERT_TRUE(std::isfinite(b.upper.value())) << "case " << c << ": " << b.note;
    ASSERT_TRUE(in.ln_mha_rows_y == rep.y_cover.center) << "case " << c;
    std::vector<Eigen::MatrixXd> d_yc(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) d_yc[size_t(i)] = LayerNormJacobianMp(*L.post_layer_norm, rep.y_cover.center.row(i));
    const Eigen::MatrixXd jm0 = JacobianMp(mha, set.center);
    std::vector<double> seen(static_cast<size_t>(n), 0.0);
    for (int k = 0; k < 6; ++k) {
      const Eigen::MatrixXd dj = JacobianMp(mha, RandomPointIn(set, rng, k % 2 ? 1.0 : 0.5)) - jm0;
      for (int i = 0; i < n; ++i) {
        const double exact = RowSumMax(d_yc[size_t(i)] * dj.middleRows(i * d, d));
        seen[size_t(i)] = std::max(seen[size_t(i)], exact);
        EXPECT_LE(exact, in.ln_mha_rows_inf(i) * (1 + 1e-9) + 1e-300) << "case " << c << " point " << k << " token " << i;
      }
      ++points;
    }
    for (int i = 0; i < n; ++i)
      if (std::isfinite(in.ln_mha_rows_inf(i))) {
        ++entries;
        if (in.ln_mha_rows_inf(i) > 0) best = std::max(best, seen[size_t(i)] / in.ln_mha_rows_inf(i));
      }
    PostLnVariationInputs without = in, elsewhere = in;
    without.ln_mha_rows_inf.resize(0);
    elsewhere.ln_mha_rows_y(0, 0) += 1e-3;  // another Y centre: the entries do not apply
    const EngineBound b0 = PostLnVariationBound(L, CoverOf(set), without);
    EXPECT_LE(b.terms.at(1).value.value(), b0.terms.at(1).value.value()) << "case " << c;
    EXPECT_EQ(PostLnVariationBound(L, CoverOf(set), elsewhere).terms.at(1).value.value(), b0.terms.at(1).value.value())
        << "case " << c;
    if (b.terms.at(1).value.value() < b0.terms.at(1).value.value()) ++smaller;
  }
  EXPECT_EQ(points, 6 * cases);
  EXPECT_GE(entries, cases);
  EXPECT_GT(smaller, 0);
  std::printf("MHA term through D_i Wo: %ld tokens computed, smaller in %ld of %ld cases, largest observed fraction %.3f\n",
              entries, smaller, cases, best);
}

// The row blocks of J_M(X0): certified above the MPFR sigma_1 of each block and within 1e-6
// of it (so 0.8 of it fails), and the cover of Y they give holds: ||y_i - yc_i|| <= rho_i at
// random points and at the search's points of the set.
TEST(PostLnVariation, RowBlocksAndTheCoverOfYHold) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(3607);
  const long cases = testing::Count(12);
  long points = 0;
  for (long c = 0; c < cases; ++c) {
    const SetCase s = RandomSetCase(c, rng, -3, 0);
    const AttentionLayer mha = s.layer.WithoutPostLayerNorm();
    const Eigen::VectorXd rows = MhaRowBlockNormsUp(mha, s.set.center, 1L << 30, 1);
    const int n = int(s.set.center.rows()), d = s.layer.d_model;
    ASSERT_EQ(rows.size(), n);
    const Eigen::MatrixXd jm0 = JacobianMp(mha, s.set.center);
    for (int i = 0; i < n; ++i) {
      const double exact = Sigma1(jm0.middleRows(i * d, d));
      EXPECT_GE(rows(i), exact) << "case " << c;
      EXPECT_LE(rows(i), exact * (1 + 1e-6) + 1e-12) << "case " << c;
    }
    EXPECT_EQ(MhaRowBlockNormsUp(mha, s.set.center, 1, 1).size(), 0);
    PostLnVariationReport rep;
    PostLnVariationBound(s.layer, CoverOf(s.set), InputsFor(s.layer, s.set, NormKind::kL2), DefaultExpBackend(), &rep);
    ASSERT_EQ(rep.y_cover.radius.size(), n);
    for (int k = 0; k < 8; ++k) {
      const Eigen::MatrixXd x = RandomPointIn(s.set, rng, k % 2 ? 1.0 : 0.5);
      const Eigen::MatrixXd y = x + ToDouble(Forward<mpreal>(mha, M(x.cast<mpreal>())));
      for (int i = 0; i < n; ++i)
        EXPECT_LE((y.row(i) - rep.y_cover.center.row(i)).norm(), rep.y_cover.radius(i)) << "case " << c << " token " << i;
      ++points;
    }
  }
  EXPECT_EQ(points, 8 * cases);
}

// LayerNormVariationUp dominates MPFR ||J_LN(y) - J_LN(yc)|| at random, radial and turned
// points of the ball, for radii from 1e-4 of ||c0|| to above it.
TEST(PostLnVariation, LayerNormVariationDominatesMpfr) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(3603);
  std::normal_distribution<double> g;
  const long cases = testing::Count(200);
  long checked = 0;
  for (long c = 0; c < cases; ++c) {
    const int d = 3 + int(c % 6);
    LayerNormParams ln;
    ln.gamma = Eigen::VectorXd::NullaryExpr(d, [&] { return g(rng); });
    ln.beta = Eigen::VectorXd::NullaryExpr(d, [&] { return g(rng); });
    ln.eps = c % 2 ? 1e-12 : 1e-5;
    const Eigen::RowVectorXd yc = Eigen::RowVectorXd::NullaryExpr(d, [&] { return 2 * g(rng); });
    const Eigen::RowVectorXd c0 = yc.array() - yc.mean();
    const double rho = c0.norm() * std::pow(10.0, std::uniform_real_distribution<double>(-4, 0.3)(rng));
    const double up = LayerNormVariationUp(ln, yc, rho);
    const Eigen::MatrixXd j0 = LayerNormJacobianMp(ln, yc);
    for (int k = 0; k < 6; ++k) {
      Eigen::RowVectorXd dir;
      if (k == 0) dir = -c0;                      // shrink
      else if (k == 1) dir = c0;                  // grow
      else dir = Eigen::RowVectorXd::NullaryExpr(d, [&] { return g(rng); });
      if (k == 2) dir -= (dir.dot(c0) / c0.squaredNorm()) * c0;  // turn
      const Eigen::RowVectorXd y = yc + 0.999999 * rho * dir / dir.norm();
      EXPECT_LE(Sigma1(LayerNormJacobianMp(ln, y) - j0), up) << "case " << c << " point " << k;
    }
    ++checked;
  }
  EXPECT_EQ(checked, cases);
}

// The inf norm at a point: the certified row sums bracket the MPFR max row sum of J_f(X0),
// within 1e-6; the row given is the largest one.
TEST(PostLnVariation, InfCentreIsExactAtAPoint) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(3604);
  const long cases = testing::Count(16);
  for (long c = 0; c < cases; ++c) {
    const SetCase s = RandomSetCase(c, rng, -3, -3);
    const PostLnCentreInfBounds b = PostLnCentreInfNormBounds(s.layer, s.set.center, 1L << 30, 1);
    const Eigen::MatrixXd j = JacobianMp(s.layer, s.set.center);
    const double exact = RowSumMax(j);
    ASSERT_TRUE(std::isfinite(b.upper.value()));
    EXPECT_GE(b.upper.value(), exact) << "case " << c;
    EXPECT_LE(b.lower.value(), exact) << "case " << c;
    EXPECT_LE(b.upper.value(), b.lower.value() * (1 + 1e-6)) << "case " << c;
    ASSERT_GE(b.row, 0);
    EXPECT_GE(j.row(b.row).cwiseAbs().sum(), exact * (1 - 1e-6)) << "case " << c;
    // Above the dense limit: no number.
    EXPECT_FALSE(std::isfinite(PostLnCentreInfNormBounds(s.layer, s.set.center, 1, 1).upper.value()));
  }
}

// Stronger witnesses than samples: the lower-bound search on the post-LN layer (rigorously
// re-evaluated) over sets with radii up to 10; the variation bound stays above it.
TEST(PostLnVariation, EnginesDominateSearchedWitnesses) {
  std::mt19937_64 rng(3605);
  const long cases = testing::Count(30);
  long checked = 0;
  double tightest = kInf;
  for (long c = 0; c < cases; ++c) {
    const NormKind p = c % 3 == 2 ? NormKind::kLinf : NormKind::kL2;
    const SetCase s = RandomSetCase(c, rng, -2, 1);
    SearchOptions so;
    so.norm = p;
    so.starts = 8;
    so.max_steps = 60;
    so.max_rounds = 1;
    so.threads = 1;
    so.seed = 100 + c;
    const double witness = SearchLowerBound(s.layer, s.set, so).best.lower_bound.value();
    const EngineBound b = PostLnVariationBound(s.layer, CoverOf(s.set), InputsFor(s.layer, s.set, p));
    ASSERT_GE(b.upper.value(), witness) << "case " << c;
    tightest = std::min(tightest, b.upper.value() / witness);
    ++checked;
  }
  EXPECT_EQ(checked, cases);
  std::printf("post_ln_variation against searched witnesses: tightest upper / witness %.4g\n", tightest);
}

// Through Certify: on a set containing X0 the witness is never below ||J_f(X0)|| (norm 2) nor
// below the centre's certified largest row sum (inf), and the engine is among the candidates.
TEST(PostLnVariation, CertifyWitnessNeverBelowTheCentre) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(3606);
  const long cases = testing::Count(6);
  for (long c = 0; c < cases; ++c) {
    const NormKind p = c % 2 ? NormKind::kLinf : NormKind::kL2;
    const SetCase s = RandomSetCase(c, rng, -3, -2);
    CertifyOptions o;
    o.time_limit_s = 1;
    o.norm = p;
    const Certificate cert = Certify(s.layer, s.set, o, Provenance{});
    bool seen = false;
    for (const EngineResult& e : cert.engines)
      if (e.id == EngineId::kPostLnVariation) {
        seen = true;
        EXPECT_TRUE(e.applied) << "case " << c << ": " << e.note;
        EXPECT_GE(e.upper.value(), cert.upper_bound.value());
      }
    EXPECT_TRUE(seen) << "case " << c;
    const double centre = NormOf(JacobianMp(s.layer, s.set.center), p);
    EXPECT_GE(cert.lower_bound.value(), centre * (1 - 1e-6)) << "case " << c;
    EXPECT_LE(cert.lower_bound.value(), cert.upper_bound.value()) << "case " << c;
  }
}

// The candidate above the dense size (inf_dense_limit 0: no row blocks, no inf enclosure) and
// without post_ln_centre: in norm 2 it applies with the crude centre from MHA's certified
// centre, and refuses, saying why, where MHA's certificate has no centre; in the inf norm it
// computes MHA's inf centre where the certificate has none and applies. Every bound that
// applies is above the MPFR ||J_f|| at the centre and at random points of the set.
TEST(PostLnVariation, CandidateAboveTheDenseSize) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(3619);
  const long cases = testing::Count(4);
  const auto no_deadline = std::chrono::steady_clock::time_point::max();
  long applied = 0;
  for (long c = 0; c < cases; ++c) {
    const SetCase s = RandomSetCase(c, rng, -3, -2);
    const AttentionLayer mha = s.layer.WithoutPostLayerNorm();
    CertifyOptions o;
    o.time_limit_s = 2;
    const Certificate c2 = Certify(mha, s.set, o, Provenance{});
    ASSERT_TRUE(std::isfinite(MhaPiecesOf(c2).centre.value())) << "case " << c;
    Certificate no_centre;  // a bound, but no centre_norm engine
    no_centre.upper_bound = c2.upper_bound;
    const Eigen::MatrixXd no_y;
    const EngineResult crude =
        PostLnVariationCandidate(s.layer, s.set, NormKind::kL2, c2, c2, UpperBound(kInf), no_y, 1, no_deadline, 0);
    const EngineResult refused = PostLnVariationCandidate(s.layer, s.set, NormKind::kL2, no_centre, no_centre,
                                                          UpperBound(kInf), no_y, 1, no_deadline, 0);
    const EngineResult inf = PostLnVariationCandidate(s.layer, s.set, NormKind::kLinf, c2, no_centre,
                                                      UpperBound(kInf), no_y, 1, no_deadline, 0);
    EXPECT_FALSE(refused.applied) << "case " << c;
    EXPECT_NE(refused.note.find("no certified centre norm"), std::string::npos) << "case " << c << ": " << refused.note;
    for (const auto& [r, p] : {std::pair{crude, NormKind::kL2}, std::pair{inf, NormKind::kLinf}}) {
      ASSERT_TRUE(r.applied) << "case " << c << ": " << r.note;
      EXPECT_NE(r.terms.at(0).name.find("crude"), std::string::npos) << "case " << c;
      EXPECT_GE(r.upper.value(), NormOf(JacobianMp(s.layer, s.set.center), p)) << "case " << c;
      for (int k = 0; k < 4; ++k)
        EXPECT_GE(r.upper.value(), NormOf(JacobianMp(s.layer, RandomPointIn(s.set, rng, k % 2 ? 1.0 : 0.5)), p))
            << "case " << c << " point " << k;
      ++applied;
    }
  }
  EXPECT_EQ(applied, 2 * cases);
}

}  // namespace
}  // namespace lipcert
