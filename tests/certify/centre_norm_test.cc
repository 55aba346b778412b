#include "certify/centre_norm.h"

#include <gtest/gtest.h>

#include <Eigen/SVD>
#include <atomic>
#include <chrono>
#include <cmath>
#include <random>

#include "certify/centred_engine.h"
#include "certify/certify.h"
#include "certify/jacobian_bounds.h"
#include "interval/norms.h"
#include "models/random_layer.h"
#include "tests/certify/test_util.h"

namespace lipcert {
namespace {

using testing_util::MpMat;
using testing_util::RandomLayer;
using testing_util::RandomLayerOptions;
using testing_util::TestScale;
using testing_util::ToMp;

Eigen::MatrixXd ToDouble(const MpMat& m) {
  Eigen::MatrixXd d(m.rows(), m.cols());
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index c = 0; c < m.cols(); ++c) d(r, c) = m(r, c).toDouble();
  return d;
}

double Sigma1(const Eigen::MatrixXd& j) {
  return Eigen::BDCSVD<Eigen::MatrixXd>(j).singularValues()(0);
}

Eigen::MatrixXd RandomCentre(std::mt19937_64& rng, int n, int d, double scale) {
  std::normal_distribution<double> gauss(0.0, 1.0);
  Eigen::MatrixXd x(n, d);
  for (int i = 0; i < n; ++i)
    for (int a = 0; a < d; ++a) x(i, a) = scale * gauss(rng);
  return x;
}

// The dense Jacobian of the configuration the options describe, in MPFR.
MpMat ReferenceJacobian(const AttentionLayer& L, const Eigen::MatrixXd& x0, const CentreNormOptions& o) {
  if (o.mha_only && L.layer_norm) {
    AttentionLayer bare = L;
    bare.layer_norm.reset();
    detail::LayerNormState<mpfr::mpreal> st;
    const MpMat z = detail::LayerNormForward(*L.layer_norm, ToMp(x0), &st);
    return DenseJacobian<mpfr::mpreal>(bare, z);
  }
  MpMat j = DenseJacobian<mpfr::mpreal>(L, ToMp(x0));
  if (o.exclude_residual && L.layer_norm)
    for (Eigen::Index i = 0; i < j.rows(); ++i) j(i, i) -= 1;
  return j;
}

// Every entry of the MPFR Jacobian lies in the enclosure (up to the reference's own
// rounding to double), and the radii are rounding-sized. Returns the entries checked (it
// stops at the first one outside).
long CheckEnclosure(const IntervalMatrix& enc, const Eigen::MatrixXd& ref, int t, double tightness = 1e-10) {
  EXPECT_EQ(enc.rows(), ref.rows()) << "case " << t;
  EXPECT_EQ(enc.cols(), ref.cols()) << "case " << t;
  if (enc.rows() != ref.rows() || enc.cols() != ref.cols()) return 0;
  long entries = 0;
  for (Eigen::Index e = 0; e < ref.size(); ++e) {
    const double slack = 2 * std::numeric_limits<double>::epsilon() * std::fabs(ref.data()[e]) + 1e-300;
    if (!(std::fabs(ref.data()[e] - enc.mid.data()[e]) <= enc.rad.data()[e] + slack)) {
      ADD_FAILURE() << "case " << t << ": entry " << e << " " << ref.data()[e] << " outside " << enc.mid.data()[e]
                    << " +- " << enc.rad.data()[e];
      return entries;
    }
    ++entries;
  }
  EXPECT_LE(enc.rad.maxCoeff(), tightness * (1 + ref.cwiseAbs().maxCoeff())) << "case " << t;
  return entries;
}

// Every entry of the MPFR Jacobian lies in the engine's enclosure (up to the last rounding
// of the MPFR value to double), for every kind, mask, bias and LayerNorm configuration.
TEST(CentreNormTest, EnclosureContainsTheMpfrJacobian) {
  mpfr::mpreal::set_default_prec(200);
  std::mt19937_64 rng(1402);
  const int cases = int(120 * TestScale());
  long entries = 0;
  int with_ln = 0, l2 = 0;
  for (int t = 0; t < cases; ++t) {
    RandomLayerOptions lo;
    lo.max_tokens = 4;
    const AttentionLayer L = RandomLayer(rng, lo);
    const int n = 1 + int(rng() % 4);
    const Eigen::MatrixXd x0 = RandomCentre(rng, n, L.d_model, 1.5);
    CentreNormOptions o;
    o.mha_only = rng() % 4 == 0;
    o.exclude_residual = rng() % 4 == 0;
    const IntervalMatrix enc = CentreJacobianEnclosure(L, x0, o);
    const Eigen::MatrixXd ref = ToDouble(ReferenceJacobian(L, x0, o));
    // The fused assembly applies the pre-LN factor to the summed block, whose rounding
    // it then scales by gamma / sigma before the factor's cancellation: up to 70 times
    // the per-head route's radius on these random layers (1e-12 where sigma is small).
    const bool fused_ln = L.kind == AttentionKind::kDot && L.layer_norm && !o.mha_only;
    entries += CheckEnclosure(enc, ref, t, fused_ln ? 1e-9 : 1e-10);
    with_ln += L.layer_norm.has_value();
    l2 += L.kind == AttentionKind::kL2;
  }
  EXPECT_GT(entries, 10 * cases);
  EXPECT_GT(with_ln, cases / 10);
  EXPECT_GT(l2, cases / 10);
}

// The fused assembly takes the rows of an entry column 16 at a time, then one by one:
// dot-product layers 16 to 24 wide (attention alone, or the sublayer's MHA) against the
// MPFR Jacobian, as above.
TEST(CentreNormTest, FusedAssemblyContainsTheMpfrJacobianOnWideLayers) {
  mpfr::mpreal::set_default_prec(200);
  std::mt19937_64 rng(1404);
  const int cases = int(12 * TestScale());
  long entries = 0;
  int fused = 0;
  for (int t = 0; t < cases; ++t) {
    RandomLayerOptions lo;
    lo.max_tokens = 3;
    lo.max_width = 24;
    lo.max_heads = 3;
    AttentionLayer L = RandomLayer(rng, lo);
    for (int draw = 0; draw < 20 && L.d_model < 16; ++draw) L = RandomLayer(rng, lo);  // widths 1-24: bounded redraws
    L.kind = AttentionKind::kDot;
    if (L.d_model < 16) continue;
    const int n = 1 + int(rng() % 3);
    const Eigen::MatrixXd x0 = RandomCentre(rng, n, L.d_model, 1.5);
    CentreNormOptions o;
    o.mha_only = true;
    const IntervalMatrix enc = CentreJacobianEnclosure(L, x0, o);
    const Eigen::MatrixXd ref = ToDouble(ReferenceJacobian(L, x0, o));
    entries += CheckEnclosure(enc, ref, t);
    ++fused;
  }
  EXPECT_GT(fused, cases / 2);
  EXPECT_GT(entries, 256L * fused);
}

// The certified centre norm is above sigma_1 of the MPFR Jacobian and within 1e-6 of it;
// the super-block bound (every grouping) is above the dense one.
// The fused assembly (dot-product attention) sums the same products as the per-head
// accumulator in another order, its magnitude sum folded into the radius, and E_i as one
// product over the stacked heads, then applies the pre-LN factor per column token where
// the accumulator applied it to W_h and g: on random layers with biases, masks and
// LayerNorm (MHA alone, and the pre-LN sublayer) the two enclosures meet (the midpoints differ by at most
// the radii, which are rounding-sized) and neither radius is more than 8 times the other (256 for the fused pre-LN one) (a dropped radius term would show as
// a fused radius far below the accumulator's). Entries that are 0 carry only the routes'
// underflow floors (2^-1000 per term, summed differently).
TEST(CentreNormTest, FusedAssemblyMatchesTheAccumulator) {
  std::mt19937_64 rng(1403);
  const int cases = int(100 * TestScale());
  int compared = 0, wide = 0, with_ln = 0;
  long with_radius = 0;
  for (int t = 0; t < cases; ++t) {
    RandomLayerOptions lo;
    lo.max_tokens = 5;
    lo.max_width = t % 2 ? 6 : 40;  // the fused rows go 16 at a time, then one by one
    lo.max_heads = 3;
    AttentionLayer L = RandomLayer(rng, lo);
    if (L.kind != AttentionKind::kDot) continue;
    wide += L.d_model >= 16;
    const int n = 1 + int(rng() % 5);
    const Eigen::MatrixXd x0 = RandomCentre(rng, n, L.d_model, 1.5);
    CentreNormOptions o;
    o.mha_only = L.layer_norm.has_value() && t % 3 != 0;  // else the pre-LN sublayer
    with_ln += L.layer_norm.has_value() && !o.mha_only;
    const IntervalMatrix g = CentreJacobianEnclosure(L, x0, o);
    o.gemm_assembly = false;
    const IntervalMatrix a = CentreJacobianEnclosure(L, x0, o);
    ASSERT_EQ(g.rows(), a.rows());
    for (Eigen::Index e = 0; e < g.mid.size(); ++e) {
      const double gm = g.mid.data()[e], am = a.mid.data()[e], gr = g.rad.data()[e], ar = a.rad.data()[e];
      EXPECT_LE(std::fabs(gm - am), gr + ar) << "case " << t;
      if (ar < 1e-280) continue;  // the underflow floor alone
      // (The pre-LN factor on the summed block widens it more than on W_h and g, where
      // gamma / sigma is large: up to 70 times on these layers.)
      EXPECT_LE(gr, (o.mha_only || !L.layer_norm ? 8 : 256) * ar) << "case " << t;
      EXPECT_GE(gr, ar / 8) << "case " << t;
      ++with_radius;
    }
    ++compared;
  }
  EXPECT_GT(compared, cases / 4);
  EXPECT_GT(with_radius, 10L * compared);
  EXPECT_GT(wide, cases / 10);
  EXPECT_GT(with_ln, cases / 20);
}

TEST(CentreNormTest, DenseBoundIsExactAndSuperBlocksDominateIt) {
  mpfr::mpreal::set_default_prec(128);
  std::mt19937_64 rng(1403);
  const int cases = int(60 * TestScale());
  int checked = 0, grouped = 0;
  double worst = 0;
  for (int t = 0; t < cases; ++t) {
    RandomLayerOptions lo;
    lo.max_width = 5;
    lo.max_heads = 3;
    const AttentionLayer L = RandomLayer(rng, lo);
    const int n = 1 + int(rng() % 5);
    const Eigen::MatrixXd x0 = RandomCentre(rng, n, L.d_model, 1.0);
    CentreNormOptions o;
    o.mha_only = rng() % 4 == 0;
    const double sigma = Sigma1(ToDouble(ReferenceJacobian(L, x0, o)));
    CentreNormReport rep;
    const double dense = CentreJacobianNormUpperBound(L, x0, o, &rep).value();
    EXPECT_EQ(rep.method, "dense");
    EXPECT_GE(dense, sigma * (1 - 1e-14)) << "case " << t;  // the double SVD's own error
    EXPECT_LE(dense, sigma * (1 + 1e-6) + 1e-12) << "case " << t;
    worst = std::max(worst, dense / sigma - 1);
    ++checked;
    for (int g = 1; g < n; ++g) {
      CentreNormOptions og = o;
      og.dense_limit = 0;
      og.block_tokens = g;
      const double sb = CentreJacobianNormUpperBound(L, x0, og, &rep).value();
      EXPECT_EQ(rep.method, "super_block");
      EXPECT_GE(sb, dense * (1 - 1e-9)) << "case " << t << " g " << g;
      ++grouped;
    }
  }
  EXPECT_EQ(checked, cases);
  EXPECT_GT(grouped, cases / 2);
  RecordProperty("worst_relative_excess", std::to_string(worst));
}

// A case for the factored heads: a random dot layer (D <= 6, up to 3 heads; masks, biases,
// half with LayerNorm taken as mha_only), the factored heads alone. False for an L2 layer.
struct FactoredCase {
  AttentionLayer layer;
  CentreNormOptions options;
};
bool RandomFactoredCase(std::mt19937_64& rng, FactoredCase* c) {
  RandomLayerOptions lo;
  lo.max_width = 6;
  lo.max_heads = 3;
  c->layer = RandomLayer(rng, lo);
  if (c->layer.kind != AttentionKind::kDot) return false;
  c->options = CentreNormOptions{};
  c->options.dense_limit = 0;
  c->options.super_blocks = false;
  c->options.mha_only = c->layer.layer_norm.has_value() && rng() % 2 == 0;
  if (!c->options.mha_only) c->layer.layer_norm.reset();
  return true;
}

// The heads factored (dot-product MHA alone: attention without LayerNorm, or mha_only):
// above sigma_1 of the MPFR Jacobian on random layers (masks, biases, D <= 6, up to 3
// heads, N = 1 to 6, centres of scale 1 and 3 for diffuse and sharp rows), and exact where
// only the values act (N = 1: J = sum_h W_h). It is the smaller of its parts' sum and the
// paths with their cross terms (PathsUp), which is above sigma_1 on its own too and the
// bound in most cases; the super-blocks' route returns the smaller of the two routes.
TEST(CentreNormTest, FactoredHeadsDominateTheMpfrNorm) {
  mpfr::mpreal::set_default_prec(128);
  std::mt19937_64 rng(1409);
  const int cases = int(400 * TestScale());
  int checked = 0, single = 0, crossed = 0, crossed_won = 0;
  double closest = kInf;
  for (int t = 0; t < cases; ++t) {
    FactoredCase c;
    if (!RandomFactoredCase(rng, &c)) continue;  // an L2 layer
    AttentionLayer& L = c.layer;
    const CentreNormOptions& o = c.options;
    const int n = 1 + int(rng() % 6);
    const Eigen::MatrixXd x0 = RandomCentre(rng, n, L.d_model, t % 2 ? 3.0 : 1.0);
    const double sigma = Sigma1(ToDouble(ReferenceJacobian(L, x0, o)));
    CentreNormReport rep;
    const double bound = CentreJacobianNormUpperBound(L, x0, o, &rep).value();
    EXPECT_EQ(rep.method, "factored_heads") << "case " << t;
    EXPECT_TRUE(rep.factored_won) << "case " << t;
    EXPECT_EQ(bound, rep.factored) << "case " << t;
    EXPECT_GE(bound, sigma * (1 - 1e-14)) << "case " << t;
    EXPECT_GE(rep.factored, std::min(rep.factored_value + std::min(rep.factored_keys + rep.factored_queries,
                                                                   rep.factored_keys_and_queries),
                                     rep.factored_crossed))
        << "case " << t;
    if (std::isfinite(rep.factored_crossed)) {  // the paths with their cross terms (PathsUp)
      EXPECT_GE(rep.factored_crossed, sigma * (1 - 1e-14)) << "case " << t;
      ++crossed;
      crossed_won += rep.factored_crossed == bound;
    }
    if (n == 1) {  // the values alone: ||sum_h W_h||
      EXPECT_LE(bound, sigma * (1 + 1e-9) + 1e-12) << "case " << t;
      ++single;
    }
    closest = std::min(closest, bound / sigma);
    // With the super-blocks as well, the smaller of the two.
    CentreNormOptions both = o;
    both.super_blocks = true;
    both.block_tokens = 1;
    CentreNormReport rb;
    const double b2 = CentreJacobianNormUpperBound(L, x0, both, &rb).value();
    EXPECT_EQ(b2, std::min(rb.factored, b2)) << "case " << t;
    EXPECT_GE(b2, sigma * (1 - 1e-14)) << "case " << t;
    ++checked;
  }
  EXPECT_GE(checked, cases / 4);
  EXPECT_GE(single, 1);
  EXPECT_LE(closest, 1 + 1e-9);
  EXPECT_GE(crossed, cases / 8);
  EXPECT_GE(crossed_won, 1);
  RecordProperty("checked", std::to_string(checked));
  RecordProperty("crossed", std::to_string(crossed));
  RecordProperty("crossed_won", std::to_string(crossed_won));
}

// The keys' and queries' part of J(x0), K + Q = J - V with V_ij = sum_h P^h_ij Wo_h Wv_h (the
// values), all in MPFR and rounded to double at the end; the same input to the MHA as
// ReferenceJacobian (LN(x0) with mha_only).
Eigen::MatrixXd ReferenceKeysAndQueries(const AttentionLayer& L, const Eigen::MatrixXd& x0, const CentreNormOptions& o) {
  AttentionLayer bare = L;
  bare.layer_norm.reset();
  MpMat z = ToMp(x0);
  if (o.mha_only && L.layer_norm) {
    detail::LayerNormState<mpfr::mpreal> st;
    z = detail::LayerNormForward(*L.layer_norm, ToMp(x0), &st);
  }
  MpMat kq = ReferenceJacobian(L, x0, o);
  const int n = int(x0.rows()), d = L.d_model;
  for (int h = 0; h < L.heads; ++h) {
    const MpMat p = detail::ComputeHead<mpfr::mpreal>(bare, h, z).p;
    const MpMat w = ToMp(Eigen::MatrixXd(L.wo_head(h))) * detail::ValueMatrix<mpfr::mpreal>(bare, h);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) kq.block(long(i) * d, long(j) * d, d, d) -= p(i, j) * w;
  }
  return ToDouble(kq);
}

