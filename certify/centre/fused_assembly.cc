// The fused assembly of a block of J(X0) for dot-product attention: one vectorised pass over
// the heads per entry column, then the pre-LN sublayer's LayerNorm factor per column token.
#include "certify/centre/internal.h"

#include <Eigen/Dense>
#include <cmath>
#include <cstring>
#include <vector>

#include "interval/parallel.h"

namespace lipcert {
namespace centre_internal {

namespace {

// One entry column (d rows) of one block for AssembleBlockFused: the head sums of mid and
// of the folded radius, in chunks of rows held in registers (GCC/Clang vector types, so
// every build vectorises; plain multiply and add, each product and sum rounded once).
struct FusedColumn {
  int d = 0, heads = 0;
  long head_stride = 0;              // between heads in the W stacks
  const double *w_mid, *w_rad;       // column c of W_0 (then + h head_stride)
  const double *a_mid, *a_rad;       // d x H, column-major: a^h[r] at h d + r
  const double *p_mid, *p_w_rad, *p_w_abs;  // per head
  const double *g_mid, *g_a_abs, *g_a_rad;  // per head (column c)
};

// The machine's vector width (the build is -march=native): wider generic vectors than the
// registers are split by the compiler and their accumulators spilled.
#ifdef __AVX512F__
constexpr int kVectorBytes = 64;
#else
constexpr int kVectorBytes = 32;
#endif
typedef double Lanes __attribute__((vector_size(kVectorBytes)));
typedef long LaneBits __attribute__((vector_size(kVectorBytes)));
constexpr int kLanes = int(sizeof(Lanes) / sizeof(double));

inline Lanes LoadLanes(const double* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline Lanes AbsLanes(Lanes v) {
  const LaneBits magnitude = LaneBits{} + 0x7fffffffffffffffL;  // every bit but the sign
  return (Lanes)((LaneBits)v & magnitude);
}

// One vector of rows of the sums below for head h: m += pm w + gm x, q += the radius terms.
struct HeadScalars {
  double pm, pw, pa, gm, ga, gr;
};
__attribute__((always_inline)) inline void AccumulateLanes(const HeadScalars& s, const double* wm, const double* wr,
                                                           const double* xm, const double* xr, Lanes& m, Lanes& q) {
  const Lanes w = LoadLanes(wm), x = LoadLanes(xm);
  m = m + s.pm * w + s.gm * x;
  q = q + s.pw * LoadLanes(wr) + s.pa * AbsLanes(w) + s.ga * AbsLanes(x) + s.gr * LoadLanes(xr);
}

void FusedColumnInto(const FusedColumn& f, const FinishConstants& fc, double* out_mid, double* out_rad) {
  // 4 vectors of rows per chunk, their sums in named registers (an array of accumulators
  // was kept on the stack, loaded and stored at every step).
  constexpr int kChunk = 4 * kLanes;
  int r = 0;
  for (; r + kChunk <= f.d; r += kChunk) {
    Lanes m0 = {}, m1 = {}, m2 = {}, m3 = {}, q0 = {}, q1 = {}, q2 = {}, q3 = {};
    for (int h = 0; h < f.heads; ++h) {
      const double* wm = f.w_mid + h * f.head_stride + r;
      const double* wr = f.w_rad + h * f.head_stride + r;
      const double* xm = f.a_mid + long(h) * f.d + r;
      const double* xr = f.a_rad + long(h) * f.d + r;
      const HeadScalars s{f.p_mid[h], f.p_w_rad[h], f.p_w_abs[h], f.g_mid[h], f.g_a_abs[h], f.g_a_rad[h]};
      AccumulateLanes(s, wm, wr, xm, xr, m0, q0);
      AccumulateLanes(s, wm + kLanes, wr + kLanes, xm + kLanes, xr + kLanes, m1, q1);
      AccumulateLanes(s, wm + 2 * kLanes, wr + 2 * kLanes, xm + 2 * kLanes, xr + 2 * kLanes, m2, q2);
      AccumulateLanes(s, wm + 3 * kLanes, wr + 3 * kLanes, xm + 3 * kLanes, xr + 3 * kLanes, m3, q3);
    }
    const Lanes ms[4] = {m0, m1, m2, m3}, qs[4] = {(q0 + fc.e0) * fc.k, (q1 + fc.e0) * fc.k, (q2 + fc.e0) * fc.k,
                                                   (q3 + fc.e0) * fc.k};
    std::memcpy(out_mid + r, ms, sizeof ms);
    std::memcpy(out_rad + r, qs, sizeof qs);
  }
  for (; r < f.d; ++r) {  // the rows left over: the same sums, one row at a time
    double m = 0, q = 0;
    for (int h = 0; h < f.heads; ++h) {
      const double w = f.w_mid[h * f.head_stride + r], x = f.a_mid[long(h) * f.d + r];
      m = m + f.p_mid[h] * w + f.g_mid[h] * x;
      q = q + f.p_w_rad[h] * f.w_rad[h * f.head_stride + r] + f.p_w_abs[h] * std::fabs(w) +
          f.g_a_abs[h] * std::fabs(x) + f.g_a_rad[h] * f.a_rad[long(h) * f.d + r];
    }
    out_mid[r] = m;
    out_rad[r] = (q + fc.e0) * fc.k;
  }
}

// The pre-LN sublayer: every column token's slab of J_MHA (rows x D) in *out, block rows
// [r0, r1) x column tokens [c0, c1), times its LayerNorm factor L_j (a diagonal scaling and
// two rank-one terms, rigorous), then + I.
void ApplyLnToColumnTokens(const CentreState& S, int r0, int r1, int c0, int c1, int threads, IntervalMatrix* out) {
  const int d = S.d, nc = c1 - c0;
  Eigen::MatrixXd& mid = out->mid;
  Eigen::MatrixXd& rad = out->rad;
  ParallelFor(nc, WorkerCount(threads, nc), [&](int jj, int) {
    const int j = c0 + jj;
    ApplyLnInPlace(mid.middleCols(long(jj) * d, d), rad.middleCols(long(jj) * d, d), S.ln_factor[j]);
    if (S.identity && j >= r0 && j < r1) {
      auto m = mid.block(long(j - r0) * d, long(jj) * d, d, d);
      auto r = rad.block(long(j - r0) * d, long(jj) * d, d, d);
      const IntervalMatrix diag = IntervalMatrix(m, r) + IntervalMatrix::Point(Eigen::MatrixXd::Identity(d, d));
      m = diag.mid;
      r = diag.rad;
    }
  });
}

}  // namespace

// a_j = P_ij (u_j - ubar_i) for the rows j in [a0, a0 + len) of u, as one vectorised
// midpoint-radius pass (the fused assembly's per-row set-up). With d = fl(u_j - ubar_i)
// (|error| <= 2u |d|) and m = fl(P d) (|error| <= 2u |m| + eta), the exact products lie
// within |P| r + P_r (|d| + r) + 2u |m| + eta of m, r = u_r + ubar_r + 2u |d|. That sum is
// taken in round-to-nearest with at most eight roundings along any term, so its floating
// value times 1 + 2^-46 (rounded once more) plus 2^-1000 (normal, far above the eta
// terms) bounds it.
IntervalMatrix ScaledDifferenceRows(const IntervalMatrix& u, int a0, int len, const IntervalMatrix& ubar, int i,
                                    const Eigen::ArrayXd& p_mid, const Eigen::ArrayXd& p_rad) {
  constexpr double kTwoU = 0x1p-52, kInflate = 1 + 0x1p-46, kFloor = 0x1p-1000;
  const Eigen::Index cols = u.cols();
  const Eigen::ArrayXXd dm = u.mid.middleRows(a0, len).array() - ubar.mid.row(i).replicate(len, 1).array();
  const Eigen::ArrayXXd dr =
      (u.rad.middleRows(a0, len).array() + ubar.rad.row(i).replicate(len, 1).array()) + kTwoU * dm.abs();
  IntervalMatrix a(Eigen::MatrixXd::Zero(len, cols), Eigen::MatrixXd::Zero(len, cols));
  a.mid.array() = dm.colwise() * p_mid;
  a.rad.array() = (((dr.colwise() * p_mid.abs()) + ((dm.abs() + dr).colwise() * p_rad)) + kTwoU * a.mid.array().abs()) *
                      kInflate +
                  kFloor;
  return a;
}

// The same enclosure as AssembleBlock below for dot-product attention without the LayerNorm
// factor, fused: every entry (r, c) of block (i, j) is taken in one pass over the heads,
//   mid = sum_h P^h_ij W_h[r, c] + a^h_ij[r] g^h_i[c]                     (2H products)
//   rad = sum_h (|P| + P_rad) W_rad[r, c] + (P_rad + g_T |P|) |W[r, c]|
//             + (g_rad + g_T |g|)[c] |a|[r] + (|g| + g_rad)[c] a_rad[r]   (4H products),
// with a^h_ij = P_ij (u_j - ubar_i) and g^h_i enclosed. rad is the accumulator's radius sum
// plus g_T times its magnitude sum (BlockAccumulator, T = 2H), each product's scalar factor
// rounded up, so the same FinishSums bound holds with the magnitude folded in: every term
// is nonnegative with a factor at least its exact one, rounded at most 2T + 4 times
// (the product, the FMA chain), and mid is the same 2H products in another order.
// Memory: only the output is written (the GEMM form wrote and re-read five D x D sums per
// block and took about 4 times as long: docs/engines.md, "Centre norm").
// Written into *out (its storage reused when the shape is the same: every entry is set).
void AssembleBlockFused(const CentreState& S, int r0, int r1, int c0, int c1, int threads, IntervalMatrix* out) {
  const int d = S.d, n = S.n, nc = c1 - c0, nr = r1 - r0, hs = S.heads;
  const long dd = long(d) * d;
  const double* w_mid = S.w_stacks.mid.data();
  const double* w_rad = S.w_stacks.rad.data();
  const FinishConstants fc = FinishConstantsOf(2 * hs);
  Eigen::MatrixXd& mid = out->mid;
  Eigen::MatrixXd& rad = out->rad;
  mid.resize(nr * d, nc * d);
  rad.resize(nr * d, nc * d);
  const long ld = long(nr) * d;
  ParallelFor(nr, WorkerCount(threads, nr), [&](int ii, int) {
    const int i = r0 + ii;
    const bool diag = i >= c0 && i < c1;
    const int a0 = diag ? 0 : c0, a1 = diag ? n : c1;
    // The diagonal term E_i = sum_h a^hT bt^h as one product of the heads' stacks.
    IntervalMatrix a_stack(Eigen::MatrixXd::Zero(diag ? long(hs) * n : 0, d), Eigen::MatrixXd::Zero(diag ? long(hs) * n : 0, d));
    // Per column token jj: [a^h_ij]_h (d x H, mid and rad), the P scalars (mid, the two
    // folded radius factors); per entry column c: the g scalars.
    std::vector<Eigen::MatrixXd> am(nc, Eigen::MatrixXd(d, hs)), ar(nc, Eigen::MatrixXd(d, hs));
    Eigen::MatrixXd p_mid(hs, nc), p_w_rad(hs, nc), p_w_abs(hs, nc);
    Eigen::MatrixXd g_mid(hs, d), g_a_abs(hs, d), g_a_rad(hs, d);
    for (int h = 0; h < hs; ++h) {
      const HeadCentre& H = S.head[h];
      const Eigen::ArrayXd pm_row = H.p.mid.row(i).segment(a0, a1 - a0).transpose().array();
      const Eigen::ArrayXd pr_row = H.p.rad.row(i).segment(a0, a1 - a0).transpose().array();
      const IntervalMatrix a = ScaledDifferenceRows(H.u, a0, a1 - a0, H.ubar, i, pm_row, pr_row);
      if (diag) {
        a_stack.mid.middleRows(long(h) * n, n) = a.mid;
        a_stack.rad.middleRows(long(h) * n, n) = a.rad;
      }
      for (int jj = 0; jj < nc; ++jj) {
        const int j = c0 + jj;
        const double pm = H.p.mid(i, j), pr = H.p.rad(i, j), pa = std::fabs(pm);
        p_mid(h, jj) = pm;
        p_w_rad(h, jj) = AddUp(pa, pr);
        p_w_abs(h, jj) = AddUp(pr, MulUp(fc.g_t, pa));
        am[jj].col(h) = a.mid.row(j - a0).transpose();
        ar[jj].col(h) = a.rad.row(j - a0).transpose();
      }
      for (int c = 0; c < d; ++c) {
        const double gm = H.g.mid(i, c), gr = H.g.rad(i, c), ga = std::fabs(gm);
        g_mid(h, c) = gm;
        g_a_abs(h, c) = AddUp(gr, MulUp(fc.g_t, ga));
        g_a_rad(h, c) = AddUp(ga, gr);
      }
    }
    // Entry column c of every block (ii, jj): W's columns c stay in cache across jj.
    for (int c = 0; c < d; ++c)
      for (int jj = 0; jj < nc; ++jj) {
        FusedColumn col;
        col.d = d;
        col.heads = hs;
        col.head_stride = dd;
        col.w_mid = w_mid + long(c) * d;
        col.w_rad = w_rad + long(c) * d;
        col.a_mid = am[jj].data();
        col.a_rad = ar[jj].data();
        col.p_mid = &p_mid(0, jj);
        col.p_w_rad = &p_w_rad(0, jj);
        col.p_w_abs = &p_w_abs(0, jj);
        col.g_mid = &g_mid(0, c);
        col.g_a_abs = &g_a_abs(0, c);
        col.g_a_rad = &g_a_rad(0, c);
        FusedColumnInto(col, fc, mid.data() + (long(jj) * d + c) * ld + long(ii) * d,
                        rad.data() + (long(jj) * d + c) * ld + long(ii) * d);
      }
    if (diag) {
      const int jj = i - c0;
      auto m = mid.block(long(ii) * d, long(jj) * d, d, d);
      auto r = rad.block(long(ii) * d, long(jj) * d, d, d);
      IntervalMatrix blk = IntervalMatrix(m, r) + Mul(a_stack.transpose(), S.bt_stack);
      if (S.identity && !S.ln) blk = blk + IntervalMatrix::Point(Eigen::MatrixXd::Identity(d, d));
      m = blk.mid;
      r = blk.rad;
    }
  });
  if (S.ln) ApplyLnToColumnTokens(S, r0, r1, c0, c1, threads, out);
}

}  // namespace centre_internal

}  // namespace lipcert
