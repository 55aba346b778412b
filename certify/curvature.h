// Certified curvature of multi-head attention at a point (docs/engines.md, "Certified
// curvature at the centre"): an upper bound C(X0) on
//
//     sup_{||U||_F = 1} || D^2 f(X0)[U, U] ||_F,
//
// the quantity that multiplies the radius in a Taylor-model bound on the Jacobian's motion,
// ||J(X) - J(X0)||_2 <= ||X - X0||_F * C + O(||X - X0||^2).
//
// The certificate is the (output; input x input) flattening of the 3-tensor D^2 f(X0):
// with F_o the Hessian of output coordinate o (an (N D) x (N D) matrix),
//     sup_U ||D^2 f[U, U]|| = sup_{||w|| = 1} ||sum_o w_o F_o||_2 <= sup_w ||sum_o w_o F_o||_F
//                           = sqrt(lambda_max(G)),   G_{o o'} = <F_o, F_o'>_F.
// G is formed exactly (no matrix of size (N D)^2 x (N D) is ever built): each F_o is a sum,
// over heads, of products of N x N softmax matrices and a few D-vectors per head and row
// (the keys' and queries' logit gradients, the value rows), so every entry of G is a small
// bilinear form in the centred values; the arithmetic runs in midpoint-radius scalars with
// outward-rounded radii, the softmax from certified ranges, and lambda_max(G) is certified by
// a Cholesky factorisation (LambdaMaxUpper). Measured within 1.01-1.91x of the tensor power
// method's estimate on the real checkpoints (docs/engines.md).
//
// Scope: dot-product attention alone (biases and causal mask allowed), norm 2. L2 attention
// and the LayerNorm sublayers are refused with a message (upper = +inf).
#pragma once

#include <Eigen/Dense>

#include <string>

#include "certify/engine_bound.h"
#include "certify/input_set.h"
#include "certify/token_cover.h"
#include "interval/rounding.h"
#include "models/attention_layer.h"
#include "models/forward.h"

