// Witnessed lower bounds: a search for a point X* of the input set and a direction v
// with a large ||J_f(X*) v|| / ||v||, the value then re-evaluated rigorously
// (certify/witness_eval.h) so that the reported lower bound is a proven fact.
//
// Norms (see docs/search.md):
//   NormKind::kL2   the spectral norm of J as an (ND) x (ND) operator on Frobenius-normed
//                   inputs and outputs; v is a top right singular vector, ||v||_F = 1.
//   NormKind::kLinf the l_inf -> l_inf operator norm = max_r ||row_r(J)||_1; v = sign(row_r)
//                   (||v||_inf = 1) and the value is ||J v||_inf >= <e_r, J v> = ||row_r||_1.
//
// Strategy (SearchLowerBound, top to bottom): the centre X0; for kL2 the first-order
// ascent steps from it along the gradients of its top few singular values (where they
// cluster, as on trained layers, the second or third may climb fastest); samples uniform in the set
// and on its boundary; structured starts the theory calls dangerous (a query splitting its
// attention between far-apart tokens, a few tokens carrying unbalanced mass along the top
// singular directions of the per-head query-key matrices, duplicated-then-perturbed
// tokens); then projected gradient ascent with backtracking from the best `starts` of
// those, in parallel; then further rounds from perturbations of the best points until the
// time limit. For kLinf the centre's direction is exact (all N*D rows of J), so the
// witness is never below ||J(X0)||_inf. Deterministic for a given seed when the time limit
// is not what stops it (the thread count only changes who computes what, never the result).
#pragma once

#include <Eigen/Dense>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "certify/input_set.h"
#include "certify/witness.h"
#include "interval/rounding.h"
#include "models/attention_layer.h"

namespace lipcert {

struct SearchOptions {
  double time_limit_s = 10;  // wall-clock budget; checked between ascent steps
  int starts = 32;           // ascent starts per round (and samples drawn per round)
  int max_steps = 200;       // ascent steps per start
  int max_rounds = 0;        // rounds of (candidates -> ascent); 0: until the time limit
  uint64_t seed = 1;         // everything random derives from it
  NormKind norm = NormKind::kL2;
  int threads = 0;           // 0: std::thread::hardware_concurrency()
  bool structured = true;    // include the theory's structured starts
  bool exact_inf_centre = true;  // kLinf: the centre's exact largest row (N*D VJPs, within
                                 // half of time_limit_s; see docs/search.md for the cost)
  double stop_at = kInf;     // stop (after screening or a round) once a floating value
                             // reaches it: e.g. the certified upper bound / (1 + tolerance)
  int centre_pairs = 4;      // kL2: the centre's top singular pairs (deflated Lanczos) whose
                             // first-order ascent steps start round 0 (docs/search.md); 0: none
  int centre_inf_row = -1;   // kLinf: a row of J(X0) known to be its largest (e.g. from the
                             // centre_norm engine's enclosure): taken instead of the N*D rows
  bool rigorous = true;      // re-evaluate the final witness in interval arithmetic
  // When it points to true the search ends as at its time limit (its witness so far is
  // still polished and evaluated rigorously).
  const std::atomic<bool>* stop = nullptr;
  bool verbose = false;      // progress lines on stderr
};

// Returns "" when valid, else a message naming the bad field.
std::string ValidateSearchOptions(const SearchOptions& opts);

struct SearchResult {
  Witness best;
  int points_evaluated = 0;  // Jacobian-norm evaluations (each a few JVP/VJP pairs)
  int ascent_steps = 0;      // accepted ascent steps, all starts together
  int rounds = 0;            // completed rounds
  double elapsed_s = 0;
  // Best floating value reached per origin, sorted by origin name.
  std::vector<std::pair<std::string, double>> best_by_origin;
};

// Throws std::invalid_argument when the options, the layer or the set are invalid or
// do not match (the message names the field).
SearchResult SearchLowerBound(const AttentionLayer& layer, const InputSet& set,
                              const SearchOptions& opts);

// The floating value ||J(x) v|| / ||v|| in the given norm and, for the caller that has
// a point and wants the best direction there, the top direction itself. Exposed for
// tests and the certificate's report.
struct TopDirection {
  double value = 0;          // sigma_1 (kL2) or max_r ||row_r||_1 (kLinf), floating
  Eigen::MatrixXd u;         // kL2: J v / sigma (unit); kLinf: e_r
  Eigen::MatrixXd v;         // kL2: unit top right singular vector; kLinf: sign(row_r)
};
// Exact (the floating Jacobian formed) for N*D <= exact_up_to, else Lanczos on J^T J through kernels/evaluator.h
// (kL2) or Hager's estimator (kLinf); the value is then ||J v|| / ||v|| for the returned
// v, a lower bound of the true norm up to rounding.
TopDirection TopDirectionAt(const AttentionLayer& layer, const Eigen::MatrixXd& x, NormKind norm,
                            int exact_up_to = 256);

// kLinf, exact: max_r ||row_r(J(x))||_1 over all N*D rows of J (N*D VJPs through
// kernels/evaluator.h, in blocks over `threads` workers, 0 = all cores; the same result for
// any count), with u = e_r and v = sign(row_r). The search starts from this at the centre.
TopDirection ExactInfDirectionAt(const AttentionLayer& layer, const Eigen::MatrixXd& x, int threads = 0);

}  // namespace lipcert
