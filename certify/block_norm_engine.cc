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

// Whether opts.deadline has passed, asked from several threads: once one of them sees it
// pass, every later question is answered without reading the clock.
class DeadlineWatch {
 public:
  explicit DeadlineWatch(const BoundOptions& opts) : opts_(opts) {}
  bool Passed() {
    if (!late_.load(std::memory_order_relaxed) && DeadlinePassed(opts_)) late_ = true;
    return late_.load(std::memory_order_relaxed);
  }

 private:
  const BoundOptions& opts_;
  std::atomic<bool> late_{false};
};

// What every step reads: the layer, its MHA input over the cover, the norm and N.
struct Problem {
  const AttentionLayer& L;
  const MhaInput& in;
  NormKind p;
  int n;
};

// Every head's geometry and factor bounds over the cover, and (norm 2) its row spreads.
struct HeadParts {
  std::vector<HeadGeometry> geo;
  std::vector<FactorBounds> fb;
  std::vector<std::vector<RowSpread>> spread;  // norm 2 only
};

// Heads are independent: bound them in parallel (the caller adds up in head order).
HeadParts BoundHeads(const Problem& job, const BoundOptions& opts, DeadlineWatch& watch) {
  const AttentionLayer& L = job.L;
  const MhaInput& in = job.in;
  const NormKind p = job.p;
  const int n = job.n;
  HeadParts hp;
  hp.geo.resize(L.heads);
  hp.fb.resize(L.heads);
  hp.spread.assign(L.heads, std::vector<RowSpread>(n));
  ParallelFor(L.heads, WorkerCount(opts.threads, L.heads), [&](int h, int) {
    if (watch.Passed()) return;
    hp.geo[h] = HeadGeometryAt(L, h, in.zc, p);
    hp.fb[h] = HeadFactorBounds(hp.geo[h], in.rho_z, in.joint_z, L.causal);
    if (p == NormKind::kL2)
      for (int i = 0; i < n && !watch.Passed(); ++i)
        hp.spread[h][i] = RowSpreadUp(hp.geo[h], hp.fb[h], in.rho_z, i, L.causal ? i + 1 : n);
  });
  return hp;
}

// L2 heads in norm 2 also have bounds that hold for every input (caps); other layers and
// norms have none, and Or leaves their bounds as they are.
struct HeadCaps {
  bool capped = false;
  std::vector<L2HeadCaps> heads;
  double Or(double bound, UpperBound cap) const { return capped ? std::min(bound, cap.value()) : bound; }
};

HeadCaps CapsOf(const AttentionLayer& L, NormKind p) {
  HeadCaps caps;
  caps.capped = L.kind == AttentionKind::kL2 && p == NormKind::kL2;
  caps.heads.resize(L.heads);
  if (caps.capped)
    for (int h = 0; h < L.heads; ++h) caps.heads[h] = CapsOfL2Head(L, h);
  return caps;
}

// J_MHA = sum_h P^h (x) W_h + R: the N x N bounds on its blocks, added up in head order.
struct BlockBounds {
  double kron = 0;       // sum_h ||P^h|| ||W_h||
  Eigen::MatrixXd full;  // sum_h P^h_ij ||W_h||
  Eigen::MatrixXd r;     // R's blocks, the diagonal E_i included
  Eigen::MatrixXd diag;  // (N, H): bound on ||E_i|| for head h
};

