// The post-LN sublayer f(X) = LN(Y(X)), Y = X + M(X), M = MHA, over a set: its own centre
// norm plus its own variation (docs/engines.md, "Post-LN variation"). With D(Y) the
// block-diagonal LayerNorm Jacobian (blocks D_i(y_i), D x D) and Yc the exact centre of the
// enclosure of Y0 = X0 + M(X0),
//
//   J_f(X) = D(Yc)(I + J_M(X0)) + D(Yc)(J_M(X) - J_M(X0)) + (D(Y) - D(Yc))(I + J_M(X)),
//   sup_S ||J_f||_p <= ||D(Yc)(I + J_M(X0))||_p + min(max_i ||D_i(yc_i)||_p V_M, max_i ||D_i(yc_i) Wo||_p V_H)
//                      + max_i sup_{y_i in B(yc_i, rho_i)} ||D_i(y_i) - D_i(yc_i)||_p (1 + U_M),
//
// and in norm 2 the last term token by token where the inputs carry it (ln_row_weights below):
// max_i delta_i / w_i (||diag(w)(I + J_M(X0))|| + sup_S ||diag(w)(J_M(X) - J_M(X0))||).
// V_M >= sup_S ||J_M(X) - J_M(X0)||_p (MHA alone's certified variation), V_H the same for the
// heads before Wo (M = Wo . H: the layer with Wo = I, where H dv = D), so that the LayerNorm
// factor meets Wo before any norm is taken (it shrinks the directions Wo writes to most), and
// in norm 2 with each output token's rows weighted by ||D_i(yc_i) Wo|| / max_k ||D_k(yc_k) Wo||
// inside the second-order bound (the max then factored out),
// U_M >= sup_S ||J_M||_p
// (the smaller of MHA's certified bound and ||J_M(X0)||_p + V_M), and the per-token cover of Y
//   rho_i = r_i + R_joint * min(U2, ||J_{M,i}(X0)|| + V_{2,i}) + err_i,  U2 >= sup_S ||J_M||_2,
// V_{2,i} >= token i's own variation (V_2 for every token, or V^w / w_i from a row-weighted one),
// (mean value theorem on the segment X0 -> X inside S: ||M_i(X) - M_i(X0)|| <= ||M(X) - M(X0)||_F
// <= U2 ||X - X0||_F), err_i the enclosure's half-width of row i. Every number is rounded up.
#pragma once

#include <Eigen/Dense>
#include <chrono>
#include <string>
#include <vector>

#include "certify/certificate.h"
#include "certify/engine_bound.h"
#include "certify/input_set.h"
#include "certify/layer_norm_cover.h"
#include "certify/post_ln_centre_rows.h"
#include "certify/post_ln_y_cover.h"
#include "certify/token_cover.h"
#include "interval/elementary.h"
#include "interval/interval_matrix.h"
#include "interval/rounding.h"
#include "models/attention_layer.h"

