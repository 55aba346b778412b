#include "certify/centred_engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "certify/centre_norm.h"
#include "certify/dense_jacobian.h"
#include "certify/head_factors.h"
#include "certify/layer_norm_cover.h"
#include "certify/time_model.h"
#include "interval/norms.h"
#include "interval/parallel.h"
#include "interval/vector_norms.h"

namespace lipcert {

namespace {
constexpr const char* kEngine = "centred";

// The heads in their own coordinates (docs/engines.md): the layer with Wo = I (dot heads,
// H dv = D) writes head h to coordinates h dv .. (h + 1) dv, so its rows' second
// derivatives stack without the triangle inequality between heads, and
// ||D^2 out|| <= ||Wo|| ||D^2 out'||. Its geometry, its factor bounds over the cover (s = 1)
// and wo_norm >= ||Wo||_2.
struct HeadsApart {
  std::vector<HeadGeometry> geo;
  std::vector<FactorBounds> full;
  double wo_norm = kInf;
};
// Which second-order bound a node computes: T(1) chooses (both unrefined, the smaller
// refined, or both refined where they are close and small), the other nodes take T(1)'s choice.
enum class SecondOrderRoute { kChoose, kSummed, kStacked };
constexpr double kRefineBothUpTo = 16384;  // N D
// Under a work budget (BoundOptions::by_work) the second order takes this many nodes after
// T(1) (s = 1/2, 1/4, 3/4), whatever the time: a fixed count, the same on every machine.
constexpr int kWorkBudgetNodes = 3;

// sup ||D^2 out[U, U]|| over unit U and the z-cover scaled by s about zc (norm 2): the smaller
// of the forms' bound (SecondOrderHeadUp: max_j sum_h ||column j of L_h|| + sum_h cross_h)
// and the pairs-apart bound (SecondOrderSplitHeadUp, the moving token's own row as one
// form over the heads, OwnRowUp, its columns refined, `threads` at a time, until
// refine_until and for at most `share` of the time left before share.of once they start:
// the factor bounds before them take seconds at BERT-base size, and a share counted before
// them left the columns nothing); or, by *route, ||Wo|| times the pairs-apart bound of the
// heads apart (HeadsApart, stacked). With F given, the heads' factor bounds over the full
// cover (s = 1).
struct ColumnsShare {
  double fraction = 1.0;
  std::chrono::steady_clock::time_point of = std::chrono::steady_clock::time_point::max();
};
double SecondOrderSupUp(const std::vector<HeadGeometry>& geo, const MhaInput& in, bool causal, double s, int threads,
                        std::chrono::steady_clock::time_point refine_until, ColumnsShare share = {},
                        const std::vector<FactorBounds>* full = nullptr, const HeadsApart* apart = nullptr,
                        SecondOrderRoute* route = nullptr, const Eigen::VectorXd* row_weights = nullptr) {
  Eigen::VectorXd rho = in.rho_z;
  for (Eigen::Index j = 0; j < rho.size(); ++j) rho(j) = MulUp(rho(j), s);
  const int heads = int(geo.size());
  SecondOrderRoute r = apart && route ? *route : SecondOrderRoute::kSummed;
  const bool summed = r != SecondOrderRoute::kStacked, stacked = r != SecondOrderRoute::kSummed;
  std::vector<SecondOrderHead> per_head(summed ? heads : 0);
  std::vector<SecondOrderSplitHead> split(summed ? heads : 0), split_apart(stacked ? heads : 0);
  std::vector<FactorBounds> factors(summed ? heads : 0), factors_apart(stacked ? heads : 0);
  ParallelFor(heads, WorkerCount(threads, heads), [&](int h, int) {
    if (summed) {
      factors[h] = full ? (*full)[h] : HeadFactorBounds(geo[h], rho, MulUp(in.joint_z, s), causal);
      per_head[h] = SecondOrderHeadUp(geo[h], factors[h], rho, causal);
      split[h] = SecondOrderSplitHeadUp(geo[h], factors[h], rho, causal);
    }
    if (stacked) {  // with both, the same softmax ranges and logit factors, the values' own
      factors_apart[h] = full     ? apart->full[h]
                         : summed ? WithValuesOf(apart->geo[h], factors[h], rho, causal)
                                  : HeadFactorBounds(apart->geo[h], rho, MulUp(in.joint_z, s), causal);
      split_apart[h] = SecondOrderSplitHeadUp(apart->geo[h], factors_apart[h], rho, causal);
    }
    if (row_weights) {  // output token i's rows (every form, lin and pairs) times w_i (0 <= w_i <= 1)
      const auto scale_rows = [&](Eigen::MatrixXd& m) {
        for (Eigen::Index i = 0; i < m.rows(); ++i)
          for (Eigen::Index k = 0; k < m.cols(); ++k) m(i, k) = MulUp(m(i, k), (*row_weights)(i));
      };
      if (summed) {
        for (size_t i = 0; i < per_head[h].forms.size(); ++i)
          for (Eigen::Index e = 0; e < per_head[h].forms[i].size(); ++e)
            per_head[h].forms[i].data()[e] = MulUp(per_head[h].forms[i].data()[e], (*row_weights)(Eigen::Index(i)));
        scale_rows(split[h].lin);
        scale_rows(split[h].pairs);
      }
      if (stacked) {
        scale_rows(split_apart[h].lin);
        scale_rows(split_apart[h].pairs);
      }
    }
  });
  if (r == SecondOrderRoute::kChoose) {
    // Above N D = kRefineBothUpTo, the smaller unrefined column term is refined (the
    // columns' time is T(1)'s largest part, and the pairs have followed the columns:
    // BERT-base size 0.58x both, MiniLM 1.07x and 1.9x; computing the pairs here as well
    // cost BERT-base size its refined node at 1/2, 48.76 -> 59.68 at 0.1%). Below it the
    // whole unrefined bounds decide, and where they are within 1.5x both are refined:
    // unrefined, the two can rank the other way round from refined (the zoo's dot layers
    // at 0.1%: the heads apart lower, then 1-10% above).
    if (double(rho.size()) * double(geo[0].b.mid.cols()) > kRefineBothUpTo) {
      const double summed_columns = SecondOrderSplitColumnTermUp(split, false);
      const double stacked_columns = MulUp(apart->wo_norm, SecondOrderSplitColumnTermUp(split_apart, true));
      r = stacked_columns < summed_columns ? SecondOrderRoute::kStacked : SecondOrderRoute::kSummed;
    } else {
      const double summed_plain = std::min(SecondOrderColumnsUp(per_head), SecondOrderSplitColumnsUp(split));
      const double stacked_plain = MulUp(apart->wo_norm, SecondOrderSplitColumnsUp(
                                                             split_apart, nullptr, std::chrono::steady_clock::time_point::max(),
                                                             threads, /*stacked=*/true));
      const double ratio = std::max(summed_plain, stacked_plain) / std::min(summed_plain, stacked_plain);
      r = ratio < 1.5                      ? SecondOrderRoute::kChoose
          : stacked_plain < summed_plain ? SecondOrderRoute::kStacked
                                         : SecondOrderRoute::kSummed;
    }
    *route = r;
  }
  const auto now = std::chrono::steady_clock::now();
  const auto columns_until =
      share.fraction < 1 && share.of != std::chrono::steady_clock::time_point::max()
          ? std::min(refine_until, share.of > now ? now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                              (share.of - now) * share.fraction)
                                                  : now)
          : refine_until;
  double apart_bound = kInf, summed_bound = kInf;
  if (r != SecondOrderRoute::kSummed) {
    auto own_row = [&](int j, int t) {
      const double o = OwnRowUp(apart->geo, factors_apart, rho, causal, j, t);
      return row_weights ? MulUp(o, (*row_weights)(j)) : o;
    };
    apart_bound = MulUp(apart->wo_norm, SecondOrderSplitColumnsUp(split_apart, own_row, columns_until, threads, true));
  }
  if (r != SecondOrderRoute::kStacked) {
    auto own_row = [&](int j, int t) {
      const double o = OwnRowUp(geo, factors, rho, causal, j, t);
      return row_weights ? MulUp(o, (*row_weights)(j)) : o;
    };
    summed_bound = std::min(SecondOrderColumnsUp(per_head), SecondOrderSplitColumnsUp(split, own_row, columns_until, threads));
  }
  if (r == SecondOrderRoute::kChoose) *route = apart_bound < summed_bound ? SecondOrderRoute::kStacked : SecondOrderRoute::kSummed;
  return std::min(apart_bound, summed_bound);
}

// The second-order variation (docs/engines.md, "Second-order variation"): along the segment
// from Zc to Z, J_M(Z) - J_M(Zc) = int_0^1 D^2 out(Zc + s (Z - Zc))[Z - Zc, .] ds, and the
// point at s lies in the cover scaled by s. So with nodes 0 < s_1 < ... < s_K = 1,
//   sup ||J_M(z) - J_M(zc)|| <= joint_z sum_k (s_k - s_{k-1}) T(s_k),
// T(s) = SecondOrderSupUp at s, and the mean along the segment likewise
// (SecondOrderNodeIntegralsUp). T(1) comes from the caller (it took t_one_seconds); the nodes
// 1/2, 1/4, 3/4, then the odd eighths are added while they fit in a tenth of the time left
// and before refine_until (the rest is the centre norm's). With up_to_refine_until, while
// they fit before it, each refining for its share of what is left among the nodes that fit
// at the last one's pace (T(1)'s for the first): a node whose columns are cut is no better
// than T(1) where the heads are diffuse, so fewer nodes, each refined, pay more. Any set of
// nodes gives a bound, and T(1) bounds every T(s).
NodeIntegrals SecondOrderVariationUp(const std::vector<HeadGeometry>& geo, const MhaInput& in, bool causal, double t_one,
                              double t_one_seconds, const BoundOptions& opts,
                              std::chrono::steady_clock::time_point refine_until, bool up_to_refine_until,
                              const HeadsApart* apart, SecondOrderRoute route, int* node_count,
                              const Eigen::VectorXd* row_weights) {
  std::vector<std::pair<double, double>> nodes = {{1.0, t_one}};  // (s, T(s))
  const bool timed = opts.deadline != std::chrono::steady_clock::time_point::max();
  const auto start = std::chrono::steady_clock::now();
  const auto budget_end =
      timed && !up_to_refine_until ? std::min(start + (opts.deadline - start) / 10, refine_until) : refine_until;
  auto last = std::chrono::steady_clock::duration::zero();
  const auto t_one_pace = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::max(0.0, t_one_seconds)));
  const std::vector<double> order = {0.5, 0.25, 0.75, 0.125, 0.375, 0.625, 0.875};
  for (size_t k = 0; k < order.size(); ++k) {
    if (opts.by_work && int(k) >= kWorkBudgetNodes) break;
    if (DeadlinePassed(opts)) break;  // the deadline, or a stop request: T(1) bounds every node
    const double s = order[k];
    const auto t0 = std::chrono::steady_clock::now();
    if (budget_end != std::chrono::steady_clock::time_point::max() && t0 + last > budget_end) break;
    auto node_end = budget_end;
    if (up_to_refine_until && budget_end != std::chrono::steady_clock::time_point::max() && budget_end > t0) {
      const auto pace = k == 0 ? t_one_pace : last;
      const long fit = pace.count() > 0 ? std::max(1L, long((budget_end - t0) / pace)) : long(order.size() - k);
      node_end = t0 + (budget_end - t0) / std::min(fit, long(order.size() - k));
    }
    // The cover scaled by s lies in the cover (scaled about its centre), so T(1) bounds T(s) too.
    nodes.push_back({s, std::min(t_one, SecondOrderSupUp(geo, in, causal, s, opts.threads, node_end, {}, nullptr, apart,
                                                         &route, row_weights))});
    last = std::chrono::steady_clock::now() - t0;
  }
  std::sort(nodes.begin(), nodes.end());
  *node_count = int(nodes.size());
  return SecondOrderNodeIntegralsUp(nodes, in.joint_z);
}
}  // namespace

