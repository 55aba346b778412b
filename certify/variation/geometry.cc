// Head geometry at the cover's centre: the head's queries, keys, values, W_h and their
// norms, enclosed, and the anchors of the factor bounds.
#include "certify/variation/internal.h"

#include <Eigen/Cholesky>
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "interval/elementary.h"
#include "interval/norms.h"
#include "interval/softmax.h"

namespace lipcert {

using namespace variation_internal;

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

// m plus the bias segment [off, off + len) on each of its n rows (none without a bias).
static IntervalMatrix AddBias(IntervalMatrix m, const Eigen::VectorXd& bias, int off, int len, int n) {
  if (bias.size() == 0) return m;
  const Eigen::MatrixXd rows = bias.segment(off, len).transpose().replicate(n, 1);
  return m + IntervalMatrix::Point(rows);
}

// Dot heads: the keys, the centre's logits, the logit gradients' rows g and b, their
// operator norms and distances, and ||b_j - c|| for the logit box.
static void DotLogitFactors(const AttentionLayer& L, int h, const Eigen::MatrixXd& zc, const Eigen::MatrixXd& wq,
                            const Eigen::MatrixXd& wk, const Interval& inv_sqrt_dk, NormKind p, HeadGeometry& G) {
  const int n = int(zc.rows());
  G.k = AddBias(Mul(zc, Eigen::MatrixXd(wk.transpose())), L.bk, h * L.head_dim_qk, L.head_dim_qk, n);
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
}

// L2 heads: the keys are the queries; g = b, their operator norm and distances, and the
// queries' distances (both ways) for the logit box.
static void L2LogitFactors(const Eigen::MatrixXd& wq, const Interval& inv_sqrt_dk, NormKind p, HeadGeometry& G) {
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

// Dot heads, norm 2: the Grams and norms of the moving token's own row (OwnRowFormUp) and
// the centred midpoints' Grams (ValueQueryCovarianceUp).
static void OwnRowGrams(const Eigen::MatrixXd& wq, const Eigen::MatrixXd& wk, const Eigen::MatrixXd& wv,
                        const Eigen::MatrixXd& wo, int n, HeadGeometry& G) {
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

// M_h, the head's map from a token to its value before Wo: Wv_h (dot) or
// Wv_h Wq_h^T Wq_h / sqrt(dk) (l2).
static IntervalMatrix ValueMap(const AttentionLayer& L, int h, const Interval& inv_sqrt_dk) {
  const Eigen::MatrixXd wv = L.wv_head(h);
  if (L.kind == AttentionKind::kDot) return IntervalMatrix::Point(wv);
  const Eigen::MatrixXd wq = L.wq_head(h);
  return Scale(inv_sqrt_dk, Mul(Mul(wv, Eigen::MatrixXd(wq.transpose())), IntervalMatrix::Point(wq)));
}

// The value side of G for the output columns wo_h (D x dv): W_h = Wo_h M_h, the values
// u_j = W_h z_j + Wo_h bv_h, their norms and distances, and their anchors (G.anchor_w set).
static void SetValueSide(const AttentionLayer& L, int h, const Eigen::MatrixXd& zc, const Eigen::MatrixXd& wo_h,
                         const IntervalMatrix& m_h, NormKind p, HeadGeometry& G) {
  const int n = int(zc.rows());
  G.w = Mul(wo_h, m_h);
  G.u = Mul(IntervalMatrix::Point(zc), G.w.transpose());
  if (L.bv.size()) {
    const IntervalMatrix ob = Mul(wo_h, Eigen::MatrixXd(L.bv.segment(h * L.head_dim_v, L.head_dim_v)));
    G.u = G.u + IntervalMatrix(ob.mid.transpose().replicate(n, 1), ob.rad.transpose().replicate(n, 1));
  }
  G.c_u = OperatorNormFromL2Up(G.w, PrimalNorm(p));
  G.w_norm = OperatorNormUp(G.w, PrimalNorm(p));
  G.du = PairDistanceUp(G.u, PrimalNorm(p));
  G.u_norm = PrimalNorm(p);
  G.a_anchor = AnchoredCentreUp(G.u, G.anchor_w, G.u_norm);
}

HeadGeometry HeadGeometryAt(const AttentionLayer& L, int h, const Eigen::MatrixXd& zc, NormKind p) {
  HeadGeometry G;
  G.dot = L.kind == AttentionKind::kDot;
  const int n = int(zc.rows());
  const Interval inv_sqrt_dk = Interval(1.0) / Sqrt(Interval(double(L.head_dim_qk)));
  G.inv_sqrt_dk = inv_sqrt_dk;
  const Eigen::MatrixXd wq = L.wq_head(h), wk = L.wk_head(h), wo = L.wo_head(h);
  G.q = AddBias(Mul(zc, Eigen::MatrixXd(wq.transpose())), L.bq, h * L.head_dim_qk, L.head_dim_qk, n);
  if (G.dot) {
    DotLogitFactors(L, h, zc, wq, wk, inv_sqrt_dk, p, G);
  } else {
    L2LogitFactors(wq, inv_sqrt_dk, p, G);
  }
  G.b_norm = DualNorm(p);
  // The centre's softmax weights (midpoints of the certified ranges) and the spreads at them.
  G.causal = L.causal;
  Eigen::MatrixXd lo0, hi0, w_lo, w_hi;
  LogitBox(G, Eigen::VectorXd::Zero(n), &lo0, &hi0);
  SoftmaxRows(lo0, hi0, L.causal, &w_lo, &w_hi);
  G.anchor_w = 0.5 * (w_lo + w_hi);
  G.b_anchor = AnchoredCentreUp(G.b, G.anchor_w, G.b_norm);
  SetValueSide(L, h, zc, wo, ValueMap(L, h, inv_sqrt_dk), p, G);
  if (G.dot && p == NormKind::kL2) OwnRowGrams(wq, wk, L.wv_head(h), wo, n, G);
  return G;
}

HeadGeometry WithOutputProjection(const HeadGeometry& G, const AttentionLayer& L, int h, const Eigen::MatrixXd& zc,
                                  const Eigen::MatrixXd& wo, NormKind p) {
  if (G.dot && p == NormKind::kL2)
    throw std::invalid_argument("WithOutputProjection: dot heads in norm 2 (their own-row Grams depend on Wo)");
  if (wo.rows() != L.d_model || wo.cols() != L.heads * L.head_dim_v || G.anchor_w.rows() != zc.rows())
    throw std::invalid_argument("WithOutputProjection: Wo must be D x H dv and G head h's geometry at zc");
  HeadGeometry out = G;
  SetValueSide(L, h, zc, wo.middleCols(h * L.head_dim_v, L.head_dim_v), ValueMap(L, h, G.inv_sqrt_dk), p, out);
  return out;
}

}  // namespace lipcert
