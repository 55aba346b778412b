#include "certify/head_factors.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <vector>

#include "certify/centre_norm.h"
#include "certify/layer_norm_cover.h"
#include "interval/elementary.h"
#include "interval/norms.h"
#include "interval/parallel.h"
#include "interval/softmax.h"

namespace lipcert {

// The rounding of the anchor fl(s_i m_j - (w m)_i) (s_i = sum_k w_ik, weights w >= 0, n
// tokens, width d) against its exact value, in a norm: at most 4 gamma_{n+2} (s_i |m_j| +
// (w |m|)_i) entrywise plus underflow, so 4 gamma_{n+2} (s_i ||m_j|| + ||(w |m|)_i||) + (n + 4) d eta.
static double AnchorRoundingUp(double s, double m_norm, double mean_abs_norm, int n, int d) {
  const double g = MulUp(4.0, GammaUp(double(n) + 2));
  return AddUp(MulUp(g, AddUp(MulUp(s, m_norm), mean_abs_norm)), MulUp(double(n + 4) * d, kEta));
}

// ||sum_k w_ik (m_j - m_k)|| (norm q) for the midpoints m of `vals` and the floating weights
// w >= 0, rounded up: the norm of fl(s_i m_j - (w m)_i) plus AnchorRoundingUp.
static Eigen::MatrixXd AnchoredCentreUp(const IntervalMatrix& vals, const Eigen::MatrixXd& w, VectorNorm q) {
  const int n = int(w.rows()), d = int(vals.mid.cols());
  const Eigen::MatrixXd& m = vals.mid;
  const Eigen::MatrixXd m_abs = m.cwiseAbs();
  const Eigen::MatrixXd mean = w * m, mean_abs = w * m_abs;
  const Eigen::VectorXd s = w.rowwise().sum();
  Eigen::VectorXd m_norm(n), mean_abs_norm(n);
  for (int k = 0; k < n; ++k) {
    m_norm(k) = NormUpOfMagnitudes(m_abs.row(k).transpose(), q);
    mean_abs_norm(k) = NormUpOfMagnitudes(mean_abs.row(k).transpose(), q);
  }
  Eigen::MatrixXd out(n, n);
  Eigen::VectorXd v(d);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      v = (s(i) * m.row(j) - mean.row(i)).transpose().cwiseAbs();
      out(i, j) = AddUp(NormUpOfMagnitudes(v, q), AnchorRoundingUp(s(i), m_norm(j), mean_abs_norm(i), n, d));
    }
  return out;
}

GramSpread GramSpreadOf(const IntervalMatrix& g) {
  // For A >= 0, ||A||_2 <= sqrt(||A||_1 ||A||_inf) <= max(||A||_1, ||A||_inf) (a floating
  // Gram need not be exactly symmetric): for rad, and for |mid|.
  const auto larger = [](const Eigen::MatrixXd& a) { return std::max(NormInf(a).value(), Norm1(a).value()); };
  return GramSpread{larger(g.rad), larger(g.mid)};
}

HeadGeometry HeadGeometryAt(const AttentionLayer& L, int h, const Eigen::MatrixXd& zc, NormKind p) {
  HeadGeometry G;
  G.dot = L.kind == AttentionKind::kDot;
  const int n = int(zc.rows());
  const Interval inv_sqrt_dk = Interval(1.0) / Sqrt(Interval(double(L.head_dim_qk)));
  G.inv_sqrt_dk = inv_sqrt_dk;
  const Eigen::MatrixXd wq = L.wq_head(h), wk = L.wk_head(h), wo = L.wo_head(h);
  const Eigen::MatrixXd wv = L.wv_head(h);
  auto add_bias = [n](IntervalMatrix m, const Eigen::VectorXd& bias, int off, int len) {
    if (bias.size() == 0) return m;
    const Eigen::MatrixXd rows = bias.segment(off, len).transpose().replicate(n, 1);
    return m + IntervalMatrix::Point(rows);
  };
  G.q = add_bias(Mul(zc, Eigen::MatrixXd(wq.transpose())), L.bq, h * L.head_dim_qk, L.head_dim_qk);
  // W_h = Wo_h M_h with M_h = Wv_h (dot) or Wv_h Wq_h^T Wq_h / sqrt(dk) (l2).
  IntervalMatrix m_h = IntervalMatrix::Point(wv);
  if (!G.dot) m_h = Scale(inv_sqrt_dk, Mul(Mul(wv, Eigen::MatrixXd(wq.transpose())), IntervalMatrix::Point(wq)));
  G.w = Mul(wo, m_h);
  // u_j = Wo_h (M_h z_j + bv_h) = W_h z_j + Wo_h bv_h.
  G.u = Mul(IntervalMatrix::Point(zc), G.w.transpose());
  if (L.bv.size()) {
    const IntervalMatrix ob = Mul(wo, Eigen::MatrixXd(L.bv.segment(h * L.head_dim_v, L.head_dim_v)));
    G.u = G.u + IntervalMatrix(ob.mid.transpose().replicate(n, 1), ob.rad.transpose().replicate(n, 1));
  }
  G.c_u = OperatorNormFromL2Up(G.w, PrimalNorm(p));
  G.w_norm = OperatorNormUp(G.w, PrimalNorm(p));
  if (G.dot) {
    G.k = add_bias(Mul(zc, Eigen::MatrixXd(wk.transpose())), L.bk, h * L.head_dim_qk, L.head_dim_qk);
    G.logits = Scale(inv_sqrt_dk, Mul(G.q, G.k.transpose()));
    G.g = Scale(inv_sqrt_dk, Mul(G.q, wk));
    G.b = Scale(inv_sqrt_dk, Mul(G.k, wq));
    const IntervalMatrix qk = Scale(inv_sqrt_dk, Mul(Eigen::MatrixXd(wq.transpose()), wk));  // Wq^T Wk / sqrt(dk)
    G.c_logit = NormL2UpperInterval(qk).value();
    G.c_g = OperatorNormFromL2Up(qk.transpose(), DualNorm(p));
    G.c_b = OperatorNormFromL2Up(qk, DualNorm(p));
    G.g_norm.resize(n);
    for (int i = 0; i < n; ++i) G.g_norm(i) = NormUpOfMagnitudes(RowMagnitude(G.g, i), DualNorm(p));
    G.db = PairDistanceUp(G.b, DualNorm(p));
    // Softmax ignores a shift common to a row: s_ij - c.dz_i has the same probabilities,
    // so the logit box only needs ||b_j - c|| (keys often share a large mean component).
    const Eigen::RowVectorXd c = G.b.mid.colwise().mean();
    G.b_shifted_l2.resize(n);
    for (int j = 0; j < n; ++j) {
      Eigen::VectorXd m(G.b.cols());
      for (Eigen::Index a = 0; a < G.b.cols(); ++a)
        m(a) = AddUp(std::max(SubUp(G.b.mid(j, a), c(a)), SubUp(c(a), G.b.mid(j, a))), G.b.rad(j, a));
      G.b_shifted_l2(j) = NormUpOfMagnitudes(m, VectorNorm::kTwo);
    }
  } else {
    G.k = G.q;
    G.g = Scale(inv_sqrt_dk, Mul(G.q, wq));
    G.b = G.g;
    const IntervalMatrix qq = Scale(inv_sqrt_dk, GramEnclosure(wq));  // Wq^T Wq / sqrt(dk)
    G.c_logit = NormL2Upper(wq).value();
    G.c_g = G.c_b = OperatorNormFromL2Up(qq, DualNorm(p));
    G.dq_lo = PairDistanceL2Down(G.q);
    G.dq_hi = PairDistanceUp(G.q, VectorNorm::kTwo);
    G.dg = PairDistanceUp(G.g, DualNorm(p));
    G.db = G.dg;
  }
  G.du = PairDistanceUp(G.u, PrimalNorm(p));
  G.u_norm = PrimalNorm(p);
  G.b_norm = DualNorm(p);
  // The centre's softmax weights (midpoints of the certified ranges) and the spreads at them.
  G.causal = L.causal;
  Eigen::MatrixXd lo0, hi0, w_lo, w_hi;
  LogitBox(G, Eigen::VectorXd::Zero(n), &lo0, &hi0);
  SoftmaxRows(lo0, hi0, L.causal, &w_lo, &w_hi);
  G.anchor_w = 0.5 * (w_lo + w_hi);
  G.a_anchor = AnchoredCentreUp(G.u, G.anchor_w, G.u_norm);
  G.b_anchor = AnchoredCentreUp(G.b, G.anchor_w, G.b_norm);
  if (G.dot && p == NormKind::kL2) {
    // ||W_h U||^2 = y^T (Wo^T Wo) y with y = Wv U: Wo^T Wo = R^T R + Delta for the floating
    // Cholesky factor R (or ||Wo|| I where it fails), so ||W_h U||^2 <= ||R Wv U||^2 +
    // ||Delta||_F ||Wv||^2, and R Wv = A + E with A, E from the enclosure of the product.
    const IntervalMatrix s = GramEnclosure(wo);
    Eigen::MatrixXd r;
    Eigen::LLT<Eigen::MatrixXd> llt(s.mid);
    if (llt.info() == Eigen::Success) {
      r = llt.matrixU();
    } else {
      r = NormL2Upper(wo).value() * Eigen::MatrixXd::Identity(wo.cols(), wo.cols());
    }
    const IntervalMatrix delta = s - Mul(Eigen::MatrixXd(r.transpose()), r);
    const IntervalMatrix a = Mul(r, wv);
    G.value_gram = GramEnclosure(a.mid);
    G.value_norm = NormFrobeniusUpper(a.mid).value();
    G.value_err = NormFrobeniusUpper(a.rad).value();
    const double wv_norm = NormL2Upper(wv).value();
    G.value_iso = MulUp(NormFrobeniusUpper(delta).value(), MulUp(wv_norm, wv_norm));
    G.wq_gram = GramEnclosure(wq);
    G.wk_gram = GramEnclosure(wk);
    G.value_spread = GramSpreadOf(G.value_gram);
    G.wq_spread = GramSpreadOf(G.wq_gram);
    G.wk_spread = GramSpreadOf(G.wk_gram);
    G.wq_norm = NormL2Upper(wq).value();
    G.wk_norm = NormL2Upper(wk).value();
    // The centred midpoints' Grams (ValueQueryCovarianceUp).
    auto centred = [n](const IntervalMatrix& m, Eigen::MatrixXd* gram, Eigen::VectorXd* norms, Eigen::VectorXd* rad_norms) {
      const Eigen::MatrixXd c = m.mid.rowwise() - m.mid.colwise().mean();
      *gram = c * c.transpose();
      norms->resize(n);
      rad_norms->resize(n);
      for (int k = 0; k < n; ++k) {
        (*norms)(k) = AddUp(NormUpOfMagnitudes(c.row(k).cwiseAbs().transpose(), VectorNorm::kTwo), 1e-150);
        (*rad_norms)(k) = NormUpOfMagnitudes(m.rad.row(k).transpose(), VectorNorm::kTwo);
      }
    };
    centred(G.u, &G.u_gram, &G.u_row_norm, &G.u_rad_norm);
    centred(G.b, &G.b_gram, &G.b_row_norm, &G.b_rad_norm);
  }
  return G;
}