std::string CentredEngineRefusal(const AttentionLayer& layer, int tokens, const BoundOptions& opts) {
  if (opts.norm != NormKind::kL2) return "norm 2 only";
  if (layer.post_ln()) return "post-LN layer: certified by post_ln_composition on MHA alone";
  const long nd = long(tokens) * layer.d_model;
  if (nd > opts.dense_limit)
    return "N*D = " + std::to_string(nd) + " exceeds dense_limit " + std::to_string(opts.dense_limit);
  return "";
}

double CentredEngineCostEstimate(const AttentionLayer& layer, int tokens) { return CentredEngineOperations(layer, tokens); }

double CentredEngineSecondsEstimate(const AttentionLayer& layer, int tokens) { return CentredEngineSeconds(layer, tokens); }

namespace {
// sup ||J_M(z) - J_M(zc)|| <= kron + ||rd||, with rd the N x N block bounds; and the row
// sums of the block bounds of J(X) - J(X0) (columns scaled by ell), with the rows of dP and
// P0 on the simplex (see SimplexWeightedSumUp). Each head's share is computed on its own
// thread and the shares are added in head order (the same bound for any threads).
// value_row(i) >= the value path's row i alone, sum_j |dP_ij| ||W_h||_p ell_j with the
// rows of dP on the simplex (caps w_ij, total 2).
struct HeadShare {
  double kron = 0;
  Eigen::MatrixXd full, rd;
  Eigen::VectorXd row_sum, value_row;
};

// One head's factors: over the cover (F) and at the centre (F0), its geometry G, and the
// distance rows' descending orders (each sorted once, SimplexWeightedSumUp's order).
struct HeadFactors {
  const HeadGeometry& G;
  const FactorBounds& F;
  const FactorBounds& F0;
  std::vector<std::vector<int>> du_orders, side_orders;
};

// w_ij >= |P_ij(X) - P_ij(X0)|.
Eigen::MatrixXd SoftmaxMotionUp(const FactorBounds& F, const FactorBounds& F0, int n) {
  Eigen::MatrixXd w(n, n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      w(i, j) = std::max({SubUp(F.p_hi(i, j), F0.p_lo(i, j)), SubUp(F0.p_hi(i, j), F.p_lo(i, j)), 0.0});
  return w;
}

// Row i of the head's share: its block bounds into share->full and share->rd, its row sum
// into share->row_sum.
void AddRowShare(const HeadFactors& hf, const MhaInput& in, bool causal, const Eigen::MatrixXd& w, int i,
                 HeadShare* share) {
  const HeadGeometry& G = hf.G;
  const FactorBounds& F = hf.F;
  const FactorBounds& F0 = hf.F0;
  Eigen::MatrixXd& full = share->full;
  Eigen::MatrixXd& rd = share->rd;
  const int n = int(w.rows());
  const int len = causal ? i + 1 : n;
  const double rho_max = in.rho_z.head(len).maxCoeff();
  // sum_k |P_ik - P0_ik| c_k <= the greedy sum with caps w_ik and total 2.
  const Eigen::VectorXd w_i = w.row(i).transpose(), p0_i = F0.p_hi.row(i).transpose();
  auto dp_sum = [&](const Eigen::MatrixXd& dist, const std::vector<std::vector<int>>& orders, int j) {
    return SimplexWeightedSumUp(w_i, dist.row(j).transpose(), len, 2.0, orders[j]);
  };
  // Row i's terms, split by their weights (w or P0) for the row-sum bound below.
  Eigen::VectorXd cw_t(len), cp_t(len), cw_e(len), cp_e(len);
  double de = 0;
  for (int j = 0; j < len; ++j) {
    full(i, j) = AddUp(full(i, j), MulUp(w(i, j), G.w_norm));
    // a_ij - a0_ij = du_j - dubar_i: ||.|| <= c_u (rho_j + max_k rho_k) + sum_k |dP_ik| ||u0_k - u0_j||.
    const double da = AddUp(MulUp(G.c_u, AddUp(in.rho_z(j), rho_max)), dp_sum(G.du, hf.du_orders, j));
    double dg, db;
    if (G.dot) {
      dg = MulUp(G.c_g, in.rho_z(i));
      db = AddUp(MulUp(G.c_b, AddUp(in.rho_z(j), rho_max)), dp_sum(G.db, hf.side_orders, j));
    } else {
      dg = MulUp(2.0, MulUp(G.c_g, AddUp(in.rho_z(i), in.rho_z(j))));
      db = MulUp(2.0, AddUp(MulUp(G.c_g, AddUp(in.rho_z(j), rho_max)), dp_sum(G.dg, hf.side_orders, j)));
    }
    // P a g^T - P0 a0 g0^T = dP a g^T + P0 da g^T + P0 a0 dg^T (and likewise with b).
    cw_t(j) = MulUp(AddUp(G.w_norm, MulUp(F.a_sup(i, j), F.g_sup(i, j))), in.ell(j));
    cp_t(j) = MulUp(AddUp(MulUp(da, F.g_sup(i, j)), MulUp(F0.a_sup(i, j), dg)), in.ell(j));
    cw_e(j) = MulUp(MulUp(F.a_sup(i, j), F.b_sup(i, j)), in.ell(i));
    cp_e(j) = MulUp(AddUp(MulUp(da, F.b_sup(i, j)), MulUp(F0.a_sup(i, j), db)), in.ell(i));
    const double dt = AddUp(MulUp(w(i, j), MulUp(F.a_sup(i, j), F.g_sup(i, j))),
                            MulUp(F0.p_hi(i, j), AddUp(MulUp(da, F.g_sup(i, j)), MulUp(F0.a_sup(i, j), dg))));
    rd(i, j) = AddUp(rd(i, j), dt);
    de = AddUp(de, AddUp(MulUp(w(i, j), MulUp(F.a_sup(i, j), F.b_sup(i, j))),
                         MulUp(F0.p_hi(i, j), AddUp(MulUp(da, F.b_sup(i, j)), MulUp(F0.a_sup(i, j), db)))));
  }
  rd(i, i) = AddUp(rd(i, i), de);
  const double row = AddUp(AddUp(SimplexWeightedSumUp(w_i, cw_t, len, 2.0), SimplexWeightedSumUp(p0_i, cp_t, len)),
                           AddUp(SimplexWeightedSumUp(w_i, cw_e, len, 2.0), SimplexWeightedSumUp(p0_i, cp_e, len)));
  share->row_sum(i) = AddUp(share->row_sum(i), row);
  share->value_row(i) = AddUp(share->value_row(i), MulUp(G.w_norm, SimplexWeightedSumUp(w_i, in.ell, len, 2.0)));
}

// One head's share of the first-order variation; false where the deadline passed (or a stop
// was requested) between its rows.
bool HeadShareOver(const HeadGeometry& G, const FactorBounds& F, const FactorBounds& F0, const MhaInput& in, int n,
                   bool causal, const BoundOptions& opts, HeadShare* share) {
  share->full = Eigen::MatrixXd::Zero(n, n);
  share->rd = Eigen::MatrixXd::Zero(n, n);
  share->row_sum = Eigen::VectorXd::Zero(n);
  share->value_row = Eigen::VectorXd::Zero(n);
  const HeadFactors hf{G, F, F0, DescendingRowOrders(G.du), DescendingRowOrders(G.dot ? G.db : G.dg)};
  const Eigen::MatrixXd w = SoftmaxMotionUp(F, F0, n);
  share->kron = MulUp(NonnegNormUp(w, PrimalNorm(opts.norm)), G.w_norm);
  for (int i = 0; i < n; ++i) {
    if (DeadlinePassed(opts)) return false;
    AddRowShare(hf, in, causal, w, i, share);
  }
  return true;
}

// The heads' shares added in head order.
HeadShare SumShares(const std::vector<HeadShare>& shares, int n) {
  HeadShare sum;
  sum.full = Eigen::MatrixXd::Zero(n, n);
  sum.rd = Eigen::MatrixXd::Zero(n, n);
  sum.row_sum = Eigen::VectorXd::Zero(n);
  sum.value_row = Eigen::VectorXd::Zero(n);
  for (const HeadShare& share : shares) {
    sum.kron = AddUp(sum.kron, share.kron);
    for (Eigen::Index e = 0; e < sum.full.size(); ++e) {
      sum.full.data()[e] = AddUp(sum.full.data()[e], share.full.data()[e]);
      sum.rd.data()[e] = AddUp(sum.rd.data()[e], share.rd.data()[e]);
    }
    for (int i = 0; i < n; ++i) {
      sum.row_sum(i) = AddUp(sum.row_sum(i), share.row_sum(i));
      sum.value_row(i) = AddUp(sum.value_row(i), share.value_row(i));
    }
  }
  return sum;
}

// Per output token i, in the inf norm: >= sup ||(J(X) - J(X0))_i||_inf. Every first-order
// inf route is a maximum over block rows of a bound on one block row (||A_i||_inf <=
// sum_j ||A_ij||_inf for the D x D blocks, the columns of block j scaled by ell_j), so each
// one's row i bounds block row i: the block-row sum row_sum(i); the joint block bounds
// sum_j (full_ij + rd_ij) ell_j; the value path's row (sum_j full_ij ell_j, or value_row(i)
// on the simplex) plus the logit path's row sum_j rd_ij ell_j. And ||A_i||_inf <= ||A||_inf,
// so `variation` caps each entry.
double RowVariationOf(const HeadShare& sum, const MhaInput& in, int i) {
  const Eigen::Index n = sum.full.cols();
  double value = 0, logit = 0, joint = 0;
  for (Eigen::Index j = 0; j < n; ++j) {
    value = AddUp(value, MulUp(sum.full(i, j), in.ell(j)));
    logit = AddUp(logit, MulUp(sum.rd(i, j), in.ell(j)));
    joint = AddUp(joint, MulUp(AddUp(sum.full(i, j), sum.rd(i, j)), in.ell(j)));
  }
  const double split = AddUp(std::min(value, sum.value_row(i)), logit);
  return std::min({sum.row_sum(i), joint, split});
}
Eigen::VectorXd RowVariationUp(const HeadShare& sum, const MhaInput& in, int n, double variation) {
  Eigen::VectorXd out(n);
  for (int i = 0; i < n; ++i) out(i) = std::min(RowVariationOf(sum, in, i), variation);
  return out;
}

// The first-order candidates from the summed shares.
struct FirstOrderVariation {
  double value_path = kInf, logit_path = kInf, split = kInf, joint = kInf, schur = kInf;
};
FirstOrderVariation FirstOrderVariationUp(const HeadShare& sum, const MhaInput& in, NormKind p, int n) {
  const double ell_max = in.ell.maxCoeff();
  Eigen::MatrixXd all(n, n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) all(i, j) = AddUp(sum.full(i, j), sum.rd(i, j));
  double col_max = 0;
  for (int j = 0; j < n; ++j) {
    double s = 0;
    for (int i = 0; i < n; ++i) s = AddUp(s, all(i, j));
    col_max = std::max(col_max, MulUp(s, in.ell(j)));
  }
  FirstOrderVariation f;
  // ||B||_2 <= sqrt(||B||_inf ||B||_1) for the block-bound matrix B; in the inf norm the
  // block-row sums bound ||J(X) - J(X0)||_inf themselves.
  f.schur = p == NormKind::kL2 ? SqrtUp(MulUp(sum.row_sum.maxCoeff(), col_max)) : sum.row_sum.maxCoeff();
  f.value_path = MulUp(sum.kron, ell_max);
  f.logit_path = ScaledNonnegNormUp(sum.rd, in.ell, PrimalNorm(p));
  f.split = AddUp(f.value_path, f.logit_path);
  f.joint = ScaledNonnegNormUp(all, in.ell, PrimalNorm(p));
  return f;
}

// The heads apart (HeadsApart) where they apply (dot heads whose values fill D): ||Wo|| now,
// the heads' geometry and factors filled per head; *own_coordinates the layer with Wo = I.
HeadsApart HeadsApartOf(const AttentionLayer& L, const BoundOptions& opts, bool applies,
                        AttentionLayer* own_coordinates) {
  HeadsApart apart;
  if (!applies) return apart;
  *own_coordinates = L;
  own_coordinates->wo = Eigen::MatrixXd::Identity(L.d_model, L.d_model);
  if (own_coordinates->bo.size()) own_coordinates->bo.setZero();
  apart.geo.resize(L.heads);
  apart.full.resize(L.heads);
  apart.wo_norm = NormL2UpperGram(L.wo, opts.threads).value();
  return apart;
}

// The winning candidate's name, and every candidate, into v.
void NameVariation(const FirstOrderVariation& f, double second, bool second_order, double ell_max, NormKind p,
                   CentredVariation* v) {
  const double variation = std::min({f.split, f.joint, f.schur, second});
  v->route = variation == second ? (v->heads_apart ? "variation sup ||J(X) - J(X0)|| (second order: radius x sup ||D^2 f||, "
                                                     "heads apart: ||Wo|| x their stacked rows)"
                                                   : "variation sup ||J(X) - J(X0)|| (second order: radius x sup ||D^2 f||)")
             : variation == f.split ? "variation sup ||J(X) - J(X0)|| (value path + logit path)"
             : variation == f.joint ? "variation sup ||J(X) - J(X0)|| (joint block-bound norm)"
             : p == NormKind::kL2   ? "variation sup ||J(X) - J(X0)|| (row and column sums)"
                                    : "variation sup ||J(X) - J(X0)|| (block-row sums)";
  v->variation = UpperBound(variation);
  v->alternatives = {
      {"variation, value path ||dP (x) W|| x LayerNorm factor max_j ell_j", UpperBound(f.value_path)},
      {"variation, logit path and diagonal E_i: ||R diag(ell)||", UpperBound(f.logit_path)},
      {"variation, value path + logit path", UpperBound(f.split)},
      {"variation, joint block-bound norm", UpperBound(f.joint)},
      {p == NormKind::kL2 ? "variation, row and column sums" : "variation, block-row sums", UpperBound(f.schur)},
      {"LayerNorm factor max_j ell_j", UpperBound(ell_max)},
  };
  if (second_order) v->alternatives.push_back({"variation, second order: radius x sup ||D^2 f||", UpperBound(second)});
}
}  // namespace

CentredVariation CentredVariationBound(const AttentionLayer& L, const TokenCover& cover, const BoundOptions& opts,
                                       std::chrono::steady_clock::time_point refine_until, bool up_to_refine_until,
                                       const Eigen::VectorXd* row_weights) {
  const int n = int(cover.center.rows());
  CentredVariation v;
  if (row_weights && (row_weights->size() != n || !(row_weights->array() >= 0).all() || !(row_weights->array() <= 1).all()))
    throw std::invalid_argument("CentredVariationBound: one row weight in [0, 1] per token");
  // Every factor and block bound is in the engine's norm p (its dual q where the factor is
  // a row vector: ||a g^T||_p = ||a||_p ||g||_q), the motions rho in the 2-norm.
  const NormKind p = opts.norm;
  v.in = MhaInputOver(L, cover, p);
  const MhaInput& in = v.in;
  std::vector<HeadGeometry>& geo = v.geo;
  std::vector<FactorBounds>& centre = v.centre;
  const Eigen::VectorXd zero = Eigen::VectorXd::Zero(n);
  // Second order (norm 2): sup ||J_M(z) - J_M(zc)|| <= joint_z sup ||D^2 out||, with
  // ||D^2 out[U, U]|| bounded over the cover by SecondOrderSupUp.
  // (A point set has nothing for it to bound: its only motion is the rounding width of the
  // LayerNorm's output, which the first-order routes carry; at BERT-base size the second
  // order's refinement took the whole window there.)
  const bool point_set = cover.radius.size() == 0 || cover.radius.maxCoeff() == 0;
  const bool second_order = p == NormKind::kL2 && std::isfinite(in.joint_z) && in.joint_z > 0 && !point_set;
  std::vector<FactorBounds> over_cover(second_order ? L.heads : 0);  // per head, for the second order at s = 1
  const bool apart_applies = second_order && L.kind == AttentionKind::kDot && L.heads * L.head_dim_v == L.d_model;
  AttentionLayer own_coordinates;
  HeadsApart apart = HeadsApartOf(L, opts, apart_applies, &own_coordinates);
  geo.assign(L.heads, HeadGeometry{});
  centre.assign(L.heads, FactorBounds{});
  std::vector<HeadShare> shares(L.heads);
  std::atomic<bool> late{false};
  ParallelFor(L.heads, WorkerCount(opts.threads, L.heads), [&](int h, int) {
    if (late || DeadlinePassed(opts)) {
      late = true;
      return;
    }
    geo[h] = HeadGeometryAt(L, h, in.zc, p);
    const FactorBounds F = HeadFactorBounds(geo[h], in.rho_z, in.joint_z, L.causal);
    centre[h] = HeadFactorBounds(geo[h], zero, 0.0, L.causal);
    if (second_order) over_cover[h] = F;
    if (apart_applies) {
      apart.geo[h] = HeadGeometryAt(own_coordinates, h, in.zc, p);
      apart.full[h] = WithValuesOf(apart.geo[h], F, in.rho_z, L.causal);
    }
    if (!HeadShareOver(geo[h], F, centre[h], in, n, L.causal, opts, &shares[h])) late = true;
  });
  if (late) return v;
  const HeadShare summed = SumShares(shares, n);
  const FirstOrderVariation first = FirstOrderVariationUp(summed, in, p, n);
  const double ell_max = in.ell.maxCoeff();
  // T(1) refines its columns, once they start, for at most a fifth of the time left (the
  // nodes: their tenth), and not past refine_until; with up_to_refine_until, for 0.65 of the
  // time left before it (T(1) bounds every node; with the heads apart at BERT-base size its
  // columns took 10.1-10.6 s, and half of the time, 11.0 s, cut them there once in three).
  const auto now = std::chrono::steady_clock::now();
  const ColumnsShare t_one_share = up_to_refine_until ? ColumnsShare{0.65, refine_until} : ColumnsShare{0.2, opts.deadline};
  double second = kInf, second_mean = kInf;
  if (second_order) {
    SecondOrderRoute route = SecondOrderRoute::kChoose;
    const HeadsApart* apart_or_null = apart_applies ? &apart : nullptr;
    const double t_one = SecondOrderSupUp(geo, in, L.causal, 1.0, opts.threads, refine_until, t_one_share, &over_cover,
                                          apart_or_null, &route, row_weights);
    v.heads_apart = route == SecondOrderRoute::kStacked;
    const double t_one_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - now).count();
    const NodeIntegrals integrals = SecondOrderVariationUp(geo, in, L.causal, t_one, t_one_seconds, opts, refine_until,
                                                           up_to_refine_until, apart_or_null, route,
                                                           &v.second_order_nodes, row_weights);
    second = MulUp(ell_max, integrals.variation);
    second_mean = MulUp(ell_max, integrals.mean);
  }
  NameVariation(first, second, second_order, ell_max, p, &v);
  // Both the second order's node mean and the winning route's whole (which bounds the motion
  // at every point of the segment) bound the mean; the second order holds where it lost too.
  v.mean_variation = UpperBound(std::min(second_mean, v.variation.value()));
  if (p == NormKind::kLinf) v.row_variation = RowVariationUp(summed, in, n, v.variation.value());
  v.complete = true;
  return v;
}

