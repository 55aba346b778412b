#include "interval/norms.h"

#include <Eigen/Eigenvalues>
#include <Eigen/SVD>
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "interval/fp_environment.h"

namespace lipcert {

namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "lipcert: norms: %s\n", what);
  std::abort();
}

// Upward sum of |a_ij| (+ r_ij) along rows (by_rows) or columns; returns the maximum.
// Vectorised in round to nearest: each term fl(|a| + r) carries one rounding and the sum
// of `inner` of them at most inner - 1 more (additions of subnormals are exact), so the
// exact sum is at most the floating one over 1 - gamma_{inner+1}.
double MaxAbsSumUp(const Eigen::MatrixXd& m, const Eigen::MatrixXd* r, bool by_rows) {
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  const Eigen::Index inner = by_rows ? m.cols() : m.rows();
  Eigen::VectorXd sums;
  if (r) {
    if (by_rows) {
      sums = Eigen::VectorXd::Zero(m.rows());
      AddAbsRowSums(m, *r, sums);
    }
    else sums = (m.array().abs() + r->array()).colwise().sum().transpose();
  } else {
    if (by_rows) {  // column by column, contiguous (as AddAbsRowSums)
      sums = Eigen::VectorXd::Zero(m.rows());
      for (Eigen::Index c = 0; c < m.cols(); ++c) sums.array() += m.col(c).array().abs();
    }
    else sums = m.array().abs().colwise().sum().transpose();
  }
  const double shrink = SubDown(1.0, GammaUp(double(inner) + 1));
  double best = 0.0;
  for (Eigen::Index o = 0; o < sums.size(); ++o) {
    const double s = DivUp(sums(o), shrink);
    if (!(s <= best)) best = s;  // NaN propagates as "not <=" and becomes the result
  }
  return best;
}

}  // namespace

void AddAbsRowSums(const Eigen::Ref<const Eigen::MatrixXd>& mid, const Eigen::Ref<const Eigen::MatrixXd>& rad,
                   Eigen::Ref<Eigen::VectorXd> hi, Eigen::VectorXd* lo) {
  if (rad.rows() != mid.rows() || rad.cols() != mid.cols() || hi.size() != mid.rows() || (lo && lo->size() != mid.rows()))
    Die("AddAbsRowSums: shapes differ");
  const ScopedSoundFpEnvironment fp_guard;  // round to nearest, as the bound assumes
  for (Eigen::Index c = 0; c < mid.cols(); ++c) {
    hi.array() += mid.col(c).array().abs() + rad.col(c).array();
    if (lo) lo->array() += (mid.col(c).array().abs() - rad.col(c).array()).max(0.0);
  }
}

