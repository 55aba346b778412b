// The centre norm's entry point: the options, the route by size (dense, factored heads,
// deflated or plain super-blocks) and the report.
#include "certify/centre/internal.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>

namespace lipcert {
namespace centre_internal {

void CheckInputs(const AttentionLayer& L, const Eigen::MatrixXd& x0, const CentreNormOptions& o) {
  if (const std::string m = o.IsValid(); !m.empty()) throw std::invalid_argument("CentreNormOptions: " + m);
  if (x0.cols() != L.d_model || x0.rows() < 1)
    throw std::invalid_argument("centre norm: x0 must be N x D with N >= 1, D = " + std::to_string(L.d_model));
}

int GroupTokens(const CentreNormOptions& o, int n, int d) {
  if (o.block_tokens > 0) return std::min(o.block_tokens, n);
  return std::clamp(int(o.block_limit / d), 1, n);
}

}  // namespace centre_internal

using namespace centre_internal;

std::string CentreNormOptions::IsValid() const {
  if (dense_limit < 0) return "dense_limit: must be >= 0";
  if (block_tokens < 0) return "block_tokens: must be >= 0";
  if (block_limit < 1) return "block_limit: must be >= 1";
  if (threads < 0) return "threads: must be >= 0";
  return "";
}

namespace {

// Above the dense size, the heads factored first (seconds): a bound in hand whatever the
// super-blocks get, and the centre norm alone where the caller leaves them out.
// With a deadline and the super-blocks too, only where they are predicted to certify
// fewer than a quarter of their blocks densely: at MiniLM's sharp heads the factored
// bound loses (31.5 against 12.4 at N = 128), and its 3 s there cost the super-blocks
// about 10 dense blocks.
bool FactorFirst(const AttentionLayer& L, int n, int d, const CentreNormOptions& o) {
  const auto dense_share = [&] {
    const double least = CentreNormMinimumSecondsEstimate(L, n, o), all = CentreNormSecondsEstimate(L, n, o);
    return all > least ? (SecondsLeft(o.deadline) - least) / (all - least) : 1.0;
  };
  return long(n) * d > o.dense_limit && FactoredHeadsApply(L, o) && !Past(DeadlineOf(o)) &&
         (!o.super_blocks || o.deadline == std::chrono::steady_clock::time_point::max() || dense_share() < 0.25);
}

// The deflated super-blocks with up to k vectors (k > 0), or the plain super-blocks where the
// basis or the probes of the deflated pass leave too few to fit.
UpperBound DeflatedRoute(const CentreState& S, const AttentionLayer& L, const Eigen::MatrixXd& x0,
                         const CentreNormOptions& o, int k, CentreNormReport& rep) {
  const int n = S.n, d = S.d;
  UpperBound bound(kInf);
  rep = DeflatedReport(o, n, d);
  const auto t_basis = std::chrono::steady_clock::now();
  // The operator the enclosure describes: centre_norm never composes a post-LN.
  // The basis gets at most twice its idle time (0.5 s at least: small layers' bases are
  // all set-up); cut there, the machine is so loaded that the plain super-blocks run.
  const double cap_s = std::max(0.5, 2 * IdleBasisSeconds(double(n) * d, k));
  // k was sized for an idle machine of the models' pace; a loaded or slower one shows in
  // the basis's own time: every 16 steps, past 1.35x the idle model, the run is resized to
  // what fits at the pace seen (an EPYC ran 1.5x the model and sized k = 767 for 80 s,
  // of which 86 could be used).
  int asked = k;
  const auto resize = [&](int steps, double seconds) {
    const double nd = double(n) * d, ratio = seconds / IdleBasisSeconds(nd, steps);
    if (ratio <= time_model::kModelScatter) return asked;
    const int fit = DeflationVectorsThatFit(L, n, o, -IdleBasisSeconds(nd, steps), ratio);
    asked = fit == 0 ? 0 : std::min(asked, std::max(steps + 1, fit));  // 0: the plain super-blocks
    return asked;
  };
  const DeflationBasis basis =
      DeflationBasisOf(L.WithoutPostLayerNorm(), x0, k, o.threads, BasisDeadline(o.deadline, cap_s), resize, o.stop);
  rep.deflation_basis_seconds = SecondsSince(t_basis);
  // Fewer columns of V and Y serve as well (DeflationVectorsAfterBasis).
  const int kept = int(basis.v.cols()) < asked ? 0 : DeflationVectorsAfterBasis(L, n, o, asked, rep.deflation_basis_seconds);
  if (kept == 0) return PlainSuperBlockBound(S, o, rep);
  // At most three probes, each with fewer columns than the last.
  for (int cols = kept, attempt = 0; cols > 0 && attempt < 3; ++attempt) {
    rep.deflation_abandoned = false;
    rep.exact_blocks = 0;
    int fewer = 0;
    bound = DeflatedSuperBlockBound(AssemblerOf(S, o.threads), n, d, basis.v.leftCols(cols), basis.y.leftCols(cols),
                                    rep.group_tokens, o, &rep, /*may_abandon=*/true, &fewer);
    cols = rep.deflation_abandoned && fewer < cols ? fewer : 0;
  }
  if (rep.deflation_abandoned) {
    rep.exact_blocks = 0;
    bound = PlainSuperBlockBound(S, o, rep);
  } else if (!std::isfinite(bound.value())) {
    rep.timed_out = true;
  }
  return bound;
}

// The factored heads' parts into the report, and their bound in place of *bound where it is
// smaller (or where *bound is +inf).
void TakeFactored(const FactoredParts& factored, double factored_s, CentreNormReport& rep, UpperBound* bound) {
  const UpperBound factored_total = factored.Total();
  rep.factored = factored_total.value();
  rep.factored_value = factored.value.value();
  rep.factored_keys = factored.keys.value();
  rep.factored_queries = factored.queries.value();
  rep.factored_keys_and_queries = factored.keys_and_queries.value();
  rep.factored_crossed = factored.crossed.value();
  rep.factored_seconds = factored_s;
  if (std::isfinite(rep.factored) && !(bound->value() <= rep.factored)) {
    *bound = factored_total;
    rep.factored_won = true;
    rep.timed_out = false;
  }
}

}  // namespace

UpperBound CentreJacobianNormUpperBound(const AttentionLayer& L, const Eigen::MatrixXd& x0, const CentreNormOptions& o,
                                        CentreNormReport* report) {
  CheckInputs(L, x0, o);
  const auto t0 = std::chrono::steady_clock::now();
  const CentreState S = EncloseCentre(L, x0, o);
  const int n = S.n, d = S.d;
  const bool factor = FactorFirst(L, n, d, o);
  FactoredParts factored;
  double factored_s = 0;
  if (factor) {
    const auto t_factored = std::chrono::steady_clock::now();
    factored = FactoredHeadsBound(S, L, o.threads, DeadlineOf(o));
    factored_s = SecondsSince(t_factored);
  }
  CentreNormReport rep;
  UpperBound bound(kInf);
  if (Past(DeadlineOf(o))) {
    rep.timed_out = true;
  } else if (factor && !o.super_blocks) {
    rep.method = "factored_heads";
  } else if (long(n) * d <= o.dense_limit) {
    rep.method = "dense";
    rep.group_tokens = n;
    const auto t_assembly = std::chrono::steady_clock::now();
    const IntervalMatrix j = AssembleBlock(S, 0, n, 0, n, o.threads);
    rep.assembly_seconds = SecondsSince(t_assembly);
    bound = NormL2UpperGram(j, o.threads, &rep.estimate, o.deadline, &rep.gram, nullptr, GramPrecision::kDouble,
                            o.stop);
  } else if (const int k = BasisDescribesTheEnclosure(L, o) ? DeflationVectorsThatFit(L, n, o, 0.0) : 0; k > 0) {
    bound = DeflatedRoute(S, L, x0, o, k, rep);
  } else {
    bound = PlainSuperBlockBound(S, o, rep);
  }
  // A deadline (or a stop) that came inside a Gram or Cholesky step shows as +inf there.
  if (Past(DeadlineOf(o)) && !std::isfinite(bound.value())) rep.timed_out = true;
  if (rep.timed_out) bound = UpperBound(kInf);
  if (factor) TakeFactored(factored, factored_s, rep, &bound);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (report) *report = rep;
  return bound;
}

}  // namespace lipcert