NodeIntegrals SecondOrderNodeIntegralsUp(const std::vector<std::pair<double, double>>& nodes, double joint) {
  double sum = 0, mean = 0, prev = 0;
  for (const auto& [s, t] : nodes) {
    sum = AddUp(sum, MulUp(SubUp(s, prev), t));
    // int over (prev, s] of (1 - r) dr = (s - prev) (2 - prev - s) / 2
    mean = AddUp(mean, MulUp(t, DivUp(MulUp(SubUp(s, prev), SubUp(2.0, AddDown(prev, s))), 2.0)));
    prev = s;
  }
  return {MulUp(joint, sum), MulUp(joint, mean)};
}

EngineBound CentredBound(const AttentionLayer& L, const TokenCover& cover, const BoundOptions& opts) {
  const int n = int(cover.center.rows()), d = int(cover.center.cols());
  const std::string refusal = CentredEngineRefusal(L, n, opts);
  if (!refusal.empty()) throw std::invalid_argument("centred engine: " + refusal);
  if (DeadlinePassed(opts)) return TimedOutBound(kEngine);
  if (opts.deadline != std::chrono::steady_clock::time_point::max()) {
    const double left = std::chrono::duration<double>(opts.deadline - std::chrono::steady_clock::now()).count();
    const double predicted = CentredEngineSecondsEstimate(L, n);
    if (predicted > left) {
      EngineBound out = TimedOutBound(kEngine);
      out.note = "centred: predicted " + std::to_string(predicted) + " s, above the " + std::to_string(left) +
                 " s left before the deadline (not started)";
      return out;
    }
  }
  const CentredVariation v = CentredVariationBound(L, cover, opts);
  if (!v.complete) return TimedOutBound(kEngine);
  const MhaInput& in = v.in;
  const double variation = v.variation.value();
  double delta = variation;
  bool timed_out = false;
  const IntervalMatrix jm = DenseMhaJacobian(L, v.geo, opts.threads, v.centre, n, d, opts.deadline, &timed_out);
  if (timed_out) return TimedOutBound(kEngine);
  IntervalMatrix j0 = jm;
  double ln_variation = 0;
  if (in.residual) {
    // + ||J_M(zc)|| max_j ||J_LN(x_j) - J_LN(x0_j)||.
    // (multiplied by a small variation: the crude sqrt(||.||_1 ||.||_inf) bound serves)
    ln_variation = MulUp(NormL2UpperCrude(jm).value(), in.delta_ln.maxCoeff());
    delta = AddUp(delta, ln_variation);
    j0 = ComposeWithLayerNorm(jm, in.ln_jac, opts.threads, n, d, !opts.exclude_residual, opts.deadline, &timed_out);
    if (timed_out) return TimedOutBound(kEngine);
  }
  if (DeadlinePassed(opts)) return TimedOutBound(kEngine);
  const double centre_norm = NormL2UpperInterval(j0).value();
  EngineBound out;
  out.upper = UpperBound(AddUp(centre_norm, delta));
  // upper = centre_norm + (variation + ln_variation), added in this order.
  out.terms.push_back({"centre norm ||J(X0)||", UpperBound(centre_norm)});
  out.terms.push_back({v.route, v.variation});
  if (in.residual)
    out.terms.push_back({"LayerNorm variation ||J_M(zc)|| max_j ||J_LN(x_j) - J_LN(x0_j)||", UpperBound(ln_variation)});
  out.alternatives = v.alternatives;
  return out;
}

