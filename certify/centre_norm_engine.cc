// The centre_norm engine: ||J(X0)|| certified (Gram/Cholesky, super-blocks, the heads
// factored, or the inf norm's row sums) plus the centred variation over the set
// (CentredVariationBound in certify/centred_engine.cc), and for the pre-LN sublayer the
// LayerNorm's variation and anchor terms; and the time it is given.
#include "certify/centred_engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "certify/centre_norm.h"
#include "certify/centre_norm_engine.h"
#include "certify/closed_form.h"
#include "certify/dense_jacobian.h"
#include "certify/head_factors.h"
#include "certify/layer_norm_cover.h"
#include "certify/time_model.h"
#include "interval/norms.h"
#include "interval/parallel.h"
#include "interval/vector_norms.h"

namespace lipcert {

std::string CentreNormEngineRefusal(const BoundOptions& opts) {
  return opts.norm == NormKind::kL2 || opts.norm == NormKind::kLinf ? "" : "norms 2 and inf only";
}

namespace {
CentreNormOptions CentreNormOptionsOf(const BoundOptions& opts, long centre_dense_limit) {
  CentreNormOptions c;
  c.dense_limit = centre_dense_limit;
  c.deflation_vectors = opts.deflation_vectors;
  c.exclude_residual = opts.exclude_residual;
  c.threads = opts.threads;
  c.deadline = opts.deadline;
  c.stop = opts.stop;  // a stop ends the centre norm's Gram, Cholesky and blocks as the deadline does
  return c;
}
}  // namespace

double CentreNormEngineSecondsEstimate(const AttentionLayer& layer, int tokens, long centre_dense_limit,
                                        NormKind norm, bool minimum) {
  CentreNormOptions c;
  c.dense_limit = centre_dense_limit;
  const double one = norm == NormKind::kLinf ? CentreInfNormSecondsEstimate(layer, tokens)
                     : minimum               ? CentreNormMinimumSecondsEstimate(layer, tokens, c)
                                             : CentreNormSecondsEstimate(layer, tokens, c);
  return layer.layer_norm ? 2 * one : one;  // the sublayer certifies ||J_M(zc)|| too
}

namespace {

// When the variation's refinements end. They leave the centre norm its least time (the
// assembly of its super-blocks, or its one dense certificate) with a margin of
// kCentreNormReserve (the assembly took 53 to 72 s of its predicted 58 s at BERT-base size
// on the 2-core EPYC): without it, at BERT-base size they took 48.6 s of a 105 s window and
// the centre norm's 53 s assembly ran out of time (docs/engines.md, "The variation's time,
// and the centre norm's reserve"). Where the super-blocks' least time takes more than
// kFactoredAloneShare of the window and the heads factored apply (dot-product MHA alone),
// the centre norm is the factored heads alone (co->super_blocks = false), and the variation
// gets the time the super-blocks would have taken (BERT-base size: 9.203 in about 10 s
// against 61.5 from the super-blocks in 84 s; docs/engines.md, "Centre norm: the heads
// factored"). Without a deadline (a work budget), never.
std::chrono::steady_clock::time_point VariationRefineUntil(const AttentionLayer& L, int tokens, const BoundOptions& opts,
                                                           long centre_dense_limit, CentreNormOptions* co) {
  if (opts.deadline == std::chrono::steady_clock::time_point::max()) return opts.deadline;
  double reserve_s = time_model::kCentreNormReserve *
                     CentreNormEngineSecondsEstimate(L, tokens, centre_dense_limit, opts.norm, /*minimum=*/true);
  const double window = SecondsUntil(opts.deadline);
  if (opts.norm == NormKind::kL2 && long(tokens) * L.d_model > centre_dense_limit && FactoredHeadsApply(L, *co) &&
      reserve_s > time_model::kFactoredAloneShare * window) {
    co->super_blocks = false;
    reserve_s = time_model::kCentreNormReserve * FactoredHeadsSecondsEstimate(L, tokens);
  }
  return opts.deadline - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(reserve_s));
}

// How the centre norm was certified, for its term's name.
std::string CentreNormHow(const CentreNormReport& report, bool inf) {
  char factored_how[200];
  if (report.factored_crossed <= report.factored)
    std::snprintf(factored_how, sizeof factored_how,
                  "heads factored, the paths with their cross terms: %.4g (values alone %.4g, keys and queries %.4g)",
                  report.factored_crossed, report.factored_value,
                  std::min(report.factored_keys + report.factored_queries, report.factored_keys_and_queries));
  else if (report.factored_keys_and_queries < report.factored_keys + report.factored_queries)
    std::snprintf(factored_how, sizeof factored_how, "heads factored: values %.4g + keys and queries %.4g (cross term)",
                  report.factored_value, report.factored_keys_and_queries);
  else
    std::snprintf(factored_how, sizeof factored_how, "heads factored: values %.4g + keys %.4g + queries %.4g",
                  report.factored_value, report.factored_keys, report.factored_queries);
  return inf                       ? "row sums of the enclosure"
                          : report.factored_won      ? std::string(factored_how)
                          : report.method == "dense" ? "dense Gram/Cholesky certificate"
                                                     : std::to_string(report.groups) + " x " +
                                                           std::to_string(report.groups) + " token super-blocks, " +
                                                           std::to_string(report.exact_blocks) + " certified densely" +
                                                           (report.method == "deflated_super_block"
                                                                ? ", deflated by " + std::to_string(report.deflation_vectors) +
                                                                      " Lanczos vectors"
                                                            : report.deflation_abandoned
                                                                ? "; deflation abandoned: the machine was too slow for it"
                                                                : std::string());
}

// The timed-out bound of a centre norm that ran out of time; its note says where the time
// went: the variation's seconds, then the centre norm's progress.
EngineBound CentreNormTimedOut(const char* name, double variation_s, int second_order_nodes,
                               const CentreNormReport& report) {
  EngineBound late = TimedOutBound(name);
  late.note += " (the variation took " + std::to_string(variation_s) + " s with " +
               std::to_string(second_order_nodes) + " second-order nodes; the centre norm, " + report.method +
               ", stopped after " + std::to_string(report.seconds) + " s with " +
               std::to_string(report.exact_blocks) + " blocks certified densely, assembly " +
               std::to_string(report.assembly_seconds) + " s)";
  return late;
}

// The variation is about the z-cover's floating centre zc, the centre norm about the exact
// z0 = LN(x0) (enclosed): ||J_M(zc) - J_M(z0)|| <= the variation of MHA alone over the point
// set's z-cover (LayerNorm's rounding only), times max_j sup ||J_LN(x_j)||. Empty where the
// anchors differ or the variation ran out of time: no bound.
std::optional<UpperBound> AnchorUp(const AttentionLayer& L, const TokenCover& cover, const MhaInput& in,
                                   const BoundOptions& opts) {
  TokenCover point = cover;
  point.radius.setZero();
  point.frobenius = UpperBound(0.0);
  const MhaInput in0 = MhaInputOver(L, point, NormKind::kL2);
  if (in0.zc != in.zc) return std::nullopt;  // not the same anchor
  AttentionLayer mha_alone = L;
  mha_alone.layer_norm.reset();
  const CentredVariation v0 = CentredVariationBound(mha_alone, TokenCover{in0.zc, in0.rho_z, UpperBound(in0.joint_z), {}}, opts);
  if (!v0.complete) return std::nullopt;
  return UpperBound(MulUp(v0.variation.value(), in.ell.maxCoeff()));
}

}  // namespace

