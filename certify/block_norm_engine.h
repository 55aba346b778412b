// Engine `block_norm` (docs/engines.md): every factor of the Jacobian's blocks bounded over
// the cover (certify/head_factors.h), the blocks bounded by norms, the N x N matrix of
// block bounds bounded in norm; the P (x) W_h terms by Kronecker. Any size, norm 2 or inf.
// The sublayer X + MHA(LN(X)) has J = I + J_MHA(LN(X)) J_LN(X), J_LN block-diagonal.
#pragma once

#include "certify/engine_bound.h"
#include "certify/token_cover.h"
#include "models/attention_layer.h"

namespace lipcert {

// Certified: sup over the cover of ||J(X)||_p <= result.upper, with its terms. +inf and
// timed_out once opts.deadline has passed.
EngineBound BlockNormBound(const AttentionLayer& layer, const TokenCover& cover, const BoundOptions& opts);

// BlockNormBound(...).upper.
UpperBound BlockNormUpperBound(const AttentionLayer& layer, const TokenCover& cover, const BoundOptions& opts);

}  // namespace lipcert
