// The dense interval Jacobian at the cover's centre, for the centred engine: J_MHA(zc)
// from the block structure of certify/head_factors.h, and its composition with the
// LayerNorm Jacobians of the sublayer X + MHA(LN(X)). Sizes are ND x ND (row-major token
// blocks), so the cost grows as (ND)^2 D per head (see CentredEngineCostEstimate).
#pragma once

#include <chrono>
#include <vector>

#include "certify/head_factors.h"
#include "interval/interval_matrix.h"
#include "models/attention_layer.h"

namespace lipcert {

// An enclosure of J_MHA at the z-centre from the heads' centre geometry and centre factor
// bounds (HeadFactorBounds with rho = 0). Block rows are filled in parallel, heads added in
// order within each. Once `deadline` has passed the remaining rows are skipped and
// *timed_out is set: the result is then not an enclosure and must not be used.
IntervalMatrix DenseMhaJacobian(const AttentionLayer& layer, const std::vector<HeadGeometry>& geo, int threads,
                                const std::vector<FactorBounds>& centre, int n, int d,
                                std::chrono::steady_clock::time_point deadline, bool* timed_out);

// An enclosure of J_M blockdiag(L_j) (+ I when add_identity): the sublayer's Jacobian from
// the MHA Jacobian's enclosure jm and the LayerNorm Jacobians' enclosures ln (block columns
// in parallel). Same deadline contract as DenseMhaJacobian.
IntervalMatrix ComposeWithLayerNorm(const IntervalMatrix& jm, const std::vector<IntervalMatrix>& ln, int threads, int n, int d,
                                    bool add_identity, std::chrono::steady_clock::time_point deadline,
                                    bool* timed_out);

}  // namespace lipcert
