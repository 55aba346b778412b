// Per-head factor bounds over a cover of the MHA input (docs/engines.md, "Factor bounds
// over a cover"): the geometry of one head at the cover's centre, its logit box and
// softmax ranges (tightened by the tangent plane), and upper bounds on the factors of the
// Jacobian's blocks
//
//     J_ij = sum_h  P_ij W_h  +  P_ij a_ij g_ij^T  +  delta_ij E_i,     E_i = sum_k P_ik a_ik b_ik^T
//
// with u_j = Wo_h v_j, a_ij = u_j - ubar_i, W_h = Wo_h M_h (M_h = Wv_h for dot, Wv_h A_h for l2),
// dot: g_ij = Wk_h^T q_i / sqrt(dk),            b_ik = Wq_h^T (k_k - kbar_i) / sqrt(dk)
// l2:  g_ij = 2 Wq_h^T (q_i - q_j) / sqrt(dk),  b_ik = 2 Wq_h^T (q_k - qbar_i) / sqrt(dk).
//
// Norms: p is the engine's norm on inputs and outputs, q its dual (2 -> 2, inf -> 1), so
// that ||a g^T||_p = ||a||_p ||g||_q. Every bound is an upper (or, "_lo", lower) bound,
// rounded outward.
#pragma once

#include <Eigen/Dense>

#include <chrono>
#include <functional>
#include <vector>

#include "certify/input_set.h"
#include "certify/token_cover.h"
#include "interval/interval_matrix.h"
#include "interval/vector_norms.h"
#include "models/attention_layer.h"