// ||J_M(z0)||_p multiplies the LayerNorm's variation. Where Castin's closed form over the
// MHA input's cover already makes that product negligible against the centre norm, it
// serves; else +inf, and MHA's own centre norm is certified (at BERT-base size that second
// pass took 28 s of a 120 s limit).
UpperBound CrudeMhaNormWhereNegligible(const AttentionLayer& L, const MhaInput& in, NormKind norm, double ln_delta_p,
                                       const UpperBound& centre_norm) {
  if (L.kind != AttentionKind::kDot || L.causal) return UpperBound(kInf);
  const UpperBound crude = CastinMhaUpperBound(L, TokenCover{in.zc, in.rho_z, UpperBound(in.joint_z), {}});
  // ||A||_inf <= sqrt(ND) ||A||_2 for the ND x ND Jacobian.
  const double p_factor = norm == NormKind::kLinf ? SqrtUp(double(in.zc.size())) : 1.0;
  const double bound = MulUp(crude.value(), p_factor);
  return MulUp(bound, ln_delta_p) <= kNegligibleLnVariation * centre_norm.value() ? UpperBound(bound) : UpperBound(kInf);
}

namespace {

// The engine's bound from its terms: centre norm + variation + LayerNorm variation + anchor,
// added in this order, and the centred form's halves.
EngineBound CentreNormSum(const UpperBound& centre_norm, const CentredVariation& v, const UpperBound& ln_variation,
                          const UpperBound& anchor, const std::string& how) {
  EngineBound out;
  out.upper = centre_norm + v.variation + ln_variation + anchor;
  out.terms.push_back({"centre norm ||J(X0)|| (" + how + ")", centre_norm});
  out.terms.push_back({v.route, v.variation});
  if (v.in.residual) {
    out.terms.push_back({"LayerNorm variation ||J_M(z0)|| max_j ||J_LN(x_j) - J_LN(x0_j)||", ln_variation});
    out.terms.push_back({"LayerNorm rounding ||J_M(zc) - J_M(z0)|| max_j ||J_LN(x_j)||", anchor});
  }
  out.alternatives = v.alternatives;
  // The centred form's halves: the centre norm, and the rest of the terms added in order.
  double variation = 0;
  for (size_t i = 1; i < out.terms.size(); ++i) variation = AddUp(variation, out.terms[i].value.value());
  // MHA alone: the variation is the centred variation's alone, and so is its mean.
  out.centre_norm = CentreNormTerms{centre_norm, UpperBound(variation),
                                    v.in.residual ? UpperBound(kInf) : v.mean_variation};
  return out;
}

// Where the time went (the sublayer's second centre norm and variation are in neither).
std::string CentreNormSeconds(double variation_s, int second_order_nodes, double centre_s) {
  char seconds[128];
  if (second_order_nodes > 0)
    std::snprintf(seconds, sizeof seconds, "the variation took %.2f s (%d second-order nodes of 8), the centre norm %.2f s",
                  variation_s, second_order_nodes, centre_s);
  else
    std::snprintf(seconds, sizeof seconds, "the variation took %.2f s, the centre norm %.2f s", variation_s, centre_s);
  return seconds;
}

}  // namespace

