// The stages Certify (certify/certify.h) runs, over one shared run state. certify.cc holds
// the two tables (a layer without post-LN, and the post-LN sublayer LN(X + MHA(X))); each
// stage is (id, applies, seconds, run):
//   applies(run)       whether it runs at all (the layer, the set, the norm, the options);
//   seconds(run)       its time, decided when it starts from what the earlier stages left
//                      (+inf under a work budget: it is then bounded by work alone);
//   run(run, seconds)  the stage itself; it records its bounds in run.cert.
// The run stops between stages once CertifyOptions::stop points to true, and every stage
// passes the flag to the loops inside it.
#pragma once

#include <optional>
#include <vector>

#include "certify/certify.h"
#include "certify/branch_and_bound.h"
#include "certify/probable_norm.h"
#include "certify/token_cover.h"

namespace lipcert {

enum class StageId {
  kClosedForms,
  kStructuredEngines,
  kProbabilistic,
  kSearch,
  kBranchAndBound,
  kInvertibility,
  kPostLnCentreAtPoint,
  kMhaCertificates,
  kPostLnCentreOverSet,
  kPostLnComposition,
  kPostLnVariation,
  kPostLnProbabilistic,
  kPostLnWitness,
  kPostLnSearch,
  kTaylor,
};
const char* StageIdToString(StageId id);

// What the post-LN stages hand each other.
struct PostLnRun {
  // post_ln_centre: not applied until its stage gives a bound.
  EngineResult centre{EngineId::kPostLnCentre, UpperBound(kInf), 0, "", false, {}, std::nullopt};
  UpperBound centre_at_x0{kInf};   // post_ln_centre's ||J_f(X0)|| term (norm 2), +inf without it
  std::optional<Certificate> mha_l2, mha_p;  // MHA alone in norm 2 and in the norm asked for
  Eigen::MatrixXd y_centre;        // the composition's centre of the cover of Y
};

// One run of Certify: what every stage reads and writes.
struct CertifyRun {
  CertifyRun(const AttentionLayer& layer, const InputSet& set, const CertifyOptions& opts, const Provenance& provenance);
  const AttentionLayer& layer;
  const InputSet& set;
  const CertifyOptions& opts;
  const Provenance& provenance;
  const RunClock clock;           // unlimited under a work budget
  const TokenCover cover;         // the set's token cover, computed once for every stage
  Certificate cert;
  // Handed from stage to stage.
  double root_seconds = 0;        // the structured engines' seconds (branch and bound's root)
  int centre_inf_row = -1;        // inf norm: the centre's largest row of J (for the search)
  Invertibility residual;         // the sublayer: Lip(g) by the block-norm engine
  PostLnRun post_ln;

  bool by_work() const { return opts.budget.enabled(); }
  bool stopped() const { return StopRequested(opts.stop); }
  // upper <= (1 + tolerance) lower.
  bool ToleranceMet() const;
  // Every certified bound enters the certificate through these: its bound is the minimum
  // over the engines.
  void Record(EngineId id, const EngineBound& b, double seconds);
  void Record(EngineId id, UpperBound upper, double seconds, const std::string& note = "");
  void Refused(EngineId id, const std::string& why);
  // A progress line on stderr (CertifyOptions::progress).
  void Progress(const char* stage) const;
  // Progress (unless stage is nullptr), and the certificate so far to on_improvement
  // (status in_progress).
  void Improved(const char* stage);
};

struct Stage {
  StageId id;
  bool (*applies)(const CertifyRun&);
  double (*seconds)(const CertifyRun&);
  void (*run)(CertifyRun&, double seconds);
};

// Each stage's options, built from CertifyOptions here and nowhere else. `seconds` is the
// stage's time (+inf: none, a work budget), `deadline` the engines'.
SearchOptions SearchOptionsOf(const CertifyOptions& o, double seconds);
BoundOptions BoundOptionsOf(const CertifyOptions& o, Clock::time_point deadline);
BranchAndBoundOptions BranchAndBoundOptionsOf(const CertifyOptions& o, double seconds);
ProbableNormOptions ProbableNormOptionsOf(const CertifyOptions& o, double seconds);

// Common applies/seconds.
bool Always(const CertifyRun&);
double TimeLeft(const CertifyRun& run);

// The stages of a layer without post-LN (certify/stages.cc).
void RunClosedForms(CertifyRun& run, double seconds);
double EnginesSeconds(const CertifyRun& run);
void RunStructuredEngines(CertifyRun& run, double seconds);
bool ProbabilisticApplies(const CertifyRun& run);
double ProbabilisticSeconds(const CertifyRun& run);
void RunProbabilistic(CertifyRun& run, double seconds);
double SearchSeconds(const CertifyRun& run);
void RunSearch(CertifyRun& run, double seconds);
void RunBranchAndBound(CertifyRun& run, double seconds);
bool IsPreLnSublayer(const CertifyRun& run);
// The Taylor model over a set (certify/taylor_stage.cc).
bool TaylorApplies(const CertifyRun& run);
double TaylorSeconds(const CertifyRun& run);
void RunTaylor(CertifyRun& run, double seconds);
void RunInvertibility(CertifyRun& run, double seconds);

// The post-LN sublayer's stages (certify/post_layer_norm.cc): J_f(X0) certified directly
// (at a point first; over a set after MHA's certificate, whose variation it adds), MHA alone
// certified by the stages above (norm 2, and the norm asked for), the composition, then the
// probabilistic bound, the witness and the search on f itself.
bool PostLnCentreAtPointApplies(const CertifyRun& run);
double PostLnCentreAtPointSeconds(const CertifyRun& run);
bool PostLnCentreOverSetApplies(const CertifyRun& run);
double PostLnCentreOverSetSeconds(const CertifyRun& run);
void RunPostLnCentre(CertifyRun& run, double seconds);
double MhaSeconds(const CertifyRun& run);
void RunMhaCertificates(CertifyRun& run, double seconds);
void RunPostLnComposition(CertifyRun& run, double seconds);
bool PostLnVariationApplies(const CertifyRun& run);
double PostLnVariationSeconds(const CertifyRun& run);
void RunPostLnVariation(CertifyRun& run, double seconds);
bool PostLnProbabilisticApplies(const CertifyRun& run);
double PostLnProbabilisticSeconds(const CertifyRun& run);
void RunPostLnProbabilistic(CertifyRun& run, double seconds);
void RunPostLnWitness(CertifyRun& run, double seconds);
bool PostLnSearchApplies(const CertifyRun& run);
double PostLnSearchSeconds(const CertifyRun& run);
void RunPostLnSearch(CertifyRun& run, double seconds);

}  // namespace lipcert
