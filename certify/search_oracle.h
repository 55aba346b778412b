// The search's Jacobian oracle and its top-direction rule (internal to certify/search.cc):
// the only code of the search that computes Jacobian products, through the public API of
// kernels/evaluator.h (CPU back end, float64, one point at a time, one thread: the search
// parallelises over points with one Oracle per worker); the dense path for tiny sizes and
// the final reference value use models/forward.h.
//
// The kernels know MHA alone and the pre-LN sublayer X + MHA(LN(X)). For the post-LN
// sublayer f(X) = LN(Y), Y = X + MHA(X), the oracle composes the kernels' MHA products with
// the LayerNorm's row by row (docs/search.md, "The post-LN sublayer"):
//   J_f v     = J_LN(Y) (v + J_MHA v)
//   J_f^T u   = w + J_MHA^T w,                    w = J_LN(Y)^T u
//   grad_X <u, J_f(X) v> = PG_MHA(X; w, v) + g + J_MHA^T g,
//                           g = grad_Y <u, J_LN(Y) (v + J_MHA v)> (the (v + J_MHA v) held fixed)
// so that every stage of the search (Lanczos, Hager's rows, the exact rows, the ascent)
// follows the sublayer's own Jacobian, LayerNorm included.
#pragma once

#include <Eigen/Dense>
#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "certify/input_set.h"
#include "kernels/evaluator.h"
#include "models/attention_layer.h"

namespace lipcert::search_parts {

class Oracle {
 public:
  // Engine stopping rule: relative Ritz residual rel_tol, at most max_iters J^T J products
  // (the post-LN sublayer's Lanczos runs here under the same rule).
  Oracle(const AttentionLayer& layer, int tokens, double rel_tol, int max_iters);
  ~Oracle();
  Eigen::MatrixXd Jv(const Eigen::MatrixXd& x, const Eigen::MatrixXd& v) const;
  Eigen::MatrixXd JTu(const Eigen::MatrixXd& x, const Eigen::MatrixXd& u) const;
  // grad_X <u, J(X) v> with u, v fixed.
  Eigen::MatrixXd PairGradient(const Eigen::MatrixXd& x, const Eigen::MatrixXd& u, const Eigen::MatrixXd& v) const;
  // Top singular triple (sigma = ||J v||, J v = sigma u), optionally warm-started.
  void TopSingular(const Eigen::MatrixXd& x, const Eigen::MatrixXd* v0, double* sigma, Eigen::MatrixXd* u,
                   Eigen::MatrixXd* v) const;
  // The top singular triple of J(x) restricted to the orthogonal complement of `found`
  // (orthonormal right singular vectors already taken): Lanczos on P J^T J P, P the
  // projector off span(found), under the oracle's stopping rule. With `found` empty, the
  // top triple (as TopSingular, from the engine's start vector).
  void NextSingular(const Eigen::MatrixXd& x, const std::vector<Eigen::MatrixXd>& found, double* sigma,
                    Eigen::MatrixXd* u, Eigen::MatrixXd* v) const;
  // out(k) = ||row_{rows[k]}(J(x))||_1 for k < count: J^T e_r for the count rows, one
  // batched engine call (each point of a batch is computed on its own, so a row's sum
  // does not depend on the batch it is in).
  void RowAbsSums(const Eigen::MatrixXd& x, const int* rows, int count, double* out) const;
  // The order in which a scan cut short should visit the rows of J(x): for the post-LN
  // sublayer by |gamma_a| / sigma_i descending (row r = i*D + a of J_f is w + J_MHA^T w with
  // ||w|| proportional to |gamma_a| / sigma_i, so the largest rows come early); empty for
  // the other layers (ExactInfTop's stride then).
  std::vector<int> RowOrder(const Eigen::MatrixXd& x) const;
  // Dense (ND) x (ND) Jacobian, row-major flattening i*D + a (small sizes).
  Eigen::MatrixXd Dense(const Eigen::MatrixXd& x) const;
  // J v through models/forward.h (the reference, for the final value).
  Eigen::MatrixXd ReferenceJv(const Eigen::MatrixXd& x, const Eigen::MatrixXd& v) const;