namespace lipcert {

// What the variation needs, all certified over the same set S (X0 in S, S convex) and all in
// the norm p unless named _l2. Any may be +inf (the bound is then +inf or uses the others).
struct PostLnVariationInputs {
  NormKind norm = NormKind::kL2;
  // >= ||D(Yc)(I + J_M(X0))||_p, Yc the cover of Y's centre; +inf in norm 2: the bound takes
  // max_i ||D_i(yc_i)|| ||diag(w)(I + J_M(X0))|| (w_i = ||D_i|| / max_k ||D_k||) from MHA's row blocks.
  UpperBound centre{kInf};
  UpperBound mha_centre{kInf};      // >= ||J_M(X0)||_p
  UpperBound mha_variation{kInf};   // >= sup_S ||J_M(X) - J_M(X0)||_p
  UpperBound mha_upper{kInf};       // >= sup_S ||J_M(X)||_p
  UpperBound mha_l2_upper{kInf};    // >= sup_S ||J_M(X)||_2 (sizes the cover of Y whatever p is)
  UpperBound mha_l2_centre{kInf};   // >= ||J_M(X0)||_2 (with the next, a second bound on the one above)
  UpperBound mha_l2_variation{kInf};  // >= sup_S ||J_M(X) - J_M(X0)||_2
  // >= sup_S int_0^1 ||J_M(X_s) - J_M(X0)||_2 ds, X_s = X0 + s (X - X0) (the second order's
  // mean along the segment, CentredVariation::mean_variation): M_i(X) - M_i(X0) =
  // int_0^1 J_{M,i}(X_s) (X - X0) ds, so the cover of Y moves token i by at most
  // (||J_{M,i}(X0)||_2 + this) ||X - X0||_F. +inf: not known.
  UpperBound mha_l2_mean_variation{kInf};
  // Optional (empty: not known): row_centre_l2(i) >= ||J_{M,i}(X0)||_2, token i's row block
  // (D x ND); then ||M_i(X) - M_i(X0)|| <= (row_centre_l2(i) + V_2) ||X - X0||_F as well.
  Eigen::VectorXd mha_row_centre_l2;
  // Optional (empty: not known): row_variation_l2(i) >= sup_S ||J_{M,i}(X) - J_{M,i}(X0)||_2, token
  // i's own variation (each at most V_2); then the cover of Y moves token i by
  // (row_centre_l2(i) + row_variation_l2(i)) ||X - X0||_F.
  Eigen::VectorXd mha_row_variation_l2;
  // Optional (empty: not known): row_mean_variation_l2(i) >= sup_S int_0^1 ||J_{M,i}(X_s) - J_{M,i}(X0)||_2 ds,
  // token i's own mean along the segment (from the weighted mean, as the row above).
  Eigen::VectorXd mha_row_mean_variation_l2;
  // >= sup_S ||diag(w) (J_H(X) - J_H(X0))||_p, H the heads before Wo (MHA with Wo = I and no
  // output bias; only where Wo is D x D), w = heads_row_weights (output token i's rows times
  // w_i >= 0; empty: all 1). The term is then max_i ||D_i(yc_i) Wo||_p / w_i times it.
  // +inf: not known, the term uses V_M alone.
  UpperBound heads_variation{kInf};
  Eigen::VectorXd heads_row_weights;
  // Optional, inf norm (empty: not known): token by token, mha_row_centre_inf(i) >= ||J_{M,i}(X0)||_inf
  // and mha_row_variation_inf(i) >= sup_S ||J_{M,i}(X) - J_{M,i}(X0)||_inf (token i's D rows). The
  // inf norm is a largest row sum, so the MHA term is max_i ||D_i(yc_i)||_inf min(V_M, v_i) and the
  // LayerNorm term max_i delta_i (1 + min(U_M, c_i + min(V_M, v_i))).
  Eigen::VectorXd mha_row_centre_inf;
  Eigen::VectorXd mha_row_variation_inf;
  // Optional, inf norm (empty: not known): ln_mha_rows_inf(i) >= sup_S ||D_i(yc_i)(J_{M,i}(X) -
  // J_{M,i}(X0))||_inf (LayerNormMhaRowsInfUp in certify/post_ln_inf.h; +inf where not computed),
  // for the Y centre ln_mha_rows_y. Where the bound's own Y centre is that one, its MHA term takes
  // the smaller of it and ||D_i(yc_i)||_inf min(V_M, v_i), token by token.
  Eigen::VectorXd ln_mha_rows_inf;
  Eigen::MatrixXd ln_mha_rows_y;
  // Optional, norm 2 (empty weights: not known): the LayerNorm variation's term token by token.
  // With weights w_i in [0, 1] (output token i's D rows times w_i),
  //   ln_rows_centre >= ||diag(w) (I + J_M(X0))||_2,  ln_rows_variation >= sup_S ||diag(w) (J_M(X) - J_M(X0))||_2,
  // the term is also max_i delta_i / w_i x (ln_rows_centre + ln_rows_variation): for
  // blockdiag(Delta_i) with ||Delta_i|| <= c w_i, Delta_i^T Delta_i <= c^2 w_i^2 I, so
  // ||blockdiag(Delta_i) A|| <= c ||diag(w) A||. Weights that follow delta_i keep a token whose
  // LayerNorm moves most from multiplying the whole of I + J_M.
  Eigen::VectorXd ln_row_weights;
  UpperBound ln_rows_centre{kInf};
  UpperBound ln_rows_variation{kInf};
  // Optional, norm 2 (upper +inf: not known): rows_centre.upper >= ||D(Yc)(I + J_M(X0))||_2 from
  // the LayerNorm's rows (LayerNormRowSplitCentreUp, with its pieces for the note), certified at
  // the Y centre rows_centre_y. The bound takes it where `centre` is +inf and its own cover of Y
  // has that centre.
  LayerNormRowSplit rows_centre;
  Eigen::MatrixXd rows_centre_y;

