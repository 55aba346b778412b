// The radii of an input set are upper bounds: checked against MPFR at 256 bits.
#include "certify/input_set.h"

#include <gtest/gtest.h>
#include <mpreal.h>

#include <random>

#include "certify/token_cover.h"
#include "tests/common/test_scale.h"

namespace lipcert {
namespace {

TEST(InputSetTest, RadiiAreUpperBounds) {
  mpfr::mpreal::set_default_prec(256);
  std::mt19937_64 rng(71);
  const long cases = testing::Count(2000);
  long checked = 0;
  for (long t = 0; t < cases; ++t) {
    InputSet s;
    s.kind = static_cast<SetKind>(t % 3);
    const int n = std::uniform_int_distribution<int>(1, 64)(rng), d = std::uniform_int_distribution<int>(1, 1024)(rng);
    s.center = Eigen::MatrixXd::Zero(n, d);
    s.radius = std::pow(10.0, std::uniform_real_distribution<double>(-8, 3)(rng));
    const mpfr::mpreal r = s.radius;
    const mpfr::mpreal token = s.kind == SetKind::kBox ? r * mpfr::sqrt(mpfr::mpreal(d)) : r;
    const mpfr::mpreal frob = s.kind == SetKind::kBall     ? r
                              : s.kind == SetKind::kTokens ? r * mpfr::sqrt(mpfr::mpreal(n))
                                                           : r * mpfr::sqrt(mpfr::mpreal(n) * d);
    ASSERT_GE(mpfr::mpreal(s.TokenRadius()), token) << "case " << t;
    ASSERT_GE(mpfr::mpreal(s.FrobeniusRadius()), frob) << "case " << t;
    // Tight: two directed roundings, a few units of roundoff at most.
    EXPECT_LE(s.TokenRadius(), token.toDouble() * (1 + 6 * kUnitRoundoff)) << "case " << t;
    EXPECT_LE(s.FrobeniusRadius(), frob.toDouble() * (1 + 6 * kUnitRoundoff)) << "case " << t;
    const TokenCover c = CoverOf(s);
    ASSERT_GE(mpfr::mpreal(JointRadiusUp(c).value()), std::min(frob, token * mpfr::sqrt(mpfr::mpreal(n))));
    ++checked;
  }
  EXPECT_EQ(checked, cases);
}

}  // namespace
}  // namespace lipcert
