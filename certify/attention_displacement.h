// How far each output token of MHA can move over a cover of its input, from the attention's
// own structure rather than from a Jacobian bound times the radius (docs/engines.md,
// "Displacement of a token"). For head h, with P0, v0 the centre's probabilities and values,
//
//   out_i(X) - out_i(X0) = sum_h Wo_h ( sum_j P_ij dv_j + sum_j (P_ij - P0_ij) v0_j ),
//
// the first sum a convex combination of the values' moves (||W_h dz_j|| <= c_u r_j), the
// second at most TV(P_i, P0_i) times the diameter of the centre's output-space values
// u_j = Wo_h v0_j over the row's keys (the positive and negative parts of P_i - P0_i have the
// same mass TV), and TV <= tanh(w_i / 4) for the oscillation w_i of the logits' change over
// the row's keys (the Hilbert-metric bound of two softmax rows; the log-ratio of P_i and P0_i
// oscillates by w_i). The bound saturates: TV <= 1 however far the logits move, so it stays
// finite and modest on sets where a Jacobian bound times the radius does not. Over a ball,
// along given directions, the heads are also bounded together (their logits' changes are linear
// maps of one perturbation of bounded Frobenius norm, so heads whose logit gradients point
// apart share the radius; the values' moves likewise), whichever is smaller.
#pragma once

#include <Eigen/Dense>

#include "certify/token_cover.h"
#include "interval/interval_matrix.h"
#include "models/attention_layer.h"

namespace lipcert {

// Per-head pieces of the bound, token by token (for tests and reports).
struct DisplacementReport {
  Eigen::MatrixXd logit_oscillation;  // (N, H): >= osc_j (s_ij(X) - s_ij(X0)) over row i's keys
  Eigen::MatrixXd total_variation;    // (N, H): >= TV(P_i(X), P_i(X0)), <= 1
  Eigen::MatrixXd value_diameter;     // (N, H): >= max over row i's keys j, k of ||u_j - u_k||_2
  Eigen::VectorXd value_moves;        // (N): >= ||sum_h Wo_h sum_j P_ij dv_j||_2
};

struct AttentionDisplacement {
  Eigen::VectorXd norm;   // >= sup ||MHA_i(X) - MHA_i(X0)||_2
  // >= sup |<MHA_i(X) - MHA_i(X0), w>| for every w in row i of the directions' enclosure (the
  // same bound with each head's values and moves read along w: its diameter is that of the
  // scalars <u_j, w>, its moves ||W_h^T w|| r); empty when no directions were given.
  Eigen::VectorXd along;
  DisplacementReport report;
};

// Over the cover (X0 = cover.center), every number rounded up. `mha` is MHA alone (no
// LayerNorm of either kind; throws std::invalid_argument otherwise), dot or l2, causal or
// not; `directions` (N x D, optional) the directions of `along`.
AttentionDisplacement AttentionDisplacementOver(const AttentionLayer& mha, const TokenCover& cover,
                                                const IntervalMatrix* directions = nullptr);

// AttentionDisplacementOver(mha, cover).norm.
Eigen::VectorXd AttentionDisplacementUp(const AttentionLayer& mha, const TokenCover& cover);

// >= tanh(w / 4) for w >= 0 (+inf gives 1): the largest total variation between two softmax
// rows whose logits' change oscillates by at most w.
double SoftmaxTotalVariationUp(double w);

}  // namespace lipcert
