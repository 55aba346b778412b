// The post-LN sublayer LN(X + MHA(X)) (certify/post_layer_norm.h): the composed bound is >=
// the MPFR-evaluated ||J_f(X) v|| / ||v|| at random points X of the set (v the top singular
// vector of the dense double Jacobian there, or its largest row's signs for norm inf); the
// witness is rigorous (<= the MPFR value) and <= the bound; the bert checkpoint loads its
// post-LN, `attention_only` drops it, and the pipeline certifies the full sublayer.
#include "certify/post_layer_norm.h"

#include <gtest/gtest.h>
#include <mpreal.h>

#include <random>
#include <unsupported/Eigen/MPRealSupport>

#include "certify/block_norm_engine.h"
#include "certify/centred_engine.h"
#include "certify/pipeline.h"
#include "certify/post_ln_variation.h"
#include "certify/probable_norm.h"
#include "certify/search.h"
#include "certify/witness_eval.h"
#include "models/forward.h"
#include "models/random_layer.h"
#include "tests/certify/test_util.h"
#include "tests/common/test_scale.h"

namespace lipcert {

namespace {

using mpfr::mpreal;
using M = Eigen::Matrix<mpreal, Eigen::Dynamic, Eigen::Dynamic>;

using testing_util::RandomPostLn;

// ||J_f(x) v|| / ||v|| at 256 bits, in the norm.
double ExactRatio(const AttentionLayer& L, const Eigen::MatrixXd& x, const Eigen::MatrixXd& v, NormKind norm) {
  const M xm = x.cast<mpreal>(), vm = v.cast<mpreal>();
  const M y = Jvp<mpreal>(L, Evaluate<mpreal>(L, xm), vm);
  mpreal a = 0, b = 0;
  for (Eigen::Index k = 0; k < y.size(); ++k) {
    if (norm == NormKind::kL2) a += y(k) * y(k), b += vm(k) * vm(k);
    else a = mpfr::max(a, mpfr::abs(y(k))), b = mpfr::max(b, mpfr::abs(vm(k)));
  }
  return norm == NormKind::kL2 ? (mpfr::sqrt(a) / mpfr::sqrt(b)).toDouble(MPFR_RNDD) : (a / b).toDouble(MPFR_RNDD);
}

// A direction that nearly attains ||J_f(x)||: top right singular vector (l2) or the signs of
// the largest absolute row (inf), from the dense double Jacobian.
Eigen::MatrixXd TopDirection(const AttentionLayer& L, const Eigen::MatrixXd& x, NormKind norm) {
  const Eigen::MatrixXd j = DenseJacobian<double>(L, x);
  const int n = int(x.rows()), d = int(x.cols());
  Eigen::VectorXd v;
  if (norm == NormKind::kL2) {
    v = Eigen::JacobiSVD<Eigen::MatrixXd>(j, Eigen::ComputeFullV).matrixV().col(0);
  } else {
    Eigen::Index r = 0;
    j.cwiseAbs().rowwise().sum().maxCoeff(&r);
    v = j.row(r).transpose().unaryExpr([](double t) { return t >= 0 ? 1.0 : -1.0; });
  }
  return Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(v.data(), n, d);
}

// sigma_1(J_f(x)): the Jacobian formed in MPFR, its norm taken in double.
double SigmaMp(const AttentionLayer& L, const Eigen::MatrixXd& x) {
  const M j = DenseJacobian<mpreal>(L, M(x.cast<mpreal>()));
  Eigen::MatrixXd jd(j.rows(), j.cols());
  for (Eigen::Index r = 0; r < j.rows(); ++r)
    for (Eigen::Index k = 0; k < j.cols(); ++k) jd(r, k) = j(r, k).toDouble();
  return Eigen::JacobiSVD<Eigen::MatrixXd>(jd).singularValues()(0);
}

Eigen::MatrixXd RandomPointIn(const InputSet& set, std::mt19937_64& rng) {
  std::normal_distribution<double> g;
  std::uniform_real_distribution<double> u(0, 1);
  Eigen::MatrixXd dx = Eigen::MatrixXd::NullaryExpr(set.center.rows(), set.center.cols(), [&] { return g(rng); });
  dx *= set.radius * std::pow(u(rng), 0.2) / dx.norm();
  return set.Project(set.center + dx);
}

// Case c of the point tests: a random post-LN layer, a centre of 2 to 4 tokens and the MPFR
// sigma_1 of J_f there.
struct PointCase {
  AttentionLayer layer;
  Eigen::MatrixXd x;
  double sigma = 0;
};
PointCase RandomPointCase(long c, std::mt19937_64& rng) {
  std::normal_distribution<double> g;
  PointCase p;
  p.layer = RandomPostLn(int(c), rng);
  p.x = Eigen::MatrixXd::NullaryExpr(2 + c % 3, p.layer.d_model, [&] { return 2 * g(rng); });
  p.sigma = SigmaMp(p.layer, p.x);
  return p;
}

// Certify at radius 0 around x.
Certificate CertifyAtPoint(const AttentionLayer& L, const Eigen::MatrixXd& x, const CertifyOptions& o) {
  InputSet set;
  set.center = x;
  set.radius = 0;
  return Certify(L, set, o, Provenance{});
}

// The composition with MHA bounded by the block-norm / centred engines: many cases, cheap.

// EncloseY: Y0 = X0 + MHA(X0) (MPFR) lies within err_i of the centre row by row, err_i is
// within 1e-6 relative of |Y0| (a tight enclosure, not a vacuous one), err_frobenius covers
// the rows together; the composition's and the variation's covers of Y share its centre.
TEST(PostLayerNorm, EncloseYHoldsAndIsSharedByTheCovers) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(3701);
  std::normal_distribution<double> g;
  const long cases = testing::Count(24);
  long rows = 0;
  for (long c = 0; c < cases; ++c) {
    const AttentionLayer L = RandomPostLn(int(c), rng);
    const Eigen::MatrixXd x0 = Eigen::MatrixXd::NullaryExpr(2 + c % 4, L.d_model, [&] { return 2 * g(rng); });
    const YEnclosure y = EncloseY(L, x0);
    ASSERT_TRUE(y.finite) << "case " << c;
    const AttentionLayer mha = L.WithoutPostLayerNorm();
    const M ymp = M(x0.cast<mpreal>()) + Forward<mpreal>(mha, M(x0.cast<mpreal>()));
    double all2 = 0;
    for (Eigen::Index i = 0; i < x0.rows(); ++i) {
      mpreal d2 = 0, y2 = 0;
      for (Eigen::Index a = 0; a < x0.cols(); ++a) {
        d2 += (ymp(i, a) - mpreal(y.centre(i, a))) * (ymp(i, a) - mpreal(y.centre(i, a)));
        y2 += ymp(i, a) * ymp(i, a);
      }
      const double dist = mpfr::sqrt(d2).toDouble();
      EXPECT_LE(dist, y.err(i)) << "case " << c << " token " << i;
      EXPECT_LE(y.err(i), 1e-6 * mpfr::sqrt(y2).toDouble() + 1e-300) << "case " << c << " token " << i;
      all2 += dist * dist;
      ++rows;
    }
    EXPECT_LE(std::sqrt(all2), y.err_frobenius * (1 + 1e-12)) << "case " << c;
    InputSet set;
    set.center = x0;
    set.radius = 1e-3;
    const TokenCover cover = CoverOf(set);
    EXPECT_EQ(ComposePostLayerNorm(L, cover, UpperBound(1), UpperBound(1), NormKind::kL2).y_cover.center, y.centre);
    EXPECT_EQ(PostLnYCover(L, cover, Eigen::VectorXd::Zero(x0.rows())).center, y.centre);
  }
  EXPECT_GT(rows, 2 * cases);
}

// EncloseY keeps its last enclosures: a layer or centre that differs in any bit the forward
// reads (a weight, a bias, the mask, the centre) gets its own enclosure, which holds Y0 of that
// layer (MPFR); the same inputs again give the same bits.
TEST(PostLayerNorm, EncloseYKeptOnlyForTheSameLayerAndCentre) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(3702);
  std::normal_distribution<double> g;
  const long cases = testing::Count(8);
  long checked = 0, moved = 0;
  for (long c = 0; c < cases; ++c) {
    const AttentionLayer L = RandomPostLn(int(c), rng);
    const Eigen::MatrixXd x0 = Eigen::MatrixXd::NullaryExpr(2 + c % 3, L.d_model, [&] { return 2 * g(rng); });
    const YEnclosure y = EncloseY(L, x0);
    std::vector<std::pair<AttentionLayer, Eigen::MatrixXd>> variants;
    for (int field = 0; field < 7; ++field) {
      AttentionLayer v = L;
      Eigen::MatrixXd xv = x0;
      switch (field) {
        case 0: v.wq(0, 0) += 1e-3; break;
        case 1: v.wk(0, 1) += 1e-3; break;
        case 2: v.wv(0, 0) += 1e-3; break;
        case 3: v.wo(0, 0) += 1e-3; break;
        case 4: if (v.bo.size()) v.bo(0) += 1e-3; else v.bo = Eigen::VectorXd::Constant(v.d_model, 1e-3); break;
        case 5: v.causal = !v.causal; break;
        case 6: xv(0, 0) += 1e-3; break;
      }
      variants.push_back({v, xv});
    }
    for (const auto& [v, xv] : variants) {
      // The original just before, so that a key missing the changed field would return its enclosure.
      EXPECT_EQ(EncloseY(L, x0).centre, y.centre);
      const YEnclosure yv = EncloseY(v, xv);
      ASSERT_TRUE(yv.finite);
      const M ymp = M(xv.cast<mpreal>()) + Forward<mpreal>(v.WithoutPostLayerNorm(), M(xv.cast<mpreal>()));
      for (Eigen::Index i = 0; i < xv.rows(); ++i) {
        mpreal d2 = 0;
        for (Eigen::Index a = 0; a < xv.cols(); ++a)
          d2 += (ymp(i, a) - mpreal(yv.centre(i, a))) * (ymp(i, a) - mpreal(yv.centre(i, a)));
        EXPECT_LE(mpfr::sqrt(d2).toDouble(), yv.err(i)) << "case " << c << " token " << i;
      }
      moved += yv.centre != y.centre;
    }
    const YEnclosure again = EncloseY(L, x0);
    EXPECT_EQ(again.centre, y.centre);
    EXPECT_EQ(again.err, y.err);
    ++checked;
  }
  EXPECT_EQ(checked, cases);
  // The weights, the output bias and the centre move Y0 in every case (the mask where N > 1 and
  // not every key is visible anyway).
  EXPECT_GE(moved, 5 * cases);
}

