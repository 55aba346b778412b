// The second derivative with the products of two tokens' motions kept apart from the squares
// (docs/engines.md, "Pair terms apart"), and its bound over the heads.
#include "certify/variation/internal.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <vector>

#include "interval/elementary.h"
#include "interval/norms.h"
#include "interval/parallel.h"
#include "interval/softmax.h"

namespace lipcert {

using namespace variation_internal;

// max of P |1 - 2P| over lo <= P <= hi (rounded up): P (1 - 2P) peaks at 1/8 for P = 1/4,
// and P (2P - 1) grows up to 1 at P = 1.
static double MaxOfPTimesAbsOneMinusTwoP(double lo, double hi) {
  double best = 0;
  if (lo <= 0.5) {
    const double x = std::clamp(0.25, lo, std::min(hi, 0.5));
    best = MulUp(x, SubUp(1.0, MulDown(2.0, x)));
  }
  if (hi >= 0.5) best = std::max(best, MulUp(hi, SubUp(MulUp(2.0, hi), 1.0)));
  return best;
}

SecondOrderSplitHead SecondOrderSplitHeadUp(const HeadGeometry& G, const FactorBounds& F, const Eigen::VectorXd& rho,
                                            bool causal) {
  const int n = int(rho.size());
  SecondOrderSplitHead out;
  out.lin = Eigen::MatrixXd::Zero(n, n);
  // Row i's pair terms, x^T O_i x, one row of `pairs` per i (O_i flattened column-major).
  out.pairs = Eigen::MatrixXd::Zero(n, Eigen::Index(n) * n);
  for (int i = 0; i < n; ++i) {
    const int len = causal ? i + 1 : n;
    const Eigen::VectorXd cap = F.p_hi.row(i).head(len).transpose(), a = F.a_sup.row(i).head(len).transpose();
    // ab2 >= sum_j P_j ||a_j|| ||b_j||^2 and ab1 >= sum_j P_j ||a_j|| ||b_j|| (b_j: the query motion's spread),
    const double ab2 = QueryMomentUp(F, i, len, 2);
    // (or the operator ||sum_j P_j a_j b_j^T||, which keeps the keys' cancellation)
    const double ab1 = std::min(QueryMomentUp(F, i, len, 1), ValueQueryCovarianceUp(G, F, rho, i, len));
    // star(k): the coefficient of x_i x_k (the row's query times key k's motion);
    // m(k) p(l): that of x_k x_l, k != l (two keys' motions).
    Eigen::VectorXd star(len), m(len), p(len);
    for (int k = 0; k < len; ++k) {
      const double gamma = F.g_sup(i, k);
      const double pq = MaxOfPTimesOneMinusP(F.p_lo(i, k), F.p_hi(i, k));
      const double one_minus_2p = std::max(SubUp(1.0, MulDown(2.0, F.p_lo(i, k))), SubUp(MulUp(2.0, F.p_hi(i, k)), 1.0));
      const double pa_abs = std::min(MulUp(MaxOfPTimesAbsOneMinusTwoP(F.p_lo(i, k), F.p_hi(i, k)), a(k)),
                                     MulUp(one_minus_2p, F.pa(i, k)));
      // T1 (keys): P_k |1 - 2P_k| ||a_k|| y_k^2;  T2 (keys): 2 P_k (1 - P_k) |y_k| ||W_h U_k||.
      out.lin(i, k) = AddUp(MulUp(MulUp(gamma, gamma), pa_abs), MulUp(MulUp(2.0, G.w_norm), MulUp(gamma, pq)));
      // T1 (query x keys): 2 gamma_k P_k ||a_k|| ||b_k|| + 2 ab1 P_k gamma_k;  T2 (query):
      // 2 ||W_h|| P_k ||b_k||;  dot T3: 2 c_b P_k ||a_k||.
      double s = AddUp(MulUp(MulUp(2.0, gamma), MulUp(F.pa(i, k), F.b_sup(i, k))),
                       MulUp(MulUp(2.0, ab1), MulUp(cap(k), gamma)));
      s = AddUp(s, MulUp(MulUp(2.0, G.w_norm), MulUp(cap(k), F.b_sup(i, k))));
      if (G.dot) s = AddUp(s, MulUp(MulUp(2.0, G.c_b), F.pa(i, k)));
      star(k) = s;
      // T1 (key x key): 2 P_k ||a_k|| gamma_k P_l gamma_l;  T2 (key x key): 2 ||W_h|| P_k P_l gamma_l.
      m(k) = AddUp(MulUp(MulUp(2.0, gamma), F.pa(i, k)), MulUp(MulUp(2.0, G.w_norm), cap(k)));
      p(k) = MulUp(cap(k), gamma);
      // L2 T3: |e_ik| <= 4 c_g (t_i + t_k), linear in t.
      if (!G.dot) {
        const double t3 = MulUp(MulUp(4.0, G.c_g), F.pa(i, k));
        out.lin(i, k) = AddUp(out.lin(i, k), t3);
        out.lin(i, i) = AddUp(out.lin(i, i), t3);
      }
    }
    // The query alone (T1: ab2 x_i^2) and the row's own key with its query (star(i)).
    out.lin(i, i) = AddUp(out.lin(i, i), AddUp(ab2, star(i)));
    for (int k = 0; k < len; ++k)
      for (int l = 0; l < len; ++l) {
        if (k == l) continue;
        double o = MulUp(0.5, AddUp(MulUp(m(k), p(l)), MulUp(m(l), p(k))));
        if (k == i) o = AddUp(o, MulUp(0.5, star(l)));
        if (l == i) o = AddUp(o, MulUp(0.5, star(k)));
        out.pairs(i, Eigen::Index(l) * n + k) = o;
      }
  }
  return out;
}

// The heads' single-token rows, summed (||d^2 out_i|| <= sum_h ||d^2 out_i^h||: the rows
// add up before the norm over rows) or stacked (row (h, i) is head h's own, at h N + i),
// and the upper bound of each column's norm.
static Eigen::MatrixXd LinRows(const std::vector<SecondOrderSplitHead>& heads, bool stacked) {
  const int n = int(heads[0].lin.cols());
  const Eigen::Index rows = stacked ? Eigen::Index(n) * Eigen::Index(heads.size()) : n;
  Eigen::MatrixXd lin = Eigen::MatrixXd::Zero(rows, n);
  for (size_t h = 0; h < heads.size(); ++h) {
    if (stacked)
      lin.middleRows(Eigen::Index(h) * n, n) = heads[h].lin;
    else
      for (Eigen::Index e = 0; e < lin.size(); ++e) lin.data()[e] = AddUp(lin.data()[e], heads[h].lin.data()[e]);
  }
  return lin;
}
static Eigen::VectorXd ColumnNormsUp(const Eigen::MatrixXd& lin) {
  Eigen::VectorXd norms(lin.cols());
  for (Eigen::Index j = 0; j < lin.cols(); ++j) {
    double s = 0;
    for (Eigen::Index r = 0; r < lin.rows(); ++r) s = AddUp(s, MulUp(lin(r, j), lin(r, j)));
    norms(j) = SqrtUp(s);
  }
  return norms;
}

double SecondOrderSplitColumnsUp(const std::vector<SecondOrderSplitHead>& heads,
                                 const std::function<double(int, int)>& own_row,
                                 std::chrono::steady_clock::time_point refine_until, int threads, bool stacked) {
  if (heads.empty()) return 0.0;
  const int n = int(heads[0].lin.cols());
  // The heads' rows summed or stacked (LinRows), and the pairs the same way.
  const Eigen::MatrixXd lin = LinRows(heads, stacked);
  const Eigen::Index rows = lin.rows();
  Eigen::MatrixXd pairs = Eigen::MatrixXd::Zero(rows, Eigen::Index(n) * n);
  for (size_t h = 0; h < heads.size(); ++h) {
    if (stacked)
      pairs.middleRows(Eigen::Index(h) * n, n) = heads[h].pairs;
    else
      for (Eigen::Index e = 0; e < pairs.size(); ++e) pairs.data()[e] = AddUp(pairs.data()[e], heads[h].pairs.data()[e]);
  }
  // Single tokens: ||lin t||_2 is convex on the simplex, so at most its largest column norm.
  // own2(j): the squares of column j's entries in the rows of token j.
  const Eigen::VectorXd norms = ColumnNormsUp(lin);
  Eigen::VectorXd own2 = Eigen::VectorXd::Zero(n);
  for (Eigen::Index r = 0; r < rows; ++r) {
    const int j = int(r % n);
    own2(j) = AddUp(own2(j), MulUp(lin(r, j), lin(r, j)));
  }
  double column = norms.maxCoeff();
  if (own_row) {
    // The largest columns again, with the moving token's own row as one form over all heads
    // (own_row(j) >= it) in place of the heads' scalars summed in lin(j, j), while a column's
    // scalar norm is above the best refined one. One column per worker at a time, each on
    // one thread: a column refined where the one-at-a-time loop would have stopped has its
    // scalar norm at most the best, so the bound is the same for any thread count.
    std::vector<int> order(n);
    for (int j = 0; j < n; ++j) order[j] = j;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return norms(a) > norms(b); });
    const int workers = WorkerCount(threads, n);  // threads = 0: all cores
    double best = 0;
    int t = 0;
    while (t < n && norms(order[t]) > best && std::chrono::steady_clock::now() < refine_until) {
      const auto batch_start = std::chrono::steady_clock::now();
      int batch = 0;
      while (batch < workers && t + batch < n && norms(order[t + batch]) > best) ++batch;
      std::vector<double> refined(batch);
      ParallelFor(batch, batch, [&](int b, int) { refined[b] = own_row(order[t + b], std::max(1, workers / batch)); });
      for (int b = 0; b < batch; ++b) {
        const int j = order[t + b];
        double s = std::min(own2(j), MulUp(refined[b], refined[b]));
        for (Eigen::Index r = 0; r < rows; ++r)
          if (r % n != j) s = AddUp(s, MulUp(lin(r, j), lin(r, j)));
        best = std::max(best, std::min(norms(j), SqrtUp(s)));
      }
      t += batch;
      // Give up where the columns still above the best refined one cannot all be refined
      // before refine_until at this batch's pace and those that can would lower the column
      // term by under a tenth: the time is the other nodes' (diffuse heads, whose columns
      // are all near the largest, on a loaded machine).
      if (refine_until != std::chrono::steady_clock::time_point::max() && t < n) {
        const double batch_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - batch_start).count();
        const double left_s = std::chrono::duration<double>(refine_until - std::chrono::steady_clock::now()).count();
        int above = t;
        while (above < n && norms(order[above]) > best) ++above;
        const long fit = batch_s > 0 ? long(std::max(0.0, left_s) / batch_s) * workers : long(n);
        if (t + fit < above && norms(order[t + fit]) > 0.9 * norms(order[t])) break;
      }
    }
    column = t < n ? std::max(best, norms(order[t])) : best;
  }
  // Pairs: sup over unit x of ||(x^T O_i x)_i||. With X = x x^T (||X||_F = 1) the vector is
  // `pairs` times vec X, so its norm is at most sqrt(lambda_max(pairs pairs^T)). The Gram's
  // entries are sums of n^2 nonnegative products: exact <= (fl + n^2 eta) / (1 - gamma_{n^2}).
  const double terms = double(n) * n;
  Eigen::MatrixXd gram_fl = Eigen::MatrixXd::Zero(rows, rows);
  gram_fl.selfadjointView<Eigen::Lower>().rankUpdate(pairs);  // the lower half (each entry one dot product)
  gram_fl.triangularView<Eigen::StrictlyUpper>() = gram_fl.transpose();
  const double shrink = SubDown(1.0, GammaUp(terms));
  Eigen::MatrixXd gram(rows, rows);
  for (Eigen::Index i = 0; i < rows; ++i)
    for (Eigen::Index l = 0; l < rows; ++l) gram(i, l) = DivUp(AddUp(gram_fl(i, l), MulUp(terms, kEta)), shrink);
  return AddUp(column, SqrtUp(SpectralRadiusUpperNonneg(gram).value()));
}

double SecondOrderSplitColumnTermUp(const std::vector<SecondOrderSplitHead>& heads, bool stacked) {
  return heads.empty() ? 0.0 : ColumnNormsUp(LinRows(heads, stacked)).maxCoeff();
}

}  // namespace lipcert
