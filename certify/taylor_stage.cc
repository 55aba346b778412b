// The Taylor stage of Certify (certify/stages.h): over a set, for MHA alone in norm 2,
//     ||J(X0)||_2 (centre_norm's certified centre) + R C(X0) + R^2 / 2 sup_cover ||D^3 f||
// (certify/taylor.h). The remainder is cheap and computed first: when the centre and the
// remainder alone already reach the bound in hand the curvature is not computed. The
// curvature's Gram gives up at the stage's deadline; the output Gram and the Cholesky after
// it cannot be interrupted, so the stage starts only when its model of them fits.
#include <algorithm>
#include <cmath>
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
  // computed only where it can pay.
  const UpperBound centre = CentreFromCentreNorm(run);
  CurvatureBound zero;
  zero.upper = UpperBound(0.0);
  const bool known = std::isfinite(centre.value());
  const EngineBound floor = TaylorVariationBound(run.layer, known ? centre : UpperBound(0.0), run.cover, zero);
  if (!(floor.upper.value() < run.cert.upper_bound.value())) {
    run.Refused(EngineId::kTaylor, std::string("taylor: ") + (known ? "centre + remainder " : "remainder ") +
                                       std::to_string(floor.upper.value()) + " already at or above the bound in hand");
    return;
  }
  if (!known) {
    run.Refused(EngineId::kTaylor, "taylor: needs centre_norm's certified centre norm");
    return;
  }
  const int n = run.set.tokens(), threads = std::max(1, run.cert.run.threads);
  if (!run.by_work() && CurvatureSecondsModel(run.layer, n, threads) > seconds) {
    run.Refused(EngineId::kTaylor, "taylor: the curvature's predicted time is above the stage's share");
    return;
  }
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
