// The BERT-family post-LN sublayer f(X) = LN(X + MHA(X)) (docs/engines.md, "Post-LN
// composition"). Its Jacobian is J_f(X) = J_LN(Y) (I + J_MHA(X)), Y = X + MHA(X), so over a
// convex set S with X0 in S
//   sup_S ||J_f||_p <= sup_{Y in cover(Y)} ||J_LN(Y)||_p * (1 + U_p),
// U_p >= sup_S ||J_MHA||_p certified by the whole pipeline on MHA alone, and cover(Y) the
// per-token balls ||y_i - y0_i|| <= r_i + U_2 R_joint + err_i (the mean value theorem in the
// Frobenius norm; y0 = X0 + MHA(X0) enclosed in interval arithmetic, err_i its half-width).
// ||J_LN(y)||_2 <= max|gamma| / sigma(y) and ||J_LN(y)||_inf by row sums
// (certify/layer_norm_cover.h), sigma bounded below over each ball.
#pragma once

#include <functional>

#include "certify/certificate.h"
#include "certify/certify.h"
#include "certify/engine_bound.h"
#include "certify/input_set.h"
#include "certify/token_cover.h"
#include "interval/elementary.h"
#include "interval/rounding.h"
#include "models/attention_layer.h"

namespace lipcert {

// Y0 = X0 + MHA(X0) enclosed in interval arithmetic, token by token: `centre` the midpoint of
// each entry's enclosure (exact doubles) and err(i) >= ||y0_i - centre_i||_2 (the half-widths'
// norm, rounded up), err_frobenius >= ||Y0 - centre||_F. `layer` is the post-LN layer (its
// MHA is evaluated) or MHA alone. Where an entry's enclosure is not finite, finite is false,
// that token's centre row is +inf and its err +inf. The one enclosure of Y0 that the
// composition, the post-LN centre and the post-LN variation share (so their centres agree).
struct YEnclosure {
  Eigen::MatrixXd centre;
  Eigen::VectorXd err;
  double err_frobenius = kInf;
  bool finite = false;
};
YEnclosure EncloseY(const AttentionLayer& layer, const Eigen::MatrixXd& x0, ExpBackend exp_backend = DefaultExpBackend());

struct PostLayerNormBound {
  UpperBound upper{kInf};       // >= sup over the cover of ||J_f||_p
  UpperBound ln_upper{kInf};    // >= sup over cover(Y) of ||J_LN(Y)||_p (block-diagonal)
  TokenCover y_cover;           // the cover of Y = X + MHA(X)
};

// The composition above. `mha_l2` >= sup over the cover of ||J_MHA||_2 (needed for the cover
// of Y whatever the norm), `mha_p` the same in the norm p. Throws std::invalid_argument when
// `layer` has no post-LN.
PostLayerNormBound ComposePostLayerNorm(const AttentionLayer& layer, const TokenCover& cover, UpperBound mha_l2,
                                        UpperBound mha_p, NormKind p, ExpBackend exp_backend = DefaultExpBackend());

// At a point (radius 0, norm 2): J_f(X0) = J_LN(Y0) (I + J_MHA(X0)) enclosed as a dense
// (ND x ND) interval matrix and its norm certified (Cholesky, interval/norms.h). Y0 is
// enclosed in balls around exact centres yc_j, so
//   ||J_f(X0)|| <= ||blockdiag(J_LN(yc_j)) (I + J_MHA(X0))|| + max_j sup ||J_LN(y_j) - J_LN(yc_j)|| (1 + ||J_MHA||).
// Above N*D = min(8192, opts.dense_limit) the first term comes from deflated super-blocks instead (Lanczos vectors of
// J_f itself, as many as fit before the deadline: opts.deflation_vectors at most, none below
// 32; docs/engines.md, "Deflation"), and ||J_MHA|| from its Frobenius norm.
// The layer must have no pre-LN. Timed out (upper +inf) once opts.deadline passes.
// Certify's post-LN stages (certify/stages.h) also use its first term over a set, adding
// sup ||J_LN|| times MHA's certified centre_norm variation and sup ||J_LN(Y) - J_LN(yc)||
// (1 + MHA's bound).
EngineBound PostLnCentreBound(const AttentionLayer& layer, const Eigen::MatrixXd& x0, const BoundOptions& opts);

}  // namespace lipcert
