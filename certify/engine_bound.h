// What the structured engines (certify/block_norm_engine.h, certify/centred_engine.h)
// take and return: their options, and a certified bound with its breakdown by term.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "certify/input_set.h"
#include "certify/run_control.h"
#include "interval/rounding.h"

namespace lipcert {

struct BoundOptions {
  NormKind norm = NormKind::kL2;
  // The centred engine refuses layers with N*D above this (it forms J(X0) densely).
  int dense_limit = 4096;
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
};

// The EngineBound of an engine stopped by its deadline.
EngineBound TimedOutBound(const std::string& engine);

// True once opts.deadline has passed or opts.stop points to true.
bool DeadlinePassed(const BoundOptions& opts);

}  // namespace lipcert