// sum_k P_ik d_jk over the unmasked k, for P_i below p_hi with sum_k P_ik = 1.
static double MeanDistanceUp(const Eigen::MatrixXd& p_hi, const Eigen::MatrixXd& d, int i, int j, int len,
                             const std::vector<std::vector<int>>& d_orders) {
  return SimplexWeightedSumUp(p_hi.row(i).transpose(), d.row(j).transpose(), len, 1.0, d_orders[j]);
}

// Logit enclosures [lo, hi] of head G when token j moves by at most rho_j (rho = 0: the
// centre's logits). Dot rows are shifted by c.dz_i, which leaves each softmax row unchanged.
void LogitBox(const HeadGeometry& G, const Eigen::VectorXd& rho, Eigen::MatrixXd* lo, Eigen::MatrixXd* hi) {
  const int n = int(rho.size());
  lo->resize(n, n);
  hi->resize(n, n);
  if (G.dot) {
    // s_ij - c.dz_i - s0_ij = g_i . dz_j + (b_j - c) . dz_i + dz_i^T (Wq^T Wk / sqrt dk) dz_j,
    // and s_ij - c.dz_i has the same softmax row as s_ij.
    for (int i = 0; i < n; ++i) {
      const double gi = NormUpOfMagnitudes(RowMagnitude(G.g, i), VectorNorm::kTwo);
      for (int j = 0; j < n; ++j) {
        const double bj = G.b_shifted_l2(j);
        const double delta = AddUp(AddUp(MulUp(gi, rho(j)), MulUp(bj, rho(i))),
                                   MulUp(G.c_logit, MulUp(rho(i), rho(j))));
        const Interval s0 = G.logits(i, j);
        (*lo)(i, j) = SubDown(s0.lo, delta);
        (*hi)(i, j) = AddUp(s0.hi, delta);
      }
    }
  } else {
    // s_ij = -||q_i - q_j||^2 / sqrt(dk), ||q_i - q_j|| within eta of the centre's distance.
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const double eta = MulUp(G.c_logit, AddUp(rho(i), rho(j)));
        const double dmax = AddUp(G.dq_hi(i, j), eta);
        const double dmin = std::max(0.0, SubDown(G.dq_lo(i, j), eta));
        (*lo)(i, j) = -MulUp(MulUp(dmax, dmax), G.inv_sqrt_dk.hi);
        (*hi)(i, j) = -MulDown(MulDown(dmin, dmin), G.inv_sqrt_dk.lo);
      }
  }
}

// Row-wise softmax ranges of a logit box (0 where masked).
void SoftmaxRows(const Eigen::MatrixXd& lo, const Eigen::MatrixXd& hi, bool causal, Eigen::MatrixXd* p_lo,
                 Eigen::MatrixXd* p_hi) {
  const int n = int(lo.rows());
  *p_lo = Eigen::MatrixXd::Zero(n, n);
  *p_hi = Eigen::MatrixXd::Zero(n, n);
  for (int i = 0; i < n; ++i) {
    const int len = causal ? i + 1 : n;
    const ProbabilityBounds pb = SoftmaxRange(lo.row(i).transpose(), hi.row(i).transpose(), len,
                                              DefaultExpBackend());
    p_lo->row(i) = pb.lo.transpose();
    p_hi->row(i) = pb.hi.transpose();
  }
}