namespace {

double FrobeniusSquaredUp(const Eigen::MatrixXd& m, const Eigen::MatrixXd* r) {
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  const Eigen::Index n = m.size();
  if (n == 0) return 0.0;
  // Vectorised: v = fl(|m| + r) <= (|m| + r) / (1 + 2u)... i.e. |m| + r <= v (1 + 2u); the
  // sum of the n squares fl(v^2) in any order is within gamma_n of its exact value plus
  // n eta (underflow), so sum (|m| + r)^2 <= (1 + 2u)^2 (fl(sum) + n eta) / (1 - gamma_n).
  double s;
  double widen = 1.0;
  if (r) {
    s = (m.array().abs() + r->array()).matrix().squaredNorm();
    widen = AddUp(1.0, 2 * kUnitRoundoff);
    widen = MulUp(widen, widen);
  } else {
    s = m.squaredNorm();
  }
  if (!(s < kInf)) return s;  // +inf or NaN, as the entries say
  const double keta = MulUp(double(n), kEta);
  return DivUp(MulUp(AddUp(s, keta), widen), SubDown(1.0, GammaUp(double(n))));
}

// Upper bound (entrywise) on the exact product a x for a >= 0, x >= 0:
//   exact <= (fl(a x) + k eta) / (1 - gamma_k)     (docs/rounding-model.md, eq. (N)).
Eigen::VectorXd MulNonnegUp(const Eigen::MatrixXd& a, const Eigen::VectorXd& x) {
  const double k = static_cast<double>(a.cols());
  const double gamma = GammaUp(k);
  const double keta = k * kEta;
  const double den = SubDown(1.0, gamma);
  Eigen::VectorXd y = a * x;
  for (Eigen::Index i = 0; i < y.size(); ++i) y[i] = DivUp(AddUp(y[i], keta), den);
  return y;
}
Eigen::VectorXd MulNonnegUpT(const Eigen::MatrixXd& a, const Eigen::VectorXd& x) {
  const double k = static_cast<double>(a.rows());
  const double gamma = GammaUp(k);
  const double keta = k * kEta;
  const double den = SubDown(1.0, gamma);
  Eigen::VectorXd y = a.transpose() * x;
  for (Eigen::Index i = 0; i < y.size(); ++i) y[i] = DivUp(AddUp(y[i], keta), den);
  return y;
}

void CheckNonneg(const Eigen::MatrixXd& a) {
  const Eigen::Index n = a.size();
  for (Eigen::Index i = 0; i < n; ++i)
    if (!(a.data()[i] >= 0)) Die("matrix must be nonnegative (and not NaN)");
}

// Collatz-Wielandt: rho(N) <= max_i (N x)_i / x_i for x > 0, N >= 0. `apply_up` returns an
// entrywise upper bound on N x. Tries several positive floors of the power-iteration
// vector and returns the smallest bound.
template <class ApplyUp, class ApplyFl>
double CollatzWielandtUp(Eigen::Index n, ApplyUp apply_up, ApplyFl apply_fl, int iterations) {
  Eigen::VectorXd x = Eigen::VectorXd::Ones(n);
  double best = kInf;
  auto evaluate = [&](const Eigen::VectorXd& v) {
    const double vmax = v.maxCoeff();
    if (!(vmax > 0) || !std::isfinite(vmax)) return;
    for (double floor_rel : {0.0, 1e-12, 1e-8, 1e-4}) {
      Eigen::VectorXd w = v / vmax;  // any positive vector is a valid test vector
      const double fl = floor_rel == 0.0 ? 0x1p-900 : floor_rel;
      for (Eigen::Index i = 0; i < n; ++i) w[i] = std::max(w[i], fl);
      const Eigen::VectorXd z = apply_up(w);
      double r = 0.0;
      for (Eigen::Index i = 0; i < n; ++i) {
        const double q = DivUp(z[i], w[i]);
        if (!(q <= r)) r = q;
      }
      if (r < best) best = r;
    }
  };
  evaluate(x);
  for (int it = 0; it < iterations; ++it) {
    Eigen::VectorXd y = apply_fl(x);
    const double m = y.maxCoeff();
    if (!(m > 0) || !std::isfinite(m)) break;
    x = y / m;
    if (it >= iterations - 3) evaluate(x);
  }
  return best;
}

// Cholesky M = L L^T in place on the lower triangle (column-major, left-looking, one
// GEMV per column, explicit division by the pivot). Returns false if a pivot is not > 0.
bool CholeskyLowerInPlace(Eigen::MatrixXd* m) {
  Eigen::MatrixXd& l = *m;
  const Eigen::Index n = l.rows();
  for (Eigen::Index j = 0; j < n; ++j) {
    if (j > 0) {
      l.block(j, j, n - j, 1).noalias() -= l.block(j, 0, n - j, j) * l.row(j).head(j).transpose();
    }
    const double d = l(j, j);
    if (!(d > 0) || !std::isfinite(d)) return false;
    const double ljj = std::sqrt(d);
    l(j, j) = ljj;
    double* col = &l(0, j);
    for (Eigen::Index i = j + 1; i < n; ++i) col[i] = col[i] / ljj;
  }
  return true;
}

struct LanczosEstimate {
  double lambda_max = 0.0;
  double lambda_min = 0.0;
};

// Lanczos with full reorthogonalisation on symmetric b; floating point, no guarantee.
LanczosEstimate Lanczos(const Eigen::MatrixXd& b, int max_steps, double tol) {
  const Eigen::Index n = b.rows();
  const Eigen::Index kmax = std::min<Eigen::Index>(n, std::max(1, max_steps));
  Eigen::MatrixXd q(n, kmax);
  std::vector<double> alpha, beta;
  // Deterministic start vector with no special structure.
  Eigen::VectorXd v(n);
  std::uint64_t s = 0x9E3779B97F4A7C15ULL;
  for (Eigen::Index i = 0; i < n; ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    v[i] = 1.0 + 0.5 * (static_cast<double>(s >> 11) * 0x1p-53);
  }
  v.normalize();
  LanczosEstimate est;
  Eigen::VectorXd w(n);
  auto orthogonalise = [&](Eigen::Index cols, Eigen::VectorXd* x) {  // full reorthogonalisation, twice
    for (int pass = 0; pass < 2; ++pass) {
      const Eigen::VectorXd c = q.leftCols(cols).transpose() * *x;
      x->noalias() -= q.leftCols(cols) * c;
    }
  };
  bool ever_restarted = false;
  for (Eigen::Index k = 0; k < kmax; ++k) {
    q.col(k) = v;
    w.noalias() = b * v;
    const double a = v.dot(w);
    alpha.push_back(a);
    const double before = w.norm();
    orthogonalise(k + 1, &w);
    double bt = w.norm();
    // An invariant subspace (b of low rank, or a start with no component along some
    // eigenvectors): what is left of w is rounding noise, not orthogonal to q once
    // normalised, and its Ritz values could leave the spectrum. Go on from a fresh
    // direction orthogonal to q, with a zero coupling (the tridiagonal matrix then splits).
    bool restarted = false;
    if (k + 1 < kmax && !(bt > 1e-8 * before)) {
      for (Eigen::Index i = 0; i < n; ++i) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        w[i] = static_cast<double>(s >> 11) * 0x1p-53 - 0.5;
      }
      const double fresh = w.norm();
      orthogonalise(k + 1, &w);
      restarted = w.norm() > 1e-8 * fresh;
      bt = restarted ? w.norm() : 0.0;
      ever_restarted |= restarted;
    }
    const bool last = (k + 1 == kmax) || !(bt > 0);
    if ((k + 1) % 10 == 0 || last) {
      const Eigen::Index m = k + 1;
      Eigen::MatrixXd t = Eigen::MatrixXd::Zero(m, m);
      for (Eigen::Index i = 0; i < m; ++i) {
        t(i, i) = alpha[i];
        if (i + 1 < m) t(i, i + 1) = t(i + 1, i) = beta[i];
      }
      Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(t);
      est.lambda_max = es.eigenvalues()(m - 1);
      est.lambda_min = es.eigenvalues()(0);
      const double resid = std::fabs(bt * es.eigenvectors()(m - 1, m - 1));
      const double scale = std::max(std::fabs(est.lambda_max), std::fabs(est.lambda_min));
      // After a restart T splits into blocks, and the residual of a Ritz vector of an
      // earlier block is 0 whatever the new block holds: no early stop from then on.
      if (last || (!ever_restarted && resid <= tol * scale)) break;
    }
    beta.push_back(restarted ? 0.0 : bt);
    v = w / bt;
  }
  return est;
}

}  // namespace

