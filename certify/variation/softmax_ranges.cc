// Softmax ranges over the cover: the logit box, its row-wise softmax ranges and their
// tangent-plane tightening.
#include "certify/head_factors.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "interval/elementary.h"
#include "interval/softmax.h"

namespace lipcert {

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

// >= range(l)^2 / 8 for row i (log-sum-exp's Bregman term), l_k = s_ik - s0_ik over k < len
// from the logit box [lo, hi] and the centre's [s0_lo, s0_hi] (shift-invariant, so the dot
// box's shift is harmless).
static double BregmanUp(const Eigen::MatrixXd& lo, const Eigen::MatrixXd& hi, const Eigen::MatrixXd& s0_lo,
                        const Eigen::MatrixXd& s0_hi, int i, int len) {
  double top = -kInf, bottom = kInf;
  for (int k = 0; k < len; ++k) {
    top = std::max(top, SubUp(hi(i, k), s0_lo(i, k)));
    bottom = std::min(bottom, SubDown(lo(i, k), s0_hi(i, k)));
  }
  const double range = SubUp(top, bottom);
  return MulUp(0.125, MulUp(range, range));
}

// Dot heads: >= ||c g_i + w||, w = b_j - bbar_i, c = 1[i=j] - P0_ii: by the triangle
// inequality (gn >= ||g_i||, to_mean >= ||w||), and expanded as c^2 ||g_i||^2 + 2 c g_i.w +
// ||w||^2 (gg encloses ||g_i||^2, gb g_i.b_j and gbbar g_i.bbar_i).
static double DotRowNormUp(const Interval& c, double gn, double to_mean, const Interval& gg, const Interval& gb,
                           const Interval& gbbar) {
  const double row_i = AddUp(MulUp(c.Mag(), gn), to_mean);
  const Interval cross = Sqr(c) * gg + Interval(2.0) * c * (gb - gbbar);
  const double expanded = AddUp(cross.hi, MulUp(to_mean, to_mean));
  return std::min(row_i, SqrtUp(std::max(expanded, 0.0)));
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
    const double bregman = BregmanUp(lo, hi, s0_lo, s0_hi, i, len);
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
        const Interval c = Interval(i == j ? 1.0 : 0.0) - p0(i, i);
        row_i = DotRowNormUp(c, gn, to_mean(i, j), gg, gb(i, j), gbbar(i, i));
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

}  // namespace lipcert
