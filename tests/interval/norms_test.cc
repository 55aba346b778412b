// Norm bounds against exact values: MPFR (mpreal at 256 bits, Eigen's MPRealSupport) on
// small matrices, double SVD on larger ones; lower <= exact <= upper throughout.
#include "interval/norms.h"

#include <gtest/gtest.h>
#include <mpreal.h>
#include <unsupported/Eigen/MPRealSupport>

#include <Eigen/Eigenvalues>
#include <Eigen/SVD>
#include <random>

#include "tests/interval/interval_test_util.h"

namespace lipcert {
namespace {

using testing::AdversarialDoubles;
using testing::Count;
using mpfr::mpreal;
using MatrixBig = Eigen::Matrix<mpreal, Eigen::Dynamic, Eigen::Dynamic>;

// sigma_1 of a at 256 bits (eigenvalues of a^T a in mpreal).
mpreal ExactNorm2(const Eigen::MatrixXd& a) {
  mpreal::set_default_prec(256);
  MatrixBig b = a.cast<mpreal>();
  MatrixBig g = b.transpose() * b;
  Eigen::SelfAdjointEigenSolver<MatrixBig> es(g, Eigen::EigenvaluesOnly);
  mpreal l = es.eigenvalues()(g.rows() - 1);
  if (l < 0) l = 0;
  return mpfr::sqrt(l);
}
mpreal ExactLambdaMax(const Eigen::MatrixXd& s) {
  mpreal::set_default_prec(256);
  MatrixBig b = s.cast<mpreal>();
  Eigen::SelfAdjointEigenSolver<MatrixBig> es(b, Eigen::EigenvaluesOnly);
  return es.eigenvalues()(b.rows() - 1);
}

Eigen::MatrixXd Random(AdversarialDoubles& g, Eigen::Index r, Eigen::Index c) {
  Eigen::MatrixXd m(r, c);
  for (Eigen::Index t = 0; t < m.size(); ++t) m.data()[t] = g.Uniform(-1, 1);
  return m;
}

// Test matrices: random, rank one, repeated top singular value, scaled by huge or tiny
// powers of two, with zero rows.
Eigen::MatrixXd TestMatrix(AdversarialDoubles& g, int kind, Eigen::Index r, Eigen::Index c) {
  Eigen::MatrixXd a = Random(g, r, c);
  switch (kind % 6) {
    case 1:
      a = Random(g, r, 1) * Random(g, 1, c);
      break;
    case 2: {  // two equal top singular values
      Eigen::HouseholderQR<Eigen::MatrixXd> q1(Random(g, r, r)), q2(Random(g, c, c));
      Eigen::MatrixXd s = Eigen::MatrixXd::Zero(r, c);
      for (Eigen::Index i = 0; i < std::min(r, c); ++i) s(i, i) = i < 2 ? 3.0 : g.Uniform(0, 2);
      a = Eigen::MatrixXd(q1.householderQ()) * s * Eigen::MatrixXd(q2.householderQ()).transpose();
      break;
    }
    case 3:
      a *= 0x1p500;
      break;
    case 4:
      a *= 0x1p-500;
      break;
    case 5:
      a.row(0).setZero();
      break;
  }
  return a;
}

TEST(NormsTest, SmallMatricesAgainstMpfr) {
  AdversarialDoubles g(61);
  const long n = Count(300);
  for (long t = 0; t < n; ++t) {
    const Eigen::Index r = 1 + g.Bits() % 8, c = 1 + g.Bits() % 8;
    const Eigen::MatrixXd a = TestMatrix(g, static_cast<int>(t), r, c);
    const mpreal exact = ExactNorm2(a);
    const UpperBound up = NormL2Upper(a);
    const LowerBound lo = NormL2Lower(a);
    ASSERT_GE(mpreal(up.value()), exact) << "t=" << t << "\n" << a;
    ASSERT_LE(mpreal(lo.value()), exact) << "t=" << t;
    // Tight: relative overestimate below 1e-12 for these sizes.
    ASSERT_LE(mpreal(up.value()), exact * (1 + 1e-12) + mpreal(1e-300)) << "t=" << t;
    ASSERT_GE(mpreal(lo.value()), exact * (1 - 1e-6)) << "t=" << t;
    // Crude and Frobenius bounds are valid.
    ASSERT_GE(mpreal(NormL2UpperCrude(a).value()), exact);
    ASSERT_GE(mpreal(NormFrobeniusUpper(a).value()), exact);
    // l_inf and l_1: exact up to one rounding per term.
    mpreal rmax = 0, cmax = 0;
    for (Eigen::Index i = 0; i < r; ++i) {
      mpreal s = 0;
      for (Eigen::Index j = 0; j < c; ++j) s += mpfr::abs(mpreal(a(i, j)));
      rmax = mpfr::max(rmax, s);
    }
    for (Eigen::Index j = 0; j < c; ++j) {
      mpreal s = 0;
      for (Eigen::Index i = 0; i < r; ++i) s += mpfr::abs(mpreal(a(i, j)));
      cmax = mpfr::max(cmax, s);
    }
    ASSERT_GE(mpreal(NormInf(a).value()), rmax);
    ASSERT_LE(mpreal(NormInf(a).value()), rmax * (1 + 1e-14));
    ASSERT_GE(mpreal(Norm1(a).value()), cmax);
    // Nonnegative matrices: Collatz-Wielandt.
    const Eigen::MatrixXd p = a.cwiseAbs();
    const mpreal ep = ExactNorm2(p);
    const UpperBound cw = NormL2UpperNonneg(p);
    ASSERT_GE(mpreal(cw.value()), ep);
    ASSERT_LE(mpreal(cw.value()), ep * 1.05 + mpreal(1e-300));
  }
}

TEST(NormsTest, LambdaMaxOfIndefiniteSymmetricEnclosure) {
  AdversarialDoubles g(62);
  for (long t = 0; t < Count(200); ++t) {
    const Eigen::Index n = 1 + g.Bits() % 8;
    Eigen::MatrixXd s = Random(g, n, n);
    s = (s + s.transpose()).eval();
    s -= 2.0 * Eigen::MatrixXd::Identity(n, n);  // often all eigenvalues negative
    const double r = (t % 2) ? 1e-3 : 0.0;
    const IntervalMatrix b = IntervalMatrix::Ball(s, r);
    const UpperBound up = LambdaMaxUpper(b);
    // Every symmetric member: check the midpoint and random symmetric perturbations.
    ASSERT_GE(mpreal(up.value()), ExactLambdaMax(s)) << s;
    for (int k = 0; k < 3; ++k) {
      Eigen::MatrixXd e = Random(g, n, n) * r;
      e = (0.5 * (e + e.transpose())).eval();
      const Eigen::MatrixXd m = s + e;
      if (!b.Contains(m)) continue;
      ASSERT_GE(mpreal(up.value()), ExactLambdaMax(m));
    }
    if (r == 0) {
      ASSERT_LE(mpreal(up.value()), ExactLambdaMax(s) + 1e-12 * (1 + s.norm()));
    }
  }
}

TEST(NormsTest, IntervalMatrixNormCoversMembers) {
  AdversarialDoubles g(63);
  for (long t = 0; t < Count(100); ++t) {
    const Eigen::Index r = 1 + g.Bits() % 7, c = 1 + g.Bits() % 7;
    const IntervalMatrix a(Random(g, r, c), Random(g, r, c).cwiseAbs() * 0.1);
    const UpperBound up = NormL2UpperInterval(a);
    const UpperBound inf = NormInfUpper(a);
    for (int k = 0; k < 5; ++k) {
      Eigen::MatrixXd m(r, c);
      for (Eigen::Index i = 0; i < m.size(); ++i) {
        const double v = a.mid.data()[i] + ((g.Bits() % 2) ? 1 : -1) * a.rad.data()[i];
        m.data()[i] = (SubUp(v, a.mid.data()[i]) <= a.rad.data()[i] && SubUp(a.mid.data()[i], v) <= a.rad.data()[i])
                          ? v
                          : a.mid.data()[i];
      }
      ASSERT_GE(mpreal(up.value()), ExactNorm2(m));
      ASSERT_GE(inf.value(), m.cwiseAbs().rowwise().sum().maxCoeff());
    }
  }
}

TEST(NormsTest, LargerMatricesAgainstDoubleSvd) {
  AdversarialDoubles g(64);
  for (Eigen::Index n : {40, 130, 257}) {
    for (int kind : {0, 1, 2, 3}) {
      const Eigen::MatrixXd a = TestMatrix(g, kind, n, n - 7);
      const double s1 = Eigen::JacobiSVD<Eigen::MatrixXd>(a).singularValues()(0);
      NormL2Report rep;
      const UpperBound up = NormL2Upper(a, {}, &rep);
      EXPECT_GE(up.value(), s1 * (1 - 1e-13)) << n << " kind " << kind;
      EXPECT_LE(up.value(), s1 * (1 + 1e-10)) << n << " kind " << kind;
      EXPECT_FALSE(rep.fell_back_to_crude);
      const LowerBound lo = NormL2Lower(a, 200);
      EXPECT_LE(lo.value(), up.value());
    }
  }
}

// Low-rank square matrices: the Lanczos estimate meets an invariant subspace after `rank`
// steps, and must go on from a fresh direction rather than normalise the rounding noise
// left there (whose Ritz values can leave the spectrum: the Cholesky certificate then holds
// but is loose). The case that showed it, an L2 layer's J V with k = N D (0.4073 for a norm
// of 0.3619), is CentreNormTest.DeflatedSuperBlocksDominateTheMpfrNormAndTighten.
TEST(NormsTest, LowRankMatricesAreTight) {
  std::mt19937_64 rng(77);
  std::normal_distribution<double> gauss(0.0, 1.0);
  int checked = 0;
  for (Eigen::Index n : {25, 60, 131}) {
    for (Eigen::Index rank : {Eigen::Index(1), Eigen::Index(3), n / 2, n - 1}) {
      Eigen::MatrixXd u(n, rank), w(n, rank);
      for (Eigen::Index i = 0; i < u.size(); ++i) u.data()[i] = gauss(rng), w.data()[i] = gauss(rng);
      const Eigen::MatrixXd a = u * w.transpose();
      const mpreal exact = ExactNorm2(a);
      NormL2Report rep;
      const UpperBound up = NormL2Upper(a, {}, &rep);
      EXPECT_GE(mpreal(up.value()), exact) << n << " rank " << rank;
      EXPECT_LE(mpreal(up.value()), exact * (1 + 1e-10)) << n << " rank " << rank << " estimate " << rep.estimate;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 12);
}

// ||a^T b||_2 from k x k certificates against the 256-bit singular value of the exact
// product; tight to 1e-9 where nothing under- or overflows, and rank-deficient b (a zero
// row, the Cholesky fails) takes the fallback.
TEST(NormsTest, ProductNormFromSmallCertificates) {
  AdversarialDoubles g(2024);
  int checked = 0;
  for (long t = 0; t < Count(24); ++t) {
    const Eigen::Index k = t % 2 ? 4 : 9, n = t % 3 ? 40 : 71;
    const int kind_a = t % 6 == 3 || t % 6 == 4 ? 0 : t % 6, kind_b = (t / 6) % 2 ? 5 : 0;
    const Eigen::MatrixXd a = TestMatrix(g, kind_a, k, n), b = TestMatrix(g, kind_b, k, n);
    mpreal::set_default_prec(256);
    const MatrixBig p = a.cast<mpreal>().transpose() * b.cast<mpreal>();
    Eigen::SelfAdjointEigenSolver<MatrixBig> es(MatrixBig(p.transpose() * p), Eigen::EigenvaluesOnly);
    const mpreal exact = mpfr::sqrt(mpfr::max(es.eigenvalues()(n - 1), mpreal(0)));
    const UpperBound up = ProductNormL2Upper(a, b);
    EXPECT_GE(mpreal(up.value()), exact) << "trial " << t;
    EXPECT_LE(mpreal(up.value()), exact * (1 + 1e-9)) << "trial " << t;
    ++checked;
  }
  EXPECT_EQ(checked, Count(24));
  EXPECT_GT(checked, 0);
}

TEST(NormsTest, ImplicitPsdOperator) {
  AdversarialDoubles g(65);
  const Eigen::Index n = 30;
  // Integer entries: the products below are exact, so column_error = 0 is honest.
  Eigen::MatrixXd b(n + 5, n);
  for (Eigen::Index i = 0; i < b.size(); ++i) b.data()[i] = static_cast<double>(static_cast<int>(g.Bits() % 11) - 5);
  const Eigen::MatrixXd m = b.transpose() * b;
  auto apply = [&](const Eigen::VectorXd& x, Eigen::VectorXd* y) { *y = b.transpose() * (b * x); };
  const UpperBound up = NormL2UpperImplicitPsd(n, apply, 0.0);
  const mpreal exact = ExactLambdaMax(m);
  EXPECT_GE(mpreal(up.value()), exact);
  EXPECT_LE(mpreal(up.value()), exact * (1 + 1e-11));
  // A callback with a declared error: perturb each product by at most eps in norm.
  const double eps = 1e-6;
  auto noisy = [&](const Eigen::VectorXd& x, Eigen::VectorXd* y) {
    *y = b.transpose() * (b * x);
    (*y)[0] -= 0.9 * eps;
  };
  const UpperBound up2 = NormL2UpperImplicitPsd(n, noisy, eps);
  EXPECT_GE(mpreal(up2.value()), exact);
}

TEST(NormsTest, DegenerateInputs) {
  EXPECT_EQ(NormL2Upper(Eigen::MatrixXd::Zero(5, 3)).value(), 0.0);
  Eigen::MatrixXd a = Eigen::MatrixXd::Identity(4, 4);
  a(2, 2) = kInf;
  EXPECT_EQ(NormL2Upper(a).value(), kInf);
  EXPECT_GE(NormL2Upper(Eigen::MatrixXd::Identity(6, 6)).value(), 1.0);
  EXPECT_LE(NormL2Upper(Eigen::MatrixXd::Identity(6, 6)).value(), 1.0 + 1e-13);
  EXPECT_EQ(NormRatioLower(a, Eigen::VectorXd::Zero(4)).value(), 0.0);
}

}  // namespace
}  // namespace lipcert

namespace lipcert {
namespace {

// A rows x cols enclosure of adversarial midpoints (below 1e290, so that no sum overflows)
// and radii, half of them 0, the rest up to rad_scale |mid|.
IntervalMatrix AdversarialEnclosure(testing::AdversarialDoubles& g, Eigen::Index rows, Eigen::Index cols,
                                    double rad_scale) {
  Eigen::MatrixXd m(rows, cols), r(rows, cols);
  for (Eigen::Index i = 0; i < rows; ++i)
    for (Eigen::Index j = 0; j < cols; ++j) {
      double x = g.Next();
      if (!(std::fabs(x) < 1e290)) x = g.Uniform(-1, 1);
      m(i, j) = x;
      r(i, j) = g.Bits() % 2 ? 0.0 : std::fabs(x) * g.Uniform(0, rad_scale);
    }
  return IntervalMatrix(m, r);
}

// The row and column sums of |M| + R (NormInfUpper, Norm1Upper: one vectorised floating sum
// over 1 - gamma_{inner+1}) against 256-bit sums, on wide adversarial matrices.
TEST(NormsTest, AbsoluteSumsBoundTheMpfrSumsOnWideMatrices) {
  testing::AdversarialDoubles g(67);
  const long n = testing::Count(60);
  long sums = 0;
  for (long t = 0; t < n; ++t) {
    const Eigen::Index rows = 1 + g.Bits() % 40, cols = 1 + g.Bits() % 400;
    const IntervalMatrix a = AdversarialEnclosure(g, rows, cols, 1e-3);
    const Eigen::MatrixXd &m = a.mid, &r = a.rad;
    mpfr::mpreal::set_default_prec(256);
    mpreal row_max = 0, col_max = 0;
    for (Eigen::Index i = 0; i < rows; ++i) {
      mpreal s = 0;
      for (Eigen::Index j = 0; j < cols; ++j) s += mpfr::abs(mpreal(m(i, j))) + mpreal(r(i, j));
      row_max = mpfr::max(row_max, s);
      ++sums;
    }
    for (Eigen::Index j = 0; j < cols; ++j) {
      mpreal s = 0;
      for (Eigen::Index i = 0; i < rows; ++i) s += mpfr::abs(mpreal(m(i, j))) + mpreal(r(i, j));
      col_max = mpfr::max(col_max, s);
      ++sums;
    }
    const double inf = NormInfUpper(a).value(), one = Norm1Upper(a).value();
    ASSERT_GE(mpreal(inf), row_max) << "t=" << t;
    ASSERT_GE(mpreal(one), col_max) << "t=" << t;
    ASSERT_LE(mpreal(inf), row_max * (1 + 3e-16 * double(cols + 4))) << "t=" << t;
    ASSERT_LE(mpreal(one), col_max * (1 + 3e-16 * double(rows + 4))) << "t=" << t;
  }
  EXPECT_GT(sums, 20 * n);
}

// AddAbsRowSums, taken in two column chunks into the same sums, against 256-bit sums of
// |m| + r and max(0, |m| - r): within its stated bounds after gamma_{T+1} and (T + 1) eta, and
// within a few roundings per term of them.
TEST(NormsTest, AbsoluteRowSumsByColumnsBracketTheMpfrSums) {
  testing::AdversarialDoubles g(71);
  const long n = testing::Count(60);
  long rows_checked = 0;
  for (long t = 0; t < n; ++t) {
    const Eigen::Index rows = 1 + g.Bits() % 40, cols = 2 + g.Bits() % 400, split = 1 + g.Bits() % (cols - 1);
    const IntervalMatrix a = AdversarialEnclosure(g, rows, cols, 2);  // some terms cross zero
    const Eigen::MatrixXd &m = a.mid, &r = a.rad;
    Eigen::VectorXd hi = Eigen::VectorXd::Zero(rows), lo = Eigen::VectorXd::Zero(rows);
    AddAbsRowSums(m.leftCols(split), r.leftCols(split), hi, &lo);
    AddAbsRowSums(m.rightCols(cols - split), r.rightCols(cols - split), hi, &lo);
    const double shrink = SubDown(1.0, GammaUp(double(cols) + 1)), eta = MulUp(double(cols) + 1, kEta);
    mpfr::mpreal::set_default_prec(256);
    for (Eigen::Index i = 0; i < rows; ++i) {
      mpreal up = 0, down = 0;
      for (Eigen::Index j = 0; j < cols; ++j) {
        up += mpfr::abs(mpreal(m(i, j))) + mpreal(r(i, j));
        down += mpfr::max(mpreal(0), mpfr::abs(mpreal(m(i, j))) - mpreal(r(i, j)));
      }
      ASSERT_GE(mpreal(AddUp(DivUp(hi(i), shrink), eta)), up) << "t=" << t << " row " << i;
      ASSERT_LE(mpreal(SubDown(MulDown(lo(i), shrink), eta)), down) << "t=" << t << " row " << i;
      ASSERT_LE(mpreal(hi(i)), up * (1 + 3e-16 * double(cols + 4)) + 1e-300) << "t=" << t << " row " << i;
      ASSERT_GE(mpreal(lo(i)), down * (1 - 3e-16 * double(cols + 4)) - 1e-300) << "t=" << t << " row " << i;
      ++rows_checked;
    }
  }
  EXPECT_GE(rows_checked, n);
}

}  // namespace
}  // namespace lipcert