UpperBound NormInf(const Eigen::MatrixXd& a) { return UpperBound(MaxAbsSumUp(a, nullptr, true)); }
UpperBound Norm1(const Eigen::MatrixXd& a) { return UpperBound(MaxAbsSumUp(a, nullptr, false)); }
UpperBound NormInfUpper(const IntervalMatrix& a) { return UpperBound(MaxAbsSumUp(a.mid, &a.rad, true)); }
UpperBound Norm1Upper(const IntervalMatrix& a) { return UpperBound(MaxAbsSumUp(a.mid, &a.rad, false)); }
UpperBound NormFrobeniusUpper(const Eigen::MatrixXd& a) {
  return UpperBound(SqrtUp(FrobeniusSquaredUp(a, nullptr)));
}
UpperBound NormFrobeniusUpper(const IntervalMatrix& a) {
  return UpperBound(SqrtUp(FrobeniusSquaredUp(a.mid, &a.rad)));
}

UpperBound NormL2UpperCrude(const Eigen::MatrixXd& a) {
  const UpperBound g = SqrtUpper(MulNonneg(Norm1(a), NormInf(a)));
  return Min(g, NormFrobeniusUpper(a));
}
UpperBound NormL2UpperCrude(const IntervalMatrix& a) {
  const UpperBound g = SqrtUpper(MulNonneg(Norm1Upper(a), NormInfUpper(a)));
  return Min(g, NormFrobeniusUpper(a));
}

