#include "certify/jacobian_bounds.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "certify/closed_form.h"
#include "certify/layer_norm_enclosure.h"
#include "interval/elementary.h"
#include "interval/interval_matrix.h"
#include "interval/norms.h"
#include "interval/softmax.h"
#include "interval/parallel.h"

namespace lipcert {
namespace {

// ---------------------------------------------------------------------------------------
// Rigorous helpers on vectors. "Up" results are >= the exact real value.
// ---------------------------------------------------------------------------------------

// ||m||_p where m >= 0 entrywise is a vector of magnitude bounds. With `dual`, the dual
// norm q instead (2 -> 2, inf -> 1): a block a g^T has ||a g^T||_p = ||a||_p ||g||_q.
double NormUpOfMagnitudes(const Eigen::VectorXd& m, NormKind p, bool dual) {
  if (p == NormKind::kL2) {
    double s = 0;
    for (Eigen::Index i = 0; i < m.size(); ++i) s = AddUp(s, MulUp(m(i), m(i)));
    return SqrtUp(s);
  }
  if (dual) {  // 1-norm
    double s = 0;
    for (Eigen::Index i = 0; i < m.size(); ++i) s = AddUp(s, m(i));
    return s;
  }
  return m.size() ? m.maxCoeff() : 0.0;  // inf-norm, exact
}

// Magnitude bounds of row r of an interval matrix: |mid| + rad, rounded up.
Eigen::VectorXd RowMagnitude(const IntervalMatrix& a, Eigen::Index r) {
  Eigen::VectorXd m(a.cols());
  for (Eigen::Index c = 0; c < a.cols(); ++c) m(c) = AddUp(std::fabs(a.mid(r, c)), a.rad(r, c));
  return m;
}

// Upper bounds on ||row_j - row_k|| for all pairs, over everything the enclosure holds.
Eigen::MatrixXd PairDistanceUp(const IntervalMatrix& a, NormKind p, bool dual) {
  const Eigen::Index n = a.rows(), d = a.cols();
  Eigen::MatrixXd out = Eigen::MatrixXd::Zero(n, n);
  Eigen::VectorXd m(d);
  for (Eigen::Index j = 0; j < n; ++j)
    for (Eigen::Index k = j + 1; k < n; ++k) {
      for (Eigen::Index c = 0; c < d; ++c) {
        const double diff = std::max(SubUp(a.mid(j, c), a.mid(k, c)), SubUp(a.mid(k, c), a.mid(j, c)));
        m(c) = AddUp(diff, AddUp(a.rad(j, c), a.rad(k, c)));
      }
      out(j, k) = out(k, j) = NormUpOfMagnitudes(m, p, dual);
    }
  return out;
}

// Lower bounds on the Euclidean distance between rows (for l2 logits).
Eigen::MatrixXd PairDistanceL2Down(const IntervalMatrix& a) {
  const Eigen::Index n = a.rows(), d = a.cols();
  Eigen::MatrixXd out = Eigen::MatrixXd::Zero(n, n);
  for (Eigen::Index j = 0; j < n; ++j)
    for (Eigen::Index k = j + 1; k < n; ++k) {
      double s = 0;
      for (Eigen::Index c = 0; c < d; ++c) {
        const double diff = std::max(SubDown(a.mid(j, c), a.mid(k, c)), SubDown(a.mid(k, c), a.mid(j, c)));
        const double g = SubDown(diff, AddUp(a.rad(j, c), a.rad(k, c)));
        if (g > 0) s = AddDown(s, MulDown(g, g));
      }
      out(j, k) = out(k, j) = s > 0 ? SqrtDown(s) : 0.0;
    }
  return out;
}

// ||M||_{2 -> p} (dual: 2 -> q) of an interval matrix, upper bound.
double OperatorNormFromL2Up(const IntervalMatrix& m, NormKind p, bool dual) {
  if (p == NormKind::kL2) return NormL2UpperInterval(m).value();
  double out = 0;
  for (Eigen::Index r = 0; r < m.rows(); ++r) {
    const double rn = NormUpOfMagnitudes(RowMagnitude(m, r), NormKind::kL2, false);
    out = dual ? AddUp(out, rn) : std::max(out, rn);  // 2 -> 1: sum of row norms; 2 -> inf: max
  }
  return out;
}

// ||M||_p -> p operator norm of an interval matrix, upper bound.
double OperatorNormUp(const IntervalMatrix& m, NormKind p) {
  return p == NormKind::kL2 ? NormL2UpperInterval(m).value() : NormInfUpper(m).value();
}

// ||B||_p of a nonnegative matrix of block bounds.
double NonnegNormUp(const Eigen::MatrixXd& b, NormKind p) {
  if (p == NormKind::kL2) return NormL2UpperNonneg(b).value();
  double out = 0;
  for (Eigen::Index r = 0; r < b.rows(); ++r) {
    double s = 0;
    for (Eigen::Index c = 0; c < b.cols(); ++c) s = AddUp(s, b(r, c));
    out = std::max(out, s);
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Geometry of one head at the cover's centre (the MHA input), enclosed rigorously.
// ---------------------------------------------------------------------------------------
struct HeadGeometry {
  bool dot = true;
  IntervalMatrix q, k;      // (N, dk) centre queries / keys (k == q for l2)
  IntervalMatrix u;         // (N, D) output-space values Wo_h v_j
  IntervalMatrix g;         // dot: rows Wk^T q_i / sqrt(dk); l2: rows Wq^T q_i / sqrt(dk)
  IntervalMatrix b;         // dot: rows Wq^T k_j / sqrt(dk); l2: same as g
  IntervalMatrix w;         // (D, D) W_h = Wo_h M_h
  IntervalMatrix logits;    // dot: centre logits (N, N)
  Eigen::MatrixXd dq_lo, dq_hi;  // l2: Euclidean distances of centre query rows
  Eigen::MatrixXd du;       // ||u_j - u_k||_p, centre
  Eigen::MatrixXd dg;       // l2: ||g_j - g_k||_q, centre
  Eigen::MatrixXd db;       // dot: ||b_j - b_k||_q, centre (l2: == dg)
  Eigen::VectorXd g_norm;   // dot: ||g_i||_q, centre
  Eigen::VectorXd b_shifted_l2;  // dot: ||b_j - c||_2 for the mean c of the centre's b rows
  double c_u = 0;      // ||W_h||_{2->p}: how far u_j moves per unit of ||z_j||
  double c_g = 0;      // dot: ||Wk^T Wq||_{2->q}/sqrt(dk); l2: ||Wq^T Wq||_{2->q}/sqrt(dk)
  double c_b = 0;      // dot: ||Wq^T Wk||_{2->q}/sqrt(dk); l2: == c_g
  double c_logit = 0;  // dot: ||Wq^T Wk||_2/sqrt(dk); l2: ||Wq||_2
  double w_norm = 0;   // ||W_h||_p
  Interval inv_sqrt_dk;  // 1/sqrt(dk)
};

HeadGeometry Geometry(const AttentionLayer& L, int h, const Eigen::MatrixXd& zc, NormKind p) {
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
  G.c_u = OperatorNormFromL2Up(G.w, p, false);
  G.w_norm = OperatorNormUp(G.w, p);
  if (G.dot) {
    G.k = add_bias(Mul(zc, Eigen::MatrixXd(wk.transpose())), L.bk, h * L.head_dim_qk, L.head_dim_qk);
    G.logits = Scale(inv_sqrt_dk, Mul(G.q, G.k.transpose()));
    G.g = Scale(inv_sqrt_dk, Mul(G.q, wk));
    G.b = Scale(inv_sqrt_dk, Mul(G.k, wq));
    const IntervalMatrix qk = Scale(inv_sqrt_dk, Mul(Eigen::MatrixXd(wq.transpose()), wk));  // Wq^T Wk / sqrt(dk)
    G.c_logit = NormL2UpperInterval(qk).value();
    G.c_g = OperatorNormFromL2Up(qk.transpose(), p, true);
    G.c_b = OperatorNormFromL2Up(qk, p, true);
    G.g_norm.resize(n);
    for (int i = 0; i < n; ++i) G.g_norm(i) = NormUpOfMagnitudes(RowMagnitude(G.g, i), p, true);
    G.db = PairDistanceUp(G.b, p, true);
    // Softmax ignores a shift common to a row: s_ij - c.dz_i has the same probabilities,
    // so the logit box only needs ||b_j - c|| (keys often share a large mean component).
    const Eigen::RowVectorXd c = G.b.mid.colwise().mean();
    G.b_shifted_l2.resize(n);
    for (int j = 0; j < n; ++j) {
      Eigen::VectorXd m(G.b.cols());
      for (Eigen::Index a = 0; a < G.b.cols(); ++a)
        m(a) = AddUp(std::max(SubUp(G.b.mid(j, a), c(a)), SubUp(c(a), G.b.mid(j, a))), G.b.rad(j, a));
      G.b_shifted_l2(j) = NormUpOfMagnitudes(m, NormKind::kL2, false);
    }
  } else {
    G.k = G.q;
    G.g = Scale(inv_sqrt_dk, Mul(G.q, wq));
    G.b = G.g;
    const IntervalMatrix qq = Scale(inv_sqrt_dk, GramEnclosure(wq));  // Wq^T Wq / sqrt(dk)
    G.c_logit = NormL2Upper(wq).value();
    G.c_g = G.c_b = OperatorNormFromL2Up(qq, p, true);
    G.dq_lo = PairDistanceL2Down(G.q);
    G.dq_hi = PairDistanceUp(G.q, NormKind::kL2, false);
    G.dg = PairDistanceUp(G.g, p, true);
    G.db = G.dg;
  }
  G.du = PairDistanceUp(G.u, p, false);
  return G;
}

// ---------------------------------------------------------------------------------------
// Factor bounds over a cover of the MHA input: centre = geometry's centre, radius rho.
// ---------------------------------------------------------------------------------------
struct FactorBounds {
  Eigen::MatrixXd p_lo, p_hi;  // softmax range (0 where masked)
  Eigen::MatrixXd a_sup;       // sup ||a_ij||_p
  Eigen::MatrixXd pa;          // sup P_ij ||a_ij||_p (<= p_hi a_sup)
  Eigen::MatrixXd g_sup;       // sup ||g_ij||_q
  Eigen::MatrixXd b_sup;       // sup ||b_ij||_q
};

// max sum_k x_k c_k over 0 <= x_k <= cap_k, sum_k x_k <= total (k < len), for c >= 0: with
// total 1 an upper bound on sum_k P_k c_k for every probability row P below the caps, with
// total 2 on sum_k |P_k - P0_k| c_k for two such rows. Greedy on the largest c (never above
// total max_k c_k nor sum_k cap_k c_k).
double SimplexWeightedSumUp(const Eigen::VectorXd& cap, const Eigen::VectorXd& c, int len, double total = 1.0) {
  std::vector<int> order(len);
  for (int k = 0; k < len; ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return c(a) > c(b); });
  double left = total, s = 0.0;  // `left` is rounded up: more mass, a larger sum
  for (int k : order) {
    if (!(left > 0)) break;
    const double x = std::min(cap(k), left);
    s = AddUp(s, MulUp(x, c(k)));
    left = SubUp(left, x);
  }
  return s;
}

// sum_k P_ik d_jk over the unmasked k, for P_i below p_hi with sum_k P_ik = 1.
double MeanDistanceUp(const Eigen::MatrixXd& p_hi, const Eigen::MatrixXd& d, int i, int j, int len) {
  return SimplexWeightedSumUp(p_hi.row(i).transpose(), d.row(j).transpose(), len);
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
      const double gi = NormUpOfMagnitudes(RowMagnitude(G.g, i), NormKind::kL2, false);
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

// Upper bounds on ||a_j - b_i||_2 over the enclosures (out(i, j); a and b have as many columns).
Eigen::MatrixXd RowDistanceL2Up(const IntervalMatrix& a, const IntervalMatrix& b) {
  const Eigen::Index n = b.rows(), m = a.rows(), d = a.cols();
  Eigen::MatrixXd out(n, m);
  for (Eigen::Index i = 0; i < n; ++i)
    for (Eigen::Index j = 0; j < m; ++j) {
      double s = 0;
      for (Eigen::Index c = 0; c < d; ++c) {
        const double diff = std::max(SubUp(a.mid(j, c), b.mid(i, c)), SubUp(b.mid(i, c), a.mid(j, c)));
        const double e = AddUp(diff, AddUp(a.rad(j, c), b.rad(i, c)));
        s = AddUp(s, MulUp(e, e));
      }
      out(i, j) = SqrtUp(s);
    }
  return out;
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
    dg = PairDistanceUp(G.g, NormKind::kL2, false);
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
      gn = NormUpOfMagnitudes(RowMagnitude(G.g, i), NormKind::kL2, false);
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
double MaxOfPTimesOneMinusP(double lo, double hi) {
  const double x = hi < 0.5 ? hi : (lo > 0.5 ? lo : 0.5);
  return MulUp(x, SubUp(1.0, x));
}

FactorBounds Bounds(const HeadGeometry& G, const Eigen::VectorXd& rho, double joint, bool causal) {
  const int n = int(rho.size());
  FactorBounds F;
  Eigen::MatrixXd lo, hi;
  LogitBox(G, rho, &lo, &hi);
  SoftmaxRows(lo, hi, causal, &F.p_lo, &F.p_hi);
  if (rho.maxCoeff() > 0) TightenByTangent(G, rho, joint, causal, lo, hi, &F);
  // Distances over the cover.
  F.a_sup.resize(n, n);
  F.pa.resize(n, n);
  F.g_sup.resize(n, n);
  F.b_sup.resize(n, n);
  Eigen::MatrixXd du(n, n), db(n, n), dg(n, n);
  for (int j = 0; j < n; ++j)
    for (int k = 0; k < n; ++k) {
      du(j, k) = AddUp(G.du(j, k), MulUp(G.c_u, AddUp(rho(j), rho(k))));
      db(j, k) = AddUp(G.db(j, k), MulUp(G.c_b, AddUp(rho(j), rho(k))));
      if (!G.dot) dg(j, k) = AddUp(G.dg(j, k), MulUp(G.c_g, AddUp(rho(j), rho(k))));
    }
  for (int j = 0; j < n; ++j) du(j, j) = db(j, j) = dg(j, j) = 0;  // a token's distance to itself
  for (int i = 0; i < n; ++i) {
    const int len = causal ? i + 1 : n;
    for (int j = 0; j < n; ++j) {
      if (j >= len) {
        F.a_sup(i, j) = F.g_sup(i, j) = F.b_sup(i, j) = F.pa(i, j) = 0;
        continue;
      }
      F.a_sup(i, j) = MeanDistanceUp(F.p_hi, du, i, j, len);
      // P_ij ||a_ij|| = P_ij ||sum_{k != j} P_ik (u_j - u_k)|| <= P_ij (1 - P_ij) max_{k != j} d_jk.
      const double pq = MaxOfPTimesOneMinusP(F.p_lo(i, j), F.p_hi(i, j));
      F.pa(i, j) = std::min(MulUp(F.p_hi(i, j), F.a_sup(i, j)), MulUp(pq, du.row(j).head(len).maxCoeff()));
      const double bmean = MeanDistanceUp(F.p_hi, db, i, j, len);
      if (G.dot) {
        F.g_sup(i, j) = AddUp(G.g_norm(i), MulUp(G.c_g, rho(i)));
        F.b_sup(i, j) = bmean;
      } else {
        F.g_sup(i, j) = MulUp(2.0, dg(i, j));
        F.b_sup(i, j) = MulUp(2.0, bmean);
      }
    }
  }
  return F;
}


// ---------------------------------------------------------------------------------------
// The MHA input over the cover: z = LN(x) (or x), its centre and per-token radii.
// ---------------------------------------------------------------------------------------
struct MhaInput {
  Eigen::MatrixXd zc;            // centre of the z-cover (exact doubles)
  Eigen::VectorXd rho_z;         // ||z_j - zc_j||_2 <= rho_z_j over the set
  double joint_z = kInf;         // ||Z - Zc||_F <= joint_z over the set
  Eigen::VectorXd ell;           // sup ||J_LN(x_j)||_p over the set (1 without LayerNorm)
  Eigen::VectorXd delta_ln;      // sup ||J_LN(x_j) - J_LN(x0_j)||_2 (0 without LayerNorm)
  std::vector<IntervalMatrix> ln_jac;  // J_LN(x0_j) enclosures (with LayerNorm)
  bool residual = false;
};

// sup ||J_LN(x)||_inf over a token's ball of radius rho around x0, where c are the centred
// entries of x0 and sigma >= sigma_lo. Row a of J_LN is gamma_a (e_a - 1/D - xhat_a xhat / D) / sigma,
// whose l1 norm is at most |gamma_a| (2 + |xhat_a| ||xhat||_1 / D) / sigma. Centring is an
// orthogonal projection, so |c_a| <= |c0_a| + rho and ||c||_1 <= ||c0||_1 + sqrt(D) rho; and
// |xhat_a| ||xhat||_1 / D <= sqrt(D) always.
double LayerNormInfNormUp(const LayerNormParams& ln, const std::vector<Interval>& c, double rho, double sigma_lo) {
  const int d = int(c.size());
  double c1 = 0;
  for (const Interval& ca : c) c1 = AddUp(c1, ca.Mag());
  const double l1 = AddUp(c1, MulUp(SqrtUp(double(d)), rho));
  const double cap = SqrtUp(double(d));
  const double denom = MulDown(MulDown(sigma_lo, sigma_lo), double(d));
  double out = 0;
  for (int a = 0; a < d; ++a) {
    const double coupling = std::min(cap, DivUp(MulUp(AddUp(c[a].Mag(), rho), l1), denom));
    out = std::max(out, DivUp(MulUp(std::fabs(ln.gamma(a)), AddUp(2.0, coupling)), sigma_lo));
  }
  return out;
}

MhaInput MhaInputOver(const AttentionLayer& L, const TokenCover& cover, NormKind p) {
  MhaInput m;
  const int n = int(cover.center.rows()), d = int(cover.center.cols());
  m.ell = Eigen::VectorXd::Ones(n);
  m.delta_ln = Eigen::VectorXd::Zero(n);
  if (!L.layer_norm) {
    m.zc = cover.center;
    m.rho_z = cover.radius;
    m.joint_z = JointRadiusUp(cover);
    return m;
  }
  m.residual = true;
  const LayerNormParams& ln = *L.layer_norm;
  const double gmax = ln.gamma.cwiseAbs().maxCoeff();
  const Interval dd{double(d)};
  const double sqrt_d_lo = SqrtDown(double(d));
  m.zc.resize(n, d);
  m.rho_z.resize(n);
  // ||z_j - zc_j|| <= ell_j ||x_j - x0_j|| + err_j, so ||Z - Zc||_F <= max_j ell_j ||X - X0||_F + ||err||.
  double ell_joint = 0, err_joint2 = 0;
  for (int j = 0; j < n; ++j) {
    const LayerNormRowEnclosure r = EncloseLayerNormRow(ln, cover.center.row(j));
    const std::vector<Interval>& c = r.centred;
    const Interval& sigma0 = r.sigma;
    double cn_lo2 = 0, cn_hi2 = 0;
    for (int a = 0; a < d; ++a) {
      cn_lo2 = AddDown(cn_lo2, MulDown(c[a].Mig(), c[a].Mig()));
      cn_hi2 = AddUp(cn_hi2, MulUp(c[a].Mag(), c[a].Mag()));
    }
    const double rho = cover.radius(j);
    const double cn_lo = SqrtDown(cn_lo2), cn_hi = SqrtUp(cn_hi2);
    const double shrunk = std::max(0.0, SubDown(cn_lo, rho));
    const double sigma_lo = SqrtDown(AddDown(DivDown(MulDown(shrunk, shrunk), double(d)), ln.eps));
    const double grown = AddUp(cn_hi, rho);
    const double sigma_hi = SqrtUp(AddUp(DivUp(MulUp(grown, grown), double(d)), ln.eps));
    const double ell2 = DivUp(gmax, sigma_lo);
    m.ell(j) = p == NormKind::kL2 ? ell2 : LayerNormInfNormUp(ln, c, rho, sigma_lo);
    // Centre z0 = gamma * c / sigma0 + beta, enclosed; the cover's centre is its midpoint.
    const std::vector<Interval>& xhat = r.xhat;
    double err2 = 0;
    for (int a = 0; a < d; ++a) {
      const Interval& z = r.z[a];
      const double mid = 0.5 * z.lo + 0.5 * z.hi;
      m.zc(j, a) = mid;
      const double e = std::max(SubUp(z.hi, mid), SubUp(mid, z.lo));
      err2 = AddUp(err2, MulUp(e, e));
    }
    m.rho_z(j) = AddUp(MulUp(ell2, rho), SqrtUp(err2));
    ell_joint = std::max(ell_joint, ell2);
    err_joint2 = AddUp(err_joint2, err2);
    // ||J_LN(x) - J_LN(x0)||_2 <= max|gamma| [(1/sigma_lo - 1/sigma_hi) + 2 rho / (sigma_lo^2 sqrt(D))].
    const double t1 = SubUp(DivUp(1.0, sigma_lo), DivDown(1.0, sigma_hi));
    const double t2 = DivUp(MulUp(2.0, rho), MulDown(MulDown(sigma_lo, sigma_lo), sqrt_d_lo));
    m.delta_ln(j) = MulUp(gmax, AddUp(std::max(t1, 0.0), t2));
    // J_LN(x0_j) = diag(gamma) (I - 11^T/D - xhat xhat^T / D) / sigma0.
    Eigen::MatrixXd lo(d, d), hi(d, d);
    const Interval inv_d = Interval(1.0) / dd;
    const Interval inv_sigma = Interval(1.0) / sigma0;
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b) {
        Interval e = -(inv_d + xhat[a] * xhat[b] * inv_d);
        if (a == b) e += Interval(1.0);
        e = Interval(ln.gamma(a)) * e * inv_sigma;
        lo(a, b) = e.lo;
        hi(a, b) = e.hi;
      }
    m.ln_jac.push_back(IntervalMatrix::FromBounds(lo, hi));
  }
  m.joint_z = AddUp(MulUp(ell_joint, JointRadiusUp(cover)), SqrtUp(err_joint2));
  return m;
}

// ||B diag(s)||_p for a nonnegative block-bound matrix B.
double ScaledNonnegNormUp(Eigen::MatrixXd b, const Eigen::VectorXd& s, NormKind p) {
  for (Eigen::Index j = 0; j < b.cols(); ++j)
    for (Eigen::Index i = 0; i < b.rows(); ++i) b(i, j) = MulUp(b(i, j), s(j));
  return NonnegNormUp(b, p);
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
  return std::min(NonnegNormUp(p_hi, p), SqrtUp(col));
}



// Norm 2, row i: upper bounds on sum_k P_ik ||a_ik||^2 and sum_k P_ik ||b_ik||^2 over the cover.
// A weighted mean minimises the weighted squared distances, so sum_k P_ik ||u_k - ubar_i||^2 <=
// sum_k P_ik ||u_k - u0_m||^2 for every centre value u0_m, each term below (du0_km + c_u rho_k)^2
// (knapsack over P_i); likewise for b (l2: b = 2 (g - gbar)). The best m is taken. Then
//   ||E_i|| <= sum_k P_ik ||a_ik|| ||b_ik|| <= (a2 b2)^1/2  and
//   sum_j P_ij ||a_ij|| ||g_ij|| <= (a2 sum_j P_ij ||g_ij||^2)^1/2   (Cauchy-Schwarz).
struct RowSpread {
  double a2 = kInf, b2 = kInf;
};

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

// Bounds on one L2 head's attention blocks (norm 2) that hold for every input, so they do
// not grow with the set (Kim et al.'s argument, applied per block; docs/engines.md, "L2
// attention: bounds that do not grow with the set"). With d_ij = ||q_i - q_j||, c = sqrt(dk)
// and the query's own key in every row, P_ij d_ij^2 <= c W0(1/e), sum_k P_ik d_ik^2 <=
// c W0((len-1)/e) =: s, ||a_ij|| <= ||V|| (d_ij + sqrt(s)) with V = Wo_h Wv_h Wq_h^T / sqrt(dk),
// and ||g_ij|| <= 2 ||Wq_h|| d_ij / sqrt(dk). With k = 2 ||V|| ||Wq_h|| / sqrt(dk):
//   ||P_ij a_ij g_ij^T|| <= k (c W0(1/e) + sqrt(c W0(1/e) s)),  ||E_i|| <= k s,
//   sum_j P_ij ||a_ij|| ||g_ij|| <= k (s + sqrt(s) sqrt(s)) = 2 k s.
struct L2HeadCaps {
  double k = 0;
  double c = 0;   // sqrt(dk), rounded up
  double w1 = 0;  // c W0(1/e)
  double Spread(int len) const { return MulUp(c, LambertW0Upper(DivUp(double(len - 1), ExpLower(1.0)))); }
  L2BlockCaps For(int len) const {
    const double s = Spread(len);
    return L2BlockCaps{MulUp(k, AddUp(w1, SqrtUp(MulUp(w1, s)))), MulUp(k, s), MulUp(2.0, MulUp(k, s))};
  }
};

L2HeadCaps CapsOfL2Head(const AttentionLayer& L, int h) {
  L2HeadCaps caps;
  const Eigen::MatrixXd wq = L.wq_head(h);
  const Interval inv_sqrt_dk = Interval(1.0) / Sqrt(Interval(double(L.head_dim_qk)));
  const IntervalMatrix v = Scale(inv_sqrt_dk, Mul(Mul(L.wo_head(h), L.wv_head(h)), Eigen::MatrixXd(wq.transpose())));
  caps.k = MulUp(MulUp(MulUp(2.0, NormL2UpperInterval(v).value()), NormL2Upper(wq).value()), inv_sqrt_dk.hi);
  caps.c = SqrtUp(double(L.head_dim_qk));
  caps.w1 = MulUp(caps.c, LambertW0Upper(DivUp(1.0, ExpLower(1.0))));
  return caps;
}

// The dense enclosure of J_MHA at the z-centre (ND x ND, row-major token blocks). Block
// rows are independent: they are filled in parallel, heads added in order within each.
IntervalMatrix DenseMhaJacobian(const AttentionLayer& L, const std::vector<HeadGeometry>& geo,
                                const std::vector<FactorBounds>& centre, int n, int d) {
  Eigen::MatrixXd mid = Eigen::MatrixXd::Zero(n * d, n * d), rad = Eigen::MatrixXd::Zero(n * d, n * d);
  auto accumulate = [&](int i, int j, const IntervalMatrix& blk) {
    IntervalMatrix cur(mid.block(i * d, j * d, d, d), rad.block(i * d, j * d, d, d));
    cur = cur + blk;
    mid.block(i * d, j * d, d, d) = cur.mid;
    rad.block(i * d, j * d, d, d) = cur.rad;
  };
  auto row_of = [](const IntervalMatrix& m, int r) { return IntervalMatrix(m.mid.row(r), m.rad.row(r)); };
  std::vector<IntervalMatrix> p0(L.heads), ubar(L.heads), bbar(L.heads);
  for (int h = 0; h < L.heads; ++h) {
    p0[h] = IntervalMatrix::FromBounds(centre[h].p_lo, centre[h].p_hi);
    ubar[h] = Mul(p0[h], geo[h].u);
    bbar[h] = Mul(p0[h], geo[h].b);
  }
  ParallelFor(n, WorkerCount(0, n), [&](int i, int) {
    const int len = L.causal ? i + 1 : n;
    for (int h = 0; h < L.heads; ++h) {
      const HeadGeometry& G = geo[h];
      // a_ik and b_ik rows for k < len.
      std::vector<IntervalMatrix> a(len), b(len);
      const IntervalMatrix ui = row_of(ubar[h], i), bi = row_of(bbar[h], i);
      for (int k = 0; k < len; ++k) {
        a[k] = row_of(G.u, k) - ui;  // 1 x D
        b[k] = row_of(G.b, k) - bi;
        if (!G.dot) b[k] = Scale(Interval(2.0), b[k]);
      }
      IntervalMatrix e_i = IntervalMatrix::Point(Eigen::MatrixXd::Zero(d, d));
      for (int k = 0; k < len; ++k) e_i = e_i + Scale(p0[h](i, k), Mul(a[k].transpose(), b[k]));
      const IntervalMatrix gi = row_of(G.g, i);
      for (int j = 0; j < len; ++j) {
        IntervalMatrix gij = gi;  // dot: Wk^T q_i / sqrt(dk)
        if (!G.dot) gij = Scale(Interval(2.0), gi - row_of(G.g, j));
        IntervalMatrix blk = Scale(p0[h](i, j), G.w + Mul(a[j].transpose(), gij));
        if (i == j) blk = blk + e_i;
        accumulate(i, j, blk);
      }
    }
  });
  return IntervalMatrix(std::move(mid), std::move(rad));
}

// J = I + J_M blockdiag(L_j) for the LayerNorm sublayer (block columns in parallel).
IntervalMatrix ComposeWithLayerNorm(const IntervalMatrix& jm, const std::vector<IntervalMatrix>& ln, int n, int d,
                                    bool add_identity) {
  Eigen::MatrixXd mid(n * d, n * d), rad(n * d, n * d);
  ParallelFor(n, WorkerCount(0, n), [&](int j, int) {
    const IntervalMatrix col(jm.mid.middleCols(j * d, d), jm.rad.middleCols(j * d, d));
    const IntervalMatrix prod = Mul(col, ln[j]);
    mid.middleCols(j * d, d) = prod.mid;
    rad.middleCols(j * d, d) = prod.rad;
  });
  IntervalMatrix out(std::move(mid), std::move(rad));
  if (!add_identity) return out;
  return out + IntervalMatrix::Point(Eigen::MatrixXd::Identity(n * d, n * d));
}

}  // namespace

TokenCover MhaInputCover(const AttentionLayer& layer, const TokenCover& cover, double* ell_max) {
  const MhaInput in = MhaInputOver(layer, cover, NormKind::kL2);
  if (ell_max) *ell_max = in.ell.maxCoeff();
  return TokenCover{in.zc, in.rho_z, in.joint_z};
}

ProbabilityRanges AttentionProbabilityRanges(const AttentionLayer& layer, const TokenCover& cover, int head) {
  const MhaInput in = MhaInputOver(layer, cover, NormKind::kL2);
  const FactorBounds f = Bounds(Geometry(layer, head, in.zc, NormKind::kL2), in.rho_z, in.joint_z, layer.causal);
  return ProbabilityRanges{f.p_lo, f.p_hi};
}

L2BlockCaps L2AttentionCaps(const AttentionLayer& layer, int head, int len) {
  if (layer.kind != AttentionKind::kL2) throw std::invalid_argument("L2AttentionCaps: not an l2 layer");
  return CapsOfL2Head(layer, head).For(len);
}

double JointRadiusUp(const TokenCover& cover) {
  double s = 0;
  for (Eigen::Index i = 0; i < cover.radius.size(); ++i) s = AddUp(s, MulUp(cover.radius(i), cover.radius(i)));
  return std::min(cover.frobenius, SqrtUp(s));
}

TokenCover CoverOf(const InputSet& set) {
  TokenCover c;
  c.center = set.center;
  c.radius = Eigen::VectorXd::Constant(set.tokens(), set.TokenRadius());
  c.frobenius = set.FrobeniusRadius();
  return c;
}

}  // namespace lipcert

namespace lipcert {

UpperBound BlockNormUpperBound(const AttentionLayer& L, const TokenCover& cover, const BoundOptions& opts) {
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
  ParallelFor(L.heads, WorkerCount(0, L.heads), [&](int h, int) {
    geo[h] = Geometry(L, h, in.zc, p);
    fb[h] = Bounds(geo[h], in.rho_z, in.joint_z, L.causal);
    if (p == NormKind::kL2)
      for (int i = 0; i < n; ++i) spread[h][i] = RowSpreadUp(geo[h], fb[h], in.rho_z, i, L.causal ? i + 1 : n);
  });
  // L2 heads in norm 2 also have bounds that hold for every input (caps).
  const bool capped = L.kind == AttentionKind::kL2 && p == NormKind::kL2;
  std::vector<L2HeadCaps> caps(L.heads);
  if (capped)
    for (int h = 0; h < L.heads; ++h) caps[h] = CapsOfL2Head(L, h);
  auto cap_or = [&](double bound, double cap) { return capped ? std::min(bound, cap) : bound; };
  Eigen::MatrixXd diag(n, L.heads);  // bound on ||E_i|| for head h
  for (int h = 0; h < L.heads; ++h) {
    const HeadGeometry& G = geo[h];
    const FactorBounds& F = fb[h];
    kron = AddUp(kron, MulUp(ProbabilityNormUp(F.p_hi, p), G.w_norm));
    for (int i = 0; i < n; ++i) {
      const int len = L.causal ? i + 1 : n;
      const L2BlockCaps c = capped ? caps[h].For(len) : L2BlockCaps{kInf, kInf, kInf};
      // ||E_i|| <= sum_k P_ik ||a_ik|| ||b_ik||, P_i on the simplex below p_hi (knapsack).
      Eigen::VectorXd ab(len);
      for (int j = 0; j < len; ++j) {
        full(i, j) = AddUp(full(i, j), MulUp(F.p_hi(i, j), G.w_norm));
        r(i, j) = AddUp(r(i, j), cap_or(MulUp(F.pa(i, j), F.g_sup(i, j)), c.block));
        ab(j) = MulUp(F.a_sup(i, j), F.b_sup(i, j));
      }
      double e = SimplexWeightedSumUp(F.p_hi.row(i).transpose(), ab, len);
      if (p == NormKind::kL2) e = std::min(e, SqrtUp(MulUp(spread[h][i].a2, spread[h][i].b2)));
      diag(i, h) = cap_or(e, c.diagonal);
      r(i, i) = AddUp(r(i, i), diag(i, h));
    }
  }
  const double ell_max = in.ell.maxCoeff();
  const double split = AddUp(MulUp(kron, ell_max), ScaledNonnegNormUp(r, in.ell, p));
  Eigen::MatrixXd all(n, n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) all(i, j) = AddUp(full(i, j), r(i, j));
  const double joint = ScaledNonnegNormUp(all, in.ell, p);
  // Row sums of the block bounds (times ell_j) with P's rows on the simplex:
  //   sum_j ||J_ij|| ell_j <= sum_h [ sum_j P_ij (||W_h|| + a g) ell_j + ell_i ||E_i|| ],
  // sum_j P_ij a g by the knapsack, by Cauchy-Schwarz over the row's spreads (norm 2) or by
  // the L2 cap, whichever is smallest. Then ||.||_inf <= max row sum, and
  // ||.||_2 <= sqrt(max row sum * max column sum).
  double row_max = 0;
  for (int i = 0; i < n; ++i) {
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
      if (capped) t = std::min(t, MulUp(AddUp(geo[h].w_norm, caps[h].For(len).row_sum), ell_row));
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
  const double mha = std::min({split, joint, schur});
  return UpperBound(in.residual && !opts.exclude_residual ? AddUp(1.0, mha) : mha);
}

UpperBound CentredUpperBound(const AttentionLayer& L, const TokenCover& cover, const BoundOptions& opts) {
  if (opts.norm != NormKind::kL2) throw std::invalid_argument("centred engine: norm 2 only");
  const int n = int(cover.center.rows()), d = int(cover.center.cols());
  if (long(n) * d > opts.dense_limit)
    throw std::invalid_argument("centred engine: N*D = " + std::to_string(long(n) * d) +
                                " exceeds dense_limit " + std::to_string(opts.dense_limit));
  const NormKind p = NormKind::kL2;
  const MhaInput in = MhaInputOver(L, cover, p);
  std::vector<HeadGeometry> geo;
  std::vector<FactorBounds> centre;
  const Eigen::VectorXd zero = Eigen::VectorXd::Zero(n);
  // sup ||J_M(z) - J_M(zc)|| <= kron + ||rd||, with rd the N x N block bounds.
  double kron = 0;
  Eigen::MatrixXd full = Eigen::MatrixXd::Zero(n, n), rd = Eigen::MatrixXd::Zero(n, n);
  // Row sums of the block bounds of J(X) - J(X0) (columns scaled by ell), with the rows of
  // dP and P0 on the simplex (see SimplexWeightedSumUp).
  Eigen::VectorXd row_sum = Eigen::VectorXd::Zero(n);
  for (int h = 0; h < L.heads; ++h) {
    geo.push_back(Geometry(L, h, in.zc, p));
    const HeadGeometry& G = geo.back();
    const FactorBounds F = Bounds(G, in.rho_z, in.joint_z, L.causal);
    centre.push_back(Bounds(G, zero, 0.0, L.causal));
    const FactorBounds& F0 = centre.back();
    // w_ij >= |P_ij(X) - P_ij(X0)|.
    Eigen::MatrixXd w(n, n);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        w(i, j) = std::max({SubUp(F.p_hi(i, j), F0.p_lo(i, j)), SubUp(F0.p_hi(i, j), F.p_lo(i, j)), 0.0});
    kron = AddUp(kron, MulUp(NonnegNormUp(w, p), G.w_norm));
    for (int i = 0; i < n; ++i) {
      const int len = L.causal ? i + 1 : n;
      const double rho_max = in.rho_z.head(len).maxCoeff();
      // sum_k |P_ik - P0_ik| c_k <= the greedy sum with caps w_ik and total 2.
      const Eigen::VectorXd w_i = w.row(i).transpose(), p0_i = F0.p_hi.row(i).transpose();
      auto dp_sum = [&](const Eigen::MatrixXd& dist, int j) {
        return SimplexWeightedSumUp(w_i, dist.row(j).transpose(), len, 2.0);
      };
      // Row i's terms, split by their weights (w or P0) for the row-sum bound below.
      Eigen::VectorXd cw_t(len), cp_t(len), cw_e(len), cp_e(len);
      double de = 0;
      for (int j = 0; j < len; ++j) {
        full(i, j) = AddUp(full(i, j), MulUp(w(i, j), G.w_norm));
        // a_ij - a0_ij = du_j - dubar_i: ||.|| <= c_u (rho_j + max_k rho_k) + sum_k |dP_ik| ||u0_k - u0_j||.
        const double da = AddUp(MulUp(G.c_u, AddUp(in.rho_z(j), rho_max)), dp_sum(G.du, j));
        double dg, db;
        if (G.dot) {
          dg = MulUp(G.c_g, in.rho_z(i));
          db = AddUp(MulUp(G.c_b, AddUp(in.rho_z(j), rho_max)), dp_sum(G.db, j));
        } else {
          dg = MulUp(2.0, MulUp(G.c_g, AddUp(in.rho_z(i), in.rho_z(j))));
          db = MulUp(2.0, AddUp(MulUp(G.c_g, AddUp(in.rho_z(j), rho_max)), dp_sum(G.dg, j)));
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
      row_sum(i) = AddUp(row_sum(i), row);
    }
  }
  const double ell_max = in.ell.maxCoeff();
  Eigen::MatrixXd all(n, n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) all(i, j) = AddUp(full(i, j), rd(i, j));
  double col_max = 0;
  for (int j = 0; j < n; ++j) {
    double s = 0;
    for (int i = 0; i < n; ++i) s = AddUp(s, all(i, j));
    col_max = std::max(col_max, MulUp(s, in.ell(j)));
  }
  // ||B||_2 <= sqrt(||B||_inf ||B||_1) for the block-bound matrix B.
  const double schur = SqrtUp(MulUp(row_sum.maxCoeff(), col_max));
  if (std::getenv("LIPCERT_DEBUG_BOUNDS"))
    std::fprintf(stderr, "centred delta: row max %.6g, col max %.6g, schur %.6g, kron+rd %.6g, all %.6g\n", row_sum.maxCoeff(),
                 col_max, schur, AddUp(MulUp(kron, ell_max), ScaledNonnegNormUp(rd, in.ell, p)), ScaledNonnegNormUp(all, in.ell, p));
  double delta = std::min({AddUp(MulUp(kron, ell_max), ScaledNonnegNormUp(rd, in.ell, p)),
                           ScaledNonnegNormUp(all, in.ell, p), schur});
  const IntervalMatrix jm = DenseMhaJacobian(L, geo, centre, n, d);
  IntervalMatrix j0 = jm;
  if (in.residual) {
    // + ||J_M(zc)|| max_j ||J_LN(x_j) - J_LN(x0_j)||.
    // (multiplied by a small variation: the crude sqrt(||.||_1 ||.||_inf) bound serves)
    delta = AddUp(delta, MulUp(NormL2UpperCrude(jm).value(), in.delta_ln.maxCoeff()));
    j0 = ComposeWithLayerNorm(jm, in.ln_jac, n, d, !opts.exclude_residual);
  }
  const double centre_norm = NormL2UpperInterval(j0).value();
  if (std::getenv("LIPCERT_DEBUG_BOUNDS"))
    std::fprintf(stderr, "centred: ||J(X0)|| <= %.6g, kron %.6g, ||rd diag(ell)|| %.6g, ln term %.6g, ell_max %.4g, rho_z max %.4g\n",
                 centre_norm, MulUp(kron, ell_max), ScaledNonnegNormUp(rd, in.ell, p),
                 in.residual ? MulUp(NormL2UpperCrude(jm).value(), in.delta_ln.maxCoeff()) : 0.0, ell_max,
                 in.rho_z.maxCoeff());
  return UpperBound(AddUp(centre_norm, delta));
}

}  // namespace lipcert
