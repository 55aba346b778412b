// What the structured engines (certify/block_norm_engine.h, certify/centred_engine.h)
// take and return: their options, and a certified bound with its breakdown by term.
#pragma once

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "certify/input_set.h"
#include "certify/run_control.h"
#include "interval/rounding.h"

namespace lipcert {

// dense_limit, wherever it appears (CertifyOptions::engines, BoundOptions, branch and
// bound): the largest N*D at which an engine encloses J(X0) densely, as one ND x ND interval
// matrix with one Gram/Cholesky certificate of its norm. Above it an engine works by token
// blocks or declines. Engines whose dense route costs more per use cap it further with a
// named constant of their own (branch and bound's pieces: kPieceDenseLimit; the post-LN
// centre's memory: kPostLnDenseLimit).
inline constexpr int kDefaultDenseLimit = 12288;

struct BoundOptions {
  NormKind norm = NormKind::kL2;
  int dense_limit = kDefaultDenseLimit;  // see above
  // The centre_norm engine's super-blocks: deflate with up to this many Lanczos vectors,
  // as many as fit before the deadline (0: off).
  int deflation_vectors = 0;
  // For the sublayer X + g(X): bound Lip(g) instead (drop the identity), as used to
  // certify invertibility. No effect on a layer without LayerNorm.
  bool exclude_residual = false;
  // Engines check this in their long loops; once it has passed they stop and return
  // upper = +inf with timed_out set (never a partial number). max(): no limit.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // When it points to true the engines stop as at the deadline (CertifyOptions::stop).
  const std::atomic<bool>* stop = nullptr;
  // Bounded by work (CertifyOptions::budget): no choice may depend on the clock or a time
  // model; sizes and fixed counts decide (deadline is then kNoDeadline).
  bool by_work = false;
  // Worker threads of the engines' parallel loops (heads, dense block rows); 0: all cores.
  int threads = 0;

  // "" when valid, else a message naming the field.
  std::string IsValid() const;
};

// One named part of a certified bound.
struct BoundTerm {
  std::string name;
  UpperBound value{kInf};
};

// The centre_norm engine's bound split as the centred form is: upper = centre + variation,
// centre >= ||J(X0)|| and variation >= sup over the set of ||J(X) - J(X0)|| (with, for the
// sublayer, its LayerNorm terms). The probabilistic stage and the post-LN composition swap
// or reuse the two halves.
struct CentreNormTerms {
  UpperBound centre{kInf};
  UpperBound variation{kInf};
  // >= sup over the set of int_0^1 ||J(X0 + s (X - X0)) - J(X0)|| ds (CentredVariation's
  // mean_variation) for MHA alone; +inf where not known.
  UpperBound mean_variation{kInf};
};

// A certified upper bound with the terms it is made of.
//   terms:        the summands: upper == the sum of their values, added in order and
//                 rounded up; each term is <= upper. This answers "which term dominates".
//   alternatives: candidate bounds the engine compared for one summand (the smallest was
//                 taken), and their parts; each is >= the summand it was a candidate for,
//                 so it may exceed upper.
// When the engine ran past opts.deadline: upper = +inf, timed_out, no terms.
struct EngineBound {
  UpperBound upper{kInf};
  std::vector<BoundTerm> terms;
  std::vector<BoundTerm> alternatives;
  bool timed_out = false;
  std::string note;  // why the bound is +inf (timeout), else ""
  // centre_norm in the inf norm: the row of J(X0) with the largest certified row sum
  // (row-major flattening i*D + a), for the search's centre witness; -1 otherwise.
  int centre_inf_row = -1;
  // centre_norm: its two halves (set where the bound is finite).
  std::optional<CentreNormTerms> centre_norm;
};

// The EngineBound of an engine stopped by its deadline.
EngineBound TimedOutBound(const std::string& engine);

// True once opts.deadline has passed or opts.stop points to true.
bool DeadlinePassed(const BoundOptions& opts);

}  // namespace lipcert
