// Internals of the centre_norm engine (certify/centre_norm_engine.cc) that its tests call
// directly; the engine itself is declared in certify/centred_engine.h.
#pragma once

#include "certify/layer_norm_cover.h"
#include "interval/rounding.h"
#include "models/attention_layer.h"

namespace lipcert {

// A LayerNorm variation term below this fraction of the centre norm is taken from a crude
// bound on ||J_M(z0)|| (it moves the certificate by less than its printed digits).
constexpr double kNegligibleLnVariation = 1e-9;

// For the pre-LN sublayer: ||J_M(z0)||_p (MHA's Jacobian at z0 = LN(x0)) multiplies the
// LayerNorm's variation ln_delta_p. Where Castin's closed form over the MHA input's cover
// `in` (times sqrt(N D) in the inf norm) makes that product at most kNegligibleLnVariation
// times centre_norm (a point set, whose delta_ln is the rounding of sigma), it returns that
// closed form, a certified bound on ||J_M(z0)||_p; else (and for L2 or causal attention,
// where Castin's bound does not apply) +inf, and the caller certifies MHA's own centre norm.
// Exposed for its test (tests/certify/centre_norm_engine_test.cc).
UpperBound CrudeMhaNormWhereNegligible(const AttentionLayer& L, const MhaInput& in, NormKind norm, double ln_delta_p,
                                       const UpperBound& centre_norm);

}  // namespace lipcert
