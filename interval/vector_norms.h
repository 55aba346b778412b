// Rigorous norms of magnitude vectors, row distances of enclosures and small operator
// norms, as the certified bound engines combine them. Every result named "Up" is >= the
// exact real value it bounds, every "Down" result <= it (outward rounding through
// interval/rounding.h); none of them depends on the rounding mode of the caller.
//
// These return plain doubles, not UpperBound: they are the steps of longer directed
// computations (AddUp / MulUp chains), and the suffix carries the direction.
#pragma once

#include <vector>

#include <Eigen/Dense>

#include "interval/interval_matrix.h"

namespace lipcert {

// A vector norm l_1, l_2 or l_inf (and the operator norms it induces).
enum class VectorNorm { kOne, kTwo, kInf };

// ||m||_q for a vector m >= 0 entrywise of magnitude bounds: >= ||x||_q for every x with
// |x| <= m entrywise. kInf is exact (the largest entry, 0 for an empty vector).
double NormUpOfMagnitudes(const Eigen::VectorXd& m, VectorNorm q);

// |mid(r, c)| + rad(r, c) rounded up, for every column c: magnitude bounds of row r of
// every matrix in the enclosure.
Eigen::VectorXd RowMagnitude(const IntervalMatrix& a, Eigen::Index r);

// out(j, k) >= ||x_j - x_k||_q for rows x_j, x_k of every matrix in the enclosure a
// (symmetric, zero diagonal).
Eigen::MatrixXd PairDistanceUp(const IntervalMatrix& a, VectorNorm q);

// out(j, k) <= ||x_j - x_k||_2 for rows of every matrix in the enclosure a (symmetric,
// zero diagonal, >= 0).
Eigen::MatrixXd PairDistanceL2Down(const IntervalMatrix& a);

// out(i, j) >= ||x_j - y_i||_2 for rows x_j of every matrix in a and rows y_i of every
// matrix in b (a and b have as many columns; out is b.rows() x a.rows()).
Eigen::MatrixXd RowDistanceL2Up(const IntervalMatrix& a, const IntervalMatrix& b);

// >= sup ||M||_{2 -> q} over the enclosure m: kTwo the spectral norm, kInf the largest row
// 2-norm, kOne the sum of the row 2-norms.
double OperatorNormFromL2Up(const IntervalMatrix& m, VectorNorm q);

// >= sup ||M||_{q -> q} over the enclosure m (kTwo: spectral, kInf: max row sum, kOne:
// max column sum).
double OperatorNormUp(const IntervalMatrix& m, VectorNorm q);

// >= ||B||_{q -> q} for a matrix B >= 0 entrywise (kTwo: Collatz-Wielandt, kInf: max row
// sum, kOne: max column sum).
double NonnegNormUp(const Eigen::MatrixXd& b, VectorNorm q);

// >= ||B diag(s)||_{q -> q} for B >= 0 and s >= 0 entrywise.
double ScaledNonnegNormUp(Eigen::MatrixXd b, const Eigen::VectorXd& s, VectorNorm q);

// >= max sum_k x_k c_k over 0 <= x_k <= cap_k, sum_k x_k <= total (k < len), for c >= 0
// (a fractional knapsack, solved greedily on the largest c_k, every step rounded up; when
// the caps fit the total, or exceed it by 1e-9 of it only, sum_k cap_k c_k, unsorted). With
// total 1: a bound on sum_k P_k c_k for every probability row P below the caps; with total
// 2: on sum_k |P_k - P0_k| c_k for two such rows. Never above total max_k c_k nor
// sum_k cap_k c_k (up to rounding).
double SimplexWeightedSumUp(const Eigen::VectorXd& cap, const Eigen::VectorXd& c, int len, double total = 1.0);
// The same with c's indices given in descending order of c (`order` lists every index of c;
// those >= len are skipped), for many rows that share one c: one sort (DescendingOrder) in
// place of one per row. Any order of equal c_k gives a bound.
double SimplexWeightedSumUp(const Eigen::VectorXd& cap, const Eigen::VectorXd& c, int len, double total,
                            const std::vector<int>& order);
// The indices of each row of m in descending order of its entries.
std::vector<std::vector<int>> DescendingRowOrders(const Eigen::MatrixXd& m);

}  // namespace lipcert