  // "" when valid, else a message naming the field.
  std::string IsValid() const;
};

// The per-token cover of Y and the LayerNorm factors over it (for reports and tests).
struct PostLnVariationReport {
  TokenCover y_cover;               // centre Yc (exact), radii rho_i
  Eigen::VectorXd ln_centre;        // >= ||D_i(yc_i)||_p
  Eigen::VectorXd ln_wo;            // >= ||D_i(yc_i) Wo||_p (empty where heads_variation is +inf)
  Eigen::VectorXd ln_variation;     // >= sup over B(yc_i, rho_i) of ||D_i(y) - D_i(yc_i)||_p
  double mha_l2 = kInf;             // the U2 used for the cover
  double mha_variation = kInf;      // the V_M used
  double mha_upper = kInf;          // the U_M used
  double through_mha = kInf;        // max_i ||D_i(yc_i)|| V_M
  double through_heads = kInf;      // max_i ||D_i(yc_i) Wo|| V_H (+inf where V_H is)
  double ln_whole = kInf;           // max_i delta_i (1 + U_M)
  double ln_rows = kInf;            // max_i delta_i / w_i (ln_rows_centre + ln_rows_variation) (+inf: not known)
};

// PostLnYCover (the cover of Y) is in certify/post_ln_y_cover.h.

// >= ||J_{M,i}(X0)||_2 for every token i (the row blocks of MHA's Jacobian at x0, from the
// dense enclosure of the centre_norm assembly, each certified by the Gram certificate of its
// D x D Gram matrix). `layer` is MHA alone. Empty when N*D > dense_limit or the deadline passed.
Eigen::VectorXd MhaRowBlockNormsUp(const AttentionLayer& mha, const Eigen::MatrixXd& x0, long dense_limit, int threads,
                                   std::chrono::steady_clock::time_point deadline =
                                       std::chrono::steady_clock::time_point::max());

// The bound above as an engine (name "post_ln_variation"), with terms naming the centre norm,
// the MHA variation and the LayerNorm variation. Throws std::invalid_argument when the layer
// has no post-LN or has a pre-LN too, or when `in` is invalid.
EngineBound PostLnVariationBound(const AttentionLayer& layer, const TokenCover& cover, const PostLnVariationInputs& in,
                                 ExpBackend exp_backend = DefaultExpBackend(), PostLnVariationReport* report = nullptr);

// ||J_f(X0)||_inf for the post-LN sublayer at a point, from both sides: J_M(X0) enclosed
// densely (the centre_norm engine's assembly), I added, each token's rows multiplied by
// D_i(yc_i), the row sums of the enclosure, and the enclosure of Y0 covered by
// max_i sup ||D_i(y) - D_i(yc_i)||_inf (1 + ||J_M(X0)||_inf). `row` (flattening i*D + a) is the
// row with the largest lower sum, the one a witness takes; `mha_upper` >= ||J_M(X0)||_inf from
// the same enclosure. Above N*D = dense_limit (or once the deadline passes) upper is +inf.
struct PostLnCentreInfBounds {
  UpperBound upper{kInf};
  LowerBound lower{0.0};
  UpperBound mha_upper{kInf};
  Eigen::VectorXd mha_rows;  // >= ||J_{M,i}(X0)||_inf per token (its D rows), from the same enclosure
  int row = -1;
  bool timed_out = false;
  std::string note;
};
PostLnCentreInfBounds PostLnCentreInfNormBounds(const AttentionLayer& layer, const Eigen::MatrixXd& x0, long dense_limit,
                                                int threads,
                                                std::chrono::steady_clock::time_point deadline =
                                                    std::chrono::steady_clock::time_point::max());

// MHA's certified pieces in one norm: its bound, and the centre_norm engine's centre term and
// the sum of its variation terms (+inf where that engine did not give a finite bound).
struct MhaPieces {
  UpperBound upper{kInf}, centre{kInf}, variation{kInf};
  UpperBound mean_variation{kInf};  // CentreNormTerms::mean_variation (the cover takes the norm-2 pieces')
};
// From MHA's certificate (the pipeline's run on MHA alone).
MhaPieces MhaPiecesOf(const Certificate& mha_certificate);
// By running the centre_norm engine on `mha` (MHA alone) over the cover, without a deadline.
MhaPieces MhaPiecesOver(const AttentionLayer& mha, const TokenCover& cover, NormKind p, int threads);

// The heads before Wo: `mha` with Wo = I and no output bias (M = Wo . H). Only where Wo is
// D x D (heads * head_dim_v == d_model); throws std::invalid_argument otherwise.
AttentionLayer HeadsBeforeWo(const AttentionLayer& mha);

// The variation's inputs, filled in one place for the candidate and the tests: MHA's pieces
// (m2 in norm 2, mp in the norm p), tightened over a set by the row blocks of J_M(X0) (up to
// N*D = inf_dense_limit), MHA's variation where the pieces have none, and V_H (the heads
// before Wo, HeadsBeforeWo), each for a share of the time before `deadline`; the centre from
// `centre_l2` in norm 2, from PostLnCentreInfNormBounds (into *inf_centre if non-null) in the
// inf norm.
PostLnVariationInputs PostLnVariationInputsFor(const AttentionLayer& layer, const InputSet& set, NormKind p,
                                               const MhaPieces& m2, const MhaPieces& mp, UpperBound centre_l2,
                                               int threads, std::chrono::steady_clock::time_point deadline,
                                               long inf_dense_limit, PostLnCentreInfBounds* inf_centre = nullptr);

// The candidate CertifyPostLayerNorm adds (engine "post_ln_variation"): the bound above with
// MHA's quantities read from its certificates (`mha_l2` in norm 2, `mha_p` in the norm p, the
// same one when p = 2): U from their upper bounds, ||J_M(X0)|| and V_M from their centre_norm
// engine's terms where it ran (else V_M <= 2 U). The centre: in norm 2 `centre_l2`, certified
// at the Y centre `centre_y` (PostLnCentreBound's first term; the candidate refuses when its
// own Y centre differs); in the inf norm PostLnCentreInfNormBounds up to N*D = inf_dense_limit,
// before `deadline`. `*inf_row` (if non-null) receives that route's witness row (-1 if none).
EngineResult PostLnVariationCandidate(const AttentionLayer& layer, const InputSet& set, NormKind p,
                                      const Certificate& mha_l2, const Certificate& mha_p, UpperBound centre_l2,
                                      const Eigen::MatrixXd& centre_y, int threads,
                                      std::chrono::steady_clock::time_point deadline, long inf_dense_limit = 12288,
                                      int* inf_row = nullptr);

}  // namespace lipcert
