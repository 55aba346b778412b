#include "certify/taylor.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "interval/interval.h"
#include "interval/interval_matrix.h"
#include "interval/norms.h"
#include "interval/rounding.h"
#include "interval/softmax.h"

namespace lipcert {
namespace {

// Upper bounds on the 2-norms of the rows of the enclosure a (|mid| + rad per entry).
Eigen::VectorXd RowNormsUp(const IntervalMatrix& a) {
  Eigen::VectorXd out(a.rows());
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    double s = 0;
    for (Eigen::Index j = 0; j < a.cols(); ++j) {
      const double m = AddUp(std::fabs(a.mid(i, j)), a.rad(i, j));
      s = AddUp(s, MulUp(m, m));
    }
    out(i) = SqrtUp(s);
  }
  return out;
}

// x0 W^T + bias, enclosed (rounding only).
IntervalMatrix Project(const Eigen::MatrixXd& x0, const Eigen::MatrixXd& w, const Eigen::VectorXd& bias) {
  IntervalMatrix out = Mul(x0, Eigen::MatrixXd(w.transpose()));
  if (bias.size() == 0) return out;
  return out + IntervalMatrix::Point(Eigen::MatrixXd(bias.transpose().replicate(x0.rows(), 1)));
}

// The enclosure a widened row by row: row i by radius(i) * norm (every entry).
IntervalMatrix Widen(IntervalMatrix a, const Eigen::VectorXd& radius, double norm) {
  for (Eigen::Index i = 0; i < a.rows(); ++i)
    for (Eigen::Index c = 0; c < a.cols(); ++c) a.rad(i, c) = AddUp(a.rad(i, c), MulUp(radius(i), norm));
  return a;
}

// Row norms of (a - 1 abar^T) w^T, abar the floating mean of a's midpoint rows (any fixed
// vector is sound: the cumulants do not see a shift common to a row's entries).
Eigen::VectorXd CentredRowNormsUp(const IntervalMatrix& a, const Eigen::MatrixXd& w) {
  const Eigen::RowVectorXd mean = a.mid.colwise().mean();
  const IntervalMatrix centred = a - IntervalMatrix::Point(Eigen::MatrixXd(mean.replicate(a.rows(), 1)));
  return RowNormsUp(Mul(centred, Eigen::MatrixXd(w.transpose())));
}

// (sum_j w_j z_j^p)^(1/p), rounded up (w, z >= 0).
double WeightedNormUp(const Eigen::VectorXd& w, const Eigen::VectorXd& z, int p) {
  double sum = 0;
  for (Eigen::Index j = 0; j < w.size(); ++j) {
    double zp = 1;
    for (int e = 0; e < p; ++e) zp = MulUp(zp, z(j));
    sum = AddUp(sum, MulUp(w(j), zp));
  }
  if (sum == 0) return 0;
  double x = std::pow(sum, 1.0 / p);
  for (int guard = 0; guard < 64; ++guard) {  // x^p >= sum, the power rounded down
    double xp = 1;
    for (int e = 0; e < p; ++e) xp = MulDown(xp, x);
    if (xp >= sum) return x;
    x = NextUp(NextUp(x));
  }
  return kInf;
}

// Row j's distance ||z_j - c||_2 to a fixed vector, over the enclosure (|mid - c| + rad), up.
double DistanceUp(const IntervalMatrix& z, Eigen::Index j, const Eigen::RowVectorXd& c) {
  double sum = 0;
  for (Eigen::Index e = 0; e < z.cols(); ++e) {
    const double d =
        AddUp(std::max(std::fabs(SubUp(z.mid(j, e), c(e))), std::fabs(SubDown(z.mid(j, e), c(e)))), z.rad(j, e));
    sum = AddUp(sum, MulUp(d, d));
  }
  return SqrtUp(sum);
}

// One head's centre quantities for the moment form: kq = K0 Wq (rows: Wq^T k_j, unscaled),
// xo = V0 Wo^T (rows: Wo v_j), the cover's radii, s, ||Wq^T Wk||, ||Wo Wv||, omega.
struct MomentInputs {
  IntervalMatrix kq, xo;
  const Eigen::VectorXd& r;
  double s_hi, qk, nu, omega;
};

// Row i's coefficients from the softmax-weighted moments (docs/engines.md, "A structured
// third-derivative bound"): with rho_j >= s ||Wq^T (k_j - c)|| and xi_j >= ||Wo (v_j - c')|| over
// the cover (c, c' the rows' Phat-weighted means), R_p = (sum_j Phat_ij rho_j^p)^(1/p),
// S_p = R_p + gamma_i, X2 = (sum_j Phat_ij xi_j^2)^(1/2):
//   A = X2 (24 S6^2 R6 + 3 S2^2 R2) + 12 X2 S4 omega + 3 nu omega,
//   B = X2 (8 gamma^3 + 3 S2^2 gamma) + 12 nu S4^2,
// or, centring by |E y| <= Y_2 instead of Y_p (S' = R6 + R2 + 2 gamma), the smaller sum of
//   A = X2 (3 S'^2 (R6 + R2) + 3 S2^2 R2) + 6 X2 (S4 + S2) omega + 3 nu omega,
//   B = X2 (8 gamma^3 + 3 S2^2 gamma) + 3 nu (S4 + S2)^2.
void MomentCoefficientsUp(const MomentInputs& m, const Eigen::MatrixXd& p_hi, int i, double gamma, double* a,
                          double* b) {
  const Eigen::Index n = p_hi.cols();
  const Eigen::VectorXd w = p_hi.row(i).transpose();
  const double wsum = std::max(w.sum(), 1e-300);
  const Eigen::RowVectorXd ck = (w.transpose() * m.kq.mid) / wsum, cx = (w.transpose() * m.xo.mid) / wsum;
  Eigen::VectorXd rho(n), xi(n);
  for (Eigen::Index j = 0; j < n; ++j) {
    rho(j) = MulUp(m.s_hi, AddUp(DistanceUp(m.kq, j, ck), MulUp(m.r(j), m.qk)));
    xi(j) = AddUp(DistanceUp(m.xo, j, cx), MulUp(m.r(j), m.nu));
  }
  const double r2 = WeightedNormUp(w, rho, 2), r4 = WeightedNormUp(w, rho, 4), r6 = WeightedNormUp(w, rho, 6);
  const double x2 = WeightedNormUp(w, xi, 2);
  const double s2 = AddUp(r2, gamma), s4 = AddUp(r4, gamma), s6 = AddUp(r6, gamma);
  const double s2sq = MulUp(s2, s2), s4sq = MulUp(s4, s4);
  const double nuom = MulUp(3.0, MulUp(m.nu, m.omega)), g3 = MulUp(8.0, MulUp(MulUp(gamma, gamma), gamma));
  const double tail = MulUp(x2, AddUp(g3, MulUp(3.0, MulUp(s2sq, gamma))));
  // ||y~||_p <= 2 Y_p:
  *a = AddUp(AddUp(MulUp(x2, AddUp(MulUp(24.0, MulUp(MulUp(s6, s6), r6)), MulUp(3.0, MulUp(s2sq, r2)))),
                   MulUp(12.0, MulUp(MulUp(x2, s4), m.omega))),
             nuom);
  *b = AddUp(tail, MulUp(12.0, MulUp(m.nu, s4sq)));
  // ||y~||_p <= Y_p + Y_2 (|E y| <= Y_2), with S' = R6 + R2 + 2 gamma:
  const double sp = AddUp(AddUp(r6, r2), MulUp(2.0, gamma)), s42 = AddUp(s4, s2);
  const double a2 = AddUp(AddUp(MulUp(x2, AddUp(MulUp(3.0, MulUp(MulUp(sp, sp), AddUp(r6, r2))), MulUp(3.0, MulUp(s2sq, r2)))),
                                MulUp(6.0, MulUp(MulUp(x2, s42), m.omega))),
                          nuom);
  const double b2 = AddUp(tail, MulUp(3.0, MulUp(m.nu, MulUp(s42, s42))));
  if (AddUp(a2, b2) < AddUp(*a, *b)) {
    *a = a2;
    *b = b2;
  }
}

// One head's coefficients A_i (the t_i part) and B_i (the sqrt(W_i) part) over the cover, and
// the softmax's upper bounds. See the header and docs/engines.md for the four terms.
struct HeadThird {
  Eigen::VectorXd a, b;
  Eigen::MatrixXd p_hi;
};

HeadThird HeadThirdUp(const AttentionLayer& L, int h, const TokenCover& cover, double s_hi) {
  const Eigen::MatrixXd& x0 = cover.center;
  const Eigen::VectorXd& r = cover.radius;
  const int n = int(x0.rows()), dk = L.head_dim_qk, dv = L.head_dim_v;
  auto seg = [&](const Eigen::VectorXd& b, int width) {
    return b.size() == 0 ? Eigen::VectorXd() : Eigen::VectorXd(b.segment(h * width, width));
  };
  const Eigen::MatrixXd wq = L.wq_head(h), wk = L.wk_head(h), wv = L.wv_head(h), wo = L.wo_head(h);
  const IntervalMatrix q0 = Project(x0, wq, seg(L.bq, dk)), k0 = Project(x0, wk, seg(L.bk, dk));
  const IntervalMatrix v0 = Project(x0, wv, seg(L.bv, dv));
  const double qk = NormL2UpperInterval(Mul(Eigen::MatrixXd(wq.transpose()), wk)).value();  // ||Wq^T Wk||
  const double nu = NormL2UpperInterval(Mul(wo, wv)).value();                                // ||Wo Wv||
  const double nq = NormL2Upper(wq).value(), nk = NormL2Upper(wk).value();
  const double omega = MulUp(MulUp(2.0, s_hi), qk);
  // K: the query's logit gradient s Wq^T (k_j - kbar); gamma_i: the keys' s Wk^T q_i; X: the
  // centred values Wo (v_j - vbar); each over the cover (x_j moves by r_j).
  const Eigen::VectorXd kc = CentredRowNormsUp(k0, wq.transpose());
  const Eigen::VectorXd qg = RowNormsUp(Mul(q0, wk));
  const Eigen::VectorXd vc = CentredRowNormsUp(v0, wo);
  double kmax = 0, xmax = 0;
  Eigen::VectorXd gamma(n), kown(n);
  for (int j = 0; j < n; ++j) {
    kown(j) = MulUp(s_hi, AddUp(kc(j), MulUp(r(j), qk)));
    kmax = std::max(kmax, kown(j));
    xmax = std::max(xmax, AddUp(vc(j), MulUp(r(j), nu)));
    gamma(j) = MulUp(s_hi, AddUp(qg(j), MulUp(r(j), qk)));
  }
  HeadThird out;
  out.a.resize(n);
  out.b.resize(n);
  for (int i = 0; i < n; ++i) {
    // max_j |l'_ij - c_i| over unit U: t_i K + t_j gamma_i <= sqrt(K^2 + gamma_i^2) for j != i
    // (t_i^2 + t_j^2 <= 1), t_i (K_i + gamma_i) for j = i.
    const double m = std::max(SqrtUp(AddUp(MulUp(kmax, kmax), MulUp(gamma(i), gamma(i)))), AddUp(kown(i), gamma(i)));
    const double m2 = MulUp(m, m);
    // (1) 4 X m^2 (t_i K + gamma_i sqrt W); (2) 6 X omega m t_i; (3) 6 nu m^2 sqrt W; (4) 3 nu omega t_i.
    const double xm2 = MulUp(4.0, MulUp(xmax, m2));
    out.a(i) = AddUp(AddUp(MulUp(xm2, kmax), MulUp(6.0, MulUp(MulUp(xmax, omega), m))), MulUp(3.0, MulUp(nu, omega)));
    out.b(i) = AddUp(MulUp(xm2, gamma(i)), MulUp(6.0, MulUp(nu, m2)));
  }
  // The softmax's upper bounds over the cover: Q, K widened by r_j ||W||_2 per coordinate.
  const IntervalMatrix q = Widen(q0, r, nq), k = Widen(k0, r, nk);
  const Interval s = InvSqrt(Interval(double(dk)));
  out.p_hi = SoftmaxRowsRange(Scale(s, Mul(q, k.transpose())), L.causal).hi;
  // The moments' coefficients, row by row where their A + B is the smaller.
  const MomentInputs mi{Mul(k0, wq), Mul(v0, Eigen::MatrixXd(wo.transpose())), r, s_hi, qk, nu, omega};
  for (int i = 0; i < n; ++i) {
    double a = 0, b = 0;
    MomentCoefficientsUp(mi, out.p_hi, i, gamma(i), &a, &b);
    if (AddUp(a, b) < AddUp(out.a(i), out.b(i))) {
      out.a(i) = a;
      out.b(i) = b;
    }
  }
  return out;
}

}  // namespace