UpperBound NormL2UpperNonneg(const Eigen::MatrixXd& a, const CollatzWielandtOptions& o) {
  CheckNonneg(a);
  if (a.size() == 0) return UpperBound(0.0);
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  const double cw = CollatzWielandtUp(
      a.cols(), [&](const Eigen::VectorXd& x) { return MulNonnegUpT(a, MulNonnegUp(a, x)); },
      [&](const Eigen::VectorXd& x) -> Eigen::VectorXd { return a.transpose() * (a * x); },
      o.power_iterations);
  return Min(UpperBound(SqrtUp(cw)), NormL2UpperCrude(a));
}

UpperBound SpectralRadiusUpperNonneg(const Eigen::MatrixXd& n, const CollatzWielandtOptions& o) {
  CheckNonneg(n);
  if (n.rows() != n.cols()) Die("SpectralRadiusUpperNonneg: not square");
  if (n.size() == 0) return UpperBound(0.0);
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  const double cw = CollatzWielandtUp(
      n.cols(), [&](const Eigen::VectorXd& x) { return MulNonnegUp(n, x); },
      [&](const Eigen::VectorXd& x) -> Eigen::VectorXd { return n * x; }, o.power_iterations);
  // rho(n) <= ||n||_inf as well.
  return Min(UpperBound(cw), NormInf(n));
}

// A radius norm below this fraction of the midpoint's norm is taken from the crude bound.
constexpr double kNegligibleRadius = 1e-9;

UpperBound LambdaMaxUpper(const IntervalMatrix& b_in, const NormL2Options& o, NormL2Report* report) {
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  if (b_in.rows() != b_in.cols()) Die("LambdaMaxUpper: not square");
  NormL2Report local;
  NormL2Report& rep = report ? *report : local;
  rep = NormL2Report();
  const Eigen::Index n = b_in.rows();
  if (n == 0) return UpperBound(-kInf);
  const IntervalMatrix b = SymmetrizeEnclosure(b_in);
  // ||B - mid||_2 <= ||rad||_2 = rho(rad) (rad symmetric, >= 0).
  // rho(rad) <= ||rad||_inf; the Collatz-Wielandt refinement only where that matters
  // (a radius of rounding size next to the midpoint's norm does not).
  UpperBound rad_norm = NormInf(b.rad);
  if (rad_norm.value() > 0.0 && rad_norm.value() > kNegligibleRadius * NormInf(b.mid).value())
    rad_norm = SpectralRadiusUpperNonneg(b.rad, o.radius);
  rep.radius_norm = rad_norm.value();
  for (Eigen::Index i = 0; i < b.mid.size(); ++i)
    if (!std::isfinite(b.mid.data()[i])) return UpperBound(kInf);
  const UpperBound mid_inf = NormInf(b.mid);  // rho(mid) <= ||mid||_inf: the fallback
  auto fallback = [&]() {
    rep.fell_back_to_crude = true;
    return UpperBound(AddUp(mid_inf.value(), rad_norm.value()));
  };
  if (mid_inf.value() == 0.0) return UpperBound(rad_norm.value());
  if (!std::isfinite(mid_inf.value())) return UpperBound(kInf);

  const LanczosEstimate est = Lanczos(b.mid, o.lanczos_max_steps, o.lanczos_tolerance);
  rep.estimate = est.lambda_max;
  double nu = std::max(std::fabs(est.lambda_max), std::fabs(est.lambda_min));
  if (!(nu > 0) || !std::isfinite(nu)) nu = mid_inf.value();
  const double nd = static_cast<double>(n);
  const double gamma_n1 = GammaUp(nd + 1.0);
  if (!(gamma_n1 < 1.0)) return fallback();
  double tau = o.initial_shift > 0 ? o.initial_shift : 4.0 * (nd + 1.0) * kUnitRoundoff;

  Eigen::MatrixXd m(n, n);
  for (int attempt = 0; attempt < o.max_cholesky_attempts; ++attempt) {
    const double s = AddUp(est.lambda_max, MulUp(tau, nu));
    tau *= o.shift_growth;
    if (!std::isfinite(s)) break;
    // M = s I - mid (lower triangle); the diagonal rounding error is bounded exactly.
    double diag_err = 0.0;
    for (Eigen::Index j = 0; j < n; ++j) {
      for (Eigen::Index i = j + 1; i < n; ++i) m(i, j) = -b.mid(i, j);
      const double d = s - b.mid(j, j);
      m(j, j) = d;
      const double e = std::max(SubUp(AddUp(s, -b.mid(j, j)), d), SubUp(d, AddDown(s, -b.mid(j, j))));
      diag_err = std::max(diag_err, e);
    }
    ++rep.cholesky_attempts;
    if (!CholeskyLowerInPlace(&m)) continue;
    // L L^T = M + dM, |dM| <= gamma_{n+1} |L||L^T| + E_eta  =>
    // ||dM||_2 <= gamma_{n+1} ||L||_F^2 + 2 n (n+1) (1 + max l_jj) eta.
    double fro2 = 0.0, lmax = 0.0;
    for (Eigen::Index j = 0; j < n; ++j) {
      lmax = std::max(lmax, m(j, j));
      for (Eigen::Index i = j; i < n; ++i) fro2 = AddUp(fro2, MulUp(m(i, j), m(i, j)));
    }
    const double eta_term = MulUp(MulUp(2.0 * nd, nd + 1.0), MulUp(AddUp(1.0, lmax), kEta));
    const double dm = AddUp(MulUp(gamma_n1, fro2), eta_term);
    // lambda_min(s I - mid) >= -(dm + diag_err)  =>  lambda_max(mid) <= s + dm + diag_err.
    const double lam = AddUp(AddUp(AddUp(s, dm), diag_err), rad_norm.value());
    rep.shift = s;
    rep.cholesky_error = AddUp(dm, diag_err);
    const double crude = AddUp(mid_inf.value(), rad_norm.value());
    return UpperBound(std::min(lam, crude));
  }
  return fallback();
}

