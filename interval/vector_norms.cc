#include "interval/vector_norms.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "interval/fp_environment.h"
#include "interval/norms.h"
#include "interval/rounding.h"

namespace lipcert {

// The 2- and 1-norms from one vectorised floating sum (any order): a sum of d nonnegative
// terms, each rounded at most d times (its square, the additions), is at least the exact
// sum times 1 - gamma_d; the squares' underflow adds at most d eta (additions of
// subnormals are exact).
double NormUpOfMagnitudes(const Eigen::VectorXd& m, VectorNorm q) {
  const ScopedSoundFpEnvironment fp_guard;  // gradual underflow for the d eta term
  const double d = double(m.size());
  if (q == VectorNorm::kTwo) return SqrtUp(DivUp(AddUp(m.squaredNorm(), MulUp(d, kEta)), SubDown(1.0, GammaUp(d))));
  if (q == VectorNorm::kOne) return DivUp(m.sum(), SubDown(1.0, GammaUp(d)));
  return m.size() ? m.maxCoeff() : 0.0;  // inf-norm, exact
}

Eigen::VectorXd RowMagnitude(const IntervalMatrix& a, Eigen::Index r) {
  Eigen::VectorXd m(a.cols());
  for (Eigen::Index c = 0; c < a.cols(); ++c) m(c) = AddUp(std::fabs(a.mid(r, c)), a.rad(r, c));
  return m;
}

// The magnitudes |m_j - m_k| + r_j + r_k in one vectorised pass, round to nearest: three
// roundings, so times 1 + 2^-50 (rounded once more) plus the smallest subnormal (a product
// that underflows) they are at least the exact ones.
Eigen::MatrixXd PairDistanceUp(const IntervalMatrix& a, VectorNorm q) {
  const ScopedSoundFpEnvironment fp_guard;  // round to nearest, gradual underflow
  const Eigen::Index n = a.rows();
  Eigen::MatrixXd out = Eigen::MatrixXd::Zero(n, n);
  constexpr double kInflate = 1 + 0x1p-50;
  Eigen::VectorXd m(a.cols());
  for (Eigen::Index j = 0; j < n; ++j)
    for (Eigen::Index k = j + 1; k < n; ++k) {
      m = (((a.mid.row(j) - a.mid.row(k)).cwiseAbs() + (a.rad.row(j) + a.rad.row(k))) * kInflate).transpose();
      m.array() += kEta;
      out(j, k) = out(k, j) = NormUpOfMagnitudes(m, q);
    }
  return out;
}

Eigen::MatrixXd PairDistanceL2Down(const IntervalMatrix& a) {
  const Eigen::Index n = a.rows(), d = a.cols();
  Eigen::MatrixXd out = Eigen::MatrixXd::Zero(n, n);
  for (Eigen::Index j = 0; j < n; ++j)
    for (Eigen::Index k = j + 1; k < n; ++k) {
      double s = 0;
      for (Eigen::Index c = 0; c < d; ++c) {
        const double diff = std::max(SubDown(a.mid(j, c), a.mid(k, c)), SubDown(a.mid(k, c), a.mid(j, c)));
        const double g = SubDown(diff, AddUp(a.rad(j, c), a.rad(k, c)));
        if (g > 0) s = AddDown(s, MulDown(g, g));
      }
      out(j, k) = out(k, j) = s > 0 ? SqrtDown(s) : 0.0;
    }
  return out;
}

// As PairDistanceUp: the magnitudes |a_j - b_i| + r_j + r_i in one vectorised pass (three
// roundings, times 1 + 2^-50, plus the smallest subnormal), then NormUpOfMagnitudes. It was
// a directed-rounding loop over n m d entries, a fifth of the variation's time at N = 128,
// D = 768 (docs/engines.md, "The variation's time, and the centre norm's reserve").
Eigen::MatrixXd RowDistanceL2Up(const IntervalMatrix& a, const IntervalMatrix& b) {
  const ScopedSoundFpEnvironment fp_guard;  // round to nearest, gradual underflow
  const Eigen::Index n = b.rows(), m = a.rows();
  Eigen::MatrixXd out(n, m);
  constexpr double kInflate = 1 + 0x1p-50;
  // Columns are contiguous: the rows of a and b as columns.
  const Eigen::MatrixXd am = a.mid.transpose(), ar = a.rad.transpose(), bm = b.mid.transpose(), br = b.rad.transpose();
  Eigen::VectorXd mag(am.rows());
  for (Eigen::Index i = 0; i < n; ++i)
    for (Eigen::Index j = 0; j < m; ++j) {
      mag = ((am.col(j) - bm.col(i)).cwiseAbs() + (ar.col(j) + br.col(i))) * kInflate;
      mag.array() += kEta;
      out(i, j) = NormUpOfMagnitudes(mag, VectorNorm::kTwo);
    }
  return out;
}

double OperatorNormFromL2Up(const IntervalMatrix& m, VectorNorm q) {
  if (q == VectorNorm::kTwo) return NormL2UpperInterval(m).value();
  double out = 0;
  for (Eigen::Index r = 0; r < m.rows(); ++r) {
    const double rn = NormUpOfMagnitudes(RowMagnitude(m, r), VectorNorm::kTwo);
    out = q == VectorNorm::kOne ? AddUp(out, rn) : std::max(out, rn);  // 2 -> 1: sum; 2 -> inf: max
  }
  return out;
}

double OperatorNormUp(const IntervalMatrix& m, VectorNorm q) {
  switch (q) {
    case VectorNorm::kTwo: return NormL2UpperInterval(m).value();
    case VectorNorm::kInf: return NormInfUpper(m).value();
    case VectorNorm::kOne: return Norm1Upper(m).value();
  }
  return kInf;
}

double NonnegNormUp(const Eigen::MatrixXd& b, VectorNorm q) {
  if (q == VectorNorm::kTwo) return NormL2UpperNonneg(b).value();
  const Eigen::MatrixXd& m = b;
  const bool rows = q == VectorNorm::kInf;  // inf: max row sum; 1: max column sum
  double out = 0;
  for (Eigen::Index r = 0; r < (rows ? m.rows() : m.cols()); ++r) {
    double s = 0;
    for (Eigen::Index c = 0; c < (rows ? m.cols() : m.rows()); ++c) s = AddUp(s, rows ? m(r, c) : m(c, r));
    out = std::max(out, s);
  }
  return out;
}

double ScaledNonnegNormUp(Eigen::MatrixXd b, const Eigen::VectorXd& s, VectorNorm q) {
  for (Eigen::Index j = 0; j < b.cols(); ++j)
    for (Eigen::Index i = 0; i < b.rows(); ++i) b(i, j) = MulUp(b(i, j), s(j));
  return NonnegNormUp(b, q);
}

namespace {
// Whether the caps fit the total (their sum rounded up), or exceed it by rounding only (1e-9
// of it, as a row of enclosed probabilities does) with c >= 0: then taking every cap whole,
// in any order, is an upper bound (above the greedy by at most 1e-9 total max c). Sets *sum.
bool CapsFit(const Eigen::VectorXd& cap, const Eigen::VectorXd& c, int len, double total, double* sum) {
  double caps = 0.0;
  bool nonneg = true;
  for (int k = 0; k < len; ++k) {
    caps = AddUp(caps, cap(k));
    nonneg = nonneg && c(k) >= 0;
  }
  if (!(caps <= total || (nonneg && caps <= total * (1 + 1e-9)))) return false;
  double s = 0.0;
  for (int k = 0; k < len; ++k) s = AddUp(s, MulUp(cap(k), c(k)));
  *sum = s;
  return true;
}

// The greedy on the largest c_k first (`order`, indices >= len skipped), every step rounded up.
double GreedyFill(const Eigen::VectorXd& cap, const Eigen::VectorXd& c, int len, double total,
                  const std::vector<int>& order) {
  double left = total, s = 0.0;  // `left` is rounded up: more mass, a larger sum
  for (int k : order) {
    if (!(left > 0)) break;
    if (k >= len) continue;
    const double x = std::min(cap(k), left);
    s = AddUp(s, MulUp(x, c(k)));
    left = SubUp(left, x);
  }
  return s;
}
}  // namespace

double SimplexWeightedSumUp(const Eigen::VectorXd& cap, const Eigen::VectorXd& c, int len, double total) {
  double s;
  if (CapsFit(cap, c, len, total, &s)) return s;
  std::vector<int> order(len);
  for (int k = 0; k < len; ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return c(a) > c(b); });
  return GreedyFill(cap, c, len, total, order);
}

double SimplexWeightedSumUp(const Eigen::VectorXd& cap, const Eigen::VectorXd& c, int len, double total,
                            const std::vector<int>& order) {
  double s;
  if (CapsFit(cap, c, len, total, &s)) return s;
  return GreedyFill(cap, c, len, total, order);
}

std::vector<std::vector<int>> DescendingRowOrders(const Eigen::MatrixXd& m) {
  std::vector<std::vector<int>> orders(m.rows(), std::vector<int>(m.cols()));
  for (Eigen::Index r = 0; r < m.rows(); ++r) {
    std::vector<int>& order = orders[r];
    for (Eigen::Index k = 0; k < m.cols(); ++k) order[k] = int(k);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return m(r, a) > m(r, b); });
  }
  return orders;
}

}  // namespace lipcert
