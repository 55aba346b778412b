#include "interval/softmax.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "interval/fp_environment.h"

namespace lipcert {

namespace {
[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "lipcert: softmax: %s\n", what);
  std::abort();
}
}  // namespace

ProbabilityBounds SoftmaxRange(const Eigen::VectorXd& l, const Eigen::VectorXd& u, Eigen::Index len,
                               ExpBackend b) {
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  const Eigen::Index n = l.size();
  if (u.size() != n) Die("SoftmaxRange: l and u sizes differ");
  if (len < 1 || len > n) Die("SoftmaxRange: len out of range");
  for (Eigen::Index i = 0; i < len; ++i)
    if (!(l[i] <= u[i])) Die("SoftmaxRange: l > u (or NaN)");
  ProbabilityBounds p;
  p.lo = Eigen::VectorXd::Zero(n);
  p.hi = Eigen::VectorXd::Zero(n);
  if (len == 1) {
    p.lo[0] = p.hi[0] = 1.0;
    return p;
  }
  // Shifts: e^{u_j - l_i} = e^{u_j - cu} e^{cu - l_i}, exact in the reals.
  double cu = -kInf, cl = -kInf;
  for (Eigen::Index i = 0; i < len; ++i) {
    cu = std::max(cu, u[i]);
    cl = std::max(cl, l[i]);
  }
  if (!std::isfinite(cu) || !std::isfinite(cl)) {
    // Unbounded logits: only the trivial bounds are certain.
    for (Eigen::Index i = 0; i < len; ++i) p.hi[i] = 1.0;
    return p;
  }
  // eu_j >= e^{u_j - cu} (upper), el_j <= e^{l_j - cl} (lower).
  std::vector<double> eu(len), el(len);
  for (Eigen::Index j = 0; j < len; ++j) {
    eu[j] = ExpUpper(SubUp(u[j], cu), b);
    el[j] = ExpLower(SubDown(l[j], cl), b);
  }
  // Leave-one-out sums via prefix/suffix sums rounded in the needed direction.
  std::vector<double> pre_u(len + 1, 0.0), suf_u(len + 1, 0.0), pre_l(len + 1, 0.0),
      suf_l(len + 1, 0.0);
  for (Eigen::Index j = 0; j < len; ++j) {
    pre_u[j + 1] = AddUp(pre_u[j], eu[j]);
    pre_l[j + 1] = AddDown(pre_l[j], el[j]);
  }
  for (Eigen::Index j = len; j-- > 0;) {
    suf_u[j] = AddUp(suf_u[j + 1], eu[j]);
    suf_l[j] = AddDown(suf_l[j + 1], el[j]);
  }
  for (Eigen::Index i = 0; i < len; ++i) {
    // Lower bound of p_i: S_up >= sum_{j!=i} e^{u_j - l_i}.
    const double rest_u = AddUp(pre_u[i], suf_u[i + 1]);
    const double fu = ExpUpper(SubUp(cu, l[i]), b);  // >= e^{cu - l_i}
    const double s_up = MulUp(rest_u, fu);           // 0 * inf == 0 is right: rest is 0 only if len == 1
    p.lo[i] = std::max(0.0, DivDown(1.0, AddUp(1.0, s_up)));
    // Upper bound of p_i: S_lo <= sum_{j!=i} e^{l_j - u_i}.
    const double rest_l = AddDown(pre_l[i], suf_l[i + 1]);
    const double fl = ExpLower(SubDown(cl, u[i]), b);  // <= e^{cl - u_i}
    const double s_lo = std::max(0.0, MulDown(rest_l, fl));
    p.hi[i] = std::min(1.0, DivUp(1.0, AddDown(1.0, s_lo)));
  }
  return p;
}

ProbabilityMatrixBounds SoftmaxRowsRange(const IntervalMatrix& logits, bool causal, ExpBackend b) {
  const Eigen::Index n = logits.rows(), m = logits.cols();
  if (causal && n > m) Die("SoftmaxRowsRange: causal mask needs rows <= cols");
  const Eigen::MatrixXd lo = logits.Lower(), hi = logits.Upper();
  ProbabilityMatrixBounds r;
  r.lo.resize(n, m);
  r.hi.resize(n, m);
  for (Eigen::Index i = 0; i < n; ++i) {
    const Eigen::VectorXd l = lo.row(i).transpose(), u = hi.row(i).transpose();
    const ProbabilityBounds p = SoftmaxRange(l, u, causal ? i + 1 : m, b);
    r.lo.row(i) = p.lo.transpose();
    r.hi.row(i) = p.hi.transpose();
  }
  return r;
}

UpperBound SoftmaxJacobianL2Upper(const ProbabilityBounds& p) {
  const double m = p.hi.size() ? p.hi.maxCoeff() : 0.0;
  return UpperBound(std::min(0.5, m));
}

}  // namespace lipcert
