// The cover of Y = X + M(X) (M = MHA) over a cover of the post-LN sublayer's input X, as the
// post-LN engines take it: per-token balls around the enclosure of Y0 = X0 + M(X0), and a lower
// bound on each token's centred norm, which decides whether the LayerNorm stays bounded over
// the cover (docs/engines.md, "The cover of Y").
#pragma once

#include <Eigen/Dense>

#include "certify/layer_norm_cover.h"
#include "certify/token_cover.h"
#include "interval/elementary.h"
#include "models/attention_layer.h"

namespace lipcert {

// Centre Yc: the midpoint of the interval enclosure of X0 + M(X0) (the same point
// ComposePostLayerNorm and PostLnCentreBound use). Radii r_i + m_i + err_i, err_i the
// enclosure's half-width and m_i the smaller of displacement_i (the caller's bound on
// sup_S ||M_i(X) - M_i(X0)||, e.g. a Jacobian bound times the radius) and the attention's own
// (AttentionDisplacementOver). centred_lo(i): with c0 the centred yc_i and w a unit direction
// along it, ||c(y_i)|| >= <c(y_i), w> = <c0, w> + <y_i - yc_i, w - mean(w)>, the last at most
// ||w - mean(w)|| (r_i + err_i) plus M_i's displacement along w - mean(w); a token whose ball
// reaches zero variance keeps its variance when M moves it sideways. `layer` is the post-LN
// layer. moved_frobenius (optional) >= sup_S ||M(X) - M(X0)||_F, for the cover's joint radius.
// Centre +inf entries (radius +inf) when the enclosure is not finite.
TokenCover PostLnYCover(const AttentionLayer& layer, const TokenCover& cover, const Eigen::VectorXd& displacement,
                        ExpBackend exp_backend = DefaultExpBackend(), UpperBound moved_frobenius = UpperBound(kInf));

// The cover of Y at the point X0 (radius 0, no displacement): the enclosure of Y0 = X0 + MHA(X0),
// the Y centre every cover of Y over a set around X0 shares.
TokenCover PostLnYCoverAtPoint(const AttentionLayer& layer, const Eigen::MatrixXd& x0);

// The post-LN's LayerNorm factors over a cover of Y: the pre-LN machinery (MhaInputOver) on a
// layer whose pre-LN carries the post-LN's parameters. ell: sup ||J_LN||_p per token; ln_jac:
// J_LN at the cover's centres; delta_ln: sup ||J_LN(y) - J_LN(yc)||_2 over each ball.
MhaInput PostLnFactorsOver(const AttentionLayer& layer, const TokenCover& y_cover, NormKind p);

}  // namespace lipcert