// False once the deadline has passed.
bool AssembleBlocks(const Problem& job, const HeadParts& hp, const HeadCaps& caps, DeadlineWatch& watch,
                    BlockBounds* b) {
  const auto& [L, in, p, n] = job;
  b->full = Eigen::MatrixXd::Zero(n, n);
  b->r = Eigen::MatrixXd::Zero(n, n);
  b->diag.resize(n, L.heads);
  for (int h = 0; h < L.heads; ++h) {
    if (watch.Passed()) return false;
    const HeadGeometry& G = hp.geo[h];
    const FactorBounds& F = hp.fb[h];
    b->kron = AddUp(b->kron, MulUp(ProbabilityNormUp(F.p_hi, p), G.w_norm));
    for (int i = 0; i < n; ++i) {
      const int len = L.causal ? i + 1 : n;
      const L2BlockCaps c = caps.capped ? caps.heads[h].For(len) : L2BlockCaps{};
      // ||E_i|| <= sum_k P_ik ||a_ik|| ||b_ik||, P_i on the simplex below p_hi (knapsack).
      Eigen::VectorXd ab(len);
      for (int j = 0; j < len; ++j) {
        b->full(i, j) = AddUp(b->full(i, j), MulUp(F.p_hi(i, j), G.w_norm));
        b->r(i, j) = AddUp(b->r(i, j), caps.Or(MulUp(F.pa(i, j), F.g_sup(i, j)), c.block));
        ab(j) = MulUp(F.a_sup(i, j), F.b_sup(i, j));
      }
      double e = SimplexWeightedSumUp(F.p_hi.row(i).transpose(), ab, len);
      // E_i is the covariance sum_k P_ik a_ik b_ik^T (ValueQueryCovarianceUp keeps its cancellation).
      if (p == NormKind::kL2)
        e = std::min({e, SqrtUp(MulUp(hp.spread[h][i].a2, hp.spread[h][i].b2)),
                      ValueQueryCovarianceUp(G, F, in.rho_z, i, len)});
      b->diag(i, h) = caps.Or(e, c.diagonal);
      b->r(i, i) = AddUp(b->r(i, i), b->diag(i, h));
    }
  }
  return true;
}

// Row i's sum of the block bounds (times ell_j) with P's rows on the simplex:
//   sum_j ||J_ij|| ell_j <= sum_h [ sum_j P_ij (||W_h|| + a g) ell_j + ell_i ||E_i|| ],
// sum_j P_ij a g by the knapsack, by Cauchy-Schwarz over the row's spreads (norm 2) or by
// the L2 cap, whichever is smallest.
double RowSumUp(const Problem& job, const HeadParts& hp, const HeadCaps& caps, const BlockBounds& b, int i) {
  const auto& [L, in, p, n] = job;
  const int len = L.causal ? i + 1 : n;
  double row = 0;
  for (int h = 0; h < L.heads; ++h) {
    const FactorBounds& F = hp.fb[h];
    Eigen::VectorXd cap = F.p_hi.row(i).transpose(), c1(len), c2(len);
    for (int j = 0; j < len; ++j) {
      c1(j) = MulUp(AddUp(hp.geo[h].w_norm, MulUp(F.a_sup(i, j), F.g_sup(i, j))), in.ell(j));
      c2(j) = MulUp(MulUp(F.a_sup(i, j), F.b_sup(i, j)), in.ell(i));
    }
    double t = SimplexWeightedSumUp(cap, c1, len);
    const double d = std::min(SimplexWeightedSumUp(cap, c2, len), MulUp(b.diag(i, h), in.ell(i)));
    const double ell_row = in.ell.head(len).maxCoeff();
    if (p == NormKind::kL2) {
      Eigen::VectorXd g2(len);
      for (int j = 0; j < len; ++j) g2(j) = MulUp(F.g_sup(i, j), F.g_sup(i, j));
      const double ag = SqrtUp(MulUp(hp.spread[h][i].a2, SimplexWeightedSumUp(cap, g2, len)));
      t = std::min(t, MulUp(AddUp(hp.geo[h].w_norm, ag), ell_row));
    }
    if (caps.capped) t = std::min(t, MulUp(AddUp(hp.geo[h].w_norm, caps.heads[h].For(len).row_sum.value()), ell_row));
    row = AddUp(row, AddUp(t, d));
  }
  return row;
}

// max_j ell_j sum_i all_ij, rounded up.
double MaxColumnSumUp(const Eigen::MatrixXd& all, const Eigen::VectorXd& ell) {
  const int n = int(all.rows());
  double col_max = 0;
  for (int j = 0; j < n; ++j) {
    double s = 0;
    for (int i = 0; i < n; ++i) s = AddUp(s, all(i, j));
    col_max = std::max(col_max, MulUp(s, ell(j)));
  }
  return col_max;
}