UpperBound NormL2Upper(const Eigen::MatrixXd& a, const NormL2Options& o, NormL2Report* report) {
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  if (a.size() == 0) return UpperBound(0.0);
  for (Eigen::Index i = 0; i < a.size(); ++i)
    if (!std::isfinite(a.data()[i])) return UpperBound(kInf);
  // Scale by 2^-e so that max |a_ij| is in [1, 2): the Gram matrix neither overflows nor
  // underflows. a = 2^e (a_s + d) with |d_ij| <= eta/2 where the scaling was inexact
  // (entries pushed into the subnormal range), so ||a|| <= 2^e (||a_s|| + sqrt(mn) eta).
  const double amax = a.cwiseAbs().maxCoeff();
  if (amax == 0.0) return UpperBound(0.0);
  const int e = std::ilogb(amax);
  Eigen::MatrixXd as(a.rows(), a.cols());
  bool inexact = false;
  for (Eigen::Index i = 0; i < a.size(); ++i) {
    as.data()[i] = std::ldexp(a.data()[i], -e);
    inexact |= std::ldexp(as.data()[i], e) != a.data()[i];
  }
  // The smaller Gram matrix: a^T a (cols x cols) or a a^T (rows x rows).
  const IntervalMatrix g = as.cols() <= as.rows() ? GramEnclosure(as) : GramEnclosure(Eigen::MatrixXd(as.transpose()));
  const UpperBound lam = LambdaMaxUpper(g, o, report);
  const double l = std::max(0.0, lam.value());  // a Gram matrix is PSD
  double ns = SqrtUp(l);
  if (inexact) ns = AddUp(ns, MulUp(SqrtUp(MulUp(static_cast<double>(a.rows()), static_cast<double>(a.cols()))), kEta));
  const double scale = std::ldexp(1.0, e);  // exact power of two (|e| <= 1074)
  const double n2 = std::isfinite(scale) && scale > 0 ? MulUp(ns, scale) : kInf;
  return Min(UpperBound(n2), NormL2UpperCrude(a));
}

UpperBound NormL2UpperInterval(const IntervalMatrix& a, const NormL2Options& o) {
  const UpperBound mid = NormL2Upper(a.mid, o);
  // The crude bound on the radius first; Collatz-Wielandt only where it matters.
  UpperBound rad = a.rad.maxCoeff() == 0.0 ? UpperBound(0.0) : NormL2UpperCrude(a.rad);
  if (rad.value() > kNegligibleRadius * mid.value()) rad = NormL2UpperNonneg(a.rad, o.radius);
  return Min(mid + rad, NormL2UpperCrude(a));
}

