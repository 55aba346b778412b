// The vector-norm helpers against MPFR (256 bits): NormUpOfMagnitudes (one floating sum
// with a gamma_d bound), PairDistanceUp and RowDistanceL2Up (one vectorised pass with an
// inflation) and SimplexWeightedSumUp (the fractional knapsack, with its no-sort route when
// the caps fit, and with an order sorted once for rows that share c).
// Upper bounds are never below the exact value and are tight.
#include "interval/vector_norms.h"

#include <gtest/gtest.h>
#include <mpreal.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "tests/interval/interval_test_util.h"

namespace lipcert {
namespace {

using testing::AdversarialDoubles;
using testing::Count;
using mpfr::mpreal;

// Magnitudes: |adversarial doubles| kept finite under squaring and summing (the norms
// overflow to +inf otherwise, which is still an upper bound but not tested here).
Eigen::VectorXd Magnitudes(AdversarialDoubles& g, Eigen::Index d) {
  Eigen::VectorXd m(d);
  for (Eigen::Index i = 0; i < d; ++i) {
    double x = std::fabs(g.Next());
    if (!(x < 1e150)) x = std::ldexp(g.Uniform(0.5, 1), int(g.Bits() % 300));
    m(i) = x;
  }
  return m;
}

mpreal ExactNorm(const Eigen::VectorXd& m, VectorNorm q) {
  mpreal::set_default_prec(256);
  mpreal s = 0;
  for (Eigen::Index i = 0; i < m.size(); ++i) s += q == VectorNorm::kTwo ? mpreal(m(i)) * mpreal(m(i)) : mpreal(m(i));
  return q == VectorNorm::kTwo ? mpfr::sqrt(s) : s;
}

TEST(VectorNormsTest, MagnitudeNormsBoundTheMpfrNormTightly) {
  AdversarialDoubles g(71);
  const long n = Count(400);
  long checked = 0;
  for (long t = 0; t < n; ++t) {
    const Eigen::Index d = (t % 3 == 0) ? 1 + g.Bits() % 2000 : 1 + g.Bits() % 20;
    const Eigen::VectorXd m = Magnitudes(g, d);
    for (const VectorNorm q : {VectorNorm::kTwo, VectorNorm::kOne}) {
      const mpreal exact = ExactNorm(m, q);
      const double up = NormUpOfMagnitudes(m, q);
      ASSERT_GE(mpreal(up), exact) << "t=" << t << " d=" << d;
      // gamma_d relative plus the underflow term.
      ASSERT_LE(mpreal(up), exact * (1 + 4e-16 * double(d + 4)) + mpreal(1e-150)) << "t=" << t << " d=" << d;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * n);
}

TEST(VectorNormsTest, PairDistancesBoundTheMpfrDistances) {
  AdversarialDoubles g(72);
  const long n = Count(150);
  long pairs = 0;
  for (long t = 0; t < n; ++t) {
    const Eigen::Index rows = 2 + g.Bits() % 5, cols = 1 + g.Bits() % 40;
    Eigen::MatrixXd mid(rows, cols), rad(rows, cols);
    for (Eigen::Index i = 0; i < rows; ++i)
      for (Eigen::Index c = 0; c < cols; ++c) {
        // Related values in a row pair give cancellation in the differences.
        mid(i, c) = i > 0 && g.Bits() % 2 ? -g.Related(-mid(i - 1, c)) : g.Next();
        if (!(std::fabs(mid(i, c)) < 1e150)) mid(i, c) = g.Uniform(-1, 1);
        rad(i, c) = g.Bits() % 3 ? 0.0 : std::fabs(g.Uniform(0, 1e-3) * mid(i, c));
      }
    const IntervalMatrix a(mid, rad);
    for (const VectorNorm q : {VectorNorm::kTwo, VectorNorm::kOne, VectorNorm::kInf}) {
      const Eigen::MatrixXd up = PairDistanceUp(a, q);
      for (Eigen::Index j = 0; j < rows; ++j)
        for (Eigen::Index k = 0; k < rows; ++k) {
          if (j == k) continue;
          mpreal::set_default_prec(256);
          mpreal s = 0;
          for (Eigen::Index c = 0; c < cols; ++c) {
            const mpreal e = mpfr::abs(mpreal(mid(j, c)) - mpreal(mid(k, c))) + mpreal(rad(j, c)) + mpreal(rad(k, c));
            s = q == VectorNorm::kTwo ? s + e * e : q == VectorNorm::kOne ? s + e : mpfr::max(s, e);
          }
          const mpreal exact = q == VectorNorm::kTwo ? mpfr::sqrt(s) : s;
          ASSERT_GE(mpreal(up(j, k)), exact) << "t=" << t;
          // (The 2-norm's underflow term is sqrt(d eta), about 1e-161.)
          ASSERT_LE(mpreal(up(j, k)), exact * (1 + 1e-13) + mpreal(1e-150)) << "t=" << t;
          ++pairs;
        }
    }
  }
  EXPECT_GT(pairs, 6 * n);
}

TEST(VectorNormsTest, RowDistancesBoundTheMpfrDistances) {
  AdversarialDoubles g(74);
  const long n = Count(150);
  long pairs = 0;
  for (long t = 0; t < n; ++t) {
    const Eigen::Index rows_a = 1 + g.Bits() % 5, rows_b = 1 + g.Bits() % 4, cols = 1 + g.Bits() % 40;
    Eigen::MatrixXd am(rows_a, cols), ar(rows_a, cols), bm(rows_b, cols), br(rows_b, cols);
    for (Eigen::Index c = 0; c < cols; ++c) {
      for (Eigen::Index i = 0; i < rows_a; ++i) {
        am(i, c) = g.Next();
        if (!(std::fabs(am(i, c)) < 1e150)) am(i, c) = g.Uniform(-1, 1);
        ar(i, c) = g.Bits() % 3 ? 0.0 : std::fabs(g.Uniform(0, 1e-3) * am(i, c));
      }
      for (Eigen::Index i = 0; i < rows_b; ++i) {
        // Values related to a's give cancellation in the differences.
        bm(i, c) = g.Bits() % 2 ? -g.Related(-am(i % rows_a, c)) : g.Next();
        if (!(std::fabs(bm(i, c)) < 1e150)) bm(i, c) = g.Uniform(-1, 1);
        br(i, c) = g.Bits() % 3 ? 0.0 : std::fabs(g.Uniform(0, 1e-3) * bm(i, c));
      }
    }
    const Eigen::MatrixXd up = RowDistanceL2Up(IntervalMatrix(am, ar), IntervalMatrix(bm, br));
    ASSERT_EQ(up.rows(), rows_b);
    ASSERT_EQ(up.cols(), rows_a);
    for (Eigen::Index i = 0; i < rows_b; ++i)
      for (Eigen::Index j = 0; j < rows_a; ++j) {
        mpreal::set_default_prec(256);
        mpreal s = 0;
        for (Eigen::Index c = 0; c < cols; ++c) {
          const mpreal e = mpfr::abs(mpreal(am(j, c)) - mpreal(bm(i, c))) + mpreal(ar(j, c)) + mpreal(br(i, c));
          s += e * e;
        }
        const mpreal exact = mpfr::sqrt(s);
        ASSERT_GE(mpreal(up(i, j)), exact) << "t=" << t;
        ASSERT_LE(mpreal(up(i, j)), exact * (1 + 1e-13) + mpreal(1e-150)) << "t=" << t;
        ++pairs;
      }
  }
  EXPECT_GE(pairs, n);
}

// The exact knapsack optimum max sum x_k c_k, 0 <= x <= cap, sum x <= total, in MPFR.
mpreal ExactKnapsack(const Eigen::VectorXd& cap, const Eigen::VectorXd& c, int len, double total) {
  mpreal::set_default_prec(256);
  std::vector<int> order(len);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return c(a) > c(b); });
  mpreal left = total, s = 0;
  for (const int k : order) {
    if (left <= 0 || c(k) <= 0) break;
    const mpreal x = mpfr::min(mpreal(cap(k)), left);
    s += x * mpreal(c(k));
    left -= x;
  }
  return s;
}

TEST(VectorNormsTest, SimplexWeightedSumBoundsTheKnapsackOnEveryRoute) {
  std::mt19937_64 rng(73);
  std::uniform_real_distribution<double> u(0, 1);
  const long n = Count(600);
  int fits = 0, by_rounding = 0, sorted = 0;
  for (long t = 0; t < n; ++t) {
    const int len = 1 + int(rng() % 40);
    Eigen::VectorXd cap(len), c(len);
    for (int k = 0; k < len; ++k) {
      cap(k) = u(rng);
      c(k) = u(rng) * std::ldexp(1.0, int(rng() % 20) - 10);
    }
    const double sum = cap.sum();
    // Three routes: caps inside the total, above it by rounding (1e-10), and far above.
    double total = 0;
    switch (t % 3) {
      case 0: total = sum * 1.5; ++fits; break;
      case 1: total = sum * (1 - 1e-10); ++by_rounding; break;
      default: total = sum * 0.4; ++sorted; break;
    }
    const mpreal exact = ExactKnapsack(cap, c, len, total);
    const double up = SimplexWeightedSumUp(cap, c, len, total);
    ASSERT_GE(mpreal(up), exact) << "t=" << t;
    ASSERT_LE(mpreal(up), exact * (1 + 1e-12) + mpreal(2e-9 * total * c.maxCoeff())) << "t=" << t;
    // With one order of a longer row sorted beforehand (entries past len are skipped; ties
    // from repeated values), the same bound.
    Eigen::VectorXd longer(len + 7);
    longer.head(len) = c;
    for (int k = len; k < len + 7; ++k) longer(k) = k % 2 ? c(k % len) : u(rng) * 1e3;
    Eigen::VectorXd longer_cap = Eigen::VectorXd::Constant(len + 7, 1.0);
    longer_cap.head(len) = cap;
    const std::vector<int> order = DescendingRowOrders(longer.transpose())[0];
    ASSERT_EQ(int(order.size()), len + 7);
    const double sorted_once = SimplexWeightedSumUp(longer_cap, longer, len, total, order);
    ASSERT_GE(mpreal(sorted_once), exact) << "t=" << t;
    ASSERT_LE(mpreal(sorted_once), exact * (1 + 1e-12) + mpreal(2e-9 * total * c.maxCoeff())) << "t=" << t;
  }
  EXPECT_GT(fits, 0);
  EXPECT_GT(by_rounding, 0);
  EXPECT_GT(sorted, 0);
}

}  // namespace
}  // namespace lipcert
