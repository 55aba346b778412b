// exp and log bounds of both back ends, and the interval operations, against MPFR at 256
// bits on adversarial inputs.
#include "interval/elementary.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "interval/boost_interval.h"
#include "tests/interval/interval_test_util.h"

namespace lipcert {
namespace {

using testing::AdversarialDoubles;
using testing::Big;
using testing::Count;

// Exp arguments: mostly where exp is finite and nonzero, plus the over/underflow edges,
// tiny arguments (exp(x) ~ 1 + x), subnormals, huge and infinite ones.
double ExpArgument(AdversarialDoubles& g) {
  switch (g.Bits() % 8) {
    case 0:
      return g.Uniform(-30, 30);
    case 1:
      return g.Uniform(-746, 710);
    case 2:
      return g.Uniform(700, 710);  // near overflow (709.78)
    case 3:
      return g.Uniform(-750, -700);  // subnormal results and underflow (-745.13)
    case 4:
      return std::ldexp(g.Uniform(-1, 1), -static_cast<int>(g.Bits() % 80));
    case 5:
      return g.Next();
    case 6:
      return std::nextafter(709.782712893384, (g.Bits() % 2) ? 800.0 : 0.0);
    default:
      return (g.Bits() % 2) ? g.Uniform(-1, 1) : std::ldexp(1.0, static_cast<int>(g.Bits() % 20) - 10);
  }
}
double LogArgument(AdversarialDoubles& g) {
  switch (g.Bits() % 5) {
    case 0:
      return std::fabs(g.Next());
    case 1:
      return 1.0 + g.Uniform(-1e-6, 1e-6);
    case 2:
      return std::fabs(std::bit_cast<double>(g.Bits() & ((std::uint64_t{1} << 52) - 1)));  // subnormal
    case 3:
      return g.Uniform(0, 100);
    default:
      return std::nextafter(1.0, (g.Bits() % 2) ? 2.0 : 0.0);
  }
}

class ElementaryTest : public ::testing::TestWithParam<ExpBackend> {};

constexpr ExpBackend kBackends[] = {ExpBackend::kMpfr, ExpBackend::kFastWidened};

TEST(ElementaryContainmentTest, ExpContainsMpfr) {
  AdversarialDoubles g(21);
  const long n = Count(100000);
  for (long t = 0; t < n; ++t) {
    const double x = ExpArgument(g);
    Big lo, hi;
    testing::EncloseUnary(mpfr_exp, x, &lo, &hi);
    for (ExpBackend b : kBackends) {
      const double u = ExpUpper(x, b), l = ExpLower(x, b);
      ASSERT_TRUE(testing::AboveOrEqual(u, hi)) << ExpBackendName(b) << " ExpUpper(" << x << ") = " << u;
      ASSERT_TRUE(testing::BelowOrEqual(l, lo)) << ExpBackendName(b) << " ExpLower(" << x << ") = " << l;
      ASSERT_GE(l, 0.0);
      // Width: at most 5 ulps of the result (2 each side for the fast back end).
      if (std::isfinite(u) && l > 0x1p-1000) {
        ASSERT_LE(u, NextUp(NextUp(NextUp(NextUp(NextUp(l)))))) << x;
      }
    }
  }
}

TEST(ElementaryContainmentTest, LogContainsMpfr) {
  AdversarialDoubles g(22);
  const long n = Count(100000);
  for (long t = 0; t < n; ++t) {
    const double x = LogArgument(g);
    if (x == 0) continue;
    Big lo, hi;
    testing::EncloseUnary(mpfr_log, x, &lo, &hi);
    for (ExpBackend b : kBackends) {
      const double u = LogUpper(x, b), l = LogLower(x, b);
      ASSERT_TRUE(testing::AboveOrEqual(u, hi)) << ExpBackendName(b) << " LogUpper(" << x << ") = " << u;
      ASSERT_TRUE(testing::BelowOrEqual(l, lo)) << ExpBackendName(b) << " LogLower(" << x << ") = " << l;
    }
  }
}

TEST_P(ElementaryTest, SpecialValues) {
  const ExpBackend b = GetParam();
  EXPECT_EQ(ExpUpper(1000.0, b), kInf);
  EXPECT_GT(ExpLower(1000.0, b), 1e308);
  EXPECT_EQ(ExpLower(-1000.0, b), 0.0);
  EXPECT_GT(ExpUpper(-1000.0, b), 0.0);
  EXPECT_EQ(ExpLower(-kInf, b), 0.0);
  EXPECT_EQ(ExpUpper(-kInf, b), 0.0);
  EXPECT_EQ(ExpUpper(kInf, b), kInf);
  EXPECT_LE(ExpLower(0.0, b), 1.0);
  EXPECT_GE(ExpUpper(0.0, b), 1.0);
  EXPECT_EQ(LogLower(0.0, b), -kInf);
  EXPECT_EQ(LogUpper(kInf, b), kInf);
  EXPECT_TRUE(std::isnan(LogUpper(-1.0, b)));
  const Interval e = Exp(Interval(-1.0, 2.0), b);
  EXPECT_LT(e.lo, std::exp(-1.0) * (1 + 1e-15));
  EXPECT_GT(e.hi, std::exp(2.0) * (1 - 1e-15));
  const Interval l = Log(Interval(0.0, 1.0), b);
  EXPECT_EQ(l.lo, -kInf);
  EXPECT_GE(l.hi, 0.0);
}

TEST_P(ElementaryTest, ThreadSafe) {
  const ExpBackend b = GetParam();
  std::vector<std::thread> ts;
  std::vector<int> bad(4, 0);
  for (int k = 0; k < 4; ++k)
    ts.emplace_back([&, k] {
      for (int i = 0; i < 2000; ++i) {
        const double x = -20.0 + 0.01 * i + 0.001 * k;
        if (!(ExpLower(x, b) <= std::exp(x) * (1 + 1e-15) && ExpUpper(x, b) >= std::exp(x) * (1 - 1e-15)))
          ++bad[k];
      }
    });
  for (auto& t : ts) t.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(bad[k], 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, ElementaryTest,
                         ::testing::Values(ExpBackend::kMpfr, ExpBackend::kFastWidened),
                         [](const auto& info) {
                           return std::string(info.param == ExpBackend::kMpfr ? "Mpfr" : "FastWidened");
                         });

TEST(ElementaryNamesTest, RoundTrip) {
  for (ExpBackend b : {ExpBackend::kMpfr, ExpBackend::kFastWidened}) {
    ExpBackend c = b == ExpBackend::kMpfr ? ExpBackend::kFastWidened : ExpBackend::kMpfr;
    ASSERT_TRUE(StringToExpBackend(ExpBackendName(b), &c));
    EXPECT_EQ(c, b);
  }
  ExpBackend c = ExpBackend::kMpfr;
  EXPECT_FALSE(StringToExpBackend("arb", &c));
  const NumericsTag tag = CurrentNumericsTag(ExpBackend::kMpfr);
  EXPECT_STREQ(tag.exp_backend, "mpfr-53-directed");
  EXPECT_STREQ(tag.rounding_model, RoundingModelName());
}

// ---- interval operations: containment of the exact result at sample points ----------------

// A random interval from adversarial endpoints, and points inside it to test at.
Interval RandomInterval(AdversarialDoubles& g) {
  double a = g.Next(), b = (g.Bits() % 3 == 0) ? a : g.Related(a);
  if (g.Bits() % 4 == 0) b = a + std::fabs(a) * g.Uniform(0, 1e-3);
  if (!std::isfinite(b)) b = a;
  return Interval(std::min(a, b), std::max(a, b));
}
double PointIn(AdversarialDoubles& g, const Interval& x) {
  switch (g.Bits() % 3) {
    case 0:
      return x.lo;
    case 1:
      return x.hi;
    default: {
      const double m = x.lo + (x.hi - x.lo) * g.Uniform(0, 1);
      return std::isfinite(m) ? std::clamp(m, x.lo, x.hi) : x.lo;
    }
  }
}

using BigBinary = int (*)(mpfr_ptr, mpfr_srcptr, mpfr_srcptr, mpfr_rnd_t);

void CheckIntervalBinary(const char* name, Interval (*op)(const Interval&, const Interval&), BigBinary ref,
                         std::uint64_t seed) {
  AdversarialDoubles g(seed);
  const long n = Count(100000);
  for (long t = 0; t < n; ++t) {
    const Interval x = RandomInterval(g), y = RandomInterval(g);
    const double px = PointIn(g, x), py = PointIn(g, y);
    if (ref == mpfr_div && py == 0) continue;
    const Interval r = op(x, y);
    Big a(px), b(py), lo, hi;
    ref(lo.get(), a.get(), b.get(), MPFR_RNDD);
    ref(hi.get(), a.get(), b.get(), MPFR_RNDU);
    ASSERT_TRUE(testing::BelowOrEqual(r.lo, lo) && testing::AboveOrEqual(r.hi, hi))
        << name << " " << x.ToString() << " , " << y.ToString() << " -> " << r.ToString() << " at " << px << ", "
        << py;
  }
}

TEST(IntervalOpsTest, AddContains) {
  CheckIntervalBinary("+", [](const Interval& a, const Interval& b) { return a + b; }, mpfr_add, 31);
}
TEST(IntervalOpsTest, SubContains) {
  CheckIntervalBinary("-", [](const Interval& a, const Interval& b) { return a - b; }, mpfr_sub, 32);
}
TEST(IntervalOpsTest, MulContains) {
  CheckIntervalBinary("*", [](const Interval& a, const Interval& b) { return a * b; }, mpfr_mul, 33);
}
TEST(IntervalOpsTest, DivContains) {
  CheckIntervalBinary("/", [](const Interval& a, const Interval& b) { return a / b; }, mpfr_div, 34);
}
TEST(IntervalOpsTest, BoostMulOnModeFreePolicyContains) {
  CheckIntervalBinary(
      "boost*", [](const Interval& a, const Interval& b) { return FromBoost(ToBoost(a) * ToBoost(b)); }, mpfr_mul,
      35);
}

TEST(IntervalOpsTest, UnaryContains) {
  AdversarialDoubles g(36);
  const long n = Count(100000);
  for (long t = 0; t < n; ++t) {
    const Interval x = RandomInterval(g);
    const double p = PointIn(g, x);
    Big bp(p), lo, hi;
    // Sqr
    mpfr_sqr(lo.get(), bp.get(), MPFR_RNDD);
    mpfr_sqr(hi.get(), bp.get(), MPFR_RNDU);
    const Interval s = Sqr(x);
    ASSERT_TRUE(testing::BelowOrEqual(s.lo, lo) && testing::AboveOrEqual(s.hi, hi)) << "Sqr " << x.ToString();
    ASSERT_GE(s.lo, 0.0);
    // t (1 - t)
    {
      Big one(1.0), omt, l2, h2;
      mpfr_sub(omt.get(), one.get(), bp.get(), MPFR_RNDN);  // exact at 256 bits? not always: bound both ways
      Big omt_d, omt_u;
      mpfr_sub(omt_d.get(), one.get(), bp.get(), MPFR_RNDD);
      mpfr_sub(omt_u.get(), one.get(), bp.get(), MPFR_RNDU);
      // t(1-t) is monotone in (1-t) for fixed t with sign(t): take both products.
      Big a1, a2;
      mpfr_mul(a1.get(), bp.get(), omt_d.get(), MPFR_RNDD);
      mpfr_mul(a2.get(), bp.get(), omt_u.get(), MPFR_RNDD);
      mpfr_min(l2.get(), a1.get(), a2.get(), MPFR_RNDD);
      mpfr_mul(a1.get(), bp.get(), omt_d.get(), MPFR_RNDU);
      mpfr_mul(a2.get(), bp.get(), omt_u.get(), MPFR_RNDU);
      mpfr_max(h2.get(), a1.get(), a2.get(), MPFR_RNDU);
      const Interval f = TOneMinusTRange(x);
      ASSERT_TRUE(testing::BelowOrEqual(f.lo, l2) && testing::AboveOrEqual(f.hi, h2))
          << "TOneMinusT " << x.ToString() << " at " << p << " -> " << f.ToString();
      ASSERT_LE(f.hi, 0.25);
    }
    const Interval ax(std::fabs(x.lo) < std::fabs(x.hi) ? std::fabs(x.lo) : std::fabs(x.hi), x.Mag());
    const double ap = std::fabs(p);
    Big bap(ap);
    // Sqrt on |x|
    {
      const Interval r = Sqrt(Interval(x.Mig(), x.Mag()));
      mpfr_sqrt(lo.get(), bap.get(), MPFR_RNDD);
      mpfr_sqrt(hi.get(), bap.get(), MPFR_RNDU);
      ASSERT_TRUE(testing::BelowOrEqual(r.lo, lo) && testing::AboveOrEqual(r.hi, hi)) << "Sqrt";
    }
    // Exp / Log on both back ends
    {
      const Interval xs(std::max(x.lo, -800.0), std::max(std::min(x.hi, 800.0), std::max(x.lo, -800.0)));
      const double ps = std::clamp(p, xs.lo, xs.hi);
      testing::EncloseUnary(mpfr_exp, ps, &lo, &hi);
      for (ExpBackend b : kBackends) {
        const Interval e = Exp(xs, b);
        ASSERT_TRUE(testing::BelowOrEqual(e.lo, lo) && testing::AboveOrEqual(e.hi, hi)) << "Exp " << xs.ToString();
      }
    }
    if (ap > 0 && t % 4 == 0) {  // log at 256 bits is slow: every fourth point
      const Interval pos(std::max(x.Mig(), 0x1p-1074), x.Mag());
      const double pp = std::clamp(ap, pos.lo, pos.hi);
      testing::EncloseUnary(mpfr_log, pp, &lo, &hi);
      for (ExpBackend b : kBackends) {
        const Interval l = Log(pos, b);
        ASSERT_TRUE(testing::BelowOrEqual(l.lo, lo) && testing::AboveOrEqual(l.hi, hi)) << "Log " << pos.ToString();
      }
    }
    // InvSqrt on |x| when positive
    if (x.Mig() > 0) {
      Big r(ap);
      mpfr_rec_sqrt(lo.get(), r.get(), MPFR_RNDD);
      mpfr_rec_sqrt(hi.get(), r.get(), MPFR_RNDU);
      const Interval v = InvSqrt(Interval(x.Mig(), x.Mag()));
      ASSERT_TRUE(testing::BelowOrEqual(v.lo, lo) && testing::AboveOrEqual(v.hi, hi)) << "InvSqrt";
    }
    (void)ax;
  }
}

TEST(IntervalOpsTest, TOneMinusTIsTheExactRange) {
  // Not an interval product: [0, 1] gives [0, 1/4], not [0, 1].
  const Interval f = TOneMinusTRange(Interval(0.0, 1.0));
  EXPECT_EQ(f.lo, 0.0);
  EXPECT_EQ(f.hi, 0.25);
  const Interval g = TOneMinusTRange(Interval(0.1, 0.2));
  EXPECT_NEAR(g.lo, 0.09, 1e-15);
  EXPECT_NEAR(g.hi, 0.16, 1e-15);
  const Interval h = TOneMinusTRange(Interval(0.6, 0.9));
  EXPECT_NEAR(h.lo, 0.09, 1e-15);
  EXPECT_NEAR(h.hi, 0.24, 1e-15);
}

TEST(IntervalOpsTest, DivisionByZeroIntervalIsEntire) {
  const Interval r = Interval(1.0, 2.0) / Interval(-1.0, 1.0);
  EXPECT_EQ(r.lo, -kInf);
  EXPECT_EQ(r.hi, kInf);
}

}  // namespace
}  // namespace lipcert
