// Directed scalar operations against MPFR at 256 bits on adversarial inputs, plus the
// rounding canaries.
#include "interval/rounding.h"

#include <gtest/gtest.h>

#include <cfenv>
#include <functional>
#include <thread>

#include "interval/boost_interval.h"
#include "interval/interval.h"
#include "tests/interval/interval_test_util.h"

namespace lipcert {
namespace {

using testing::AdversarialDoubles;
using testing::Big;
using testing::Count;

using MpfrBinary = int (*)(mpfr_ptr, mpfr_srcptr, mpfr_srcptr, mpfr_rnd_t);
using MpfrUnary = int (*)(mpfr_ptr, mpfr_srcptr, mpfr_rnd_t);

// The correctly rounded directed double of an MPFR operation: 53 bits, then mpfr_get_d in
// the same direction (two roundings in one direction == one; see rounding_test notes).
double CorrectDirected(MpfrBinary op, double a, double b, mpfr_rnd_t rnd) {
  Big x(a, testing::Prec{53}), y(b, testing::Prec{53}), z(testing::Prec{53});
  op(z.get(), x.get(), y.get(), rnd);
  return z.ToDouble(rnd);
}

struct BinaryCase {
  const char* name;
  double (*up)(double, double);
  double (*down)(double, double);
  MpfrBinary op;
};

void CheckBinary(const BinaryCase& c, std::uint64_t seed, bool skip_zero_divisor) {
  AdversarialDoubles gen(seed);
  const long n = Count(100000);
  long tight = 0, checked = 0;
  for (long t = 0; t < n; ++t) {
    const double a = gen.Next();
    double b = gen.Related(a);
    if (skip_zero_divisor && b == 0.0) b = 1.0;
    Big x(a), y(b), lo, hi;
    c.op(lo.get(), x.get(), y.get(), MPFR_RNDD);
    c.op(hi.get(), x.get(), y.get(), MPFR_RNDU);
    const double up = c.up(a, b), down = c.down(a, b);
    ASSERT_TRUE(testing::AboveOrEqual(up, hi)) << c.name << "Up(" << a << ", " << b << ") = " << up;
    ASSERT_TRUE(testing::BelowOrEqual(down, lo)) << c.name << "Down(" << a << ", " << b << ") = " << down;
    // Tightness: at most one ulp beyond the correctly rounded result.
    const double cu = CorrectDirected(c.op, a, b, MPFR_RNDU), cd = CorrectDirected(c.op, a, b, MPFR_RNDD);
    ASSERT_LE(up, NextUp(cu)) << c.name << "Up(" << a << ", " << b << ")";
    ASSERT_GE(down, NextDown(cd)) << c.name << "Down(" << a << ", " << b << ")";
    if (std::fabs(cu) >= kExactErrorThreshold && std::fabs(cd) >= kExactErrorThreshold) {
      ++checked;
      tight += (up == cu && down == cd);
    }
  }
  // Outside the tiny range where the FMA error term may be inexact, results are the
  // correctly rounded ones.
  EXPECT_EQ(tight, checked) << c.name;
  EXPECT_GT(checked, n / 2) << c.name;
}

TEST(RoundingTest, AddAgainstMpfr) {
  CheckBinary({"Add", AddUp, AddDown, mpfr_add}, 1, false);
}
TEST(RoundingTest, SubAgainstMpfr) {
  CheckBinary({"Sub", SubUp, SubDown, mpfr_sub}, 2, false);
}
TEST(RoundingTest, MulAgainstMpfr) {
  CheckBinary({"Mul", MulUp, MulDown, mpfr_mul}, 3, false);
}
TEST(RoundingTest, DivAgainstMpfr) {
  CheckBinary({"Div", DivUp, DivDown, mpfr_div}, 4, true);
}

TEST(RoundingTest, AddIsExactlyCorrectlyRounded) {
  // TwoSum is exact for every finite input: Add must equal the correctly rounded result.
  AdversarialDoubles gen(11);
  const long n = Count(100000);
  for (long t = 0; t < n; ++t) {
    const double a = gen.Next(), b = gen.Related(a);
    ASSERT_EQ(AddUp(a, b), CorrectDirected(mpfr_add, a, b, MPFR_RNDU)) << a << " + " << b;
    ASSERT_EQ(AddDown(a, b), CorrectDirected(mpfr_add, a, b, MPFR_RNDD)) << a << " + " << b;
  }
}

TEST(RoundingTest, SqrtAgainstMpfr) {
  AdversarialDoubles gen(5);
  const long n = Count(100000);
  for (long t = 0; t < n; ++t) {
    const double a = std::fabs(gen.Next());
    Big x(a), lo, hi;
    mpfr_sqrt(lo.get(), x.get(), MPFR_RNDD);
    mpfr_sqrt(hi.get(), x.get(), MPFR_RNDU);
    ASSERT_TRUE(testing::AboveOrEqual(SqrtUp(a), hi)) << "SqrtUp(" << a << ")";
    ASSERT_TRUE(testing::BelowOrEqual(SqrtDown(a), lo)) << "SqrtDown(" << a << ")";
    ASSERT_LE(SqrtUp(a) - SqrtDown(a), 2 * (NextUp(std::sqrt(a)) - std::sqrt(a)));
  }
}

TEST(RoundingTest, SpecialValues) {
  const double M = kMaxDouble;
  EXPECT_EQ(AddUp(M, M), kInf);
  EXPECT_EQ(AddDown(M, M), M);  // the exact 2 DBL_MAX is above DBL_MAX
  EXPECT_EQ(AddUp(-M, -M), -M);
  EXPECT_EQ(AddDown(-M, -M), -kInf);
  EXPECT_EQ(MulUp(M, 2.0), kInf);
  EXPECT_EQ(MulDown(M, 2.0), M);
  EXPECT_EQ(MulUp(0.0, kInf), 0.0);  // interval convention
  EXPECT_EQ(MulDown(-kInf, 0.0), 0.0);
  EXPECT_EQ(MulUp(0x1p-1074, 0.5), 0x1p-1074);
  EXPECT_EQ(MulDown(0x1p-1074, 0.5), 0.0);
  EXPECT_EQ(MulUp(-0x1p-1074, 0.5), 0.0);
  EXPECT_EQ(DivUp(1.0, kInf), 0.0);
  EXPECT_EQ(DivUp(M, 0.5), kInf);
  EXPECT_EQ(DivDown(M, 0.5), M);
  EXPECT_EQ(DivUp(0x1p-1074, 2.0), 0x1p-1074);
  EXPECT_EQ(DivDown(0x1p-1074, 2.0), 0.0);
  EXPECT_EQ(AddUp(1.0, 0x1p-53), NextUp(1.0));  // a tie: round-to-nearest goes down to 1
  EXPECT_EQ(AddDown(1.0, 0x1p-53), 1.0);
  EXPECT_EQ(AddUp(1.0, -0x1p-54), 1.0);
  EXPECT_EQ(AddDown(1.0, -0x1p-54), NextDown(1.0));
  EXPECT_EQ(NextUp(-0x1p-1074), 0.0);
  EXPECT_EQ(NextUp(kInf), kInf);
  EXPECT_EQ(NextDown(-kInf), -kInf);
  EXPECT_EQ(NextUp(-kInf), -M);
  EXPECT_TRUE(std::isnan(AddUp(kInf, -kInf)));
  EXPECT_EQ(UpperBound(std::nan("")).value(), kInf);
  EXPECT_EQ(LowerBound(std::nan("")).value(), -kInf);
}

TEST(RoundingTest, GammaUpBoundsGamma) {
  for (double k : {1.0, 2.0, 3.0, 100.0, 1024.0, 1e5, 1e9, 0x1p52}) {
    Big ku(k), one(1.0), num, den, g;
    mpfr_mul_d(num.get(), ku.get(), kUnitRoundoff, MPFR_RNDU);
    mpfr_sub(den.get(), one.get(), num.get(), MPFR_RNDD);
    mpfr_div(g.get(), num.get(), den.get(), MPFR_RNDU);
    EXPECT_TRUE(testing::AboveOrEqual(GammaUp(k), g)) << k;
  }
  EXPECT_EQ(GammaUp(0x1p53), kInf);
}

// ---- canaries ----------------------------------------------------------------------------

TEST(RoundingCanaryTest, OneThirdHasPositiveWidth) {
  const Interval third = Interval(1.0) / Interval(3.0);
  EXPECT_GT(third.hi - third.lo, 0.0);
  Big one(1.0), lo, hi;
  mpfr_div_ui(lo.get(), one.get(), 3, MPFR_RNDD);
  mpfr_div_ui(hi.get(), one.get(), 3, MPFR_RNDU);
  EXPECT_TRUE(testing::BelowOrEqual(third.lo, lo));
  EXPECT_TRUE(testing::AboveOrEqual(third.hi, hi));
  EXPECT_EQ(third.hi, NextUp(third.lo));  // tight: adjacent doubles
  // The same through Boost.Interval on the mode-free policy.
  const BoostInterval b = BoostInterval(1.0) / BoostInterval(3.0);
  EXPECT_EQ(b.lower(), third.lo);
  EXPECT_EQ(b.upper(), third.hi);
}

// GCC bug 34678: with a mode-switching policy the compiler may compute x/y once and use
// it for both the downward and the upward result. The mode-free scheme evaluates both
// from the round-to-nearest quotient plus an exact remainder, so the merged division is
// harmless; this canary must hold at every optimisation level.
__attribute__((noinline)) Interval DivideTwice(double x, double y) {
  const double lo = DivDown(x, y);
  const double hi = DivUp(x, y);
  return Interval(lo, hi);
}
TEST(RoundingCanaryTest, ReorderingCase) {
  const Interval r = DivideTwice(1.0, 3.0);
  EXPECT_LT(r.lo, r.hi);
  // Also with constants the optimiser can see and fold.
  const double lo = DivDown(1.0, 3.0), hi = DivUp(1.0, 3.0);
  EXPECT_LT(lo, hi);
  EXPECT_EQ(lo, r.lo);
  EXPECT_EQ(hi, r.hi);
  // And between rounding modes: an upward-mode thread must not change our results...
  // but the entry points refuse to run at all outside round-to-nearest (next test).
}

TEST(RoundingCanaryTest, NewThreadsStartInRoundToNearest) {
  int mode = -1;
  std::thread t([&] { mode = std::fegetround(); });
  t.join();
  EXPECT_EQ(mode, FE_TONEAREST);
}

TEST(RoundingCanaryDeathTest, EntryPointsRefuseOtherModes) {
  EXPECT_DEATH(
      {
        std::fesetround(FE_UPWARD);
        RequireRoundToNearest();
      },
      "round-to-nearest");
}

TEST(RoundingCanaryTest, NamesForCertificates) {
  EXPECT_NE(std::string(RoundingModelName()).find("round-to-nearest"), std::string::npos);
}

}  // namespace
}  // namespace lipcert
