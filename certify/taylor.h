// The Taylor model of MHA's Jacobian over a set (docs/engines.md, "Certified curvature at the
// centre", "A structured third-derivative bound"):
//
//     sup_S ||J(X)||_2 <= ||J(X0)||_2 + R C(X0) + R^2 / 2 sup_cover ||D^3 f||,
//
// with C(X0) the certified curvature at the centre (CentreCurvatureUpperBound) and the
// remainder's third derivative bounded per head and row from the softmax's cumulants, in
// weighted second moments of the direction (so a key moving is felt by a row in proportion
// to the probability the row gives it) rather than every row at its worst.
#pragma once

#include "certify/curvature.h"
#include "certify/engine_bound.h"
#include "certify/token_cover.h"
#include "models/attention_layer.h"

namespace lipcert {

// sup over X in the cover and ||U||_F = 1 of ||D^3 f(X)[U, U, U]||_F for MHA alone (dot heads,
// biases and causal mask allowed). Per head h and row i, with t_j = ||u_j||, W_i = sum_j P_ij t_j^2,
// the third derivative is k4(x; l', l', l') + 3 k3(x; l', l'') + 3 k3(c; l', l') + 3 Cov(c, l'')
// (x_j = Wo_h v_j, c_j = Wo_h Wv_h u_j, l the logits; cumulants under row i's softmax), and each
// cumulant is bounded by Cauchy-Schwarz in the row's weighted moments: its norm is at most
// t_i A_ih + sqrt(W_i) B_ih, so the whole is at most
//     max_i sum_h A_ih + sum_h sqrt(max_j sum_i Phat_ij B_ih^2),
// Phat the softmax's upper bounds over the cover. +inf for L2 attention or a LayerNorm.
UpperBound StructuredThirdDerivativeUpperBound(const AttentionLayer& layer, const TokenCover& cover);

// The Taylor model as an engine bound over a convex set containing its centre: terms
// "centre" (the caller's certified ||J(X0)||_2), "curvature x radius" (R C(X0)) and
// "remainder" (R^2 / 2 times the smaller of StructuredThirdDerivativeUpperBound over the
// cover and ThirdDerivativeUpperBound over the Frobenius ball of radius R); upper is their
// sum. R = JointRadiusUp(cover). The note carries the curvature's refusal message.
EngineBound TaylorVariationBound(const AttentionLayer& layer, UpperBound centre_norm, const TokenCover& cover,
                                 const CurvatureBound& centre_curvature);

}  // namespace lipcert
