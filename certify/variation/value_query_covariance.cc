// The values' and the query gradients' covariance under a row's weights (docs/engines.md,
// "The values' and queries' covariance").
#include "certify/head_factors.h"

#include <algorithm>
#include <cmath>

#include "interval/elementary.h"
#include "interval/softmax.h"

namespace lipcert {

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

}  // namespace lipcert
