// The LayerNorm Jacobian's enclosure at a token, against its 256-bit value.
#include "certify/layer_norm_cover.h"

#include <gtest/gtest.h>
#include <mpreal.h>

#include <random>

#include "certify/layer_norm_enclosure.h"
#include "tests/common/test_scale.h"

namespace lipcert {
namespace {

using mpfr::mpreal;

// J_LN(x)_{ab} = gamma_a (delta_ab - 1/D - xhat_a xhat_b / D) / sigma at 256 bits.
std::vector<mpreal> ExactLayerNormJacobian(const LayerNormParams& ln, const Eigen::RowVectorXd& x) {
  mpreal::set_default_prec(256);
  const int d = int(x.size());
  mpreal mean = 0, var = 0;
  for (int a = 0; a < d; ++a) mean += mpreal(x(a));
  mean /= d;
  for (int a = 0; a < d; ++a) var += (mpreal(x(a)) - mean) * (mpreal(x(a)) - mean);
  const mpreal sigma = mpfr::sqrt(var / d + mpreal(ln.eps));
  std::vector<mpreal> xhat(static_cast<size_t>(d)), j(static_cast<size_t>(d) * d);
  for (int a = 0; a < d; ++a) xhat[size_t(a)] = (mpreal(x(a)) - mean) / sigma;
  for (int a = 0; a < d; ++a)
    for (int b = 0; b < d; ++b)
      j[size_t(a) * d + b] = mpreal(ln.gamma(a)) * ((a == b ? 1 : 0) - mpreal(1) / d - xhat[a] * xhat[b] / d) / sigma;
  return j;
}

TEST(LayerNormCoverTest, JacobianEnclosureHoldsTheExactJacobianTightly) {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> gauss(0.0, 1.0);
  int checked = 0;
  const long cases = testing::Count(12);
  for (long t = 0; t < cases; ++t) {
    const int d = t % 3 == 0 ? 7 : (t % 3 == 1 ? 32 : 96);
    LayerNormParams ln;
    ln.gamma = Eigen::VectorXd(d);
    ln.beta = Eigen::VectorXd(d);
    for (int a = 0; a < d; ++a) ln.gamma(a) = 1 + 0.5 * gauss(rng), ln.beta(a) = gauss(rng);
    ln.eps = t % 2 ? 1e-12 : 1e-5;
    Eigen::RowVectorXd x(d);
    // Rows of very different scales: the variance near eps, and far above it.
    const double scale = t % 4 == 0 ? 1e-3 : 3.0;
    for (int a = 0; a < d; ++a) x(a) = 0.7 + scale * gauss(rng);
    const LayerNormRowEnclosure r = EncloseLayerNormRow(ln, x);
    const IntervalMatrix m =
        LayerNormJacobianEnclosure(ln.gamma, r.xhat, Interval(1.0) / r.sigma, Interval(1.0) / Interval(double(d)));
    const std::vector<mpreal> exact = ExactLayerNormJacobian(ln, x);
    const Eigen::MatrixXd lo = m.Lower(), hi = m.Upper();
    double largest = 0;
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b) largest = std::max(largest, std::fabs(m.mid(a, b)));
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b) {
        const mpreal e = exact[size_t(a) * d + b];
        ASSERT_LE(mpreal(lo(a, b)), e) << "case " << t << " (" << a << "," << b << ")";
        ASSERT_GE(mpreal(hi(a, b)), e) << "case " << t << " (" << a << "," << b << ")";
        ASSERT_LE(m.rad(a, b), 1e-12 * largest) << "case " << t << " (" << a << "," << b << ")";
        ++checked;
      }
  }
  EXPECT_GT(checked, 0);
  EXPECT_EQ(cases == 0, checked == 0);
}

}  // namespace
}  // namespace lipcert
