// Branch and bound: split bounds dominate witnesses, and the structured bound of a cover
// runs the centred engine exactly where CentredEngineRefusal allows it.
#include <gtest/gtest.h>

#include "certify/branch_and_bound.h"

#include "certify/block_norm_engine.h"
#include "certify/centred_engine.h"
#include "tests/certify/engine_cases.h"

namespace lipcert {
namespace {

using namespace testing_util;

// Branch and bound splits the set and covers pieces by its own logic (piece covers,
// disjointness pruning, parent caps): its bound must dominate the witnesses too.
TEST(BranchAndBoundLongTest, SplitBoundsDominateWitnessedLowerBounds) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(31);
  const int cases = int(150 * TestScale());
  int split_cases = 0;
  for (int t = 0; t < cases; ++t) {
    RandomLayerOptions lo;
    lo.max_tokens = 2;
    lo.max_width = 2;
    const AttentionLayer layer = RandomLayer(rng, lo);
    const InputSet set = RandomSet(rng, std::uniform_int_distribution<int>(1, 2)(rng), layer.d_model);
    const NormKind norm = t % 2 ? NormKind::kL2 : NormKind::kLinf;
    double lower = JacobianNormMp(layer, set.center, norm);
    for (int s = 0; s < 8; ++s) lower = std::max(lower, JacobianNormMp(layer, SamplePoint(rng, set, s % 2), norm));
    BranchAndBoundOptions o;
    o.norm = norm;
    o.tolerance = 0;      // never stop early: split until the piece budget is spent
    o.max_pieces = 40;
    o.time_limit_s = 5;
    const BranchAndBoundResult r = BranchAndBound(layer, set, LowerBound(0), o);
    ASSERT_GE(r.upper.value(), lower * (1 - 1e-12)) << "case " << t;
    split_cases += r.pieces_explored > 1;
  }
  EXPECT_GT(split_cases, cases / 2);
}

// The structured bound of a cover is the block-norm bound, improved by the centred one
// exactly where CentredEngineRefusal allows it.
TEST(BranchAndBoundTest, StructuredBoundUsesCentredEngineWhereItApplies) {
  std::mt19937_64 rng(61);
  int centred = 0, block_only = 0;
  for (int t = 0; t < 60; ++t) {
    const Case c = RandomCase(rng);
    BoundOptions o;
    o.norm = c.norm;
    o.dense_limit = 6;
    const TokenCover cover = CoverOf(c.set);
    const double block = BlockNormUpperBound(c.layer, cover, o).value();
    const double best = BestStructuredBound(c.layer, cover, o).value();
    if (CentredEngineRefusal(c.layer, c.set.tokens(), o).empty()) {
      EXPECT_EQ(best, std::min(block, CentredUpperBound(c.layer, cover, o).value()));
      ++centred;
    } else {
      EXPECT_EQ(best, block);
      ++block_only;
    }
  }
  EXPECT_GT(centred, 0);
  EXPECT_GT(block_only, 0);
}

}  // namespace
}  // namespace lipcert
