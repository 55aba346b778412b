#include "certify/certify.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "certify/branch_and_bound.h"
#include "certify/closed_form.h"
#include "certify/block_norm_engine.h"
#include "certify/centre_norm.h"
#include "certify/centred_engine.h"
#include "certify/post_layer_norm.h"
#include "certify/probable_norm.h"
#include "certify/token_cover.h"
#include "interval/elementary.h"
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

// A stage's seconds as the options of its engine take them: finite (a work budget's
// unbounded time is a long one that its own counts end first).
double FiniteSeconds(double s) { return std::min(s, 1e9); }

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
  c.biases = L.has_bias();
  c.set = set.kind;
  c.radius = set.radius;
  c.centre_frobenius_norm = set.center.norm();
  c.norm = o.norm;
  const NumericsTag tag = CurrentNumericsTag();
  c.rounding_model = tag.rounding_model;
  c.exp_backend = tag.exp_backend;
  c.status = CertificateStatus::kInProgress;  // until the run ends
  return c;
}

// Every certified bound enters the certificate through here: the certificate's bound is
// the minimum over the engines.
void Record(Certificate* c, const std::string& name, UpperBound upper, double seconds, const std::string& note = "",
            std::vector<BoundTerm> terms = {}) {
  c->engines.push_back({name, upper, seconds, note, true, std::move(terms)});
  c->upper_bound = Min(c->upper_bound, upper);
}

void Record(Certificate* c, const std::string& name, const EngineBound& b, double seconds) {
  Record(c, name, b.upper, seconds, b.note, b.terms);
}

void Refused(Certificate* c, const std::string& name, const std::string& why) {
  c->engines.push_back({name, UpperBound(kInf), 0, why, false, {}});
}

void Progress(const CertifyOptions& o, const char* stage, const Certificate& c, double t) {
  if (!o.progress) return;
  std::fprintf(stderr, "[lipcert %7.2fs] %-18s upper %.9g  lower %.9g  gap %.6g\n", t, stage,
               c.upper_bound.value(), c.lower_bound.value(), c.gap());
}

// 1. The published closed forms that apply to the layer and the set.
void RunClosedForms(const AttentionLayer& L, const InputSet& set, const CertifyOptions& o, Certificate* c) {
  const auto [bounds, seconds] = Timed([&] { return ClosedFormBounds(L, set, o.norm); });
  for (const ClosedFormBound& b : bounds) Record(c, b.name, b.upper, seconds / double(bounds.size()));
}

