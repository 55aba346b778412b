// Engine `centred` (norm 2, N*D <= dense_limit; docs/engines.md): a rigorous norm of J at
// the cover's centre (the dense interval matrix of certify/dense_jacobian.h) plus a bound on
// sup ||J(X) - J(X0)|| over the cover from the factor bounds of certify/head_factors.h.
// Tight for small sets; its cost grows as (N D)^3.
#pragma once

#include <string>
#include <vector>

#include "certify/engine_bound.h"
#include "certify/head_factors.h"
#include "certify/layer_norm_cover.h"
#include "certify/token_cover.h"
#include "models/attention_layer.h"

namespace lipcert {

// "" when the centred engine applies to `layer` on `tokens` tokens under opts, else the
// reason ("norm 2 only", "N*D = ... exceeds dense_limit ..."). The one applicability test:
// callers ask it before calling CentredBound.
std::string CentredEngineRefusal(const AttentionLayer& layer, int tokens, const BoundOptions& opts);

// Predicted operations of CentredBound on `tokens` tokens (about 1e4 (N D)^2 plus the
// Cholesky's (N D)^3 / 3; sizes only) and its predicted seconds on this machine: the cost
// model of certify/time_model.h (CentredEngineOperations, CentredEngineSeconds).
double CentredEngineCostEstimate(const AttentionLayer& layer, int tokens);
double CentredEngineSecondsEstimate(const AttentionLayer& layer, int tokens);

// Certified: sup over the cover of ||J(X)||_2 <= result.upper, with its terms. Throws
// std::invalid_argument when CentredEngineRefusal is not "". Once opts.deadline has passed
// (or, with a deadline set, when the predicted seconds exceed the time left: then it does
// not start), upper = +inf and timed_out.
EngineBound CentredBound(const AttentionLayer& layer, const TokenCover& cover, const BoundOptions& opts);

// CentredBound(...).upper.
UpperBound CentredUpperBound(const AttentionLayer& layer, const TokenCover& cover, const BoundOptions& opts);

// The variation half of the centred form: sup over the cover of ||J_M(z) - J_M(zc)||
// (the MHA Jacobian at the MHA input, LayerNorm factors included), from the factor bounds.
// Any size (O(H N^2 D) work); `complete` is false when opts.deadline passed first.
struct CentredVariation {
  UpperBound variation{kInf};
  // >= sup over the cover of the mean along the segment, int_0^1 ||J_M(z_s) - J_M(zc)|| ds with
  // z_s = zc + s (z - zc) (LayerNorm factors included as in `variation`): where the second order
  // ran, its nodes weighted by the integral of (1 - s) over their intervals (about half of its
  // own bound, which holds where a first-order route won too), at most `variation`. For MHA
  // alone it bounds a token's displacement:
  // ||M_i(z) - M_i(zc)|| <= (||J_{M,i}(zc)|| + mean_variation) ||z - zc||.
  UpperBound mean_variation{kInf};
  const char* route = "";                 // which of the candidate bounds won
  std::vector<BoundTerm> alternatives;    // the candidates
  MhaInput in;                            // the cover of the MHA input (LayerNorm factors)
  std::vector<HeadGeometry> geo;          // per head, at the centre
  std::vector<FactorBounds> centre;       // per head, factor bounds at the centre point
  int second_order_nodes = 0;             // nodes of the second order's integral (s = 1 included)
  bool heads_apart = false;               // the second order took the heads apart (Wo = I, times ||Wo||)
  bool complete = false;
  // In the inf norm (opts.norm == kLinf) and when complete, one entry per output token i:
  // row_variation(i) >= sup over the cover of ||(J_M(z) - J_M(zc))_i||_inf, (.)_i token i's D
  // rows (LayerNorm factors included as in `variation`): the first-order routes restricted to
  // block row i (docs/engines.md, "Per output token in the inf norm"), each at most
  // `variation`. Empty otherwise.
  Eigen::VectorXd row_variation;
};
// The second order's optional refinements (T(1)'s columns, the nodes of the integral) end
// by refine_until too, where the caller keeps the time after it for other work. They take
// a fifth (T(1)) and a tenth (the nodes) of the time left before the deadline; with
// up_to_refine_until, a quarter of the time before refine_until (T(1)) and then the rest of
// it, each node refining for its share of what is left (for a caller whose own work after
// refine_until is known to be short; BERT-base size, 0.1%, 120 s: 6 nodes and a variation of
// 136.7, where a half for T(1) and the nodes refining in turn gave 2 nodes and 157.0).
// With row_weights (one w_i in [0, 1] per output token), the second order bounds
// sup ||diag(w) (J_M(X) - J_M(X0))|| (output token i's rows times w_i; the first-order routes,
// unweighted, bound it too): for a block-diagonal left factor C with ||C_i|| <= c w_i,
// ||C (J_M(X) - J_M(X0))|| <= c times it (the post-LN's LayerNorm, post_ln_variation.h).
CentredVariation CentredVariationBound(
    const AttentionLayer& layer, const TokenCover& cover, const BoundOptions& opts,
    std::chrono::steady_clock::time_point refine_until = std::chrono::steady_clock::time_point::max(),
    bool up_to_refine_until = false, const Eigen::VectorXd* row_weights = nullptr);

// The second order's integral over its nodes (s, T(s)), 0 < s_1 < ... < s_K = 1, T(s_k) >=
// sup ||D^2 f[U, .]|| over unit U and the cover scaled by s_k, `joint` >= ||Z - Zc||_F:
// `variation` = joint sum_k (s_k - s_{k-1}) T(s_k) >= sup ||J(Z) - J(Zc)||, and, since
// ||J(Z_s) - J(Zc)|| <= joint int_0^s T, `mean` = joint sum_k T(s_k) ((1 - s_{k-1})^2 - (1 - s_k)^2) / 2
// >= int_0^1 ||J(Z_s) - J(Zc)|| ds (the order of integration swapped: weight 1 - s). Rounded up.
struct NodeIntegrals {
  double variation = 0;
  double mean = 0;
};
NodeIntegrals SecondOrderNodeIntegralsUp(const std::vector<std::pair<double, double>>& nodes, double joint);

// The inf variation of one token's rows with the output projection replaced, token by token
// (the post-LN sublayer's D_i Wo, certify/post_ln_inf.h). The work that does not depend on Wo
// (the MHA input over the cover, each head's queries, keys, logit side, softmax ranges over
// the cover and at the centre, and the softmax's motion) is done once by the constructor;
// RowUp(i, wo) redoes the value side of each head for `wo` (WithOutputProjection) and row i
// alone. RowUp(i, wo) is CentredVariationBound(layer with Wo = wo, cover, opts).row_variation(i)
// without that entry's cap by the whole variation: at least that entry, equal where the cap
// does not bind. complete() is false where opts.deadline passed in the constructor.
class RowVariationInf {
 public:
  RowVariationInf(const AttentionLayer& layer, const TokenCover& cover, const BoundOptions& opts);
  bool complete() const { return complete_; }
  // >= sup over the cover of ||(J_{M'}(z) - J_{M'}(zc))_i||_inf, M' the layer with Wo = wo
  // (D x H dv), token i's D rows.
  double RowUp(int i, const Eigen::MatrixXd& wo) const;