UpperBound CentredUpperBound(const AttentionLayer& layer, const TokenCover& cover, const BoundOptions& opts) {
  return CentredBound(layer, cover, opts).upper;
}

RowVariationInf::RowVariationInf(const AttentionLayer& L, const TokenCover& cover, const BoundOptions& opts)
    : layer_(L), threads_(opts.threads) {
  if (opts.norm != NormKind::kLinf) throw std::invalid_argument("RowVariationInf: the inf norm only");
  const int n = int(cover.center.rows());
  in_ = MhaInputOver(L, cover, NormKind::kLinf);
  geo_.assign(L.heads, HeadGeometry{});
  over_.assign(L.heads, FactorBounds{});
  centre_.assign(L.heads, FactorBounds{});
  motion_.assign(L.heads, Eigen::MatrixXd{});
  side_orders_.assign(L.heads, {});
  const Eigen::VectorXd zero = Eigen::VectorXd::Zero(n);
  std::atomic<bool> late{false};
  ParallelFor(L.heads, WorkerCount(opts.threads, L.heads), [&](int h, int) {
    if (late || DeadlinePassed(opts)) {
      late = true;
      return;
    }
    geo_[h] = HeadGeometryAt(L, h, in_.zc, NormKind::kLinf);
    over_[h] = HeadFactorBounds(geo_[h], in_.rho_z, in_.joint_z, L.causal);
    centre_[h] = HeadFactorBounds(geo_[h], zero, 0.0, L.causal);
    motion_[h] = SoftmaxMotionUp(over_[h], centre_[h], n);
    side_orders_[h] = DescendingRowOrders(geo_[h].dot ? geo_[h].db : geo_[h].dg);
  });
  complete_ = !late;
}