UpperBound ProductNormL2Upper(const Eigen::MatrixXd& a, const Eigen::MatrixXd& b, const NormL2Options& o) {
  if (a.rows() != b.rows()) Die("ProductNormL2Upper: a and b need the same number of rows");
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  const IntervalMatrix g = GramEnclosure(Eigen::MatrixXd(b.transpose()));  // b b^T
  const Eigen::LLT<Eigen::MatrixXd> llt(g.mid);
  if (llt.info() != Eigen::Success) return NormL2UpperInterval(Mul(Eigen::MatrixXd(a.transpose()), b), o);
  const Eigen::MatrixXd r = llt.matrixU();
  const IntervalMatrix e = g - Mul(Eigen::MatrixXd(r.transpose()), r);
  const IntervalMatrix ra = Mul(r, a);
  const UpperBound main = LambdaMaxUpper(GramEnclosure(ra.transpose()), o);
  const UpperBound a2 = LambdaMaxUpper(GramEnclosure(Eigen::MatrixXd(a.transpose())), o);
  const double square = AddUp(std::max(main.value(), 0.0), MulUp(NormL2UpperCrude(e).value(), std::max(a2.value(), 0.0)));
  return UpperBound(SqrtUp(square));
}

UpperBound NormL2UpperImplicitPsd(Eigen::Index n,
                                  const std::function<void(const Eigen::VectorXd&, Eigen::VectorXd*)>& apply,
                                  double column_error, const NormL2Options& o) {
  if (!(column_error >= 0)) Die("NormL2UpperImplicitPsd: column_error must be >= 0");
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  Eigen::MatrixXd mt(n, n);
  Eigen::VectorXd e = Eigen::VectorXd::Zero(n), y(n);
  for (Eigen::Index j = 0; j < n; ++j) {
    e[j] = 1.0;
    apply(e, &y);
    if (y.size() != n) Die("NormL2UpperImplicitPsd: apply returned the wrong size");
    mt.col(j) = y;
    e[j] = 0.0;
  }
  // S = (Mt + Mt^T)/2 is symmetric; enclose it, then lambda_max(M) <= lambda_max(S) + ||E||_2
  // with ||E||_2 <= ||E||_F <= sqrt(n) column_error (E = Mt - M; M = S - (E + E^T)/2).
  IntervalMatrix s = Scale(Interval(0.5), IntervalMatrix::Point(mt) + IntervalMatrix::Point(mt.transpose()));
  const UpperBound lam = LambdaMaxUpper(s, o);
  const double err = MulUp(SqrtUp(static_cast<double>(n)), column_error);
  return UpperBound(std::max(0.0, AddUp(lam.value(), err)));
}

LowerBound NormRatioLower(const Eigen::MatrixXd& a, const Eigen::VectorXd& v) {
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  if (a.cols() != v.size()) Die("NormRatioLower: size mismatch");
  const IntervalMatrix av = Mul(a, Eigen::MatrixXd(v));
  double num2 = 0.0;
  for (Eigen::Index i = 0; i < av.rows(); ++i) {
    const double mg = av(i, 0).Mig();
    num2 = AddDown(num2, MulDown(mg, mg));
  }
  double den2 = 0.0;
  for (Eigen::Index i = 0; i < v.size(); ++i) den2 = AddUp(den2, MulUp(v[i], v[i]));
  if (den2 == 0.0 || num2 <= 0.0) return LowerBound(0.0);
  return LowerBound(std::max(0.0, DivDown(SqrtDown(num2), SqrtUp(den2))));
}

LowerBound NormL2Lower(const Eigen::MatrixXd& a, int power_iterations) {
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  if (a.size() == 0) return LowerBound(0.0);
  for (Eigen::Index i = 0; i < a.size(); ++i)
    if (!std::isfinite(a.data()[i])) return LowerBound(0.0);
  LowerBound best(0.0);
  if (std::min(a.rows(), a.cols()) <= 64) {
    // Small: the top right singular vector from a floating-point SVD is the best witness.
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(a, Eigen::ComputeThinV);
    best = Max(best, NormRatioLower(a, svd.matrixV().col(0)));
  }
  Eigen::VectorXd v = Eigen::VectorXd::Ones(a.cols());
  for (Eigen::Index i = 0; i < v.size(); ++i) v[i] += 0.01 * std::sin(1.0 + static_cast<double>(i));
  for (int it = 0; it < power_iterations; ++it) {
    Eigen::VectorXd w = a.transpose() * (a * v);
    const double nw = w.norm();
    if (!(nw > 0) || !std::isfinite(nw)) break;
    v = w / nw;
  }
  return Max(best, NormRatioLower(a, v));
}

}  // namespace lipcert
