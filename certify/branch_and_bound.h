// Anytime branch and bound over the input set: the set's box hull is split along its
// widest coordinate; each piece (box intersected with the set) is covered by per-token
// balls and bounded by the structured engines; the certified bound is the maximum over
// the open pieces. Splitting pays off where the set is low-dimensional (few tokens and
// coordinates); on wide layers the root bound is usually all the time allows.
#pragma once

#include <atomic>
#include <functional>

#include "certify/engine_bound.h"
#include "certify/input_set.h"
#include "certify/token_cover.h"
#include "models/attention_layer.h"

namespace lipcert {

// The centred engine bounds a piece densely up to this N*D at most: it runs once per piece,
// its cost (N D)^3.
inline constexpr int kPieceDenseLimit = 4096;

struct BranchAndBoundOptions {
  NormKind norm = NormKind::kL2;
  double time_limit_s = 10;   // wall clock for the whole search (+inf: none, work alone)
  double tolerance = 0.01;    // stop when upper <= (1 + tolerance) * lower
  int max_pieces = 100000;    // pieces bounded, at most (the work budget's steps)
  int dense_limit = kDefaultDenseLimit;  // certify/engine_bound.h; the pieces' centred engine
                                        // at most kPieceDenseLimit
  bool exclude_residual = false;
  bool by_work = false;       // no clock in the pieces' engines (BoundOptions::by_work)
  // When it points to true the loop ends before its next split (and the engines inside
  // stop as at their deadline).
  const std::atomic<bool>* stop = nullptr;
  // The root's bound and the seconds it took, when the caller has already computed them
  // (root_upper = +inf: compute here).
  UpperBound root_upper{kInf};
  double root_seconds = 0;
  // Called whenever the certified bound improves (anytime certificates).
  std::function<void(UpperBound upper, int explored, int open)> on_improvement;
};

struct BranchAndBoundResult {
  UpperBound upper{kInf};
  int pieces_explored = 0;
  int open_pieces = 0;
  bool tolerance_reached = false;
  bool exhausted = false;     // no piece left worth splitting (all at full resolution)
  bool pieces_spent = false;  // ended by max_pieces
  bool stopped = false;       // ended by opts.stop
};

// Bound of one cover: the better of the block-norm engine and, where CentredEngineRefusal
// allows it, the centred engine.
UpperBound BestStructuredBound(const AttentionLayer& layer, const TokenCover& cover, const BoundOptions& opts);

BranchAndBoundResult BranchAndBound(const AttentionLayer& layer, const InputSet& set, LowerBound lower,
                                    const BranchAndBoundOptions& opts);

}  // namespace lipcert