// Tangent-plane softmax ranges when token t moves by at most rho_t and the input by at most
// `joint` in Frobenius norm in all (docs/engines.md, "Tangent-plane probability ranges"). With l_k = s_ik - s0_ik and
// P0 the centre's row, log-sum-exp's convexity gives
//     log P_ij - log P0_ij = L_ij - B_i,   L_ij = l_j - sum_k P0_ik l_k,   0 <= B_i <= range(l)^2 / 8,
// and L_ij is a linear form C_ij . dZ (||C_ij||_F bounded here) plus a quadratic rest.
// Intersects F's ranges with P0 exp(-L - B) <= P <= P0 exp(L).
void TightenByTangent(const HeadGeometry& G, const Eigen::VectorXd& rho, double joint, bool causal,
                      const Eigen::MatrixXd& lo, const Eigen::MatrixXd& hi, FactorBounds* F) {
  const int n = int(rho.size());
  Eigen::MatrixXd s0_lo, s0_hi, p0_lo, p0_hi;
  LogitBox(G, Eigen::VectorXd::Zero(n), &s0_lo, &s0_hi);
  SoftmaxRows(s0_lo, s0_hi, causal, &p0_lo, &p0_hi);
  const IntervalMatrix p0 = IntervalMatrix::FromBounds(p0_lo, p0_hi);
  // dot: row i of C is g_i (1[i=j] - P0_ii) + b_j - bbar_i, row t != i is g_i (1[t=j] - P0_it).
  // l2:  with h_t = -2 (g_i - g_t): row i is 2 (g_j - gbar_i), row t != i is P0_it h_t - 1[t=j] h_j.
  const IntervalMatrix& v = G.dot ? G.b : G.g;
  const IntervalMatrix vbar = Mul(p0, v);
  const Eigen::MatrixXd to_mean = RowDistanceL2Up(v, vbar);  // ||v_j - vbar_i||
  Eigen::MatrixXd dg;
  IntervalMatrix gb, gbbar;  // dot: g_i . b_j and g_i . bbar_k, for ||c g_i + b_j - bbar_i||^2
  if (G.dot) {
    gb = Mul(G.g, G.b.transpose());
    gbbar = Mul(G.g, vbar.transpose());
  } else {
    dg = PairDistanceUp(G.g, VectorNorm::kTwo);
  }
  for (int i = 0; i < n; ++i) {
    const int len = causal ? i + 1 : n;
    const double rho_max = rho.head(len).maxCoeff();
    // range of l_i. over k < len (shift-invariant, so the dot box's shift is harmless).
    double top = -kInf, bottom = kInf;
    for (int k = 0; k < len; ++k) {
      top = std::max(top, SubUp(hi(i, k), s0_lo(i, k)));
      bottom = std::min(bottom, SubDown(lo(i, k), s0_hi(i, k)));
    }
    const double range = SubUp(top, bottom);
    const double bregman = MulUp(0.125, MulUp(range, range));
    // Rows t != i of C have norm |1[t=j] - P0_it| |h_t| (dot: |h_t| = ||g_i||, factored out):
    // sum1 = sum_t P0_it |h_t| rho_t and sum2 = sum_t (P0_it |h_t|)^2 over all t, from which the
    // t = i and t = j terms are replaced below.
    double gn = 0, sum1 = 0, sum2 = 0;
    Interval gg(0.0);         // dot: ||g_i||^2
    if (G.dot) {
      gn = NormUpOfMagnitudes(RowMagnitude(G.g, i), VectorNorm::kTwo);
      for (Eigen::Index a = 0; a < G.g.cols(); ++a) gg += Sqr(G.g(i, a));
    }
    auto weight = [&](int t) { return G.dot ? 1.0 : MulUp(2.0, dg(i, t)); };  // |h_t| (dot: 1)
    for (int t = 0; t < len; ++t) {
      const double x = MulUp(p0_hi(i, t), weight(t));
      sum2 = AddUp(sum2, MulUp(x, x));
      sum1 = AddUp(sum1, MulUp(x, rho(t)));
    }
    for (int j = 0; j < len; ++j) {
      // sum over rows t != i of |row t|^2 and of |row t| rho_t (dot: / ||g_i||^2, / ||g_i||);
      // removing at most the included t = i and t = j terms keeps upper bounds.
      double others = sum2, others1 = sum1;
      const double xi = MulDown(p0_hi(i, i), weight(i));
      others = SubUp(others, MulDown(xi, xi));
      others1 = SubUp(others1, MulDown(xi, rho(i)));
      if (j != i) {
        const double xj = MulDown(p0_hi(i, j), weight(j));
        const double yj = MulUp(SubUp(1.0, p0_lo(i, j)), weight(j));
        others = AddUp(SubUp(others, MulDown(xj, xj)), MulUp(yj, yj));
        others1 = AddUp(SubUp(others1, MulDown(xj, rho(j))), MulUp(yj, rho(j)));
      }
      others = std::max(others, 0.0);
      others1 = std::max(others1, 0.0);
      double row_i, quad_up, quad_down;
      if (G.dot) {
        // ||c g_i + w||, w = b_j - bbar_i, c = 1[i=j] - P0_ii: by the triangle inequality, and
        // expanded as c^2 ||g_i||^2 + 2 c g_i.w + ||w||^2.
        const Interval c = Interval(i == j ? 1.0 : 0.0) - p0(i, i);
        row_i = AddUp(MulUp(c.Mag(), gn), to_mean(i, j));
        const Interval cross = Sqr(c) * gg + Interval(2.0) * c * (gb(i, j) - gbbar(i, i));
        const double expanded = AddUp(cross.hi, MulUp(to_mean(i, j), to_mean(i, j)));
        row_i = std::min(row_i, SqrtUp(std::max(expanded, 0.0)));
        others = MulUp(MulUp(gn, gn), others);
        others1 = MulUp(gn, others1);
        quad_up = quad_down = MulUp(G.c_logit, MulUp(rho(i), AddUp(rho(j), rho_max)));
      } else {
        row_i = MulUp(2.0, to_mean(i, j));
        const double e_up = MulUp(G.c_logit, AddUp(rho(i), rho_max));
        const double e_down = MulUp(G.c_logit, AddUp(rho(i), rho(j)));
        quad_up = MulUp(MulUp(e_up, e_up), G.inv_sqrt_dk.hi);
        quad_down = MulUp(MulUp(e_down, e_down), G.inv_sqrt_dk.hi);
      }
      // |C . dZ| <= ||C||_F ||dZ||_F, and <= sum_t ||C_t|| rho_t (per token).
      const double c_norm = SqrtUp(AddUp(MulUp(row_i, row_i), others));
      const double per_token = AddUp(MulUp(row_i, rho(i)), others1);
      const double lin = std::isfinite(joint) ? std::min(MulUp(joint, c_norm), per_token) : per_token;
      const double up = AddUp(lin, quad_up);
      const double down = AddUp(AddUp(lin, quad_down), bregman);
      F->p_hi(i, j) = std::min(F->p_hi(i, j), MulUp(p0_hi(i, j), ExpUpper(up)));
      F->p_lo(i, j) = std::max(F->p_lo(i, j), MulDown(p0_lo(i, j), ExpLower(-down)));
    }
  }
}

