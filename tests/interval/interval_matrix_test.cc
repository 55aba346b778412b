// Midpoint-radius products against MPFR (directed 256-bit accumulation), multithreaded
// use, and softmax ranges against MPFR.
#include "interval/interval_matrix.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "interval/softmax.h"
#include "tests/interval/interval_test_util.h"

namespace lipcert {
namespace {

using testing::AdversarialDoubles;
using testing::Big;
using testing::Count;

// Entries with exponents spread over many binades (and a few zeros and tiny values).
Eigen::MatrixXd RandomMatrix(AdversarialDoubles& g, Eigen::Index r, Eigen::Index c, int spread) {
  Eigen::MatrixXd m(r, c);
  for (Eigen::Index j = 0; j < c; ++j)
    for (Eigen::Index i = 0; i < r; ++i) {
      const auto k = g.Bits() % 20;
      if (k == 0)
        m(i, j) = 0.0;
      else if (k == 1)
        m(i, j) = std::ldexp(g.Uniform(-1, 1), -1060);  // subnormal products
      else
        m(i, j) = std::ldexp(g.Uniform(-1, 1), static_cast<int>(g.Bits() % (2 * spread + 1)) - spread);
    }
  return m;
}

// [lo, hi] enclosing the exact x^T y (directed accumulation at 256 bits).
void ExactDot(const double* x, Eigen::Index xs, const double* y, Eigen::Index ys, Eigen::Index k, Big* lo, Big* hi) {
  mpfr_set_zero(lo->get(), 1);
  mpfr_set_zero(hi->get(), 1);
  Big p;
  for (Eigen::Index l = 0; l < k; ++l) {
    Big a(x[l * xs]), b(y[l * ys]);
    mpfr_mul(p.get(), a.get(), b.get(), MPFR_RNDN);  // exact: 106 bits
    mpfr_add(lo->get(), lo->get(), p.get(), MPFR_RNDD);
    mpfr_add(hi->get(), hi->get(), p.get(), MPFR_RNDU);
  }
}

bool Encloses(const IntervalMatrix& c, Eigen::Index i, Eigen::Index j, const Big& lo, const Big& hi) {
  const Interval e = c(i, j);
  return testing::BelowOrEqual(e.lo, lo) && testing::AboveOrEqual(e.hi, hi);
}

TEST(IntervalMatrixTest, PointProductContainsExact) {
  AdversarialDoubles g(41);
  const long target = Count(100000);
  long checked = 0;
  while (checked < target) {
    const Eigen::Index m = 1 + g.Bits() % 12, k = 1 + g.Bits() % 24, n = 1 + g.Bits() % 12;
    const Eigen::MatrixXd a = RandomMatrix(g, m, k, 40), b = RandomMatrix(g, k, n, 40);
    const IntervalMatrix c = Mul(a, b);
    for (Eigen::Index j = 0; j < n; ++j)
      for (Eigen::Index i = 0; i < m; ++i) {
        Big lo, hi;
        ExactDot(&a(i, 0), m, &b(0, j), 1, k, &lo, &hi);
        ASSERT_TRUE(Encloses(c, i, j, lo, hi)) << "entry " << i << "," << j << " k=" << k;
        ++checked;
      }
  }
}

TEST(IntervalMatrixTest, IntervalProductContainsVertexProducts) {
  AdversarialDoubles g(42);
  const long target = Count(100000);
  long checked = 0;
  while (checked < target) {
    const Eigen::Index m = 1 + g.Bits() % 8, k = 1 + g.Bits() % 16, n = 1 + g.Bits() % 8;
    const IntervalMatrix a(RandomMatrix(g, m, k, 10), RandomMatrix(g, m, k, 10).cwiseAbs());
    const IntervalMatrix b(RandomMatrix(g, k, n, 10), RandomMatrix(g, k, n, 10).cwiseAbs());
    const bool point_a = g.Bits() % 4 == 0;
    const IntervalMatrix c = point_a ? Mul(a.mid, b) : Mul(a, b);
    // A random member of each enclosure: endpoints or the midpoint, entry by entry.
    auto pick = [&](const IntervalMatrix& x) {
      Eigen::MatrixXd p(x.rows(), x.cols());
      for (Eigen::Index t = 0; t < p.size(); ++t) {
        const auto s = g.Bits() % 3;
        const double m0 = x.mid.data()[t], r0 = x.rad.data()[t];
        double v = s == 0 ? m0 - r0 : s == 1 ? m0 + r0 : m0;
        // Keep only points certainly inside the exact [mid - rad, mid + rad].
        if (!(SubUp(v, m0) <= r0 && SubUp(m0, v) <= r0)) v = m0;
        p.data()[t] = v;
      }
      return p;
    };
    for (int rep = 0; rep < 3; ++rep) {
      const Eigen::MatrixXd pa = point_a ? a.mid : pick(a), pb = pick(b);
      for (Eigen::Index j = 0; j < n; ++j)
        for (Eigen::Index i = 0; i < m; ++i) {
          Big lo, hi;
          ExactDot(&pa(i, 0), m, &pb(0, j), 1, k, &lo, &hi);
          ASSERT_TRUE(Encloses(c, i, j, lo, hi)) << "entry " << i << "," << j;
          ++checked;
        }
    }
  }
}

TEST(IntervalMatrixTest, LargeBlockedProductContainsExact) {
  // Sizes where Eigen's blocked, vectorised GEMM kernel is used.
  AdversarialDoubles g(43);
  const Eigen::Index n = 300;
  const Eigen::MatrixXd a = RandomMatrix(g, n, n, 3), b = RandomMatrix(g, n, n, 3);
  const IntervalMatrix c = Mul(a, b);
  for (int t = 0; t < 500; ++t) {
    const Eigen::Index i = g.Bits() % n, j = g.Bits() % n;
    Big lo, hi;
    ExactDot(&a(i, 0), n, &b(0, j), 1, n, &lo, &hi);
    ASSERT_TRUE(Encloses(c, i, j, lo, hi));
  }
  // The radius is tiny relative to |A||B|: about n u.
  const Eigen::MatrixXd ab = a.cwiseAbs() * b.cwiseAbs();
  EXPECT_LT((c.rad.array() / ab.array()).maxCoeff(), 4.0 * n * kUnitRoundoff);
}

TEST(IntervalMatrixTest, GramEnclosureIsSymmetricAndContainsExact) {
  AdversarialDoubles g(44);
  const Eigen::MatrixXd a = RandomMatrix(g, 37, 23, 5);
  const IntervalMatrix c = GramEnclosure(a);
  ASSERT_EQ(c.rows(), 23);
  EXPECT_TRUE(c.mid == c.mid.transpose());
  EXPECT_TRUE(c.rad == c.rad.transpose());
  for (Eigen::Index j = 0; j < 23; ++j)
    for (Eigen::Index i = 0; i < 23; ++i) {
      Big lo, hi;
      ExactDot(&a(0, i), 1, &a(0, j), 1, 37, &lo, &hi);
      ASSERT_TRUE(Encloses(c, i, j, lo, hi));
    }
}

TEST(IntervalMatrixTest, DotAddSubScale) {
  AdversarialDoubles g(45);
  for (long t = 0; t < Count(2000); ++t) {
    const Eigen::Index n = 1 + g.Bits() % 10;
    const IntervalMatrix x = IntervalMatrix::Point(RandomMatrix(g, n, 1, 30));
    const IntervalMatrix y = IntervalMatrix::Point(RandomMatrix(g, n, 1, 30));
    const Interval d = Dot(x, y);
    Big lo, hi;
    ExactDot(x.mid.data(), 1, y.mid.data(), 1, n, &lo, &hi);
    ASSERT_TRUE(testing::BelowOrEqual(d.lo, lo) && testing::AboveOrEqual(d.hi, hi));
    const IntervalMatrix s = x + y, df = x - y;
    const IntervalMatrix sc = Scale(Interval(-3.0, 0.5), x);
    for (Eigen::Index i = 0; i < n; ++i) {
      Big a(x.mid(i, 0)), b(y.mid(i, 0)), r1, r2;
      mpfr_add(r1.get(), a.get(), b.get(), MPFR_RNDD);
      mpfr_add(r2.get(), a.get(), b.get(), MPFR_RNDU);
      ASSERT_TRUE(testing::BelowOrEqual(s(i, 0).lo, r1) && testing::AboveOrEqual(s(i, 0).hi, r2));
      mpfr_sub(r1.get(), a.get(), b.get(), MPFR_RNDD);
      mpfr_sub(r2.get(), a.get(), b.get(), MPFR_RNDU);
      ASSERT_TRUE(testing::BelowOrEqual(df(i, 0).lo, r1) && testing::AboveOrEqual(df(i, 0).hi, r2));
      for (double f : {-3.0, 0.5, 0.0}) {
        mpfr_mul_d(r1.get(), a.get(), f, MPFR_RNDD);
        mpfr_mul_d(r2.get(), a.get(), f, MPFR_RNDU);
        ASSERT_TRUE(testing::BelowOrEqual(sc(i, 0).lo, r1) && testing::AboveOrEqual(sc(i, 0).hi, r2));
      }
    }
  }
}

TEST(IntervalMatrixTest, NonFiniteInputsGiveUnboundedEntries) {
  Eigen::MatrixXd a = Eigen::MatrixXd::Ones(3, 3), b = Eigen::MatrixXd::Ones(3, 3);
  a(1, 1) = kInf;
  const IntervalMatrix c = Mul(a, b);
  EXPECT_EQ(c.rad(1, 0), kInf);
  EXPECT_EQ(c.rad(0, 0), c.rad(0, 0));  // not NaN
  EXPECT_FALSE(std::isnan(c.rad.sum()));
  IntervalMatrix big = IntervalMatrix::Ball(Eigen::MatrixXd::Constant(2, 2, 1e308), 1e308);
  const IntervalMatrix p = Mul(big, big);
  for (Eigen::Index t = 0; t < p.rad.size(); ++t) EXPECT_EQ(p.rad.data()[t], kInf);
}

TEST(IntervalMatrixTest, MultithreadedProductsAgree) {
  AdversarialDoubles g(46);
  const IntervalMatrix a(RandomMatrix(g, 96, 80, 4), RandomMatrix(g, 96, 80, 4).cwiseAbs() * 1e-6);
  const IntervalMatrix b(RandomMatrix(g, 80, 72, 4), RandomMatrix(g, 80, 72, 4).cwiseAbs() * 1e-6);
  const IntervalMatrix ref = Mul(a, b);
  std::vector<std::thread> ts;
  std::vector<int> same(6, 0);
  for (int t = 0; t < 6; ++t)
    ts.emplace_back([&, t] {
      int ok = 1;
      for (int rep = 0; rep < 20; ++rep) {
        const IntervalMatrix c = Mul(a, b);
        ok &= (c.mid == ref.mid) && (c.rad == ref.rad);
      }
      same[t] = ok;
    });
  for (auto& t : ts) t.join();
  for (int t = 0; t < 6; ++t) EXPECT_EQ(same[t], 1) << "thread " << t;
  // And the shared result contains exact products of members (spot check).
  for (int t = 0; t < 200; ++t) {
    const Eigen::Index i = g.Bits() % 96, j = g.Bits() % 72;
    Big lo, hi;
    ExactDot(&a.mid(i, 0), 96, &b.mid(0, j), 1, 80, &lo, &hi);
    ASSERT_TRUE(Encloses(ref, i, j, lo, hi));
  }
}

// ---- softmax ------------------------------------------------------------------------------

// MPFR enclosures of p_i = e^{z_i} / sum_j e^{z_j} for every i of one logit vector, at
// 256 bits with directed rounding (MPFR's exponent range makes e^{z} finite for any z).
// lo[i] <= p_i <= hi[i] where p is evaluated at z_i = zi[i] and z_j = zo[j] (j != i).
void SoftmaxBig(const std::vector<double>& zi, const std::vector<double>& zo, std::vector<double>* lo_d,
                std::vector<double>* hi_d, std::vector<Big*>* lo, std::vector<Big*>* hi) {
  const size_t n = zi.size();
  std::vector<Big> eo_lo(n), eo_hi(n);
  Big x, s_lo, s_hi, tot_lo, tot_hi, ei_lo, ei_hi, den;
  for (size_t j = 0; j < n; ++j) {
    mpfr_set_d(x.get(), zo[j], MPFR_RNDN);
    mpfr_exp(eo_lo[j].get(), x.get(), MPFR_RNDD);
    mpfr_exp(eo_hi[j].get(), x.get(), MPFR_RNDU);
  }
  for (size_t i = 0; i < n; ++i) {
    mpfr_set_zero(s_lo.get(), 1);
    mpfr_set_zero(s_hi.get(), 1);
    for (size_t j = 0; j < n; ++j) {
      if (j == i) continue;
      mpfr_add(s_lo.get(), s_lo.get(), eo_lo[j].get(), MPFR_RNDD);
      mpfr_add(s_hi.get(), s_hi.get(), eo_hi[j].get(), MPFR_RNDU);
    }
    mpfr_set_d(x.get(), zi[i], MPFR_RNDN);
    mpfr_exp(ei_lo.get(), x.get(), MPFR_RNDD);
    mpfr_exp(ei_hi.get(), x.get(), MPFR_RNDU);
    // lower: ei_lo / (ei_lo + s_hi) (increasing in e_i), upper: ei_hi / (ei_hi + s_lo).
    mpfr_add(den.get(), ei_lo.get(), s_hi.get(), MPFR_RNDU);
    mpfr_div(lo->at(i)->get(), ei_lo.get(), den.get(), MPFR_RNDD);
    mpfr_add(den.get(), ei_hi.get(), s_lo.get(), MPFR_RNDD);
    mpfr_div(hi->at(i)->get(), ei_hi.get(), den.get(), MPFR_RNDU);
    (*lo_d)[i] = lo->at(i)->ToDouble();
    (*hi_d)[i] = hi->at(i)->ToDouble();
  }
}

TEST(SoftmaxTest, RangeIsExactUpToRoundingAndContainsSamples) {
  AdversarialDoubles g(51);
  // 25,000 probabilities at scale 1 (each needs ~9 exps at 256 bits); the scalar
  // primitives underneath (exp, +, x, /) are each checked on 10^5 inputs.
  const long target = Count(25000);
  long checked = 0;
  while (checked < target) {
    const int n = 1 + static_cast<int>(g.Bits() % 8);
    const int len = 1 + static_cast<int>(g.Bits() % n);
    const double scale = std::ldexp(1.0, static_cast<int>(g.Bits() % 12) - 4);
    Eigen::VectorXd l(n), u(n);
    for (int i = 0; i < n; ++i) {
      l[i] = scale * g.Uniform(-10, 10);
      u[i] = l[i] + ((g.Bits() % 4 == 0) ? 0.0 : scale * g.Uniform(0, 2));
    }
    const ExpBackend b = (g.Bits() % 2) ? ExpBackend::kMpfr : ExpBackend::kFastWidened;
    const ProbabilityBounds p = SoftmaxRange(l, u, len, b);
    for (int i = len; i < n; ++i) ASSERT_EQ(p.hi[i], 0.0);
    std::vector<double> lv(len), uv(len), z(len), d1(len), d2(len);
    for (int j = 0; j < len; ++j) {
      lv[j] = l[j];
      uv[j] = u[j];
      z[j] = std::clamp(l[j] + (u[j] - l[j]) * g.Uniform(0, 1), l[j], u[j]);
    }
    std::vector<Big> blo(len), bhi(len), slo(len), shi(len), tmp(len);
    std::vector<Big*> plo, phi, pslo, pshi, ptmp;
    for (int j = 0; j < len; ++j) {
      plo.push_back(&blo[j]);
      phi.push_back(&bhi[j]);
      pslo.push_back(&slo[j]);
      pshi.push_back(&shi[j]);
      ptmp.push_back(&tmp[j]);
    }
    // Exact lower end: z_i = l_i, z_j = u_j; exact upper end: z_i = u_i, z_j = l_j.
    std::vector<double> lo_d(len), hi_d(len), dummy(len);
    SoftmaxBig(lv, uv, &lo_d, &dummy, &plo, &ptmp);
    SoftmaxBig(uv, lv, &dummy, &hi_d, &ptmp, &phi);
    SoftmaxBig(z, z, &d1, &d2, &pslo, &pshi);  // a random point of the box
    for (int i = 0; i < len; ++i) {
      ASSERT_TRUE(testing::BelowOrEqual(p.lo[i], blo[i])) << "p_lo " << i;
      ASSERT_TRUE(testing::AboveOrEqual(p.hi[i], bhi[i])) << "p_hi " << i;
      // Tight: within 1e-12 (absolute, probabilities are <= 1) of the exact extremes.
      ASSERT_GE(p.lo[i], lo_d[i] - 1e-12);
      ASSERT_LE(p.hi[i], hi_d[i] + 1e-12);
      ASSERT_TRUE(testing::BelowOrEqual(p.lo[i], slo[i]) && testing::AboveOrEqual(p.hi[i], shi[i]));
      ++checked;
    }
  }
}

TEST(SoftmaxTest, ExtremeLogits) {
  Eigen::VectorXd l(3), u(3);
  l << -1000, 0, 800;
  u << -999, 1, 801;
  const ProbabilityBounds p = SoftmaxRange(l, u);
  EXPECT_EQ(p.lo[0], 0.0);
  EXPECT_LT(p.hi[0], 1e-300);
  EXPECT_GE(p.hi[2], 1.0 - 1e-300);
  EXPECT_LE(p.hi[2], 1.0);
  EXPECT_GE(p.lo[2], 0.999);
  EXPECT_EQ(SoftmaxJacobianL2Upper(p).value(), 0.5);
}

TEST(SoftmaxTest, RowsWithCausalMask) {
  const Eigen::MatrixXd mid = Eigen::MatrixXd::Zero(4, 4);
  const ProbabilityMatrixBounds p = SoftmaxRowsRange(IntervalMatrix::Ball(mid, 0.0), true);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      if (j > i) {
        EXPECT_EQ(p.hi(i, j), 0.0);
      } else {
        EXPECT_LE(p.lo(i, j), 1.0 / (i + 1));
        EXPECT_GE(p.hi(i, j), 1.0 / (i + 1));
        EXPECT_LT(p.hi(i, j) - p.lo(i, j), 1e-14);
      }
    }
  ProbabilityBounds row{p.lo.row(3).transpose(), p.hi.row(3).transpose()};
  EXPECT_NEAR(SoftmaxJacobianL2Upper(row).value(), 0.25, 1e-14);
}

}  // namespace
}  // namespace lipcert
