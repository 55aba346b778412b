// Covers of an input set by per-token balls, as every structured engine consumes them.
#pragma once

#include <Eigen/Dense>

#include "certify/input_set.h"
#include "interval/rounding.h"

namespace lipcert {

// A cover of the input set by per-token balls: every X of the set has
// ||x_i - center_i||_2 <= radius(i) for all i. Each radius(i) is an upper bound (>= 0),
// rounded up where it was computed; the centre is exact.
struct TokenCover {
  Eigen::MatrixXd center;  // (N, D)
  Eigen::VectorXd radius;  // (N), upper bounds, >= 0
  // ||X - center||_F <= frobenius over the set as well (a ball's radius couples the
  // tokens); +inf when only the per-token radii are known.
  UpperBound frobenius{kInf};
  // Optional (empty: not known): ||x_i - mean(x_i) 1|| >= centred_lo(i) >= 0 over the set, a
  // lower bound on each token's centred norm that may be tighter than the ball's
  // ||center_i - mean|| - radius(i) (the post-LN cover of Y, PostLnYCover); a LayerNorm over the
  // cover takes the larger of the two.
  Eigen::VectorXd centred_lo;
};

// Upper bound on ||X - center||_F over the cover: the smaller of `frobenius` and ||radius||_2
// (rounded up).
UpperBound JointRadiusUp(const TokenCover& cover);

// The cover of a whole set: its centre and the set's TokenRadius / FrobeniusRadius.
TokenCover CoverOf(const InputSet& set);

}  // namespace lipcert
