// Interval matrices in midpoint-radius form, multiplied with plain double GEMMs.
//
// An IntervalMatrix {mid, rad} encloses every real matrix X with |X - mid| <= rad
// entrywise. Products run the midpoint through an ordinary round-to-nearest Eigen GEMM
// (any blocking, vectorisation, FMA or threading) and add a rigorous radius computed
// from two more nonnegative GEMMs inflated by gamma_k = k u / (1 - k u) plus an
// underflow term; the derivation is in docs/rounding-model.md ("Midpoint-radius
// products"). Nothing changes the rounding mode, so every function is thread-safe;
// each entry point checks that the calling thread is in round-to-nearest.
//
// A vector is an n x 1 IntervalMatrix.
#pragma once

#include <Eigen/Dense>

#include "interval/interval.h"

namespace lipcert {

struct IntervalMatrix {
  Eigen::MatrixXd mid;  // midpoint
  Eigen::MatrixXd rad;  // radius, >= 0 entrywise (+inf allowed: an unbounded entry)

  IntervalMatrix() = default;
  // Aborts if the shapes differ or a radius entry is negative or NaN.
  IntervalMatrix(Eigen::MatrixXd mid_, Eigen::MatrixXd rad_);

  // The exact point matrix m (radius 0).
  static IntervalMatrix Point(const Eigen::MatrixXd& m);
  // The smallest (up to rounding) midpoint-radius enclosure of [lo, hi] entrywise.
  // Aborts unless lo <= hi entrywise.
  static IntervalMatrix FromBounds(const Eigen::MatrixXd& lo, const Eigen::MatrixXd& hi);
  // Encloses [m - r, m + r] for a radius that is a plain double (>= 0) on every entry.
  static IntervalMatrix Ball(const Eigen::MatrixXd& m, double r);

  Eigen::Index rows() const { return mid.rows(); }
  Eigen::Index cols() const { return mid.cols(); }
  // Entrywise lower / upper endpoints, rounded outward.
  Eigen::MatrixXd Lower() const;
  Eigen::MatrixXd Upper() const;
  // The enclosure of entry (i, j).
  Interval operator()(Eigen::Index i, Eigen::Index j) const;
  // True when every entry of x lies in the enclosure (exact comparison).
  bool Contains(const Eigen::MatrixXd& x) const;
  IntervalMatrix transpose() const { return IntervalMatrix(mid.transpose(), rad.transpose()); }
  // Upper bound on max_ij rad_ij.
  double MaxRadius() const;
};

// Enclosures of the exact products (aborts on a shape mismatch).
IntervalMatrix Mul(const IntervalMatrix& a, const IntervalMatrix& b);
IntervalMatrix Mul(const Eigen::MatrixXd& a, const IntervalMatrix& b);
IntervalMatrix Mul(const IntervalMatrix& a, const Eigen::MatrixXd& b);
IntervalMatrix Mul(const Eigen::MatrixXd& a, const Eigen::MatrixXd& b);
// Encloses a^T a; the midpoint is exactly symmetric.
IntervalMatrix GramEnclosure(const Eigen::MatrixXd& a);
// Encloses a^T a over all a in the enclosure (mid exactly symmetric).
IntervalMatrix GramEnclosure(const IntervalMatrix& a);

IntervalMatrix operator+(const IntervalMatrix& a, const IntervalMatrix& b);
IntervalMatrix operator-(const IntervalMatrix& a, const IntervalMatrix& b);
// s * a for an interval scalar s.
IntervalMatrix Scale(const Interval& s, const IntervalMatrix& a);
// Dot product of two n x 1 interval vectors.
Interval Dot(const IntervalMatrix& x, const IntervalMatrix& y);

// Given an enclosure b of a matrix known to be symmetric, returns an enclosure of the
// same symmetric matrices whose midpoint is exactly symmetric (and radius symmetric).
IntervalMatrix SymmetrizeEnclosure(const IntervalMatrix& b);

}  // namespace lipcert
