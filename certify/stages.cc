#include "certify/stages.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <thread>

#include "certify/block_norm_engine.h"
#include "certify/centre_norm.h"
#include "certify/centred_engine.h"
#include "certify/closed_form.h"
#include "certify/time_model.h"
#include "interval/elementary.h"
#include "interval/fp_environment.h"

namespace lipcert {

const char* StageIdToString(StageId id) {
  switch (id) {
    case StageId::kClosedForms: return "closed_forms";
    case StageId::kStructuredEngines: return "structured_engines";
    case StageId::kProbabilistic: return "probabilistic";
    case StageId::kSearch: return "search";
    case StageId::kBranchAndBound: return "branch_and_bound";
    case StageId::kInvertibility: return "invertibility";
    case StageId::kPostLnCentreAtPoint: return "post_ln_centre_at_point";
    case StageId::kMhaCertificates: return "mha_certificates";
    case StageId::kPostLnCentreOverSet: return "post_ln_centre_over_set";
    case StageId::kPostLnComposition: return "post_ln_composition";
    case StageId::kPostLnVariation: return "post_ln_variation";
    case StageId::kPostLnProbabilistic: return "post_ln_probabilistic";
    case StageId::kPostLnWitness: return "post_ln_witness";
    case StageId::kPostLnSearch: return "post_ln_search";
    case StageId::kTaylor: return "taylor";
  }
  return "?";
}

namespace {

Certificate Skeleton(const AttentionLayer& L, const InputSet& set, const CertifyOptions& o, const Provenance& p) {
  Certificate c;
  c.provenance = p;
  c.kind = L.kind;
  c.d_model = L.d_model;
  c.heads = L.heads;
  c.head_dim_qk = L.head_dim_qk;
  c.head_dim_v = L.head_dim_v;
  c.tokens = set.tokens();
  c.causal = L.causal;
  c.layer_norm = L.residual();
  c.post_layer_norm = L.post_ln();
  c.biases = L.has_bias();
  c.set = set.kind;
  c.radius = set.radius;
  c.centre_frobenius_norm = set.center.norm();
  c.norm = o.norm;
  const NumericsTag tag = CurrentNumericsTag();
  c.rounding_model = tag.rounding_model;
  c.exp_backend = tag.exp_backend;
  c.status = CertificateStatus::kInProgress;  // until the run ends
  c.run.time_limit_s = o.time_limit_s;
  c.run.budget = o.budget;
  c.run.tolerance = o.tolerance;
  c.run.seed = o.seed;
  c.run.threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  if (!o.budget.enabled()) c.run.calibration = Calibration();
  return c;
}

// A stage's seconds as its engine's options take them: finite (a work budget's unbounded
// time is a long one that the stage's own counts end first).
double FiniteSeconds(double s) { return std::min(s, 1e9); }

}  // namespace

CertifyRun::CertifyRun(const AttentionLayer& L, const InputSet& s, const CertifyOptions& o, const Provenance& p)
    : layer(L),
      set(s),
      opts(o),
      provenance(p),
      clock(o.budget.enabled() ? kInf : o.time_limit_s),
      cover(CoverOf(s)),
      cert(Skeleton(L, s, o, p)) {}

bool CertifyRun::ToleranceMet() const {
  return cert.upper_bound.value() <= MulDown(cert.lower_bound.value(), 1 + opts.tolerance);
}

void CertifyRun::Record(EngineId id, const EngineBound& b, double seconds) {
  cert.engines.push_back({id, b.upper, seconds, b.note, true, b.terms, b.centre_norm});
  cert.upper_bound = Min(cert.upper_bound, b.upper);
}

void CertifyRun::Record(EngineId id, UpperBound upper, double seconds, const std::string& note) {
  cert.engines.push_back({id, upper, seconds, note, true, {}, std::nullopt});
  cert.upper_bound = Min(cert.upper_bound, upper);
}

void CertifyRun::Refused(EngineId id, const std::string& why) {
  cert.engines.push_back({id, UpperBound(kInf), 0, why, false, {}, std::nullopt});
}

void CertifyRun::Progress(const char* stage) const {
  if (!opts.progress) return;
  std::fprintf(stderr, "[lipcert %7.2fs] %-18s upper %.9g  lower %.9g  gap %.6g\n", clock.Elapsed(), stage,
               cert.upper_bound.value(), cert.lower_bound.value(), cert.gap());
}

void CertifyRun::Improved(const char* stage) {
  if (stage) Progress(stage);
  if (opts.on_improvement) opts.on_improvement(cert);
}

// ---- Each stage's options from CertifyOptions: the one place. ----

SearchOptions SearchOptionsOf(const CertifyOptions& o, double seconds) {
  SearchOptions so;
  so.norm = o.norm;
  so.seed = o.seed;
  so.threads = o.threads;
  so.max_rounds = o.budget.enabled() ? o.budget.rounds : o.search.max_rounds;
  so.time_limit_s = FiniteSeconds(seconds);
  so.stop = o.stop;
  return so;
}

BoundOptions BoundOptionsOf(const CertifyOptions& o, Clock::time_point deadline) {
  BoundOptions bo;
  bo.norm = o.norm;
  bo.dense_limit = o.engines.dense_limit;
  bo.deflation_vectors = o.engines.deflation_vectors;
  bo.deadline = o.budget.enabled() ? kNoDeadline : deadline;
  bo.threads = o.threads;
  bo.stop = o.stop;
  bo.by_work = o.budget.enabled();
  return bo;
}

BranchAndBoundOptions BranchAndBoundOptionsOf(const CertifyOptions& o, double seconds) {
  BranchAndBoundOptions bb;
  bb.norm = o.norm;
  bb.tolerance = o.tolerance;
  bb.dense_limit = o.engines.dense_limit;
  bb.max_pieces = o.budget.enabled() ? o.budget.steps : o.branch_and_bound.max_pieces;
  bb.time_limit_s = o.budget.enabled() ? kInf : seconds;
  bb.by_work = o.budget.enabled();
  bb.stop = o.stop;
  return bb;
}

ProbableNormOptions ProbableNormOptionsOf(const CertifyOptions& o, double seconds) {
  ProbableNormOptions po;
  po.failure_probability = o.probabilistic.failure_probability;
  po.time_limit_s = FiniteSeconds(seconds);
  // Under a work budget the start is fixed too: the run repeats bit for bit.
  po.seed = o.probabilistic.seed == 0 && o.budget.enabled() ? o.seed + 1 : o.probabilistic.seed;
  po.stop = o.stop;
  return po;
}

bool Always(const CertifyRun&) { return true; }
double TimeLeft(const CertifyRun& run) { return run.clock.Left(); }

// ---- The stages of a layer without post-LN. ----

// The published closed forms that apply to the layer and the set.
void RunClosedForms(CertifyRun& run, double) {
  const auto [bounds, seconds] = Timed([&] { return ClosedFormBounds(run.layer, run.set, run.opts.norm); });
  for (const ClosedFormBound& b : bounds) {
    EngineId id;
    if (!StringToEngineId(b.name, &id)) throw std::logic_error("closed form without an engine id: " + b.name);
    run.Record(id, b.upper, seconds / double(bounds.size()));
  }
}

// The fraction of the time limit by which the structured engines stop. On a point set
// (radius 0) the search can only evaluate the centre, a few Jacobian products that it
// stops once they meet the certified bound: the engines get 95% of the limit there. The
// probabilistic stage's share comes out of the engines' time.
double EnginesSeconds(const CertifyRun& run) {
  const CertifyOptions& o = run.opts;
  const double share = run.set.radius == 0 ? std::max(0.95, 1 - o.search.share) : 1 - o.search.share;
  const double until = ProbabilisticApplies(run) ? std::max(0.05, share - o.probabilistic.share) : share;
  return until * o.time_limit_s - run.clock.Elapsed();
}

namespace {

// The centred form (||J(X0)|| + the variation) with the centre-norm certificate: one dense
// Gram/Cholesky certificate of J(X0) when its predicted time is at most half of what is
// left before the engines' deadline (the Cholesky is not interrupted), else token
// super-blocks, else not at all; under a work budget by size alone. Branch and bound uses
// the dense `centred` engine on its pieces. Returns the centre's largest row for the
// search's witness (inf norm; else -1).
int RunCentreNorm(CertifyRun& run, const BoundOptions& bo) {
  const AttentionLayer& L = run.layer;
  const CertifyOptions& o = run.opts;
  const int n = int(run.cover.center.rows());
  const long nd = long(n) * L.d_model;
  if (const std::string why = CentreNormEngineRefusal(bo); !why.empty()) {
    run.Refused(EngineId::kCentreNorm, why);
    return -1;
  }
  if (o.engines.dense_limit == 0) {
    run.Refused(EngineId::kCentreNorm, "engines.dense_limit = 0");
    return -1;
  }
  long dense_limit = nd <= o.engines.dense_limit ? nd : 0;  // 0: token super-blocks (norm 2)
  if (!bo.by_work) {
    const double window = SecondsUntil(bo.deadline);
    if (CentreNormEngineSecondsEstimate(L, n, dense_limit, o.norm) > 0.5 * window) dense_limit = 0;
    double least_s = CentreNormEngineSecondsEstimate(L, n, dense_limit, o.norm, /*minimum=*/true);
    if (o.norm == NormKind::kL2 && nd > dense_limit && FactoredHeadsApply(L, CentreNormOptions{}))
      least_s = std::min(least_s, FactoredHeadsSecondsEstimate(L, n));  // the heads factored alone
    if (least_s > window) {
      run.Refused(EngineId::kCentreNorm, "predicted time above the engines' share of the time limit");
      return -1;
    }
  }
  const double in_hand = run.cert.upper_bound.value();
  const auto [b, seconds] = Timed([&] { return CentreNormBound(L, run.cover, bo, dense_limit, in_hand); });
  run.Record(EngineId::kCentreNorm, b, seconds);
  run.Progress("centre_norm");
  return b.centre_inf_row;
}

}  // namespace

// The structured bound engines on the whole set, by the end of the time that is not the
// search's: the centre_norm engine does not start when its predicted time does not fit,
// and either engine stops at the deadline with +inf (never a partial number). For the
// sublayer, the block-norm bound on Lip(g) too (cheap; the invertibility stage's start).
void RunStructuredEngines(CertifyRun& run, double seconds) {
  const BoundOptions bo = BoundOptionsOf(run.opts, After(Clock::now(), seconds));
  const auto start = Clock::now();
  const auto [block, block_s] = Timed([&] { return BlockNormBound(run.layer, run.cover, bo); });
  run.Record(EngineId::kBlockNorm, block, block_s);
  run.Progress("block_norm");
  run.centre_inf_row = RunCentreNorm(run, bo);
  run.Improved(nullptr);  // its progress lines are the engines' own
  run.root_seconds = ElapsedSeconds(start);
  if (run.layer.residual()) {
    BoundOptions g = BoundOptionsOf(run.opts, run.clock.At(1));
    g.exclude_residual = true;
    run.residual.lip_g_upper = BlockNormBound(run.layer, run.cover, g).upper;
  }
}

// Norm 2 (the inf norm's centre is certified exactly from its row sums), when enabled.
bool ProbabilisticApplies(const CertifyRun& run) {
  return run.opts.probabilistic.enabled && run.opts.norm == NormKind::kL2;
}

double ProbabilisticSeconds(const CertifyRun& run) {
  return std::min(run.opts.probabilistic.share * run.opts.time_limit_s, run.clock.Left());
}

// Beside the certificate, never in it: ||J(X0)||_2 by randomized Lanczos with its failure
// probability (certify/probable_norm.h), and over a set the centre_norm engine's certified
// variation added: the certified centre norm swapped for the probable one. Never above the
// certified bound (which holds with probability 1; capped when the run ends).
void RunProbabilistic(CertifyRun& run, double seconds) {
  if (!(seconds > 0)) return;
  // Over a set: centre_norm's certified variation; without it (refused, gave up, timed
  // out) the Lanczos run would have nothing to add to.
  double variation = 0;
  if (run.set.radius != 0) {
    const EngineResult* centred = nullptr;
    for (const EngineResult& e : run.cert.engines)
      if (e.id == EngineId::kCentreNorm && e.applied && e.centre_norm && std::isfinite(e.upper.value())) centred = &e;
    if (!centred) return;
    variation = centred->centre_norm->variation.value();
  }
  const ProbableNormOptions po = ProbableNormOptionsOf(run.opts, seconds);
  ProbabilisticBound p;
  p.centre = ProbableJacobianNormUpper(run.layer, run.set.center, po);
  p.failure_probability = po.failure_probability;
  p.value = AddUp(p.centre.value, variation);
  p.route = run.set.radius == 0 ? "the centre: randomized Lanczos"
                                : "randomized Lanczos centre + centre_norm's certified variation terms";
  run.cert.probabilistic = p;
}

// The search's time: what each later stage can still gain decides it. Branch and bound
// splits the set's box hull one coordinate at a time, which pays only on low-dimensional
// sets (few tokens and coordinates): there the time of one more root bound is kept for it
// and the search gets half of the rest. Elsewhere the root bound is all it can give, and
// the search, which keeps improving with time, gets what is left: all of it, unless the
// invertibility stage's centred bound needs the root bound's time after it (attention alone
// at MiniLM N = 64, 0.1%, ended 6 s early while that time was kept). At least search.share
// of the limit either way.
double SearchSeconds(const CertifyRun& run) {
  constexpr long kSplitPaysUpTo = 256;  // N*D at which splitting has helped on the zoo
  const CertifyOptions& o = run.opts;
  const bool split_pays = long(run.set.center.size()) <= kSplitPaysUpTo;
  // Its last step can end up to a step past its deadline (0.4 s at MiniLM N = 64): 1% of
  // the limit, at most 0.5 s, is kept for that, whichever share it gets.
  const double margin = std::min(0.5, 0.01 * o.time_limit_s);
  const double keep = split_pays || run.layer.residual() ? run.root_seconds : 0.0;
  const double left = std::max(0.0, run.clock.Left() - margin - keep);
  const double share = split_pays ? 0.5 * left : left;
  return std::max(std::min(o.time_limit_s * o.search.share, std::max(0.0, run.clock.Left() - margin)), share);
}

// The witnessed lower bound: stops once a witness is within the tolerance of the certified
// bound.
void RunSearch(CertifyRun& run, double seconds) {
  SearchOptions so = SearchOptionsOf(run.opts, seconds);
  so.centre_inf_row = run.centre_inf_row;
  const double upper = run.cert.upper_bound.value();
  so.stop_at = std::isfinite(upper) ? upper / (1 + run.opts.tolerance) * (1 + 1e-9) : kInf;
  const SearchResult sr = SearchLowerBound(run.layer, run.set, so);
  run.cert.lower_bound = sr.best.lower_bound;
  run.cert.witness = sr.best;
  run.Improved("search");
}

// Branch and bound over the set with the time that is left (or the budget's pieces).
void RunBranchAndBound(CertifyRun& run, double seconds) {
  Certificate& c = run.cert;
  BranchAndBoundOptions bb = BranchAndBoundOptionsOf(run.opts, seconds);
  bb.root_upper = c.upper_bound;
  bb.root_seconds = run.root_seconds;
  bb.on_improvement = [&](UpperBound u, int explored, int open) {
    if (u.value() < c.upper_bound.value()) {
      c.upper_bound = u;
      c.pieces_explored = explored;
      c.open_pieces = open;
      c.elapsed_s = run.clock.Elapsed();
      run.Improved("branch_and_bound");
    }
  };
  const auto [r, s] = Timed([&] { return BranchAndBound(run.layer, run.set, c.lower_bound, bb); });
  run.Record(EngineId::kBranchAndBound, r.upper, s, std::to_string(r.pieces_explored) + " pieces");
  c.pieces_explored = r.pieces_explored;
  c.open_pieces = r.open_pieces;
  c.status = r.tolerance_reached                     ? CertificateStatus::kTolerance
             : r.exhausted                          ? CertificateStatus::kExhausted
             : r.stopped                            ? CertificateStatus::kInterrupted
             : r.pieces_spent && run.by_work()      ? CertificateStatus::kWorkBudget
                                                    : CertificateStatus::kTimeLimit;
}

bool IsPreLnSublayer(const CertifyRun& run) { return run.layer.residual(); }

// The residual sublayer X + g(X) is certified invertible on the set where Lip(g) < 1: the
// block-norm bound on g from the engines' stage, the centre_norm one when it fits in half
// of the time left (by size alone under a work budget).
void RunInvertibility(CertifyRun& run, double seconds) {
  BoundOptions g = BoundOptionsOf(run.opts, After(Clock::now(), seconds));
  g.exclude_residual = true;
  const int n = int(run.cover.center.rows());
  const long nd = long(n) * run.layer.d_model;
  Invertibility inv = run.residual;
  if (CentreNormEngineRefusal(g).empty() && nd <= run.opts.engines.dense_limit &&
      (g.by_work || CentreNormEngineSecondsEstimate(run.layer, n, nd, run.opts.norm) <= 0.5 * seconds))
    inv.lip_g_upper = Min(inv.lip_g_upper, CentreNormBound(run.layer, run.cover, g, nd).upper);
  inv.certified = inv.lip_g_upper.value() < 1;
  if (inv.certified) inv.bi_lipschitz_lower = LowerBound(SubDown(1.0, inv.lip_g_upper.value()));
  inv.bi_lipschitz_upper = Min(run.cert.upper_bound, UpperBound(AddUp(1.0, inv.lip_g_upper.value())));
  run.cert.invertibility = inv;
}

}  // namespace lipcert
