// Certified upper bounds on sup_{X in S} ||J_f(X)|| through the Jacobian's block structure
// (docs/engines.md derives every inequality used here).
//
// For one head h, with u_j = Wo_h v_j the value of token j in output space,
// a_ij = u_j - ubar_i (ubar_i = sum_k P_ik u_k) and W_h = Wo_h M_h (M_h = Wv_h for dot,
// Wv_h A_h for l2), the (i, j) block of the MHA Jacobian is
//
//     J_ij = sum_h  P_ij W_h  +  P_ij a_ij g_ij^T  +  delta_ij E_i,     E_i = sum_k P_ik a_ik b_ik^T
//
// dot: g_ij = Wk_h^T q_i / sqrt(dk),            b_ik = Wq_h^T (k_k - kbar_i) / sqrt(dk)
// l2:  g_ij = 2 Wq_h^T (q_i - q_j) / sqrt(dk),  b_ik = 2 Wq_h^T (q_k - qbar_i) / sqrt(dk)
//
// The sublayer X + MHA(LN(X)) has J = I + J_MHA(LN(X)) J_LN(X), J_LN block-diagonal.
//
// Two engines:
//   BlockNormUpperBound: every factor bounded over the set, blocks bounded by norms, the
//     N x N matrix of block bounds bounded in norm; P (x) W_h terms by Kronecker. Any size.
//   CentredUpperBound (norm 2): a rigorous norm of J at the centre (dense interval matrix)
//     plus a bound on sup ||J(X) - J(X0)|| from the same factor bounds. Tight for small sets.
#pragma once

#include <Eigen/Dense>
#include <limits>

#include "certify/input_set.h"
#include "interval/rounding.h"
#include "models/attention_layer.h"

namespace lipcert {

// A cover of the input set by per-token balls: every X of the set has
// ||x_i - center_i||_2 <= radius_i for all i.
struct TokenCover {
  Eigen::MatrixXd center;  // (N, D)
  Eigen::VectorXd radius;  // (N), >= 0
  // ||X - center||_F <= frobenius over the set as well (a ball's radius couples the
  // tokens); infinity when only the per-token radii are known.
  double frobenius = std::numeric_limits<double>::infinity();
};

// Upper bound on ||X - center||_F over the cover: the smaller of `frobenius` and ||radius||_2.
double JointRadiusUp(const TokenCover& cover);

TokenCover CoverOf(const InputSet& set);

// The cover of the MHA input z (LN(X) for the sublayer, else X) implied by a cover of X;
// *ell_max (if non-null) receives sup ||J_LN||_2 over the set (1 without LayerNorm).
TokenCover MhaInputCover(const AttentionLayer& layer, const TokenCover& cover, double* ell_max);

struct BoundOptions {
  NormKind norm = NormKind::kL2;
  // CentredUpperBound refuses layers with N*D above this (it forms J(X0) densely).
  int dense_limit = 4096;
  // For the sublayer X + g(X): bound Lip(g) instead (drop the identity), as used to
  // certify invertibility. No effect on a layer without LayerNorm.
  bool exclude_residual = false;
};

// Certified ranges lo <= P_ij(X) <= hi of head h's attention probabilities over the cover,
// as both engines use them (0 where masked).
struct ProbabilityRanges {
  Eigen::MatrixXd lo, hi;  // (N, N)
};
ProbabilityRanges AttentionProbabilityRanges(const AttentionLayer& layer, const TokenCover& cover, int head);

// Bounds for head h of an L2 layer, in norm 2, that hold for every input (X of any size),
// for a query row with len unmasked keys (the query's own among them): with the notation of
// the block structure above, ||P_ij a_ij g_ij^T|| <= block, ||E_i|| <= diagonal and
// sum_j P_ij ||a_ij|| ||g_ij|| <= row_sum. Throws std::invalid_argument for a dot layer.
struct L2BlockCaps {
  double block = 0, diagonal = 0, row_sum = 0;
};
L2BlockCaps L2AttentionCaps(const AttentionLayer& layer, int head, int len);

// Certified: sup over the cover of ||J(X)||_p <= result.
UpperBound BlockNormUpperBound(const AttentionLayer& layer, const TokenCover& cover,
                               const BoundOptions& opts);

// Certified, norm 2 only; throws std::invalid_argument for norm inf or N*D > dense_limit.
UpperBound CentredUpperBound(const AttentionLayer& layer, const TokenCover& cover,
                             const BoundOptions& opts);

}  // namespace lipcert
