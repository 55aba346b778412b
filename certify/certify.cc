#include "certify/certify.h"

#include <cmath>
#include <span>
#include <stdexcept>

#include "certify/stages.h"
#include "interval/fp_environment.h"

namespace lipcert {

std::string SearchStageOptions::IsValid() const {
  if (!(share >= 0 && share < 1)) return "search.share: must be in [0, 1)";
  if (max_rounds < 0) return "search.max_rounds: must be >= 0";
  return "";
}

std::string EngineStageOptions::IsValid() const {
  if (dense_limit < 0) return "engines.dense_limit: must be >= 0";
  if (deflation_vectors < 0) return "engines.deflation_vectors: must be >= 0";
  return "";
}

std::string BranchStageOptions::IsValid() const {
  if (max_pieces < 1) return "branch_and_bound.max_pieces: must be >= 1";
  return "";
}

std::string ProbabilisticStageOptions::IsValid() const {
  if (!(share >= 0 && share < 1)) return "probabilistic.share: must be in [0, 1)";
  if (!(failure_probability > 0 && failure_probability < 1))
    return "probabilistic.failure_probability: must be in (0, 1)";
  return "";
}

std::string CertifyOptions::IsValid() const {
  if (!(time_limit_s > 0)) return "time_limit: must be positive";
  if (!(tolerance >= 0)) return "tolerance: must be >= 0";
  if (threads < 0) return "threads: must be >= 0";
  for (const std::string& e : {budget.IsValid(), search.IsValid(), engines.IsValid(), branch_and_bound.IsValid(), probabilistic.IsValid()})
    if (!e.empty()) return e;
  return "";
}

std::string ValidateCertifyOptions(const CertifyOptions& o) { return o.IsValid(); }

namespace {

// A layer without post-LN (attention alone, or the pre-LN sublayer X + MHA(LN(X))):
// closed forms -> structured engines on the whole set -> the Taylor model -> probabilistic bound beside the
// certificate -> witnessed lower bound -> branch and bound -> residual invertibility.
//   id                            applies                     seconds (when it starts)     run
const Stage kStages[] = {
    {StageId::kClosedForms,        Always,                     TimeLeft,                    RunClosedForms},
    {StageId::kStructuredEngines,  Always,                     EnginesSeconds,              RunStructuredEngines},
    {StageId::kTaylor,             TaylorApplies,              TaylorSeconds,               RunTaylor},
    {StageId::kProbabilistic,      ProbabilisticApplies,       ProbabilisticSeconds,        RunProbabilistic},
    {StageId::kSearch,             Always,                     SearchSeconds,               RunSearch},
    {StageId::kBranchAndBound,     Always,                     TimeLeft,                    RunBranchAndBound},
    {StageId::kInvertibility,      IsPreLnSublayer,            TimeLeft,                    RunInvertibility},
};

// The post-LN sublayer f(X) = LN(X + MHA(X)) (certify/post_layer_norm.h): J_f(X0) certified
// directly, MHA alone certified by the stages above, the composition, the sublayer's own
// centre norm plus its variation (certify/post_ln_variation.h), then the probabilistic
// bound, the witness and the search on f itself.
const Stage kPostLnStages[] = {
    {StageId::kPostLnCentreAtPoint, PostLnCentreAtPointApplies, PostLnCentreAtPointSeconds, RunPostLnCentre},
    {StageId::kMhaCertificates,     Always,                     MhaSeconds,                 RunMhaCertificates},
    {StageId::kPostLnCentreOverSet, PostLnCentreOverSetApplies, PostLnCentreOverSetSeconds, RunPostLnCentre},
    {StageId::kPostLnComposition,   Always,                     TimeLeft,                   RunPostLnComposition},
    {StageId::kPostLnVariation,     PostLnVariationApplies,     PostLnVariationSeconds,     RunPostLnVariation},
    {StageId::kPostLnProbabilistic, PostLnProbabilisticApplies, PostLnProbabilisticSeconds, RunPostLnProbabilistic},
    {StageId::kPostLnWitness,       Always,                     TimeLeft,                   RunPostLnWitness},
    {StageId::kPostLnSearch,        PostLnSearchApplies,        PostLnSearchSeconds,        RunPostLnSearch},
};

// The run's status once its stages are done: interrupted when stopped; tolerance_reached
// when the bounds meet it; else the last stage's (branch and bound's), or, where no stage
// gave one (post-LN), the limit that ended the run. The probabilistic bound is capped by
// the certified one, which holds with probability 1.
void Finish(CertifyRun& run) {
  Certificate& c = run.cert;
  if (run.ToleranceMet()) c.status = CertificateStatus::kTolerance;
  else if (run.stopped()) c.status = CertificateStatus::kInterrupted;
  else if (c.status == CertificateStatus::kInProgress)
    c.status = run.by_work() ? CertificateStatus::kWorkBudget : CertificateStatus::kTimeLimit;
  if (c.probabilistic && c.upper_bound.value() < c.probabilistic->value) {
    c.probabilistic->value = c.upper_bound.value();
    c.probabilistic->route = "the certified bound (below the probabilistic route)";
  }
  c.elapsed_s = run.clock.Elapsed();
}

}  // namespace

Certificate Certify(const AttentionLayer& L, const InputSet& set, const CertifyOptions& o,
                    const Provenance& provenance) {
  // Certified arithmetic needs round-to-nearest with FTZ/DAZ off: repaired here (and in
  // every ParallelFor worker) if other code changed it, and recorded in the certificate.
  const auto repairs_before = FpEnvironmentRepairs();
  const ScopedSoundFpEnvironment fp_guard;
  if (const std::string e = o.IsValid(); !e.empty()) throw std::invalid_argument(e);
  if (const std::string e = ValidateLayer(L); !e.empty()) throw std::invalid_argument(e);
  if (set.width() != L.d_model) throw std::invalid_argument("centre: width does not match the layer's d_model");
  if (!(set.radius >= 0) || !std::isfinite(set.radius)) throw std::invalid_argument("radius: must be finite and >= 0");
  CertifyRun run(L, set, o, provenance);
  for (const Stage& stage : L.post_ln() ? std::span<const Stage>(kPostLnStages) : std::span<const Stage>(kStages)) {
    if (run.stopped()) break;
    if (stage.applies(run)) stage.run(run, run.by_work() ? kInf : stage.seconds(run));
  }
  Finish(run);
  run.cert.fp_environment_repaired = fp_guard.repaired() || FpEnvironmentRepairs() > repairs_before;
  run.Progress("done");
  return run.cert;
}

}  // namespace lipcert
