// A certified upper bound on ||J(X0)||_2, the Jacobian at the centre of the set, tight
// (about 1e-8 relative) wherever one dense certificate of all of J fits the budget, and a
// token-grouped super-block bound above that (docs/engines.md, "Centre norm").
//
// J(X0) is enclosed block by block (token i's output against token j's input, D x D):
//
//     J_ij = sum_h [ P^h_ij W_h + a^h_ij r^h_ij^T ] L_j  +  delta_ij ( sum_h A_i^h^T Bt^h ) L_i  (+ delta_ij I)
//
// with the notation of certify/jacobian_bounds.h (W_h = Wo_h M_h, a_ij = P_ij (u_j - ubar_i);
// dot: r_ij = Wk_h^T q_i / sqrt(dk), rows of Bt = Wq_h^T k_j / sqrt(dk) - c; l2: r_ij = g_i - g_j,
// g_i = 2 Wq_h^T q_i / sqrt(dk), Bt = g - c; any constant row c, since sum_j a_ij = 0), L_j the
// LayerNorm Jacobian at x0_j (identity without LayerNorm), applied in O(D^2) as
// diag(c) - (rank two). Every quantity is a midpoint-radius enclosure (interval/).
//
// The norm of an enclosure [M +- R] is certified as ||M||_2 + ||R||_2: ||M||_2^2 through a
// floating Gram matrix G = M^T M (two threads), a Lanczos estimate theta of lambda_max(G),
// and a Cholesky factorisation of s I - G with s = theta (1 + tau), whose success proves
// lambda_max(M^T M) <= s + (Gram error) + (Cholesky backward error, Higham Thm 10.3).
//
// Above dense_limit the tokens are cut into groups of block_tokens; with B_IK a certified
// bound on the group block ||J_IK||_2 (dense certificate, or the Frobenius norm when
// block_tokens * D is above block_limit or the block's certificate would not fit before
// the deadline: anytime, diagonal blocks first), ||J||_2 <= ||B||_2 (nonnegative G x G).
// Measured on all-MiniLM-L6-v2 the per-token (G = N) bound is 1.9 times sigma_1 at N = 8;
// sigma_2 / sigma_1 = 0.97 there, so deflating the top pair does not make it exact.
//
// Cost model (2 cores, unloaded; n = N*D; docs/engines.md has the measured figures):
//   assembly  ~ 2.5e-9 s * N^2 H D^2    (interval block accumulation)
//   dense     ~ (n^3 / 2 + n^3 / 3) / 1.5e10 s  + assembly, memory 2 n^2 doubles
//   grouped   ~ (N/g)^2 (m^3 / 2 + m^3 / 3) / 1.5e10 s with m = g D (exact blocks)
// CentreNormSecondsEstimate returns this model for the pipeline's scheduling.
#pragma once

#include <Eigen/Dense>
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "interval/interval_matrix.h"
#include "interval/rounding.h"
#include "models/attention_layer.h"

