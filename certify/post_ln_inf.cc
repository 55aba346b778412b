#include "certify/post_ln_inf.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>

#include "certify/centred_engine.h"
#include "certify/layer_norm_cover.h"
#include "certify/post_ln_y_cover.h"
#include "interval/norms.h"
#include "interval/parallel.h"
#include "interval/rounding.h"

namespace lipcert {

namespace {

PostLnCentreInfBounds TimedOut(PostLnCentreInfBounds out) {
  out.timed_out = true;
  out.note = "did not finish before its deadline";
  return out;
}

// The absolute row sums of an enclosure from both sides: row r of every matrix in `a` has
// down(r) <= sum_c |A_rc| <= up(r). Vectorised, in round to nearest as
// CentreJacobianInfNormBounds: each term |m| + r and max(0, |m| - r) carries one rounding, and
// a floating sum of the row's nonnegative terms is within gamma_{cols+1} (relative, the terms'
// rounding included) plus cols eta of the exact one. Without with_down, `down` is empty.
struct RowSums {
  Eigen::VectorXd up, down;
};
RowSums AbsRowSums(const IntervalMatrix& a, bool with_down) {
  const double one_minus_gamma = SubDown(1.0, GammaUp(double(a.cols()) + 1));
  const double sum_eta = MulUp(double(a.cols()) + 1, kEta);
  Eigen::VectorXd hi = Eigen::VectorXd::Zero(a.rows()), lo = Eigen::VectorXd::Zero(with_down ? a.rows() : 0);
  AddAbsRowSums(a.mid, a.rad, hi, with_down ? &lo : nullptr);
  RowSums out;
  out.up.resize(a.rows());
  for (Eigen::Index r = 0; r < a.rows(); ++r) out.up(r) = AddUp(DivUp(hi(r), one_minus_gamma), sum_eta);
  if (!with_down) return out;
  out.down.resize(a.rows());
  for (Eigen::Index r = 0; r < a.rows(); ++r)
    out.down(r) = std::max(0.0, SubDown(MulDown(lo(r), one_minus_gamma), sum_eta));
  return out;
}

// >= ||A_i||_inf for each token i's D rows of the enclosure (the largest upper row sum).
Eigen::VectorXd RowBlockInfNormsUp(const IntervalMatrix& a, int n, int d) {
  const Eigen::VectorXd up = AbsRowSums(a, false).up;
  Eigen::VectorXd out = Eigen::VectorXd::Zero(n);
  for (Eigen::Index r = 0; r < a.rows(); ++r) out(r / d) = std::max(out(r / d), up(r));
  return out;
}

}  // namespace

PostLnCentreInfBounds PostLnCentreInfFrom(const AttentionLayer& L, const Eigen::MatrixXd& x0, IntervalMatrix jm,
                                          int threads, std::chrono::steady_clock::time_point deadline) {
  PostLnCentreInfBounds out;
  const int n = int(x0.rows()), d = int(x0.cols());
  const auto passed = [&] { return std::chrono::steady_clock::now() > deadline; };
  if (passed()) return TimedOut(out);
  out.mha_rows = RowBlockInfNormsUp(jm, n, d);
  const double jm_inf = out.mha_rows.maxCoeff();  // ||J_M(X0)||_inf: the largest row sum
  out.mha_upper = UpperBound(jm_inf);
  for (Eigen::Index i = 0; i < jm.rows(); ++i) {  // + I, the rounding of mid + 1 into the radius
    const Interval e = Interval(jm.mid(i, i)) + Interval(1.0);
    const double mid = 0.5 * e.lo + 0.5 * e.hi;
    jm.rad(i, i) = AddUp(jm.rad(i, i), std::max(SubUp(e.hi, mid), SubUp(mid, e.lo)));
    jm.mid(i, i) = mid;
  }
  // Y0 within balls of radius err_i around yc_i; D_i(yc_i) enclosed, and
  // sup ||D_i(y) - D_i(yc_i)||_inf <= sqrt(D) sup ||D_i(y) - D_i(yc_i)||_2 over each ball.
  const TokenCover y_cover = PostLnYCoverAtPoint(L, x0);
  if (!y_cover.center.allFinite()) {
    out.note = "no finite enclosure of Y0";
    return out;
  }
  const MhaInput f = PostLnFactorsOver(L, y_cover, NormKind::kL2);
  const double moved = MulUp(MulUp(SqrtUp(double(d)), f.delta_ln.maxCoeff()), AddUp(1.0, jm_inf));
  // Row sums of D_i(yc_i) (I + J_M(X0))_i, token by token (D x ND products, tokens in
  // parallel), from both sides.
  std::vector<double> ups(size_t(n), 0.0), downs(size_t(n), 0.0);
  std::vector<int> rows(size_t(n), -1);
  std::atomic<bool> late{false};
  ParallelFor(n, WorkerCount(threads, n), [&](int i, int) {
    if (late || passed()) {
      late = true;
      return;
    }
    const IntervalMatrix block(jm.mid.middleRows(i * d, d), jm.rad.middleRows(i * d, d));
    // Row a of D_i(yc_i) A_i is g_a times row a of the projection's product: its sums scale by |g_a|.
    std::vector<Interval> gain;
    const IntervalMatrix p = LayerNormProjectionTimes(*L.post_layer_norm, y_cover.center.row(i), block, &gain);
    const RowSums sums = AbsRowSums(p, true);
    for (int a = 0; a < d; ++a) {
      const double up = MulUp(gain[size_t(a)].Mag(), sums.up(a));
      const double down = MulDown(gain[size_t(a)].Mig(), sums.down(a));
      ups[size_t(i)] = std::max(ups[size_t(i)], up);
      if (down > downs[size_t(i)]) downs[size_t(i)] = down, rows[size_t(i)] = i * d + a;
    }
  });
  if (late || passed()) return TimedOut(out);
  double upper = 0, lower = 0;
  int row = -1;
  for (int i = 0; i < n; ++i) {
    upper = std::max(upper, ups[size_t(i)]);
    if (downs[size_t(i)] > lower) lower = downs[size_t(i)], row = rows[size_t(i)];
  }
  out.upper = UpperBound(AddUp(upper, moved));
  out.lower = LowerBound(std::max(0.0, SubDown(lower, moved)));
  out.row = row;
  return out;
}


LayerNormMhaRowsInf LayerNormMhaRowsInfUp(const AttentionLayer& mha, const TokenCover& cover,
                                          const std::vector<IntervalMatrix>& ln_jac, UpperBound heads_variation,
                                          const Eigen::VectorXd& current, int threads,
                                          std::chrono::steady_clock::time_point deadline) {
  const Eigen::Index n = cover.center.rows();
  LayerNormMhaRowsInf out;
  out.upper = Eigen::VectorXd::Constant(n, kInf);
  if (Eigen::Index(ln_jac.size()) != n || current.size() != n || mha.wo.rows() != mha.d_model ||
      mha.wo.cols() != mha.d_model)
    return out;
  std::vector<Eigen::Index> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), Eigen::Index(0));
  std::stable_sort(order.begin(), order.end(), [&](Eigen::Index a, Eigen::Index b) { return current(a) > current(b); });
  BoundOptions bo;
  bo.norm = NormKind::kLinf;
  bo.threads = threads;
  bo.deadline = deadline;
  const RowVariationInf rows(mha, cover, bo);  // the work that does not depend on Wo, once
  if (!rows.complete()) return out;
  double reached = 0;  // max over the tokens done of min(current, upper)
  for (const Eigen::Index i : order) {
    if (current(i) <= reached || std::chrono::steady_clock::now() > deadline) break;
    const IntervalMatrix dw = Mul(ln_jac[size_t(i)], mha.wo);
    const double slack = dw.rad.isZero(0) ? 0.0
                                          : MulUp(NormInfUpper(IntervalMatrix(Eigen::MatrixXd::Zero(dw.rows(), dw.cols()),
                                                                              dw.rad)).value(),
                                                  heads_variation.value());
    out.upper(i) = AddUp(rows.RowUp(int(i), dw.mid), slack);
    ++out.computed;
    reached = std::max(reached, std::min(current(i), out.upper(i)));
  }
  return out;
}

