// Engine `centred` (norm 2, N*D <= dense_limit; docs/engines.md): a rigorous norm of J at
// the cover's centre (the dense interval matrix of certify/dense_jacobian.h) plus a bound on
// sup ||J(X) - J(X0)|| over the cover from the factor bounds of certify/head_factors.h.
// Tight for small sets; its cost grows as (N D)^3.
#pragma once

#include <string>

#include "certify/engine_bound.h"
#include "certify/token_cover.h"
#include "models/attention_layer.h"

namespace lipcert {

// "" when the centred engine applies to `layer` on `tokens` tokens under opts, else the
// reason ("norm 2 only", "N*D = ... exceeds dense_limit ..."). The one applicability test:
// callers ask it before calling CentredBound.
std::string CentredEngineRefusal(const AttentionLayer& layer, int tokens, const BoundOptions& opts);

// Predicted operations of CentredBound on `tokens` tokens: about 1e4 (N D)^2 (the dense
// ND x ND enclosure and its norm certificate; measured, see docs/engines.md "Engine
// cost") plus the (N D)^3 / 3 of the Cholesky and the LayerNorm composition. Cheap:
// arithmetic on the sizes only.
double CentredEngineCostEstimate(const AttentionLayer& layer, int tokens);

// The rate of CentredBound in these operations on an idle 2-core machine, and the
// predicted seconds at a rate. Optimistic on purpose: the engine is not started only when
// even an idle machine could not finish before the deadline; on a loaded one (1.1e9 was
// measured at a load average of 15 on 2 cores) the deadline checks inside stop it.
inline constexpr double kCentredEngineFlopsPerSecond = 1e10;
double CentredEngineSecondsEstimate(const AttentionLayer& layer, int tokens,
                                    double flops_per_second = kCentredEngineFlopsPerSecond);

// Certified: sup over the cover of ||J(X)||_2 <= result.upper, with its terms. Throws
// std::invalid_argument when CentredEngineRefusal is not "". Once opts.deadline has passed
// (or, with a deadline set, when the predicted seconds exceed the time left: then it does
// not start), upper = +inf and timed_out.
EngineBound CentredBound(const AttentionLayer& layer, const TokenCover& cover, const BoundOptions& opts);

// CentredBound(...).upper.
UpperBound CentredUpperBound(const AttentionLayer& layer, const TokenCover& cover, const BoundOptions& opts);

}  // namespace lipcert
