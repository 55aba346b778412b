// Figures for docs/rounding-model.md: midpoint-radius GEMM against plain double GEMM and
// against Boost interval scalars through Eigen, and the rigorous l2 norm of a 1024 x 1024
// point matrix (time and overestimate against the double SVD's sigma_1).
//
//   build-*/bench/interval_bench   (Release build; single-threaded Eigen; times are thread CPU time)
#include <Eigen/Dense>
#include <Eigen/SVD>
#include <algorithm>
#include <boost/numeric/interval.hpp>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "interval/boost_interval.h"
#include "interval/interval_matrix.h"
#include "interval/norms.h"

namespace {


double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Median thread CPU time (seconds) of `reps` runs of f: robust on a shared machine
// (Eigen runs single-threaded here, so CPU time is the work done).
double Time(int reps, const std::function<void()>& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double a = ThreadCpuSeconds();
    f();
    t.push_back(ThreadCpuSeconds() - a);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Eigen::MatrixXd Gaussian(std::mt19937_64& g, int r, int c) {
  std::normal_distribution<double> d;
  Eigen::MatrixXd m(r, c);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = d(g);
  return m;
}

// C = A B with interval scalars stored in Eigen matrices (Eigen's own product is
// ambiguous for Boost intervals, so the scalar triple loop is what "through Eigen" runs).
template <class I>
void ScalarIntervalGemm(const Eigen::Matrix<I, -1, -1>& a, const Eigen::Matrix<I, -1, -1>& b,
                        Eigen::Matrix<I, -1, -1>* c) {
  const Eigen::Index n = a.rows(), k = a.cols(), m = b.cols();
  for (Eigen::Index j = 0; j < m; ++j)
    for (Eigen::Index i = 0; i < n; ++i) {
      I s(0.0);
      for (Eigen::Index l = 0; l < k; ++l) s += a(i, l) * b(l, j);
      (*c)(i, j) = s;
    }
}

}  // namespace

int main() {
  using namespace lipcert;
  std::mt19937_64 g(7);
  std::printf("lipcert interval_bench (Eigen threads: %d)\n", Eigen::nbThreads());

  // ---- GEMM n = 256 ----
  {
    const int n = 256;
    const Eigen::MatrixXd am = Gaussian(g, n, n), bm = Gaussian(g, n, n);
    const IntervalMatrix a(am, Gaussian(g, n, n).cwiseAbs() * 1e-8), b(bm, Gaussian(g, n, n).cwiseAbs() * 1e-8);
    Eigen::MatrixXd c(n, n);
    const double t_d = Time(21, [&] { c.noalias() = am * bm; });
    IntervalMatrix ci;
    const double t_ii = Time(21, [&] { ci = Mul(a, b); });
    const double t_pi = Time(21, [&] { ci = Mul(am, b); });
    const double t_pp = Time(21, [&] { ci = Mul(am, bm); });
    std::printf("GEMM n=%d: double %.3f ms | midrad interval x interval %.3f ms (%.2fx) | point x interval %.3f ms (%.2fx) | point x point enclosure %.3f ms (%.2fx)\n",
                n, 1e3 * t_d, 1e3 * t_ii, t_ii / t_d, 1e3 * t_pi, t_pi / t_d, 1e3 * t_pp, t_pp / t_d);
  }
  // ---- against Boost interval scalars through Eigen, n = 128 ----
  {
    const int n = 128;
    const Eigen::MatrixXd am = Gaussian(g, n, n), bm = Gaussian(g, n, n);
    const IntervalMatrix a(am, Eigen::MatrixXd::Constant(n, n, 1e-8)), b(bm, Eigen::MatrixXd::Constant(n, n, 1e-8));
    IntervalMatrix ci;
    const double t_mr = Time(11, [&] { ci = Mul(a, b); });
    using BoostDefault = boost::numeric::interval<double>;  // fesetround-switching policy
    Eigen::Matrix<BoostDefault, -1, -1> ba(n, n), bb(n, n), bc(n, n);
    Eigen::Matrix<BoostInterval, -1, -1> fa(n, n), fb(n, n), fc(n, n);
    for (Eigen::Index i = 0; i < n * n; ++i) {
      ba.data()[i] = BoostDefault(am.data()[i] - 1e-8, am.data()[i] + 1e-8);
      bb.data()[i] = BoostDefault(bm.data()[i] - 1e-8, bm.data()[i] + 1e-8);
      fa.data()[i] = BoostInterval(am.data()[i] - 1e-8, am.data()[i] + 1e-8);
      fb.data()[i] = BoostInterval(bm.data()[i] - 1e-8, bm.data()[i] + 1e-8);
    }
    const double t_bd = Time(3, [&] { ScalarIntervalGemm(ba, bb, &bc); });
    const double t_bf = Time(3, [&] { ScalarIntervalGemm(fa, fb, &fc); });
    // Width comparison on one entry.
    const double w_mr = 2 * ci.rad(5, 7), w_b = bc(5, 7).upper() - bc(5, 7).lower();
    std::printf("GEMM n=%d: midrad %.3f ms | Boost interval<double> (mode-switching) through Eigen %.1f ms (%.0fx slower) | "
                "BoostInterval on ModeFreeRounding %.1f ms (%.0fx slower) | width of C(5,7): midrad %.3g, Boost %.3g\n",
                n, 1e3 * t_mr, 1e3 * t_bd, t_bd / t_mr, 1e3 * t_bf, t_bf / t_mr, w_mr, w_b);
  }
  // ---- rigorous l2 norm, n = 1024 ----
  {
    const int n = 1024;
    const Eigen::MatrixXd a = Gaussian(g, n, n);
    NormL2Report rep;
    UpperBound up(0.0);
    const double t_up = Time(3, [&] { up = NormL2Upper(a, {}, &rep); });
    double s1 = 0;
    const double t_svd = Time(1, [&] { s1 = Eigen::BDCSVD<Eigen::MatrixXd>(a).singularValues()(0); });
    const LowerBound lo = NormL2Lower(a, 300);
    std::printf("NormL2Upper n=%d: %.3f s (%d Cholesky attempt(s)) | bound %.17g | double SVD sigma_1 %.17g (%.2f s) | "
                "relative overestimate %.3g | certified lower bound %.17g (gap %.3g)\n",
                n, t_up, rep.cholesky_attempts, up.value(), s1, t_svd, up.value() / s1 - 1, lo.value(),
                up.value() / lo.value() - 1);
  }
  return 0;
}
