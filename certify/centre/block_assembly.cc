// The enclosure of a block of J(X0) from the centre's state: the rounded sums of interval
// products, the LayerNorm factor applied in O(D^2), and the general assembly (any kind of
// attention, with the LayerNorm factor and the identity).
#include "certify/centre/internal.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <vector>

#include "interval/parallel.h"

namespace lipcert {
namespace centre_internal {

namespace {

class BlockAccumulator {
 public:
  explicit BlockAccumulator(int d) : mid_(Eigen::MatrixXd::Zero(d, d)), rad_(Eigen::MatrixXd::Zero(d, d)),
                                     mag_(Eigen::MatrixXd::Zero(d, d)) {}
  // += p * w for an interval scalar p (midpoint pm, radius pr) and an interval matrix w.
  void AddScaled(double pm, double pr, const IntervalMatrix& w) {
    if (pm == 0.0 && pr == 0.0) return;
    const double apm = std::fabs(pm);
    mid_.array() += pm * w.mid.array();
    mag_.array() += apm * w.mid.array().abs();
    rad_.array() += apm * w.rad.array() + pr * (w.mid.array().abs() + w.rad.array());
    ++terms_;
  }
  // += a r^T for interval vectors a, r (midpoints am, rm; radii ar, rr).
  void AddOuter(const Eigen::VectorXd& am, const Eigen::VectorXd& ar, const Eigen::VectorXd& rm,
                const Eigen::VectorXd& rr) {
    const Eigen::VectorXd aam = am.cwiseAbs(), arm = rm.cwiseAbs();
    mid_.noalias() += am * rm.transpose();
    mag_.noalias() += aam * arm.transpose();
    rad_.noalias() += aam * rr.transpose();
    rad_.noalias() += ar * (arm + rr).transpose();
    ++terms_;
  }
  // The enclosure: |fl(mid) - exact| <= gamma_T mag + T eta, and rad, mag themselves are
  // computed sums of nonnegative terms with at most 2T + 4 roundings each, so
  // exact <= (fl + 4 T eta) / (1 - gamma_{4T+8}).
  IntervalMatrix Finish() const { return FinishSums(mid_, rad_, mag_, std::max(terms_, 1)); }