TEST(PostLayerNorm, ComposedBoundDominatesMpfrValuesAtRandomPoints) {
  std::mt19937_64 rng(2024);
  std::normal_distribution<double> g;
  const long cases = testing::Count(24);
  long points = 0, layers = 0;
  for (long c = 0; c < cases; ++c) {
    const AttentionLayer L = RandomPostLn(int(c), rng);
    const AttentionLayer mha = L.WithoutPostLayerNorm();
    InputSet set;
    set.kind = c % 3 == 2 ? SetKind::kTokens : SetKind::kBall;
    set.center = Eigen::MatrixXd::NullaryExpr(3 + c % 2, L.d_model, [&] { return g(rng); });
    set.radius = c % 5 == 0 ? 0.0 : 0.02 * double(1 + c % 4);
    const TokenCover cover = CoverOf(set);
    for (NormKind norm : {NormKind::kL2, NormKind::kLinf}) {
      BoundOptions bo;
      bo.norm = NormKind::kL2;
      UpperBound u2 = BlockNormBound(mha, cover, bo).upper;
      if (CentredEngineRefusal(mha, set.tokens(), bo).empty()) u2 = Min(u2, CentredBound(mha, cover, bo).upper);
      bo.norm = norm;
      const UpperBound up = norm == NormKind::kL2 ? u2 : BlockNormBound(mha, cover, bo).upper;
      const PostLayerNormBound b = ComposePostLayerNorm(L, cover, u2, up, norm);
      ASSERT_TRUE(std::isfinite(b.upper.value())) << "case " << c;
      for (int k = 0; k < 4; ++k) {
        const Eigen::MatrixXd x = k == 0 ? set.center : RandomPointIn(set, rng);
        const Eigen::MatrixXd v = TopDirection(L, x, norm);
        const double exact = ExactRatio(L, x, v, norm);
        EXPECT_LE(exact, b.upper.value()) << "case " << c << " point " << k << " norm " << NormKindToString(norm);
        // The rigorous witness value never exceeds the exact one.
        const LowerBound w = WitnessLowerBound(L, x, v, norm);
        EXPECT_LE(w.value(), exact);
        EXPECT_GT(w.value(), exact * (1 - 1e-8));
        ++points;
      }
    }
    ++layers;
  }
  EXPECT_EQ(layers, cases);
  EXPECT_EQ(points, 8 * cases);
}