namespace lipcert {

// The engine's norm p and its dual q as vector norms.
inline VectorNorm PrimalNorm(NormKind p) { return p == NormKind::kL2 ? VectorNorm::kTwo : VectorNorm::kInf; }
inline VectorNorm DualNorm(NormKind p) { return p == NormKind::kL2 ? VectorNorm::kTwo : VectorNorm::kOne; }

// Upper bounds, by max row and column sums, on ||rad||_2 and on ||(|mid|)||_2 of an
// enclosure [mid +- rad] of a symmetric matrix: what a weighted sum of such enclosures can
// add to the largest eigenvalue of its floating midpoint (OwnRowUp).
struct GramSpread {
  double rad = kInf, abs_mid = kInf;
};
GramSpread GramSpreadOf(const IntervalMatrix& g);

// Geometry of one head at the cover's centre (the MHA input), enclosed rigorously.
struct HeadGeometry {
  bool dot = true;
  IntervalMatrix q, k;      // (N, dk) centre queries / keys (k == q for l2)
  IntervalMatrix u;         // (N, D) output-space values Wo_h v_j
  IntervalMatrix g;         // dot: rows Wk^T q_i / sqrt(dk); l2: rows Wq^T q_i / sqrt(dk)
  IntervalMatrix b;         // dot: rows Wq^T k_j / sqrt(dk); l2: same as g
  IntervalMatrix w;         // (D, D) W_h = Wo_h M_h
  IntervalMatrix logits;    // dot: centre logits (N, N)
  Eigen::MatrixXd dq_lo, dq_hi;  // l2: Euclidean distances of centre query rows
  Eigen::MatrixXd du;       // ||u_j - u_k||_p, centre
  Eigen::MatrixXd dg;       // l2: ||g_j - g_k||_q, centre
  Eigen::MatrixXd db;       // dot: ||b_j - b_k||_q, centre (l2: == dg)
  Eigen::VectorXd g_norm;   // dot: ||g_i||_q, centre
  Eigen::VectorXd b_shifted_l2;  // dot: ||b_j - c||_2 for the mean c of the centre's b rows
  double c_u = 0;      // ||W_h||_{2->p}: how far u_j moves per unit of ||z_j||
  double c_g = 0;      // dot: ||Wk^T Wq||_{2->q}/sqrt(dk); l2: ||Wq^T Wq||_{2->q}/sqrt(dk)
  double c_b = 0;      // dot: ||Wq^T Wk||_{2->q}/sqrt(dk); l2: == c_g
  double c_logit = 0;  // dot: ||Wq^T Wk||_2/sqrt(dk); l2: ||Wq||_2
  double w_norm = 0;   // ||W_h||_p
  Interval inv_sqrt_dk;  // 1/sqrt(dk)
  VectorNorm u_norm = VectorNorm::kTwo;  // the norm of du (p) and of db, dg (its dual)
  VectorNorm b_norm = VectorNorm::kTwo;
  // The centre's softmax weights w (midpoints of its certified ranges, 0 where masked by
  // `causal`) and >= ||sum_k w_ik (m_j - m_k)|| for the midpoints m of u (a_anchor) and of
  // b (b_anchor): the anchors of the factor bounds a_sup and b_sup.
  bool causal = false;
  Eigen::MatrixXd anchor_w, a_anchor, b_anchor;
  // Dot heads, norm 2, for the moving token's own row as one form (OwnRowFormUp): for every
  // unit U, ||W_h U||^2 <= (||A U|| + value_err)^2 + value_iso with A = R Wv_h (dv x D, R a
  // factor of Wo_h^T Wo_h) and ||A||_F <= value_norm; enclosures of A^T A, Wq_h^T Wq_h and
  // Wk_h^T Wk_h, and upper bounds on ||Wq_h||, ||Wk_h||.
  IntervalMatrix value_gram, wq_gram, wk_gram;
  GramSpread value_spread, wq_spread, wk_spread;  // of the three Grams (GramSpreadOf)
  double value_norm = kInf, value_err = kInf, value_iso = kInf, wq_norm = kInf, wk_norm = kInf;
  // Dot heads, norm 2, for ValueQueryCovarianceUp: the floating Grams (N x N) of the centred
  // midpoints U~ = fl(m_u - c_u) and B~ = fl(m_b - c_b) (c: the columns' means), and upper
  // bounds on their rows' norms (plus 1e-150, which covers the Grams' underflow), and upper
  // bounds on the norms of the enclosures' radii, row by row.
  Eigen::MatrixXd u_gram, b_gram;
  Eigen::VectorXd u_row_norm, b_row_norm, u_rad_norm, b_rad_norm;
};

// Head h's geometry at the centre zc (N, D) of the MHA input, for the engine norm p.
HeadGeometry HeadGeometryAt(const AttentionLayer& layer, int h, const Eigen::MatrixXd& zc, NormKind p);

// G (head h's HeadGeometryAt at zc) with the output projection `wo` (D x H dv) in place of the
// layer's: the value side (W_h, the values u, c_u, w_norm, their distances and anchors)
// recomputed, the queries, keys and logit side kept. Bit for bit HeadGeometryAt of the layer
// with Wo = wo. Not for dot heads in norm 2, whose own-row Grams depend on Wo too (throws).
HeadGeometry WithOutputProjection(const HeadGeometry& G, const AttentionLayer& layer, int h, const Eigen::MatrixXd& zc,
                                  const Eigen::MatrixXd& wo, NormKind p);

// Factor bounds over a cover of the MHA input: centre = the geometry's centre, token j
// within rho_j of it (and the whole input within `joint` in Frobenius norm).
struct FactorBounds {
  Eigen::MatrixXd p_lo, p_hi;  // softmax range (0 where masked)
  Eigen::MatrixXd a_sup;       // sup ||a_ij||_p
  Eigen::MatrixXd pa;          // sup P_ij ||a_ij||_p (<= p_hi a_sup)
  Eigen::MatrixXd g_sup;       // sup ||g_ij||_q
  Eigen::MatrixXd b_sup;       // sup ||b_ij||_q
};

// Logit enclosures [lo, hi] of head G when token j moves by at most rho_j (rho = 0: the
// centre's logits). Dot rows are shifted by c.dz_i, which leaves each softmax row unchanged.
void LogitBox(const HeadGeometry& G, const Eigen::VectorXd& rho, Eigen::MatrixXd* lo, Eigen::MatrixXd* hi);

// Row-wise softmax ranges of a logit box (0 where masked).
void SoftmaxRows(const Eigen::MatrixXd& lo, const Eigen::MatrixXd& hi, bool causal, Eigen::MatrixXd* p_lo,
                 Eigen::MatrixXd* p_hi);

// Intersects F's softmax ranges with the tangent-plane ranges (docs/engines.md,
// "Tangent-plane probability ranges"); lo, hi are the logit box of rho.
void TightenByTangent(const HeadGeometry& G, const Eigen::VectorXd& rho, double joint, bool causal,
                      const Eigen::MatrixXd& lo, const Eigen::MatrixXd& hi, FactorBounds* F);

// All factor bounds of head G over the cover (rho, joint); rho = 0 gives the centre's.
FactorBounds HeadFactorBounds(const HeadGeometry& G, const Eigen::VectorXd& rho, double joint, bool causal);

// F (HeadFactorBounds of a geometry with the same queries and keys) with its value side
// (a_sup, pa) from the geometry `values`: the same head with another Wo (the heads apart,
// Wo = I), whose softmax ranges and logit factors are F's.
FactorBounds WithValuesOf(const HeadGeometry& values, const FactorBounds& F, const Eigen::VectorXd& rho, bool causal);

// Norm 2, row i: upper bounds on sum_k P_ik ||a_ik||^2 and sum_k P_ik ||b_ik||^2 over the
// cover (the row's spreads), so that
//   ||E_i|| <= sum_k P_ik ||a_ik|| ||b_ik|| <= (a2 b2)^1/2  and
//   sum_j P_ij ||a_ij|| ||g_ij|| <= (a2 sum_j P_ij ||g_ij||^2)^1/2   (Cauchy-Schwarz).
struct RowSpread {
  double a2 = kInf, b2 = kInf;
};
RowSpread RowSpreadUp(const HeadGeometry& G, const FactorBounds& F, const Eigen::VectorXd& rho, int i, int len);

// Norm 2: the second derivative of head G's output over the cover (docs/engines.md,
// "Second-order variation"). For every point of the cover and every direction U of the MHA
// input with ||U||_F = 1 and t_j = ||U_j||^2 (t on the simplex),
//   ||d^2/ds^2 out_h(Z + s U)||_2 <= ||L t||_2 + cross,   L >= 0 (N x N),
// row i of L from the terms of d^2 out_i = T1 (P'' through the logits' motion squared) + T2
// (P' times the values' motion) + T3 (P'' through the logits' second derivative), bounded by
// the factor bounds F (spreads, ||a_ij||, ||g_ij||, P ranges). Dot heads put T3 in `cross`,
// l2 heads in L. ||L t|| is convex in t, so its sup over the simplex is the largest column
// norm of L.
// Each row of L has several valid forms (`forms[i]`, one per row of the matrix, entries
// rounded up); any choice of one form per row bounds the head.
struct SecondOrderHead {
  std::vector<Eigen::MatrixXd> forms;  // forms[i]: (forms x N), zero beyond the row's keys
  double cross = kInf;
};
SecondOrderHead SecondOrderHeadUp(const HeadGeometry& G, const FactorBounds& F, const Eigen::VectorXd& rho,
                                  bool causal);

// >= max_j sum_h ||column j of L_h||_2 + sum_h cross_h, for one form per row of every head:
// the forms are picked to make the largest column small (smallest sum of squares first, then
// a few sweeps of coordinate descent on sum_j (column sum)^16), and the bound is computed
// with upward rounding from the picked forms.
double SecondOrderColumnsUp(const std::vector<SecondOrderHead>& heads);

// Norm 2: the same second derivative with the products of two tokens' motions kept apart
// from the squares (docs/engines.md, "Pair terms apart"). With
// x_k = ||U_k|| (x a unit vector, t = x^2 on the simplex),
//   ||d^2 out_i|| <= sum_k lin(i, k) t_k + x^T O_i x,   O_i >= 0 with a zero diagonal,
// lin holding what one token moving alone gives (its key, and for k = i its query), O_i the
// products of the query's and the keys' motions and of two keys' motions (one head's share).
// The heads add up row by row (||d^2 out_i|| <= sum_h ||d^2 out_i^h||), and the pairs' norm
// is bounded over unit x by sqrt(lambda_max) of the Gram of the vec O_i (SecondOrderSplitColumnsUp).
struct SecondOrderSplitHead {
  Eigen::MatrixXd lin;    // (N x N), entries rounded up, zero beyond each row's keys
  Eigen::MatrixXd pairs;  // (N x N^2): row i is vec O_i (column-major), entries rounded up
};
SecondOrderSplitHead SecondOrderSplitHeadUp(const HeadGeometry& G, const FactorBounds& F, const Eigen::VectorXd& rho,
                                            bool causal);

// Norm 2, dot heads, row i: >= sup over the cover of ||sum_k P_ik a_ik b_ik^T||_2, the covariance
// Cov_P(u, b) of the values and the query gradients under the row's weights (docs/engines.md,
// "The values' and queries' covariance"); +inf for other heads. Where the products'
// magnitudes sum_k P_ik ||a_ik|| ||b_ik|| take every key at its own direction, this keeps their
// cancellation: at the centre's weights it is the Frobenius norm of U~^T (W - w w^T / s) B~.
double ValueQueryCovarianceUp(const HeadGeometry& G, const FactorBounds& F, const Eigen::VectorXd& rho, int i,
                              int len);

// Norm 2, dot heads: row i's second derivative when token i moves alone by U (unit), as a
// quadratic form over the cover (docs/engines.md, "The moving token's own row"): its query's
// and its own key's logit motion r_k . U (T1, T2), its value W_h U (T2) and its logit's
// curvature (Wq U).(Wk U) (T3):
//   ||d^2 out_i^h[U, U]|| <= (||rows U|| + err)^2 + value_weight ||A U||^2 + q_weight ||Wq U||^2
//                            + k_weight ||Wk U||^2 + iso,
// rows floating ((2 len + 1) x D, the directions anchored at the centre's weights), A, Wq, Wk
// as in the geometry (value_gram, wq_gram, wk_gram). Other heads give iso = +inf (no form). Summed over
// heads before the largest eigenvalue (OwnRowUp), this bounds lin(i, i) of the heads summed.
struct OwnRowForm {
  Eigen::MatrixXd rows;
  double err = 0, iso = 0;
  double value_weight = 0, q_weight = 0, k_weight = 0;
};
OwnRowForm OwnRowFormUp(const HeadGeometry& G, const FactorBounds& F, const Eigen::VectorXd& rho, bool causal, int i);
// >= sup over unit U of the sum over heads of token j's own row: lambda_max (LambdaMaxUpper)
// of the stacked rows' Gram plus the heads' weighted fixed Grams, plus the isotropic terms;
// +inf when a head has no form.
double OwnRowUp(const std::vector<HeadGeometry>& geo, const std::vector<FactorBounds>& factors,
                const Eigen::VectorXd& rho, bool causal, int j, int threads);

// >= max_j ||column j of sum_h lin_h||_2 + sqrt(lambda_max(P P^T)), P = sum_h pairs_h.
// With own_row (own_row(j, t) >= the moving token's own row over all heads, computed on t
// threads, e.g. by OwnRowUp), the largest columns are refined with it until refine_until,
// `threads` columns at a time (own_row is then called concurrently). Without a deadline
// the bound does not depend on `threads`.
// stacked: the heads' rows are stacked (N H rows, head h's row i at h N + i) instead of
// summed: the bound on ||d^2 out|| where the heads write to orthogonal coordinates (the
// layer with Wo = I, docs/engines.md, "The heads in their own coordinates"); own_row then
// replaces all of token j's rows of column j.
double SecondOrderSplitColumnsUp(const std::vector<SecondOrderSplitHead>& heads,
                                 const std::function<double(int, int)>& own_row = nullptr,
                                 std::chrono::steady_clock::time_point refine_until =
                                     std::chrono::steady_clock::time_point::max(),
                                 int threads = 1, bool stacked = false);

// The column term of SecondOrderSplitColumnsUp alone, unrefined (max_j ||column j||), summed
// or stacked: what decides between the two (the pairs follow it).
double SecondOrderSplitColumnTermUp(const std::vector<SecondOrderSplitHead>& heads, bool stacked);

// >= ||P||_p for every attention matrix P below p_hi (rows on the simplex).
double ProbabilityNormUp(const Eigen::MatrixXd& p_hi, NormKind p);

// Certified enclosure of head h's attention probabilities P_ij(X) over the cover, as both
// engines use them (exactly 0 where masked): lower and upper ends of every entry.
IntervalMatrix AttentionProbabilityEnclosure(const AttentionLayer& layer, const TokenCover& cover, int head);

}  // namespace lipcert
