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

// Predicted floating-point operations of CentredBound on `tokens` tokens (dominated by the
// (N D)^3 norm certificate of the dense Jacobian). Cheap: arithmetic on the sizes only.
double CentredEngineCostEstimate(const AttentionLayer& layer, int tokens);

// The measured rate of CentredBound in these flops (docs/engines.md, "Engine cost"), and
// the predicted seconds at a rate.
inline constexpr double kCentredEngineFlopsPerSecond = 5e9;
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
