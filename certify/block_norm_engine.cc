#include "certify/block_norm_engine.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "certify/head_factors.h"
#include "certify/l2_caps.h"
#include "certify/layer_norm_cover.h"
#include "interval/parallel.h"
#include "interval/vector_norms.h"

namespace lipcert {

namespace {
constexpr const char* kEngine = "block_norm";
}  // namespace

EngineBound BlockNormBound(const AttentionLayer& L, const TokenCover& cover, const BoundOptions& opts) {
  if (DeadlinePassed(opts)) return TimedOutBound(kEngine);
  if (L.post_ln()) {  // refused: certified by post_ln_composition (certify/post_layer_norm.h) on MHA alone
    EngineBound refused;
    refused.note = "post-LN layer: not handled by block_norm";
    return refused;
  }
  const NormKind p = opts.norm;
  const int n = int(cover.center.rows());
  const MhaInput in = MhaInputOver(L, cover, p);
  // J_MHA = sum_h P^h (x) W_h + R, R's blocks bounded by the N x N matrix r.
  double kron = 0;
  Eigen::MatrixXd full = Eigen::MatrixXd::Zero(n, n), r = Eigen::MatrixXd::Zero(n, n);
  // Heads are independent: bound them in parallel, then add up in head order.
  std::vector<HeadGeometry> geo(L.heads);
  std::vector<FactorBounds> fb(L.heads);
  std::vector<std::vector<RowSpread>> spread(L.heads, std::vector<RowSpread>(n));  // norm 2 only
  std::atomic<bool> late{false};
  auto past_deadline = [&] {
    if (!late.load(std::memory_order_relaxed) && DeadlinePassed(opts)) late = true;
    return late.load(std::memory_order_relaxed);
  };
  ParallelFor(L.heads, WorkerCount(opts.threads, L.heads), [&](int h, int) {
    if (past_deadline()) return;
    geo[h] = HeadGeometryAt(L, h, in.zc, p);
    fb[h] = HeadFactorBounds(geo[h], in.rho_z, in.joint_z, L.causal);
    if (p == NormKind::kL2)
      for (int i = 0; i < n && !past_deadline(); ++i)
        spread[h][i] = RowSpreadUp(geo[h], fb[h], in.rho_z, i, L.causal ? i + 1 : n);
  });
  if (past_deadline()) return TimedOutBound(kEngine);
  // L2 heads in norm 2 also have bounds that hold for every input (caps).
  const bool capped = L.kind == AttentionKind::kL2 && p == NormKind::kL2;
  std::vector<L2HeadCaps> caps(L.heads);
  if (capped)
    for (int h = 0; h < L.heads; ++h) caps[h] = CapsOfL2Head(L, h);
  auto cap_or = [&](double bound, UpperBound cap) { return capped ? std::min(bound, cap.value()) : bound; };
  Eigen::MatrixXd diag(n, L.heads);  // bound on ||E_i|| for head h
  for (int h = 0; h < L.heads; ++h) {
    if (past_deadline()) return TimedOutBound(kEngine);
    const HeadGeometry& G = geo[h];
    const FactorBounds& F = fb[h];
    kron = AddUp(kron, MulUp(ProbabilityNormUp(F.p_hi, p), G.w_norm));
    for (int i = 0; i < n; ++i) {
      const int len = L.causal ? i + 1 : n;
      const L2BlockCaps c = capped ? caps[h].For(len) : L2BlockCaps{};
      // ||E_i|| <= sum_k P_ik ||a_ik|| ||b_ik||, P_i on the simplex below p_hi (knapsack).
      Eigen::VectorXd ab(len);
      for (int j = 0; j < len; ++j) {
        full(i, j) = AddUp(full(i, j), MulUp(F.p_hi(i, j), G.w_norm));
        r(i, j) = AddUp(r(i, j), cap_or(MulUp(F.pa(i, j), F.g_sup(i, j)), c.block));
        ab(j) = MulUp(F.a_sup(i, j), F.b_sup(i, j));
      }
      double e = SimplexWeightedSumUp(F.p_hi.row(i).transpose(), ab, len);
      // E_i is the covariance sum_k P_ik a_ik b_ik^T (ValueQueryCovarianceUp keeps its cancellation).
      if (p == NormKind::kL2)
        e = std::min({e, SqrtUp(MulUp(spread[h][i].a2, spread[h][i].b2)), ValueQueryCovarianceUp(G, F, in.rho_z, i, len)});
      diag(i, h) = cap_or(e, c.diagonal);
      r(i, i) = AddUp(r(i, i), diag(i, h));
    }
  }
  const double ell_max = in.ell.maxCoeff();
  const double value_path = MulUp(kron, ell_max);
  const double logit_path = ScaledNonnegNormUp(r, in.ell, PrimalNorm(p));
  const double split = AddUp(value_path, logit_path);
  Eigen::MatrixXd all(n, n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) all(i, j) = AddUp(full(i, j), r(i, j));
  const double joint = ScaledNonnegNormUp(all, in.ell, PrimalNorm(p));
  // Row sums of the block bounds (times ell_j) with P's rows on the simplex:
  //   sum_j ||J_ij|| ell_j <= sum_h [ sum_j P_ij (||W_h|| + a g) ell_j + ell_i ||E_i|| ],
  // sum_j P_ij a g by the knapsack, by Cauchy-Schwarz over the row's spreads (norm 2) or by
  // the L2 cap, whichever is smallest. Then ||.||_inf <= max row sum, and
  // ||.||_2 <= sqrt(max row sum * max column sum).
  double row_max = 0;
  for (int i = 0; i < n; ++i) {
    if (past_deadline()) return TimedOutBound(kEngine);
    const int len = L.causal ? i + 1 : n;
    double row = 0;
    for (int h = 0; h < L.heads; ++h) {
      const FactorBounds& F = fb[h];
      Eigen::VectorXd cap = F.p_hi.row(i).transpose(), c1(len), c2(len);
      for (int j = 0; j < len; ++j) {
        c1(j) = MulUp(AddUp(geo[h].w_norm, MulUp(F.a_sup(i, j), F.g_sup(i, j))), in.ell(j));
        c2(j) = MulUp(MulUp(F.a_sup(i, j), F.b_sup(i, j)), in.ell(i));
      }
      double t = SimplexWeightedSumUp(cap, c1, len);
      const double d = std::min(SimplexWeightedSumUp(cap, c2, len), MulUp(diag(i, h), in.ell(i)));
      const double ell_row = in.ell.head(len).maxCoeff();
      if (p == NormKind::kL2) {
        Eigen::VectorXd g2(len);
        for (int j = 0; j < len; ++j) g2(j) = MulUp(F.g_sup(i, j), F.g_sup(i, j));
        const double ag = SqrtUp(MulUp(spread[h][i].a2, SimplexWeightedSumUp(cap, g2, len)));
        t = std::min(t, MulUp(AddUp(geo[h].w_norm, ag), ell_row));
      }
      if (capped) t = std::min(t, MulUp(AddUp(geo[h].w_norm, caps[h].For(len).row_sum.value()), ell_row));
      row = AddUp(row, AddUp(t, d));
    }
    row_max = std::max(row_max, row);
  }
  double col_max = 0;
  for (int j = 0; j < n; ++j) {
    double s = 0;
    for (int i = 0; i < n; ++i) s = AddUp(s, all(i, j));
    col_max = std::max(col_max, MulUp(s, in.ell(j)));
  }
  const double schur = p == NormKind::kL2 ? SqrtUp(MulUp(row_max, col_max)) : row_max;
  // L2 heads in norm 2: one operator bound for every input (no block bounds at all).
  const double operator_cap = capped ? MulUp(L2AttentionOperatorCap(L, n).total.value(), ell_max) : kInf;
  const double mha = std::min({split, joint, schur, operator_cap});
  EngineBound out;
  const bool identity = in.residual && !opts.exclude_residual;
  out.upper = UpperBound(identity ? AddUp(1.0, mha) : mha);
  if (identity) out.terms.push_back({"residual identity", UpperBound(1.0)});
  const char* route = mha == split          ? "attention Jacobian (value path + logit path)"
                      : mha == joint        ? "attention Jacobian (joint block-bound norm)"
                      : mha == schur        ? "attention Jacobian (row and column sums)"
                                            : "attention Jacobian (L2 operator bound for every input)";
  out.terms.push_back({route, UpperBound(mha)});
  out.alternatives = {
      {"value path sum_h ||P^h (x) W_h|| x LayerNorm factor max_j ell_j", UpperBound(value_path)},
      {"logit path and diagonal E_i: ||R diag(ell)||", UpperBound(logit_path)},
      {"value path + logit path", UpperBound(split)},
      {"joint block-bound norm ||(F + R) diag(ell)||", UpperBound(joint)},
      {"row and column sums of the block bounds", UpperBound(schur)},
      {"LayerNorm factor max_j ell_j", UpperBound(ell_max)},
  };
  if (capped) out.alternatives.push_back({"L2 operator bound for every input x LayerNorm factor", UpperBound(operator_cap)});
  return out;
}

UpperBound BlockNormUpperBound(const AttentionLayer& layer, const TokenCover& cover, const BoundOptions& opts) {
  return BlockNormBound(layer, cover, opts).upper;
}

}  // namespace lipcert
