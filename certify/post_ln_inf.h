// The post-LN sublayer LN(X + MHA(X)) in the inf norm: its centre ||J_f(X0)||_inf from the
// dense enclosure of J_M(X0), and the MHA term of its variation token by token through
// D_i Wo (docs/engines.md, "The MHA term through D_i Wo"). D_i = D_i(yc_i) is the LayerNorm's
// Jacobian at token i of the centre of the cover of Y; J_{M,i} is token i's D rows of MHA's
// Jacobian.
#pragma once

#include <Eigen/Dense>
#include <chrono>
#include <vector>

#include "certify/post_ln_variation.h"
#include "certify/token_cover.h"
#include "interval/interval_matrix.h"
#include "models/attention_layer.h"

namespace lipcert {

// PostLnCentreInfNormBounds from jm, the dense enclosure of J_M(X0) (taken over: I is added in
// place); `layer` is the post-LN layer.
PostLnCentreInfBounds PostLnCentreInfFrom(const AttentionLayer& layer, const Eigen::MatrixXd& x0, IntervalMatrix jm,
                                          int threads, std::chrono::steady_clock::time_point deadline);

// Per token i, upper(i) >= sup_S ||D_i (J_{M,i}(X) - J_{M,i}(X0))||_inf, S the set the token
// cover `cover` covers. D_i J_{M,i} is token i's rows of the Jacobian of MHA with its output
// projection Wo replaced by D_i Wo; with W_i = mid(D_i Wo) (D_i enclosed by ln_jac[i], the
// product by Mul) and E_i = D_i Wo - W_i, |E_i| <= rad(D_i Wo) entrywise, so
//   ||D_i (J_{M,i}(X) - J_{M,i}(X0))||_inf <= r_i(W_i) + ||rad(D_i Wo)||_inf V_H,
// r_i(W_i) the inf variation of token i's rows (CentredVariation::row_variation) of MHA with
// Wo = W_i, V_H >= sup_S ||J_H(X) - J_H(X0)||_inf the heads' before Wo (HeadsBeforeWo). The
// variation of a whole row block is then bounded with the LayerNorm's projection inside it, so
// that its rank-one parts (the mean and the normalised token, whose outlier coordinates make
// ||D_i||_inf several times ||D_i||_2) act on J_M's rows before their absolute values are taken.
// The tokens go in decreasing order of `current` (the bound each competes with, e.g.
// ||D_i||_inf r_i(Wo)) and stop at the deadline or once the rest cannot raise the largest
// min(current, upper) reached; the others stay +inf. `mha` is MHA alone with a D x D Wo. The
// values hold for the set `cover` covers and the D_i given (a Y centre), and for no other.
struct LayerNormMhaRowsInf {
  Eigen::VectorXd upper;  // per token; +inf where not computed
  int computed = 0;       // tokens computed
};
LayerNormMhaRowsInf LayerNormMhaRowsInfUp(const AttentionLayer& mha, const TokenCover& cover,
                                          const std::vector<IntervalMatrix>& ln_jac, UpperBound heads_variation,
                                          const Eigen::VectorXd& current, int threads,
                                          std::chrono::steady_clock::time_point deadline);

// The crude centre in the inf norm, >= ||D(Yc)(I + J_M(X0))||_inf, from ln_centre(i) >=
// ||D_i(yc_i)||_inf and MHA's certified centre in `in` (its rows where known): above the dense
// size, where the inf centre is not certified (docs/engines.md, "The inf norm at a point").
double CrudeInfCentreUp(const Eigen::VectorXd& ln_centre, const PostLnVariationInputs& in);

// in->ln_mha_rows_inf (LayerNormMhaRowsInfUp) at the Y centre every cover of Y has (the
// enclosure of Y0), the tokens in the order of the term each competes with,
// ||D_i(yc_i)||_inf min(V_M, v_i), until `deadline`; nothing where MHA's row variations or the
// heads' variation are missing.
void AddLayerNormMhaRowsInf(const AttentionLayer& L, const TokenCover& cover, int threads,
                            std::chrono::steady_clock::time_point deadline, PostLnVariationInputs* in);

}  // namespace lipcert