// The whole pipeline on post-LN layers: lower (rigorous) <= MPFR values <= upper.
TEST(PostLayerNorm, CertifyWitnessBelowBoundAndBoundAboveMpfr) {
  std::mt19937_64 rng(99);
  std::normal_distribution<double> g;
  const long cases = testing::Count(4);
  long checked = 0;
  for (long c = 0; c < cases; ++c) {
    const AttentionLayer L = RandomPostLn(int(c), rng);
    InputSet set;
    set.center = Eigen::MatrixXd::NullaryExpr(3, L.d_model, [&] { return g(rng); });
    set.radius = 0.05;
    CertifyOptions o;
    o.time_limit_s = 0.6;
    o.norm = c % 2 ? NormKind::kLinf : NormKind::kL2;
    const Certificate cert = Certify(L, set, o, Provenance{});
    EXPECT_TRUE(cert.post_layer_norm);
    EXPECT_FALSE(cert.layer_norm);
    ASSERT_TRUE(std::isfinite(cert.upper_bound.value()));
    EXPECT_GT(cert.lower_bound.value(), 0);
    EXPECT_LE(cert.lower_bound.value(), cert.upper_bound.value());
    // The composition; in norm 2 also the dense centre plus variation.
    // The composition, post_ln_centre (norm 2) and post_ln_variation.
    ASSERT_EQ(cert.engines.size(), o.norm == NormKind::kL2 ? 3u : 2u);
    EXPECT_EQ(cert.engines.back().id, EngineId::kPostLnVariation);
    EXPECT_EQ(cert.engines[0].id, EngineId::kPostLnComposition);
    ASSERT_TRUE(set.Contains(cert.witness.x));
    EXPECT_LE(cert.lower_bound.value(), ExactRatio(L, cert.witness.x, cert.witness.v, o.norm));
    for (int k = 0; k < 3; ++k) {
      const Eigen::MatrixXd x = RandomPointIn(set, rng);
      EXPECT_LE(ExactRatio(L, x, TopDirection(L, x, o.norm), o.norm), cert.upper_bound.value());
    }
    ++checked;
  }
  EXPECT_EQ(checked, cases);
}