namespace lipcert {

struct CurvatureOptions {
  int threads = 1;            // worker threads for the Gram's pair blocks (>= 1)
  long max_gram_size = 6144;  // refuse when N * D exceeds this (G is (N D)^2 doubles, twice)
  double time_limit_seconds = 0;  // > 0: give up (upper = +inf) once this much time has passed
  // Returns true when valid; otherwise false with *message naming the bad field.
  bool IsValid(std::string* message) const;
};

struct CurvatureBound {
  UpperBound upper{kInf};  // >= sup_{||U||_F = 1} ||D^2 f(X0)[U, U]||_F (+inf when refused)
  double estimate = 0;     // floating sqrt(lambda_max(G)) (Lanczos); not a bound
  double seconds = 0;
  std::string message;     // why the bound is +inf ("" when it is finite)
  // Where a cover's enclosures widen (diagnostics, not bounds): the largest and the mean
  // radius of the logits s q_i.k_j over heads and unmasked entries, the largest and the mean
  // width hi - lo of the softmax ranges, and the norm bound of G's radius matrix next to the
  // midpoint's floating lambda_max (estimate^2).
  double logit_radius_max = 0, logit_radius_mean = 0;
  double softmax_width_max = 0, softmax_width_mean = 0;
  double gram_radius_norm = 0;
};

// The certified curvature of MHA alone at x0 (N x D). Refuses (upper = +inf, message set)
// L2 attention, a pre-LN or post-LN sublayer, N * D above max_gram_size, invalid options.
CurvatureBound CentreCurvatureUpperBound(const AttentionLayer& layer, const Eigen::MatrixXd& x0,
                                         const CurvatureOptions& opts = {});

// The certified sup of the curvature over a cover: an upper bound on
//     sup_{X in cover} sup_{||U||_F = 1} ||D^2 f(X)[U, U]||_F,
// by the same Gram computation as at the centre with Q, K, V enclosed over the per-token
// balls ||x_i - center_i|| <= radius(i) (each coordinate widened by radius(i) ||w_c||_2), so
// that the logits, the softmax ranges (SoftmaxRowsRange) and every entry of G are enclosures
// over the whole cover; lambda_max of the interval G is certified (LambdaMaxUpper). A cover of
// zero radii gives CentreCurvatureUpperBound's value bit for bit (one code path). Refusals as
// CentreCurvatureUpperBound's, and radii that are not N finite values >= 0. The enclosures
// widen fast (docs/engines.md, "The curvature over a cover"): on the zoo layers 1.6-6x C(X0)
// at 0.001% of ||X0||_F, 85-630x at 0.1%.
CurvatureBound CoverCurvatureUpperBound(const AttentionLayer& layer, const TokenCover& cover,
                                        const CurvatureOptions& opts = {});
CurvatureBound CoverCurvatureUpperBound(const AttentionLayer& layer, const InputSet& set,
                                        const CurvatureOptions& opts = {});

// The variation bound of the Jacobian over a convex set S that contains its centre X0:
//     sup_S ||J(X)||_2 <= ||J(X0)||_2 + R sup_cover C(X),   R >= ||X - X0||_F on S,
// from J(X) - J(X0) = int_0^1 D^2 f(X0 + s (X - X0))[X - X0, .] ds (the segment stays in S,
// hence in the cover) and ||D^2 f(Y)[H, .]||_2 <= ||H||_F C(Y) (Banach: the symmetric bilinear
// map's norm is taken on the diagonal). terms: "centre" = centre_norm (the caller's certified
// ||J(X0)||_2, e.g. CentreJacobianNormUpperBound) and "curvature x radius" =
// JointRadiusUp(cover) x cover_curvature.upper; upper is their sum, rounded up; note carries
// the curvature's refusal message.
EngineBound CurvatureVariationBound(UpperBound centre_norm, const TokenCover& cover,
                                    const CurvatureBound& cover_curvature);

// Exact second directional derivative d^2/dt^2 f(X0 + t U) at t = 0 of MHA alone (dot heads,
// no LayerNorm), in the scalar T (double, or mpfr::mpreal in tests), at the state s of X0:
// per head, with A = U Wq^T, B = U Wk^T, C = U Wv^T, the logits move by
// ds = (A K^T + Q B^T)/sqrt(dk) and curve by e = 2 A B^T/sqrt(dk); row i's probabilities by
// dP_ij = P_ij d_ij and d2P_ij = P_ij (d_ij^2 - sum_k P_ik d_ik^2 + e_ij - sum_k P_ik e_ik), with
// d_ij = ds_ij - sum_k P_ik ds_ik; and the head's output by d2P V + 2 dP C.
template <class T>
Mat<T> SecondDirectional(const AttentionLayer& L, const LayerState<T>& s, const Mat<T>& u) {
  using std::sqrt;
  const int n = int(u.rows());
  const T scale = T(1) / sqrt(T(L.head_dim_qk));
  Mat<T> out = Mat<T>::Zero(n, L.d_model);
  for (int h = 0; h < L.heads; ++h) {
    const auto& hs = s.heads[h];
    const Mat<T> a = u * detail::Cast<T>(L.wq_head(h)).transpose();
    const Mat<T> b = u * detail::Cast<T>(L.wk_head(h)).transpose();
    const Mat<T> c = u * detail::Cast<T>(L.wv_head(h)).transpose();
    const Mat<T> ds = (a * hs.k.transpose() + hs.q * b.transpose()) * scale;
    const Mat<T> e = (a * b.transpose()) * (T(2) * scale);
    Mat<T> dp = Mat<T>::Zero(n, n), d2p = Mat<T>::Zero(n, n);
    for (int i = 0; i < n; ++i) {
      T mean = T(0), emean = T(0);
      for (int j = 0; j < n; ++j) {
        mean += hs.p(i, j) * ds(i, j);
        emean += hs.p(i, j) * e(i, j);
      }
      T var = T(0);
      for (int j = 0; j < n; ++j) var += hs.p(i, j) * (ds(i, j) - mean) * (ds(i, j) - mean);
      for (int j = 0; j < n; ++j) {
        const T d = ds(i, j) - mean;
        dp(i, j) = hs.p(i, j) * d;
        d2p(i, j) = hs.p(i, j) * (d * d - var + e(i, j) - emean);
      }
    }
    out += (d2p * hs.v + T(2) * dp * c) * detail::Cast<T>(L.wo_head(h)).transpose();
  }
  return out;
}

// sup over the cover ||X - X0||_F <= radius of sup_{||U||_F = 1} ||d^3/dt^3 f(X + t U)||_F, by the
// product rule on cumulants (docs/engines.md, "Certified curvature at the centre"): crude
// (every token moves by the whole radius, every row at its worst), meant to be multiplied
// by radius^2 / 2. MHA alone, dot heads; +inf otherwise.
UpperBound ThirdDerivativeUpperBound(const AttentionLayer& layer, const Eigen::MatrixXd& x0, double radius);

// The Taylor model of the Jacobian over the Frobenius ball of the given radius about x0:
//     sup ||J(X)||_2 <= centre + curvature + remainder,
//     centre = ||J(X0)||_2 (the caller's certified bound, e.g. CentreJacobianNormUpperBound),
//     curvature = radius * C(X0)                       (CentreCurvatureUpperBound),
//     remainder = radius^2 / 2 * sup_ball ||D^3 f||      (ThirdDerivativeUpperBound).
// From J(X) - J(X0) = int_0^1 D^2 f(X0 + s (X - X0))[X - X0, .] ds and
// D^2 f(Y) = D^2 f(X0) + int D^3 f[Y - X0, ., .], with the norms of the symmetric multilinear
// maps taken on the diagonal (Banach).
struct TaylorJacobianBound {
  UpperBound centre{kInf};
  UpperBound curvature{kInf};
  UpperBound remainder{kInf};
  UpperBound total{kInf};
  std::string message;  // why +inf (from the curvature), "" otherwise
};
TaylorJacobianBound TaylorJacobianUpperBound(const AttentionLayer& layer, const Eigen::MatrixXd& x0, double radius,
                                             UpperBound centre_norm, const CurvatureBound& curvature);

// A floating lower estimate of sup_{||U||_F = 1} ||D^2 f(X0)[U, U]||_F by the symmetric tensor
// power method (w <- D^2 f[U, U] normalised, U <- H_w U normalised, H_w = Hessian of <w, f>,
// applied as a central difference of vector-Jacobian products), from `starts` random starts
// of `iterations` steps each. *argmax (optional) receives the best unit U. Not a bound.
double CurvatureLowerEstimate(const AttentionLayer& layer, const Eigen::MatrixXd& x0, int starts, int iterations,
                              unsigned seed, Eigen::MatrixXd* argmax = nullptr);

// A floating lower estimate of sup_{||U||_F = 1} ||D^3 f(X0)[U, U, U]||_F by the symmetric power
// method on the 4-tensor (w <- D^3 f[U, U, U] normalised, U <- D^3 <w, f>[U, U, .] normalised),
// both by central differences (of SecondDirectional and of J^T w, step `step` ||X0||_F / sqrt(N D)
// with step = 1e-3 by default); starts as CurvatureLowerEstimate's plus one from `start` when it
// is non-empty (e.g. the curvature's maximiser). Not a bound.
double ThirdDerivativeLowerEstimate(const AttentionLayer& layer, const Eigen::MatrixXd& x0, int starts,
                                   int iterations, unsigned seed, const Eigen::MatrixXd& start = Eigen::MatrixXd(),
                                   Eigen::MatrixXd* argmax = nullptr);

}  // namespace lipcert
