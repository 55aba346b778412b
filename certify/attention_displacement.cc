#include "certify/attention_displacement.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "certify/head_factors.h"
#include "interval/elementary.h"
#include "interval/norms.h"
#include "interval/vector_norms.h"
#include "interval/rounding.h"

namespace lipcert {

double SoftmaxTotalVariationUp(double w) {
  if (!(w >= 0)) throw std::invalid_argument("SoftmaxTotalVariationUp: the oscillation must be >= 0");
  if (w == 0) return 0.0;
  if (!std::isfinite(w)) return 1.0;
  // tanh(w/4) = 1 - 2 / (e^{w/2} + 1), increasing in e^{w/2}; also tanh(x) <= x.
  const double e = ExpUpper(w / 2);  // w / 2 is exact for w >= 0 away from underflow, and rounds down below it
  const double t = SubUp(1.0, DivDown(2.0, AddUp(e, 1.0)));
  return std::min({1.0, t, DivUp(w, 4.0)});
}

namespace {

int KeysOf(const AttentionLayer& L, int i, int n) { return L.causal ? i + 1 : n; }

// What one head's displacement needs, at the cover's centre: the row logit gradients' norms
// ||g_i|| (g_i = Wk_h^T q_i / sqrt(dk)) and the distances ||b_j - b_k|| (b_j = Wq_h^T k_j / sqrt(dk)),
// c >= ||Wq_h^T Wk_h|| / sqrt(dk), c_u >= ||W_h|| (W_h = Wo_h M_h), the output-space values
// u_j = Wo_h v_j enclosed and their distances; for l2 heads the logit boxes' oscillation.
struct HeadMoves {
  bool dot = true;
  Eigen::VectorXd g_norm;
  Eigen::MatrixXd db, du;
  double c_logit = kInf, c_u = kInf;
  IntervalMatrix u;
  Eigen::MatrixXd wo, m;  // dot: Wo_h (D x dv) and Wv_h (dv x D), for moves along directions
  IntervalMatrix w;       // l2: W_h (D x D) enclosed, for moves along directions
  Eigen::VectorXd box_oscillation;  // l2: >= the logits' change oscillation by row (from LogitBox)
};

// z w^T + bias[off, off + len) on every row, enclosed.
IntervalMatrix RowsOf(const Eigen::MatrixXd& z, const Eigen::MatrixXd& w, const Eigen::VectorXd& bias, int off, int len) {
  IntervalMatrix out = Mul(z, Eigen::MatrixXd(w.transpose()));
  if (bias.size()) out = out + IntervalMatrix::Point(bias.segment(off, len).transpose().replicate(z.rows(), 1));
  return out;
}

HeadMoves DotHeadMovesAt(const AttentionLayer& L, int h, const Eigen::MatrixXd& zc) {
  HeadMoves m;
  const int n = int(zc.rows()), dk = L.head_dim_qk, dv = L.head_dim_v;
  const Eigen::MatrixXd wq = L.wq_head(h), wk = L.wk_head(h), wv = L.wv_head(h);
  m.wo = L.wo_head(h);
  m.m = wv;
  const Interval inv_sqrt_dk = Interval(1.0) / Sqrt(Interval(double(dk)));
  const IntervalMatrix q = RowsOf(zc, wq, L.bq, h * dk, dk), k = RowsOf(zc, wk, L.bk, h * dk, dk);
  const IntervalMatrix v = RowsOf(zc, wv, L.bv, h * dv, dv);
  const IntervalMatrix g = Scale(inv_sqrt_dk, Mul(q, wk)), b = Scale(inv_sqrt_dk, Mul(k, wq));
  m.g_norm.resize(n);
  for (int i = 0; i < n; ++i) m.g_norm(i) = NormUpOfMagnitudes(RowMagnitude(g, i), VectorNorm::kTwo);
  m.db = PairDistanceUp(b, VectorNorm::kTwo);
  m.c_logit = MulUp(ProductNormL2Upper(wq, wk).value(), inv_sqrt_dk.hi);
  m.c_u = ProductNormL2Upper(Eigen::MatrixXd(m.wo.transpose()), wv).value();
  m.u = Mul(v, Eigen::MatrixXd(m.wo.transpose()));
  m.du = PairDistanceUp(m.u, VectorNorm::kTwo);
  return m;
}

// >= the oscillation over row i's keys of s_ij(X) - s_ij(X0), from the logit boxes at rho and
// at the centre (rows may be shifted by a per-row constant, which the oscillation ignores).
double BoxOscillationUp(const Eigen::MatrixXd& lo, const Eigen::MatrixXd& hi, const Eigen::MatrixXd& lo0,
                        const Eigen::MatrixXd& hi0, int i, int len) {
  double top = -kInf, bottom = kInf;
  for (int j = 0; j < len; ++j) {
    top = std::max(top, SubUp(hi(i, j), lo0(i, j)));
    bottom = std::min(bottom, SubDown(lo(i, j), hi0(i, j)));
  }
  return std::max(0.0, SubUp(top, bottom));
}

// L2 heads, from the geometry the engines use, with the logit boxes' oscillation over rho.
HeadMoves L2HeadMovesOver(const AttentionLayer& L, int h, const Eigen::MatrixXd& zc, const Eigen::VectorXd& rho) {
  const HeadGeometry G = HeadGeometryAt(L, h, zc, NormKind::kL2);
  HeadMoves m;
  m.dot = false;
  m.c_u = G.c_u;
  m.u = G.u;
  m.du = G.du;
  m.w = G.w;
  const int n = int(zc.rows());
  Eigen::MatrixXd lo, hi, lo0, hi0;
  LogitBox(G, rho, &lo, &hi);
  LogitBox(G, Eigen::VectorXd::Zero(n), &lo0, &hi0);
  m.box_oscillation.resize(n);
  for (int i = 0; i < n; ++i) m.box_oscillation(i) = BoxOscillationUp(lo, hi, lo0, hi0, i, KeysOf(L, i, n));
  return m;
}

// Dot heads: for keys j, k of row i,
//   (s_ij - s_ij0) - (s_ik - s_ik0) = g_i.(dz_j - dz_k) + (b_j - b_k).dz_i + dz_i^T W (dz_j - dz_k),
// W = Wq^T Wk / sqrt(dk), ||W|| <= c. Token by token, x = ||dz_i|| <= r_i and
// y = ||dz_j - dz_k|| <= r_j + r_k. Within the joint radius J (||dz||_F <= J):
//   j, k != i: x^2 + y^2 / 2 <= J^2, so g y + db x <= (2 g^2 + db^2)^1/2 J and x y <= J^2 / sqrt(2);
//   k = i (j != i alike): z = ||dz_j||, x^2 + z^2 <= J^2, y <= x + z, so the change is at most
//   (g + db) x + g z + c x (x + z) <= ((g + db)^2 + g^2)^1/2 J + c J^2 (1 + sqrt(2)) / 2.
double DotPairOscillationUp(const HeadMoves& G, const Eigen::VectorXd& rho, double joint, int i, int len) {
  const double g = G.g_norm(i), c = G.c_logit, x = rho(i);
  const double j2 = MulUp(joint, joint);
  double w = 0;
  for (int j = 0; j < len; ++j)
    for (int k = j + 1; k < len; ++k) {
      const double db = G.db(j, k);
      const double y = AddUp(rho(j), rho(k));
      double pair = AddUp(MulUp(AddUp(g, MulUp(c, x)), y), MulUp(db, x));
      if (std::isfinite(joint)) {
        double joint_form;
        if (j != i && k != i) {
          const double lin = MulUp(SqrtUp(AddUp(MulUp(2.0, MulUp(g, g)), MulUp(db, db))), joint);
          joint_form = AddUp(lin, MulUp(c, DivUp(j2, SqrtDown(2.0))));
        } else {
          const double gd = AddUp(g, db);
          const double lin = MulUp(SqrtUp(AddUp(MulUp(gd, gd), MulUp(g, g))), joint);
          joint_form = AddUp(lin, MulUp(c, MulUp(j2, DivUp(AddUp(1.0, SqrtUp(2.0)), 2.0))));
        }
        pair = std::min(pair, joint_form);
      }
      w = std::max(w, pair);
    }
  return w;
}

// >= ||sum_h Wo_h sum_j P_ij Wv_h dz_j||: each head moves by at most c_u max_j r_j (a convex
// combination of its values' moves); for dot heads also ||Wo|| ||Wv|| joint (Jensen over the
// rows' weights, then the stacked heads) and ||Wo|| (sum_h ||Wv_h||^2)^1/2 max_j r_j.
Eigen::VectorXd ValueMovesUp(const AttentionLayer& L, const std::vector<HeadMoves>& geo, const Eigen::VectorXd& rho,
                             double joint) {
  const int n = int(rho.size());
  double wo = kInf, wv = kInf, wv_heads = kInf;
  if (L.kind == AttentionKind::kDot) {
    wo = NormL2Upper(L.wo).value();
    wv = NormL2Upper(L.wv).value();
    double s = 0;
    for (int h = 0; h < L.heads; ++h) {
      const double nh = NormL2Upper(Eigen::MatrixXd(L.wv_head(h))).value();
      s = AddUp(s, MulUp(nh, nh));
    }
    wv_heads = SqrtUp(s);
  }
  Eigen::VectorXd out(n);
  double r_max = 0;
  for (int i = 0; i < n; ++i) {
    r_max = std::max(r_max, rho(i));
    const double r = L.causal ? r_max : rho.maxCoeff();
    double sum = 0;
    for (const HeadMoves& G : geo) sum = AddUp(sum, MulUp(G.c_u, r));
    out(i) = std::min({sum, MulUp(MulUp(wo, wv), joint), MulUp(MulUp(wo, wv_heads), r)});
  }
  return out;
}

// >= ||W_h^T w_i||_2 for every row w_i of the directions (W_h = Wo_h M_h).
Eigen::VectorXd MovesAlongUp(const HeadMoves& G, const IntervalMatrix& dirs) {
  const IntervalMatrix m = G.dot ? Mul(Mul(dirs, G.wo), G.m) : Mul(dirs, G.w);
  Eigen::VectorXd out(m.rows());
  for (Eigen::Index i = 0; i < m.rows(); ++i) out(i) = NormUpOfMagnitudes(RowMagnitude(m, i), VectorNorm::kTwo);
  return out;
}

// >= max over row i's keys j, k of <u_j - u_k, w_i> (the scalars' diameter along w_i).
double DiameterAlongUp(const IntervalMatrix& a, int i, int len) {
  double top = -kInf, bottom = kInf;
  for (int j = 0; j < len; ++j) {
    top = std::max(top, AddUp(a.mid(j, i), a.rad(j, i)));
    bottom = std::min(bottom, SubDown(a.mid(j, i), a.rad(j, i)));
  }
  return std::max(0.0, SubUp(top, bottom));
}

}  // namespace

AttentionDisplacement AttentionDisplacementOver(const AttentionLayer& L, const TokenCover& cover,
                                                const IntervalMatrix* dirs) {
  if (L.layer_norm || L.post_layer_norm)
    throw std::invalid_argument("AttentionDisplacementOver: the layer must be MHA alone (no LayerNorm)");
  const int n = int(cover.center.rows()), heads = L.heads;
  if (cover.radius.size() != n) throw std::invalid_argument("AttentionDisplacementOver: one radius per token");
  if (dirs && (dirs->rows() != n || dirs->cols() != L.d_model))
    throw std::invalid_argument("AttentionDisplacementOver: one direction of D entries per token");
  const Eigen::VectorXd& rho = cover.radius;
  const double joint = JointRadiusUp(cover).value();
  std::vector<HeadMoves> geo;
  for (int h = 0; h < heads; ++h)
    geo.push_back(L.kind == AttentionKind::kDot ? DotHeadMovesAt(L, h, cover.center)
                                                : L2HeadMovesOver(L, h, cover.center, rho));

  AttentionDisplacement out;
  DisplacementReport& r = out.report;
  r.logit_oscillation.resize(n, heads);
  r.total_variation.resize(n, heads);
  r.value_diameter.resize(n, heads);
  r.value_moves = ValueMovesUp(L, geo, rho, joint);
  out.norm = r.value_moves;
  if (dirs) out.along = Eigen::VectorXd::Zero(n);
  for (int h = 0; h < heads; ++h) {
    const HeadMoves& G = geo[size_t(h)];
    IntervalMatrix scalars;  // (N keys, N directions): <u_j, w_i>
    Eigen::VectorXd moves_along;
    if (dirs) {
      scalars = Mul(G.u, dirs->transpose());
      moves_along = MovesAlongUp(G, *dirs);
    }
    double diam = 0, r_max = 0;
    for (int i = 0; i < n; ++i) {
      const int len = KeysOf(L, i, n);
      const double w = G.dot ? DotPairOscillationUp(G, rho, joint, i, len) : G.box_oscillation(i);
      // The keys' diameter: row i adds key i to row i - 1's (causal) or has them all.
      if (i == 0 || L.causal)
        for (int j = L.causal ? len - 1 : 0; j < len; ++j)
          for (int k = 0; k < j; ++k) diam = std::max(diam, G.du(j, k));
      const double tv = SoftmaxTotalVariationUp(w);
      r.logit_oscillation(i, h) = w;
      r.total_variation(i, h) = tv;
      r.value_diameter(i, h) = diam;
      out.norm(i) = AddUp(out.norm(i), MulUp(tv, diam));
      if (dirs) {
        r_max = L.causal ? std::max(r_max, rho(i)) : rho.maxCoeff();
        out.along(i) = AddUp(out.along(i), AddUp(MulUp(tv, DiameterAlongUp(scalars, i, len)), MulUp(moves_along(i), r_max)));
      }
    }
  }
  return out;
}

Eigen::VectorXd AttentionDisplacementUp(const AttentionLayer& mha, const TokenCover& cover) {
  return AttentionDisplacementOver(mha, cover).norm;
}

}  // namespace lipcert
