// Every reproduced published number is a test: the witness reaches the formula's value
// within the stated tolerance (1e-9 relative), the published bounds are reproduced to their
// printed digits, and no certified bound is below a witness.
#include "reports/validation.h"

#include <gtest/gtest.h>

#include <cmath>

#include "certify/certify.h"
#include "certify/closed_form.h"
#include "certify/witness_eval.h"

namespace lipcert::reports {
namespace {

constexpr double kTol = 1e-9;  // relative: the witness is evaluated at the double-rounded input

double CertifiedUpper(const AttentionLayer& L, SetKind kind, const Eigen::MatrixXd& centre, double r, NormKind norm) {
  InputSet set;
  set.kind = kind;
  set.center = centre;
  set.radius = r;
  CertifyOptions o;
  o.norm = norm;
  o.time_limit_s = 0.5;
  o.threads = 1;
  return Certify(L, set, o, Provenance{}).upper_bound.value();
}

TEST(Validation, KimPublishedBoundsReproduced) {
  // Kim et al.: 4 W0((N-1)/e) + 1 = 2.11, 5.40, 11.52, 18.68 at N = 2, 10, 100, 1000, to the
  // last printed digit (at N = 100 the exact value is 11.5146, printed 11.52).
  const int ns[] = {2, 10, 100, 1000};
  const double published[] = {2.11, 5.40, 11.52, 18.68};
  for (int i = 0; i < 4; ++i) {
    const double w = LambertW0((ns[i] - 1) / std::exp(1.0));
    EXPECT_NEAR(4 * w + 1, published[i], 0.01) << "N = " << ns[i];
    EXPECT_GE(LambertW0Upper((ns[i] - 1) / std::exp(1.0)), w);
    EXPECT_NEAR(w * std::exp(w), (ns[i] - 1) / std::exp(1.0), 1e-12 * ns[i]);
  }
}

TEST(Validation, KimTightnessConstructionAttainsItsFormula) {
  const AttentionLayer l2 = UnitLayer(AttentionKind::kL2);
  int checked = 0;
  for (int n : {3, 5, 11, 101, 1001}) {
    const Eigen::MatrixXd x = KimTightnessInput(n);
    const double formula = KimTightnessFormula(n);
    const double w = LambertW0((n - 1) / std::exp(1.0));
    const LowerBound witness = BestDirectionWitness(l2, x, NormKind::kLinf);
    EXPECT_GE(witness.value(), formula * (1 - kTol)) << "N = " << n;
    EXPECT_LE(witness.value(), 4 * w + 1) << "N = " << n << ": a witness above Kim's bound";
    if (n <= 101) {
      EXPECT_GE(CertifiedUpper(l2, SetKind::kBox, x, 0, NormKind::kLinf), witness.value()) << "N = " << n;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

TEST(Validation, DotAttentionGrowsWithoutBound) {
  // Kim et al.: x_1 = 0, the others at +-R: ||J e_1|| >= J_11 = 1/N + Var(x).
  const AttentionLayer dot = UnitLayer(AttentionKind::kDot);
  const int n = 8;
  Eigen::MatrixXd e1 = Eigen::MatrixXd::Zero(n, 1);
  e1(0, 0) = 1;
  double previous = 0;
  for (double r : {0.5, 1.0, 2.0, 4.0, 8.0, 16.0}) {
    const Eigen::MatrixXd x = VarianceInput(n, r * kInside);
    InputSet set;
    set.kind = SetKind::kTokens;
    set.center = Eigen::MatrixXd::Zero(n, 1);
    set.radius = r;
    ASSERT_TRUE(CertainlyInSet(set, x));
    const LowerBound w = WitnessLowerBound(dot, x, e1, NormKind::kL2);
    EXPECT_GE(w.value(), VarianceFormula(n, r) * (1 - kTol)) << "R = " << r;
    EXPECT_GT(w.value(), previous);
    previous = w.value();
    if (r <= 4) {
      EXPECT_GE(CertifiedUpper(dot, SetKind::kTokens, Eigen::MatrixXd::Zero(n, 1), r, NormKind::kL2), w.value());
    }
  }
  EXPECT_GT(previous, 16.0 * 16.0 / 2);  // Var grows like R^2: unbounded
}

TEST(Validation, CastinUnbalancedMassReachesTheFormula) {
  const AttentionLayer dot = UnitLayer(AttentionKind::kDot);
  int checked = 0;
  for (int light : {4, 16, 64}) {
    const int n = light + 1;
    const double r = 2 * std::sqrt(std::log(double(light)));
    const Eigen::MatrixXd x = UnbalancedInput(1, light, r * kInside);
    Eigen::MatrixXd e1 = Eigen::MatrixXd::Zero(n, 1);
    e1(0, 0) = 1;
    const LowerBound moving = WitnessLowerBound(dot, x, e1, NormKind::kL2);
    EXPECT_GE(moving.value(), CastinMassFormula(n) * (1 - kTol)) << "N = " << n;
    const LowerBound best = BestDirectionWitness(dot, x, NormKind::kL2);
    EXPECT_GE(best.value(), moving.value() * (1 - kTol));
    InputSet ball;
    ball.kind = SetKind::kTokens;
    ball.center = Eigen::MatrixXd::Zero(n, 1);
    ball.radius = r;
    ASSERT_TRUE(CertainlyInSet(ball, x));
    for (const ClosedFormBound& b : ClosedFormBounds(dot, ball, NormKind::kL2)) EXPECT_GE(b.upper.value(), best.value());
    EXPECT_GE(CertifiedUpper(dot, SetKind::kTokens, ball.center, r, NormKind::kL2), best.value());
    // Mass splitting at 2N tokens, same R: certified on that set is above both witnesses.
    const LowerBound split = BestDirectionWitness(dot, UnbalancedInput(2, 2 * n - 2, r * kInside), NormKind::kL2);
    EXPECT_GE(CertifiedUpper(dot, SetKind::kTokens, Eigen::MatrixXd::Zero(2 * n, 1), r, NormKind::kL2), split.value());
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

TEST(Validation, RunValidationIsConsistent) {
  ValidationOptions o;
  o.time_limit_s = 0.3;
  o.threads = 1;
  o.growth_radii = {1, 3};
  o.kim_tokens = {2, 3, 11};
  o.castin_light_tokens = {4};
  const ValidationResult r = RunValidation(o);
  ASSERT_EQ(r.growth.size(), 2u);
  for (const GrowthRow& g : r.growth) {
    EXPECT_GE(g.dot_upper, g.dot_lower);
    EXPECT_GE(g.dot_upper, g.variance_witness.value());
    EXPECT_GE(g.castin, g.variance_witness.value());
    EXPECT_GE(g.l2_upper, g.l2_lower);
    EXPECT_LE(g.l2_upper, g.kim);  // below Kim's radius-free bound
    EXPECT_TRUE(std::isfinite(g.kim));
  }
  EXPECT_EQ(r.growth[0].kim, r.growth[1].kim);
  EXPECT_GT(r.growth[1].variance_witness.value(), r.growth[0].variance_witness.value());
  ASSERT_EQ(r.kim.size(), 3u);
  for (const KimRow& k : r.kim) {
    EXPECT_GT(k.certified_upper, 0) << k.tokens;
    EXPECT_GE(k.certified_upper, k.construction_witness.value()) << k.tokens;
    EXPECT_LE(k.construction_witness.value(), k.kim_inf_bound) << k.tokens;
    if (k.tokens % 2) {
      EXPECT_GE(k.construction_witness.value(), k.construction_formula * (1 - kTol));
    }
  }
  EXPECT_NEAR(r.kim[0].published_bound, r.kim[0].kim_inf_bound, 0.01);
  ASSERT_EQ(r.castin.size(), 1u);
  EXPECT_GE(r.castin[0].moving_witness.value(), r.castin[0].formula * (1 - kTol));
  EXPECT_GE(r.castin[0].certified_upper, r.castin[0].best_witness.value());
  EXPECT_GE(r.castin[0].split_certified_upper, r.castin[0].split_witness.value());
  const std::vector<Section> sections = ValidationSections(r);
  EXPECT_EQ(sections.size(), 3u);
}

}  // namespace
}  // namespace lipcert::reports