namespace lipcert {

struct CentreNormOptions {
  // Largest N*D certified with one dense certificate of all of J(X0).
  long dense_limit = 8192;
  // Above dense_limit: tokens per group (0: the largest with tokens * D <= block_limit).
  int block_tokens = 0;
  // Largest group block (rows) certified densely; larger blocks use their Frobenius norm.
  long block_limit = 3072;
  // For the sublayer X + g(X): bound ||J_g|| instead (drop the identity).
  bool exclude_residual = false;
  // The MHA Jacobian alone at its input z = LN(X0): no LayerNorm factor, no identity.
  bool mha_only = false;
  // Worker threads (0: hardware concurrency).
  int threads = 0;
  // Above dense_limit, for layers without LayerNorm: deflate J with up to this many Lanczos
  // vectors of J^T J before the super-blocks (docs/engines.md, "Deflation"); 0: plain
  // super-blocks. Not anytime: with a deadline it takes as many as its predicted time
  // (with a margin) fits, and the plain super-blocks run when that is fewer than 32.
  int deflation_vectors = 0;
  // Dot-product attention: the fused assembly, one pass over the heads per entry column,
  // then the pre-LN sublayer's LayerNorm factor per column token (the same enclosure up to
  // rounding); false: one update per head.
  bool gemm_assembly = true;
  // Above dense_limit, dot-product MHA alone (attention alone, or mha_only): also bound
  // ||J(X0)|| through the heads' factors (V + K + Q, seconds at any size; docs/engines.md,
  // "Centre norm: the heads factored") and take the smaller bound.
  bool factored_heads = true;
  // Above dense_limit: run the super-blocks (plain or deflated). false: where the factored
  // heads apply, they alone (the engine's choice when the super-blocks would not fit).
  bool super_blocks = true;
  // Checked between blocks, Gram tiles and Cholesky tiles: once it has passed the result
  // is +inf (report->timed_out), never a partial number. The dense enclosure's assembly and
  // one tile step of its Cholesky are not interrupted: callers size dense_limit to their time.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // A stop request (BoundOptions::stop, CertifyOptions::stop): wherever the deadline is
  // checked, a flag that points to true ends the work as the deadline would (+inf,
  // report->timed_out). nullptr: none.
  const std::atomic<bool>* stop = nullptr;

