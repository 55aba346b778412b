// A probabilistic upper bound on ||J(X0)||_2 at one point, reported beside the certified
// bound and never as it: randomized Lanczos on J^T J (matrix-free, one JVP and one VJP per
// step through kernels/evaluator.h) from a start vector drawn uniformly on the unit sphere.
//
// Kuczynski & Wozniakowski (SIAM J. Matrix Anal. Appl. 13(4), 1992, Theorem 4.2): for a
// symmetric positive semi-definite A of order n and the largest Ritz value theta_k of the
// Krylov space K_k(A, b) = span{b, Ab, ..., A^(k-1) b}, b uniform on the sphere,
//     P[ theta_k < (1 - eps) lambda_1(A) ] <= 1.648 sqrt(n) exp(-sqrt(eps) (2k - 1)).
// So lambda_1 <= theta_k / (1 - eps) except on a set of start vectors of measure at most
// delta, with sqrt(eps) = ln(1.648 sqrt(n) / delta) / (2k - 1). With A = J^T J this bounds
// sigma_1 = ||J||_2 by sqrt(theta_k / (1 - eps)).
//
// How it is used here (docs/engines.md, "Probabilistic centre norm"):
//   - k in the formula is the Krylov dimension minus one (one step conservative whichever
//     way the paper's k is counted);
//   - the run stops at a step chosen from the data (the target ratio, the time), so the
//     failure probability is split over every step it could stop at (union bound:
//     delta / max_krylov each), and the bound reported is the least over the steps, which
//     then all hold at once with probability >= 1 - delta;
//   - a Krylov space that turns (numerically) invariant is enlarged by random vectors
//     orthogonal to it: eps stays that of its Krylov part, and once the space is all of
//     R^n (small layers) theta is lambda_1 itself (eps = 0);
//   - the Krylov basis is computed in floating point with full reorthogonalisation
//     (twice), which the theorem does not model; theta is enlarged by a relative 1e-8
//     (Ritz values of such a run are accurate to about k u ||A||, u = 1.1e-16).
// The probability is over the start vector alone: the seed is drawn from the operating
// system unless one is given, and recorded.
#pragma once

#include <Eigen/Dense>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "interval/rounding.h"
#include "models/attention_layer.h"

namespace lipcert {

struct ProbableNormOptions {
  double failure_probability = 1e-6;  // delta: the bound may fail for this share of starts
  int max_krylov = 300;               // Lanczos steps (Krylov dimension), at most
  double target_ratio = 1.001;        // stop once value <= target_ratio * Ritz estimate
  double time_limit_s = 10;           // wall clock, checked after every step
  uint64_t seed = 0;                  // the start vector's; 0: drawn from std::random_device
  const std::atomic<bool>* stop = nullptr;  // ends the run after its step when it points to true
  std::string IsValid() const;        // "" or a message naming the field
};

// sigma_1(J(X0)) <= value with probability >= 1 - failure_probability over the random
// start. NOT certified: a type of its own so that it cannot be taken for an UpperBound.
struct ProbableUpperBound {
  double value = kInf;             // the probabilistic upper bound on ||J(X0)||_2
  double failure_probability = 1;  // delta
  double ritz_sigma = 0;           // sqrt(theta): the Lanczos estimate of sigma_1 (from below)
  double epsilon = 1;              // the theorem's relative eigenvalue error at the step taken
  int krylov_dim = 0;              // Krylov dimension of the step whose bound is reported
  int steps = 0;                   // Lanczos steps run (J^T J products)
  uint64_t seed = 0;               // of the start vector
  double seconds = 0;
  bool stopped_by_time = false;    // the time limit ended it before the target ratio
};

// The eps of the theorem above for order n, Krylov dimension k and failure probability
// delta: sqrt(eps) = ln(1.648 sqrt(n) / delta) / (2k - 1); returns 1 (no bound) when that
// is not below 1. Rounded so that the eps returned is at least the exact one.
double KuczynskiWozniakowskiEpsilon(double n, int k, double delta);

// v -> J(x0)^T J(x0) v in floating point, v and the result flat in row-major (token,
// feature) order: through the kernels evaluator (attention, pre-LN sublayer), or the
// model's own JVP and VJP for the post-LN sublayer LN(X + MHA(X)) (models/forward.h). The
// function owns what it needs. Used for the Lanczos run here.
std::function<void(const double* v, double* out)> NormalProduct(const AttentionLayer& layer, const Eigen::MatrixXd& x0,
                                                                 int threads);

// Both products from one set-up, the same layouts and operators: jvp v -> J(x0) v and
// vjp u -> J(x0)^T u (the centre norm's deflation keeps the J q of its Lanczos steps as Y).
struct JacobianProducts {
  std::function<void(const double* v, double* out)> jvp, vjp;
};
JacobianProducts JacobianProductsOf(const AttentionLayer& layer, const Eigen::MatrixXd& x0, int threads);

// The bound for the layer's full Jacobian at x0 (N x D): the attention, the pre-LN sublayer
// X + MHA(LN(X)) and the post-LN sublayer LN(X + MHA(X)) alike. Throws std::invalid_argument on invalid options
// or a centre whose width is not the layer's d_model.
ProbableUpperBound ProbableJacobianNormUpper(const AttentionLayer& layer, const Eigen::MatrixXd& x0,
                                             const ProbableNormOptions& opts);

}  // namespace lipcert