// Token i's rows D_i (E_i + J_{M,i}(X0)), E_i selecting token i's columns, have ||.||_inf <=
// ||D_i||_inf (1 + c_i), c_i >= ||J_{M,i}(X0)||_inf: MHA's row sums where known, else its
// certified ||J_M(X0)||_inf (every token's rows are rows of J_M(X0)).
double CrudeInfCentreUp(const Eigen::VectorXd& ln_centre, const PostLnVariationInputs& in) {
  const Eigen::Index n = ln_centre.size();
  const bool rows = in.mha_row_centre_inf.size() == n;
  double out = 0;
  for (Eigen::Index i = 0; i < n; ++i) {
    const double c_i = rows ? std::min(in.mha_row_centre_inf(i), in.mha_centre.value()) : in.mha_centre.value();
    out = std::max(out, MulUp(ln_centre(i), AddUp(1.0, c_i)));
  }
  return out;
}

// The tokens compete with ||D_i(yc_i)||_inf min(V_M, v_i), the term they replace.
void AddLayerNormMhaRowsInf(const AttentionLayer& L, const TokenCover& cover, int threads,
                            std::chrono::steady_clock::time_point deadline, PostLnVariationInputs* in) {
  const Eigen::Index n = cover.center.rows();
  if (in->mha_row_variation_inf.size() != n || !std::isfinite(in->heads_variation.value())) return;
  const TokenCover yc = PostLnYCoverAtPoint(L, cover.center);
  if (!yc.center.allFinite()) return;
  const MhaInput f = PostLnFactorsOver(L, yc, NormKind::kLinf);
  Eigen::VectorXd current(n);
  for (Eigen::Index i = 0; i < n; ++i)
    current(i) = MulUp(NormInfUpper(f.ln_jac[size_t(i)]).value(),
                       std::min(in->mha_variation.value(), in->mha_row_variation_inf(i)));
  in->ln_mha_rows_inf =
      LayerNormMhaRowsInfUp(L.WithoutPostLayerNorm(), cover, f.ln_jac, in->heads_variation, current, threads, deadline)
          .upper;
  in->ln_mha_rows_y = yc.center;
}

}  // namespace lipcert