 private:
  AttentionLayer layer_;
  int threads_ = 1;
  MhaInput in_;
  std::vector<HeadGeometry> geo_;
  std::vector<FactorBounds> over_, centre_;            // per head, over the cover and at its centre
  std::vector<Eigen::MatrixXd> motion_;                // per head, w_ij >= |P_ij(X) - P_ij(X0)|
  std::vector<std::vector<std::vector<int>>> side_orders_;  // per head, the logit side's row orders
  bool complete_ = false;
};

// Engine `centre_norm` (norms 2 and inf, any size; in the inf norm ||J(X0)||_inf comes from
// the enclosure's row sums, CentreJacobianInfNormBounds, and the variation's block bounds
// are taken in the inf norm): the centred form with the centre-norm
// certificate of certify/centre_norm.h for ||J(X0)|| (exact to about 1e-8 where one dense
// Gram/Cholesky certificate fits, token super-blocks above), plus the variation above, plus
// for the sublayer ||J_M(zc)|| max_j ||J_LN(x_j) - J_LN(x0_j)|| with ||J_M(zc)|| certified
// the same way. `centre_dense_limit` is the largest N*D certified densely (the caller sizes
// it to its time: one Cholesky is not interrupted).
std::string CentreNormEngineRefusal(const BoundOptions& opts);
// `give_up_above`: a bound already in hand; once the variation alone reaches it the engine
// cannot beat it and returns +inf with a note, before its costly centre norm (the time goes
// to the stages that can still gain).
EngineBound CentreNormBound(const AttentionLayer& layer, const TokenCover& cover, const BoundOptions& opts,
                            long centre_dense_limit, double give_up_above = kInf);
// Predicted seconds of CentreNormBound on an idle 2-core machine; with `minimum`, the least
// time that gives a bound (super-blocks certify their blocks densely only as time allows).
double CentreNormEngineSecondsEstimate(const AttentionLayer& layer, int tokens, long centre_dense_limit,
                                        NormKind norm = NormKind::kL2, bool minimum = false);

}  // namespace lipcert
