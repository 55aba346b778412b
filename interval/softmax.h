// Dependency-free enclosures of softmax over a box of logits.
//
// For logits z in the box [l, u] (one row; the first `len` entries are active, the rest
// masked out), p = softmax(z) satisfies, EXACTLY (each p_i is increasing in z_i and
// decreasing in z_j, j != i, so the extremes sit at corners of the box):
//   p_i in [ 1/(1 + sum_{j!=i} e^{u_j - l_i}),  1/(1 + sum_{j!=i} e^{l_j - u_i}) ].
// The functions return these bounds rounded outward (O(len) exp calls per row, no
// cancellation: the leave-one-out sums are prefix + suffix sums).
#pragma once

#include <Eigen/Dense>

#include "interval/elementary.h"
#include "interval/interval_matrix.h"

namespace lipcert {

struct ProbabilityBounds {
  Eigen::VectorXd lo;  // lo_i <= p_i for every z in the box
  Eigen::VectorXd hi;  // p_i <= hi_i
};

// One row. l and u have the same size n >= len >= 1; entries >= len get [0, 0].
// Aborts unless l <= u on the active entries.
ProbabilityBounds SoftmaxRange(const Eigen::VectorXd& l, const Eigen::VectorXd& u,
                               Eigen::Index len, ExpBackend b);
inline ProbabilityBounds SoftmaxRange(const Eigen::VectorXd& l, const Eigen::VectorXd& u) {
  return SoftmaxRange(l, u, l.size(), DefaultExpBackend());
}

struct ProbabilityMatrixBounds {
  Eigen::MatrixXd lo;
  Eigen::MatrixXd hi;
};
// Row-wise softmax over logits given as an interval matrix (midpoint + radius), with an
// optional causal mask (row i attends to columns j <= i).
ProbabilityMatrixBounds SoftmaxRowsRange(const IntervalMatrix& logits, bool causal, ExpBackend b);
inline ProbabilityMatrixBounds SoftmaxRowsRange(const IntervalMatrix& logits, bool causal) {
  return SoftmaxRowsRange(logits, causal, DefaultExpBackend());
}

// Upper bound on || diag(p) - p p^T ||_2 (the softmax Jacobian) over the row's box:
// its eigenvalues lie in [0, min(1/2, max_i p_i)].
UpperBound SoftmaxJacobianL2Upper(const ProbabilityBounds& p);

}  // namespace lipcert
