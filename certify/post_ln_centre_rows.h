// The post-LN sublayer's centre norm ||D(Yc)(I + J_M(X0))||_2 from the rows of the LayerNorm
// factor, where J_f(X0) itself is not certified in the time (docs/engines.md, "The centre
// from the LayerNorm's rows"). D(Yc) = blockdiag(D_i), D_i = D_i(yc_i) the LayerNorm's
// Jacobian at token i of the centre of the cover of Y; A = I + J_M(X0), A_i its D rows of
// token i.
#pragma once

#include <Eigen/Dense>
#include <chrono>
#include <vector>

#include "interval/interval_matrix.h"
#include "interval/rounding.h"

namespace lipcert {

// >= ||diag(w) (I + J_M(X0))||_2 from the row blocks r_i >= ||J_{M,i}(X0)||_2 (empty: not
// known) and c >= ||J_M(X0)||_2: with A = I + J_M(X0), ||A_i|| <= 1 + r_i and ||A|| <= 1 + c,
// and for any set H of tokens
//   ||diag(w) A||^2 = ||sum_i w_i^2 A_i^T A_i|| <= sum_{i in H} w_i^2 ||A_i||^2 + max_{i not in H} w_i^2 ||A||^2;
// H runs over the k tokens of largest weight, k = 0..N, and the least is kept; the same with
// the identity apart, ||diag(w) A|| <= max_i w_i + ||diag(w) J_M(X0)|| (||J_{M,i}|| <= r_i,
// ||J_M|| <= c), where smaller.
double WeightedCentreUp(const Eigen::VectorXd& w, const Eigen::VectorXd& rows, double c);

// ||blockdiag(D_i) A||_2, split by the rows of the LayerNorm factors. A LayerNorm's Jacobian
// is diag(gamma / sigma_i) times a projection, so its few rows where |gamma_a| is large carry
// its norm (MiniLM layer 0: |gamma| 1.55 and 1.49 against a median of 0.55; docs/engines.md).
// For any matrix B and any split of its rows into H and R,
// ||B||^2 <= ||B_H||^2 + ||B_R||^2. With H the K rows (i, a) of largest ||row a of D_i||:
//   B_H = the rows of D_i in H times A_i (K x ND, enclosed from `jm`, certified by the Gram
//         certificate of its K x K Gram matrix),
//   ||B_R|| <= t ||diag(w) A||, c_i >= ||S_{R_i} D_i|| (token i's rows outside H), t = max_i c_i,
//         w_i = c_i / t, ||diag(w) A|| by WeightedCentreUp,
// for each K in heavy_counts (0 gives max_i ||D_i|| ||diag(w) A||, the crude centre), the least
// kept. ln_jac[i] encloses D_i (D x D); jm encloses J_M(X0) (ND x ND, output rows i*D + a).
// K = 0 is computed whatever the deadline; a larger K only where its rows and its certificate
// finish before it. +inf when an input is not finite.
struct LayerNormRowSplit {
  UpperBound upper{kInf};
  int heavy_rows = -1;                 // the K of the least bound (-1: none finished)
  UpperBound heavy_norm{kInf};         // its ||B_H||
  UpperBound rest{kInf};               // its bound on ||B_R||
};
LayerNormRowSplit LayerNormRowSplitCentreUp(const std::vector<IntervalMatrix>& ln_jac, const IntervalMatrix& jm,
                                            const Eigen::VectorXd& mha_rows, UpperBound mha_centre,
                                            const std::vector<int>& heavy_counts, int threads,
                                            std::chrono::steady_clock::time_point deadline =
                                                std::chrono::steady_clock::time_point::max());

}  // namespace lipcert