 private:
  // The post-LN LayerNorm's row statistics at Y = X + MHA(X) for the last x seen (one
  // Oracle serves one worker at a time, so the cache needs no lock).
  struct PostLnRows {
    Eigen::MatrixXd x;     // the point they belong to
    Eigen::MatrixXd yhat;  // (Y - mean) / sigma, row by row
    Eigen::VectorXd sigma; // sqrt(var + eps), row by row
  };
  const PostLnRows& RowsAt(const Eigen::MatrixXd& x) const;
  Eigen::MatrixXd LnJv(const PostLnRows& r, const Eigen::MatrixXd& w) const;   // J_LN(Y) w
  Eigen::MatrixXd LnJTu(const PostLnRows& r, const Eigen::MatrixXd& u) const;  // J_LN(Y)^T u
  // grad_Y <u, J_LN(Y) w> with w held fixed.
  Eigen::MatrixXd LnPairGradient(const PostLnRows& r, const Eigen::MatrixXd& u, const Eigen::MatrixXd& w) const;
  Eigen::MatrixXd MhaJv(const Eigen::MatrixXd& x, const Eigen::MatrixXd& v) const;
  Eigen::MatrixXd MhaJTu(const Eigen::MatrixXd& x, const Eigen::MatrixXd& u) const;
  // Lanczos on P J^T J P through the engine's products at x (MHA's state evaluated once,
  // the post-LN LayerNorm composed when there is one), from v0 or the engine's start.
  void LanczosTop(const Eigen::MatrixXd& x, const std::vector<Eigen::MatrixXd>& found, const Eigen::MatrixXd* v0,
                  double* sigma, Eigen::MatrixXd* u, Eigen::MatrixXd* v) const;

  const AttentionLayer& layer_;
  int n_, d_;
  double rel_tol_;
  int max_iters_;
  bool post_ln_;
  std::unique_ptr<JacobianEvaluator> engine_;  // MHA alone (or the pre-LN sublayer)
  mutable PostLnRows rows_;
};

// Engine stopping rules (relative Ritz residual, J^T J products): screening and ascent,
// and the final witness direction.
constexpr double kCheapTol = 1e-6;
constexpr int kCheapIters = 60;
constexpr double kFineTol = 1e-13;
constexpr int kFineIters = 3000;

// The top direction at a point.
struct Pair {
  double value = -1;  // floating; -1: not computed
  Eigen::MatrixXd u, v;
  int row = -1;  // kLinf: the row r
};

struct TopParams {
  int exact_up_to = 16;  // N*D at or below which the floating Jacobian is formed (not an
                         // enclosure: nothing like the engines' dense_limit)
  int iters = 12;        // kLinf: Hager steps = iters / 3 (kL2 follows the engine's rule)
};

// sigma_1 with its singular pair (kL2), or a large row of J with its sign vector (kLinf:
// Hager's estimator, started from warm->row when given); exact up to tp.exact_up_to.
Pair ComputeTop(const Oracle& o, const Eigen::MatrixXd& x, NormKind norm, const Pair* warm, const TopParams& tp);

// Gradient of <u, J(x) v> in x (the envelope theorem makes it the gradient of the norm at
// a simple top pair): d/dt J(x + t v)^T u at t = 0, exact from the engine.
Eigen::MatrixXd PairGradient(const Oracle& o, const Eigen::MatrixXd& x, const Pair& p);

// kLinf: row r of J(x) (one VJP) with its sign vector: value = ||row_r||_1 = (J(x) v)_r.
Pair InfRowPair(const Oracle& o, const Eigen::MatrixXd& x, int r);

// kLinf, exact: the largest row sum max_r ||row_r(J(x))||_1 from all N*D rows of J (N*D
// VJPs, in blocks over the given oracles, one per worker), with its row and sign vector.
// The lowest such row wins ties, so the result does not depend on the number of workers.
// Blocks are taken in a strided order over the tokens and stop at `deadline`: a partial
// run still returns the best row it computed (any row's sum is a value of ||J v||_inf
// with v its sign vector), and *complete (if given) says whether every row was seen.
// `stop` (when it points to true) ends it as the deadline does.
Pair ExactInfTop(const std::vector<std::unique_ptr<Oracle>>& oracles, const Eigen::MatrixXd& x,
                 std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max(),
                 bool* complete = nullptr, const std::atomic<bool>* stop = nullptr);

Eigen::MatrixXd SignOf(const Eigen::MatrixXd& m);

}  // namespace lipcert::search_parts
