// The block-norm engine: scaling, monotonicity and symmetry properties, radius-free L2
// bounds, its breakdown by term and its deadline.
#include <gtest/gtest.h>

#include "certify/block_norm_engine.h"

#include "tests/certify/engine_cases.h"

namespace lipcert {
namespace {

using namespace testing_util;

TEST(BlockNormEngineTest, ScalingValueWeightScalesBlockBound) {
  std::mt19937_64 rng(11);
  for (int t = 0; t < 50; ++t) {
    Case c = RandomCase(rng);
    c.layer.layer_norm.reset();  // the residual's identity does not scale
    c.layer.bv.resize(0);
    BoundOptions o;
    o.norm = c.norm;
    const double b1 = BlockNormUpperBound(c.layer, CoverOf(c.set), o).value();
    c.layer.wv *= 2;
    const double b2 = BlockNormUpperBound(c.layer, CoverOf(c.set), o).value();
    EXPECT_NEAR(b2, 2 * b1, 1e-9 * b1) << "case " << t;
  }
}

TEST(BlockNormEngineTest, SubsetBoundIsAtMostSupersetBound) {
  std::mt19937_64 rng(13);
  for (int t = 0; t < 50; ++t) {
    Case c = RandomCase(rng);
    BoundOptions o;
    o.norm = c.norm;
    const double big = BlockNormUpperBound(c.layer, CoverOf(c.set), o).value();
    c.set.radius *= 0.5;
    const double small = BlockNormUpperBound(c.layer, CoverOf(c.set), o).value();
    EXPECT_LE(small, big) << "case " << t;
  }
}

TEST(BlockNormEngineTest, TokenPermutationLeavesUnmaskedBoundUnchanged) {
  std::mt19937_64 rng(17);
  constexpr int kWanted = 30;
  int checked = 0;
  for (int t = 0; t < 300 && checked < kWanted; ++t) {
    Case c = RandomCase(rng);
    if (c.layer.causal || c.set.tokens() < 2) continue;
    BoundOptions o;
    o.norm = c.norm;
    const double b1 = BlockNormUpperBound(c.layer, CoverOf(c.set), o).value();
    ASSERT_TRUE(std::isfinite(b1) && b1 > 0) << "case " << t << ": bound " << b1;
    // A permutation that moves token 0 (a plain shuffle may return the identity).
    Eigen::PermutationMatrix<Eigen::Dynamic> perm(c.set.tokens());
    perm.setIdentity();
    std::shuffle(perm.indices().data(), perm.indices().data() + perm.size(), rng);
    if (perm.indices()(0) == 0) std::swap(perm.indices()(0), perm.indices()(1));
    const Eigen::MatrixXd before = c.set.center;
    c.set.center = perm * c.set.center;
    // Only a case whose permuted centre really differs tests anything.
    if (c.set.center == before) continue;
    const double b2 = BlockNormUpperBound(c.layer, CoverOf(c.set), o).value();
    EXPECT_NEAR(b1, b2, 1e-9 * b1) << "case " << t;
    ++checked;
  }
  ASSERT_EQ(checked, kWanted) << "too few unmasked cases with two distinct tokens";
}

// Certified bounds of L2 attention stop growing with the radius: for layers without
// LayerNorm, the block-norm bound at radius 1e3 equals the one at 1e4, and stays above the
// Jacobian norms sampled, in MPFR, at inputs of every scale up to that radius.
TEST(BlockNormEngineLongTest, L2BlockBoundIsRadiusFreeAndSound) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(20261206);
  int checked = 0;
  for (int t = 0; t < 400 && checked < 40; ++t) {
    AttentionLayer L = RandomLayer(rng);
    if (L.kind != AttentionKind::kL2) continue;
    L.layer_norm.reset();
    InputSet set = RandomSet(rng, std::uniform_int_distribution<int>(1, 4)(rng), L.d_model);
    set.kind = SetKind::kTokens;
    BoundOptions o;
    set.radius = 1e3;
    const double big = BlockNormUpperBound(L, CoverOf(set), o).value();
    set.radius = 1e4;
    const double huge = BlockNormUpperBound(L, CoverOf(set), o).value();
    EXPECT_EQ(big, huge) << "case " << t;
    ASSERT_TRUE(std::isfinite(huge));
    for (double r : {0.1, 1.0, 10.0, 100.0}) {
      set.radius = r;
      for (int s = 0; s < 3; ++s) {
        const double j = JacobianNormMp(L, SamplePoint(rng, set, s == 0), NormKind::kL2);
        ASSERT_GE(huge, j * (1 - 1e-12)) << "case " << t << " radius " << r;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 40);  // about half the random layers are l2
}

// The breakdown: the terms are present and finite, each at most the bound, and they add
// up to it; the wrapper returns the same number.
TEST(BlockNormEngineTest, BreakdownTermsAddUpToTheBound) {
  std::mt19937_64 rng(41);
  const int cases = int(200 * TestScale());
  int checked = 0;
  for (int t = 0; t < cases; ++t) {
    const Case c = RandomCase(rng);
    BoundOptions o;
    o.norm = c.norm;
    o.exclude_residual = t % 4 == 0;
    const TokenCover cover = CoverOf(c.set);
    const EngineBound b = BlockNormBound(c.layer, cover, o);
    ASSERT_FALSE(b.timed_out);
    ASSERT_TRUE(std::isfinite(b.upper.value())) << "case " << t;
    EXPECT_EQ(b.upper.value(), BlockNormUpperBound(c.layer, cover, o).value());
    ASSERT_FALSE(b.terms.empty());
    ASSERT_FALSE(b.alternatives.empty());
    double sum = 0;
    for (const BoundTerm& term : b.terms) {
      EXPECT_FALSE(term.name.empty());
      ASSERT_TRUE(std::isfinite(term.value.value())) << term.name;
      EXPECT_LE(term.value.value(), b.upper.value()) << term.name;
      sum = AddUp(sum, term.value.value());
    }
    EXPECT_EQ(sum, b.upper.value()) << "case " << t;
    EXPECT_EQ(b.terms.size(), c.layer.residual() && !o.exclude_residual ? 2u : 1u);
    for (const BoundTerm& alt : b.alternatives) EXPECT_TRUE(std::isfinite(alt.value.value())) << alt.name;
    ++checked;
  }
  EXPECT_EQ(checked, cases);
}

// A deadline that has already passed gives +inf and timed_out, never a finite number.
TEST(BlockNormEngineTest, PassedDeadlineGivesInfinityAndTimedOut) {
  std::mt19937_64 rng(43);
  for (int t = 0; t < 20; ++t) {
    const Case c = RandomCase(rng);
    BoundOptions o;
    o.norm = c.norm;
    o.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);
    const EngineBound b = BlockNormBound(c.layer, CoverOf(c.set), o);
    EXPECT_TRUE(b.timed_out);
    EXPECT_EQ(b.upper.value(), kInf);
    EXPECT_TRUE(b.terms.empty());
    EXPECT_FALSE(b.note.empty());
    EXPECT_EQ(BlockNormUpperBound(c.layer, CoverOf(c.set), o).value(), kInf);
  }
}

// A deadline far ahead changes nothing.
TEST(BlockNormEngineTest, DistantDeadlineLeavesTheBoundUnchanged) {
  std::mt19937_64 rng(47);
  for (int t = 0; t < 20; ++t) {
    const Case c = RandomCase(rng);
    BoundOptions o;
    o.norm = c.norm;
    const double free_bound = BlockNormUpperBound(c.layer, CoverOf(c.set), o).value();
    o.deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
    const EngineBound b = BlockNormBound(c.layer, CoverOf(c.set), o);
    EXPECT_FALSE(b.timed_out);
    EXPECT_EQ(b.upper.value(), free_bound);
  }
}

}  // namespace
}  // namespace lipcert
