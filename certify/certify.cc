#include "certify/certify.h"

#include <chrono>
#include <cstdio>
#include <stdexcept>

#include "certify/branch_and_bound.h"
#include "certify/closed_form.h"
#include "certify/jacobian_bounds.h"
#include "certify/search.h"
#include "interval/elementary.h"

namespace lipcert {

std::string ValidateCertifyOptions(const CertifyOptions& o) {
  if (!(o.time_limit_s > 0)) return "time_limit: must be positive";
  if (!(o.search_share >= 0 && o.search_share < 1)) return "search_share: must be in [0, 1)";
  if (!(o.tolerance >= 0)) return "tolerance: must be >= 0";
  if (o.dense_limit < 0) return "dense_limit: must be >= 0";
  if (o.search_rounds < 0) return "search_rounds: must be >= 0";
  if (o.max_pieces < 1) return "max_pieces: must be >= 1";
  return "";
}

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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

void Progress(const CertifyOptions& o, const char* stage, const Certificate& c, double t) {
  if (!o.progress) return;
  std::fprintf(stderr, "[lipcert %7.2fs] %-18s upper %.9g  lower %.9g  gap %.6g\n", t, stage,
               c.upper_bound.value(), c.lower_bound.value(), c.gap());
}

}  // namespace

Certificate Certify(const AttentionLayer& L, const InputSet& set, const CertifyOptions& o,
                    const Provenance& provenance, WitnessData* witness) {
  if (const std::string e = ValidateCertifyOptions(o); !e.empty()) throw std::invalid_argument(e);
  if (const std::string e = ValidateLayer(L); !e.empty()) throw std::invalid_argument(e);
  if (set.width() != L.d_model) throw std::invalid_argument("centre: width does not match the layer's d_model");
  if (!(set.radius >= 0) || !std::isfinite(set.radius)) throw std::invalid_argument("radius: must be finite and >= 0");
  const auto start = Clock::now();
  Certificate c = Skeleton(L, set, o, provenance);
  auto record = [&](const std::string& name, UpperBound u, double secs, const std::string& note) {
    c.engines.push_back({name, u, secs, note});
    c.upper_bound = Min(c.upper_bound, u);
  };

  // 1. Closed-form baselines.
  for (const ClosedFormBound& b : ClosedFormBounds(L, set, o.norm)) record(b.name, b.upper, 0, "");

  // 2. The witnessed lower bound.
  SearchOptions so;
  so.norm = o.norm;
  so.seed = o.seed;
  so.threads = o.threads;
  so.time_limit_s = o.time_limit_s * o.search_share;
  so.max_rounds = o.search_rounds;
  so.verbose = false;
  const SearchResult sr = SearchLowerBound(L, set, so);
  c.lower_bound = LowerBound(sr.best.lower_bound);
  c.witness = {sr.best.origin, sr.best.value, LowerBound(sr.best.lower_bound)};
  if (witness) *witness = {sr.best.x, sr.best.v};
  Progress(o, "search", c, Since(start));

  // 3. Structured engines on the whole set.
  BoundOptions bo;
  bo.norm = o.norm;
  bo.dense_limit = o.dense_limit;
  const TokenCover cover = CoverOf(set);
  const auto structured_start = Clock::now();
  double centred_seconds = 0;
  {
    const auto t = Clock::now();
    record("block_norm", BlockNormUpperBound(L, cover, bo), Since(t), "");
    Progress(o, "block_norm", c, Since(start));
  }
  if (o.norm == NormKind::kL2 && long(set.center.size()) <= o.dense_limit) {
    const auto t = Clock::now();
    record("centred", CentredUpperBound(L, cover, bo), Since(t), "");
    centred_seconds = Since(t);
    Progress(o, "centred", c, Since(start));
  } else {
    c.engines.push_back({"centred", UpperBound(kInf), 0,
                         o.norm != NormKind::kL2 ? "norm 2 only" : "N*D above dense_limit", false});
  }
  if (o.on_improvement) o.on_improvement(c);

  // 4. Branch and bound with the time that is left.
  BranchAndBoundOptions bb;
  bb.norm = o.norm;
  bb.tolerance = o.tolerance;
  bb.dense_limit = o.dense_limit;
  bb.max_pieces = o.max_pieces;
  bb.time_limit_s = std::max(0.0, o.time_limit_s - Since(start));
  bb.root_upper = c.upper_bound;
  bb.root_seconds = Since(structured_start);
  bb.on_improvement = [&](UpperBound u, int explored, int open) {
    if (u.value() < c.upper_bound.value()) {
      c.upper_bound = u;
      c.pieces_explored = explored;
      c.open_pieces = open;
      c.elapsed_s = Since(start);
      Progress(o, "branch_and_bound", c, c.elapsed_s);
      if (o.on_improvement) o.on_improvement(c);
    }
  };
  {
    const auto t = Clock::now();
    const BranchAndBoundResult r = BranchAndBound(L, set, c.lower_bound, bb);
    record("branch_and_bound", r.upper, Since(t), std::to_string(r.pieces_explored) + " pieces");
    c.pieces_explored = r.pieces_explored;
    c.open_pieces = r.open_pieces;
    c.status = r.tolerance_reached ? CertificateStatus::kTolerance
               : r.exhausted      ? CertificateStatus::kExhausted
                                  : CertificateStatus::kTimeLimit;
  }
  if (c.upper_bound.value() <= MulDown(c.lower_bound.value(), 1 + o.tolerance)) c.status = CertificateStatus::kTolerance;

  // 5. The residual sublayer: certified invertible where Lip(g) < 1.
  if (L.residual()) {
    BoundOptions g = bo;
    g.exclude_residual = true;
    Invertibility inv;
    // The block-norm bound is cheap; the centred one only if it fits in the time left
    // (it takes about as long as it took in step 3).
    inv.lip_g_upper = BlockNormUpperBound(L, cover, g);
    const bool dense = o.norm == NormKind::kL2 && long(set.center.size()) <= o.dense_limit;
    if (dense && Since(start) + centred_seconds <= o.time_limit_s)
      inv.lip_g_upper = Min(inv.lip_g_upper, CentredUpperBound(L, cover, g));
    inv.certified = inv.lip_g_upper.value() < 1;
    if (inv.certified) inv.bi_lipschitz_lower = LowerBound(SubDown(1.0, inv.lip_g_upper.value()));
    inv.bi_lipschitz_upper = Min(c.upper_bound, UpperBound(AddUp(1.0, inv.lip_g_upper.value())));
    c.invertibility = inv;
  }
  c.elapsed_s = Since(start);
  Progress(o, "done", c, c.elapsed_s);
  return c;
}

}  // namespace lipcert