UpperBound StructuredThirdDerivativeUpperBound(const AttentionLayer& L, const TokenCover& cover) {
  if (L.kind != AttentionKind::kDot || L.layer_norm || L.post_layer_norm) return UpperBound(kInf);
  const int n = int(cover.center.rows());
  if (n < 1 || cover.center.cols() != L.d_model || cover.radius.size() != n || !(cover.radius.minCoeff() >= 0) ||
      !std::isfinite(cover.radius.maxCoeff()))
    return UpperBound(kInf);
  RequireRoundToNearest();
  const double s_hi = InvSqrt(Interval(double(L.head_dim_qk))).hi;
  Eigen::VectorXd a_sum = Eigen::VectorXd::Zero(n);
  double b_total = 0;
  for (int h = 0; h < L.heads; ++h) {
    const HeadThird t = HeadThirdUp(L, h, cover, s_hi);
    for (int i = 0; i < n; ++i) a_sum(i) = AddUp(a_sum(i), t.a(i));
    // sum_i W_i B_i^2 = sum_j t_j^2 sum_i P_ij B_i^2 <= max_j sum_i Phat_ij B_i^2.
    double worst = 0;
    for (int j = 0; j < n; ++j) {
      double col = 0;
      for (int i = 0; i < n; ++i) col = AddUp(col, MulUp(t.p_hi(i, j), MulUp(t.b(i), t.b(i))));
      worst = std::max(worst, col);
    }
    b_total = AddUp(b_total, SqrtUp(worst));
  }
  const double total = AddUp(a_sum.maxCoeff(), b_total);
  return std::isfinite(total) ? UpperBound(total) : UpperBound(kInf);
}

EngineBound TaylorVariationBound(const AttentionLayer& L, UpperBound centre_norm, const TokenCover& cover,
                                 const CurvatureBound& centre_curvature) {
  EngineBound b;
  const UpperBound radius = JointRadiusUp(cover);
  const double rmax = cover.radius.size() ? cover.radius.maxCoeff() : 0.0;
  const UpperBound third = Min(StructuredThirdDerivativeUpperBound(L, cover), ThirdDerivativeUpperBound(L, cover.center, rmax));
  const UpperBound curvature = MulNonneg(radius, centre_curvature.upper);
  const UpperBound remainder =
      MulNonneg(UpperBound(MulUp(0.5, MulUp(radius.value(), radius.value()))), third);
  b.terms = {BoundTerm{"centre", centre_norm}, BoundTerm{"curvature x radius", curvature},
             BoundTerm{"remainder", remainder}};
  b.upper = centre_norm + curvature + remainder;
  if (!centre_curvature.message.empty()) b.note = centre_curvature.message;
  return b;
}

}  // namespace lipcert
