// The centre norm's time models: the constants of certify/time_model.h (the reference
// machine) times this machine's calibrated slowdowns; what the pipeline schedules with.
#include "certify/centre/internal.h"

#include <cmath>

#include "certify/time_model.h"

namespace lipcert {

using namespace centre_internal;
using namespace time_model;

double CentreNormSecondsEstimate(const AttentionLayer& L, int tokens, const CentreNormOptions& o) {
  const double n = tokens, d = L.d_model, h = L.heads, nd = n * d;
  const bool gemm = o.gemm_assembly && L.kind == AttentionKind::kDot;
  // measured: D = 384, H = 12 (the fused assembly: 2.2e-10, 4.6e-10 and 3.2e-10 at N = 32,
  // 64 and 128, taken at the largest; the general one 6.5e-9 at N = 32)
  const double assembly = (gemm ? kFusedAssemblySeconds : kGeneralAssemblySeconds) * n * n * h * d * d * IntervalSlowdown();
  const double flops = kGramFlopsPerSecond / GemmSlowdown();
  if (long(tokens) * L.d_model <= o.dense_limit) return assembly + (nd * nd * nd * (0.5 + 1.0 / 3)) / flops;
  const int g = GroupTokens(o, tokens, L.d_model);
  const double groups = std::ceil(n / g), m = g * d;
  if (long(g) * L.d_model > o.block_limit) return assembly;
  return assembly + groups * groups * m * m * m * (0.5 + 1.0 / 3) / flops;
}

bool FactoredHeadsApply(const AttentionLayer& L, const CentreNormOptions& o) {
  return o.factored_heads && L.kind == AttentionKind::kDot;  // MHA alone or the pre-LN sublayer (factored_heads.cc)
}

double FactoredHeadsSecondsEstimate(const AttentionLayer& L, int tokens) {
  const double n = tokens, d = L.d_model, h = L.heads;
  // Per query token: ||A_i|| (a D x D Gram of H N rows) and E_i (one GEMM of H N x D x D),
  // both in double (measured 9.0 s at BERT-base size, 2 cores); then the heads' enclosure.
  // The cross terms are left out: they run only where the time left holds kFactoredCrossMargin times the
  // rows' pass (measured: 18.2 s in all at BERT-base size on the 2-core EPYC). Counted in,
  // the variation's reserve grew by 6 s at BERT-base size and its refinement lost more
  // (0.1%, 120 s: 85.12 against 68.21) than the cross terms gain.
  // The pre-LN sublayer certifies two centre norms through the heads' factors: the
  // sublayer's, whose factors carry each token's LayerNorm Jacobian (measured 18.5 s at
  // BERT-base size, twice MHA alone's pass), and J_M(z0)'s; three passes in all.
  const double passes = L.layer_norm ? 3 : 1;
  return passes * (kFactoredSecondsPerFlop * n * (4 * h * n * d * d) * GemmSlowdown() +
                   kFusedAssemblySeconds * h * n * n * d * IntervalSlowdown());
}

double CentreNormMinimumSecondsEstimate(const AttentionLayer& L, int tokens, const CentreNormOptions& o) {
  if (long(tokens) * L.d_model <= o.dense_limit) return CentreNormSecondsEstimate(L, tokens, o);
  const double n = tokens, d = L.d_model, h = L.heads;
  const bool gemm = o.gemm_assembly && L.kind == AttentionKind::kDot;
  // Super-blocks: the assembly; the dense blocks are anytime.
  return (gemm ? kFusedAssemblySeconds : kGeneralAssemblySeconds) * n * n * h * d * d * IntervalSlowdown();
}

}  // namespace lipcert