// The probabilistic field of a post-LN certificate is f's own: at a point it is randomized
// Lanczos on J_f (above sigma_1 of J_f in MPFR, within the theorem's eps, between the
// witness and the certified bound); over a set there is none (no certified variation of J_f
// to add it to). MHA's own bound, which it once carried, can lie below f's witness.
TEST(PostLayerNorm, ProbabilisticFieldIsTheSublayersOwn) {
  mpfr::mpreal::set_default_prec(128);
  std::mt19937_64 rng(123);
  std::normal_distribution<double> g;
  const long cases = testing::Count(6);
  long checked = 0;
  for (long c = 0; c < cases; ++c) {
    const AttentionLayer L = RandomPostLn(int(c), rng);
    const Eigen::MatrixXd x = Eigen::MatrixXd::NullaryExpr(3, L.d_model, [&] { return 2 * g(rng); });
    const double sigma = SigmaMp(L, x);
    ProbableNormOptions po;
    po.seed = 3 + c;
    const ProbableUpperBound p = ProbableJacobianNormUpper(L, x, po);
    EXPECT_GE(p.value, sigma * (1 + 1e-12)) << "case " << c;
    EXPECT_LE(p.value, std::sqrt(1 + 1e-7) * sigma / std::sqrt(1 - p.epsilon) + 1e-12) << "case " << c;

    InputSet set;
    set.center = x;
    set.radius = 0;
    CertifyOptions o;
    o.time_limit_s = 0.6;
    o.probabilistic.seed = 5;
    const Certificate at_point = Certify(L, set, o, Provenance{});
    ASSERT_TRUE(at_point.probabilistic.has_value()) << "case " << c;
    EXPECT_GE(at_point.probabilistic->value, sigma * (1 + 1e-12)) << "case " << c;
    EXPECT_GE(at_point.probabilistic->value, at_point.lower_bound.value()) << "case " << c;
    EXPECT_LE(at_point.probabilistic->value, at_point.upper_bound.value()) << "case " << c;
    set.radius = 0.05;
    EXPECT_FALSE(Certify(L, set, o, Provenance{}).probabilistic.has_value()) << "case " << c;
    ++checked;
  }
  EXPECT_EQ(checked, cases);
}

