// Soundness of the upper-bound engines together: on random small layers and sets, every
// certified bound (block-norm, centred, closed forms) is at least every witnessed lower
// bound (Jacobian norms at sampled points and difference quotients, both evaluated in MPFR
// at 256 bits, and the lower-bound search's rigorously re-evaluated witnesses).
#include <gtest/gtest.h>

#include "certify/jacobian_bounds.h"
#include "certify/centred_engine.h"
#include "certify/closed_form.h"
#include "certify/centre_norm.h"
#include "certify/curvature.h"
#include "certify/taylor.h"
#include "certify/search.h"
#include "tests/certify/engine_cases.h"

namespace lipcert {
namespace {

using namespace testing_util;

TEST(JacobianBoundsLongTest, UpperBoundsDominateWitnessedLowerBounds) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(20261202);
  const int cases = int(1000 * TestScale());
  int centred_cases = 0, closed_form_cases = 0, centre_norm_inf_cases = 0;
  for (int t = 0; t < cases; ++t) {
    const Case c = RandomCase(rng);
    const double lower = WitnessedLower(rng, c, 6);
    BoundOptions o;
    o.norm = c.norm;
    const TokenCover cover = CoverOf(c.set);
    const double block = BlockNormUpperBound(c.layer, cover, o).value();
    // Witnessed values carry ~1e-15 relative error from the double SVD of the MPFR Jacobian.
    ASSERT_GE(block, lower * (1 - 1e-12)) << "block-norm engine, case " << t;
    for (const ClosedFormBound& b : ClosedFormBounds(c.layer, c.set, c.norm)) {
      ASSERT_GE(b.upper.value(), lower * (1 - 1e-12)) << b.name << ", case " << t;
      ++closed_form_cases;
    }
    if (c.norm == NormKind::kL2) {
      const double centred = CentredUpperBound(c.layer, cover, o).value();
      ASSERT_GE(centred, lower * (1 - 1e-12)) << "centred engine, case " << t;
      // The pipeline's centre_norm engine, with one dense centre certificate and with
      // token super-blocks (centre_dense_limit 0).
      for (long centre_dense_limit : {long(1) << 30, 0L}) {
        const EngineBound cn = CentreNormBound(c.layer, cover, o, centre_dense_limit);
        ASSERT_FALSE(cn.timed_out);
        ASSERT_GE(cn.upper.value(), lower * (1 - 1e-12))
            << "centre_norm engine (dense limit " << centre_dense_limit << "), case " << t;
      }
      ++centred_cases;
    } else {
      // The inf norm: the enclosure's row sums at the centre plus the inf-norm variation.
      const EngineBound cn = CentreNormBound(c.layer, cover, o, 0);
      ASSERT_FALSE(cn.timed_out);
      ASSERT_GE(cn.upper.value(), lower * (1 - 1e-12)) << "centre_norm engine (inf), case " << t;
      ++centre_norm_inf_cases;
    }
  }
  EXPECT_GT(centred_cases, cases / 4);
  EXPECT_GT(centre_norm_inf_cases, cases / 4);
  EXPECT_GT(closed_form_cases, cases / 10);
}

// Stronger witnesses than samples: the lower-bound search (ascent from structured and random
// starts, rigorously re-evaluated) on random layers and sets with radii up to 10, where the
// radius-free L2 caps, the P (1 - P) factor and the spread bounds are the active ones.
// Every engine's bound stays at or above the searched witness.
TEST(JacobianBoundsLongTest, EnginesDominateSearchedWitnesses) {
  std::mt19937_64 rng(20261207);
  const int cases = int(300 * TestScale());
  double tightest = kInf;
  int checked = 0, taylor_cases = 0;
  for (int t = 0; t < cases; ++t) {
    const AttentionLayer L = RandomLayer(rng);
    InputSet set = RandomSet(rng, std::uniform_int_distribution<int>(2, 4)(rng), L.d_model);
    set.radius = std::pow(10.0, std::uniform_real_distribution<double>(-2, 1)(rng));
    const NormKind norm = t % 3 == 2 ? NormKind::kLinf : NormKind::kL2;
    SearchOptions so;
    so.norm = norm;
    so.starts = 8;
    so.max_steps = 60;
    so.max_rounds = 1;
    so.threads = 1;
    so.seed = 100 + t;
    const double witness = SearchLowerBound(L, set, so).best.lower_bound.value();
    BoundOptions o;
    o.norm = norm;
    const double block = BlockNormUpperBound(L, CoverOf(set), o).value();
    ASSERT_GE(block, witness) << "block-norm engine, case " << t;
    tightest = std::min(tightest, block / witness);
    if (norm == NormKind::kL2) {
      const double centred = CentredUpperBound(L, CoverOf(set), o).value();
      ASSERT_GE(centred, witness) << "centred engine, case " << t;
      tightest = std::min(tightest, centred / witness);
    }
    const double centre_norm = CentreNormBound(L, CoverOf(set), o, 1L << 30).upper.value();
    ASSERT_GE(centre_norm, witness) << "centre_norm engine, case " << t;
    tightest = std::min(tightest, centre_norm / witness);
    if (norm == NormKind::kL2 && L.kind == AttentionKind::kDot && !L.layer_norm) {
      // The Taylor stage's bound (certify/taylor.h): centre + curvature x radius + remainder.
      const double taylor = TaylorVariationBound(L, CentreJacobianNormUpperBound(L, set.center), CoverOf(set),
                                                 CentreCurvatureUpperBound(L, set.center))
                                .upper.value();
      ASSERT_GE(taylor, witness) << "taylor, case " << t;
      tightest = std::min(tightest, taylor / witness);
      ++taylor_cases;
    }
    ++checked;
  }
  EXPECT_EQ(checked, cases);
  EXPECT_GT(taylor_cases, cases / 10);
  EXPECT_GT(checked, 0);
  std::printf("searched witnesses: tightest upper / witness %.4g\n", tightest);
}

}  // namespace
}  // namespace lipcert
