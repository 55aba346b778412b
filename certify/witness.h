// A witness of a lower bound: an input X* of the set and a direction v with
// ||J(X*) v|| / ||v|| >= lower_bound, evaluated rigorously (certify/witness_eval.h). The one
// record the search returns, the certificate carries and the CLI writes.
#pragma once

#include <Eigen/Dense>
#include <string>

#include "interval/rounding.h"

namespace lipcert {

struct Witness {
  Eigen::MatrixXd x;         // the point X*, (N, D), inside the set
  Eigen::MatrixXd v;         // the direction (N, D): unit Frobenius (kL2) or a sign matrix (kLinf)
  double value = 0;          // floating estimate of ||J(X*) v|| / ||v||
  LowerBound lower_bound{0}; // rigorous: lower_bound <= ||J(X*) v|| / ||v|| (0 when not evaluated)
  std::string origin;        // "centre", "sample", "boundary", "split-attention", "mass-unbalanced",
                             // "mass-split", "perturb"; "ascent:<origin>" after ascent
};

}  // namespace lipcert