 private:
  Eigen::MatrixXd mid_, rad_, mag_;
  int terms_ = 0;
};

// The general assembly: any kind, with the LayerNorm factor and the identity.
IntervalMatrix AssembleBlockGeneral(const CentreState& S, int r0, int r1, int c0, int c1, int threads) {
  const int d = S.d, n = S.n, nc = c1 - c0, nr = r1 - r0;
  // Column caches: W_h L_j and the rows r (times L_j) for every column token.
  // Without LayerNorm they are the head's own W_h and g (no copies).
  std::vector<std::vector<IntervalMatrix>> wl_ln, gl_ln;
  std::vector<std::vector<const IntervalMatrix*>> wl(nc, std::vector<const IntervalMatrix*>(S.heads));
  std::vector<std::vector<const IntervalMatrix*>> gl(nc, std::vector<const IntervalMatrix*>(S.heads));
  if (S.ln) {
    wl_ln.assign(nc, std::vector<IntervalMatrix>(S.heads));
    gl_ln.assign(nc, std::vector<IntervalMatrix>(S.heads));
  }
  ParallelFor(nc * S.heads, WorkerCount(threads, nc * S.heads), [&](int t, int) {
    const int jj = t / S.heads, h = t % S.heads, j = c0 + jj;
    const HeadCentre& H = S.head[h];
    if (S.ln) {
      wl_ln[jj][h] = ApplyLn(H.w, S.ln_factor[j]);
      gl_ln[jj][h] = ApplyLn(H.g, S.ln_factor[j]);
    }
    wl[jj][h] = S.ln ? &wl_ln[jj][h] : &H.w;
    gl[jj][h] = S.ln ? &gl_ln[jj][h] : &H.g;
  });
  Eigen::MatrixXd mid(nr * d, nc * d), rad(nr * d, nc * d);
  ParallelFor(nr, WorkerCount(threads, nr), [&](int ii, int) {
    const int i = r0 + ii;
    const bool diag = i >= c0 && i < c1;
    IntervalMatrix e_i = IntervalMatrix::Point(Eigen::MatrixXd::Zero(diag ? d : 0, diag ? d : 0));
    // a_ij = P_ij (u_j - ubar_i) for the columns (all j for the diagonal term).
    std::vector<IntervalMatrix> a(S.heads);
    const int a0 = diag ? 0 : c0, a1 = diag ? n : c1;
    for (int h = 0; h < S.heads; ++h) {
      const HeadCentre& H = S.head[h];
      std::vector<Interval> p(a1 - a0);
      for (int j = a0; j < a1; ++j) p[j - a0] = H.p(i, j);
      a[h] = ScaleRows(RowsOf(H.u, a0, a1 - a0) - ReplicateRow(H.ubar, i, a1 - a0), p);
      if (diag) e_i = e_i + Mul(a[h].transpose(), H.bt);
    }
    if (diag && S.ln) e_i = ApplyLn(e_i, S.ln_factor[i]);
    for (int jj = 0; jj < nc; ++jj) {
      const int j = c0 + jj;
      BlockAccumulator acc(d);
      for (int h = 0; h < S.heads; ++h) {
        const HeadCentre& H = S.head[h];
        acc.AddScaled(H.p.mid(i, j), H.p.rad(i, j), *wl[jj][h]);
        const IntervalMatrix& g = *gl[jj][h];
        const Eigen::VectorXd am = a[h].mid.row(j - a0).transpose(), ar = a[h].rad.row(j - a0).transpose();
        if (S.dot) {
          acc.AddOuter(am, ar, g.mid.row(i).transpose(), g.rad.row(i).transpose());
        } else if (i != j) {  // r_ij = g_i - g_j (times L_j), enclosed
          const IntervalMatrix r = RowsOf(g, i, 1) - RowsOf(g, j, 1);
          acc.AddOuter(am, ar, r.mid.transpose(), r.rad.transpose());
        }
      }
      IntervalMatrix blk = acc.Finish();
      if (i == j) {
        blk = blk + e_i;
        if (S.identity) blk = blk + IntervalMatrix::Point(Eigen::MatrixXd::Identity(d, d));
      }
      mid.block(ii * d, jj * d, d, d) = blk.mid;
      rad.block(ii * d, jj * d, d, d) = blk.rad;
    }
  });
  return IntervalMatrix(std::move(mid), std::move(rad));
}

}  // namespace

FinishConstants FinishConstantsOf(int terms) {
  const double t = double(terms);
  FinishConstants c;
  c.g_t = GammaUp(t);
  c.k = MulUp(DivUp(1.0, SubDown(1.0, GammaUp(4 * t + 8))), AddUp(1.0, 4 * kUnitRoundoff));
  c.e0 = 0x1p-1000;
  return c;
}
IntervalMatrix FinishSums(const Eigen::MatrixXd& mid, const Eigen::MatrixXd& rad_sum, const Eigen::MatrixXd& mag_sum,
                          int terms) {
  const FinishConstants c = FinishConstantsOf(terms);
  Eigen::MatrixXd r = (((rad_sum.array() + c.g_t * mag_sum.array()) + c.e0) * c.k).matrix();
  return IntervalMatrix(mid, std::move(r));
}

// x J_LN in place for a block of rows x (rows x D, midpoint-radius): the three terms
// x diag(c) - (x c) 1^T / D - (x (c xhat)) xhat^T / D, in O(rows * D), vectorised down the
// columns in round to nearest. First s1 = x c and s2 = x (c xhat) per row, sums of D
// interval products each; then every entry as a sum of three interval products,
// x_a c_a + s1 (-1/D) + s2 (-xhat_a / D). Each stage is enclosed as FinishSums does (its
// terms are rounded at most T + 3 times: a product, an inner sum, the chain of sums).
void ApplyLnInPlace(Eigen::Ref<Eigen::MatrixXd> mid, Eigen::Ref<Eigen::MatrixXd> rad, const LnFactor& f) {
  const Eigen::Index d = mid.cols();
  const IntervalMatrix c = FromIntervals(f.c, d, 1), cx = FromIntervals(f.cx, d, 1);
  const Eigen::ArrayXd cm = c.mid.col(0).array(), cr = c.rad.col(0).array();
  const Eigen::ArrayXd xm = cx.mid.col(0).array(), xr = cx.rad.col(0).array();
  // Stage 1: the two row sums (GEMVs in any order of summation).
  const FinishConstants f1 = FinishConstantsOf(int(d));
  const Eigen::MatrixXd abs_mid = mid.cwiseAbs();
  const Eigen::VectorXd s1m = mid * cm.matrix(), s2m = mid * xm.matrix();
  const Eigen::ArrayXd s1r = ((abs_mid * cr.matrix() + rad * (cm.abs() + cr).matrix()).array() +
                              f1.g_t * (abs_mid * cm.abs().matrix()).array() + f1.e0) * f1.k;
  const Eigen::ArrayXd s2r = ((abs_mid * xr.matrix() + rad * (xm.abs() + xr).matrix()).array() +
                              f1.g_t * (abs_mid * xm.abs().matrix()).array() + f1.e0) * f1.k;
  // Stage 2: column a, all rows at once; -1/D and -xhat_a/D as intervals (negation exact).
  const FinishConstants f3 = FinishConstantsOf(3);
  const double om = -f.ones_d.mid(0, 0), orad = f.ones_d.rad(0, 0);
  const Eigen::ArrayXd s1a = s1m.array().abs(), s2a = s2m.array().abs();
  for (Eigen::Index a = 0; a < d; ++a) {
    const double hm = -f.xhat_d.mid(0, a), hr = f.xhat_d.rad(0, a);
    auto m = mid.col(a).array();
    auto r = rad.col(a).array();
    const Eigen::ArrayXd ma = m.abs();
    const Eigen::ArrayXd rad_sum = ma * cr(a) + r * (std::fabs(cm(a)) + cr(a)) + s1a * orad + s1r * (std::fabs(om) + orad) +
                                   s2a * hr + s2r * (std::fabs(hm) + hr);
    const Eigen::ArrayXd mag_sum = ma * std::fabs(cm(a)) + s1a * std::fabs(om) + s2a * std::fabs(hm);
    m = m * cm(a) + s1m.array() * om + s2m.array() * hm;
    r = ((rad_sum + f3.g_t * mag_sum) + f3.e0) * f3.k;
  }
}
IntervalMatrix ApplyLn(IntervalMatrix x, const LnFactor& f) {
  ApplyLnInPlace(x.mid, x.rad, f);
  return x;
}

// The enclosure of rows [r0, r1) x columns [c0, c1) of J (token ranges), into *out (its
// storage reused where the fused assembly applies).
void AssembleBlockInto(const CentreState& S, int r0, int r1, int c0, int c1, int threads, IntervalMatrix* out) {
  if (S.gemm) AssembleBlockFused(S, r0, r1, c0, c1, threads, out);
  else *out = AssembleBlockGeneral(S, r0, r1, c0, c1, threads);
}

IntervalMatrix AssembleBlock(const CentreState& S, int r0, int r1, int c0, int c1, int threads) {
  IntervalMatrix out;
  AssembleBlockInto(S, r0, r1, c0, c1, threads, &out);
  return out;
}

}  // namespace centre_internal

using namespace centre_internal;

IntervalMatrix CentreJacobianEnclosure(const AttentionLayer& L, const Eigen::MatrixXd& x0, const CentreNormOptions& o) {
  CheckInputs(L, x0, o);
  const CentreState S = EncloseCentre(L, x0, o);
  return AssembleBlock(S, 0, S.n, 0, S.n, o.threads);
}

}  // namespace lipcert
