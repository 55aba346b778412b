// The moving token's own row as one quadratic form over the cover (docs/engines.md, "The
// moving token's own row"), and its largest eigenvalue summed over the heads.
#include "certify/variation/internal.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "interval/elementary.h"
#include "interval/norms.h"
#include "interval/parallel.h"
#include "interval/softmax.h"

namespace lipcert {

using namespace variation_internal;

// >= ||x||_2 (NormUpOfMagnitudes: one floating sum of squares with a gamma_d bound).
static double NormUp(const Eigen::RowVectorXd& x) {
  return NormUpOfMagnitudes(x.cwiseAbs().transpose(), VectorNorm::kTwo);
}

// Row i's quantities at the centre that its parts share (OwnRowFormUp): the centre's weights w
// (s = sum w) and the anchor's mean, g_i and its radius, the weights' range dp at i and per key
// (dev), the radii of b, the motion's scales, and the rows b_l - c centred at c = (w m) / s with
// their rounding, whose weighted sums bound eps (the weights' range).
struct OwnRowCentre {
  Eigen::RowVectorXd w, mean, g;
  double s = 0, mean_abs_norm = 0, g_norm = 0, g_rad = 0, dp = 0, p_i = 0, inv_sqrt_dk = 0;
  Eigen::VectorXd b_rad, dev, m_norm;
  double rad_moved = 0, rho_moved = 0, key_move = 0, query_move = 0;
  Eigen::MatrixXd centred;
  Eigen::VectorXd centred_err, centred_norm;
  double dev_sum = 0, eps_norm = 0, eps_rounding = 0, one_minus_s = 0;
};

OwnRowCentre OwnRowCentreOf(const HeadGeometry& G, const FactorBounds& F, const Eigen::VectorXd& rho, int i, int len) {
  const int d = int(G.b.mid.cols());
  const Eigen::MatrixXd& m = G.b.mid;
  OwnRowCentre C;
  C.w = G.anchor_w.row(i).head(len);
  const Eigen::RowVectorXd& w = C.w;
  C.s = w.sum();
  const double s = C.s;
  const Eigen::RowVectorXd mean = w * m.topRows(len), mean_abs = w * m.topRows(len).cwiseAbs();
  C.mean = mean;
  C.mean_abs_norm = NormUp(mean_abs);
  C.g = G.g.mid.row(i);
  C.g_norm = NormUp(C.g);
  C.g_rad = NormUp(G.g.rad.row(i));
  // |gamma_k - ([k = i] - w_i)| <= dp, and |gamma_k| <= 1 - p_lo (k = i) or p_hi (k != i).
  C.dp = std::max({0.0, SubUp(F.p_hi(i, i), w(i)), SubUp(w(i), F.p_lo(i, i))});
  C.p_i = F.p_hi(i, i);
  C.inv_sqrt_dk = G.inv_sqrt_dk.hi;
  // The centre's parts of the anchor's excess: radii (each and their mean) and the weights' range.
  C.b_rad.resize(len);
  C.dev.resize(len);
  for (int k = 0; k < len; ++k) {
    C.b_rad(k) = NormUp(G.b.rad.row(k));
    C.dev(k) = std::max({0.0, SubUp(F.p_hi(i, k), w(k)), SubUp(w(k), F.p_lo(i, k))});
  }
  C.m_norm.resize(len);
  for (int l = 0; l < len; ++l) C.m_norm(l) = NormUp(m.row(l));
  const Eigen::VectorXd cap = F.p_hi.row(i).head(len).transpose();
  C.rad_moved = SimplexWeightedSumUp(cap, C.b_rad, len);
  C.rho_moved = SimplexWeightedSumUp(cap, rho.head(len), len);
  C.key_move = MulUp(G.wk_norm, C.inv_sqrt_dk);
  C.query_move = MulUp(G.wq_norm, C.inv_sqrt_dk);
  // The weights' range: sum_l (P_l - w_l)(b_k - b_l) = (1 - s)(b_k - c) - eps with
  // eps = sum_l (P_l - w_l)(b_l - c) . U the same for every k, c = (w m) / s, and
  // eps^2 <= (sum_l dev_l) sum_l dev_l (fl(b_l - c) . U)^2 plus its rounding (into z).
  const Eigen::RowVectorXd c_mean = C.mean / s;
  C.centred.resize(len, d);
  C.centred_err.resize(len);
  C.centred_norm.resize(len);
  for (int l = 0; l < len; ++l) {
    C.centred.row(l) = m.row(l) - c_mean;
    const double f = C.centred_norm(l) = NormUp(C.centred.row(l));
    // fl(m_l - c) against m_l - exact c: c's own rounding (division and the product's, gamma_{n+1})
    // and the subtraction's, generously.
    C.centred_err(l) = AddUp(MulUp(2 * kUnitRoundoff, AddUp(f, C.m_norm(l))),
                             MulUp(MulUp(2.0, GammaUp(double(len) + 2)), DivUp(C.mean_abs_norm, s * (1 - 1e-15))));
    C.dev_sum = AddUp(C.dev_sum, C.dev(l));
    C.eps_norm = AddUp(C.eps_norm, MulUp(C.dev(l), f));
    C.eps_rounding = AddUp(C.eps_rounding, MulUp(C.dev(l), C.centred_err(l)));
  }
  C.one_minus_s = std::max(SubUp(1.0, s), SubUp(s, 1.0));
  return C;
}

// Each row's parts: x (floating), and the scales of y along g, m along Wq U and Wk U, eps along
// the centred rows and z (isotropic).
struct OwnRowParts {
  Eigen::RowVectorXd x;
  double x_norm = 0, y_norm = 0, mq = 0, mk = 0, mq_norm = 0, mk_norm = 0, e = 0, total = 0;
};

std::vector<OwnRowParts> OwnRowPartsOf(const HeadGeometry& G, const FactorBounds& F, const Eigen::VectorXd& rho,
                                       const OwnRowCentre& C, int i, int len) {
  const int n = int(rho.size()), d = int(G.b.mid.cols());
  const Eigen::MatrixXd& m = G.b.mid;
  const double s = C.s;
  std::vector<OwnRowParts> parts(len);
  for (int k = 0; k < len; ++k) {
    OwnRowParts& P = parts[k];
    const double gamma = (k == i ? 1.0 : 0.0) - C.w(i);
    const Eigen::RowVectorXd beta = s * m.row(k) - C.mean;
    P.x = beta + gamma * C.g;
    const double beta_norm = NormUp(beta);
    P.x_norm = NormUp(P.x);
    // z: the anchor's rounding, gamma g's rounding (product and sum: 2u each, generously), the
    // radii of b_k, of the mean and of g_i, and eps's and (1 - s)'s shares.
    double e = AddUp(AnchorRoundingUp(s, C.m_norm(k), C.mean_abs_norm, n, d),
                     MulUp(4 * kUnitRoundoff, AddUp(beta_norm, MulUp(std::abs(gamma), C.g_norm))));
    const double gamma_max = k == i ? SubUp(1.0, F.p_lo(i, i)) : C.p_i;
    e = AddUp(e, AddUp(AddUp(C.b_rad(k), C.rad_moved), MulUp(gamma_max, C.g_rad)));
    P.e = AddUp(e, AddUp(MulUp(C.one_minus_s, AddUp(C.centred_norm(k), C.centred_err(k))), C.eps_rounding));
    P.y_norm = MulUp(C.dp, C.g_norm);
    P.mq = MulUp(C.key_move, AddUp(rho(k), C.rho_moved));
    P.mk = MulUp(MulUp(gamma_max, C.query_move), rho(i));
    P.mq_norm = MulUp(P.mq, G.wq_norm);
    P.mk_norm = MulUp(P.mk, G.wk_norm);
    P.total = AddUp(AddUp(AddUp(P.x_norm, P.y_norm), AddUp(P.mq_norm, P.mk_norm)), AddUp(P.e, C.eps_norm));
  }
  return parts;
}

// The shared rows' weights of the parts (g, Wq U, Wk U) before T3's.
struct SharedWeights {
  double g = 0, q = 0, k = 0;
};

// The form's rows (x of each key, g, the centred rows), its rounding err2 and the parts' share
// of iso, with T2's split theta2; returns the shared rows' weights.
SharedWeights AddPartRows(const FactorBounds& F, const OwnRowCentre& C, const std::vector<OwnRowParts>& parts,
                          double theta2, int i, int len, OwnRowForm& out, double& err2) {
  const int d = int(C.centred.cols());
  const double dp = C.dp, p_i = C.p_i, eps_norm = C.eps_norm;
  double eps_weight = 0;
  out.rows.resize(len + 1 + len, d);
  // Appends sqrt(c) x as a row (its product rounding, u per entry, goes into err).
  int row = 0;
  auto add_row = [&](double c, const Eigen::RowVectorXd& x) {
    out.rows.row(row) = SqrtUp(c) * x;
    const double row_norm = NormUp(out.rows.row(row));
    err2 = AddUp(err2, MulUp(MulUp(row_norm, kUnitRoundoff), MulUp(row_norm, kUnitRoundoff)));
    ++row;
  };
  double g_weight = 0, q_weight = 0, k_weight = 0;  // the shared rows' weights
  for (int k = 0; k < len; ++k) {
    const OwnRowParts& P = parts[k];
    const double c = k == i ? AddUp(F.pa(i, k), MulUp(theta2, p_i)) : F.pa(i, k);
    if (P.x_norm > 0) {
      add_row(MulUp(c, DivUp(P.total, P.x_norm)), P.x);
    } else {
      out.rows.row(row++).setZero();
    }
    if (P.y_norm > 0) g_weight = AddUp(g_weight, MulUp(MulUp(c, MulUp(dp, dp)), DivUp(P.total, P.y_norm)));
    if (P.mq_norm > 0) q_weight = AddUp(q_weight, MulUp(MulUp(c, MulUp(P.mq, P.mq)), DivUp(P.total, P.mq_norm)));
    if (P.mk_norm > 0) k_weight = AddUp(k_weight, MulUp(MulUp(c, MulUp(P.mk, P.mk)), DivUp(P.total, P.mk_norm)));
    if (eps_norm > 0) eps_weight = AddUp(eps_weight, MulUp(c, DivUp(P.total, eps_norm)));
    if (P.e > 0) out.iso = AddUp(out.iso, MulUp(c, MulUp(P.e, P.total)));
  }
  add_row(g_weight, C.g);
  for (int l = 0; l < len; ++l) add_row(MulUp(MulUp(eps_weight, C.dev_sum), C.dev(l)), C.centred.row(l));
  return SharedWeights{g_weight, q_weight, k_weight};
}

OwnRowForm OwnRowFormUp(const HeadGeometry& G, const FactorBounds& F, const Eigen::VectorXd& rho, bool causal, int i) {
  const int n = int(rho.size());
  const int len = causal ? i + 1 : n;
  OwnRowForm out;
  if (!G.dot || G.anchor_w.rows() != n || G.causal != causal || !std::isfinite(G.value_iso)) {
    out.iso = kInf;  // no form: the scalar bound stands
    return out;
  }
  // Token i moves by U alone. Row i's logit motion is delta_k = b_k . U + [k = i] g_i . U, so
  // delta_k - delta_bar = r_k . U with r_k = (b_k - bbar_i) + gamma_k g_i, gamma_k = [k = i] - P_i,
  // and the row's second derivative is
  //   T1 = sum_k P_k a_k (r_k . U)^2,   T2 = 2 P_i (r_i . U) W_h U,   T3 = 2 P_i a_i (Wq U).(Wk U) / sqrt(dk),
  // so ||d^2 out_i|| <= sum_k pa_k (r_k . U)^2 + p_i (theta2 (r_i . U)^2 + ||W_h U||^2 / theta2)
  //                     + pa_i / sqrt(dk) (theta3 ||Wq U||^2 + ||Wk U||^2 / theta3).
  // Over the cover, r_k . U = x . U + y + m + z with x = fl(rhat_k) at the centre's weights w,
  //  - y = -(P_i - w_i) g_i0 . U: |y| <= dp |g_i0 . U| (one direction for all k),
  //  - m: the motion, b_k - b_l = Wq^T Wk (z_k - z_l) / sqrt(dk) and g_i = Wk^T Wq z_i / sqrt(dk) + ...,
  //    so |m| <= (||Wk|| (rho_k + sum_l P_l rho_l) ||Wq U|| + |gamma_k| ||Wq|| rho_i ||Wk U||) / sqrt(dk),
  //  - z: the rest, |z| <= e (the anchor's rounding, sum_l (P_l - w_l)(b_k - b_l) at the centre, the
  //    enclosures' radii),
  // and (sum of parts)^2 <= sum part^2 / a_part for a_part >= 0 summing to 1, each a_part in
  // proportion to its norm. The g, Wq and Wk parts of all rows (and T3) share their rows.
  const OwnRowCentre C = OwnRowCentreOf(G, F, rho, i, len);
  const std::vector<OwnRowParts> parts = OwnRowPartsOf(G, F, rho, C, i, len);
  const double p_i = C.p_i, inv_sqrt_dk = C.inv_sqrt_dk;
  const double value_norm = G.value_norm;
  // T2's split: theta2 balances r_i's scale against ||W_h|| (any theta2 > 0 holds).
  const double theta2 = parts[i].total > 0 && G.w_norm > 0 ? G.w_norm / parts[i].total : 1.0;
  double err2 = 0;
  const SharedWeights shared = AddPartRows(F, C, parts, theta2, i, len, out, err2);
  // T2's values: (p_i / theta2) ((||A U|| + value_err)^2 + value_iso), the same split.
  const double c2 = DivUp(p_i, theta2 * (1 - 1e-15));
  out.iso = AddUp(out.iso, MulUp(c2, G.value_iso));
  const double value_total = AddUp(value_norm, G.value_err);
  if (value_norm > 0) out.value_weight = MulUp(c2, DivUp(value_total, value_norm));
  out.iso = AddUp(out.iso, MulUp(c2, MulUp(G.value_err, value_total)));
  // T3 (theta3 balancing the weights' norms), with the motion's shares: the exact weights.
  const double c3 = MulUp(F.pa(i, i), inv_sqrt_dk);
  const double theta3 = G.wq_norm > 0 && G.wk_norm > 0 ? G.wk_norm / G.wq_norm : 1.0;
  out.q_weight = AddUp(shared.q, MulUp(c3, theta3));
  out.k_weight = AddUp(shared.k, DivUp(c3, theta3 * (1 - 1e-15)));
  out.err = MulUp(SqrtUp(err2), 1.0 + 1e-10);
  return out;
}

double OwnRowUp(const std::vector<HeadGeometry>& geo, const std::vector<FactorBounds>& factors,
                const Eigen::VectorXd& rho, bool causal, int j, int threads) {
  const int heads = int(geo.size());
  std::vector<OwnRowForm> forms(heads);
  ParallelFor(heads, WorkerCount(threads, heads),
              [&](int h, int) { forms[h] = OwnRowFormUp(geo[h], factors[h], rho, causal, j); });
  Eigen::Index rows = 0;
  for (const OwnRowForm& f : forms) {
    if (!std::isfinite(f.iso)) return kInf;  // a head without a form: nothing to refine
    rows += f.rows.rows();
  }
  Eigen::MatrixXd stacked(rows, geo[0].b.mid.cols());
  double err2 = 0, iso = 0;
  rows = 0;
  for (const OwnRowForm& f : forms) {
    if (f.rows.rows() > 0) stacked.middleRows(rows, f.rows.rows()) = f.rows;
    rows += f.rows.rows();
    err2 = AddUp(err2, MulUp(f.err, f.err));
    iso = AddUp(iso, f.iso);
  }
  // U^T S U with S = the stacked rows' Gram and the heads' weighted fixed Grams; the rows'
  // rounding err: (||rows U|| + err)^2 <= (1 + phi) ||rows U||^2 + (1 + 1/phi) err^2.
  constexpr double kPhi = 1e-6;
  // The rows' Gram in one floating product (the lower triangle by a symmetric rank-k update,
  // mirrored): |fl(S^T S) - S^T S|_ab <= gamma_k sum_r |s_ra||s_rb| <= gamma_k ||col a|| ||col b||
  // (k rows), plus k eta for underflow, so that enclosure's radius has rho <= gamma_k ||col||^2
  // + D k eta, and |mid| <= ||col a|| ||col b|| + rad.
  const Eigen::Index d = stacked.cols();
  Eigen::MatrixXd mid = Eigen::MatrixXd::Zero(d, d);
  mid.selfadjointView<Eigen::Lower>().rankUpdate(stacked.transpose());
  mid.triangularView<Eigen::StrictlyUpper>() = mid.transpose();
  double col2 = 0;
  for (Eigen::Index a = 0; a < d; ++a) {
    const double c = NormUp(stacked.col(a).transpose());
    col2 = AddUp(col2, MulUp(c, c));
  }
  const double k = double(stacked.rows());
  const double rows_rad = AddUp(MulUp(GammaUp(k), col2), MulUp(double(d), MulUp(k, kEta)));
  std::vector<std::pair<double, GramSpread>> spreads = {{1.0 + kPhi, GramSpread{rows_rad, AddUp(col2, rows_rad)}}};
  mid *= 1.0 + kPhi;  // its rounding is the sum's (below)
  // The heads' fixed Grams with their weights c >= 0 (NaN: no bound), added column by column
  // (a column's sum stays in cache while the terms are added).
  std::vector<std::pair<double, const IntervalMatrix*>> fixed;
  for (int h = 0; h < heads; ++h) {
    fixed.push_back({forms[h].value_weight, &geo[h].value_gram});
    fixed.push_back({forms[h].q_weight, &geo[h].wq_gram});
    fixed.push_back({forms[h].k_weight, &geo[h].wk_gram});
    spreads.push_back({forms[h].value_weight, geo[h].value_spread});
    spreads.push_back({forms[h].q_weight, geo[h].wq_spread});
    spreads.push_back({forms[h].k_weight, geo[h].wk_spread});
  }
  for (const auto& [c, g] : fixed)
    if (std::isnan(c)) return kInf;
  for (Eigen::Index col = 0; col < d; ++col)
    for (const auto& [c, g] : fixed)
      if (c > 0) mid.col(col) += c * g->mid.col(col);
  // S = mid + E with E symmetric: |E| <= sum_t c_t rad_t + gamma sum_t c_t |mid_t| (the weighted
  // sum's rounding, T terms and the products: gamma_{2T+4}, generously), so by Weyl
  // lambda_max(S) <= lambda_max(mid) + ||E||_2, ||E||_2 <= sum_t c_t (rho(rad_t) + gamma || |mid_t| ||_2).
  const double g = GammaUp(2.0 * double(spreads.size()) + 4);
  double spread = 0;
  for (const auto& [c, s] : spreads)
    if (c > 0) spread = AddUp(spread, MulUp(c, AddUp(s.rad, MulUp(g, s.abs_mid))));
  const double lambda = LambdaMaxUpper(IntervalMatrix::Point(mid)).value();
  return AddUp(AddUp(lambda, spread), AddUp(iso, MulUp(1.0 + 1.0 / kPhi, err2)));
}

}  // namespace lipcert
