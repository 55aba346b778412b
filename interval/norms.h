// Rigorous bounds on operator norms. Every function returns an UpperBound or a
// LowerBound: an upper bound can never be passed where a lower bound or an enclosure is
// expected. Methods and proofs: docs/rounding-model.md ("Norm bounds").
#pragma once

#include <Eigen/Dense>
#include <functional>
#include <string>

#include "interval/interval_matrix.h"

namespace lipcert {

// ---- l_inf, l_1, Frobenius: exact up to outward rounding --------------------------------
UpperBound NormInf(const Eigen::MatrixXd& a);          // max row sum of |a_ij|
UpperBound Norm1(const Eigen::MatrixXd& a);            // max column sum of |a_ij|
UpperBound NormInfUpper(const IntervalMatrix& a);      // sup over the enclosure (exact sup)
UpperBound Norm1Upper(const IntervalMatrix& a);
UpperBound NormFrobeniusUpper(const Eigen::MatrixXd& a);
UpperBound NormFrobeniusUpper(const IntervalMatrix& a);
// Adds fl(|mid_rc| + rad_rc) to hi(r) and, where lo is non-null, fl(max(0, |mid_rc| - rad_rc))
// to (*lo)(r), column by column in round to nearest (vectorised along the contiguous columns of
// column-major storage; a row-wise reduction would stride). Each term carries one rounding and
// each addition one more: once a row has summed T terms in all, its exact sum of |mid| + rad
// is at most hi(r) / (1 - gamma_{T+1}) + (T + 1) eta, and of max(0, |mid| - rad) at least
// lo(r) (1 - gamma_{T+1}) - (T + 1) eta. Sums in round to nearest (the environment guarded).
void AddAbsRowSums(const Eigen::Ref<const Eigen::MatrixXd>& mid, const Eigen::Ref<const Eigen::MatrixXd>& rad,
                   Eigen::Ref<Eigen::VectorXd> hi, Eigen::VectorXd* lo = nullptr);

// ---- l2 --------------------------------------------------------------------------------
// sqrt(||a||_1 ||a||_inf), and the Frobenius norm: the smaller of the two (cheap, crude).
UpperBound NormL2UpperCrude(const Eigen::MatrixXd& a);
UpperBound NormL2UpperCrude(const IntervalMatrix& a);

struct CollatzWielandtOptions {
  int power_iterations = 30;  // power steps on a^T a that choose the test vector x > 0
};
// ||a||_2 for a >= 0 entrywise (aborts on a negative or NaN entry), via Collatz-Wielandt:
// rho(a^T a) <= max_i (a^T a x)_i / x_i for every x > 0; never worse than the crude bound.
UpperBound NormL2UpperNonneg(const Eigen::MatrixXd& a, const CollatzWielandtOptions& o = {});
// rho(n) (= ||n||_2 when n is also symmetric) for a square n >= 0 entrywise.
UpperBound SpectralRadiusUpperNonneg(const Eigen::MatrixXd& n, const CollatzWielandtOptions& o = {});

struct NormL2Options {
  int lanczos_max_steps = 300;        // Lanczos steps for the eigenvalue estimate (stops early)
  double lanczos_tolerance = 1e-12;   // relative Ritz residual at which Lanczos stops
  int max_cholesky_attempts = 40;     // shifts tried before falling back to the crude bound
  double initial_shift = 0.0;         // relative shift tau of the first attempt; 0: 4 (n+1) u
  double shift_growth = 4.0;          // tau is multiplied by this after a failed Cholesky
  CollatzWielandtOptions radius;      // for the norm of a radius matrix
};

// What a tight l2 bound did (for logs and certificates).
struct NormL2Report {
  double estimate = 0.0;        // floating-point estimate (Lanczos); not a bound
  int cholesky_attempts = 0;    // Cholesky factorisations run
  bool fell_back_to_crude = false;
  double shift = 0.0;           // the certified shift s
  double cholesky_error = 0.0;  // the bound on ||Delta M||_2 that was added
  double radius_norm = 0.0;     // the bound on the enclosure radius norm that was added
};

// Upper bound on lambda_max(B) over every SYMMETRIC matrix B in the enclosure b (square).
// Certificate: Cholesky of s I - mid(b) succeeds in floating point, with Higham's
// backward error bound (Thm 10.3) and Weyl's inequality for the radius.
UpperBound LambdaMaxUpper(const IntervalMatrix& b, const NormL2Options& o = {},
                          NormL2Report* report = nullptr);
// Tight ||a||_2 = sqrt(lambda_max(a^T a)) for a point matrix (relative overestimate about
// (k + n^2/... ) u; ~1e-11 at n = 1024; see the bench).
UpperBound NormL2Upper(const Eigen::MatrixXd& a, const NormL2Options& o = {},
                       NormL2Report* report = nullptr);
// sup ||A||_2 over the enclosure: NormL2Upper(mid) + NormL2UpperNonneg(rad) (and never
// worse than NormL2UpperCrude).
UpperBound NormL2UpperInterval(const IntervalMatrix& a, const NormL2Options& o = {});

// sup ||a^T b||_2 for point matrices a and b of k rows (k much smaller than their columns),
// in O(k^2 n) work instead of the n x n product's: ||a^T b||^2 = lambda_max(a^T G a) with
// G = b b^T (k x k). With G = R^T R + E (R a floating-point Cholesky factor, E enclosed),
// lambda_max(a^T G a) <= lambda_max((R a)(R a)^T) + ||E||_2 ||a||_2^2, all k x k
// certificates. Falls back to NormL2UpperInterval of the enclosed product when the
// Cholesky of G fails.
UpperBound ProductNormL2Upper(const Eigen::MatrixXd& a, const Eigen::MatrixXd& b, const NormL2Options& o = {});

// An implicit symmetric operator M (n x n) given by products: apply(x, &y) sets y ~ M x,
// and for every unit basis vector e_j the caller guarantees ||apply(e_j) - M e_j||_2 <=
// column_error. Certifies ||M||_2 <= lambda_max-bound + sqrt(n) column_error by forming
// M column by column (n products, then the Cholesky certificate of LambdaMaxUpper), and
// needs M positive semidefinite (||M||_2 = lambda_max). No matrix-free certificate is
// offered: finitely many products cannot bound the norm of an unseen direction.
UpperBound NormL2UpperImplicitPsd(Eigen::Index n,
                                  const std::function<void(const Eigen::VectorXd&, Eigen::VectorXd*)>& apply,
                                  double column_error, const NormL2Options& o = {});

// ---- lower bounds (witnesses) ------------------------------------------------------------
// Rigorous lower bound on ||a v||_2 / ||v||_2 (<= ||a||_2). 0 for v == 0.
LowerBound NormRatioLower(const Eigen::MatrixXd& a, const Eigen::VectorXd& v);
// A witnessed lower bound on ||a||_2: power iteration picks v, NormRatioLower certifies it.
LowerBound NormL2Lower(const Eigen::MatrixXd& a, int power_iterations = 50);

}  // namespace lipcert
