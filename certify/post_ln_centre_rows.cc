#include "certify/post_ln_centre_rows.h"

#include <algorithm>
#include <cmath>

#include "certify/centre_norm.h"
#include "interval/norms.h"
#include "interval/parallel.h"

namespace lipcert {

namespace {

// The split below for ||diag(w) (e I + J_M(X0))||, e = 1 or 0: ||A_i|| <= e + r_i, ||A|| <= e + c.
double WeightedSplitUp(const Eigen::VectorXd& w, const Eigen::VectorXd& rows, double c, double e) {
  const Eigen::Index n = w.size();
  std::vector<Eigen::Index> order(size_t(n), 0);
  for (Eigen::Index i = 0; i < n; ++i) order[size_t(i)] = i;
  std::sort(order.begin(), order.end(), [&](Eigen::Index a, Eigen::Index b) { return w(a) > w(b); });
  const double whole = AddUp(e, c);
  double best = kInf, heavy = 0;
  for (Eigen::Index k = 0; k <= n; ++k) {
    const double rest = k < n ? MulUp(w(order[size_t(k)]), whole) : 0.0;
    best = std::min(best, SqrtUp(AddUp(heavy, MulUp(rest, rest))));
    if (k == n || rows.size() != n) break;
    const Eigen::Index i = order[size_t(k)];
    const double a = MulUp(w(i), AddUp(e, rows(i)));
    heavy = AddUp(heavy, MulUp(a, a));
  }
  return best;
}

}  // namespace

double WeightedCentreUp(const Eigen::VectorXd& w, const Eigen::VectorXd& rows, double c) {
  if (w.size() == 0) return 0.0;
  // The identity whole (||diag(w)|| = max w) or in every row block.
  return std::min(WeightedSplitUp(w, rows, c, 1.0), AddUp(w.maxCoeff(), WeightedSplitUp(w, rows, c, 0.0)));
}

namespace {

// >= the l2 norm of row r of every member of m.
double RowNormUp(const IntervalMatrix& m, Eigen::Index r) {
  double s = 0;
  for (Eigen::Index c = 0; c < m.cols(); ++c) {
    const double a = AddUp(std::abs(m.mid(r, c)), m.rad(r, c));
    s = AddUp(s, MulUp(a, a));
  }
  return SqrtUp(s);
}

IntervalMatrix RowsOf(const IntervalMatrix& m, const std::vector<Eigen::Index>& rows) {
  Eigen::MatrixXd mid(Eigen::Index(rows.size()), m.cols()), rad(Eigen::Index(rows.size()), m.cols());
  for (size_t k = 0; k < rows.size(); ++k) {
    mid.row(Eigen::Index(k)) = m.mid.row(rows[k]);
    rad.row(Eigen::Index(k)) = m.rad.row(rows[k]);
  }
  return IntervalMatrix(std::move(mid), std::move(rad));
}

bool Late(std::chrono::steady_clock::time_point deadline) { return std::chrono::steady_clock::now() >= deadline; }

// An enclosure of B_H for the rows `heavy` (flattened i*D + a, any order): row r is row a of
// D_i times A_i = E_i + J_{M,i}(X0) (E_i the identity's rows of token i: row a of D_i lands in
// token i's own D columns). Token by token, so that J_M is read once; empty once `deadline`
// passes.
IntervalMatrix HeavyRows(const std::vector<IntervalMatrix>& ln_jac, const IntervalMatrix& jm,
                         const std::vector<Eigen::Index>& heavy, std::chrono::steady_clock::time_point deadline) {
  const Eigen::Index n = Eigen::Index(ln_jac.size()), d = ln_jac[0].rows(), nd = n * d;
  std::vector<std::vector<Eigen::Index>> rows_of(static_cast<size_t>(n)), out_row(static_cast<size_t>(n));
  for (size_t r = 0; r < heavy.size(); ++r) {
    rows_of[size_t(heavy[r] / d)].push_back(heavy[r] % d);
    out_row[size_t(heavy[r] / d)].push_back(Eigen::Index(r));
  }
  Eigen::MatrixXd mid(Eigen::Index(heavy.size()), nd), rad(Eigen::Index(heavy.size()), nd);
  for (Eigen::Index i = 0; i < n; ++i) {
    if (rows_of[size_t(i)].empty()) continue;
    if (Late(deadline)) return IntervalMatrix();
    const IntervalMatrix s = RowsOf(ln_jac[size_t(i)], rows_of[size_t(i)]);
    const IntervalMatrix jm_i(jm.mid.middleRows(i * d, d), jm.rad.middleRows(i * d, d));
    IntervalMatrix identity_part(Eigen::MatrixXd::Zero(s.rows(), nd), Eigen::MatrixXd::Zero(s.rows(), nd));
    identity_part.mid.middleCols(i * d, d) = s.mid;
    identity_part.rad.middleCols(i * d, d) = s.rad;
    const IntervalMatrix b = Mul(s, jm_i) + identity_part;
    for (size_t k = 0; k < out_row[size_t(i)].size(); ++k) {
      mid.row(out_row[size_t(i)][k]) = b.mid.row(Eigen::Index(k));
      rad.row(out_row[size_t(i)][k]) = b.rad.row(Eigen::Index(k));
    }
  }
  return IntervalMatrix(std::move(mid), std::move(rad));
}

}  // namespace

LayerNormRowSplit LayerNormRowSplitCentreUp(const std::vector<IntervalMatrix>& ln_jac, const IntervalMatrix& jm,
                                            const Eigen::VectorXd& mha_rows, UpperBound mha_centre,
                                            const std::vector<int>& heavy_counts, int threads,
                                            std::chrono::steady_clock::time_point deadline) {
  LayerNormRowSplit out;
  if (ln_jac.empty() || heavy_counts.empty()) return out;
  const Eigen::Index n = Eigen::Index(ln_jac.size()), d = ln_jac[0].rows(), nd = n * d;
  if (jm.rows() != nd || jm.cols() != nd || !jm.mid.allFinite() || !jm.rad.allFinite()) return out;
  // The rows (i, a) by their norm, largest first: the heavy rows of every K are the first K.
  std::vector<std::pair<double, Eigen::Index>> by_norm;
  for (Eigen::Index i = 0; i < n; ++i) {
    if (ln_jac[size_t(i)].rows() != d || !ln_jac[size_t(i)].mid.allFinite() || !ln_jac[size_t(i)].rad.allFinite())
      return out;
    for (Eigen::Index a = 0; a < d; ++a) by_norm.push_back({RowNormUp(ln_jac[size_t(i)], a), i * d + a});
  }
  std::stable_sort(by_norm.begin(), by_norm.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  const Eigen::Index most = std::clamp<Eigen::Index>(*std::max_element(heavy_counts.begin(), heavy_counts.end()), 0, nd);
  std::vector<Eigen::Index> heaviest(static_cast<size_t>(most));
  for (Eigen::Index r = 0; r < most; ++r) heaviest[size_t(r)] = by_norm[size_t(r)].second;
  // B_H for the largest K (for a smaller K, its first K rows), and the K = 0 split (the crude
  // centre) whatever the deadline.
  const IntervalMatrix all_heavy = most > 0 ? HeavyRows(ln_jac, jm, heaviest, deadline) : IntervalMatrix();
  for (const int asked : heavy_counts) {
    const Eigen::Index k = std::clamp<Eigen::Index>(asked, 0, nd);
    if (k > 0 && (Late(deadline) || all_heavy.rows() < k)) continue;
    std::vector<char> is_heavy(size_t(nd), 0);
    for (Eigen::Index r = 0; r < k; ++r) is_heavy[size_t(by_norm[size_t(r)].second)] = 1;
    // c_i >= ||S_{R_i} D_i||, t = max_i c_i, w_i = c_i / t rounded up (then t w_i >= c_i).
    Eigen::VectorXd c(n);
    ParallelFor(int(n), WorkerCount(threads, int(n)), [&](int i, int) {
      std::vector<Eigen::Index> light;
      for (Eigen::Index a = 0; a < d; ++a)
        if (!is_heavy[size_t(i * d + a)]) light.push_back(a);
      c(i) = light.empty() ? 0.0 : NormL2UpperGram(RowsOf(ln_jac[size_t(i)], light), 1).value();
    });
    const double t = c.maxCoeff();
    Eigen::VectorXd w(n);
    for (Eigen::Index i = 0; i < n; ++i) w(i) = t > 0 ? std::min(1.0, DivUp(c(i), t)) : 1.0;
    const double rest = t > 0 ? MulUp(t, WeightedCentreUp(w, mha_rows, mha_centre.value())) : 0.0;
    double heavy_norm = 0;
    if (k > 0) {
      // B_H (K x ND) is wide: the certificate takes its K x K Gram matrix B_H B_H^T.
      const IntervalMatrix b_h(all_heavy.mid.topRows(k), all_heavy.rad.topRows(k));
      heavy_norm = NormL2UpperGram(b_h, threads, nullptr, deadline).value();
      if (!std::isfinite(heavy_norm)) continue;  // the deadline passed during its certificate
    }
    const double total = SqrtUp(AddUp(MulUp(heavy_norm, heavy_norm), MulUp(rest, rest)));
    if (std::isfinite(total) && total < out.upper.value()) {
      out.upper = UpperBound(total);
      out.heavy_rows = int(k);
      out.heavy_norm = UpperBound(heavy_norm);
      out.rest = UpperBound(rest);
    }
  }
  return out;
}

}  // namespace lipcert