// At a point the dense route certifies ||J_f(X0)||_2 itself: above sigma_1 of the MPFR
// Jacobian of LN(X + MHA(X)) and within 1e-6 of it, on random post-LN layers (dot and L2,
// masks, biases); in Certify it is the engine that wins at radius 0.
TEST(PostLayerNorm, DenseCentreIsExactAtAPoint) {
  mpfr::mpreal::set_default_prec(128);
  std::mt19937_64 rng(321);
  const long cases = testing::Count(8);
  long checked = 0;
  for (long c = 0; c < cases; ++c) {
    const auto [L, x, sigma] = RandomPointCase(c, rng);
    const EngineBound e = PostLnCentreBound(L, x, BoundOptions{});
    ASSERT_FALSE(e.timed_out) << "case " << c;
    EXPECT_GE(e.upper.value(), sigma * (1 + 1e-12)) << "case " << c;
    EXPECT_LE(e.upper.value(), sigma * (1 + 1e-6)) << "case " << c;
    ASSERT_EQ(e.terms.size(), 2u);

    CertifyOptions o;
    o.time_limit_s = 1;
    const Certificate cert = CertifyAtPoint(L, x, o);
    ASSERT_EQ(cert.engines.size(), 3u);
    EXPECT_EQ(cert.engines[1].id, EngineId::kPostLnCentre);
    EXPECT_EQ(cert.upper_bound.value(),
              std::min({cert.engines[0].upper.value(), e.upper.value(), cert.engines[2].upper.value()}))
        << "case " << c;
    EXPECT_LE(cert.lower_bound.value(), sigma * (1 + 1e-12)) << "case " << c;
    ++checked;
  }
  EXPECT_EQ(checked, cases);
}

