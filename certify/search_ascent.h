// Projected gradient ascent of the floating norm ||J(X)|| over the input set, from one
// start (internal to certify/search.cc): steps along grad_X <u, J(X) v> for the current
// top pair (u, v), projected onto the set, with backtracking on the step length.
#pragma once

#include <Eigen/Dense>
#include <atomic>
#include <chrono>

#include "certify/input_set.h"
#include "certify/search_oracle.h"

namespace lipcert::search_parts {

struct Candidate;

struct AscentResult {
  Eigen::MatrixXd x;  // the last accepted point
  Pair pair;          // its top direction
  int steps = 0;        // accepted steps
  int evaluations = 0;  // top-direction evaluations
};

// At most max_steps accepted steps, each trying up to 12 step lengths; stops at the
// deadline, at a stationary point, or when no step length improves the value.
// `stop` (when it points to true) ends it as the deadline does.
AscentResult Ascend(const Oracle& o, const InputSet& set, const Candidate& start, NormKind norm, int max_steps,
                    std::chrono::steady_clock::time_point deadline, const std::atomic<bool>* stop = nullptr);

}  // namespace lipcert::search_parts