// 2. The witnessed lower bound, with its share of the time.
void RunSearch(const AttentionLayer& L, const InputSet& set, const CertifyOptions& o, double seconds,
               int centre_inf_row, Certificate* c) {
  SearchOptions so;
  so.centre_inf_row = centre_inf_row;
  // Once a witness is within the tolerance of the certified bound the search stops.
  so.stop_at = std::isfinite(c->upper_bound.value()) ? c->upper_bound.value() / (1 + o.tolerance) * (1 + 1e-9) : kInf;
  so.norm = o.norm;
  so.seed = o.seed;
  so.threads = o.threads;
  so.max_rounds = o.budget.enabled() ? o.budget.rounds : o.search.max_rounds;
  so.time_limit_s = FiniteSeconds(seconds);
  so.stop = o.stop;
  const SearchResult sr = SearchLowerBound(L, set, so);
  c->lower_bound = sr.best.lower_bound;
  c->witness = sr.best;
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

// The centred form (||J(X0)|| + the variation) with the centre-norm certificate: one dense
// Gram/Cholesky certificate of J(X0) when its predicted time is at most half of what is
// left before the engines' deadline (the Cholesky is not interrupted), else token
// super-blocks, else not at all. It replaces the older dense `centred` engine, whose
// centre norm it computes faster (certify/centre_norm.h); branch and bound still uses that
// one on its pieces.
// Returns the centre's largest row for the search's witness (inf norm; else -1).
int RunCentreNorm(const AttentionLayer& L, const TokenCover& cover, const CertifyOptions& o, const BoundOptions& bo,
                  const RunClock& clock, Certificate* c) {
  const int n = int(cover.center.rows());
  const long nd = long(n) * L.d_model;
  Refused(c, "centred", o.norm == NormKind::kL2 ? "replaced by centre_norm" : "norm 2 only");
  if (const std::string why = CentreNormEngineRefusal(bo); !why.empty()) {
    Refused(c, "centre_norm", why);
    return -1;
  }
  if (o.engines.dense_limit == 0) {
    Refused(c, "centre_norm", "engines.dense_limit = 0");
    return -1;
  }
  long dense_limit = nd <= o.engines.dense_limit ? nd : 0;  // 0: token super-blocks (norm 2)
  if (bo.by_work) {  // by size alone
    const double in_hand = c->upper_bound.value();
    const auto [b, seconds] = Timed([&] { return CentreNormBound(L, cover, bo, dense_limit, in_hand); });
    Record(c, "centre_norm", b, seconds);
    Progress(o, "centre_norm", *c, clock.Elapsed());
    return b.centre_inf_row;
  }
  const double window = SecondsUntil(bo.deadline);
  if (CentreNormEngineSecondsEstimate(L, n, dense_limit, o.norm) > 0.5 * window) dense_limit = 0;
  double least_s = CentreNormEngineSecondsEstimate(L, n, dense_limit, o.norm, /*minimum=*/true);
  if (o.norm == NormKind::kL2 && nd > dense_limit && FactoredHeadsApply(L, CentreNormOptions{}))
    least_s = std::min(least_s, FactoredHeadsSecondsEstimate(L, n));  // the heads factored alone
  if (least_s > window) {
    Refused(c, "centre_norm", "predicted time above the engines' share of the time limit");
    return -1;
  }
  const double in_hand = c->upper_bound.value();
  const auto [b, seconds] = Timed([&] { return CentreNormBound(L, cover, bo, dense_limit, in_hand); });
  Record(c, "centre_norm", b, seconds);
  Progress(o, "centre_norm", *c, clock.Elapsed());
  return b.centre_inf_row;
}

// 3. The structured bound engines on the whole set, by the end of the time that is not
// the search's: the centred engine does not start when its predicted time does not fit,
// and either engine stops at the deadline with +inf (never a partial number). Returns
// the seconds they took and, in the inf norm, the centre's largest row of J (or -1).
struct StructuredRun {
  double seconds = 0;
  int centre_inf_row = -1;
};
StructuredRun RunStructuredEngines(const AttentionLayer& L, const TokenCover& cover, const CertifyOptions& o,
                                   double engines_until, const RunClock& clock, Certificate* c) {
  const BoundOptions bo = BoundOptionsOf(o, clock.At(engines_until));
  const auto start = Clock::now();
  const auto [block, block_s] = Timed([&] { return BlockNormBound(L, cover, bo); });
  Record(c, "block_norm", block, block_s);
  Progress(o, "block_norm", *c, clock.Elapsed());
  StructuredRun run;
  run.centre_inf_row = RunCentreNorm(L, cover, o, bo, clock, c);
  if (o.on_improvement) o.on_improvement(*c);
  run.seconds = ElapsedSeconds(start);
  return run;
}

// Whether the probabilistic stage runs: norm 2 (the inf norm's centre is certified exactly
// from its row sums), when enabled.
bool ProbabilisticApplies(const CertifyOptions& o) { return o.probabilistic.enabled && o.norm == NormKind::kL2; }

// The fraction of the time limit by which the structured engines stop. On a point set
// (radius 0) the search can only evaluate the centre, a few Jacobian products that it
// stops once they meet the certified bound: the engines get 95% of the limit there. The
// probabilistic stage's share comes out of the engines' time.
double EnginesUntil(const InputSet& set, const CertifyOptions& o) {
  const double until = set.radius == 0 ? std::max(0.95, 1 - o.search.share) : 1 - o.search.share;
  return ProbabilisticApplies(o) ? std::max(0.05, until - o.probabilistic.share) : until;
}

// 3b. Beside the certificate, never in it: ||J(X0)||_2 by randomized Lanczos with its
// failure probability (certify/probable_norm.h), and over a set the centre_norm engine's
// certified terms after its centre norm (the variation): the certified centre norm swapped
// for the probable one. Never above the certified bound (which holds with probability 1).
void RunProbabilistic(const AttentionLayer& L, const InputSet& set, const CertifyOptions& o, double seconds,
                      Certificate* c) {
  if (!ProbabilisticApplies(o) || !(seconds > 0)) return;
  // Over a set: the certified terms of centre_norm after its centre norm; without them
  // (refused, gave up, timed out) the Lanczos run would have nothing to add to.
  double rest = 0;
  if (set.radius != 0) {
    const EngineResult* centred = nullptr;
    for (const EngineResult& e : c->engines)
      if (e.name == "centre_norm" && e.applied && std::isfinite(e.upper.value()) && !e.terms.empty()) centred = &e;
    if (!centred) return;
    for (size_t i = 1; i < centred->terms.size(); ++i) rest = AddUp(rest, centred->terms[i].value.value());
  }
  ProbableNormOptions po;
  po.failure_probability = o.probabilistic.failure_probability;
  po.time_limit_s = FiniteSeconds(seconds);
  po.seed = o.probabilistic.seed == 0 && o.budget.enabled() ? o.seed + 1 : o.probabilistic.seed;
  po.stop = o.stop;
  ProbabilisticBound p;
  p.centre = ProbableJacobianNormUpper(L, set.center, po);
  p.failure_probability = po.failure_probability;
  p.value = AddUp(p.centre.value, rest);
  p.route = set.radius == 0 ? "the centre: randomized Lanczos"
                            : "randomized Lanczos centre + centre_norm's certified variation terms";
  c->probabilistic = p;
}

// The certified bound holds with probability 1: the probabilistic one is never above it
// (called once branch and bound is done).
void CapProbabilisticByCertified(Certificate* c) {
  if (!c->probabilistic || !(c->upper_bound.value() < c->probabilistic->value)) return;
  c->probabilistic->value = c->upper_bound.value();
  c->probabilistic->route = "the certified bound (below the probabilistic route)";
}

// The search's time: what each later stage can still gain decides it. Branch and bound
// splits the set's box hull one coordinate at a time, which pays only on low-dimensional
// sets (few tokens and coordinates): there the time of one more root bound is kept for it
// and the search gets half of the rest. Elsewhere the root bound is all it can give, and
// the search, which keeps improving with time, gets what is left: all of it, unless the
// residual stage's centred bound (`residual`) needs the root bound's time after it
// (attention alone at MiniLM N = 64, 0.1%, ended 6 s early while that time was kept).
// At least search.share of the limit either way.
double SearchSeconds(const InputSet& set, const CertifyOptions& o, double root_seconds, bool residual,
                     const RunClock& clock) {
  constexpr long kSplitPaysUpTo = 256;  // N*D at which splitting has helped on the zoo
  const bool split_pays = long(set.center.size()) <= kSplitPaysUpTo;
  // Its last step can end up to a step past its deadline (0.4 s at MiniLM N = 64): 1% of
  // the limit, at most 0.5 s, is kept for that, whichever share it gets.
  const double margin = std::min(0.5, 0.01 * o.time_limit_s);
  const double left = std::max(0.0, clock.Left() - margin - (split_pays || residual ? root_seconds : 0.0));
  const double share = split_pays ? 0.5 * left : left;
  return std::max(std::min(o.time_limit_s * o.search.share, std::max(0.0, clock.Left() - margin)), share);
}

// Branch and bound bounds its pieces with the dense `centred` engine up to this N*D.
constexpr int kPieceDenseLimit = 4096;

// 4. Branch and bound over the set with the time that is left.
void RunBranchAndBound(const AttentionLayer& L, const InputSet& set, const CertifyOptions& o,
                       double root_seconds, const RunClock& clock, Certificate* c) {
  BranchAndBoundOptions bb;
  bb.norm = o.norm;
  bb.tolerance = o.tolerance;
  bb.dense_limit = std::min(o.engines.dense_limit, kPieceDenseLimit);
  bb.max_pieces = o.budget.enabled() ? o.budget.steps : o.branch_and_bound.max_pieces;
  bb.by_work = o.budget.enabled();
  bb.stop = o.stop;
  bb.time_limit_s = clock.Left();
  bb.root_upper = c->upper_bound;
  bb.root_seconds = root_seconds;
  bb.on_improvement = [&](UpperBound u, int explored, int open) {
    if (u.value() < c->upper_bound.value()) {
      c->upper_bound = u;
      c->pieces_explored = explored;
      c->open_pieces = open;
      c->elapsed_s = clock.Elapsed();
      Progress(o, "branch_and_bound", *c, c->elapsed_s);
      if (o.on_improvement) o.on_improvement(*c);
    }
  };
  const auto [r, seconds] = Timed([&] { return BranchAndBound(L, set, c->lower_bound, bb); });
  Record(c, "branch_and_bound", r.upper, seconds, std::to_string(r.pieces_explored) + " pieces");
  c->pieces_explored = r.pieces_explored;
  c->open_pieces = r.open_pieces;
  c->status = r.tolerance_reached                    ? CertificateStatus::kTolerance
              : r.exhausted                         ? CertificateStatus::kExhausted
              : r.stopped                           ? CertificateStatus::kInterrupted
              : r.pieces_spent && o.budget.enabled() ? CertificateStatus::kWorkBudget
                                                    : CertificateStatus::kTimeLimit;
}

// 5. The residual sublayer X + g(X) is certified invertible on the set where Lip(g) < 1.
// The block-norm bound on g comes with stage 3 (it is cheap); the centred one only when
// it fits before the run's deadline.
Invertibility BlockNormInvertibility(const AttentionLayer& L, const TokenCover& cover, const CertifyOptions& o,
                                     const RunClock& clock) {
  BoundOptions g = BoundOptionsOf(o, clock.At(1));
  g.exclude_residual = true;
  Invertibility inv;
  inv.lip_g_upper = BlockNormBound(L, cover, g).upper;
  return inv;
}

void CertifyInvertibility(const AttentionLayer& L, const TokenCover& cover, const CertifyOptions& o,
                          const RunClock& clock, Invertibility inv, Certificate* c) {
  BoundOptions g = BoundOptionsOf(o, clock.At(1));
  g.exclude_residual = true;
  const int n = int(cover.center.rows());
  const long nd = long(n) * L.d_model;
  if (CentreNormEngineRefusal(g).empty() && nd <= o.engines.dense_limit &&
      CentreNormEngineSecondsEstimate(L, n, nd, o.norm) <= 0.5 * clock.Left())
    inv.lip_g_upper = Min(inv.lip_g_upper, CentreNormBound(L, cover, g, nd).upper);
  inv.certified = inv.lip_g_upper.value() < 1;
  if (inv.certified) inv.bi_lipschitz_lower = LowerBound(SubDown(1.0, inv.lip_g_upper.value()));
  inv.bi_lipschitz_upper = Min(c->upper_bound, UpperBound(AddUp(1.0, inv.lip_g_upper.value())));
  c->invertibility = inv;
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
  // The post-LN sublayer LN(X + MHA(X)) composes certificates of MHA alone
  // (certify/post_layer_norm.h); no stage below knows the post-LN.
  if (L.post_ln()) return CertifyPostLayerNorm(L, set, o, provenance);
  const RunClock clock(o.budget.enabled() ? kInf : o.time_limit_s);
  Certificate c = Skeleton(L, set, o, provenance);
  const TokenCover cover = CoverOf(set);
  const auto finish = [&](Certificate& c) {
    if (StopRequested(o.stop) && c.status == CertificateStatus::kInProgress) c.status = CertificateStatus::kInterrupted;
    CapProbabilisticByCertified(&c);
    c.fp_environment_repaired = fp_guard.repaired() || FpEnvironmentRepairs() > repairs_before;
    c.elapsed_s = clock.Elapsed();
    Progress(o, "done", c, c.elapsed_s);
    return c;
  };

  RunClosedForms(L, set, o, &c);
  if (StopRequested(o.stop)) return finish(c);
  const StructuredRun engines = RunStructuredEngines(L, cover, o, EnginesUntil(set, o), clock, &c);
  if (StopRequested(o.stop)) return finish(c);
  RunProbabilistic(L, set, o, o.budget.enabled() ? kInf : std::min(o.probabilistic.share * o.time_limit_s, clock.Left()),
                   &c);
  const double root_seconds = engines.seconds;
  const Invertibility residual = L.residual() ? BlockNormInvertibility(L, cover, o, clock) : Invertibility{};
  if (StopRequested(o.stop)) return finish(c);
  RunSearch(L, set, o, SearchSeconds(set, o, root_seconds, L.residual(), clock), engines.centre_inf_row, &c);
  Progress(o, "search", c, clock.Elapsed());
  if (o.on_improvement) o.on_improvement(c);
  if (StopRequested(o.stop)) return finish(c);
  RunBranchAndBound(L, set, o, root_seconds, clock, &c);
  if (c.upper_bound.value() <= MulDown(c.lower_bound.value(), 1 + o.tolerance)) c.status = CertificateStatus::kTolerance;
  if (L.residual() && !StopRequested(o.stop)) CertifyInvertibility(L, cover, o, clock, residual, &c);
  return finish(c);
}

}  // namespace lipcert
