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
  const double e = ExpUpper(DivUp(w, 2.0));
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
  IntervalMatrix g;  // dot: rows g_i
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
  m.g = Scale(inv_sqrt_dk, Mul(q, wk));
  const IntervalMatrix b = Scale(inv_sqrt_dk, Mul(k, wq));
  m.g_norm.resize(n);
  for (int i = 0; i < n; ++i) m.g_norm(i) = NormUpOfMagnitudes(RowMagnitude(m.g, i), VectorNorm::kTwo);
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

// The rows W_h^T w_i for every row w_i of the directions (W_h = Wo_h M_h), enclosed.
IntervalMatrix MovesAlong(const HeadMoves& G, const IntervalMatrix& dirs) {
  return G.dot ? Mul(Mul(dirs, G.wo), G.m) : Mul(dirs, G.w);
}

// >= ||M||_2 for the enclosure of M (D x H, H small): sqrt of lambda_max of its H x H Gram.
double ColumnsNormUp(const IntervalMatrix& m) { return SqrtUp(LambdaMaxUpper(GramEnclosure(m)).value()); }

// Row i of every head as one D x H enclosure, column h = weight_h times row i of rows[h].
IntervalMatrix RowsAsColumns(const std::vector<const IntervalMatrix*>& rows, const Eigen::VectorXd& weight, int i) {
  const Eigen::Index d = rows[0]->cols(), heads = Eigen::Index(rows.size());
  Eigen::MatrixXd lo(d, heads), hi(d, heads);
  for (Eigen::Index h = 0; h < heads; ++h)
    for (Eigen::Index a = 0; a < d; ++a) {
      const Interval e = Interval(weight(h)) * (*rows[size_t(h)])(i, a);
      lo(a, h) = e.lo;
      hi(a, h) = e.hi;
    }
  return IntervalMatrix::FromBounds(lo, hi);
}

// Dot heads over a ball (joint radius J): sum_h d_h TV_h <= sum_h d_h osc_h / 4 with, for the
// keys j_h, k_h each head takes, osc_h <= g_h.(dz_j - dz_k) + (b_j - b_k).dz_i + dz_i^T W_h (dz_j - dz_k).
// The first terms together are <A, dZ> for the N x D matrix A whose row m adds +-d_h g_h over the
// heads with m among their two keys, so ||A||_F^2 <= sum_m |S_m| ||V||_2^2 = 2 H ||V||_2^2,
// V = [d_h g_h] (D x H): heads whose logit gradients point apart share the radius instead of
// each taking it whole. The second is at most db_h ||dz_i||, ||dz_i|| <= min(r_i, J); the third
// c_h ||dz_i|| ||dz_j - dz_k|| <= c_h J^2 (1 + sqrt(2)) / 2.
struct JointHeads {
  const std::vector<HeadMoves>* geo = nullptr;  // null: each head by itself
  double joint = kInf;
};

// ||V||_2^2 <= lambda_max(diag(d) Gamma diag(d)) for V = [d_h g_h] and Gamma >= the Gram of [g_h].
double WeightedColumnsNormUp(const IntervalMatrix& gram, const Eigen::VectorXd& d) {
  IntervalMatrix w = gram;
  for (Eigen::Index a = 0; a < w.rows(); ++a)
    for (Eigen::Index b = 0; b < w.cols(); ++b) {
      const Interval e = Interval(d(a)) * Interval(d(b)) * gram(a, b);
      w.mid(a, b) = 0.5 * e.lo + 0.5 * e.hi;
      w.rad(a, b) = std::max(SubUp(e.hi, w.mid(a, b)), SubUp(w.mid(a, b), e.lo));
    }
  return SqrtUp(LambdaMaxUpper(w).value());
}