  // "" when valid, else a message naming the field.
  std::string IsValid() const;
};

// Where a dense certificate's time went (NormL2UpperGram).
struct GramStats {
  double gram_seconds = 0;      // fl(M^T M)
  double lanczos_seconds = 0;   // the floating estimate theta
  double cholesky_seconds = 0;  // all attempts together
  int cholesky_attempts = 0;    // factorisations of s I - G tried (the last one succeeded, if any did)
};

struct CentreNormReport {
  std::string method;     // "dense", "super_block" or "deflated_super_block"
  int groups = 1;         // G (token groups); 1 for dense
  int group_tokens = 0;   // tokens per group
  bool frobenius_blocks = false;  // group blocks bounded by their Frobenius norm
  int exact_blocks = 0;   // super-blocks certified densely (the others: their Frobenius norm)
  double estimate = 0;    // floating sigma_1 of the midpoint (Lanczos), dense only; NOT a bound
  double seconds = 0;
  double assembly_seconds = 0;  // the enclosure of J(X0) (dense: all of it)
  GramStats gram;               // dense (and the super-blocks' dense certificates)
  int deflation_vectors = 0;    // deflated_super_block: k, and the three parts of its bound
  double deflation_basis_seconds = 0;
  double deflated_top = 0;      // >= ||Y + D|| (Y = fl(J V), E = J - Y V^T, D = E V)
  double deflated_rest = 0;     // >= ||E|| (super-blocks of the deflated J)
  double deflation_coupling = 0;  // >= ||(Y + D)^T E||
  double deflation_orthogonality = 0;  // >= ||V^T V - I||
  // The heads factored (above dense_limit, where they apply; +inf otherwise): the bound and
  // its three parts (values, keys, queries), and whether it is the one returned.
  double factored = kInf, factored_value = kInf, factored_keys = kInf, factored_queries = kInf;
  double factored_keys_and_queries = kInf;  // >= ||K + Q|| with their cross term
  double factored_crossed = kInf;  // >= ||J||: the values' mean, the keys and the queries with
                                   // their cross terms, plus the values' spread. The bound is
                                   // min(values + min(keys + queries, keys_and_queries), crossed).
  double factored_seconds = 0;
  bool factored_won = false;
  bool timed_out = false; // the deadline passed: the bound is +inf
  // The deflated pass's probe (its second block, at the machine's present speed) projected
  // the pass past the deadline, and so did its retries with fewer vectors: the plain
  // super-blocks ran instead (method "super_block").
  bool deflation_abandoned = false;
};

// Certified: ||J(x0)||_2 <= result (J of the layer as configured: attention alone, or the
// sublayer X + MHA(LN(X)) unless mha_only / exclude_residual). Throws std::invalid_argument
// for invalid options or a centre whose width is not D.
UpperBound CentreJacobianNormUpperBound(const AttentionLayer& layer, const Eigen::MatrixXd& x0,
                                        const CentreNormOptions& opts = {}, CentreNormReport* report = nullptr);

// The deflated super-block bound (docs/engines.md, "Deflation") with the caller's V and Y
// (both (N D) x k, row-major token flattening): certified for ANY V and Y (they only decide
// how tight it is; the route above takes V from Lanczos on J^T J and Y = fl(J V)). Token
// groups as for the super-blocks (block_tokens / block_limit); the deadline gives +inf.
UpperBound DeflatedCentreNormUpperBound(const AttentionLayer& layer, const Eigen::MatrixXd& x0,
                                        const Eigen::MatrixXd& v, const Eigen::MatrixXd& y,
                                        const CentreNormOptions& opts = {}, CentreNormReport* report = nullptr);

// The post-LN sublayer's Jacobian at a point, ||blockdiag(L_i) (I + J_MHA(x0))||_2, by the
// same deflated super-blocks: `mha` is the layer without its post-LN, left[i] encloses the
// post-LN's J_LN at token i's Y0 (D x D). V and Y as above (any serve; tight when they come
// from J_f itself: DeflationBasisOf on the full layer). *mha_frobenius >= ||J_MHA(x0)||_F,
// from the same pass (+inf when the deadline cut it).
UpperBound DeflatedPostLnCentreNormUpperBound(const AttentionLayer& mha, const Eigen::MatrixXd& x0,
                                              const std::vector<IntervalMatrix>& left, const Eigen::MatrixXd& v,
                                              const Eigen::MatrixXd& y, const CentreNormOptions& opts,
                                              CentreNormReport* report, UpperBound* mha_frobenius);

// k Lanczos vectors V of J^T J (floating point, reorthogonalised twice, a fixed start) and
// Y = fl(J V), J the Jacobian of `layer` at x0 as the evaluator (or, with a post-LN, the
// model's own JVP/VJP) computes it. Fewer columns when the deadline (or a stop request)
// cut the Lanczos run, or when `resize(steps, seconds)` (asked every 16 steps) returned
// fewer than asked.
struct DeflationBasis {
  Eigen::MatrixXd v, y;  // (N D) x k each
};
DeflationBasis DeflationBasisOf(const AttentionLayer& layer, const Eigen::MatrixXd& x0, int k, int threads,
                                std::chrono::steady_clock::time_point deadline,
                                const std::function<int(int steps, double seconds)>& resize = nullptr,
                                const std::atomic<bool>* stop = nullptr);
// The deadline for a deflation basis inside a window ending at `deadline`: half of the time
// left, and at most cap_seconds, so that a basis cut short still leaves the blocks (or the
// plain super-blocks) their time (max() stays max()).
std::chrono::steady_clock::time_point BasisDeadline(std::chrono::steady_clock::time_point deadline, double cap_seconds);

// How many deflation vectors fit before opts.deadline (docs/engines.md, "Deflation"), with
// `extra_seconds` of other work in the same window: opts.deflation_vectors (at most N D)
// without a deadline; 0 when fewer than min(32, asked) fit. `slowdown` (>= 1): this
// machine's pace against the time models'.
int DeflationVectorsThatFit(const AttentionLayer& layer, int tokens, const CentreNormOptions& opts, double extra_seconds,
                            double slowdown = 1.0);

// The enclosure of all of J(x0) ((N D) x (N D), row-major token flattening i*D + a), as the
// engine assembles it: for tests and small sizes.
IntervalMatrix CentreJacobianEnclosure(const AttentionLayer& layer, const Eigen::MatrixXd& x0,
                                       const CentreNormOptions& opts = {});

// Storage for the dense certificate: the scaled matrix, its Gram matrix and the Cholesky
// factor. Blocks of one size certified one after another through the same workspace reuse
// it (no fresh pages per block); without one, each call allocates its own.
struct GramWorkspace {
  Eigen::MatrixXd scaled, gram, factor;
  Eigen::MatrixXf single, gram_single;  // GramPrecision::kSingle
};

// The precision of the dense certificate's Gram matrix (the Cholesky factor is always in
// double). kDouble: within about 1e-13 relative of sigma_1. kSingle: the Gram matrix of
// fl32(m) in float, about twice as fast; its rounding is bounded by gamma_k(2^-24)
// ||m||_F^2, about 2e-4 ||m||_F^2 at k = 3072. For the super-blocks' blocks, whose block
// structure loses far more than that.
enum class GramPrecision { kDouble, kSingle };

// Certified ||a||_2 over the enclosure, with the fast dense certificate described above.
// +inf once `deadline` has passed or `stop` points to true (checked between Gram tiles,
// Cholesky attempts and Cholesky tiles; a stop before the call runs no Gram and no Cholesky).
UpperBound NormL2UpperGram(const IntervalMatrix& a, int threads = 0, double* estimate = nullptr,
                           std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max(),
                           GramStats* stats = nullptr, GramWorkspace* workspace = nullptr,
                           GramPrecision precision = GramPrecision::kDouble, const std::atomic<bool>* stop = nullptr);
// The same for a point matrix (no radius to carry).
UpperBound NormL2UpperGram(const Eigen::MatrixXd& m, int threads = 0, double* estimate = nullptr,
                           std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max(),
                           GramStats* stats = nullptr, GramWorkspace* workspace = nullptr,
                           GramPrecision precision = GramPrecision::kDouble, const std::atomic<bool>* stop = nullptr);

// ||J(x0)||_inf (the largest absolute row sum), certified from both sides from the same
// enclosure, streamed in token tiles of block_limit rows (never all of J in memory):
// lower = max_r sum_c max(0, |mid_rc| - rad_rc) <= ||J(x0)||_inf <= max_r sum_c (|mid_rc| + rad_rc)
// = upper, with the floating sums' rounding bounded (Higham: n nonnegative terms within
// gamma_n relative) and T eta for underflow. `row` is the row of the largest lower sum
// (row-major flattening i*D + a), the one a witness should take. Cost: the assembly alone
// (no Gram, no Cholesky), checked against the deadline between tiles.
struct CentreInfNormBounds {
  UpperBound upper{kInf};
  LowerBound lower{0.0};
  int row = -1;
  double seconds = 0;
  bool timed_out = false;  // the deadline passed: upper = +inf, lower = 0, row = -1
};
CentreInfNormBounds CentreJacobianInfNormBounds(const AttentionLayer& layer, const Eigen::MatrixXd& x0,
                                                const CentreNormOptions& opts = {});
// Its predicted seconds on an idle 2-core machine (the assembly).
double CentreInfNormSecondsEstimate(const AttentionLayer& layer, int tokens);

// The model above, in seconds, for a layer of N tokens under these options.
double CentreNormSecondsEstimate(const AttentionLayer& layer, int tokens, const CentreNormOptions& opts = {});
// The factored heads' predicted seconds (2 cores, idle).
double FactoredHeadsSecondsEstimate(const AttentionLayer& layer, int tokens);
// Whether the factored heads bound the operator these options describe.
bool FactoredHeadsApply(const AttentionLayer& layer, const CentreNormOptions& o);
// The least time that gives a bound: the dense model, or for super-blocks the assembly
// alone (each block's dense certificate is taken only when it fits the deadline).
double CentreNormMinimumSecondsEstimate(const AttentionLayer& layer, int tokens, const CentreNormOptions& opts = {});

// sup over a set of ||J(X)||_2 <= ||J(X0)||_2 + sup ||J(X) - J(X0)||_2: the centre bound above
// plus a variation bound (e.g. the `delta` of CentredUpperBound in certify/jacobian_bounds.cc).
inline UpperBound CentredExactUpperBound(UpperBound centre_norm, UpperBound variation) {
  return centre_norm + variation;
}

}  // namespace lipcert
