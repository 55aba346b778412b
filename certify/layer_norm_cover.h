// The cover of the MHA input z = LN(x) (or x without LayerNorm) implied by a cover of the
// sublayer's input X, with the LayerNorm Jacobian factors the engines multiply by
// (docs/engines.md, "LayerNorm"). Every number is an upper bound, rounded up, unless named
// otherwise; the centre zc is an exact double matrix (the midpoint of the enclosure of
// LN(x0)), its enclosure error folded into rho_z.
#pragma once

#include <Eigen/Dense>
#include <vector>

#include "certify/input_set.h"
#include "certify/token_cover.h"
#include "interval/interval_matrix.h"
#include "models/attention_layer.h"

namespace lipcert {

struct MhaInput {
  Eigen::MatrixXd zc;            // centre of the z-cover (exact doubles)
  Eigen::VectorXd rho_z;         // ||z_j - zc_j||_2 <= rho_z_j over the set
  double joint_z = kInf;         // ||Z - Zc||_F <= joint_z over the set
  Eigen::VectorXd ell;           // sup ||J_LN(x_j)||_p over the set (1 without LayerNorm)
  Eigen::VectorXd delta_ln;      // sup ||J_LN(x_j) - J_LN(x0_j)||_2 (0 without LayerNorm)
  std::vector<IntervalMatrix> ln_jac;  // J_LN(x0_j) enclosures (with LayerNorm)
  bool residual = false;         // the layer is the sublayer X + MHA(LN(X))
};

// The MHA input over a cover of X, with ell in the norm p (2 or inf).
// Encloses J_LN(x0) = diag(gamma) (I - 11^T/D - xhat xhat^T / D) * inv_sigma for the
// enclosures xhat of x0's normalised entries, inv_sigma of 1/sigma0 and inv_d of 1/D.
IntervalMatrix LayerNormJacobianEnclosure(const Eigen::VectorXd& gamma, const std::vector<Interval>& xhat,
                                          const Interval& inv_sigma, const Interval& inv_d);
MhaInput MhaInputOver(const AttentionLayer& layer, const TokenCover& cover, NormKind p);

// J_LN(y) = diag(g) Pi, g_a = gamma_a / sigma(y) and Pi = I - 11^T/D - yhat yhat^T/D, at the
// point y (EncloseLayerNormRow's quantities). Encloses Pi A for every A in `a` (D x m) as
// A - W (V^T A), W = [1/D, yhat/D] and V = [1, yhat]: two rank-2 products, O(D m) work where
// J_LN(y) A costs O(D^2 m). *row_gain receives the enclosures of g_a: row a of J_LN(y) A is g_a
// times row a of the result.
IntervalMatrix LayerNormProjectionTimes(const LayerNormParams& ln, const Eigen::RowVectorXd& y, const IntervalMatrix& a,
                                        std::vector<Interval>* row_gain);

// >= sup ||J_LN(x)||_inf over a token's ball of radius rho around x0, where c encloses the
// centred entries of x0 and sigma_lo <= sigma over the ball.
double LayerNormInfNormUp(const LayerNormParams& ln, const std::vector<Interval>& c, double rho, double sigma_lo);

// >= sup over ||y - yc|| <= rho of ||J_LN(y) - J_LN(yc)||_2 for one token (D entries): the
// radial change of 1/sigma and the turn of the unit centred vector, apart (docs/engines.md,
// "Post-LN variation"). centred_lo: a lower bound on the centred norm over the ball, where one
// tighter than ||yc - mean|| - rho is known (TokenCover::centred_lo).
double LayerNormVariationUp(const LayerNormParams& ln, const Eigen::RowVectorXd& yc, double rho,
                            double centred_lo = 0.0);

// >= sup over ||y - yc||_2 <= rho of ||J_LN(y) - J_LN(yc)||_inf for one token (D entries),
// row by row (docs/engines.md, "The LayerNorm's variation in the inf norm"): row r is
// |gamma_r| times the l1 norm of (a - a0)(e_r - 1/D) - (b u_r u - b0 u0_r u0), with the radial
// ranges of a = 1/sigma and b = s^2 / (D sigma^3) and the turn of the unit centred vector u
// (per coordinate and in l1) taken together on each of 32 sectors of the ball (cut by the step's
// component along the centre's direction), the largest over the sectors. +inf where the
// variance may vanish over the ball (eps = 0) or the centre has no finite enclosure.
// centred_lo as for LayerNormVariationUp.
double LayerNormVariationInfUp(const LayerNormParams& ln, const Eigen::RowVectorXd& yc, double rho,
                               double centred_lo = 0.0);

// cover.centred_lo(i), or 0 where it is not known.
inline double CentredLo(const TokenCover& cover, Eigen::Index i) {
  return cover.centred_lo.size() == cover.center.rows() ? cover.centred_lo(i) : 0.0;
}

// The cover of the MHA input z (LN(X) for the sublayer, else X) implied by a cover of X;
// *ell_max (if non-null) receives an upper bound on sup ||J_LN||_2 over the set (1 without
// LayerNorm).
TokenCover MhaInputCover(const AttentionLayer& layer, const TokenCover& cover, double* ell_max);

}  // namespace lipcert