// gram: the Gram of row i's logit gradients [g_h] (H x H, enclosed).
double JointHeadsUp(const JointHeads& jh, const IntervalMatrix& gram, const Eigen::VectorXd& d,
                    const Eigen::VectorXd& db_max, double x) {
  const std::vector<HeadMoves>& geo = *jh.geo;
  double active = 0, b_sum = 0, c_sum = 0;
  for (size_t h = 0; h < geo.size(); ++h) {
    const Eigen::Index e = Eigen::Index(h);
    if (d(e) > 0) active += 1;
    b_sum = AddUp(b_sum, MulUp(d(e), db_max(e)));
    c_sum = AddUp(c_sum, MulUp(d(e), geo[h].c_logit));
  }
  if (active == 0) return 0.0;
  const double g_part = MulUp(MulUp(SqrtUp(2.0 * active), WeightedColumnsNormUp(gram, d)), jh.joint);
  const double xy = MulUp(MulUp(jh.joint, jh.joint), DivUp(AddUp(1.0, SqrtUp(2.0)), 2.0));
  const double rest = AddUp(MulUp(b_sum, x), MulUp(c_sum, xy));
  return DivUp(AddUp(g_part, rest), 4.0);
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

// sum_h d_h TV_h: each head by itself, or (jh.geo set) the smaller of that and JointHeadsUp.
double ShiftsUp(const JointHeads& jh, const Eigen::VectorXd& tv, const Eigen::VectorXd& d, const Eigen::VectorXd& db_max,
                double x, int i) {
  const int heads = int(tv.size());
  double apart = 0;
  for (int h = 0; h < heads; ++h) apart = AddUp(apart, MulUp(tv(h), d(h)));
  if (!jh.geo) return apart;
  std::vector<const IntervalMatrix*> g;
  for (const HeadMoves& G : *jh.geo) g.push_back(&G.g);
  const IntervalMatrix gram = GramEnclosure(RowsAsColumns(g, Eigen::VectorXd::Ones(heads), i));
  return std::min(apart, JointHeadsUp(jh, gram, d, db_max, x));
}

// Each head's pieces, row by row: into the report the logits' oscillation, TV and the values'
// diameter; here the largest ||b_j - b_k|| over the row's keys, and along the directions
// (when given) the values' diameter, the moves ||W_h^T w_i|| and the rows W_h^T w_i.
struct HeadRows {
  Eigen::MatrixXd diam_along, moves_along, db_max;  // (N, H)
  std::vector<IntervalMatrix> along_rows;          // per head (N, D)
};
HeadRows HeadRowsOf(const AttentionLayer& L, const std::vector<HeadMoves>& geo, const Eigen::VectorXd& rho,
                    double joint, const IntervalMatrix* dirs, DisplacementReport* report) {
  const int n = int(rho.size()), heads = int(geo.size());
  DisplacementReport& r = *report;
  HeadRows out;
  r.logit_oscillation.resize(n, heads);
  r.total_variation.resize(n, heads);
  r.value_diameter.resize(n, heads);
  out.diam_along.resize(n, heads);
  out.moves_along.resize(n, heads);
  out.db_max.resize(n, heads);
  std::vector<IntervalMatrix>& along_rows = out.along_rows;
  along_rows.reserve(size_t(heads));
  for (int h = 0; h < heads; ++h) {
    const HeadMoves& G = geo[size_t(h)];
    IntervalMatrix scalars;  // (N keys, N directions): <u_j, w_i>
    if (dirs) {
      scalars = Mul(G.u, dirs->transpose());
      along_rows.push_back(MovesAlong(G, *dirs));
    }
    double diam = 0, dbm = 0;
    for (int i = 0; i < n; ++i) {
      const int len = KeysOf(L, i, n);
      const double w = G.dot ? DotPairOscillationUp(G, rho, joint, i, len) : G.box_oscillation(i);
      // The keys' diameters: row i adds key i to row i - 1's (causal) or has them all.
      if (i == 0 || L.causal)
        for (int j = L.causal ? len - 1 : 0; j < len; ++j)
          for (int k = 0; k < j; ++k) {
            diam = std::max(diam, G.du(j, k));
            if (G.dot) dbm = std::max(dbm, G.db(j, k));
          }
      r.logit_oscillation(i, h) = w;
      r.total_variation(i, h) = SoftmaxTotalVariationUp(w);
      r.value_diameter(i, h) = diam;
      out.db_max(i, h) = dbm;
      if (dirs) {
        out.diam_along(i, h) = DiameterAlongUp(scalars, i, len);
        out.moves_along(i, h) = NormUpOfMagnitudes(RowMagnitude(along_rows.back(), i), VectorNorm::kTwo);
      }
    }
  }
  return out;
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
  HeadRows hr = HeadRowsOf(L, geo, rho, joint, dirs, &r);
  const Eigen::MatrixXd &diam_along = hr.diam_along, &moves_along = hr.moves_along, &db_max = hr.db_max;
  const std::vector<IntervalMatrix>& along_rows = hr.along_rows;
  // Token by token: the values' moves plus the softmax rows' shifts, each head by itself
  // (sum_h d_h TV_h) or, along the directions for dot heads over a ball, the heads together
  // (JointHeadsUp: the directions decide whether a token's variance can vanish, while the
  // norm's bound meets a Jacobian bound times the radius, so only the directions pay for it).
  JointHeads jh;
  if (L.kind == AttentionKind::kDot && std::isfinite(joint)) {
    jh.geo = &geo;
    jh.joint = joint;
  }
  const auto shifts_up = [&](const Eigen::MatrixXd& d, int i, bool joint_too) {
    return ShiftsUp(joint_too ? jh : JointHeads{}, r.total_variation.row(i).transpose(), d.row(i).transpose(),
                    db_max.row(i).transpose(), std::min(rho(i), joint), i);
  };
  r.value_moves = ValueMovesUp(L, geo, rho, joint);
  out.norm.resize(n);
  if (dirs) out.along.resize(n);
  std::vector<const IntervalMatrix*> along_ptrs;
  for (const IntervalMatrix& a : along_rows) along_ptrs.push_back(&a);
  double r_max = 0;
  for (int i = 0; i < n; ++i) {
    out.norm(i) = AddUp(r.value_moves(i), shifts_up(r.value_diameter, i, false));
    if (!dirs) continue;
    // |sum_h sum_j P_ij <dz_j, a_h>| <= ||dZ||_F ||A Q||_F <= J ||A||_2 sqrt(H), A = [a_h] (D x H),
    // a_h = W_h^T w_i, Q_hj = P_ij (||Q||_F^2 <= H); or each head by itself, ||a_h|| max_j r_j.
    r_max = L.causal ? std::max(r_max, rho(i)) : rho.maxCoeff();
    double values = 0;
    for (int h = 0; h < heads; ++h) values = AddUp(values, MulUp(moves_along(i, h), r_max));
    if (std::isfinite(joint))
      values = std::min(values, MulUp(MulUp(joint, SqrtUp(double(heads))),
                                      ColumnsNormUp(RowsAsColumns(along_ptrs, Eigen::VectorXd::Ones(heads), i))));
    out.along(i) = AddUp(values, shifts_up(diam_along, i, true));
  }
  return out;
}

Eigen::VectorXd AttentionDisplacementUp(const AttentionLayer& mha, const TokenCover& cover) {
  return AttentionDisplacementOver(mha, cover).norm;
}

}  // namespace lipcert
