#include "certify/post_ln_variation.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "certify/centre_norm.h"
#include "certify/centred_engine.h"
#include "certify/layer_norm_cover.h"
#include "certify/layer_norm_enclosure.h"
#include "certify/post_layer_norm.h"
#include "certify/post_ln_centre_rows.h"
#include "certify/post_ln_inf.h"
#include "certify/post_ln_y_cover.h"
#include "certify/witness_eval.h"
#include "interval/norms.h"
#include "interval/parallel.h"

namespace lipcert {

namespace {

bool Finite(UpperBound u) { return std::isfinite(u.value()); }

// >= ||D_i Wo||_p per token, D_i enclosed by ln_jac[i].
Eigen::VectorXd LayerNormWoNormsUp(const AttentionLayer& L, const std::vector<IntervalMatrix>& ln_jac, NormKind p) {
  Eigen::VectorXd out(Eigen::Index(ln_jac.size()));
  for (size_t i = 0; i < ln_jac.size(); ++i) {
    const IntervalMatrix dw = Mul(ln_jac[i], L.wo);
    out(Eigen::Index(i)) = p == NormKind::kL2 ? NormL2UpperGram(dw, 1).value() : NormInfUpper(dw).value();
  }
  return out;
}

void CheckLayer(const AttentionLayer& L) {
  if (!L.post_ln()) throw std::invalid_argument("post_ln_variation: the layer has no post-LN LayerNorm");
  if (L.layer_norm) throw std::invalid_argument("post_ln_variation: a layer with both LayerNorms");
}

}  // namespace

std::string PostLnVariationInputs::IsValid() const {
  if (norm != NormKind::kL2 && norm != NormKind::kLinf) return "norm: 2 or inf";
  const std::pair<const char*, UpperBound> fields[] = {
      {"centre", centre},           {"mha_centre", mha_centre},       {"mha_variation", mha_variation},
      {"mha_upper", mha_upper},     {"mha_l2_upper", mha_l2_upper},   {"mha_l2_centre", mha_l2_centre},
      {"mha_l2_variation", mha_l2_variation}, {"mha_l2_mean_variation", mha_l2_mean_variation}};
  for (const auto& [name, u] : fields)
    if (std::isnan(u.value()) || u.value() < 0) return std::string(name) + ": must be >= 0 (+inf allowed)";
  for (Eigen::Index i = 0; i < heads_row_weights.size(); ++i)
    if (!(heads_row_weights(i) >= 0)) return "heads_row_weights: each must be >= 0";
  for (Eigen::Index i = 0; i < mha_row_variation_l2.size(); ++i)
    if (!(mha_row_variation_l2(i) >= 0)) return "mha_row_variation_l2: each must be >= 0 (+inf allowed)";
  for (Eigen::Index i = 0; i < mha_row_mean_variation_l2.size(); ++i)
    if (!(mha_row_mean_variation_l2(i) >= 0)) return "mha_row_mean_variation_l2: each must be >= 0 (+inf allowed)";
  for (Eigen::Index i = 0; i < ln_mha_rows_inf.size(); ++i)
    if (!(ln_mha_rows_inf(i) >= 0)) return "ln_mha_rows_inf: each must be >= 0 (+inf allowed)";
  for (Eigen::Index i = 0; i < ln_row_weights.size(); ++i)
    if (!(ln_row_weights(i) >= 0 && ln_row_weights(i) <= 1)) return "ln_row_weights: each must be in [0, 1]";
  for (const auto& [name, u] : {std::pair<const char*, UpperBound>{"ln_rows_centre", ln_rows_centre},
                                {"ln_rows_variation", ln_rows_variation},
                                {"rows_centre.upper", rows_centre.upper}})
    if (std::isnan(u.value()) || u.value() < 0) return std::string(name) + ": must be >= 0 (+inf allowed)";
  return "";
}

namespace {

// The MHA term through the heads before Wo: max_i ||D_i(yc_i) Wo|| / w_i x V_H, where V_H
// bounds the heads' variation with output token i's rows weighted by w_i (1 without
// weights); +inf where V_H is not given or Wo is not D x D. *ln_wo: ||D_i(yc_i) Wo||.
double ThroughHeadsUp(const AttentionLayer& L, const MhaInput& f, const PostLnVariationInputs& in, Eigen::VectorXd* ln_wo) {
  const Eigen::Index n = Eigen::Index(f.ln_jac.size()), d = L.d_model;
  if (!std::isfinite(in.heads_variation.value()) || L.wo.rows() != d || L.wo.cols() != d) return kInf;
  *ln_wo = LayerNormWoNormsUp(L, f.ln_jac, in.norm);
  // ||D_i(yc_i) Wo|| <= scale w_i for every i, so ||blockdiag(D_i Wo) A|| <= scale ||diag(w) A||.
  const bool weighted = in.heads_row_weights.size() == n;
  double scale = 0;
  for (Eigen::Index i = 0; i < n; ++i) {
    const double w = weighted ? in.heads_row_weights(i) : 1.0;
    scale = std::max(scale, (*ln_wo)(i) == 0 ? 0.0 : w > 0 ? DivUp((*ln_wo)(i), w) : kInf);
  }
  return MulUp(scale, in.heads_variation.value());
}

// The per-token cover of Y: on the segment X_t in S, ||M_i(X) - M_i(X0)|| <= sup_t ||J_{M,i}(X_t)||_2 ||X - X0||_F,
// and ||J_{M,i}(X_t)|| <= min(U2, ||J_{M,i}(X0)|| + V_2) (a row block is at most the whole);
// PostLnYCover also takes the attention's own displacement bound, which saturates.
// >= sup_S ||J_{M,i}(X)||_2 for token i of n: min(U2, ||J_{M,i}(X0)||_2 + its own variation)
// where the row blocks are known, else U2.
double MhaRowL2UpperOf(const PostLnVariationInputs& in, double u2, Eigen::Index i, Eigen::Index n) {
  if (in.mha_row_centre_l2.size() != n) return u2;
  const double own = in.mha_row_variation_l2.size() == n ? std::min(in.mha_l2_variation.value(), in.mha_row_variation_l2(i))
                                                         : in.mha_l2_variation.value();
  return std::min(u2, AddUp(in.mha_row_centre_l2(i), own));
}

// >= sup_S int_0^1 ||J_{M,i}(X_s)||_2 ds for token i of n, X_s = X0 + s (X - X0): its row
// block's (else the whole) norm at X0 plus the mean variation along the segment, token i's
// own where known (the variation, which bounds the mean, where no mean is known).
double MhaRowMeanL2UpperOf(const PostLnVariationInputs& in, Eigen::Index i, Eigen::Index n) {
  const double centre = in.mha_row_centre_l2.size() == n ? in.mha_row_centre_l2(i) : in.mha_l2_centre.value();
  double mean = std::min(in.mha_l2_mean_variation.value(), in.mha_l2_variation.value());
  if (in.mha_row_mean_variation_l2.size() == n) mean = std::min(mean, in.mha_row_mean_variation_l2(i));
  return AddUp(centre, mean);
}

// The per-token cover of Y. On the segment X_s, M_i(X) - M_i(X0) = int_0^1 J_{M,i}(X_s) (X - X0) ds,
// so token i moves by at most ||X - X0||_F times the sup of ||J_{M,i}|| over the set
// (MhaRowL2UpperOf), or times its mean along the segment (MhaRowMeanL2UpperOf), the smaller.
TokenCover YCoverOf(const AttentionLayer& L, const TokenCover& cover, const PostLnVariationInputs& in, double u2,
                    ExpBackend exp_backend) {
  const Eigen::Index n = cover.center.rows();
  const double joint = JointRadiusUp(cover).value();
  Eigen::VectorXd moved(n);
  for (Eigen::Index i = 0; i < n; ++i)
    moved(i) = MulUp(std::min(MhaRowL2UpperOf(in, u2, i, n), MhaRowMeanL2UpperOf(in, i, n)), joint);
  const double whole_mean = std::isfinite(in.mha_l2_mean_variation.value())
                                ? AddUp(in.mha_l2_centre.value(), in.mha_l2_mean_variation.value()) : kInf;
  return PostLnYCover(L, cover, moved, exp_backend, UpperBound(MulUp(std::min(u2, whole_mean), joint)));
}

// Whether a piece computed at the Y centre `at` holds at the bound's own Y centre yc.
bool SameYCentre(const Eigen::MatrixXd& at, const Eigen::MatrixXd& yc) {
  return at.rows() == yc.rows() && at.cols() == yc.cols() && at == yc;
}

// U2 >= sup_S ||J_M||_2: the certified bound, or the centre plus the variation.
double MhaL2UpperOf(const PostLnVariationInputs& in) {
  return std::min(in.mha_l2_upper.value(), AddUp(in.mha_l2_centre.value(), in.mha_l2_variation.value()));
}

// max_i delta_i / w_i (0 where delta_i is; +inf where w_i = 0 < delta_i): with it,
// ||blockdiag(Delta_i) A|| <= scale ||diag(w) A|| for ||Delta_i|| <= delta_i.
double WeightScaleUp(const Eigen::VectorXd& delta, const Eigen::VectorXd& w) {
  double scale = 0;
  for (Eigen::Index i = 0; i < delta.size(); ++i)
    scale = std::max(scale, delta(i) == 0 ? 0.0 : w(i) > 0 ? DivUp(delta(i), w(i)) : kInf);
  return scale;
}

// Per token of the cover of Y: ln_centre(i) >= ||D_i(yc_i)||_p and ln_var(i) >= sup over the
// token's ball of ||D_i(y_i) - D_i(yc_i)||_p, and ln_var_l2(i) the same in norm 2 (if non-null).
// False where Y0 has no finite enclosure.
bool LayerNormTermsOver(const AttentionLayer& L, const TokenCover& y_cover, const MhaInput& f, NormKind norm,
                        Eigen::VectorXd* ln_centre, Eigen::VectorXd* ln_var, Eigen::VectorXd* ln_var_l2 = nullptr) {
  if (ln_var_l2) ln_var_l2->resize(y_cover.center.rows());
  const double sqrt_d = SqrtUp(double(L.d_model));
  for (Eigen::Index i = 0; i < y_cover.center.rows(); ++i) {
    if (!y_cover.center.row(i).allFinite()) return false;
    const double delta2 =
        std::min(f.delta_ln(i), LayerNormVariationUp(*L.post_layer_norm, y_cover.center.row(i), y_cover.radius(i), CentredLo(y_cover, i)));
    if (ln_var_l2) (*ln_var_l2)(i) = delta2;
    if (norm == NormKind::kL2) {
      (*ln_centre)(i) = NormL2UpperGram(f.ln_jac[size_t(i)], 1).value();
      (*ln_var)(i) = delta2;
    } else {
      (*ln_centre)(i) = NormInfUpper(f.ln_jac[size_t(i)]).value();
      // Row by row (LayerNormVariationInfUp), ||A||_inf <= sqrt(D) ||A||_2 for D x D matrices,
      // and the triangle inequality.
      (*ln_var)(i) = std::min({LayerNormVariationInfUp(*L.post_layer_norm, y_cover.center.row(i), y_cover.radius(i),
                                                              CentredLo(y_cover, i)),
                               MulUp(sqrt_d, delta2), AddUp(f.ell(i), (*ln_centre)(i))});
    }
  }
  return true;
}

// The crude centre: ||blockdiag(D_i(yc_i)) A|| <= max_k ||D_k|| ||diag(w) A|| with
// w_i = ||D_i|| / max_k ||D_k||, A = I + J_M(X0) (WeightedCentreUp from MHA's row blocks and centre).
double CrudeCentreUp(const Eigen::VectorXd& ln_centre, const PostLnVariationInputs& in) {
  const double top = ln_centre.maxCoeff();
  Eigen::VectorXd w(ln_centre.size());
  for (Eigen::Index i = 0; i < w.size(); ++i) w(i) = top > 0 ? std::min(1.0, DivUp(ln_centre(i), top)) : 1.0;
  return MulUp(top, WeightedCentreUp(w, in.mha_row_centre_l2, in.mha_l2_centre.value()));
}

// The MHA term through D(Yc) and the LayerNorm term, from the LayerNorm's factors per token.
struct LayerNormTerms {
  double through_mha = 0;  // ||D(Yc)(J_M(X) - J_M(X0))|| <= max_i ||D_i(yc_i)|| V_M (token by token in inf)
  double ln_whole = 0;     // max_i delta_i (1 + U_M) (token by token in inf)
  double ln_rows = kInf;   // norm 2: max_i delta_i / w_i (ln_rows_centre + ln_rows_variation)
  double ln_scale = kInf;  // max_i delta_i / w_i
  bool inf_rows = false;   // the inf norm with MHA's rows
  bool through_d = false;  // the inf norm's MHA term took some token's rows through D_i Wo
  bool ln_via_l2 = false;  // the inf norm's LN term took some token's bound through norm 2
};
// In the inf norm, with Delta_i = D_i(y_i) - D_i(yc_i) and (I + J_M(X))_i = E_i + J_{M,i}(X)
// (E_i selects token i's columns, so ||Delta_i E_i||_inf = ||Delta_i||_inf <= delta_i): the
// D x ND matrix Delta_i J_{M,i}(X) has rows whose l1 norm is at most sqrt(ND) their l2 norm,
// at most its norm 2, and ||J_{M,i}(X)||_2 <= min(U2, ||J_{M,i}(X0)||_2 + V_2). So the LN term
// of token i is at most delta_i + sqrt(ND) delta2_i min(U2, ...), delta2_i >= sup ||Delta_i||_2:
// the identity's part in the inf norm, only MHA's part through norm 2.
double LayerNormTermViaL2Up(const PostLnVariationInputs& in, double ln_var_inf, const Eigen::VectorXd& ln_var_l2,
                            Eigen::Index i, double nd) {
  const double u2_i = MhaRowL2UpperOf(in, MhaL2UpperOf(in), i, ln_var_l2.size());
  return AddUp(ln_var_inf, MulUp(SqrtUp(nd), MulUp(ln_var_l2(i), u2_i)));
}
LayerNormTerms LayerNormTermsOf(const Eigen::VectorXd& ln_centre, const Eigen::VectorXd& ln_var,
                                const Eigen::VectorXd& ln_var_l2, const PostLnVariationInputs& in, double v_m,
                                double u_m, const Eigen::MatrixXd& yc) {
  const Eigen::Index n = ln_centre.size();
  LayerNormTerms t;
  // D(Yc)(J_M(X) - J_M(X0)) has a block-diagonal left factor (its norm the largest block's); in
  // the inf norm, token by token where MHA's rows are known: the norm is the largest row sum.
  t.inf_rows = in.norm == NormKind::kLinf && in.mha_row_variation_inf.size() == n;
  const auto v_row = [&](Eigen::Index i) { return t.inf_rows ? std::min(v_m, in.mha_row_variation_inf(i)) : v_m; };
  const auto u_row = [&](Eigen::Index i) {
    return t.inf_rows && in.mha_row_centre_inf.size() == n ? std::min(u_m, AddUp(in.mha_row_centre_inf(i), v_row(i)))
                                                           : u_m;
  };
  // Token i's rows through D_i Wo hold at their own Y centre only.
  const bool d_rows = t.inf_rows && in.ln_mha_rows_inf.size() == n && SameYCentre(in.ln_mha_rows_y, yc);
  for (Eigen::Index i = 0; i < n; ++i) {
    double mha_i = MulUp(ln_centre(i), v_row(i));
    if (d_rows && in.ln_mha_rows_inf(i) < mha_i) mha_i = in.ln_mha_rows_inf(i), t.through_d = true;
    t.through_mha = std::max(t.through_mha, mha_i);
    double ln_i = MulUp(ln_var(i), AddUp(1.0, u_row(i)));
    if (in.norm == NormKind::kLinf && ln_var_l2.size() == n) {
      const double via_l2 = LayerNormTermViaL2Up(in, ln_var(i), ln_var_l2, i, double(yc.size()));
      if (via_l2 < ln_i) ln_i = via_l2, t.ln_via_l2 = true;
    }
    t.ln_whole = std::max(t.ln_whole, ln_i);
  }
  // The LayerNorm's variation times I + J_M(X): as a whole, or token by token through the
  // weighted pieces (norm 2).
  if (in.norm == NormKind::kL2 && in.ln_row_weights.size() == n && Finite(in.ln_rows_centre) &&
      Finite(in.ln_rows_variation)) {
    t.ln_scale = WeightScaleUp(ln_var, in.ln_row_weights);
    t.ln_rows = MulUp(t.ln_scale, AddUp(in.ln_rows_centre.value(), in.ln_rows_variation.value()));
  }
  return t;
}

// The bound's three terms, named by the route that gave each.
enum class CentreRoute { kCertified, kCrude, kCrudeInf, kLayerNormRows };
std::string RowsCentreNote(const LayerNormRowSplit& r) {
  char rows[160];
  std::snprintf(rows, sizeof rows, "; centre from the LayerNorm's rows: K %d, heavy rows %.6g, the rest %.6g",
                r.heavy_rows, r.heavy_norm.value(), r.rest.value());
  return rows;
}
std::vector<BoundTerm> NamedTerms(UpperBound centre, CentreRoute route, UpperBound variation, bool heads_won,
                                  UpperBound through_ln, bool rows_won, const LayerNormTerms& t) {
  const bool inf_rows = t.inf_rows;
  return {
      {route == CentreRoute::kCrude
           ? "centre norm ||D(Yc)(I + J_M(X0))||, crude: max_i ||D_i(yc_i)|| x ||diag(w)(I + J_M(X0))|| from MHA's "
             "row blocks"
       : route == CentreRoute::kCrudeInf
           ? "centre norm ||D(Yc)(I + J_M(X0))||, crude: max_i ||D_i(yc_i)|| x (1 + ||J_{M,i}(X0)||) from MHA's "
             "certified centre"
       : route == CentreRoute::kLayerNormRows
           ? "centre norm ||D(Yc)(I + J_M(X0))||, from the LayerNorm's rows: its largest rows times I + J_M(X0) "
             "(Gram certificate), the rest x ||diag(w)(I + J_M(X0))||"
           : "centre norm ||D(Yc)(I + J_M(X0))||",
       centre},
      {heads_won    ? "MHA variation: max_i ||D_i(yc_i) Wo|| x sup ||J_H(X) - J_H(X0)|| (heads before Wo)"
       : t.through_d ? "MHA variation: max_i sup ||D_i(yc_i)(J_{M,i}(X) - J_{M,i}(X0))|| (token i's rows through D_i Wo)"
       : inf_rows   ? "MHA variation: max_i ||D_i(yc_i)|| x sup ||J_{M,i}(X) - J_{M,i}(X0)|| (token i's rows)"
                  : "MHA variation: max_i ||D_i(yc_i)|| x sup ||J_M(X) - J_M(X0)||",
       variation},
      {rows_won ? "LN variation: max_i delta_i / w_i x (||diag(w)(I + J_M(X0))|| + sup ||diag(w)(J_M(X) - J_M(X0))||), "
                  "delta_i = sup ||D_i(y_i) - D_i(yc_i)|| over the per-token cover of Y"
       : t.ln_via_l2 ? "LN variation: max_i delta_i x (1 + sup ||J_{M,i}||) or, where smaller, delta_i + sqrt(ND) x "
                       "delta2_i x sup ||J_{M,i}||_2, delta_i = sup ||D_i(y_i) - D_i(yc_i)|| (delta2_i: in norm 2) over "
                       "the per-token cover of Y (token i's rows)"
       : inf_rows    ? "LN variation: max_i sup ||D_i(y_i) - D_i(yc_i)|| over the per-token cover of Y x "
                       "(1 + sup ||J_{M,i}||) (token i's rows)"
                  : "LN variation: max_i sup ||D_i(y_i) - D_i(yc_i)|| over the per-token cover of Y x (1 + U_M)",
       through_ln}};
}

void FillReport(const TokenCover& y_cover, const Eigen::VectorXd& ln_centre, const Eigen::VectorXd& ln_var,
                const Eigen::VectorXd& ln_wo, const LayerNormTerms& t, double through_heads,
                PostLnVariationReport* report) {
  report->y_cover = y_cover;
  report->ln_centre = ln_centre;
  report->ln_variation = ln_var;
  report->ln_wo = ln_wo;
  report->through_mha = t.through_mha;
  report->through_heads = through_heads;
  report->ln_whole = t.ln_whole;
  report->ln_rows = t.ln_rows;
}

}  // namespace

EngineBound PostLnVariationBound(const AttentionLayer& L, const TokenCover& cover, const PostLnVariationInputs& in,
                                 ExpBackend exp_backend, PostLnVariationReport* report) {
  CheckLayer(L);
  if (const std::string bad = in.IsValid(); !bad.empty()) throw std::invalid_argument("post_ln_variation: " + bad);
  EngineBound out;
  const Eigen::Index n = cover.center.rows();
  const double u2 = MhaL2UpperOf(in);
  // V_M >= sup_S ||J_M(X) - J_M(X0)||_p: the certified variation, or ||J_M(X)|| + ||J_M(X0)||.
  const double u_p0 = std::min(in.mha_upper.value(), AddUp(in.mha_centre.value(), in.mha_variation.value()));
  const double v_m = std::min(in.mha_variation.value(), AddUp(u_p0, std::min(in.mha_centre.value(), u_p0)));
  const double u_m = std::min(u_p0, AddUp(in.mha_centre.value(), v_m));
  if (report) {
    report->mha_l2 = u2;
    report->mha_variation = v_m;
    report->mha_upper = u_m;
  }
  // Without a certified centre (norm 2: post_ln_centre did not finish; inf: above the dense
  // size) the bound takes a crude one below.
  const bool centre_missing = !Finite(in.centre);
  if (!std::isfinite(u2) || !std::isfinite(v_m) || !std::isfinite(u_m)) {
    out.upper = UpperBound(kInf);
    out.note = "an input is +inf (centre " + std::to_string(in.centre.value()) + ", U2 " + std::to_string(u2) +
               ", V_M " + std::to_string(v_m) + ", U_M " + std::to_string(u_m) + ")";
    return out;
  }
  const TokenCover y_cover = YCoverOf(L, cover, in, u2, exp_backend);
  // The LayerNorm factors: ln_jac at yc (radius 0 enclosures), delta_ln over the balls (norm 2),
  // ell the sup over the balls in the norm p.
  const MhaInput f = PostLnFactorsOver(L, y_cover, in.norm);
  Eigen::VectorXd ln_centre(n), ln_var(n), ln_var_l2;
  if (!LayerNormTermsOver(L, y_cover, f, in.norm, &ln_centre, &ln_var, &ln_var_l2)) {
    out.upper = UpperBound(kInf);
    out.note = "no finite enclosure of Y0";
    return out;
  }
  UpperBound centre = in.centre;
  CentreRoute route = CentreRoute::kCertified;
  if (centre_missing && in.norm != NormKind::kL2) {
    centre = UpperBound(CrudeInfCentreUp(ln_centre, in));
    route = CentreRoute::kCrudeInf;
  } else if (centre_missing) {
    centre = UpperBound(CrudeCentreUp(ln_centre, in));
    route = CentreRoute::kCrude;
    // The LayerNorm rows' centre holds at its own Y centre only.
    if (in.rows_centre.upper.value() < centre.value() && SameYCentre(in.rows_centre_y, y_cover.center)) {
      centre = in.rows_centre.upper;
      route = CentreRoute::kLayerNormRows;
    }
    if (!Finite(centre)) {
      out.upper = UpperBound(kInf);
      out.note = "no certified centre norm and no finite crude one";
      return out;
    }
  }
  Eigen::VectorXd ln_wo;
  const double through_heads = ThroughHeadsUp(L, f, in, &ln_wo);
  const LayerNormTerms t = LayerNormTermsOf(ln_centre, ln_var, ln_var_l2, in, v_m, u_m, y_cover.center);
  const UpperBound variation(std::min(t.through_mha, through_heads)), through_ln(std::min(t.ln_whole, t.ln_rows));
  out.upper = UpperBound(AddUp(AddUp(centre.value(), variation.value()), through_ln.value()));
  out.terms = NamedTerms(centre, route, variation, through_heads < t.through_mha, through_ln,
                         t.ln_rows < t.ln_whole, t);
  char how[400];
  std::snprintf(how, sizeof how,
                "MHA term%s: max||D_i|| %.6g, V_M %.6g: %.6g; max||D_i Wo|| %.6g x V_H %.6g = %.6g; "
                "LN term: max delta_i %.6g, U_M %.6g: %.6g; max delta_i/w_i %.6g x (%.6g + %.6g) = %.6g; "
                "max rho_i %.6g",
                t.through_d  ? " (rows through D_i Wo) and LN term token by token (rows of J_M)"
                : t.inf_rows ? " and LN term token by token (rows of J_M)"
                             : "", ln_centre.maxCoeff(), v_m, t.through_mha,
                ln_wo.size() ? ln_wo.maxCoeff() : kInf, in.heads_variation.value(), through_heads, ln_var.maxCoeff(), u_m,
                t.ln_whole, t.ln_scale, in.ln_rows_centre.value(), in.ln_rows_variation.value(), t.ln_rows,
                y_cover.radius.maxCoeff());
  out.note = how + (route == CentreRoute::kLayerNormRows ? RowsCentreNote(in.rows_centre) : std::string());
  if (report) FillReport(y_cover, ln_centre, ln_var, ln_wo, t, through_heads, report);
  return out;
}

namespace {

// J_M(X0) enclosed densely (the centre_norm engine's assembly), `mha` MHA alone.
IntervalMatrix MhaJacobianEnclosure(const AttentionLayer& mha, const Eigen::MatrixXd& x0, int threads,
                                    std::chrono::steady_clock::time_point deadline) {
  CentreNormOptions co;
  co.mha_only = true;
  co.threads = threads;
  co.deadline = deadline;
  co.dense_limit = long(x0.rows()) * x0.cols();
  return CentreJacobianEnclosure(mha, x0, co);
}

// >= ||J_{M,i}(X0)||_2 per token from the enclosure jm of J_M(X0); empty once the deadline passed.
Eigen::VectorXd RowBlockL2NormsUp(const IntervalMatrix& jm, int n, int d, int threads,
                                  std::chrono::steady_clock::time_point deadline) {
  if (std::chrono::steady_clock::now() > deadline) return {};
  Eigen::VectorXd out(n);
  for (int i = 0; i < n; ++i) {
    // B (D x ND) is wide: the certificate takes its D x D Gram matrix B B^T.
    const IntervalMatrix b(jm.mid.middleRows(i * d, d), jm.rad.middleRows(i * d, d));
    out(i) = NormL2UpperGram(b, threads, nullptr, deadline).value();
    if (!std::isfinite(out(i))) return {};
  }
  return out;
}

}  // namespace

Eigen::VectorXd MhaRowBlockNormsUp(const AttentionLayer& mha, const Eigen::MatrixXd& x0, long dense_limit, int threads,
                                   std::chrono::steady_clock::time_point deadline) {
  const int n = int(x0.rows()), d = int(x0.cols());
  if (long(n) * d > dense_limit || mha.post_ln() || mha.layer_norm) return {};
  return RowBlockL2NormsUp(MhaJacobianEnclosure(mha, x0, threads, deadline), n, d, threads, deadline);
}

namespace {

// The dense limit's refusal, or "" (the inf centre holds one (ND)^2 enclosure).
std::string InfDenseRefusal(long nd, long dense_limit) {
  return nd > dense_limit ? "N*D = " + std::to_string(nd) + " above the dense limit " + std::to_string(dense_limit) : "";
}

}  // namespace

PostLnCentreInfBounds PostLnCentreInfNormBounds(const AttentionLayer& L, const Eigen::MatrixXd& x0, long dense_limit,
                                                int threads, std::chrono::steady_clock::time_point deadline) {
  CheckLayer(L);
  PostLnCentreInfBounds out;
  out.note = InfDenseRefusal(long(x0.size()), dense_limit);
  if (!out.note.empty()) return out;
  return PostLnCentreInfFrom(L, x0, MhaJacobianEnclosure(L.WithoutPostLayerNorm(), x0, threads, deadline), threads,
                             deadline);
}

namespace {

// MHA's variation over the cover in the norm q (the centred form's variation half,
// certify/centred_engine.h): its optional refinements end by `refine_until` (a share of the
// stage), the bound itself by `deadline` (the stage's end), so that a share too short for the
// machine's load still gives the unrefined bound; +inf where it did not finish.
// *mean (if non-null) receives its mean along the segment (CentredVariation::mean_variation).
UpperBound VariationOf(const AttentionLayer& mha, const TokenCover& cover, NormKind q, int threads,
                       std::chrono::steady_clock::time_point refine_until, std::chrono::steady_clock::time_point deadline,
                       const Eigen::VectorXd* row_weights = nullptr, UpperBound* mean = nullptr) {
  BoundOptions bo;
  bo.norm = q;
  bo.threads = threads;
  bo.deadline = deadline;
  const CentredVariation v = CentredVariationBound(mha, cover, bo, std::min(refine_until, deadline), false, row_weights);
  if (mean) *mean = v.complete ? v.mean_variation : UpperBound(kInf);
  return v.complete ? v.variation : UpperBound(kInf);
}

// A deadline a fraction of the way from now to `deadline` (max() stays max()).
std::chrono::steady_clock::time_point ShareOf(std::chrono::steady_clock::time_point deadline, double fraction) {
  if (deadline == std::chrono::steady_clock::time_point::max()) return deadline;
  const auto now = std::chrono::steady_clock::now();
  if (deadline <= now) return deadline;
  return now + std::chrono::duration_cast<std::chrono::steady_clock::duration>((deadline - now) * fraction);
}

// Weights w_i = delta_i / max_k delta_k (norm 2), delta_i the LayerNorm variation over token
// i's ball of the cover of Y that PostLnVariationBound builds from the same inputs, and
// *centre >= ||diag(w)(I + J_M(X0))||_2 (WeightedCentreUp); empty where the cover is not finite.
Eigen::VectorXd LayerNormRowWeights(const AttentionLayer& L, const TokenCover& cover, const PostLnVariationInputs& in,
                                    UpperBound* centre) {
  const Eigen::Index n = cover.center.rows();
  const double u2 = MhaL2UpperOf(in);
  if (!std::isfinite(u2)) return {};
  const TokenCover y_cover = YCoverOf(L, cover, in, u2, DefaultExpBackend());
  const MhaInput f = PostLnFactorsOver(L, y_cover, NormKind::kL2);
  Eigen::VectorXd ln_centre(n), ln_var(n);
  if (!LayerNormTermsOver(L, y_cover, f, NormKind::kL2, &ln_centre, &ln_var)) return {};
  const double top = ln_var.maxCoeff();
  if (!std::isfinite(top) || !(top > 0)) return {};
  Eigen::VectorXd w(n);
  for (Eigen::Index i = 0; i < n; ++i) w(i) = std::min(1.0, DivUp(ln_var(i), top));
  *centre = UpperBound(WeightedCentreUp(w, in.mha_row_centre_l2, in.mha_l2_centre.value()));
  return w;
}

// w_i = ||D_i(yc_i) Wo|| / max_k ||D_k(yc_k) Wo|| (norm 2) at the centre of the cover of Y;
// empty where Y0 has no finite enclosure or every factor is 0.
Eigen::VectorXd HeadsRowWeights(const AttentionLayer& L, const Eigen::MatrixXd& x0) {
  const Eigen::Index n = x0.rows();
  const TokenCover yc = PostLnYCoverAtPoint(L, x0);
  if (!yc.center.allFinite()) return {};
  Eigen::VectorXd w = LayerNormWoNormsUp(L, PostLnFactorsOver(L, yc, NormKind::kL2).ln_jac, NormKind::kL2);
  const double top = w.maxCoeff();
  if (!std::isfinite(top) || !(top > 0)) return {};
  for (Eigen::Index i = 0; i < n; ++i) w(i) = std::min(1.0, DivUp(w(i), top));
  return w;
}

// The LayerNorm term token by token (norm 2), in two passes: weights w from the delta_i of the
// cover of Y, the weighted variation V^w, and from it each token's own variation
// ||J_{M,i}(X) - J_{M,i}(X0)|| <= V^w / w_i, which narrows the cover where w_i is large; the
// second pass weighs the narrower delta_i. Each pass's weights come with their own centre and
// variation, so the bound holds whichever pass the time ends in.
void AddLayerNormRows(const AttentionLayer& L, const TokenCover& cover, int threads,
                      std::chrono::steady_clock::time_point deadline, PostLnVariationInputs* in) {
  const AttentionLayer mha = L.WithoutPostLayerNorm();
  for (int pass = 0; pass < 2; ++pass) {
    UpperBound centre_w(kInf);
    const Eigen::VectorXd w = LayerNormRowWeights(L, cover, *in, &centre_w);
    if (!w.size()) return;
    UpperBound mean_w(kInf);
    const UpperBound variation_w = VariationOf(mha, cover, NormKind::kL2, threads,
                                               ShareOf(deadline, pass == 0 ? 0.5 : 0.85), deadline, &w, &mean_w);
    if (!Finite(variation_w) || !Finite(centre_w)) return;
    in->ln_row_weights = w;
    in->ln_rows_centre = centre_w;
    in->ln_rows_variation = variation_w;
    // w_i ||A_i|| <= ||diag(w) A||, at every point of the segment and so in the mean.
    if (in->mha_row_variation_l2.size() != w.size()) in->mha_row_variation_l2 = Eigen::VectorXd::Constant(w.size(), kInf);
    if (in->mha_row_mean_variation_l2.size() != w.size())
      in->mha_row_mean_variation_l2 = Eigen::VectorXd::Constant(w.size(), kInf);
    for (Eigen::Index i = 0; i < w.size(); ++i) {
      if (!(w(i) > 0)) continue;
      in->mha_row_variation_l2(i) = std::min(in->mha_row_variation_l2(i), DivUp(variation_w.value(), w(i)));
      in->mha_row_mean_variation_l2(i) = std::min(in->mha_row_mean_variation_l2(i), DivUp(mean_w.value(), w(i)));
    }
  }
}

// in->rows_centre (LayerNormRowSplitCentreUp) at the Y centre every cover of Y has (the
// enclosure of Y0), from the dense enclosure jm of J_M(X0), within half of the time left.
void AddRowsCentre(const AttentionLayer& L, const Eigen::MatrixXd& x0, const IntervalMatrix& jm, int threads,
                   std::chrono::steady_clock::time_point deadline, PostLnVariationInputs* in) {
  const Eigen::Index n = x0.rows();
  if (jm.rows() != x0.size()) return;
  const TokenCover yc = PostLnYCoverAtPoint(L, x0);
  if (!yc.center.allFinite()) return;
  const int k = int(n);
  in->rows_centre = LayerNormRowSplitCentreUp(PostLnFactorsOver(L, yc, NormKind::kL2).ln_jac, jm, in->mha_row_centre_l2,
                                              in->mha_l2_centre, {0, 4 * k, 8 * k, 16 * k}, threads, ShareOf(deadline, 0.5));
  in->rows_centre_y = yc.center;
}


}  // namespace

namespace {
// The inf norm's centre (PostLnCentreInfFrom, from the dense enclosure jm) and its rows, or
// above the dense size MHA's certified inf centre for the bound's crude one; then, over a set,
// the MHA term through D_i Wo.
void AddInfCentre(const AttentionLayer& L, const InputSet& set, long inf_dense_limit, IntervalMatrix jm, int threads,
                  std::chrono::steady_clock::time_point deadline, PostLnVariationInputs* in,
                  PostLnCentreInfBounds* inf_centre) {
  PostLnCentreInfBounds c;
  c.note = InfDenseRefusal(long(set.center.size()), inf_dense_limit);
  const bool dense = c.note.empty();
  if (dense) c = PostLnCentreInfFrom(L, set.center, std::move(jm), threads, deadline);
  in->centre = c.upper;
  // Above the dense size the bound's crude centre needs MHA's certified ||J_M(X0)||_inf:
  // from MHA's streamed row sums where its certificate has none (its share of the run too
  // short: MiniLM N = 64 takes about 10 s on 2 cores), within 0.4 of the time left.
  if (!dense && !std::isfinite(in->mha_centre.value())) {
    CentreNormOptions co;
    co.threads = threads;
    co.deadline = ShareOf(deadline, 0.4);
    const CentreInfNormBounds mc = CentreJacobianInfNormBounds(L.WithoutPostLayerNorm(), set.center, co);
    if (!mc.timed_out) in->mha_centre = mc.upper;
  }
  // The enclosure's own ||J_M(X0)||_inf is a second certified centre of MHA, and its rows token by token.
  if (c.mha_upper.value() < in->mha_centre.value()) in->mha_centre = c.mha_upper;
  if (set.radius > 0) in->mha_row_centre_inf = c.mha_rows;
  if (inf_centre) *inf_centre = c;
  // After the centre, which the bound cannot do without.
  if (set.radius > 0) AddLayerNormMhaRowsInf(L, CoverOf(set), threads, ShareOf(deadline, 0.85), in);
}

}  // namespace

PostLnVariationInputs PostLnVariationInputsFor(const AttentionLayer& L, const InputSet& set, NormKind p,
                                               const MhaPieces& m2, const MhaPieces& mp, UpperBound centre_l2,
                                               int threads, std::chrono::steady_clock::time_point deadline,
                                               long inf_dense_limit, PostLnCentreInfBounds* inf_centre) {
  CheckLayer(L);
  PostLnVariationInputs in;
  in.norm = p;
  in.mha_l2_upper = m2.upper;
  in.mha_l2_centre = m2.centre;
  in.mha_l2_variation = m2.variation;
  in.mha_l2_mean_variation = m2.mean_variation;
  in.mha_upper = mp.upper;
  in.mha_centre = mp.centre;
  in.mha_variation = mp.variation;
  const AttentionLayer mha = L.WithoutPostLayerNorm();
  // J_M(X0) enclosed once, up to N*D = inf_dense_limit, for its rows (over a set) and the inf centre.
  const int n = int(set.center.rows());
  const bool dense = InfDenseRefusal(long(set.center.size()), inf_dense_limit).empty();
  IntervalMatrix jm;
  if (dense && (set.radius > 0 || p != NormKind::kL2)) jm = MhaJacobianEnclosure(mha, set.center, threads, deadline);
  if (set.radius > 0) {
    const TokenCover cover = CoverOf(set);
    // The rows of J_M(X0) size the cover of Y token by token; ||J_M(X0)||_2^2 <= sum_i ||J_{M,i}(X0)||_2^2.
    if (dense) in.mha_row_centre_l2 = RowBlockL2NormsUp(jm, n, L.d_model, threads, deadline);
    if (in.mha_row_centre_l2.size()) {
      double sum2 = 0;
      for (Eigen::Index i = 0; i < in.mha_row_centre_l2.size(); ++i)
        sum2 = AddUp(sum2, MulUp(in.mha_row_centre_l2(i), in.mha_row_centre_l2(i)));
      if (SqrtUp(sum2) < in.mha_l2_centre.value()) in.mha_l2_centre = UpperBound(SqrtUp(sum2));
      if (p == NormKind::kL2 && SqrtUp(sum2) < in.mha_centre.value()) in.mha_centre = UpperBound(SqrtUp(sum2));
    }
    // Norm 2 without a certified centre: the centre from the LayerNorm's rows.
    if (p == NormKind::kL2 && !std::isfinite(centre_l2.value())) AddRowsCentre(L, set.center, jm, threads, deadline, &in);
    // MHA's variation where its pieces have none, then the heads' before Wo.
    if (!std::isfinite(in.mha_l2_variation.value()))
      in.mha_l2_variation = VariationOf(mha, cover, NormKind::kL2, threads, ShareOf(deadline, 0.3), deadline, nullptr,
                                        &in.mha_l2_mean_variation);
    if (p == NormKind::kL2) {
      in.mha_variation = in.mha_l2_variation;
    } else {
      // The inf norm's variation with its rows, token by token (CentredVariation::row_variation).
      BoundOptions bo;
      bo.norm = p;
      bo.threads = threads;
      bo.deadline = deadline;
      const CentredVariation v = CentredVariationBound(mha, cover, bo, ShareOf(deadline, 0.3));
      if (v.complete) {
        in.mha_variation = UpperBound(std::min(in.mha_variation.value(), v.variation.value()));
        in.mha_row_variation_inf = v.row_variation;
      }
    }
    if (mha.wo.rows() == mha.d_model && mha.wo.cols() == mha.d_model) {
      // Norm 2: output token i's rows weighted by ||D_i(yc_i) Wo|| / max_k ||D_k(yc_k) Wo|| in
      // the second order (the other norms have no weighted route).
      const Eigen::VectorXd w = p == NormKind::kL2 ? HeadsRowWeights(L, set.center) : Eigen::VectorXd();
      // In norm 2 only the bound's small per-token factors follow it; in the inf norm the
      // dense centre does, so it keeps half of the time left.
      in.heads_variation = VariationOf(HeadsBeforeWo(mha), cover, p, threads, ShareOf(deadline, 0.35), deadline,
                                       w.size() ? &w : nullptr);
      in.heads_row_weights = w;
    }
    if (p == NormKind::kL2) AddLayerNormRows(L, cover, threads, deadline, &in);
  }
  if (p == NormKind::kL2) {
    in.centre = centre_l2;
  } else {
    AddInfCentre(L, set, inf_dense_limit, std::move(jm), threads, deadline, &in, inf_centre);
  }
  return in;
}

EngineResult PostLnVariationCandidate(const AttentionLayer& L, const InputSet& set, NormKind p,
                                      const Certificate& mha_l2, const Certificate& mha_p, UpperBound centre_l2,
                                      const Eigen::MatrixXd& centre_y, int threads,
                                      std::chrono::steady_clock::time_point deadline, long inf_dense_limit,
                                      int* inf_row) {
  const auto t0 = std::chrono::steady_clock::now();
  EngineResult r{EngineId::kPostLnVariation, UpperBound(kInf), 0, "", false, {}, {}};
  if (inf_row) *inf_row = -1;
  const auto done = [&](EngineResult e) {
    e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return e;
  };
  if (!L.post_ln() || L.layer_norm) {
    r.note = "a post-LN layer without pre-LN only";
    return done(r);
  }
  // Norm 2 without a certified centre the bound takes the crude one, max_k ||D_k|| times a
  // bound on ||I + J_M(X0)||: from MHA's row blocks up to the dense size, else from MHA's own
  // certified centre norm; without either the variation cannot give a bound.
  if (p == NormKind::kL2 && !std::isfinite(centre_l2.value()) &&
      !InfDenseRefusal(long(set.center.size()), inf_dense_limit).empty() &&
      !std::isfinite(MhaPiecesOf(mha_l2).centre.value())) {
    r.note = "no certified centre norm, and no crude one (no row blocks above the dense size, no MHA centre)";
    return done(r);
  }
  const TokenCover cover = CoverOf(set);
  PostLnCentreInfBounds inf_centre;
  const PostLnVariationInputs in = PostLnVariationInputsFor(L, set, p, MhaPiecesOf(mha_l2), MhaPiecesOf(mha_p),
                                                            centre_l2, threads, deadline, inf_dense_limit, &inf_centre);
  // Without the inf centre (above the dense size) the bound takes the crude one from MHA's.
  if (p != NormKind::kL2 && !std::isfinite(in.centre.value()) && !std::isfinite(in.mha_centre.value())) {
    r.note = "inf centre: " + inf_centre.note + ", and no MHA centre for a crude one";
    return done(r);
  }
  if (p != NormKind::kL2 && inf_row) *inf_row = inf_centre.row;
  if (set.radius == 0 && p != NormKind::kL2 && std::isfinite(in.centre.value())) {
    // at a point: the inf centre, enclosure of Y0 included
    r.upper = in.centre;
    r.terms.push_back({"centre norm ||D(Yc)(I + J_M(X0))||", in.centre});
    r.applied = true;
    return done(r);
  }
  PostLnVariationReport rep;
  const EngineBound b = PostLnVariationBound(L, cover, in, DefaultExpBackend(), &rep);
  if (p == NormKind::kL2 && std::isfinite(in.centre.value()) && std::isfinite(b.upper.value()) &&
      !(rep.y_cover.center == centre_y)) {
    r.note = "the Y centre differs from the centre norm's";
    return done(r);
  }
  r.upper = b.upper;
  r.terms = b.terms;
  r.applied = std::isfinite(b.upper.value());
  r.note = b.note;
  return done(r);
}

}  // namespace lipcert