// The cross term of the keys and queries (KeysAndQueriesUp): above the MPFR norm of K + Q
// wherever it is computed, and below keys + queries in some cases (the test draws diffuse
// and sharp heads alike).
TEST(CentreNormTest, FactoredKeysAndQueriesDominateTheirMpfrNorm) {
  mpfr::mpreal::set_default_prec(128);
  std::mt19937_64 rng(1410);
  const int cases = int(80 * TestScale());
  int checked = 0, won = 0;
  for (int t = 0; t < cases; ++t) {
    FactoredCase c;
    if (!RandomFactoredCase(rng, &c)) continue;  // an L2 layer
    AttentionLayer& L = c.layer;
    const CentreNormOptions& o = c.options;
    const int n = 2 + int(rng() % 5);
    const Eigen::MatrixXd x0 = RandomCentre(rng, n, L.d_model, t % 3 == 0 ? 2.0 : 0.5);
    CentreNormReport rep;
    CentreJacobianNormUpperBound(L, x0, o, &rep);
    EXPECT_EQ(rep.method, "factored_heads") << "case " << t;
    const double separate = rep.factored_keys + rep.factored_queries;
    if (!std::isfinite(rep.factored_keys_and_queries)) continue;  // the cross terms lost and stopped
    const double sigma = Sigma1(ReferenceKeysAndQueries(L, x0, o));
    EXPECT_GE(rep.factored_keys_and_queries, sigma * (1 - 1e-12)) << "case " << t;
    EXPECT_GE(rep.factored, std::min(rep.factored_value + std::min(separate, rep.factored_keys_and_queries),
                                     rep.factored_crossed))
        << "case " << t;
    won += rep.factored_keys_and_queries < separate;
    ++checked;
  }
  EXPECT_GE(checked, cases / 8);
  EXPECT_GE(won, 1);
  RecordProperty("checked", std::to_string(checked));
  RecordProperty("won", std::to_string(won));
}