// max of P (1 - P) over lo <= P <= hi (rounded up).
static double MaxOfPTimesOneMinusP(double lo, double hi) {
  const double x = hi < 0.5 ? hi : (lo > 0.5 ? lo : 0.5);
  return MulUp(x, SubUp(1.0, x));
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

// >= sum_j P_ij ||a_ij|| ||b_ij||^power over the cover (power 1 or 2): P_i on the simplex below
// p_hi, ||a_ij|| <= a_sup, ||b_ij|| <= b_sup (the query motion's spread).
static double QueryMomentUp(const FactorBounds& F, int i, int len, int power) {
  Eigen::VectorXd c(len);
  for (int j = 0; j < len; ++j) {
    c(j) = MulUp(F.a_sup(i, j), F.b_sup(i, j));
    if (power == 2) c(j) = MulUp(c(j), F.b_sup(i, j));
  }
  return SimplexWeightedSumUp(F.p_hi.row(i).head(len).transpose(), c, len);
}

// max of P (1 - 2P)^+ over lo <= P <= hi (rounded up; its peak is 1/8 at P = 1/4).
static double MaxOfPTimesOneMinusTwoP(double lo, double hi) {
  const double x = std::clamp(0.25, lo, hi);
  return x >= 0.5 ? 0.0 : MulUp(x, SubUp(1.0, MulDown(2.0, x)));
}

SecondOrderHead SecondOrderHeadUp(const HeadGeometry& G, const FactorBounds& F, const Eigen::VectorXd& rho,
                                  bool causal) {
  const int n = int(rho.size());
  SecondOrderHead out;
  out.forms.resize(n);
  double cross = 0;
  for (int i = 0; i < n; ++i) {
    const int len = causal ? i + 1 : n;
    const Eigen::VectorXd cap = F.p_hi.row(i).head(len).transpose(), a = F.a_sup.row(i).head(len).transpose();
    const double beta = SqrtUp(RowSpreadUp(G, F, rho, i, len).b2);
    const double a_max = a.maxCoeff();
    // The keys' logit motion y_k = g_ik . U_k: |y_k| <= gamma_k sqrt(t_k) (dot: g_ik = g_i).
    Eigen::VectorXd gamma2(len);
    for (int k = 0; k < len; ++k) gamma2(k) = MulUp(F.g_sup(i, k), F.g_sup(i, k));
    const double gamma_max = F.g_sup.row(i).head(len).maxCoeff();
    // a_bar >= sum_j P_ij ||a_ij||, ab2 >= sum_j P_ij ||a_ij|| ||b_ij||^2.
    const double a_bar = SimplexWeightedSumUp(cap, a, len);
    const double ab2 = std::min(QueryMomentUp(F, i, len, 2), MulUp(a_max, MulUp(beta, beta)));
    // Var_i(y) <= sum_j P_ij y_j^2, and also <= 2 sum_j P_ij (1 - P_ij) y_j^2 (from
    // Var = 1/2 sum_jk P_ij P_ik (y_j - y_k)^2); the row takes the smaller weights.
    Eigen::VectorXd w_p = cap, w_q(len);
    for (int j = 0; j < len; ++j) w_q(j) = MulUp(2.0, MaxOfPTimesOneMinusP(F.p_lo(i, j), F.p_hi(i, j)));
    const Eigen::VectorXd& w = w_q.sum() < w_p.sum() ? w_q : w_p;
    // T1's key part, signed: sum_j P_j a_j (y_j - ybar)^2 <= sum_k P_k (2 ||a_k|| (1 - 2P_k)^+ + a_bar) y_k^2;
    // unsigned (for the cross term): sum_j P_j ||a_j|| (y_j - ybar)^2 <= sum_k P_k (2 ||a_k|| + 2 a_bar) y_k^2,
    // or A_i Var_i(y) <= A_i sum_k W_k y_k^2, whichever the row finds smaller.
    Eigen::VectorXd signed_k(len), unsigned_1(len), unsigned_2(len);
    for (int k = 0; k < len; ++k) {
      signed_k(k) = AddUp(MulUp(MulUp(2.0, a(k)), MaxOfPTimesOneMinusTwoP(F.p_lo(i, k), F.p_hi(i, k))), MulUp(cap(k), a_bar));
      unsigned_1(k) = MulUp(cap(k), MulUp(2.0, AddUp(a(k), a_bar)));
      unsigned_2(k) = MulUp(a_max, w(k));
    }
    const Eigen::VectorXd& unsigned_k = unsigned_1.sum() < unsigned_2.sum() ? unsigned_1 : unsigned_2;
    // T2 <= 2 ||W_h|| sqrt(Var) sqrt(sum_k W_k t_k) with sqrt(Var) <= beta sqrt(t_i) + sqrt(sum_k W_k gamma_k^2 t_k):
    // <= ||W_h|| beta (t_i + W t) + ||W_h|| sum_k W_k (gamma_k^2 / gamma_max + gamma_max) t_k.
    const double t2_diag = MulUp(G.w_norm, beta);
    Eigen::VectorXd t2_off(len);
    for (int k = 0; k < len; ++k) {
      const double g_part = gamma_max > 0 ? AddUp(DivUp(gamma2(k), gamma_max), gamma_max) : 0.0;
      t2_off(k) = MulUp(MulUp(G.w_norm, AddUp(beta, g_part)), w(k));
    }
    // T3 = sum_j P_ij a_ij e_ij with e_ij the logits' second derivative. Dot: 2 U_i^T Wq^T Wk U_j / sqrt(dk),
    // a cross term below. L2: -2 ||Wq (U_i - U_j)||^2 / sqrt(dk), |e_ij| <= 4 c_g (t_i + t_j), linear in t.
    Eigen::VectorXd t3_row = Eigen::VectorXd::Zero(len);
    if (!G.dot) {
      double pa_sum = 0;
      for (int j = 0; j < len; ++j) {
        t3_row(j) = MulUp(MulUp(4.0, G.c_g), F.pa(i, j));
        pa_sum = AddUp(pa_sum, F.pa(i, j));
      }
      t3_row(i) = AddUp(t3_row(i), MulUp(MulUp(4.0, G.c_g), pa_sum));
    }
    // Row i of L, from one of two bounds on T1 (SecondOrderColumnsUp picks one form per row):
    //  - split: sum_j P_j a_j delta_j^2 with delta = delta_q + delta_k (query and key motion),
    //    (1 + theta) ab2 t_i + sum_k gamma_k^2 (signed_k + unsigned_k / theta) t_k;
    //  - whole: A_i Var_i(ds) <= 2 A_i beta^2 t_i + 2 A_i sum_k W_k gamma_k^2 t_k.
    Eigen::MatrixXd& forms = out.forms[i];
    forms = Eigen::MatrixXd::Zero(5, n);
    int f = 0;
    for (const double theta : {-1.0, 0.5, 1.0, 2.0, 4.0}) {  // -1: the whole bound
      Eigen::VectorXd row(len);
      double diag;
      if (theta < 0) {
        for (int k = 0; k < len; ++k) row(k) = MulUp(MulUp(2.0, a_max), MulUp(gamma2(k), w(k)));
        diag = MulUp(MulUp(2.0, a_max), MulUp(beta, beta));
      } else {
        for (int k = 0; k < len; ++k) row(k) = MulUp(gamma2(k), AddUp(signed_k(k), DivUp(unsigned_k(k), theta)));
        diag = MulUp(1.0 + theta, ab2);
      }
      for (int k = 0; k < len; ++k) row(k) = AddUp(AddUp(row(k), t2_off(k)), t3_row(k));
      row(i) = AddUp(row(i), AddUp(diag, t2_diag));
      forms.row(f++).head(len) = row.transpose();
    }
    if (G.dot) {
      double pa2 = 0;
      for (int j = 0; j < len; ++j) pa2 = AddUp(pa2, MulUp(F.pa(i, j), F.pa(i, j)));
      cross = std::max(cross, SqrtUp(pa2));
    }
  }
  // Dot: ||T3_i|| <= 2 c_b sqrt(t_i) sum_j pa_ij sqrt(t_j), whose norm over i is at most
  // 2 c_b max_i ||row i of pa||_2.
  out.cross = G.dot ? MulUp(MulUp(2.0, G.c_b), cross) : 0.0;
  return out;
}

double ValueQueryCovarianceUp(const HeadGeometry& G, const FactorBounds& F, const Eigen::VectorXd& rho, int i,
                              int len) {
  const int n = int(rho.size());
  if (!G.dot || G.u_gram.rows() != n || G.anchor_w.rows() != n || len != (G.causal ? i + 1 : n)) return kInf;
  // C = sum_k P_k (u_k - ubar)(b_k - bbar)^T = sum_k P_k X_k Y_k^T - (sum_k P_k X_k)(sum_k P_k Y_k)^T for
  // X_k = u_k - c, Y_k = b_k - c' and any c, c' (sum_k P_k = 1). Take c, c' the exact means of the
  // midpoints m under the centre's weights w (s = sum w), X_k = X0_k + e_k with X0_k = m_k - c,
  // ||e_k|| <= eu_k = ||radius of u_k|| + c_u rho_k (the same for Y with c_b), and P = w + Delta,
  // |Delta_k| <= dev_k. Since sum_k w_k X0_k = 0,
  //   ||C|| <= ||sum_k w_k X0_k Y0_k^T|| + sum_k dev_k ||X0_k|| ||Y0_k||
  //            + sup_P sum_k P_k (eu_k ||Y0_k|| + ||X0_k|| eb_k + eu_k eb_k) + xbar ybar,
  // xbar >= ||sum_k P_k X_k|| <= sup_P sum_k P_k eu_k + sum_k dev_k ||X0_k|| (the same for ybar).
  const Eigen::VectorXd w = G.anchor_w.row(i).head(len).transpose();
  const double s = w.sum();
  if (!(s > 0) || !w.allFinite()) return kInf;
  const double s_lo = MulDown(s, SubDown(1.0, GammaUp(double(len) + 1))), s_hi = MulUp(s, AddUp(1.0, GammaUp(double(len) + 1)));
  // The first term: sum_k w_k X0_k Y0_k^T = U~^T K B~ - (rounding of U~, B~) with K = W - w w^T / s
  // (K kills any shift: 1^T K = 0), and ||U~^T K B~||_F^2 = tr(K Ga K Gb) =
  //   sum_kl w_k w_l Ga_kl Gb_kl - (2 / s) sum_k w_k (Ga w)_k (Gb w)_k + (w^T Ga w)(w^T Gb w) / s^2
  // for the exact Grams Ga, Gb of the floating U~, B~. |fl(Ga) - Ga| <= gamma_D na na^T (na: the
  // rows' norms, their floor covering underflow), |Ga| <= na na^T, so with Tm the same sum at
  // na na^T, nb nb^T with every term's absolute value, fl(Ga), fl(Gb) and the floating sum are
  // off by at most (3 gamma_D + 2 gamma_T) Tm (T: the sum's terms and the roundings of s), here x4.
  const Eigen::MatrixXd ga = G.u_gram.topLeftCorner(len, len), gb = G.b_gram.topLeftCorner(len, len);
  const Eigen::VectorXd gaw = ga * w, gbw = gb * w;
  const double t1 = (w.asDiagonal() * ga.cwiseProduct(gb) * w.asDiagonal()).sum();
  const double t2 = (w.array() * gaw.array() * gbw.array()).sum();
  const double f = t1 - 2 * t2 / s + w.dot(gaw) * w.dot(gbw) / (s * s);
  const Eigen::VectorXd na = G.u_row_norm.head(len), nb = G.b_row_norm.head(len);
  const double wna = w.dot(na), wnb = w.dot(nb), wnanb = (w.array() * na.array() * nb.array()).sum();
  const double tm = (wnanb * wnanb + 2 * wna * wnb * wnanb / s + wna * wna * wnb * wnb / (s * s)) *
                    (1 + GammaUp(4.0 * len + 20));
  const double dims = double(std::max(G.u.mid.cols(), G.b.mid.cols()));
  const double g = AddUp(MulUp(3.0, GammaUp(dims)), MulUp(2.0, GammaUp(double(len) * len + 2.0 * len + 20)));
  const double main_f = SqrtUp(std::max(0.0, AddUp(AddUp(f, MulUp(MulUp(4.0, g), tm)), 1e-300)));
  // The cover's terms, per key: ||X0_k|| <= a_anchor / s (a_anchor >= ||s m_k - sum_l w_l m_l||).
  Eigen::VectorXd nu(len), nbr(len), eu(len), eb(len), dev(len), c(len);
  for (int k = 0; k < len; ++k) {
    nu(k) = DivUp(G.a_anchor(i, k), s_lo);
    nbr(k) = DivUp(G.b_anchor(i, k), s_lo);
    eu(k) = AddUp(G.u_rad_norm(k), MulUp(G.c_u, rho(k)));
    eb(k) = AddUp(G.b_rad_norm(k), MulUp(G.c_b, rho(k)));
    dev(k) = std::max({0.0, SubUp(F.p_hi(i, k), w(k)), SubUp(w(k), F.p_lo(i, k))});
    c(k) = AddUp(AddUp(MulUp(eu(k), nbr(k)), MulUp(nu(k), eb(k))), MulUp(eu(k), eb(k)));
  }
  if (!nu.allFinite() || !nbr.allFinite()) return kInf;
  const Eigen::VectorXd cap = F.p_hi.row(i).head(len).transpose();
  double spread = 0, xbar = SimplexWeightedSumUp(cap, eu, len), ybar = SimplexWeightedSumUp(cap, eb, len);
  for (int k = 0; k < len; ++k) {
    spread = AddUp(spread, MulUp(dev(k), MulUp(nu(k), nbr(k))));
    xbar = AddUp(xbar, MulUp(dev(k), nu(k)));
    ybar = AddUp(ybar, MulUp(dev(k), nbr(k)));
  }
  // U~ and B~ against the exact differences: |fl(m - c) - (m - c)| <= 2u |fl(m - c)| entrywise, and
  // ||sum_k w_k (d_k - dbar) Y_k^T|| (and the same with X) with ||d_k - dbar|| <= 4u max na:
  // at most 8u s (max na (max nbr + max nb) + max nb (max nu + max na)), generously.
  const double na_max = na.maxCoeff(), nb_max = nb.maxCoeff();
  const double rounding = MulUp(MulUp(8 * kUnitRoundoff, s_hi), AddUp(MulUp(na_max, AddUp(nbr.maxCoeff(), nb_max)),
                                                                       MulUp(nb_max, AddUp(nu.maxCoeff(), na_max))));
  return AddUp(AddUp(AddUp(main_f, rounding), AddUp(spread, SimplexWeightedSumUp(cap, c, len))), MulUp(xbar, ybar));
}

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

// >= ||x||_2 (NormUpOfMagnitudes: one floating sum of squares with a gamma_d bound).
static double NormUp(const Eigen::RowVectorXd& x) {
  return NormUpOfMagnitudes(x.cwiseAbs().transpose(), VectorNorm::kTwo);
}

OwnRowForm OwnRowFormUp(const HeadGeometry& G, const FactorBounds& F, const Eigen::VectorXd& rho, bool causal, int i) {
  const int n = int(rho.size()), d = int(G.b.mid.cols());
  const int len = causal ? i + 1 : n;
  OwnRowForm out;
  if (!G.dot || G.anchor_w.rows() != n || G.causal != causal || !std::isfinite(G.value_iso)) {
    out.iso = kInf;  // no form: the scalar bound stands
    return out;
  }
  // Token i moves by U alone. Row i's logit motion is delta_k = b_k . U + [k = i] g_i . U, so
  // delta_k - delta_bar = r_k . U with r_k = (b_k - bbar_i) + gamma_k g_i, gamma_k = [k = i] - P_i,
  // and the row's second derivative is
  //   T1 = sum_k P_k a_k (r_k . U)^2,   T2 = 2 P_i (r_i . U) W_h U,   T3 = 2 P_i a_i (Wq U).(Wk U) / sqrt(dk),
  // so ||d^2 out_i|| <= sum_k pa_k (r_k . U)^2 + p_i (theta2 (r_i . U)^2 + ||W_h U||^2 / theta2)
  //                     + pa_i / sqrt(dk) (theta3 ||Wq U||^2 + ||Wk U||^2 / theta3).
  // Over the cover, r_k . U = x . U + y + m + z with x = fl(rhat_k) at the centre's weights w,
  //  - y = -(P_i - w_i) g_i0 . U: |y| <= dp |g_i0 . U| (one direction for all k),
  //  - m: the motion, b_k - b_l = Wq^T Wk (z_k - z_l) / sqrt(dk) and g_i = Wk^T Wq z_i / sqrt(dk) + ...,
  //    so |m| <= (||Wk|| (rho_k + sum_l P_l rho_l) ||Wq U|| + |gamma_k| ||Wq|| rho_i ||Wk U||) / sqrt(dk),
  //  - z: the rest, |z| <= e (the anchor's rounding, sum_l (P_l - w_l)(b_k - b_l) at the centre, the
  //    enclosures' radii),
  // and (sum of parts)^2 <= sum part^2 / a_part for a_part >= 0 summing to 1, each a_part in
  // proportion to its norm. The g, Wq and Wk parts of all rows (and T3) share their rows.
  const Eigen::MatrixXd& m = G.b.mid;
  const Eigen::RowVectorXd w = G.anchor_w.row(i).head(len);
  const double s = w.sum();
  const Eigen::RowVectorXd mean = w * m.topRows(len), mean_abs = w * m.topRows(len).cwiseAbs();
  const double mean_abs_norm = NormUp(mean_abs);
  const Eigen::RowVectorXd g = G.g.mid.row(i);
  const double g_norm = NormUp(g);
  const double g_rad = NormUp(G.g.rad.row(i));
  // |gamma_k - ([k = i] - w_i)| <= dp, and |gamma_k| <= 1 - p_lo (k = i) or p_hi (k != i).
  const double dp = std::max({0.0, SubUp(F.p_hi(i, i), w(i)), SubUp(w(i), F.p_lo(i, i))});
  const double p_i = F.p_hi(i, i);
  const double inv_sqrt_dk = G.inv_sqrt_dk.hi;
  // The centre's parts of the anchor's excess: radii (each and their mean) and the weights' range.
  Eigen::VectorXd b_rad(len), dev(len);
  for (int k = 0; k < len; ++k) {
    b_rad(k) = NormUp(G.b.rad.row(k));
    dev(k) = std::max({0.0, SubUp(F.p_hi(i, k), w(k)), SubUp(w(k), F.p_lo(i, k))});
  }
  Eigen::VectorXd m_norm(len);
  for (int l = 0; l < len; ++l) m_norm(l) = NormUp(m.row(l));
  const Eigen::VectorXd cap = F.p_hi.row(i).head(len).transpose();
  const double rad_moved = SimplexWeightedSumUp(cap, b_rad, len);
  const double rho_moved = SimplexWeightedSumUp(cap, rho.head(len), len);
  const double key_move = MulUp(G.wk_norm, inv_sqrt_dk), query_move = MulUp(G.wq_norm, inv_sqrt_dk);
  // The weights' range: sum_l (P_l - w_l)(b_k - b_l) = (1 - s)(b_k - c) - eps with
  // eps = sum_l (P_l - w_l)(b_l - c) . U the same for every k, c = (w m) / s, and
  // eps^2 <= (sum_l dev_l) sum_l dev_l (fl(b_l - c) . U)^2 plus its rounding (into z).
  const Eigen::RowVectorXd c_mean = mean / s;
  Eigen::MatrixXd centred(len, d);
  Eigen::VectorXd centred_err(len), centred_norm(len);
  double dev_sum = 0, eps_norm = 0, eps_rounding = 0;
  for (int l = 0; l < len; ++l) {
    centred.row(l) = m.row(l) - c_mean;
    const double f = centred_norm(l) = NormUp(centred.row(l));
    // fl(m_l - c) against m_l - exact c: c's own rounding (division and the product's, gamma_{n+1})
    // and the subtraction's, generously.
    centred_err(l) = AddUp(MulUp(2 * kUnitRoundoff, AddUp(f, m_norm(l))),
                           MulUp(MulUp(2.0, GammaUp(double(len) + 2)), DivUp(mean_abs_norm, s * (1 - 1e-15))));
    dev_sum = AddUp(dev_sum, dev(l));
    eps_norm = AddUp(eps_norm, MulUp(dev(l), f));
    eps_rounding = AddUp(eps_rounding, MulUp(dev(l), centred_err(l)));
  }
  const double one_minus_s = std::max(SubUp(1.0, s), SubUp(s, 1.0));
  double eps_weight = 0;
  const double value_norm = G.value_norm;
  out.rows.resize(len + 1 + len, d);
  double err2 = 0;
  // Appends sqrt(c) x as a row (its product rounding, u per entry, goes into err).
  int row = 0;
  auto add_row = [&](double c, const Eigen::RowVectorXd& x) {
    out.rows.row(row) = SqrtUp(c) * x;
    const double row_norm = NormUp(out.rows.row(row));
    err2 = AddUp(err2, MulUp(MulUp(row_norm, kUnitRoundoff), MulUp(row_norm, kUnitRoundoff)));
    ++row;
  };
  double g_weight = 0, q_weight = 0, k_weight = 0;  // the shared rows' weights
  // Each row's parts: x (floating), and the scales of y along g, m along Wq U and Wk U, eps along
  // the centred rows and z (isotropic).
  struct Parts {
    Eigen::RowVectorXd x;
    double x_norm = 0, y_norm = 0, mq = 0, mk = 0, mq_norm = 0, mk_norm = 0, e = 0, total = 0;
  };
  std::vector<Parts> parts(len);
  for (int k = 0; k < len; ++k) {
    Parts& P = parts[k];
    const double gamma = (k == i ? 1.0 : 0.0) - w(i);
    const Eigen::RowVectorXd beta = s * m.row(k) - mean;
    P.x = beta + gamma * g;
    const double beta_norm = NormUp(beta);
    P.x_norm = NormUp(P.x);
    // z: the anchor's rounding, gamma g's rounding (product and sum: 2u each, generously), the
    // radii of b_k, of the mean and of g_i, and eps's and (1 - s)'s shares.
    double e = AddUp(AnchorRoundingUp(s, m_norm(k), mean_abs_norm, n, d),
                     MulUp(4 * kUnitRoundoff, AddUp(beta_norm, MulUp(std::abs(gamma), g_norm))));
    const double gamma_max = k == i ? SubUp(1.0, F.p_lo(i, i)) : p_i;
    e = AddUp(e, AddUp(AddUp(b_rad(k), rad_moved), MulUp(gamma_max, g_rad)));
    P.e = AddUp(e, AddUp(MulUp(one_minus_s, AddUp(centred_norm(k), centred_err(k))), eps_rounding));
    P.y_norm = MulUp(dp, g_norm);
    P.mq = MulUp(key_move, AddUp(rho(k), rho_moved));
    P.mk = MulUp(MulUp(gamma_max, query_move), rho(i));
    P.mq_norm = MulUp(P.mq, G.wq_norm);
    P.mk_norm = MulUp(P.mk, G.wk_norm);
    P.total = AddUp(AddUp(AddUp(P.x_norm, P.y_norm), AddUp(P.mq_norm, P.mk_norm)), AddUp(P.e, eps_norm));
  }
  // T2's split: theta2 balances r_i's scale against ||W_h|| (any theta2 > 0 holds).
  const double theta2 = parts[i].total > 0 && G.w_norm > 0 ? G.w_norm / parts[i].total : 1.0;
  for (int k = 0; k < len; ++k) {
    const Parts& P = parts[k];
    const double c = k == i ? AddUp(F.pa(i, k), MulUp(theta2, p_i)) : F.pa(i, k);
    if (P.x_norm > 0) {
      add_row(MulUp(c, DivUp(P.total, P.x_norm)), P.x);
    } else {
      out.rows.row(row++).setZero();
    }
    if (P.y_norm > 0) g_weight = AddUp(g_weight, MulUp(MulUp(c, MulUp(dp, dp)), DivUp(P.total, P.y_norm)));
    if (P.mq_norm > 0) q_weight = AddUp(q_weight, MulUp(MulUp(c, MulUp(P.mq, P.mq)), DivUp(P.total, P.mq_norm)));
    if (P.mk_norm > 0) k_weight = AddUp(k_weight, MulUp(MulUp(c, MulUp(P.mk, P.mk)), DivUp(P.total, P.mk_norm)));
    if (eps_norm > 0) eps_weight = AddUp(eps_weight, MulUp(c, DivUp(P.total, eps_norm)));
    if (P.e > 0) out.iso = AddUp(out.iso, MulUp(c, MulUp(P.e, P.total)));
  }
  add_row(g_weight, g);
  for (int l = 0; l < len; ++l) add_row(MulUp(MulUp(eps_weight, dev_sum), dev(l)), centred.row(l));
  // T2's values: (p_i / theta2) ((||A U|| + value_err)^2 + value_iso), the same split.
  const double c2 = DivUp(p_i, theta2 * (1 - 1e-15));
  out.iso = AddUp(out.iso, MulUp(c2, G.value_iso));
  const double value_total = AddUp(value_norm, G.value_err);
  if (value_norm > 0) out.value_weight = MulUp(c2, DivUp(value_total, value_norm));
  out.iso = AddUp(out.iso, MulUp(c2, MulUp(G.value_err, value_total)));
  // T3 (theta3 balancing the weights' norms), with the motion's shares: the exact weights.
  const double c3 = MulUp(F.pa(i, i), inv_sqrt_dk);
  const double theta3 = G.wq_norm > 0 && G.wk_norm > 0 ? G.wk_norm / G.wq_norm : 1.0;
  out.q_weight = AddUp(q_weight, MulUp(c3, theta3));
  out.k_weight = AddUp(k_weight, DivUp(c3, theta3 * (1 - 1e-15)));
  out.err = MulUp(SqrtUp(err2), 1.0 + 1e-10);
  return out;
}

double OwnRowUp(const std::vector<HeadGeometry>& geo, const std::vector<FactorBounds>& factors,
                const Eigen::VectorXd& rho, bool causal, int j, int threads) {
  const int heads = int(geo.size());
  std::vector<OwnRowForm> forms(heads);
  ParallelFor(heads, WorkerCount(threads, heads),
              [&](int h, int) { forms[h] = OwnRowFormUp(geo[h], factors[h], rho, causal, j); });
  Eigen::Index rows = 0;
  for (const OwnRowForm& f : forms) {
    if (!std::isfinite(f.iso)) return kInf;  // a head without a form: nothing to refine
    rows += f.rows.rows();
  }
  Eigen::MatrixXd stacked(rows, geo[0].b.mid.cols());
  double err2 = 0, iso = 0;
  rows = 0;
  for (const OwnRowForm& f : forms) {
    if (f.rows.rows() > 0) stacked.middleRows(rows, f.rows.rows()) = f.rows;
    rows += f.rows.rows();
    err2 = AddUp(err2, MulUp(f.err, f.err));
    iso = AddUp(iso, f.iso);
  }
  // U^T S U with S = the stacked rows' Gram and the heads' weighted fixed Grams; the rows'
  // rounding err: (||rows U|| + err)^2 <= (1 + phi) ||rows U||^2 + (1 + 1/phi) err^2.
  constexpr double kPhi = 1e-6;
  // The rows' Gram in one floating product (the lower triangle by a symmetric rank-k update,
  // mirrored): |fl(S^T S) - S^T S|_ab <= gamma_k sum_r |s_ra||s_rb| <= gamma_k ||col a|| ||col b||
  // (k rows), plus k eta for underflow, so that enclosure's radius has rho <= gamma_k ||col||^2
  // + D k eta, and |mid| <= ||col a|| ||col b|| + rad.
  const Eigen::Index d = stacked.cols();
  Eigen::MatrixXd mid = Eigen::MatrixXd::Zero(d, d);
  mid.selfadjointView<Eigen::Lower>().rankUpdate(stacked.transpose());
  mid.triangularView<Eigen::StrictlyUpper>() = mid.transpose();
  double col2 = 0;
  for (Eigen::Index a = 0; a < d; ++a) {
    const double c = NormUp(stacked.col(a).transpose());
    col2 = AddUp(col2, MulUp(c, c));
  }
  const double k = double(stacked.rows());
  const double rows_rad = AddUp(MulUp(GammaUp(k), col2), MulUp(double(d), MulUp(k, kEta)));
  std::vector<std::pair<double, GramSpread>> spreads = {{1.0 + kPhi, GramSpread{rows_rad, AddUp(col2, rows_rad)}}};
  mid *= 1.0 + kPhi;  // its rounding is the sum's (below)
  // The heads' fixed Grams with their weights c >= 0 (NaN: no bound), added column by column
  // (a column's sum stays in cache while the terms are added).
  std::vector<std::pair<double, const IntervalMatrix*>> fixed;
  for (int h = 0; h < heads; ++h) {
    fixed.push_back({forms[h].value_weight, &geo[h].value_gram});
    fixed.push_back({forms[h].q_weight, &geo[h].wq_gram});
    fixed.push_back({forms[h].k_weight, &geo[h].wk_gram});
    spreads.push_back({forms[h].value_weight, geo[h].value_spread});
    spreads.push_back({forms[h].q_weight, geo[h].wq_spread});
    spreads.push_back({forms[h].k_weight, geo[h].wk_spread});
  }
  for (const auto& [c, g] : fixed)
    if (std::isnan(c)) return kInf;
  for (Eigen::Index col = 0; col < d; ++col)
    for (const auto& [c, g] : fixed)
      if (c > 0) mid.col(col) += c * g->mid.col(col);
  // S = mid + E with E symmetric: |E| <= sum_t c_t rad_t + gamma sum_t c_t |mid_t| (the weighted
  // sum's rounding, T terms and the products: gamma_{2T+4}, generously), so by Weyl
  // lambda_max(S) <= lambda_max(mid) + ||E||_2, ||E||_2 <= sum_t c_t (rho(rad_t) + gamma || |mid_t| ||_2).
  const double g = GammaUp(2.0 * double(spreads.size()) + 4);
  double spread = 0;
  for (const auto& [c, s] : spreads)
    if (c > 0) spread = AddUp(spread, MulUp(c, AddUp(s.rad, MulUp(g, s.abs_mid))));
  const double lambda = LambdaMaxUpper(IntervalMatrix::Point(mid)).value();
  return AddUp(AddUp(lambda, spread), AddUp(iso, MulUp(1.0 + 1.0 / kPhi, err2)));
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

double SecondOrderColumnsUp(const std::vector<SecondOrderHead>& heads) {
  const int h_count = int(heads.size());
  if (h_count == 0) return 0.0;
  const int n = int(heads[0].forms.size());
  // pick[h][i]: the form of row i of head h; col2[h](j): sum_i L_h(i, j)^2 in floating point.
  std::vector<std::vector<int>> pick(h_count, std::vector<int>(n, 0));
  std::vector<Eigen::VectorXd> col2(h_count, Eigen::VectorXd::Zero(n));
  for (int h = 0; h < h_count; ++h)
    for (int i = 0; i < n; ++i) {
      Eigen::Index best;
      heads[h].forms[i].rowwise().squaredNorm().minCoeff(&best);
      pick[h][i] = int(best);
      col2[h] += heads[h].forms[i].row(best).transpose().cwiseAbs2();
    }
  // The bound from the picks, rounded up.
  auto bound = [&]() {
    Eigen::VectorXd columns = Eigen::VectorXd::Zero(n);
    double cross = 0;
    for (int h = 0; h < h_count; ++h) {
      for (int j = 0; j < n; ++j) {
        double s = 0;
        for (int i = 0; i < n; ++i) {
          const double v = heads[h].forms[i](pick[h][i], j);
          s = AddUp(s, MulUp(v, v));
        }
        columns(j) = AddUp(columns(j), SqrtUp(s));
      }
      cross = AddUp(cross, heads[h].cross);
    }
    return AddUp(columns.maxCoeff(), cross);
  };
  double best = bound();
  if (!std::isfinite(best)) return best;
  // Second start: each row's form by its sum of squares weighted by (column sum / largest)^8
  // of the first picks; the descent starts from the better of the two.
  {
    Eigen::VectorXd sums = Eigen::VectorXd::Zero(n);
    for (int h = 0; h < h_count; ++h) sums += col2[h].cwiseSqrt();
    const Eigen::VectorXd weight = (sums / sums.maxCoeff()).array().pow(8.0).matrix();
    const auto first_pick = pick;
    const auto first_col2 = col2;
    for (int h = 0; h < h_count; ++h) {
      col2[h].setZero();
      for (int i = 0; i < n; ++i) {
        Eigen::Index f;
        (heads[h].forms[i].cwiseAbs2() * weight).minCoeff(&f);
        pick[h][i] = int(f);
        col2[h] += heads[h].forms[i].row(f).transpose().cwiseAbs2();
      }
    }
    const double second = bound();
    if (second < best) {
      best = second;
    } else {
      pick = first_pick;
      col2 = first_col2;
    }
  }
  // Coordinate descent on sum_j (column sum / scale)^16, a smooth stand-in for the largest.
  auto surrogate = [&](const Eigen::VectorXd& sums, double scale) {
    return (sums / scale).array().pow(16.0).sum();
  };
  auto column_sums = [&]() {
    Eigen::VectorXd sums = Eigen::VectorXd::Zero(n);
    for (int h = 0; h < h_count; ++h) sums += col2[h].cwiseSqrt();
    return sums;
  };
  Eigen::VectorXd sums = column_sums();
  for (int sweep = 0; sweep < 3; ++sweep) {
    const double scale = sums.maxCoeff();
    double current = surrogate(sums, scale);
    bool moved = false;
    for (int h = 0; h < h_count; ++h)
      for (int i = 0; i < n; ++i) {
        const Eigen::MatrixXd& forms = heads[h].forms[i];
        for (int f = 0; f < forms.rows(); ++f) {
          if (f == pick[h][i]) continue;
          const Eigen::VectorXd trial2 =
              (col2[h] - forms.row(pick[h][i]).transpose().cwiseAbs2() + forms.row(f).transpose().cwiseAbs2())
                  .cwiseMax(0.0);
          const Eigen::VectorXd trial_sums = sums - col2[h].cwiseSqrt() + trial2.cwiseSqrt();
          const double value = surrogate(trial_sums, scale);
          if (value < current) {
            current = value;
            col2[h] = trial2;
            sums = trial_sums;
            pick[h][i] = f;
            moved = true;
          }
        }
      }
    if (!moved) break;
    sums = column_sums();  // (drops the updates' rounding drift)
  }
  return std::min(best, bound());
}

IntervalMatrix AttentionProbabilityEnclosure(const AttentionLayer& layer, const TokenCover& cover, int head) {
  const MhaInput in = MhaInputOver(layer, cover, NormKind::kL2);
  const FactorBounds f = HeadFactorBounds(HeadGeometryAt(layer, head, in.zc, NormKind::kL2), in.rho_z, in.joint_z,
                                          layer.causal);
  return IntervalMatrix::FromBounds(f.p_lo, f.p_hi);
}

}  // namespace lipcert