// Over small balls the dense route adds the variation (MHA's centre_norm variation through
// sup ||J_LN||, and the LayerNorm's own variation): its bound stays above ||J_f|| in MPFR at
// the centre, at points on the boundary and at the ascent's points, and above the witness.
TEST(PostLayerNorm, DenseCentrePlusVariationDominatesOverSmallBalls) {
  mpfr::mpreal::set_default_prec(128);
  std::mt19937_64 rng(323);
  std::normal_distribution<double> g;
  const long cases = testing::Count(8);
  long checked = 0, routed = 0;
  for (long c = 0; c < cases; ++c) {
    const AttentionLayer L = RandomPostLn(int(c), rng);
    InputSet set;
    set.center = Eigen::MatrixXd::NullaryExpr(2 + c % 3, L.d_model, [&] { return 2 * g(rng); });
    set.radius = std::pow(10.0, -4 + int(c % 4));
    CertifyOptions o;
    o.time_limit_s = 1;
    const Certificate cert = Certify(L, set, o, Provenance{});
    ASSERT_EQ(cert.engines.size(), 3u) << "case " << c;
    const EngineResult& e = cert.engines[1];
    EXPECT_EQ(e.id, EngineId::kPostLnCentre);
    EXPECT_LE(cert.upper_bound.value(), e.upper.value());
    EXPECT_LE(cert.lower_bound.value(), cert.upper_bound.value()) << "case " << c;
    ++checked;
    if (!e.applied) continue;
    ++routed;
    ASSERT_EQ(e.terms.size(), 3u) << "case " << c;
    EXPECT_GE(e.upper.value(), cert.lower_bound.value()) << "case " << c;
    for (int k = 0; k < 6; ++k) {
      Eigen::MatrixXd x = set.center;
      if (k > 0) {
        Eigen::MatrixXd dx = Eigen::MatrixXd::NullaryExpr(x.rows(), x.cols(), [&] { return g(rng); });
        x = set.Project(set.center + set.radius * (k % 2 ? 1.0 : 0.5) * dx / dx.norm());
      }
      const double exact = ExactRatio(L, x, TopDirection(L, x, NormKind::kL2), NormKind::kL2);
      EXPECT_LE(exact, e.upper.value()) << "case " << c << " point " << k;
      EXPECT_LE(exact, cert.engines[2].upper.value()) << "post_ln_variation, case " << c << " point " << k;
    }
  }
  EXPECT_EQ(checked, cases);
  EXPECT_GT(routed, 0);  // the route gave a bound on some of the sets
}

// Above the dense size (forced here with dense_limit = 0) the centre comes from deflated
// super-blocks of J_LN(Yc) (I + J_MHA(X0)) with Lanczos vectors of J_f: above the MPFR
// sigma_1 of J_f for any number of vectors, within 1e-6 of it once they span everything,
// and the same through Certify.
TEST(PostLayerNorm, DeflatedCentreDominatesMpfrAndIsExactWithAFullBasis) {
  mpfr::mpreal::set_default_prec(128);
  std::mt19937_64 rng(324);
  const long cases = testing::Count(8);
  long checked = 0;
  for (long c = 0; c < cases; ++c) {
    const auto [L, x, sigma] = RandomPointCase(c, rng);
    const int nd = int(x.size());
    for (int k : {1, std::max(1, nd / 2), nd}) {
      BoundOptions o;
      o.dense_limit = 0;
      o.deflation_vectors = k;
      const EngineBound e = PostLnCentreBound(L, x, o);
      ASSERT_FALSE(e.timed_out) << "case " << c << " k " << k << " " << e.note;
      ASSERT_EQ(e.terms.size(), 2u);
      EXPECT_NE(e.terms[0].name.find("deflated by " + std::to_string(k) + " "), std::string::npos) << e.terms[0].name;
      EXPECT_GE(e.upper.value(), sigma) << "case " << c << " k " << k;
      if (k == nd) {
        EXPECT_LE(e.upper.value(), sigma * (1 + 1e-6)) << "case " << c;
      }
    }
    CertifyOptions o;
    o.time_limit_s = 2;
    o.engines.dense_limit = 0;  // MHA's centre_norm off, the post-LN centre deflated
    const Certificate cert = CertifyAtPoint(L, x, o);
    ASSERT_EQ(cert.engines.size(), 3u);
    EXPECT_EQ(cert.engines[1].id, EngineId::kPostLnCentre);
    EXPECT_TRUE(cert.engines[1].applied) << cert.engines[1].note;
    EXPECT_GE(cert.upper_bound.value(), sigma) << "case " << c;
    EXPECT_LE(cert.upper_bound.value(), sigma * (1 + 1e-6)) << "case " << c;
    EXPECT_LE(cert.lower_bound.value(), sigma * (1 + 1e-12)) << "case " << c;
    ++checked;
  }
  EXPECT_EQ(checked, cases);
}

