#include "certify/layer_norm_cover.h"

#include <algorithm>
#include <stdexcept>
#include <cmath>

#include "certify/layer_norm_enclosure.h"
#include "interval/rounding.h"

namespace lipcert {

namespace {
// Sectors of the ball by the step's component along the centre's direction
// (LayerNormVariationInfUp).
constexpr int kInfVariationSectors = 32;
double Sq(double x) { return MulUp(x, x); }
}  // namespace

// sup ||J_LN(x)||_inf over a token's ball of radius rho around x0, where c are the centred
// entries of x0 and sigma >= sigma_lo. Row a of J_LN is gamma_a (e_a - 1/D - xhat_a xhat / D) / sigma,
// whose l1 norm is at most |gamma_a| (2 + |xhat_a| ||xhat||_1 / D) / sigma. Centring is an
// orthogonal projection, so |c_a| <= |c0_a| + rho and ||c||_1 <= ||c0||_1 + sqrt(D) rho; and
// |xhat_a| ||xhat||_1 / D <= sqrt(D) always.
double LayerNormInfNormUp(const LayerNormParams& ln, const std::vector<Interval>& c, double rho, double sigma_lo) {
  const int d = int(c.size());
  double c1 = 0;
  for (const Interval& ca : c) c1 = AddUp(c1, ca.Mag());
  const double l1 = AddUp(c1, MulUp(SqrtUp(double(d)), rho));
  const double cap = SqrtUp(double(d));
  const double denom = MulDown(MulDown(sigma_lo, sigma_lo), double(d));
  double out = 0;
  for (int a = 0; a < d; ++a) {
    const double coupling = std::min(cap, DivUp(MulUp(AddUp(c[a].Mag(), rho), l1), denom));
    out = std::max(out, DivUp(MulUp(std::fabs(ln.gamma(a)), AddUp(2.0, coupling)), sigma_lo));
  }
  return out;
}

// sup over ||y - yc||_2 <= rho of ||J_LN(y) - J_LN(yc)||_inf, row by row. With c the centred
// y, s = ||c||, u = c / s, q = s^2 / D, a = (q + eps)^(-1/2), b = q (q + eps)^(-3/2):
// J_LN(y) = diag(gamma) (a Pi - b u u^T), Pi = I - 11^T/D, so row r of the difference is
//   gamma_r [(a - a0)(e_r - 1/D) - (b u_r u - b0 u0_r u0)],
// and ||e_r - 1/D||_1 = 2 (D - 1) / D. The rank-one part splits two ways,
//   b0 (u_r u - u0_r u0) + (b - b0) u_r u   or   b (u_r u - u0_r u0) + (b - b0) u0_r u0,
// and with du = u - u0, u_r u - u0_r u0 = du_r u + u0_r du = du_r u0 + u_r du
// = du_r u0 + u0_r du + du_r du; every split is a bound, the smallest is taken. In the last,
// |du_r| = x and ||du||_1 <= x + sqrt(D - 1) sqrt(tau^2 - x^2) give
// x (||u0||_1 + |u0_r|) + |u0_r| sqrt(D - 1) sqrt(tau^2 - x^2) <= tau hypot(||u0||_1 + |u0_r|, |u0_r| sqrt(D - 1)).
// The ranges: centring is an orthogonal projection, so c = c0 + e with ||e|| <= rho. The
// ball is cut into sectors by e's component along u0, e.u0 in rho [k1, k2]: there
// p = c.u0 in [s0 + rho k1, s0 + rho k2], the orthogonal part ||e_perp|| <= w = rho sqrt(1 - min k^2),
// s = sqrt(p^2 + ||e_perp||^2), and for p > 0 ||du||^2 = 2 (1 - p / s) = 2 ||e_perp||^2 / (s (s + p)),
// increasing in ||e_perp|| and decreasing in p, so ||du|| <= tau = sqrt(2 w^2 / (S (S + p_lo))),
// S = sqrt(p_lo^2 + w^2) (tau = 2 where p may be <= 0). So the radial change and the turn are
// taken together per sector, not both at their largest. a decreases in q; b rises up to
// q = 2 eps and falls after it, so over [q_lo, q_hi] its range is
// [min(b(q_lo), b(q_hi)), b(clamp(2 eps))]. Every value is an interval evaluation or rounded outward.
double LayerNormVariationInfUp(const LayerNormParams& ln, const Eigen::RowVectorXd& yc, double rho, double centred_lo) {
  const int d = int(yc.size());
  if (d == 0) return 0.0;
  if (!(rho >= 0) || !std::isfinite(rho) || !(ln.eps >= 0)) return kInf;
  const LayerNormRowEnclosure r = EncloseLayerNormRow(ln, yc);
  double s_lo2 = 0, s_hi2 = 0, c1 = 0;
  for (const Interval& c : r.centred) {
    if (!std::isfinite(c.lo) || !std::isfinite(c.hi)) return kInf;
    s_lo2 = AddDown(s_lo2, MulDown(c.Mig(), c.Mig()));
    s_hi2 = AddUp(s_hi2, MulUp(c.Mag(), c.Mag()));
    c1 = AddUp(c1, c.Mag());
  }
  const double s0_lo = SqrtDown(s_lo2), s0_hi = SqrtUp(s_hi2);
  const double ball_lo = std::max({0.0, SubDown(s0_lo, rho), centred_lo}), ball_hi = AddUp(s0_hi, rho);
  if (!std::isfinite(ball_hi)) return kInf;
  const Interval dd{double(d)}, eps{ln.eps};
  const auto q_of = [&](const Interval& s) { return Sqr(s) / dd; };
  if (!(AddDown(q_of(Interval(ball_lo)).lo, ln.eps) > 0)) return kInf;  // the variance may vanish
  const auto a_of = [&](double q_from, double q_to) { return InvSqrt(Interval(q_from, q_to) + eps); };
  const auto b_of = [&](double q_from, double q_to) {
    const Interval q(q_from, q_to), inv = InvSqrt(q + eps);
    return q * (inv * inv * inv);
  };
  const Interval q0 = q_of(Interval(s0_lo, s0_hi));
  const Interval a0 = a_of(q0.lo, q0.hi), b0 = b_of(q0.lo, q0.hi);
  const double sqrt_d = SqrtUp(double(d)), sqrt_d1 = SqrtUp(double(d - 1));
  const double u0_l1 = s0_lo > 0 ? std::min(sqrt_d, DivUp(c1, s0_lo)) : sqrt_d;  // >= ||u0||_1
  const double pi_row = DivUp(2.0 * double(d - 1), double(d));
  std::vector<double> u0_mag(static_cast<size_t>(d));  // >= |u0_r|
  for (int a = 0; a < d; ++a) u0_mag[size_t(a)] = s0_lo > 0 ? std::min(1.0, DivUp(r.centred[size_t(a)].Mag(), s0_lo)) : 1.0;
  // The largest row bound where s lies in [s_lo, s_hi] and ||u - u0|| <= tau.
  const auto rows_up = [&](double s_lo, double s_hi, double tau) {
    s_lo = std::max(s_lo, ball_lo), s_hi = std::min(s_hi, ball_hi);
    if (s_lo > s_hi) return 0.0;  // (only by rounding: the sector meets the ball)
    tau = std::min(tau, 2.0);
    const double q_lo = q_of(Interval(s_lo)).lo, q_hi = q_of(Interval(s_hi)).hi;
    const double da = std::max({SubUp(a_of(q_lo, q_lo).hi, a0.lo), SubUp(a0.hi, a_of(q_hi, q_hi).lo), 0.0});
    const double q_peak = std::clamp(2.0 * ln.eps, q_lo, q_hi);
    const double b_max = b_of(q_peak, q_peak).hi;
    const double b_min = std::max(0.0, std::min(b_of(q_lo, q_lo).lo, b_of(q_hi, q_hi).lo));
    const double db = std::max({SubUp(b_max, b0.lo), SubUp(b0.hi, b_min), 0.0});
    if (!std::isfinite(da) || !std::isfinite(db) || !std::isfinite(b_max) || !std::isfinite(b0.hi)) return kInf;
    const double u_l1 = std::min(sqrt_d, AddUp(u0_l1, MulUp(sqrt_d, tau)));  // >= ||u||_1
    const double du_l1 = std::min(MulUp(sqrt_d, tau), AddUp(u_l1, u0_l1));   // >= ||du||_1
    const double radial = MulUp(da, pi_row);
    double out = 0;
    for (int a = 0; a < d; ++a) {
      const double m0 = u0_mag[size_t(a)];
      const double mu = std::min(1.0, AddUp(m0, tau));  // >= |u_r|
      const double du = std::min(tau, AddUp(1.0, m0));  // >= |du_r|
      const double hyp = SqrtUp(AddUp(Sq(AddUp(u0_l1, m0)), Sq(MulUp(m0, sqrt_d1))));
      const double turn = std::min({AddUp(MulUp(du, u_l1), MulUp(m0, du_l1)), AddUp(MulUp(du, u0_l1), MulUp(mu, du_l1)),
                                    AddUp(MulUp(tau, hyp), MulUp(du, du_l1))});
      const double centre_first = AddUp(MulUp(b0.hi, turn), MulUp(db, MulUp(mu, u_l1)));
      const double moved_first = AddUp(MulUp(b_max, turn), MulUp(db, MulUp(m0, u0_l1)));
      out = std::max(out, MulUp(std::fabs(ln.gamma(a)), AddUp(radial, std::min(centre_first, moved_first))));
    }
    return out;
  };
  if (!(s0_lo > 0)) return rows_up(ball_lo, ball_hi, 2.0);
  double out = 0;
  for (int k = 0; k < kInfVariationSectors; ++k) {
    // e.u0 in rho [k1, k2] (k1, k2 exact: multiples of 2 / kInfVariationSectors).
    const double k1 = -1.0 + 2.0 * k / kInfVariationSectors, k2 = -1.0 + 2.0 * (k + 1) / kInfVariationSectors;
    const double p_lo = AddDown(s0_lo, MulDown(rho, k1)), p_hi = AddUp(s0_hi, MulUp(rho, k2));
    const double k_min = k1 <= 0 && k2 >= 0 ? 0.0 : std::min(std::fabs(k1), std::fabs(k2));
    const double w = MulUp(rho, SqrtUp(std::max(0.0, SubUp(1.0, MulDown(k_min, k_min)))));
    const double s_lo = p_lo > 0 ? p_lo : p_hi < 0 ? -p_hi : 0.0;
    const double p_abs = std::max(std::fabs(p_lo), std::fabs(p_hi));
    const double s_hi = SqrtUp(AddUp(MulUp(p_abs, p_abs), MulUp(w, w)));
    double tau = 2.0;
    if (p_lo > 0) {
      const double big_s = SqrtDown(AddDown(MulDown(p_lo, p_lo), MulDown(w, w)));
      tau = SqrtUp(DivUp(MulUp(2.0, MulUp(w, w)), MulDown(big_s, AddDown(big_s, p_lo))));
    }
    out = std::max(out, rows_up(s_lo, s_hi, tau));
  }
  return out;
}

// J_LN(x0) = diag(gamma) (I - 11^T/D - xhat xhat^T / D) / sigma0, enclosed as
// diag(gamma s) - U V^T with s = 1/sigma0, U = [gamma s / D, gamma s xhat / D] and
// V = [1, xhat] (D x 2): one enclosed rank-2 product (O(D^2) vectorised work) instead of
// D^2 interval expressions, which took tens of seconds per layer at BERT-base size.
IntervalMatrix LayerNormJacobianEnclosure(const Eigen::VectorXd& gamma, const std::vector<Interval>& xhat,
                                          const Interval& inv_sigma, const Interval& inv_d) {
  const int d = int(gamma.size());
  Eigen::MatrixXd u_lo(d, 2), u_hi(d, 2), v_lo(d, 2), v_hi(d, 2);
  for (int a = 0; a < d; ++a) {
    const Interval u0 = Interval(gamma(a)) * inv_sigma * inv_d, u1 = u0 * xhat[size_t(a)];
    u_lo(a, 0) = u0.lo, u_hi(a, 0) = u0.hi, u_lo(a, 1) = u1.lo, u_hi(a, 1) = u1.hi;
    v_lo(a, 0) = v_hi(a, 0) = 1.0;
    v_lo(a, 1) = xhat[size_t(a)].lo, v_hi(a, 1) = xhat[size_t(a)].hi;
  }
  IntervalMatrix m = Mul(IntervalMatrix::FromBounds(u_lo, u_hi), IntervalMatrix::FromBounds(v_lo, v_hi).transpose());
  m.mid = -m.mid;
  for (int a = 0; a < d; ++a) {
    const Interval e = m(a, a) + Interval(gamma(a)) * inv_sigma;
    const IntervalMatrix diag =
        IntervalMatrix::FromBounds(Eigen::MatrixXd::Constant(1, 1, e.lo), Eigen::MatrixXd::Constant(1, 1, e.hi));
    m.mid(a, a) = diag.mid(0, 0);
    m.rad(a, a) = diag.rad(0, 0);
  }
  return m;
}

IntervalMatrix LayerNormProjectionTimes(const LayerNormParams& ln, const Eigen::RowVectorXd& y, const IntervalMatrix& a,
                                        std::vector<Interval>* row_gain) {
  const int d = int(y.size());
  if (a.rows() != d) throw std::invalid_argument("LayerNormProjectionTimes: A needs D rows");
  const LayerNormRowEnclosure r = EncloseLayerNormRow(ln, y);
  const Interval inv_d = Interval(1.0) / Interval(double(d));
  Eigen::MatrixXd w_lo(d, 2), w_hi(d, 2), v_lo(d, 2), v_hi(d, 2);
  row_gain->resize(size_t(d));
  for (int k = 0; k < d; ++k) {
    const Interval& x = r.xhat[size_t(k)];
    const Interval w1 = x * inv_d;
    w_lo(k, 0) = inv_d.lo, w_hi(k, 0) = inv_d.hi, w_lo(k, 1) = w1.lo, w_hi(k, 1) = w1.hi;
    v_lo(k, 0) = v_hi(k, 0) = 1.0;
    v_lo(k, 1) = x.lo, v_hi(k, 1) = x.hi;
    (*row_gain)[size_t(k)] = Interval(ln.gamma(k)) / r.sigma;
  }
  const IntervalMatrix vt_a = Mul(IntervalMatrix::FromBounds(v_lo, v_hi).transpose(), a);
  return a - Mul(IntervalMatrix::FromBounds(w_lo, w_hi), vt_a);
}

MhaInput MhaInputOver(const AttentionLayer& L, const TokenCover& cover, NormKind p) {
  MhaInput m;
  const int n = int(cover.center.rows()), d = int(cover.center.cols());
  m.ell = Eigen::VectorXd::Ones(n);
  m.delta_ln = Eigen::VectorXd::Zero(n);
  if (!L.layer_norm) {
    m.zc = cover.center;
    m.rho_z = cover.radius;
    m.joint_z = JointRadiusUp(cover).value();
    return m;
  }
  m.residual = true;
  const LayerNormParams& ln = *L.layer_norm;
  const double gmax = ln.gamma.cwiseAbs().maxCoeff();
  const Interval dd{double(d)};
  const double sqrt_d_lo = SqrtDown(double(d));
  m.zc.resize(n, d);
  m.rho_z.resize(n);
  // ||z_j - zc_j|| <= ell_j ||x_j - x0_j|| + err_j, so ||Z - Zc||_F <= max_j ell_j ||X - X0||_F + ||err||.
  double ell_joint = 0, err_joint2 = 0;
  for (int j = 0; j < n; ++j) {
    const LayerNormRowEnclosure r = EncloseLayerNormRow(ln, cover.center.row(j));
    const std::vector<Interval>& c = r.centred;
    const Interval& sigma0 = r.sigma;
    double cn_lo2 = 0, cn_hi2 = 0;
    for (int a = 0; a < d; ++a) {
      cn_lo2 = AddDown(cn_lo2, MulDown(c[a].Mig(), c[a].Mig()));
      cn_hi2 = AddUp(cn_hi2, MulUp(c[a].Mag(), c[a].Mag()));
    }
    const double rho = cover.radius(j);
    const double cn_lo = SqrtDown(cn_lo2), cn_hi = SqrtUp(cn_hi2);
    const double shrunk = std::max({0.0, SubDown(cn_lo, rho), CentredLo(cover, j)});
    const double sigma_lo = SqrtDown(AddDown(DivDown(MulDown(shrunk, shrunk), double(d)), ln.eps));
    const double grown = AddUp(cn_hi, rho);
    const double sigma_hi = SqrtUp(AddUp(DivUp(MulUp(grown, grown), double(d)), ln.eps));
    const double ell2 = DivUp(gmax, sigma_lo);
    m.ell(j) = p == NormKind::kL2 ? ell2 : LayerNormInfNormUp(ln, c, rho, sigma_lo);
    // Centre z0 = gamma * c / sigma0 + beta, enclosed; the cover's centre is its midpoint.
    const std::vector<Interval>& xhat = r.xhat;
    double err2 = 0;
    for (int a = 0; a < d; ++a) {
      const Interval& z = r.z[a];
      const double mid = 0.5 * z.lo + 0.5 * z.hi;
      m.zc(j, a) = mid;
      const double e = std::max(SubUp(z.hi, mid), SubUp(mid, z.lo));
      err2 = AddUp(err2, MulUp(e, e));
    }
    m.rho_z(j) = AddUp(MulUp(ell2, rho), SqrtUp(err2));
    ell_joint = std::max(ell_joint, ell2);
    err_joint2 = AddUp(err_joint2, err2);
    // ||J_LN(x) - J_LN(x0)||_2 <= max|gamma| [(1/sigma_lo - 1/sigma_hi) + 2 rho / (sigma_lo^2 sqrt(D))].
    const double t1 = SubUp(DivUp(1.0, sigma_lo), DivDown(1.0, sigma_hi));
    const double t2 = DivUp(MulUp(2.0, rho), MulDown(MulDown(sigma_lo, sigma_lo), sqrt_d_lo));
    m.delta_ln(j) = MulUp(gmax, AddUp(std::max(t1, 0.0), t2));
    m.ln_jac.push_back(LayerNormJacobianEnclosure(ln.gamma, xhat, Interval(1.0) / sigma0, Interval(1.0) / dd));
  }
  m.joint_z = AddUp(MulUp(ell_joint, JointRadiusUp(cover).value()), SqrtUp(err_joint2));
  return m;
}

TokenCover MhaInputCover(const AttentionLayer& layer, const TokenCover& cover, double* ell_max) {
  const MhaInput in = MhaInputOver(layer, cover, NormKind::kL2);
  if (ell_max) *ell_max = in.ell.maxCoeff();
  return TokenCover{in.zc, in.rho_z, UpperBound(in.joint_z), {}};
}

// sup over ||y - yc|| <= rho of ||J_LN(y) - J_LN(yc)||_2 (docs/engines.md, "Post-LN variation").
// With c the centred y, s = ||c||, u = c / s, sigma = sqrt(s^2 / D + eps), a = 1/sigma and
// b = s^2 / (D sigma^3): J_LN(y) = diag(gamma) (a Pi - b u u^T), Pi = I - 11^T/D, u ⊥ 1. So
//   J_LN(y) - J_LN(yc) = diag(gamma) [(a - a0)(Pi - u u^T) + ((a - b) - (a0 - b0)) u u^T - b0 (u u^T - u0 u0^T)],
// the first two on orthogonal ranges, ||u u^T - u0 u0^T|| = sin(angle) <= rho / s0 (centring is
// an orthogonal projection: ||c - c0|| <= rho), a and a - b = eps / sigma^3 decreasing in s,
// s in [s0 - rho, s0 + rho]. Hence
//   ||.|| <= max|gamma| [max(a(s0 - rho) - a0, a0 - a(s0 + rho), eps (sigma_lo^-3 - sigma_hi^-3)) + b0 min(1, rho / s0)].
double LayerNormVariationUp(const LayerNormParams& ln, const Eigen::RowVectorXd& yc, double rho, double centred_lo) {
  const int d = int(yc.size());
  const LayerNormRowEnclosure r = EncloseLayerNormRow(ln, yc);
  double s_lo2 = 0, s_hi2 = 0;
  for (const Interval& c : r.centred) {
    s_lo2 = AddDown(s_lo2, MulDown(c.Mig(), c.Mig()));
    s_hi2 = AddUp(s_hi2, MulUp(c.Mag(), c.Mag()));
  }
  const double s0_lo = SqrtDown(s_lo2), s0_hi = SqrtUp(s_hi2);
  const auto sig_up = [&](double s) { return SqrtUp(AddUp(DivUp(MulUp(s, s), double(d)), ln.eps)); };
  const auto sig_down = [&](double s) { return SqrtDown(AddDown(DivDown(MulDown(s, s), double(d)), ln.eps)); };
  const double shrunk = std::max({0.0, SubDown(s0_lo, rho), centred_lo}), grown = AddUp(s0_hi, rho);
  const double sigma_lo = sig_down(shrunk), sigma_hi = sig_up(grown);
  const double sigma0_lo = std::max(sig_down(s0_lo), r.sigma.lo), sigma0_hi = std::min(sig_up(s0_hi), r.sigma.hi);
  const double a_drop = SubUp(DivUp(1.0, sigma_lo), DivDown(1.0, sigma0_hi));
  const double a_rise = SubUp(DivUp(1.0, sigma0_lo), DivDown(1.0, sigma_hi));
  const auto cube_up = [](double x) { return MulUp(MulUp(x, x), x); };
  const auto cube_down = [](double x) { return MulDown(MulDown(x, x), x); };
  const double eps_part = MulUp(ln.eps, SubUp(DivUp(1.0, cube_down(sigma_lo)), DivDown(1.0, cube_up(sigma_hi))));
  const double radial = std::max({a_drop, a_rise, eps_part, 0.0});
  // b0 = s0^2 / (D sigma0^3) <= 1 / sigma0 (s0^2 / D <= sigma0^2).
  const double b0 = std::min(DivUp(1.0, sigma0_lo), DivUp(MulUp(s0_hi, s0_hi), MulDown(double(d), cube_down(sigma0_lo))));
  const double turn = s0_lo > 0 ? std::min(1.0, DivUp(rho, s0_lo)) : 1.0;
  return MulUp(ln.gamma.cwiseAbs().maxCoeff(), AddUp(radial, MulUp(b0, turn)));
}

}  // namespace lipcert
