// The Taylor stage of Certify (certify/stages.h): over a set, for MHA alone in norm 2,
//     ||J(X0)||_2 (centre_norm's certified centre) + R C(X0) + R^2 / 2 sup_cover ||D^3 f||
// (certify/taylor.h). The remainder is cheap and computed first: when the centre and the
// remainder alone already reach the bound in hand the curvature is not computed. The
// curvature's Gram gives up at the stage's deadline; the output Gram and the Cholesky after
// it cannot be interrupted, so the stage starts only when its model of them fits.
//
// Its entry in the certificate's engines follows the rule of the other stages: an engine
// that was attempted has an entry (its bound, won or lost, or why it gave up on the way),
// and an engine that every such certificate runs has one when refused (centre_norm: the
// user learns why the main bound is missing); an optional stage that declines before any
// work of its own, as the closed forms that do not apply and the probabilistic stage
// without centre_norm's variation, leaves none. The Taylor stage is such a stage: where it
// declines before computing the curvature (centre + remainder already at or above the
// bound in hand, no certified centre from centre_norm, or the curvature's predicted time
// above its share, the usual case at the default time limits) it records nothing; where
// the curvature ran it records its bound, or why the curvature gave up (its time limit).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "certify/curvature.h"
#include "certify/stages.h"
#include "certify/taylor.h"
#include "certify/time_model.h"
#include "interval/rounding.h"

namespace lipcert {
namespace {

// The stage's share of the time limit, at most.
constexpr double kTaylorShare = 0.25;
// Largest N * D under a work budget (no clock: the curvature runs to completion).
constexpr long kTaylorWorkBudgetSize = 512;
// The curvature's uninterruptible tail: the output Gram (2 N^2 D^2 H dv interval operations)
// and the Cholesky of N D ((N D)^3 / 3), at kCentredOperationsPerSecond times the machine's
// interval slowdown; the Gram's pair blocks (about 40 (N H)^2 (N^2 dv + N dv^2) scalar
// midpoint-radius operations) at kCurvatureOperationsPerSecond per thread (measured 6e7 to
// 7.5e7 per thread on the zoo and MiniLM layers under a load of 5x the cores; idle about
// 2e8).
constexpr double kCurvatureOperationsPerSecond = 2e8;

double CurvatureSecondsModel(const AttentionLayer& L, int n, int threads) {
  const double nd = double(n) * L.d_model, nh = double(n) * L.heads, dv = L.head_dim_v;
  const double tail = 2.0 * n * n * double(L.d_model) * L.d_model * L.heads * dv + nd * nd * nd / 3;
  const double gram = 40.0 * nh * nh * (double(n) * n * dv + n * dv * dv);
  return IntervalSlowdown() *
         (tail / time_model::kCentredOperationsPerSecond + gram / (kCurvatureOperationsPerSecond * threads));
}

// centre_norm's certified ||J(X0)||_2 (+inf when it did not give one).
UpperBound CentreFromCentreNorm(const CertifyRun& run) {
  UpperBound best(kInf);
  for (const EngineResult& e : run.cert.engines)
    if (e.id == EngineId::kCentreNorm && e.applied && e.centre_norm) best = Min(best, e.centre_norm->centre);
  return best;
}

// The stage declined before computing the curvature: no engine entry, a progress line.
void Declined(const CertifyRun& run, const std::string& why) {
  if (run.opts.progress)
    std::fprintf(stderr, "[lipcert %7.2fs] taylor declined: %s\n", run.clock.Elapsed(), why.c_str());
}

}  // namespace

bool TaylorApplies(const CertifyRun& run) {
  const AttentionLayer& L = run.layer;
  const long nd = long(run.set.tokens()) * L.d_model;
  if (run.opts.norm != NormKind::kL2 || run.set.radius == 0 || L.kind != AttentionKind::kDot) return false;
  if (L.layer_norm || L.post_layer_norm || nd > CurvatureOptions{}.max_gram_size) return false;
  if (run.by_work() && nd > kTaylorWorkBudgetSize) return false;
  return !run.ToleranceMet();
}

double TaylorSeconds(const CertifyRun& run) {
  return std::max(0.0, std::min(kTaylorShare * run.opts.time_limit_s, EnginesSeconds(run)));
}

void RunTaylor(CertifyRun& run, double seconds) {
  const auto start = Clock::now();
  // The remainder (with the centre where centre_norm gave one, curvature 0) first: C(X0) is
  // computed only where it can pay. Declined before the curvature: no entry (the rule above).
  const UpperBound centre = CentreFromCentreNorm(run);
  CurvatureBound zero;
  zero.upper = UpperBound(0.0);
  const bool known = std::isfinite(centre.value());
  const EngineBound floor = TaylorVariationBound(run.layer, known ? centre : UpperBound(0.0), run.cover, zero);
  if (!(floor.upper.value() < run.cert.upper_bound.value()))
    return Declined(run, std::string(known ? "centre + remainder " : "remainder ") +
                             std::to_string(floor.upper.value()) + " already at or above the bound in hand");
  if (!known) return Declined(run, "needs centre_norm's certified centre norm");
  const int n = run.set.tokens(), threads = std::max(1, run.cert.run.threads);
  if (!run.by_work() && CurvatureSecondsModel(run.layer, n, threads) > seconds)
    return Declined(run, "the curvature's predicted time is above the stage's share");
  CurvatureOptions co;
  co.threads = threads;
  co.time_limit_seconds = run.by_work() ? 0.0 : std::max(1e-3, seconds);
  const CurvatureBound c = CentreCurvatureUpperBound(run.layer, run.set.center, co);
  if (!c.message.empty()) {
    run.Refused(EngineId::kTaylor, c.message);
    return;
  }
  run.Record(EngineId::kTaylor, TaylorVariationBound(run.layer, centre, run.cover, c), ElapsedSeconds(start));
  run.Improved("taylor");
}

}  // namespace lipcert