// A deadline already passed: the dense route reports a timeout, never a number.
TEST(PostLayerNorm, DenseCentreHonoursItsDeadline) {
  std::mt19937_64 rng(322);
  const AttentionLayer L = RandomPostLn(0, rng);
  BoundOptions o;
  o.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  const EngineBound e = PostLnCentreBound(L, Eigen::MatrixXd::Ones(3, L.d_model), o);
  EXPECT_TRUE(e.timed_out);
  EXPECT_EQ(e.upper.value(), kInf);
}

// SearchLowerBound given a post-LN layer directly: its witness is re-evaluated on f, so it
// stays a proven lower bound (<= the MPFR value, <= the composed bound).
TEST(PostLayerNorm, SearchWitnessOnThePostLnLayerIsBelowTheBound) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> g;
  const long cases = testing::Count(4);
  long checked = 0;
  for (long c = 0; c < cases; ++c) {
    const AttentionLayer L = RandomPostLn(int(c), rng);
    InputSet set;
    set.center = Eigen::MatrixXd::NullaryExpr(3, L.d_model, [&] { return g(rng); });
    set.radius = 0.1;
    const NormKind norm = c % 2 ? NormKind::kLinf : NormKind::kL2;
    SearchOptions so;
    so.norm = norm;
    so.max_rounds = 1;
    so.time_limit_s = 0.5;
    so.threads = 1;
    const SearchResult sr = SearchLowerBound(L, set, so);
    const TokenCover cover = CoverOf(set);
    BoundOptions bo;
    const UpperBound u2 = BlockNormBound(L.WithoutPostLayerNorm(), cover, bo).upper;
    bo.norm = norm;
    const UpperBound up = BlockNormBound(L.WithoutPostLayerNorm(), cover, bo).upper;
    const PostLayerNormBound b = ComposePostLayerNorm(L, cover, u2, up, norm);
    ASSERT_GT(sr.best.lower_bound.value(), 0) << "case " << c;
    EXPECT_LE(sr.best.lower_bound.value(), b.upper.value());
    EXPECT_LE(sr.best.lower_bound.value(), ExactRatio(L, sr.best.x, sr.best.v, norm));
    ++checked;
  }
  EXPECT_EQ(checked, cases);
}

TEST(PostLayerNorm, BertCheckpointFullSublayerAndAttentionOnly) {
  CertifyRequest r;
  r.model.path = std::string(LIPCERT_SOURCE_DIR) + "/tests/data/checkpoints/bert";
  r.model.layer = 1;
  r.set.centre = "zero";
  r.set.tokens = 4;
  r.set.kind = SetKind::kBall;
  r.set.radius = 0.01;
  r.options.time_limit_s = 1;
  PreparedJob full = PrepareJob(r);
  ASSERT_TRUE(full.Layer().post_ln());
  std::mt19937_64 rng(5);
  std::normal_distribution<double> g;
  full.set.center = Eigen::MatrixXd::NullaryExpr(4, full.Layer().d_model, [&] { return g(rng); });
  const CertifyOutcome out = RunJob(full);
  EXPECT_TRUE(out.certificate.post_layer_norm);
  EXPECT_TRUE(std::isfinite(out.certificate.upper_bound.value()));
  EXPECT_GT(out.certificate.lower_bound.value(), 0);
  EXPECT_LE(out.certificate.lower_bound.value(), out.certificate.upper_bound.value());
  EXPECT_EQ(ToJson(out.certificate)["layer"]["post_layer_norm"], true);

  r.model.attention_only = true;
  PreparedJob mha = PrepareJob(r);
  EXPECT_FALSE(mha.Layer().post_ln());
  EXPECT_FALSE(mha.Layer().layer_norm.has_value());
  mha.set.center = full.set.center;
  const CertifyOutcome mout = RunJob(mha);
  EXPECT_FALSE(mout.certificate.post_layer_norm);
  EXPECT_EQ(ToJson(mout.certificate)["layer"]["post_layer_norm"], false);
}

}  // namespace
}  // namespace lipcert
