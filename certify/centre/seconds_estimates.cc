// The centre norm's time models (2 cores, idle): what the pipeline schedules with.
#include "certify/centre/internal.h"

#include <cmath>


namespace lipcert {
namespace centre_internal {

namespace {

// Seconds per (token pair x head x D^2) of the fused assembly (bench/centre_norm_bench).
constexpr double kFusedAssemblySeconds = 5e-10;
// Seconds per flop of the factored heads' per-token products (measured: FactoredHeadsBound).
constexpr double kFactoredSecondsPerFlop = 1.0 / 3e10;

}  // namespace

}  // namespace centre_internal

using namespace centre_internal;

double CentreNormSecondsEstimate(const AttentionLayer& L, int tokens, const CentreNormOptions& o) {
  const double n = tokens, d = L.d_model, h = L.heads, nd = n * d;
  const bool gemm = o.gemm_assembly && L.kind == AttentionKind::kDot;
  // measured: D = 384, H = 12 (the fused assembly: 2.2e-10, 4.6e-10 and 3.2e-10 at N = 32,
  // 64 and 128, taken at the largest; the general one 6.5e-9 at N = 32)
  const double assembly = (gemm ? kFusedAssemblySeconds : 6.5e-9) * n * n * h * d * d;
  const double flops = kGramFlopsPerSecond;
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
  // The cross terms are left out: they run only where the time left holds 1.8 times the
  // rows' pass (measured: 18.2 s in all at BERT-base size on the 2-core EPYC). Counted in,
  // the variation's reserve grew by 6 s at BERT-base size and its refinement lost more
  // (0.1%, 120 s: 85.12 against 68.21) than the cross terms gain.
  return kFactoredSecondsPerFlop * n * (4 * h * n * d * d) + kFusedAssemblySeconds * h * n * n * d;
}

double CentreNormMinimumSecondsEstimate(const AttentionLayer& L, int tokens, const CentreNormOptions& o) {
  if (long(tokens) * L.d_model <= o.dense_limit) return CentreNormSecondsEstimate(L, tokens, o);
  const double n = tokens, d = L.d_model, h = L.heads;
  const bool gemm = o.gemm_assembly && L.kind == AttentionKind::kDot;
  return (gemm ? kFusedAssemblySeconds : 6.5e-9) * n * n * h * d * d;  // super-blocks: the assembly; the dense blocks are anytime
}

}  // namespace lipcert
