// First-order factor bounds over the cover: the values' spreads a_sup and P a, the logit
// factors g_sup and b_sup, the rows' spreads and the attention matrix's norm.
#include "certify/variation/internal.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "certify/layer_norm_cover.h"
#include "interval/elementary.h"
#include "interval/norms.h"
#include "interval/softmax.h"

namespace lipcert {

using namespace variation_internal;

// sum_k P_ik d_jk over the unmasked k, for P_i below p_hi with sum_k P_ik = 1.
static double MeanDistanceUp(const Eigen::MatrixXd& p_hi, const Eigen::MatrixXd& d, int i, int j, int len,
                             const std::vector<std::vector<int>>& d_orders) {
  return SimplexWeightedSumUp(p_hi.row(i).transpose(), d.row(j).transpose(), len, 1.0, d_orders[j]);
}

// Row i, over the cover: how far sum_k P_ik (v_j - v_k) (norm q) can be from the anchor
// sum_k w_ik (m_j - m_k), for rows v_k that move by at most c_move rho_k from the centre's
// enclosure `vals` (m its midpoints, w = G.anchor_w; any weights would do). From
//   sum_k P_k (v_j - v_k) = sum_k w_k (m_j - m_k) + sum_k (P_k - w_k)(m_j - m_k) + sum_k P_k (e_j - e_k),
// ||e_k|| <= delta_k = c_move rho_k + ||radius row k||, the excess of key j is at most
// sum_k max(p_hi - w, w - p_lo)_k dist_jk + delta_j + sup_P sum_k P_k delta_k (dist >= ||m_j - m_k||).
static Eigen::VectorXd AnchorExcessUp(const HeadGeometry& G, const IntervalMatrix& vals, const Eigen::MatrixXd& dist,
                                      double c_move, VectorNorm q, const Eigen::VectorXd& rho, bool causal,
                                      const FactorBounds& F, int i) {
  const int len = causal ? i + 1 : int(rho.size());
  Eigen::VectorXd delta(len), dev(len), out(len);
  for (int k = 0; k < len; ++k) {
    delta(k) = AddUp(MulUp(c_move, rho(k)), NormUpOfMagnitudes(vals.rad.row(k).transpose(), q));
    dev(k) = std::max({0.0, SubUp(F.p_hi(i, k), G.anchor_w(i, k)), SubUp(G.anchor_w(i, k), F.p_lo(i, k))});
  }
  const double moved = SimplexWeightedSumUp(F.p_hi.row(i).head(len).transpose(), delta, len);
  for (int j = 0; j < len; ++j) {
    double e = AddUp(delta(j), moved);
    for (int k = 0; k < len; ++k)
      if (k != j) e = AddUp(e, MulUp(dev(k), dist(j, k)));
    out(j) = e;
  }
  return out;
}

// sup over the cover of ||sum_k P_ik (v_j - v_k)||: the anchor `centre` (AnchoredCentreUp)
// plus AnchorExcessUp. Exact at the centre up to rounding, where the mean distance
// sum_k P_k ||v_j - v_k|| is not.
static Eigen::MatrixXd AnchoredMeanDistanceUp(const HeadGeometry& G, const IntervalMatrix& vals, const Eigen::MatrixXd& centre,
                                              const Eigen::MatrixXd& dist, double c_move, VectorNorm q,
                                              const Eigen::VectorXd& rho, bool causal, const FactorBounds& F) {
  const int n = int(rho.size());
  Eigen::MatrixXd out = Eigen::MatrixXd::Zero(n, n);
  for (int i = 0; i < n; ++i) {
    const Eigen::VectorXd excess = AnchorExcessUp(G, vals, dist, c_move, q, rho, causal, F, i);
    for (Eigen::Index j = 0; j < excess.size(); ++j) out(i, j) = AddUp(centre(i, j), excess(j));
  }
  return out;
}

// The value side of F (a_sup, pa) from G's values, over F's softmax ranges.
static void FillValueSide(const HeadGeometry& G, const Eigen::VectorXd& rho, bool causal, FactorBounds* F) {
  const int n = int(rho.size());
  F->a_sup.resize(n, n);
  F->pa.resize(n, n);
  Eigen::MatrixXd du(n, n);
  for (int j = 0; j < n; ++j)
    for (int k = 0; k < n; ++k) du(j, k) = j == k ? 0.0 : AddUp(G.du(j, k), MulUp(G.c_u, AddUp(rho(j), rho(k))));
  // Row j of du serves every query row i: sorted once.
  const std::vector<std::vector<int>> du_orders = DescendingRowOrders(du);
  // The anchored spreads need the centre's weights for the same mask (HeadGeometryAt's).
  const bool anchored = G.causal == causal && G.anchor_w.rows() == n;
  const Eigen::MatrixXd a_anchored =
      anchored ? AnchoredMeanDistanceUp(G, G.u, G.a_anchor, G.du, G.c_u, G.u_norm, rho, causal, *F)
               : Eigen::MatrixXd::Constant(n, n, kInf);
  for (int i = 0; i < n; ++i) {
    const int len = causal ? i + 1 : n;
    for (int j = 0; j < n; ++j) {
      if (j >= len) {
        F->a_sup(i, j) = F->pa(i, j) = 0;
        continue;
      }
      F->a_sup(i, j) = std::min(MeanDistanceUp(F->p_hi, du, i, j, len, du_orders), a_anchored(i, j));
      // P_ij ||a_ij|| = P_ij ||sum_{k != j} P_ik (u_j - u_k)|| <= P_ij (1 - P_ij) max_{k != j} d_jk.
      const double pq = MaxOfPTimesOneMinusP(F->p_lo(i, j), F->p_hi(i, j));
      F->pa(i, j) = std::min(MulUp(F->p_hi(i, j), F->a_sup(i, j)), MulUp(pq, du.row(j).head(len).maxCoeff()));
    }
  }
}

FactorBounds HeadFactorBounds(const HeadGeometry& G, const Eigen::VectorXd& rho, double joint, bool causal) {
  const int n = int(rho.size());
  FactorBounds F;
  Eigen::MatrixXd lo, hi;
  LogitBox(G, rho, &lo, &hi);
  SoftmaxRows(lo, hi, causal, &F.p_lo, &F.p_hi);
  if (rho.maxCoeff() > 0) TightenByTangent(G, rho, joint, causal, lo, hi, &F);
  // Distances over the cover: the logit side (g, b), then the values'.
  F.g_sup.resize(n, n);
  F.b_sup.resize(n, n);
  Eigen::MatrixXd db(n, n), dg(n, n);
  for (int j = 0; j < n; ++j)
    for (int k = 0; k < n; ++k) {
      db(j, k) = AddUp(G.db(j, k), MulUp(G.c_b, AddUp(rho(j), rho(k))));
      if (!G.dot) dg(j, k) = AddUp(G.dg(j, k), MulUp(G.c_g, AddUp(rho(j), rho(k))));
    }
  for (int j = 0; j < n; ++j) db(j, j) = dg(j, j) = 0;  // a token's distance to itself
  const std::vector<std::vector<int>> db_orders = DescendingRowOrders(db);
  const bool anchored = G.causal == causal && G.anchor_w.rows() == n;
  const Eigen::MatrixXd b_anchored =
      anchored ? AnchoredMeanDistanceUp(G, G.b, G.b_anchor, G.db, G.c_b, G.b_norm, rho, causal, F)
               : Eigen::MatrixXd::Constant(n, n, kInf);
  for (int i = 0; i < n; ++i) {
    const int len = causal ? i + 1 : n;
    for (int j = 0; j < n; ++j) {
      if (j >= len) {
        F.g_sup(i, j) = F.b_sup(i, j) = 0;
        continue;
      }
      const double bmean = std::min(MeanDistanceUp(F.p_hi, db, i, j, len, db_orders), b_anchored(i, j));
      if (G.dot) {
        F.g_sup(i, j) = AddUp(G.g_norm(i), MulUp(G.c_g, rho(i)));
        F.b_sup(i, j) = bmean;
      } else {
        F.g_sup(i, j) = MulUp(2.0, dg(i, j));
        F.b_sup(i, j) = MulUp(2.0, bmean);
      }
    }
  }
  FillValueSide(G, rho, causal, &F);
  return F;
}

FactorBounds WithValuesOf(const HeadGeometry& values, const FactorBounds& F, const Eigen::VectorXd& rho, bool causal) {
  FactorBounds out = F;
  FillValueSide(values, rho, causal, &out);
  return out;
}

// ||P (x) W||_p <= ||P||_p ||W||_p, and P's rows sum to one: ||P||_inf = 1, so also
// ||P||_2 <= sqrt(||P||_inf ||P||_1) <= sqrt(max column sum of p_hi).
double ProbabilityNormUp(const Eigen::MatrixXd& p_hi, NormKind p) {
  if (p != NormKind::kL2) return 1.0;
  double col = 0;
  for (Eigen::Index j = 0; j < p_hi.cols(); ++j) {
    double s = 0;
    for (Eigen::Index i = 0; i < p_hi.rows(); ++i) s = AddUp(s, p_hi(i, j));
    col = std::max(col, s);
  }
  return std::min(NonnegNormUp(p_hi, PrimalNorm(p)), SqrtUp(col));
}

RowSpread RowSpreadUp(const HeadGeometry& G, const FactorBounds& F, const Eigen::VectorXd& rho, int i, int len) {
  const Eigen::VectorXd cap = F.p_hi.row(i).transpose();
  const Eigen::MatrixXd& db0 = G.dot ? G.db : G.dg;
  const double cb = G.dot ? G.c_b : G.c_g;
  RowSpread out;
  Eigen::VectorXd su(len), sb(len);
  for (int m = 0; m < len; ++m) {
    for (int k = 0; k < len; ++k) {
      const double du = AddUp(G.du(k, m), MulUp(G.c_u, rho(k)));
      const double db = AddUp(db0(k, m), MulUp(cb, rho(k)));
      su(k) = MulUp(du, du);
      sb(k) = MulUp(db, db);
    }
    out.a2 = std::min(out.a2, SimplexWeightedSumUp(cap, su, len));
    out.b2 = std::min(out.b2, SimplexWeightedSumUp(cap, sb, len));
  }
  if (!G.dot) out.b2 = MulUp(4.0, out.b2);
  return out;
}

IntervalMatrix AttentionProbabilityEnclosure(const AttentionLayer& layer, const TokenCover& cover, int head) {
  const MhaInput in = MhaInputOver(layer, cover, NormKind::kL2);
  const FactorBounds f = HeadFactorBounds(HeadGeometryAt(layer, head, in.zc, NormKind::kL2), in.rho_z, in.joint_z,
                                          layer.causal);
  return IntervalMatrix::FromBounds(f.p_lo, f.p_hi);
}

}  // namespace lipcert