// A deflation case: a random layer without LayerNorm (dot or L2, masks, biases; D <= 5, up
// to 3 heads), a centre of 2 to 5 tokens, and J(x0) formed in MPFR (rounded to double).
struct DeflationCase {
  AttentionLayer layer;
  Eigen::MatrixXd x0, jacobian;
  double sigma = 0;
};
DeflationCase RandomDeflationCase(std::mt19937_64& rng, bool keep_pre_ln = false) {
  RandomLayerOptions lo;
  lo.max_width = 5;
  lo.max_heads = 3;
  DeflationCase c;
  c.layer = RandomLayer(rng, lo);
  if (!keep_pre_ln) c.layer.layer_norm.reset();
  const int n = 2 + int(rng() % 4);
  c.x0 = RandomCentre(rng, n, c.layer.d_model, 1.0);
  c.jacobian = ToDouble(ReferenceJacobian(c.layer, c.x0, CentreNormOptions{}));
  c.sigma = Sigma1(c.jacobian);
  return c;
}

// The deflated super-block bound: above sigma_1 of the MPFR Jacobian for every group size
// and number of deflation vectors (1 to N*D), on layers without LayerNorm and on pre-LN
// sublayers X + MHA(LN(X)) (dot and L2, masks, biases). Once V spans everything (k = N*D: J P and the coupling are rounding
// error) it is within 1e-6 of sigma_1, dot and L2 alike: the enclosure's radius enters
// norm-wise (||R_IK||_F per block), not entrywise through |V|.
TEST(CentreNormTest, DeflatedSuperBlocksDominateTheMpfrNormAndTighten) {
  mpfr::mpreal::set_default_prec(128);
  std::mt19937_64 rng(1404);
  const int cases = int(40 * TestScale());
  int checked = 0, tight = 0, pre_ln = 0;
  for (int t = 0; t < cases; ++t) {
    const auto [L, x0, j, sigma] = RandomDeflationCase(rng, /*keep_pre_ln=*/t % 2 == 1);
    pre_ln += L.layer_norm.has_value();
    const int n = int(x0.rows()), nd = int(x0.size());
    for (int g = 1; g < n; ++g) {
      CentreNormOptions o;
      o.dense_limit = 0;
      o.block_tokens = g;
      CentreNormReport plain_rep;
      const double plain = CentreJacobianNormUpperBound(L, x0, o, &plain_rep).value();
      for (int k : {1, std::max(1, nd / 2), nd}) {
        o.deflation_vectors = k;
        CentreNormReport rep;
        const double deflated = CentreJacobianNormUpperBound(L, x0, o, &rep).value();
        EXPECT_EQ(rep.method, "deflated_super_block");
        EXPECT_EQ(rep.deflation_vectors, k);
        ASSERT_TRUE(std::isfinite(deflated)) << "case " << t;
        EXPECT_GE(deflated, sigma * (1 - 1e-14)) << "case " << t << " g " << g << " k " << k;
        if (k == nd) {
          EXPECT_LE(deflated, sigma * (1 + 1e-6) + 1e-12) << "case " << t << " g " << g << " top " << rep.deflated_top
              << " rest " << rep.deflated_rest << " coupling " << rep.deflation_coupling << " eps " << rep.deflation_orthogonality;
          EXPECT_LE(deflated, plain * (1 + 1e-9)) << "case " << t << " g " << g;
          ++tight;
        }
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, cases);
  EXPECT_GT(tight, cases / 2);
  EXPECT_GT(pre_ln, cases / 10);
}

// The deflated bound is certified for ANY V and Y: random non-orthonormal V, Y far from
// J V, Y = 0, V with repeated columns, and the exact pair (V = I, Y = fl(J)) where it must be
// tight. Every one stays above the MPFR sigma_1, for every token grouping, dot and L2 alike.
TEST(CentreNormTest, DeflatedBoundHoldsForAnyBasisAndImage) {
  mpfr::mpreal::set_default_prec(128);
  std::mt19937_64 rng(1406);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const int cases = int(30 * TestScale());
  int checked = 0, tight = 0;
  for (int t = 0; t < cases; ++t) {
    const auto [L, x0, j, sigma] = RandomDeflationCase(rng);
    const int n = int(x0.rows()), nd = int(x0.size());
    for (int g = 1; g <= n; ++g) {
      CentreNormOptions o;
      o.block_tokens = g;
      const int k = 1 + int(rng() % nd);
      Eigen::MatrixXd v(nd, k), y(nd, k);
      for (int variant = 0; variant < 4; ++variant) {
        for (long i = 0; i < v.size(); ++i) v.data()[i] = gauss(rng);
        for (long i = 0; i < y.size(); ++i) y.data()[i] = gauss(rng);
        if (variant == 1) y.setZero();
        if (variant == 2) {
          v.col(k - 1) = v.col(0);
          y = j * v;
        }
        if (variant == 3) {
          v = Eigen::MatrixXd::Identity(nd, nd);
          y = j;
        }
        CentreNormReport rep;
        const double bound = DeflatedCentreNormUpperBound(L, x0, v, y, o, &rep).value();
        EXPECT_GE(bound, sigma * (1 - 1e-14)) << "case " << t << " g " << g << " variant " << variant;
        if (variant == 3) {
          EXPECT_LE(bound, sigma * (1 + 1e-6) + 1e-12) << "case " << t << " g " << g << " rest " << rep.deflated_rest;
          ++tight;
        }
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, cases);
  EXPECT_GE(tight, 2 * cases);
  const AttentionLayer L = RandomLayer(rng, RandomLayerOptions{});
  const Eigen::MatrixXd x0 = RandomCentre(rng, 2, L.d_model, 1.0);
  EXPECT_THROW(DeflatedCentreNormUpperBound(L, x0, Eigen::MatrixXd::Zero(3, 1), Eigen::MatrixXd::Zero(3, 1)),
               std::invalid_argument);
}

// The basis's resize (DeflationBasisOf): asked every 16 steps, it ends the Lanczos run where
// it says (0: one step past the ask; more than asked: all of them), and the shorter basis is
// still orthonormal with Y = J V, and gives a bound above sigma_1.
TEST(CentreNormTest, DeflationBasisStopsWhereItsResizeSays) {
  std::mt19937_64 rng(1407);
  RandomLayerOptions lo;
  lo.max_width = 6;
  lo.max_heads = 2;
  int checked = 0;
  for (int t = 0; t < int(6 * TestScale()); ++t) {
    AttentionLayer L = RandomLayer(rng, lo);
    L.layer_norm.reset();
    const int n = 40 / L.d_model + 2, nd = n * L.d_model;  // nd > 40
    const Eigen::MatrixXd x0 = RandomCentre(rng, n, L.d_model, 1.0);
    const Eigen::MatrixXd j = ToDouble(ReferenceJacobian(L, x0, CentreNormOptions{}));
    const double sigma = Sigma1(j);
    for (const int want : {0, 20, 100}) {
      std::vector<int> asked_at;
      const DeflationBasis b = DeflationBasisOf(L, x0, 40, 1, std::chrono::steady_clock::time_point::max(),
                                                [&](int steps, double) {
                                                  asked_at.push_back(steps);
                                                  return want;
                                                });
      const int expected = want == 0 ? 17 : std::min(want, 40);
      ASSERT_EQ(b.v.cols(), expected) << "case " << t << " want " << want;
      ASSERT_EQ(b.y.cols(), expected);
      ASSERT_FALSE(asked_at.empty());
      EXPECT_EQ(asked_at.front(), 16);
      EXPECT_LE((b.v.transpose() * b.v - Eigen::MatrixXd::Identity(expected, expected)).norm(), 1e-10);
      EXPECT_LE((b.y - j * b.v).norm(), 1e-10 * (1 + j.norm())) << "case " << t;
      EXPECT_GE(DeflatedCentreNormUpperBound(L, x0, b.v, b.y).value(), sigma * (1 - 1e-14)) << "case " << t;
      ++checked;
    }
    EXPECT_GT(nd, 40);
  }
  EXPECT_EQ(checked, 3 * int(6 * TestScale()));
}

// Through Certify (--deflate): radius 0 above the dense size, the centre_norm engine's term
// says it was deflated and the certified bound is above the MPFR sigma_1; a negative count
// is refused naming the field.
TEST(CentreNormTest, CertifyDeflatesWhenAsked) {
  mpfr::mpreal::set_default_prec(128);
  std::mt19937_64 rng(1405);
  int checked = 0;
  for (int t = 0; t < 20 && checked < 4; ++t) {
    RandomLayerOptions lo;
    lo.max_width = 5;
    AttentionLayer L = RandomLayer(rng, lo);
    if (L.kind != AttentionKind::kDot) continue;
    L.layer_norm.reset();
    InputSet set;
    set.center = RandomCentre(rng, 4, L.d_model, 1.0);
    set.radius = 0;
    const double sigma = Sigma1(ToDouble(ReferenceJacobian(L, set.center, CentreNormOptions{})));
    CertifyOptions o;
    o.time_limit_s = 2;
    o.engines.dense_limit = L.d_model;  // one token: the centre norm goes to super-blocks
    o.engines.deflation_vectors = 4 * L.d_model;
    const Certificate c = Certify(L, set, o, {});
    const EngineResult* cn = nullptr;
    for (const EngineResult& e : c.engines)
      if (e.id == EngineId::kCentreNorm && e.applied) cn = &e;
    ASSERT_NE(cn, nullptr) << "case " << t;
    ASSERT_FALSE(cn->terms.empty());
    EXPECT_NE(cn->terms[0].name.find("deflated by"), std::string::npos) << cn->terms[0].name;
    EXPECT_GE(cn->upper.value(), sigma * (1 - 1e-14)) << "case " << t;
    EXPECT_LE(cn->upper.value(), sigma * (1 + 1e-6) + 1e-12) << "case " << t;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
  CertifyOptions bad;
  bad.engines.deflation_vectors = -1;
  EXPECT_NE(bad.IsValid().find("engines.deflation_vectors"), std::string::npos);
}

// The inf-norm bounds bracket the MPFR Jacobian's largest row sum, from both sides and
// within 1e-9, for every tiling of the tokens (block_limit from one token to all), and the
// row they name is a largest row.
TEST(CentreNormTest, InfNormBoundsBracketTheMpfrRowSums) {
  mpfr::mpreal::set_default_prec(128);
  std::mt19937_64 rng(1404);
  const int cases = int(60 * TestScale());
  int checked = 0, tiled = 0;
  for (int t = 0; t < cases; ++t) {
    RandomLayerOptions lo;
    lo.max_width = 5;
    lo.max_heads = 3;
    const AttentionLayer L = RandomLayer(rng, lo);
    const int n = 1 + int(rng() % 5);
    const Eigen::MatrixXd x0 = RandomCentre(rng, n, L.d_model, 1.0);
    CentreNormOptions o;
    o.mha_only = rng() % 4 == 0;
    o.exclude_residual = rng() % 4 == 0;
    const Eigen::MatrixXd j = ToDouble(ReferenceJacobian(L, x0, o));
    const Eigen::VectorXd rows = j.cwiseAbs().rowwise().sum();
    const double exact = rows.maxCoeff();
    for (long block_limit : {long(L.d_model), long(2 * L.d_model), long(n) * L.d_model}) {
      o.block_limit = block_limit;
      const CentreInfNormBounds b = CentreJacobianInfNormBounds(L, x0, o);
      ASSERT_FALSE(b.timed_out);
      EXPECT_LE(b.lower.value(), exact * (1 + 1e-14)) << "case " << t;  // the double sum's own error
      EXPECT_GE(b.upper.value(), exact * (1 - 1e-14)) << "case " << t;
      EXPECT_LE(b.upper.value(), exact * (1 + 1e-9) + 1e-12) << "case " << t;
      EXPECT_GE(b.lower.value(), exact * (1 - 1e-9) - 1e-12) << "case " << t;
      ASSERT_GE(b.row, 0);
      ASSERT_LT(b.row, int(rows.size()));
      EXPECT_GE(rows(b.row), exact * (1 - 1e-9) - 1e-12) << "case " << t;
      tiled += block_limit < long(n) * L.d_model;
    }
    ++checked;
  }
  EXPECT_EQ(checked, cases);
  EXPECT_GT(tiled, cases / 2);
}

// Larger size classes (N*D from 256 to 1536 at the default scale), against the double
// dense Jacobian of models/forward.h: sigma_1 <= bound <= sigma_1 (1 + 1e-6), and the
// per-token and grouped bounds above it.
TEST(CentreNormTest, ExactAtLargerSizesAgainstTheDenseReference) {
  auto spec = [](AttentionKind kind, bool ln, int d, int heads) {
    RandomLayerSpec s;
    s.kind = kind;
    s.layer_norm = ln;
    s.biases = true;
    s.d = d;
    s.heads = heads;
    s.dk = d / heads;
    return s;
  };
  const RandomLayerSpec sizes[] = {spec(AttentionKind::kDot, true, 64, 4), spec(AttentionKind::kL2, false, 96, 4),
                                   spec(AttentionKind::kDot, false, 96, 6)};
  const int classes = TestScale() >= 2 ? 3 : 2;
  int checked = 0;
  std::mt19937_64 rng(1404);
  for (int c = 0; c < classes; ++c) {
    for (int n : {4, 16}) {
      const AttentionLayer L = RandomAttentionLayer(sizes[c], rng);
      const Eigen::MatrixXd x0 = RandomCentre(rng, n, L.d_model, 1.0);
      const double sigma = Sigma1(DenseJacobian<double>(L, x0));
      CentreNormReport rep;
      const double dense = CentreJacobianNormUpperBound(L, x0, {}, &rep).value();
      EXPECT_GE(dense, sigma * (1 - 1e-12)) << "class " << c << " N " << n;
      EXPECT_LE(dense, sigma * (1 + 1e-6)) << "class " << c << " N " << n;
      CentreNormOptions og;
      og.dense_limit = 0;
      og.block_tokens = 2;
      const double sb = CentreJacobianNormUpperBound(L, x0, og).value();
      EXPECT_GE(sb, dense * (1 - 1e-9));
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * classes);
}

// The dense certificate on matrices larger than one Cholesky tile (256), sizes not a
// multiple of it, with prescribed singular values (a clear top, a near-tie 1e-9 below
// it, an exact tie): above the SVD's sigma_1 (double, about 1e-15 relative), within 1e-7
// of it; the same through the point overload and one shared workspace, and scaled into
// the subnormal range; in single precision above it; a passed deadline gives +inf.
TEST(CentreNormTest, TiledGramCertificateIsExactAboveTheSvd) {
  std::mt19937_64 rng(1404);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const int cases = std::max(3, int(6 * TestScale()));
  int checked = 0;
  GramWorkspace workspace;
  for (int t = 0; t < cases; ++t) {
    const int n = 257 + int(rng() % 400), m = n + 1 + int(rng() % 50);
    auto orthonormal = [&](int rows, int cols) {
      Eigen::MatrixXd g = Eigen::MatrixXd::NullaryExpr(rows, cols, [&] { return gauss(rng); });
      return Eigen::MatrixXd(Eigen::HouseholderQR<Eigen::MatrixXd>(g).householderQ() * Eigen::MatrixXd::Identity(rows, cols));
    };
    Eigen::VectorXd s = Eigen::VectorXd::LinSpaced(n, 0.0, 2.0).reverse();
    s(0) = 3.0 + t;
    if (t % 3 == 1) s(1) = s(0) * (1 - 1e-9);
    if (t % 3 == 2) s(1) = s(0);
    const Eigen::MatrixXd a = orthonormal(m, n) * s.asDiagonal() * orthonormal(n, n).transpose();
    const double sigma = Sigma1(a);
    GramStats stats;
    double estimate = 0;
    const UpperBound b = NormL2UpperGram(IntervalMatrix::Point(a), 2, &estimate,
                                         std::chrono::steady_clock::time_point::max(), &stats);
    SCOPED_TRACE("case " + std::to_string(t) + " n " + std::to_string(n));
    EXPECT_GE(b.value(), sigma * (1 - 1e-13));
    EXPECT_LE(b.value(), sigma * (1 + 1e-7));
    EXPECT_NEAR(estimate, sigma, 1e-9 * sigma);
    EXPECT_GE(stats.cholesky_attempts, 1);
    // The point overload through one workspace shared by every case (sizes differ), and
    // the same matrix scaled into the subnormal range (its sigma_1 exactly, from the
    // scaled-back copy: scaling a subnormal up by 2^1040 is exact).
    EXPECT_EQ(NormL2UpperGram(a, 2, nullptr, std::chrono::steady_clock::time_point::max(), nullptr, &workspace).value(),
              b.value());
    // (All of it, 2^-1030 a, compared at 2^1030 times: exact both ways; and one column
    // only beside normal entries: the two scaling routes.)
    Eigen::MatrixXd tiny = a * std::ldexp(1.0, -1030), mixed = a * 32.0;
    mixed.col(0) *= std::ldexp(1.0, -1030);
    const double sigma_tiny = Sigma1(Eigen::MatrixXd(tiny * std::ldexp(1.0, 515) * std::ldexp(1.0, 515)));
    const auto max_time = std::chrono::steady_clock::time_point::max();
    const double b_tiny = NormL2UpperGram(tiny, 2, nullptr, max_time, nullptr, &workspace).value();
    const double b_mixed = NormL2UpperGram(mixed, 2, nullptr, max_time, nullptr, &workspace).value();
    EXPECT_GE(std::ldexp(std::ldexp(b_tiny, 515), 515), sigma_tiny * (1 - 1e-13));
    EXPECT_LE(std::ldexp(std::ldexp(b_tiny, 515), 515), sigma_tiny * (1 + 1e-7));
    EXPECT_GE(b_mixed, Sigma1(mixed) * (1 - 1e-13));
    EXPECT_LE(b_mixed, Sigma1(mixed) * (1 + 1e-7));
    // The wide transpose: its Gram matrix of rows by tiles (no transposed copy), the same sigma_1.
    const double b_wide = NormL2UpperGram(Eigen::MatrixXd(a.transpose()), 2, nullptr, max_time, nullptr, &workspace).value();
    EXPECT_GE(b_wide, sigma * (1 - 1e-13));
    EXPECT_LE(b_wide, sigma * (1 + 1e-7));
    // The Gram matrix in single precision (the super-blocks' blocks): still above, and
    // within its gamma_k(2^-24) ||a||_F^2 (about 3e-3 relative here).
    const double b_single = NormL2UpperGram(IntervalMatrix::Point(a), 2, nullptr, max_time, nullptr, &workspace,
                                            GramPrecision::kSingle).value();
    EXPECT_GE(b_single, sigma * (1 - 1e-13));
    EXPECT_LE(b_single, sigma * (1 + 1e-2));
    ++checked;
  }
  EXPECT_EQ(checked, cases);
  // Adversarial for single precision: entries 0.49 ulp above floats in [1, 1.01), so that
  // fl32 shrinks every one by the same factor 1 + 0.49 2^-23 (5.8e-8, above the
  // certificate's margin): the conversion's term has to carry it.
  {
    std::uniform_real_distribution<float> unit(1.0f, 1.01f);
    Eigen::MatrixXd up(300, 280);
    for (Eigen::Index e = 0; e < up.size(); ++e) {
      const float f = unit(rng);
      up.data()[e] = double(f) + 0.49 * double(std::nextafter(f, 2.0f) - f);
    }
    EXPECT_TRUE((up.cast<float>().cast<double>().array() < up.array()).all());
    const double b_up = NormL2UpperGram(up, 2, nullptr, std::chrono::steady_clock::time_point::max(), nullptr, nullptr,
                                        GramPrecision::kSingle).value();
    EXPECT_GE(b_up, Sigma1(up) * (1 - 1e-13));
    EXPECT_LE(b_up, Sigma1(up) * (1 + 1e-2));
  }
  const Eigen::MatrixXd a = Eigen::MatrixXd::Identity(300, 300);
  EXPECT_EQ(NormL2UpperGram(IntervalMatrix::Point(a), 2, nullptr, std::chrono::steady_clock::now()).value(), kInf);
}

// A stop request (CentreNormOptions::stop) ends the centre norm as its deadline would: with
// the flag already true every route (dense, plain and deflated super-blocks, the heads
// factored alone, the inf norm's row sums) returns +inf with timed_out, runs no Cholesky and
// certifies no block; the Gram certificate alone runs no Cholesky either; a deflation basis
// whose stop comes at its 16th step keeps 17 columns; and the centre_norm engine reports no
// bound. The same calls without the stop give finite bounds (so each check can fail).
TEST(CentreNormTest, StopRequestEndsEveryRouteWithoutABound) {
  std::mt19937_64 rng(3604);
  RandomLayerSpec spec;
  spec.kind = AttentionKind::kDot;
  spec.biases = true;
  spec.d = 8;
  spec.heads = 2;
  spec.dk = 4;
  const AttentionLayer L = RandomAttentionLayer(spec, rng);
  const int n = 12;
  const Eigen::MatrixXd x0 = RandomCentre(rng, n, L.d_model, 1.0);
  std::atomic<bool> stopped{true}, running{false};
  struct Route {
    const char* name;
    CentreNormOptions o;
  };
  std::vector<Route> routes(4);
  routes[0].name = "dense";
  routes[1].name = "super_block";
  routes[1].o.dense_limit = 16;
  routes[1].o.block_tokens = 4;
  routes[1].o.factored_heads = false;
  routes[2] = routes[1];
  routes[2].name = "deflated_super_block";
  routes[2].o.deflation_vectors = 40;
  routes[3].name = "factored_heads";
  routes[3].o.dense_limit = 16;
  routes[3].o.super_blocks = false;
  for (Route& r : routes) {
    SCOPED_TRACE(r.name);
    r.o.threads = 2;
    r.o.stop = &running;
    CentreNormReport free_report;
    const double free = CentreJacobianNormUpperBound(L, x0, r.o, &free_report).value();
    ASSERT_TRUE(std::isfinite(free));
    EXPECT_FALSE(free_report.timed_out);
    EXPECT_EQ(free_report.method, r.name);
    r.o.stop = &stopped;
    CentreNormReport report;
    EXPECT_EQ(CentreJacobianNormUpperBound(L, x0, r.o, &report).value(), kInf);
    EXPECT_TRUE(report.timed_out);
    EXPECT_EQ(report.gram.cholesky_attempts, 0);
    EXPECT_EQ(report.exact_blocks, 0);
    EXPECT_EQ(report.factored, kInf);
  }
  // The inf norm's row sums.
  CentreNormOptions o;
  o.stop = &running;
  ASSERT_TRUE(std::isfinite(CentreJacobianInfNormBounds(L, x0, o).upper.value()));
  o.stop = &stopped;
  const CentreInfNormBounds inf = CentreJacobianInfNormBounds(L, x0, o);
  EXPECT_TRUE(inf.timed_out);
  EXPECT_EQ(inf.upper.value(), kInf);
  EXPECT_EQ(inf.row, -1);
  // The Gram certificate of one matrix: neither its Gram nor its Cholesky.
  const IntervalMatrix j = CentreJacobianEnclosure(L, x0);
  const auto no_deadline = std::chrono::steady_clock::time_point::max();
  GramStats free_stats, stats;
  EXPECT_TRUE(std::isfinite(
      NormL2UpperGram(j, 2, nullptr, no_deadline, &free_stats, nullptr, GramPrecision::kDouble, &running).value()));
  EXPECT_GE(free_stats.cholesky_attempts, 1);
  EXPECT_EQ(NormL2UpperGram(j, 2, nullptr, no_deadline, &stats, nullptr, GramPrecision::kDouble, &stopped).value(), kInf);
  EXPECT_EQ(stats.cholesky_attempts, 0);
  // The deflation basis: a stop at its 16th step (asked from its resize hook) ends it there;
  // the deflated pass with the stop gives no bound.
  std::atomic<bool> late{false};
  const DeflationBasis cut = DeflationBasisOf(L, x0, 40, 1, no_deadline,
                                              [&](int, double) {
                                                late = true;
                                                return 40;
                                              },
                                              &late);
  EXPECT_EQ(cut.v.cols(), 17);
  const DeflationBasis full = DeflationBasisOf(L, x0, 40, 1, no_deadline, [](int, double) { return 40; }, &running);
  ASSERT_EQ(full.v.cols(), 40);
  CentreNormOptions deflated = routes[2].o;
  deflated.stop = &running;
  ASSERT_TRUE(std::isfinite(DeflatedCentreNormUpperBound(L, x0, full.v, full.y, deflated).value()));
  deflated.stop = &stopped;
  CentreNormReport deflated_report;
  EXPECT_EQ(DeflatedCentreNormUpperBound(L, x0, full.v, full.y, deflated, &deflated_report).value(), kInf);
  EXPECT_TRUE(deflated_report.timed_out);
  EXPECT_EQ(deflated_report.exact_blocks, 0);
  // The centre_norm engine over a small ball: no bound, timed out.
  BoundOptions bo;
  bo.threads = 2;
  bo.stop = &running;
  const TokenCover cover = CoverOf(InputSet{SetKind::kBall, x0, 1e-3});
  ASSERT_TRUE(std::isfinite(CentreNormBound(L, cover, bo, long(1) << 30).upper.value()));
  bo.stop = &stopped;
  const EngineBound b = CentreNormBound(L, cover, bo, long(1) << 30);
  EXPECT_EQ(b.upper.value(), kInf);
  EXPECT_TRUE(b.timed_out);
}

TEST(CentreNormTest, InvalidOptionsAndShapesAreRefused) {
  CentreNormOptions o;
  EXPECT_EQ(o.IsValid(), "");
  o.block_limit = 0;
  EXPECT_NE(o.IsValid().find("block_limit"), std::string::npos);
  std::mt19937_64 rng(1);
  const AttentionLayer L = RandomLayer(rng);
  EXPECT_THROW(CentreJacobianNormUpperBound(L, Eigen::MatrixXd::Zero(2, L.d_model + 1)), std::invalid_argument);
  EXPECT_THROW(CentreJacobianNormUpperBound(L, Eigen::MatrixXd::Zero(2, L.d_model), o), std::invalid_argument);
}

}  // namespace
}  // namespace lipcert