EngineBound CentreNormBound(const AttentionLayer& L, const TokenCover& cover, const BoundOptions& opts,
                            long centre_dense_limit, double give_up_above) {
  constexpr const char* kName = "centre_norm";
  if (const std::string why = CentreNormEngineRefusal(opts); !why.empty())
    throw std::invalid_argument(std::string(kName) + " engine: " + why);
  const auto t_variation = std::chrono::steady_clock::now();
  const int tokens = int(cover.center.rows());
  // The pre-LN sublayer's anchor term first, so that the variation's refinement below leaves
  // time for the centre norm alone (at BERT-base size the anchor's variation took 12 s).
  UpperBound anchor(0.0);
  if (L.layer_norm) {
    const std::optional<UpperBound> anchor_up = AnchorUp(L, cover, MhaInputOver(L, cover, opts.norm), opts);
    if (!anchor_up) return TimedOutBound(kName);
    anchor = *anchor_up;
  }
  CentreNormOptions co = CentreNormOptionsOf(opts, centre_dense_limit);
  const auto refine_until = VariationRefineUntil(L, tokens, opts, centre_dense_limit, &co);
  // With the factored heads alone the centre norm is short: the variation refines up to its reserve.
  const CentredVariation v = CentredVariationBound(L, cover, opts, refine_until, /*up_to_refine_until=*/!co.super_blocks);
  const double variation_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_variation).count();
  if (!v.complete) {
    EngineBound late = TimedOutBound(kName);
    late.note += " (in the variation, after " + std::to_string(variation_s) + " s)";
    return late;
  }
  if (v.variation.value() >= give_up_above) {
    EngineBound skipped;
    skipped.note = "variation alone " + std::to_string(v.variation.value()) + " >= the bound in hand " +
                   std::to_string(give_up_above) + ": centre norm not computed";
    return skipped;
  }
  const bool inf = opts.norm == NormKind::kLinf;
  // ||J(X0)||_p: norm 2 by the Gram/Cholesky certificate (or super-blocks), norm inf by the
  // enclosure's row sums (exact to the enclosure's width at any size).
  CentreNormReport report;
  CentreInfNormBounds inf_report;
  auto centre_norm_of = [&](const CentreNormOptions& c, bool* timed_out) {
    if (!inf) {
      const UpperBound u = CentreJacobianNormUpperBound(L, cover.center, c, &report);
      *timed_out = report.timed_out;
      return u;
    }
    const CentreInfNormBounds b = CentreJacobianInfNormBounds(L, cover.center, c);
    *timed_out = b.timed_out;
    if (!c.mha_only) inf_report = b;
    return b.upper;
  };
  bool timed_out = false;
  const auto t_centre = std::chrono::steady_clock::now();
  const UpperBound centre_norm = centre_norm_of(co, &timed_out);
  const double centre_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_centre).count();
  if (timed_out) return CentreNormTimedOut(kName, variation_s, v.second_order_nodes, report);
  // delta_ln is a 2-norm bound on D x D matrices; ||A||_inf <= sqrt(D) ||A||_2.
  const double ln_delta_p = inf ? MulUp(SqrtUp(double(L.d_model)), v.in.delta_ln.maxCoeff()) : v.in.delta_ln.maxCoeff();
  UpperBound ln_variation(0.0);
  if (v.in.residual) {
    UpperBound mha_norm = CrudeMhaNormWhereNegligible(L, v.in, opts.norm, ln_delta_p, centre_norm);
    if (!std::isfinite(mha_norm.value())) {
      CentreNormOptions mha = co;
      mha.mha_only = true;
      CentreNormReport centre_report = report;
      mha_norm = centre_norm_of(mha, &timed_out);
      report = centre_report;
      if (timed_out) return TimedOutBound(kName);
    }
    ln_variation = UpperBound(MulUp(mha_norm.value(), ln_delta_p));
  }
  EngineBound out = CentreNormSum(centre_norm, v, ln_variation, anchor, CentreNormHow(report, inf));
  out.centre_inf_row = inf ? inf_report.row : -1;
  out.note = CentreNormSeconds(variation_s, v.second_order_nodes, centre_s);
  return out;
}

}  // namespace lipcert