// The routes to a bound on ||J_MHA diag(ell)||, each an upper bound on its own.
struct Routes {
  double ell_max = 0;       // LayerNorm factor max_j ell_j
  double value_path = 0;    // sum_h ||P^h (x) W_h|| ell_max
  double logit_path = 0;    // ||R diag(ell)||
  double split = 0;         // value path + logit path
  double joint = 0;         // ||(F + R) diag(ell)||
  double schur = 0;         // from the row and column sums
  double operator_cap = kInf;  // L2 heads in norm 2: one operator bound for every input
  double mha = 0;           // the smallest of them
};

// The certificate: J = I + J_MHA J_LN for the sublayer (unless opts.exclude_residual), with
// the route that won and every alternative.
EngineBound Describe(const Routes& w, bool residual, const BoundOptions& opts, bool capped) {
  EngineBound out;
  const bool identity = residual && !opts.exclude_residual;
  out.upper = UpperBound(identity ? AddUp(1.0, w.mha) : w.mha);
  if (identity) out.terms.push_back({"residual identity", UpperBound(1.0)});
  const char* route = w.mha == w.split   ? "attention Jacobian (value path + logit path)"
                      : w.mha == w.joint ? "attention Jacobian (joint block-bound norm)"
                      : w.mha == w.schur ? "attention Jacobian (row and column sums)"
                                         : "attention Jacobian (L2 operator bound for every input)";
  out.terms.push_back({route, UpperBound(w.mha)});
  out.alternatives = {
      {"value path sum_h ||P^h (x) W_h|| x LayerNorm factor max_j ell_j", UpperBound(w.value_path)},
      {"logit path and diagonal E_i: ||R diag(ell)||", UpperBound(w.logit_path)},
      {"value path + logit path", UpperBound(w.split)},
      {"joint block-bound norm ||(F + R) diag(ell)||", UpperBound(w.joint)},
      {"row and column sums of the block bounds", UpperBound(w.schur)},
      {"LayerNorm factor max_j ell_j", UpperBound(w.ell_max)},
  };
  if (capped)
    out.alternatives.push_back({"L2 operator bound for every input x LayerNorm factor", UpperBound(w.operator_cap)});
  return out;
}

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
  const Problem job{L, in, p, n};
  DeadlineWatch watch(opts);
  const HeadParts hp = BoundHeads(job, opts, watch);
  if (watch.Passed()) return TimedOutBound(kEngine);
  const HeadCaps caps = CapsOf(L, p);
  BlockBounds b;
  if (!AssembleBlocks(job, hp, caps, watch, &b)) return TimedOutBound(kEngine);
  Routes w;
  w.ell_max = in.ell.maxCoeff();
  w.value_path = MulUp(b.kron, w.ell_max);
  w.logit_path = ScaledNonnegNormUp(b.r, in.ell, PrimalNorm(p));
  w.split = AddUp(w.value_path, w.logit_path);
  Eigen::MatrixXd all(n, n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) all(i, j) = AddUp(b.full(i, j), b.r(i, j));
  w.joint = ScaledNonnegNormUp(all, in.ell, PrimalNorm(p));
  // ||.||_inf <= max row sum, and ||.||_2 <= sqrt(max row sum * max column sum).
  double row_max = 0;
  for (int i = 0; i < n; ++i) {
    if (watch.Passed()) return TimedOutBound(kEngine);
    row_max = std::max(row_max, RowSumUp(job, hp, caps, b, i));
  }
  const double col_max = MaxColumnSumUp(all, in.ell);
  w.schur = p == NormKind::kL2 ? SqrtUp(MulUp(row_max, col_max)) : row_max;
  if (caps.capped) w.operator_cap = MulUp(L2AttentionOperatorCap(L, n).total.value(), w.ell_max);
  w.mha = std::min({w.split, w.joint, w.schur, w.operator_cap});
  return Describe(w, in.residual, opts, caps.capped);
}

UpperBound BlockNormUpperBound(const AttentionLayer& layer, const TokenCover& cover, const BoundOptions& opts) {
  return BlockNormBound(layer, cover, opts).upper;
}

}  // namespace lipcert
