// Shared by the variation's files (certify/variation/): small bounds that more than one of
// the factor bounds and second-order forms use. Not a public API: the variation's entry
// points are in certify/head_factors.h.
#pragma once

#include <Eigen/Dense>

#include "certify/head_factors.h"
#include "interval/rounding.h"
#include "interval/softmax.h"

namespace lipcert::variation_internal {

// The rounding of the anchor fl(s_i m_j - (w m)_i) (s_i = sum_k w_ik, weights w >= 0, n
// tokens, width d) against its exact value, in a norm: at most 4 gamma_{n+2} (s_i |m_j| +
// (w |m|)_i) entrywise plus underflow, so 4 gamma_{n+2} (s_i ||m_j|| + ||(w |m|)_i||) + (n + 4) d eta.
inline double AnchorRoundingUp(double s, double m_norm, double mean_abs_norm, int n, int d) {
  const double g = MulUp(4.0, GammaUp(double(n) + 2));
  return AddUp(MulUp(g, AddUp(MulUp(s, m_norm), mean_abs_norm)), MulUp(double(n + 4) * d, kEta));
}

// max of P (1 - P) over lo <= P <= hi (rounded up).
inline double MaxOfPTimesOneMinusP(double lo, double hi) {
  const double x = hi < 0.5 ? hi : (lo > 0.5 ? lo : 0.5);
  return MulUp(x, SubUp(1.0, x));
}

// >= sum_j P_ij ||a_ij|| ||b_ij||^power over the cover (power 1 or 2): P_i on the simplex below
// p_hi, ||a_ij|| <= a_sup, ||b_ij|| <= b_sup (the query motion's spread).
inline double QueryMomentUp(const FactorBounds& F, int i, int len, int power) {
  Eigen::VectorXd c(len);
  for (int j = 0; j < len; ++j) {
    c(j) = MulUp(F.a_sup(i, j), F.b_sup(i, j));
    if (power == 2) c(j) = MulUp(c(j), F.b_sup(i, j));
  }
  return SimplexWeightedSumUp(F.p_hi.row(i).head(len).transpose(), c, len);
}

}  // namespace lipcert::variation_internal