double RowVariationInf::RowUp(int i, const Eigen::MatrixXd& wo) const {
  const int n = int(in_.zc.rows());
  if (!complete_ || i < 0 || i >= n) throw std::invalid_argument("RowVariationInf::RowUp: incomplete, or no token i");
  const Eigen::VectorXd zero = Eigen::VectorXd::Zero(n);
  std::vector<HeadShare> shares(layer_.heads);
  ParallelFor(layer_.heads, WorkerCount(threads_, layer_.heads), [&](int h, int) {
    const HeadGeometry G = WithOutputProjection(geo_[h], layer_, h, in_.zc, wo, NormKind::kLinf);
    const FactorBounds F = WithValuesOf(G, over_[h], in_.rho_z, layer_.causal);
    const FactorBounds F0 = WithValuesOf(G, centre_[h], zero, layer_.causal);
    const HeadFactors hf{G, F, F0, DescendingRowOrders(G.du), side_orders_[h]};
    HeadShare& share = shares[h];
    share.full = Eigen::MatrixXd::Zero(n, n);
    share.rd = Eigen::MatrixXd::Zero(n, n);
    share.row_sum = Eigen::VectorXd::Zero(n);
    share.value_row = Eigen::VectorXd::Zero(n);
    AddRowShare(hf, in_, layer_.causal, motion_[h], i, &share);
  });
  return RowVariationOf(SumShares(shares, n), in_, i);
}

}  // namespace lipcert
