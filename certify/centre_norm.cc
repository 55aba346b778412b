#include "certify/centre_norm.h"

#include <Eigen/Cholesky>
#include <Eigen/Eigenvalues>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <vector>

#include "certify/layer_norm_enclosure.h"
#include "interval/fp_environment.h"
#include "interval/norms.h"
#include "interval/parallel.h"
#include "interval/softmax.h"
#include "certify/probable_norm.h"

namespace lipcert {

std::string CentreNormOptions::IsValid() const {
  if (dense_limit < 0) return "dense_limit: must be >= 0";
  if (block_tokens < 0) return "block_tokens: must be >= 0";
  if (block_limit < 1) return "block_limit: must be >= 1";
  if (threads < 0) return "threads: must be >= 0";
  return "";
}

namespace {

// The time models' rate for the Gram matrix and the Cholesky factor of a dense certificate,
// (5/6) m^3 flops for an m x m matrix: half the rate measured on 2 idle cores (1.2e11
// flop/s for the dense certificate at N = 16, 9.6e10 for the super-blocks' single-precision
// blocks at N = 64 with their estimate). The old 1.5e10 predicted 4 times the time.
constexpr double kGramFlopsPerSecond = 6e10;

// ---------------------------------------------------------------------------------------
// Small rigorous helpers on midpoint-radius matrices.
// ---------------------------------------------------------------------------------------

IntervalMatrix FromIntervals(const std::vector<Interval>& v, Eigen::Index rows, Eigen::Index cols) {
  Eigen::MatrixXd lo(rows, cols), hi(rows, cols);
  for (Eigen::Index r = 0; r < rows; ++r)
    for (Eigen::Index c = 0; c < cols; ++c) {
      lo(r, c) = v[r * cols + c].lo;
      hi(r, c) = v[r * cols + c].hi;
    }
  return IntervalMatrix::FromBounds(lo, hi);
}

// Rows k of x multiplied by p_k.
IntervalMatrix ScaleRows(const IntervalMatrix& x, const std::vector<Interval>& p) {
  Eigen::MatrixXd lo(x.rows(), x.cols()), hi(x.rows(), x.cols());
  for (Eigen::Index a = 0; a < x.cols(); ++a)
    for (Eigen::Index r = 0; r < x.rows(); ++r) {
      const Interval v = x(r, a) * p[r];
      lo(r, a) = v.lo;
      hi(r, a) = v.hi;
    }
  return IntervalMatrix::FromBounds(lo, hi);
}

IntervalMatrix ReplicateRow(const IntervalMatrix& m, Eigen::Index r, Eigen::Index rows) {
  return IntervalMatrix(m.mid.row(r).replicate(rows, 1), m.rad.row(r).replicate(rows, 1));
}

IntervalMatrix RowsOf(const IntervalMatrix& m, Eigen::Index r0, Eigen::Index count) {
  return IntervalMatrix(m.mid.middleRows(r0, count), m.rad.middleRows(r0, count));
}

// The LayerNorm Jacobian at one token, J_LN = diag(c) (I - 1 1^T / D - xhat xhat^T / D),
// c = gamma / sigma, kept in factored form.
struct LnFactor {
  std::vector<Interval> c, cx;  // c_a and c_a xhat_a
  IntervalMatrix ones_d, xhat_d;  // 1 x D rows: 1/D and xhat / D
};

LnFactor MakeLnFactor(const LayerNormParams& ln, const Eigen::RowVectorXd& x) {
  const LayerNormRowEnclosure e = EncloseLayerNormRow(ln, x);
  const Eigen::Index d = x.size();
  LnFactor f;
  f.c.resize(d);
  f.cx.resize(d);
  std::vector<Interval> ones(d), xh(d);
  const Interval inv_d = Interval(1.0) / Interval(double(d));
  for (Eigen::Index a = 0; a < d; ++a) {
    f.c[a] = Interval(ln.gamma(a)) / e.sigma;
    f.cx[a] = f.c[a] * e.xhat[a];
    ones[a] = inv_d;
    xh[a] = e.xhat[a] * inv_d;
  }
  f.ones_d = FromIntervals(ones, 1, d);
  f.xhat_d = FromIntervals(xh, 1, d);
  return f;
}


// ---------------------------------------------------------------------------------------
// The layer at the centre, enclosed.
// ---------------------------------------------------------------------------------------
struct HeadCentre {
  IntervalMatrix p;      // (N, N) probabilities, 0 where masked
  IntervalMatrix u;      // (N, D) u_j = Wo_h v_j
  IntervalMatrix ubar;   // (N, D) P u
  IntervalMatrix g;      // (N, D) dot: Wk^T q_i / sqrt(dk); l2: 2 Wq^T q_i / sqrt(dk)
  IntervalMatrix bt;     // (N, D) rows of the diagonal term (shifted by a constant row)
  IntervalMatrix w;      // (D, D) W_h = Wo_h M_h
  IntervalMatrix v;      // (N, dv) the values v_j (dot: Wv_h z_j + bias), for the factored heads
  IntervalMatrix vbar;   // (N, dv) P v
};

using RowMajorXd = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// [vec W_h]_h (H x D^2, column-major vec in row h): mid and rad, for AssembleBlockFused.
struct WStacks {
  RowMajorXd mid, rad;
};

WStacks WStacksOf(const std::vector<HeadCentre>& heads, int d) {
  const Eigen::Index dd = Eigen::Index(d) * d, hs = Eigen::Index(heads.size());
  WStacks w{RowMajorXd(hs, dd), RowMajorXd(hs, dd)};
  for (Eigen::Index h = 0; h < hs; ++h) {
    w.mid.row(h) = Eigen::Map<const Eigen::RowVectorXd>(heads[h].w.mid.data(), dd);
    w.rad.row(h) = Eigen::Map<const Eigen::RowVectorXd>(heads[h].w.rad.data(), dd);
  }
  return w;
}

struct CentreState {
  int n = 0, d = 0, heads = 0;
  bool dot = true;
  bool ln = false;        // compose with the LayerNorm Jacobian
  bool identity = false;  // add I
  bool gemm = true;       // AssembleBlockFused where it applies (dot-product attention)
  std::vector<HeadCentre> head;
  WStacks w_stacks;         // when the fused assembly applies
  IntervalMatrix bt_stack;  // [bt^h]_h, (H N) x D, when the fused assembly applies
  std::vector<LnFactor> ln_factor;  // per token, when ln
};

CentreState EncloseCentre(const AttentionLayer& L, const Eigen::MatrixXd& x0, const CentreNormOptions& o) {
  CentreState S;
  S.n = int(x0.rows());
  S.d = L.d_model;
  S.heads = L.heads;
  S.dot = L.kind == AttentionKind::kDot;
  S.ln = L.layer_norm.has_value() && !o.mha_only;
  S.identity = L.layer_norm.has_value() && !o.mha_only && !o.exclude_residual;
  S.gemm = o.gemm_assembly;
  const int n = S.n, d = S.d;
  IntervalMatrix z = IntervalMatrix::Point(x0);
  if (L.layer_norm) {
    std::vector<Interval> zs(size_t(n) * d);
    for (int i = 0; i < n; ++i) {
      const LayerNormRowEnclosure e = EncloseLayerNormRow(*L.layer_norm, x0.row(i));
      for (int a = 0; a < d; ++a) zs[size_t(i) * d + a] = e.z[a];
      if (S.ln) S.ln_factor.push_back(MakeLnFactor(*L.layer_norm, x0.row(i)));
    }
    z = FromIntervals(zs, n, d);
  }
  const Interval inv_sqrt_dk = Interval(1.0) / Sqrt(Interval(double(L.head_dim_qk)));
  auto bias_rows = [n](const Eigen::VectorXd& b, int off, int len) {
    return IntervalMatrix::Point(b.segment(off, len).transpose().replicate(n, 1));
  };
  S.head.resize(L.heads);
  ParallelFor(L.heads, WorkerCount(o.threads, L.heads), [&](int h, int) {
    HeadCentre& H = S.head[h];
    const int dk = L.head_dim_qk, dv = L.head_dim_v;
    const Eigen::MatrixXd wq = L.wq_head(h), wk = L.wk_head(h), wv = L.wv_head(h), wo = L.wo_head(h);
    IntervalMatrix q = Mul(z, Eigen::MatrixXd(wq.transpose()));
    if (L.bq.size()) q = q + bias_rows(L.bq, h * dk, dk);
    IntervalMatrix logits, mv;
    if (S.dot) {
      IntervalMatrix k = Mul(z, Eigen::MatrixXd(wk.transpose()));
      if (L.bk.size()) k = k + bias_rows(L.bk, h * dk, dk);
      logits = Scale(inv_sqrt_dk, Mul(q, k.transpose()));
      mv = IntervalMatrix::Point(wv);
      H.g = Scale(inv_sqrt_dk, Mul(q, wk));
      H.bt = Scale(inv_sqrt_dk, Mul(k, wq));
    } else {
      std::vector<Interval> s(size_t(n) * n);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          Interval acc(0.0);
          for (int c = 0; c < dk; ++c) acc += Sqr(q(i, c) - q(j, c));
          s[size_t(i) * n + j] = -(acc * inv_sqrt_dk);
        }
      logits = FromIntervals(s, n, n);
      mv = Scale(inv_sqrt_dk, Mul(Mul(wv, Eigen::MatrixXd(wq.transpose())), IntervalMatrix::Point(wq)));
      H.g = Scale(Interval(2.0) * inv_sqrt_dk, Mul(q, wq));
      H.bt = H.g;
    }
    // sum_j a_ij = 0, so any constant row may be taken off bt; its mean keeps radii small.
    const Eigen::RowVectorXd c = H.bt.mid.colwise().mean();
    H.bt = H.bt - IntervalMatrix::Point(c.replicate(n, 1));
    const ProbabilityMatrixBounds pb = SoftmaxRowsRange(logits, L.causal);
    H.p = IntervalMatrix::FromBounds(pb.lo, pb.hi);
    IntervalMatrix v = Mul(z, mv.transpose());
    if (L.bv.size()) v = v + bias_rows(L.bv, h * dv, dv);
    H.u = Mul(v, Eigen::MatrixXd(wo.transpose()));
    if (S.dot) {
      H.v = v;
      H.vbar = Mul(H.p, v);
    }
    H.ubar = Mul(H.p, H.u);
    H.w = Mul(wo, mv);
  });
  S.gemm = S.gemm && S.dot;
  if (S.gemm) {
    S.w_stacks = WStacksOf(S.head, d);
    S.bt_stack = IntervalMatrix(Eigen::MatrixXd::Zero(long(L.heads) * n, d), Eigen::MatrixXd::Zero(long(L.heads) * n, d));
    for (int h = 0; h < L.heads; ++h) {
      S.bt_stack.mid.middleRows(long(h) * n, n) = S.head[h].bt.mid;
      S.bt_stack.rad.middleRows(long(h) * n, n) = S.head[h].bt.rad;
    }
  }
  return S;
}

// ---------------------------------------------------------------------------------------
// Block accumulation: sum of T interval products per entry, midpoint through plain double,
// radius bounded as in docs/engines.md ("Centre norm: block accumulation").
// ---------------------------------------------------------------------------------------
// The enclosure of a sum of T interval products per entry from the three floating sums:
// mid = fl(sum of midpoint products), rad and mag = fl(sums of the nonnegative radius and
// |midpoint| products), each term rounded at most 2T + 4 times in any order of summation:
// |fl(mid) - exact| <= gamma_T mag + T eta, and exact <= (fl + 4 T eta) / (1 - gamma_{4T+8})
// for rad and mag, so the radius (rad + eta')/shrink + g_T (mag + eta')/shrink + eta'
// (shrink = 1 - gamma_{4T+8}, eta' = (8T + 8) eta) encloses the sum around fl(mid).
// It is taken in one vectorised pass, never below that: with E0 = 2^-1000 (normal, far
// above the eta terms) every intermediate is normal, so each of the three round-to-nearest
// operations in ((rad + g_T mag) + E0) K loses at most a factor (1 - u), which
// K = (1 + 4u) / shrink (rounded up) absorbs (an FMA only removes a rounding).
struct FinishConstants {
  double g_t = 0, k = 0, e0 = 0;
};
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

typedef double Lanes __attribute__((vector_size(64)));
typedef long LaneBits __attribute__((vector_size(64)));
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

void FusedColumnInto(const FusedColumn& f, const FinishConstants& fc, double* out_mid, double* out_rad) {
  constexpr int kVectors = 2;  // 2 x 8 rows per chunk
  int r = 0;
  for (; r + kVectors * kLanes <= f.d; r += kVectors * kLanes) {
    Lanes m[kVectors] = {}, q[kVectors] = {};
    for (int h = 0; h < f.heads; ++h) {
      const double* wm = f.w_mid + h * f.head_stride + r;
      const double* wr = f.w_rad + h * f.head_stride + r;
      const double* xm = f.a_mid + long(h) * f.d + r;
      const double* xr = f.a_rad + long(h) * f.d + r;
      const double pm = f.p_mid[h], pw = f.p_w_rad[h], pa = f.p_w_abs[h];
      const double gm = f.g_mid[h], ga = f.g_a_abs[h], gr = f.g_a_rad[h];
      for (int v = 0; v < kVectors; ++v) {
        const Lanes w = LoadLanes(wm + v * kLanes), x = LoadLanes(xm + v * kLanes);
        m[v] = m[v] + pm * w + gm * x;
        q[v] = q[v] + pw * LoadLanes(wr + v * kLanes) + pa * AbsLanes(w) + ga * AbsLanes(x) +
               gr * LoadLanes(xr + v * kLanes);
      }
    }
    for (int v = 0; v < kVectors; ++v) {
      const Lanes out = (q[v] + fc.e0) * fc.k;
      std::memcpy(out_mid + r + v * kLanes, &m[v], sizeof m[v]);
      std::memcpy(out_rad + r + v * kLanes, &out, sizeof out);
    }
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
  if (!S.ln) return;
  // The pre-LN sublayer: every column token's slab of J_MHA (rows x D) times its LayerNorm
  // factor L_j (a diagonal scaling and two rank-one terms, rigorous), then + I.
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

// ---------------------------------------------------------------------------------------
// The dense certificate.
// ---------------------------------------------------------------------------------------

// fl(m^T m) into *g, exactly symmetric (each lower tile mirrored by the task that computed
// it), tiles on `threads` workers; *g keeps its storage when it already has the size.
using Deadline = std::chrono::steady_clock::time_point;
bool Past(Deadline d) { return std::chrono::steady_clock::now() >= d; }

// fn(c0, cn) over the column chunks [c0, c0 + cn) of a matrix with `cols` columns, on
// `threads` workers: the element-wise passes over a block that does not fit in cache.
template <typename Fn>
void ForColumnChunks(Eigen::Index cols, int threads, Fn&& fn) {
  constexpr Eigen::Index kChunk = 64;
  const int chunks = int((cols + kChunk - 1) / kChunk);
  ParallelFor(chunks, WorkerCount(threads, chunks), [&](int c, int) {
    const Eigen::Index c0 = c * kChunk;
    fn(c0, std::min(kChunk, cols - c0));
  });
}

template <typename Matrix>
void GramInto(const Matrix& m, int threads, Deadline deadline, Matrix* g) {
  const Eigen::Index n = m.cols(), tile = 256;
  const int nt = int((n + tile - 1) / tile);
  std::vector<std::pair<int, int>> tasks;
  for (int a = 0; a < nt; ++a)
    for (int b = 0; b <= a; ++b) tasks.push_back({a, b});
  g->resize(n, n);
  ParallelFor(int(tasks.size()), WorkerCount(threads, int(tasks.size())), [&](int t, int) {
    const auto [a, b] = tasks[t];
    if (Past(deadline)) return;  // the caller checks the deadline again and discards g
    const Eigen::Index ra = std::min(tile, n - a * tile), rb = std::min(tile, n - b * tile);
    auto lower = g->block(a * tile, b * tile, ra, rb);
    lower.noalias() = m.middleCols(a * tile, ra).transpose() * m.middleCols(b * tile, rb);
    if (a != b) {
      g->block(b * tile, a * tile, rb, ra) = lower.transpose();
    } else {
      for (Eigen::Index c = 0; c < ra; ++c)
        for (Eigen::Index r = 0; r < c; ++r) lower(r, c) = lower(c, r);
    }
  });
}

// Floating estimate of lambda_max of a symmetric matrix (Lanczos, full reorthogonalisation).
// The products g v by column tiles on `threads` workers (g = g^T: each tile gives its
// entries of g^T v as dot products down contiguous columns).
double LanczosLambdaMax(const Eigen::MatrixXd& g, int threads, int max_steps = 120, double tol = 1e-13) {
  const Eigen::Index n = g.rows();
  const int k_max = int(std::min<Eigen::Index>(max_steps, n));
  Eigen::MatrixXd v(n, k_max + 1);
  Eigen::VectorXd alpha(k_max), beta(k_max + 1);
  v.col(0) = Eigen::VectorXd::Ones(n) / std::sqrt(double(n));
  for (Eigen::Index i = 0; i < n; ++i) v(i, 0) *= 1.0 + 0.1 * std::sin(double(i));  // break symmetry
  v.col(0).normalize();
  constexpr Eigen::Index kTile = 256;
  const int tiles = int((n + kTile - 1) / kTile);
  Eigen::VectorXd w(n);
  double theta = 0;
  for (int k = 0; k < k_max; ++k) {
    ParallelFor(tiles, WorkerCount(threads, tiles), [&](int t, int) {
      const Eigen::Index c0 = t * kTile, cn = std::min(kTile, n - c0);
      w.segment(c0, cn).noalias() = g.middleCols(c0, cn).transpose() * v.col(k);
    });
    alpha(k) = v.col(k).dot(w);
    for (int pass = 0; pass < 2; ++pass) w -= v.leftCols(k + 1) * (v.leftCols(k + 1).transpose() * w);
    beta(k + 1) = w.norm();
    Eigen::MatrixXd t = Eigen::MatrixXd::Zero(k + 1, k + 1);
    for (int i = 0; i <= k; ++i) {
      t(i, i) = alpha(i);
      if (i < k) t(i, i + 1) = t(i + 1, i) = beta(i + 1);
    }
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(t);
    const Eigen::Index top = k;  // eigenvalues ascending
    theta = es.eigenvalues()(top);
    const double resid = std::fabs(beta(k + 1) * es.eigenvectors()(k, top));
    if (resid <= tol * std::fabs(theta) || beta(k + 1) <= 1e-300) break;
    v.col(k + 1) = w / beta(k + 1);
  }
  return theta;
}

// Lower Cholesky factor of c in place (the strict upper triangle is left as it was),
// right-looking by tiles of kTile: the diagonal tile by Eigen's LLT, the panel below it by
// a triangular solve, the trailing lower tiles by GEMM updates, both on `threads` workers.
// Every entry is still a - sum l l (over k) divided by a diagonal entry, or the square root
// of such a difference, only summed in another order: Higham's Thm 10.3 bound
// |c - R^T R| <= gamma_{n+1} |R^T||R| holds as for the unblocked algorithm. False when a
// diagonal tile is not positive definite or the deadline passed.
bool ParallelCholesky(Eigen::MatrixXd& c, int threads, Deadline deadline) {
  constexpr Eigen::Index kTile = 256;
  const Eigen::Index n = c.rows();
  const int nt = int((n + kTile - 1) / kTile);
  auto start = [&](int t) { return Eigen::Index(t) * kTile; };
  auto size = [&](int t) { return std::min(kTile, n - start(t)); };
  for (int k = 0; k < nt; ++k) {
    if (Past(deadline)) return false;
    const Eigen::Index k0 = start(k), bk = size(k);
    Eigen::Ref<Eigen::MatrixXd> ckk = c.block(k0, k0, bk, bk);
    Eigen::LLT<Eigen::Ref<Eigen::MatrixXd>, Eigen::Lower> llt(ckk);
    if (llt.info() != Eigen::Success) return false;
    const int below = nt - k - 1;
    if (below == 0) break;
    ParallelFor(below, WorkerCount(threads, below), [&](int t, int) {
      const int i = k + 1 + t;
      auto panel = c.block(start(i), k0, size(i), bk);
      c.block(k0, k0, bk, bk).triangularView<Eigen::Lower>().transpose().solveInPlace<Eigen::OnTheRight>(panel);
    });
    std::vector<std::pair<int, int>> tiles;
    for (int i = k + 1; i < nt; ++i)
      for (int j = k + 1; j <= i; ++j) tiles.push_back({i, j});
    ParallelFor(int(tiles.size()), WorkerCount(threads, int(tiles.size())), [&](int t, int) {
      const auto [i, j] = tiles[t];
      c.block(start(i), start(j), size(i), size(j)).noalias() -=
          c.block(start(i), k0, size(i), bk) * c.block(start(j), k0, size(j), bk).transpose();
    });
  }
  return true;
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The float format's unit roundoff and underflow unit.
constexpr double kUnitRoundoffSingle = 0x1p-24, kEtaSingle = 0x1p-150;

// Certified lambda_max(m^T m) for a point matrix m (entries of moderate size: see below);
// the Gram matrix and the factor in ws.
double GramLambdaMaxUp(const Eigen::MatrixXd& m, int threads, double* estimate, Deadline deadline, GramStats* stats,
                       GramWorkspace& ws, GramPrecision precision) {
  RequireRoundToNearest();
  // The smaller Gram matrix; its error |fl(G) - G| <= gamma_k |m|^T |m| <= gamma_k c c^T
  // (c the column norms, Cauchy-Schwarz) has ||.||_2 <= gamma_k ||m||_F^2, plus k n eta.
  const bool tall = m.rows() >= m.cols();
  const Eigen::Index k = tall ? m.rows() : m.cols();
  const Eigen::Index n = tall ? m.cols() : m.rows();
  const double fro = NormFrobeniusUpper(m).value();
  const double fro2 = MulUp(fro, fro);
  if (fro2 == 0) return 0.0;
  const bool single = precision == GramPrecision::kSingle;
  // In single precision the Gram matrix is that of m32 = fl32(m), with |m - m32| <= u32 |m|
  // + eta32 entrywise (round to nearest; m is scaled to max |m_ij| in [1, 2), so nothing
  // overflows), hence ||m||_2 <= ||m32||_2 + conv and ||m32||_F <= (1 + u32) ||m||_F + conv,
  // conv = u32 ||m||_F + sqrt(k n) eta32. Its float products and sums: gamma_k(u32) and
  // k n eta32, as above.
  const double conv = single ? AddUp(MulUp(kUnitRoundoffSingle, fro), MulUp(SqrtUp(double(k) * double(n)), kEtaSingle))
                             : 0.0;
  double gram_err;
  if (single) {
    const double ku = MulUp(double(k), kUnitRoundoffSingle);
    if (!(ku < 1.0)) return kInf;
    const double gamma = DivUp(ku, SubDown(1.0, ku));
    const double fro32 = AddUp(MulUp(fro, AddUp(1.0, kUnitRoundoffSingle)), conv);
    gram_err = AddUp(MulUp(gamma, MulUp(fro32, fro32)), MulUp(double(k) * double(n), kEtaSingle));
  } else {
    gram_err = AddUp(MulUp(GammaUp(double(k)), fro2), MulUp(double(k) * double(n), kEta));
  }
  auto t = std::chrono::steady_clock::now();
  Eigen::MatrixXd& a = ws.gram;
  if (single) {
    if (tall) {
      ws.single.resize(m.rows(), m.cols());
      ForColumnChunks(m.cols(), threads, [&](Eigen::Index c0, Eigen::Index cn) {
        ws.single.middleCols(c0, cn) = m.middleCols(c0, cn).cast<float>();
      });
    } else {
      ws.single = m.transpose().cast<float>();
    }
    GramInto(ws.single, threads, deadline, &ws.gram_single);
    a.resize(n, n);
    ForColumnChunks(n, threads, [&](Eigen::Index c0, Eigen::Index cn) {
      a.middleCols(c0, cn) = ws.gram_single.middleCols(c0, cn).cast<double>();  // exact
    });
  } else if (tall) {
    GramInto(m, threads, deadline, &a);
  } else {
    GramInto(Eigen::MatrixXd(m.transpose()), threads, deadline, &a);
  }
  stats->gram_seconds += SecondsSince(t);
  if (Past(deadline)) return kInf;
  t = std::chrono::steady_clock::now();
  // The estimate needs to be as close as the margin tau below: in single precision the
  // Gram matrix's own rounding (about 1e-4 relative) dwarfs a margin of 1e-8.
  const double theta = LanczosLambdaMax(a, threads, 120, single ? 1e-9 : 1e-13);
  stats->lanczos_seconds += SecondsSince(t);
  if (estimate) *estimate = theta;
  const double diag_max = a.diagonal().maxCoeff();
  // Cholesky of s I - G succeeds => s I - G + dA + dD >= 0 with |dA| <= gamma_{n+1} |R^T||R|
  // (Higham Thm 10.3, any summation order, so also the tiled ParallelCholesky), hence
  // lambda_max(G) <= s + gamma_{n+1} ||R||_F^2 + max_i |dD_ii| (rounding of s - G_ii).
  Eigen::MatrixXd& c = ws.factor;
  double tau = std::max(single ? 1e-8 : 1e-10, 64.0 * double(n) * kUnitRoundoff);
  for (int attempt = 0; attempt < 12; ++attempt, tau *= 8) {
    if (Past(deadline)) return kInf;
    const double s = MulUp(std::max(theta, 0.0), 1.0 + 2 * tau) + tau * diag_max * 1e-3;
    c.resize(n, n);  // same size: the storage is kept
    ForColumnChunks(n, threads, [&](Eigen::Index c0, Eigen::Index cn) { c.middleCols(c0, cn) = -a.middleCols(c0, cn); });
    double diag_err = 0;
    for (Eigen::Index i = 0; i < n; ++i) {
      c(i, i) = s - a(i, i);
      diag_err = std::max(diag_err, MulUp(kUnitRoundoff, std::fabs(c(i, i))));
    }
    t = std::chrono::steady_clock::now();
    ++stats->cholesky_attempts;
    const bool factored = ParallelCholesky(c, threads, deadline);
    stats->cholesky_seconds += SecondsSince(t);
    if (!factored || !(c.diagonal().array() > 0).all()) continue;
    // ||R||_F^2 over the factor (the lower triangle; the strict upper one still holds -G):
    // the vectorised Frobenius bound, +inf or NaN for an entry that is not finite.
    c.triangularView<Eigen::StrictlyUpper>().setZero();
    const double r = NormFrobeniusUpper(c).value();
    if (!(r < kInf)) continue;
    const double chol_err = AddUp(MulUp(GammaUp(double(n + 1)), MulUp(r, r)), diag_err);
    const double lambda = AddUp(AddUp(s, chol_err), gram_err);
    if (!single) return lambda;
    const double norm = AddUp(SqrtUp(lambda), conv);  // ||m||_2 <= ||m32||_2 + conv
    return MulUp(norm, norm);
  }
  return kInf;
}

}  // namespace

UpperBound NormL2UpperGram(const Eigen::MatrixXd& m, int threads, double* estimate, Deadline deadline, GramStats* stats,
                           GramWorkspace* workspace, GramPrecision precision) {
  GramStats local_stats;
  if (!stats) stats = &local_stats;
  GramWorkspace local_ws;
  GramWorkspace& ws = workspace ? *workspace : local_ws;
  if (m.size() == 0) return UpperBound(0.0);
  // Per column: finite, and the largest magnitude.
  Eigen::VectorXd col_max(m.cols());
  std::vector<char> col_flag(m.cols(), 0);
  ForColumnChunks(m.cols(), threads, [&](Eigen::Index c0, Eigen::Index cn) {
    for (Eigen::Index c = c0; c < c0 + cn; ++c) {
      col_flag[c] = !m.col(c).allFinite();
      col_max[c] = col_flag[c] ? 0.0 : m.col(c).cwiseAbs().maxCoeff();
    }
  });
  if (std::find(col_flag.begin(), col_flag.end(), 1) != col_flag.end()) return UpperBound(kInf);
  // Scale by 2^-e so that max |m_ij| is in [1, 2) (exact unless entries become subnormal,
  // which adds at most sqrt(rows cols) eta / 2 to the norm).
  const double amax = col_max.maxCoeff();
  if (amax == 0.0) return UpperBound(0.0);
  const int e = std::ilogb(amax);
  // Products with powers of two: exact unless a result is subnormal or zero. Every such
  // result of a nonzero entry counts as inexact (only the term below is added for it).
  Eigen::MatrixXd& ms = ws.scaled;
  ms.resize(m.rows(), m.cols());
  bool inexact = false;
  if (std::abs(e) < 1000) {
    const double factor = std::ldexp(1.0, -e);
    ForColumnChunks(m.cols(), threads, [&](Eigen::Index c0, Eigen::Index cn) {
      for (Eigen::Index c = c0; c < c0 + cn; ++c) {
        ms.col(c) = m.col(c) * factor;
        col_flag[c] = ((ms.col(c).array().abs() < std::numeric_limits<double>::min()) && (m.col(c).array() != 0.0)).any();
      }
    });
    inexact = std::find(col_flag.begin(), col_flag.end(), 1) != col_flag.end();
  } else {
    for (Eigen::Index i = 0; i < m.size(); ++i) {
      ms.data()[i] = std::ldexp(m.data()[i], -e);
      inexact |= std::ldexp(ms.data()[i], e) != m.data()[i];
    }
  }
  double est = 0;
  double ns = SqrtUp(std::max(0.0, GramLambdaMaxUp(ms, threads, &est, deadline, stats, ws, precision)));
  if (inexact) ns = AddUp(ns, MulUp(SqrtUp(double(m.rows()) * double(m.cols())), kEta));
  const double scale = std::ldexp(1.0, e);
  if (estimate) *estimate = std::sqrt(std::max(est, 0.0)) * scale;
  return UpperBound(std::isfinite(scale) ? MulUp(ns, scale) : kInf);
}

UpperBound NormL2UpperGram(const IntervalMatrix& a, int threads, double* estimate, Deadline deadline, GramStats* stats,
                           GramWorkspace* workspace, GramPrecision precision) {
  if (a.mid.size() == 0) return UpperBound(0.0);
  if (!a.rad.allFinite()) return UpperBound(kInf);
  // The radius is rounding-sized: its Frobenius norm (one pass) is enough unless it is not
  // negligible, when the Collatz-Wielandt bound below is tried as well.
  UpperBound rad = a.rad.maxCoeff() == 0.0 ? UpperBound(0.0) : NormFrobeniusUpper(a.rad);
  const UpperBound mid = NormL2UpperGram(a.mid, threads, estimate, deadline, stats, workspace, precision);
  if (rad.value() > 1e-9 * mid.value()) rad = Min(rad, NormL2UpperNonneg(a.rad));
  const UpperBound total = mid + rad;
  // The crude norms (three passes over a) only when the certificate failed.
  if (std::isfinite(total.value()) || Past(deadline)) return total;
  return Min(total, NormL2UpperCrude(a));
}

namespace {

void CheckInputs(const AttentionLayer& L, const Eigen::MatrixXd& x0, const CentreNormOptions& o) {
  if (const std::string m = o.IsValid(); !m.empty()) throw std::invalid_argument("CentreNormOptions: " + m);
  if (x0.cols() != L.d_model || x0.rows() < 1)
    throw std::invalid_argument("centre norm: x0 must be N x D with N >= 1, D = " + std::to_string(L.d_model));
}

int GroupTokens(const CentreNormOptions& o, int n, int d) {
  if (o.block_tokens > 0) return std::min(o.block_tokens, n);
  return std::clamp(int(o.block_limit / d), 1, n);
}

// How many deflation vectors the route takes: all it is allowed (at most N*D) without a
// deadline; with one, as many as its predicted time fits before the deadline with a margin
// of 1.3, and none (the plain super-blocks) when that is fewer than kMinDeflationVectors
// (or than asked, when fewer were). Not anytime, hence the margin. Measured on 2 cores, idle
// (docs/engines.md, "Deflation"), MiniLM layer 0, with the blocks' Gram matrices in single
// precision and the basis reorthogonalised on the threads: the whole route took 35.0 s,
// 52.1 s and 69.7 s at N = 64 with k = 300, 600 and 1000 (the basis 4.6, 9.9 and 20.7 s of
// it), and 15.7 s at N = 32 with k = 600 (the basis 3.6 s). The model: kPlainShare of the
// plain super-blocks' model (29.4 s at N = 64), kSecondsPerVector (N D)^2 per vector (the
// basis's J^T J product and the three GEMMs of every block with V and Y) and
// kSecondsPerVector2 N D k^2 (the basis's reorthogonalisation, V^T V, the Gram matrices of
// Y and E^T Y). It predicted 35.3, 51.5 and 74.4 s at N = 64 and 13.4 s at N = 32.
// Since the basis's products keep the centre's state (PointProducts, stop 33: a J^T J
// product at N = 64 went from 18 ms to 6.5 ms on the 2-core EPYC) and its Lanczos steps
// reorthogonalise once, the per-vector term is 1.6e-11 lower: the model predicts 32.4, 45.8
// and 65.3 s at N = 64 and 12.0 s at N = 32, against the EPYC's 52.3, 71.1, 100.8 and
// 20.7 s (1.4-1.7x: the EPYC runs this route about 1.5x the reference machine's time).
constexpr int kMinDeflationVectors = 32;
constexpr double kPlainShare = 0.68;
constexpr double kSecondsPerVector = 6.6e-11;   // times (N D)^2
constexpr double kSecondsPerVector2 = 2.2e-10;  // times N D k^2
// One J^T J product of the basis, fitted on the EPYC (the slower machine, so that it reads
// no load there): 6.5 ms at N D = 24576 is 1.1e-11 (N D)^2. With kSecondsPerVector2 it
// predicts 2.5, 5.9 and 12.1 s at N = 64 for k = 300, 600 and 1000 (2.3, 5.5 and 11.6 s
// measured) and 2.0 s at N = 32, k = 600 (2.8 s). It was 2.4e-11 while each product set
// the centre up again; a model that reads an idle machine's basis as 1.3x load costs the
// 0.1% balls their deflation (docs/engines.md, "Deflation").
constexpr double kSecondsPerProduct = 1.1e-11;

// The Lanczos basis of k vectors on an idle machine: its reorthogonalisation and its k
// J^T J products through the evaluator.
double IdleBasisSeconds(double nd, int k) {
  return kSecondsPerVector2 * nd * double(k) * k + kSecondsPerProduct * nd * nd * k;
}

// The plain super-blocks' share of the time (kPlainShare times their model).
double PlainSuperBlockSeconds(const AttentionLayer& L, int n, const CentreNormOptions& o) {
  CentreNormOptions plain = o;
  plain.deflation_vectors = 0;
  return kPlainShare * CentreNormSecondsEstimate(L, n, plain);
}

double SecondsLeft(std::chrono::steady_clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
}

// The deflation's basis comes from the evaluator's J^T J of the layer as it stands (attention
// alone, or the whole pre-LN sublayer X + MHA(LN(X))). Any basis gives a bound; one of
// another operator (MHA alone at LN(x0), or the sublayer without its residual) would give
// a loose one, so those run the plain super-blocks.
bool BasisDescribesTheEnclosure(const AttentionLayer& L, const CentreNormOptions& o) {
  return !L.layer_norm || (!o.mha_only && !o.exclude_residual);
}

// After a basis of k vectors that took basis_seconds: how many of its columns the block
// pass can take before o.deadline (0: fewer than min(32, k)). k was sized
// for an idle machine; the basis's own time against its idle model gives the slowdown.
int DeflationVectorsAfterBasis(const AttentionLayer& L, int n, const CentreNormOptions& o, int k, double basis_seconds) {
  if (o.deadline == std::chrono::steady_clock::time_point::max() || k <= 0) return std::max(k, 0);
  const double nd = double(n) * L.d_model;
  // Within 35% of the idle model is the model's own scatter on an idle machine (1.0 to 1.3
  // measured at N = 32), not load.
  const double ratio = basis_seconds / IdleBasisSeconds(nd, k);
  const double load = ratio <= 1.35 ? 1.0 : ratio;
  const double budget = SecondsLeft(o.deadline) / (1.3 * load) - PlainSuperBlockSeconds(L, n, o);
  if (!(budget > 0)) return 0;
  const int kept = int(std::min<double>(k, std::floor(budget / (kSecondsPerVector * nd * nd))));
  // Under 3x load (three runs on 2 cores) MiniLM N = 32 kept 56 and 131 of about 600
  // vectors, and the blocks' certificates then ran out of time: 14.8 and 15.1 against the
  // plain super-blocks' 6.353. Fewer than half of k then meant the plain super-blocks; now
  // the deflated pass's second block measures the pace (and retries with fewer columns or
  // gives up), so any kMinDeflationVectors are tried: a slower machine reads as load too
  // (an EPYC's basis ran 1.5x its idle model), and the model's k left it none.
  return kept >= std::min(kMinDeflationVectors, k) ? kept : 0;
}

}  // namespace

int DeflationVectorsThatFit(const AttentionLayer& L, int n, const CentreNormOptions& o, double extra_seconds,
                            double slowdown) {
  const double nd = double(n) * L.d_model;
  const int asked = int(std::min<double>(o.deflation_vectors, nd));
  if (asked <= 0 || o.deadline == std::chrono::steady_clock::time_point::max()) return std::max(asked, 0);
  // The largest k with kSecondsPerVector (N D)^2 k + kSecondsPerVector2 N D k^2 <= budget.
  const double budget = SecondsLeft(o.deadline) / (1.3 * std::max(1.0, slowdown)) - PlainSuperBlockSeconds(L, n, o) - extra_seconds;
  if (!(budget > 0)) return 0;
  const double a = kSecondsPerVector * nd * nd, b = kSecondsPerVector2 * nd;
  const double fits = 2 * budget / (a + std::sqrt(a * a + 4 * b * budget));
  const int k = int(std::min<double>(asked, std::floor(fits)));
  return k >= std::min(kMinDeflationVectors, asked) ? k : 0;
}

std::chrono::steady_clock::time_point BasisDeadline(std::chrono::steady_clock::time_point deadline, double cap_seconds) {
  if (deadline == std::chrono::steady_clock::time_point::max()) return deadline;
  const auto now = std::chrono::steady_clock::now();
  if (deadline <= now) return deadline;
  const auto cap = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::min(cap_seconds, 1e9)));
  return now + std::min<std::chrono::steady_clock::duration>((deadline - now) / 2, cap);
}

namespace {

// w -= Q (Q^T w), once (`passes` = 1) or twice (classical Gram-Schmidt: twice is enough),
// the rows of Q in chunks on `threads` workers: both products read all of Q, so the memory
// traffic is what is shared out.
void Reorthogonalise(const Eigen::Ref<const Eigen::MatrixXd>& q, Eigen::VectorXd& w, int threads, int passes = 2) {
  constexpr Eigen::Index kChunk = 4096;
  const Eigen::Index rows = q.rows();
  const int chunks = int((rows + kChunk - 1) / kChunk);
  const int workers = WorkerCount(threads, chunks);
  std::vector<Eigen::VectorXd> partial(workers);
  for (int pass = 0; pass < passes; ++pass) {
    for (auto& p : partial) p.setZero(q.cols());
    ParallelFor(chunks, workers, [&](int c, int worker) {
      const Eigen::Index r0 = c * kChunk, rn = std::min(kChunk, rows - r0);
      partial[worker].noalias() += q.middleRows(r0, rn).transpose() * w.segment(r0, rn);
    });
    Eigen::VectorXd h = partial[0];
    for (int t = 1; t < workers; ++t) h += partial[t];
    ParallelFor(chunks, workers, [&](int c, int) {
      const Eigen::Index r0 = c * kChunk, rn = std::min(kChunk, rows - r0);
      w.segment(r0, rn).noalias() -= q.middleRows(r0, rn) * h;
    });
  }
}

}  // namespace

DeflationBasis DeflationBasisOf(const AttentionLayer& layer, const Eigen::MatrixXd& x0, int k, int threads,
                                std::chrono::steady_clock::time_point deadline,
                                const std::function<int(int steps, double seconds)>& resize) {
  const auto t0 = std::chrono::steady_clock::now();
  const long nd = long(x0.rows()) * x0.cols();
  if (k < 1 || k > nd) throw std::invalid_argument("deflation: k must be in [1, N D]");
  const JacobianProducts products = JacobianProductsOf(layer, x0, threads);
  DeflationBasis out;
  Eigen::MatrixXd& q = out.v;
  Eigen::MatrixXd& y = out.y;  // y_j = fl(J q_j), the first half of each step's J^T J q_j
  q.resize(nd, k);
  y.resize(nd, k);
  std::mt19937_64 rng(20261205);
  std::normal_distribution<double> gauss(0.0, 1.0);
  for (long i = 0; i < nd; ++i) q(i, 0) = gauss(rng);
  q.col(0).normalize();
  Eigen::VectorXd w(nd);
  int cols = k;
  int target = k;
  double beta_prev = 0;  // ||w|| of the step before: q_j's coefficient beta_{j-1}
  for (int j = 0; j + 1 < k; ++j) {
    if (resize && j > 0 && j % 16 == 0) target = std::clamp(resize(j, SecondsSince(t0)), 1, target);
    if (Past(deadline) || j + 1 >= target) {
      cols = j + 1;
      break;
    }
    products.jvp(q.col(j).data(), y.col(j).data());
    products.vjp(y.col(j).data(), w.data());
    const double before = w.norm();
    // The three-term recurrence first (Lanczos: J^T J q_j - alpha_j q_j - beta_{j-1} q_{j-1}),
    // then one pass of classical Gram-Schmidt against the whole basis, which only has the
    // rounding's components left to remove; a second pass where the first removed much
    // (Daniel, Gragg, Kaufman and Stewart's test, ||w|| below ||w before|| / sqrt 2). Each
    // pass reads all of Q: at N D = 24576 and k = 1000 two passes every step took about
    // 12 s of the basis's 30 s (the products 18 s before PointProducts, 6.5 s since); one
    // pass about 5 s.
    const double alpha = q.col(j).dot(w);
    w -= alpha * q.col(j);
    if (j > 0) w -= beta_prev * q.col(j - 1);
    const double recurred = w.norm();
    Reorthogonalise(q.leftCols(j + 1), w, threads, 1);
    double b = w.norm();
    if (b < recurred / std::sqrt(2.0)) {
      Reorthogonalise(q.leftCols(j + 1), w, threads, 1);
      b = w.norm();
    }
    if (!(b > 1e-8 * before) || !(b > 1e-300)) {  // (numerically) invariant: a random direction
      for (long i = 0; i < nd; ++i) w(i) = gauss(rng);
      Reorthogonalise(q.leftCols(j + 1), w, threads);
      b = 0;  // J^T J q_{j+1} has no known component along q_j
    }
    q.col(j + 1) = w / w.norm();
    beta_prev = b;
  }
  products.jvp(q.col(cols - 1).data(), y.col(cols - 1).data());
  q.conservativeResize(nd, cols);
  y.conservativeResize(nd, cols);
  return out;
}

namespace {

// out += sign * a * b in floating point (round to nearest), the columns of b split over the
// workers. sign is +1 or -1 (exact), which SumErrorF's error model assumes.
template <class A, class B>
void GemmInto(const A& a, const B& b, double sign, Eigen::Ref<Eigen::MatrixXd> out, int threads) {
  if (sign != 1.0 && sign != -1.0) throw std::invalid_argument("GemmInto: sign must be +1 or -1");
  const int workers = WorkerCount(threads, int(std::min<Eigen::Index>(b.cols(), 8)));
  const Eigen::Index chunk = (b.cols() + workers - 1) / workers;
  ParallelFor(workers, workers, [&](int t, int) {
    const Eigen::Index c0 = t * chunk, width = std::min(chunk, b.cols() - c0);
    if (width > 0) out.middleCols(c0, width).noalias() += sign * (a * b.middleCols(c0, width));
  });
}

// A Frobenius-norm bound on the rounding error of a floating sum of `terms` terms per entry
// (products rounded once, or addends), in any order, with or without FMA: entrywise
// |fl(s) - s| <= gamma_terms sum |terms| + 2 terms eta (Higham, eq. 3.13, with underflow), so
// ||fl(S) - S||_F <= gamma_terms ||sum |terms| ||_F + 2 terms eta sqrt(rows cols), where
// abs_terms_f >= || sum |terms| ||_F.
double SumErrorF(double terms, double abs_terms_f, double rows, double cols) {
  return AddUp(MulUp(GammaUp(terms), abs_terms_f), MulUp(MulUp(2.0 * terms, kEta), SqrtUp(MulUp(rows, cols))));
}

// ||J||_2 from k deflation vectors V (nd x k), any Y (nd x k, J V in floating point) and
// G x G token groups (docs/engines.md, "Deflation"). With E = J - Y V^T, every unit x splits
// as x = V a + w (a = V^T x, w = x - V a), and
//   J x = Y a + E V a + E w = (Y + D) a + E w,   D = E V,
//   ||J x||^2 <= alpha ||a||^2 + 2 beta ||a|| ||w|| + gamma ||w||^2
//            <= lambda_max([[alpha, beta], [beta, gamma]]) (||a||^2 + ||w||^2),
// with alpha^1/2 >= ||Y + D||, gamma^1/2 >= ||E|| (super-blocks: E_IK = J_IK - Y_I V_K^T) and
// beta >= ||(Y + D)^T E|| <= ||E^T Y|| + ||D|| ||E||; and ||a||^2 + ||w||^2 =
// x^T (I + V (V^T V - I) V^T) x <= 1 + eps (1 + eps), eps >= ||V^T V - I||.
// One pass over the blocks: each enclosure [M +- R] of J_IK gives the floating
// F = fl(M - Y_I V_K^T), and ||E_IK - F||_F <= ||R||_F + the rounding of F; then D and E^T Y
// are accumulated from F by floating GEMMs, their rounding and the F - E terms bounded
// norm-wise. Three GEMMs of m x m x k per block and the block's Gram certificate.
// `block(r0, r1, c0, c1, &out)` encloses the block of J for tokens [r0, r1) x [c0, c1) in
// out (every entry written; out's storage is reused from block to block).
using BlockAssembler = std::function<void(int r0, int r1, int c0, int c1, IntervalMatrix* out)>;
// With may_abandon, the second block's time (the first is slowed by first-touch pages) is a
// probe of the machine's present speed: when
// every block at that pace would not fit before the deadline, the pass stops there (+inf,
// rep->deflation_abandoned) so that the caller can run the anytime plain super-blocks (a
// deflated block left with its Frobenius norm costs far more than a plain one), or the pass
// again with fewer columns: *fewer_vectors is how many would fit at that pace (the GEMMs'
// time scales with k, the assembly's and the certificate's do not), 0 when that is under
// kMinDeflationVectors.
UpperBound DeflatedSuperBlockBound(const BlockAssembler& block, int n, int d, const Eigen::MatrixXd& v,
                                   const Eigen::MatrixXd& y, int g, const CentreNormOptions& o, CentreNormReport* rep,
                                   bool may_abandon = false, int* fewer_vectors = nullptr) {
  if (fewer_vectors) *fewer_vectors = 0;
  const ScopedSoundFpEnvironment fp_guard;
  const int k = int(v.cols());
  const long nd = long(n) * d;
  const int groups = (n + g - 1) / g;
  auto rows = [&](int t) { return std::pair<long, long>{long(t) * g * d, long(std::min(n, (t + 1) * g) - t * g) * d}; };
  if (!v.allFinite() || !y.allFinite()) return UpperBound(kInf);  // no bound from a basis that overflowed
  const IntervalMatrix vtv = Mul(Eigen::MatrixXd(v.transpose()), v);
  const double eps = NormL2UpperInterval(vtv - IntervalMatrix::Point(Eigen::MatrixXd::Identity(k, k))).value();
  const double v_norm = SqrtUp(AddUp(1.0, eps));  // >= ||V||_2, and so >= ||V_K||_2
  std::vector<double> y_f(groups), v_f(groups);   // >= ||Y_I||_F, ||V_I||_F
  for (int t = 0; t < groups; ++t) {
    const auto [r, m] = rows(t);
    y_f[t] = NormFrobeniusUpper(Eigen::MatrixXd(y.middleRows(r, m))).value();
    v_f[t] = NormFrobeniusUpper(Eigen::MatrixXd(v.middleRows(r, m))).value();
  }
  // fl(sum_K F_IK V_K) and fl(sum_I F_IK^T Y_I), and what bounds their distance from D and
  // E^T Y: per row group, sum ||F|| ||.||_F (rounding) and sum ||E - F|| ||.|| (the enclosure).
  Eigen::MatrixXd d_fl = Eigen::MatrixXd::Zero(nd, k), ety_fl = Eigen::MatrixXd::Zero(nd, k);
  std::vector<double> d_abs(groups, 0.0), d_enc(groups, 0.0), ety_abs(groups, 0.0), ety_enc(groups, 0.0);
  Eigen::MatrixXd b(groups, groups);
  const double m_max = double(g) * d;
  // Per block, modelled then measured: the Gram certificate, and the rest (the assembly and
  // the three GEMMs). A block gets its certificate when that and the rest of every block
  // still to come fit before the deadline (anytime, as the plain super-blocks).
  double gram_s = m_max * m_max * m_max * (0.5 + 1.0 / 3) / kGramFlopsPerSecond, rest_s = 0;
  const bool frobenius = long(g) * d > o.block_limit;
  IntervalMatrix blk;        // one block's storage, reused (no fresh pages per block)
  GramWorkspace workspace;  // and its certificate's
  int done = 0;
  for (int i = 0; i < groups; ++i) {
    const auto [ri, mi] = rows(i);
    for (int c = 0; c < groups; ++c) {
      if (Past(o.deadline)) return UpperBound(kInf);
      const auto [rc, mc] = rows(c);
      const auto t_rest = std::chrono::steady_clock::now();
      block(i * g, std::min(n, (i + 1) * g), c * g, std::min(n, (c + 1) * g), &blk);
      const double assembly_s = SecondsSince(t_rest);
      const double m_f = NormFrobeniusUpper(blk.mid).value();
      const double r_f = NormFrobeniusUpper(blk.rad).value();  // +inf for a NaN radius
      Eigen::MatrixXd& f = blk.mid;  // F, in place of M
      GemmInto(y.middleRows(ri, mi), v.middleRows(rc, mc).transpose(), -1.0, f, o.threads);
      // ||E_IK - F||_F <= ||R||_F + the rounding of F's k + 1 terms (|M| + |Y_I| |V_K|^T).
      const double rho = AddUp(r_f, SumErrorF(k + 1, AddUp(m_f, MulUp(y_f[i], v_f[c])), double(mi), double(mc)));
      const double f_f = NormFrobeniusUpper(f).value();
      GemmInto(f, v.middleRows(rc, mc), 1.0, d_fl.middleRows(ri, mi), o.threads);
      GemmInto(f.transpose(), y.middleRows(ri, mi), 1.0, ety_fl.middleRows(rc, mc), o.threads);
      d_abs[i] = AddUp(d_abs[i], MulUp(f_f, v_f[c]));
      d_enc[i] = AddUp(d_enc[i], MulUp(rho, v_norm));
      ety_abs[c] = AddUp(ety_abs[c], MulUp(f_f, y_f[i]));
      ety_enc[c] = AddUp(ety_enc[c], MulUp(rho, y_f[i]));
      const double block_rest_s = SecondsSince(t_rest);
      rest_s = std::max(rest_s, block_rest_s);
      const double left = std::chrono::duration<double>(o.deadline - std::chrono::steady_clock::now()).count();
      double dense = kInf;
      if (!frobenius && gram_s + rest_s * double(groups * groups - done - 1) <= left) {
        const auto t_block = std::chrono::steady_clock::now();
        dense = NormL2UpperGram(f, o.threads, nullptr, o.deadline, &rep->gram, &workspace, GramPrecision::kSingle).value();
        gram_s = SecondsSince(t_block);
      }
      if (std::isfinite(dense)) ++rep->exact_blocks;
      b(i, c) = AddUp(std::isfinite(dense) ? dense : f_f, rho);
      ++done;
      if (may_abandon && done == std::min(2, groups * groups - 1) && !frobenius &&
          1.15 * (block_rest_s + gram_s) * double(groups * groups - done) > SecondsLeft(o.deadline)) {
        rep->deflation_abandoned = true;
        if (fewer_vectors) {
          // Every block again, with a margin of 1.2: per block, the certificate and the
          // assembly, and the GEMMs at k' / k of their time.
          const double per_block = SecondsLeft(o.deadline) / (1.2 * double(groups * groups));
          const double gemm_s = std::max(block_rest_s - assembly_s, 1e-9);
          const double fits = double(k) * (per_block - gram_s - assembly_s) / gemm_s;
          const int kept = int(std::max(0.0, std::floor(std::min(fits, 0.9 * k))));  // a real step down
          if (kept >= kMinDeflationVectors) *fewer_vectors = kept;
        }
        return UpperBound(kInf);
      }
    }
  }
  // Each entry of D and E^T Y sums nd products (the blocks' GEMMs and their accumulation).
  double d_err = 0, ety_err = 0;
  for (int t = 0; t < groups; ++t) {
    const double m = double(rows(t).second);
    d_err = AddUp(d_err, AddUp(SumErrorF(double(nd), d_abs[t], m, k), d_enc[t]));
    ety_err = AddUp(ety_err, AddUp(SumErrorF(double(nd), ety_abs[t], m, k), ety_enc[t]));
  }
  if (!b.allFinite()) return UpperBound(kInf);  // a block that overflowed
  const double d_norm = AddUp(NormFrobeniusUpper(d_fl).value(), d_err);
  const double gamma_root = NormL2UpperNonneg(b).value();
  const double alpha_root = AddUp(NormL2Upper(y).value(), d_norm);
  const double beta = AddUp(AddUp(NormL2Upper(ety_fl).value(), ety_err), MulUp(d_norm, gamma_root));
  const double alpha = MulUp(alpha_root, alpha_root), gamma = MulUp(gamma_root, gamma_root);
  const double half_sum = DivUp(AddUp(alpha, gamma), 2.0);
  const double half_diff = DivUp(std::max(SubUp(alpha, gamma), SubUp(gamma, alpha)), 2.0);
  const double lambda = AddUp(half_sum, SqrtUp(AddUp(MulUp(half_diff, half_diff), MulUp(beta, beta))));
  rep->deflation_vectors = k;  // the columns of V (fewer than asked when the deadline cut the Lanczos run)
  rep->deflated_top = alpha_root;
  rep->deflated_rest = gamma_root;
  rep->deflation_coupling = beta;
  rep->deflation_orthogonality = eps;
  return UpperBound(SqrtUp(MulUp(lambda, AddUp(1.0, MulUp(eps, AddUp(1.0, eps))))));
}

// The order in which the super-blocks get their dense certificates: decreasing share
// u_I B_IK v_K of ||B||_2, with (u, v) B's top singular pair (floating power iteration on
// B^T B: it only orders the work, every B_IK stays a bound whatever the order).
std::vector<std::pair<int, int>> BlocksByShare(const Eigen::MatrixXd& b) {
  const Eigen::Index groups = b.rows();
  Eigen::VectorXd v = Eigen::VectorXd::Ones(groups), u = b * v;
  for (int it = 0; it < 100 && u.norm() > 0; ++it) {
    v = b.transpose() * u;
    v /= v.norm();
    u = b * v;
  }
  std::vector<std::pair<int, int>> order;
  std::vector<double> share;
  for (int i = 0; i < groups; ++i)
    for (int k = 0; k < groups; ++k) order.push_back({i, k});
  for (const auto& [i, k] : order) share.push_back(u(i) * b(i, k) * v(k));
  std::vector<size_t> idx(order.size());
  for (size_t t = 0; t < idx.size(); ++t) idx[t] = t;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return share[x] > share[y]; });
  std::vector<std::pair<int, int>> sorted;
  for (const size_t t : idx) sorted.push_back(order[t]);
  return sorted;
}

// ||J||_2 <= ||B||_2, B_IK >= ||J_IK||_2 (the norm of a block matrix is at most the norm
// of the matrix of its block norms), in two passes:
//   1. every B_IK is the block's Frobenius norm (one assembly each): a bound once it ends;
//   2. the blocks in decreasing share of ||B|| (BlocksByShare) are assembled again and get
//      their dense certificate, min(Frobenius, dense), while the assembly and the Gram
//      certificate are predicted to fit before the deadline.
// Anytime after the first pass: the deadline costs tightness, not the bound.
UpperBound PlainSuperBlockBound(const CentreState& S, const CentreNormOptions& o, CentreNormReport& rep) {
  const int n = S.n, d = S.d;
  const int g = GroupTokens(o, n, d);
  const int groups = (n + g - 1) / g;
  rep.method = "super_block";
  rep.groups = groups;
  rep.group_tokens = g;
  rep.frobenius_blocks = long(g) * d > o.block_limit;
  auto assemble = [&](int ir, int kc, IntervalMatrix* blk) {
    const auto t_block = std::chrono::steady_clock::now();
    AssembleBlockInto(S, ir * g, std::min(n, (ir + 1) * g), kc * g, std::min(n, (kc + 1) * g), o.threads, blk);
    const double s = SecondsSince(t_block);
    rep.assembly_seconds += s;
    return s;
  };
  Eigen::MatrixXd b(groups, groups);
  IntervalMatrix blk;  // one block's storage, reused (no fresh pages per block)
  GramWorkspace workspace;  // and its certificate's
  double assembly_s = 0;  // per block, the largest measured
  for (int ir = 0; ir < groups; ++ir)
    for (int kc = 0; kc < groups; ++kc) {
      if (Past(o.deadline)) {
        rep.timed_out = true;
        return UpperBound(kInf);
      }
      assembly_s = std::max(assembly_s, assemble(ir, kc, &blk));
      b(ir, kc) = NormFrobeniusUpper(blk).value();
    }
  if (!rep.frobenius_blocks) {
    const double m = double(g) * d;
    double gram_s = m * m * m * (0.5 + 1.0 / 3) / kGramFlopsPerSecond;  // per block (model, then measured)
    for (const auto& [ir, kc] : BlocksByShare(b)) {
      if (assembly_s + gram_s > SecondsLeft(o.deadline)) break;
      assemble(ir, kc, &blk);
      const auto t_gram = std::chrono::steady_clock::now();
      const double dense =
          NormL2UpperGram(blk, o.threads, nullptr, o.deadline, &rep.gram, &workspace, GramPrecision::kSingle).value();
      gram_s = SecondsSince(t_gram);
      if (!std::isfinite(dense)) continue;  // the deadline passed inside: the Frobenius norm stays
      ++rep.exact_blocks;
      b(ir, kc) = std::min(b(ir, kc), dense);
    }
  }
  return NormL2UpperNonneg(b);
}

// ---------------------------------------------------------------------------------------
// The heads factored: dot-product MHA alone at any size, in seconds (docs/engines.md,
// "Centre norm: the heads factored"). J = V + K + Q with block (i, j)
//   V_ij = sum_h P^h_ij W_h                  (the values, W_h = Wo_h Wv_h)
//   K_ij = sum_h a^h_ij g^h_i^T              (the keys: token j's key moves logit s_ij)
//   Q_ij = delta_ij E_i, E_i = sum_h A_i^hT Bt^h  (the queries: block diagonal)
// and ||J|| <= ||V|| + ||K|| + max_i ||E_i||, each bounded through the heads' factors:
//   ||V|| <= ||Pbar|| ||sum_h W_h|| + min(||Wo|| ||Wv|| max_h ||P_h - Pbar||, sum_h ||P_h - Pbar|| ||W_h||),
//            Pbar = mean_h P_h (also ||Wo|| ||Wv|| max_h ||P_h|| and sum_h ||P_h|| ||W_h||):
//            sum_h D_h (x) Wo_h Wv_h = (I (x) Wo) blockdiag_h(D_h (x) I) (I (x) Wv);
//   ||K|| <= ||Phi||, Phi the (H N) x D stack of the rows alpha_i g^h_i, alpha_i >= ||A_i||,
//            A_i = [a^h_ij]_{j,h} (D x N H): ||K x||^2 = sum_i ||A_i y_i||^2 with
//            (y_i)_{jh} = g^h_i . x_j, so <= sum_j x_j^T (sum_{i,h} alpha_i^2 g g^T) x_j.
// (and the same with Wo taken out, per-head alpha^h_i). The three paths are nearly
// orthogonal where the heads attend diffusely, so the keys and the queries also get one
// bound with their cross term (KeysAndQueriesUp), and the values' mean with both another
// (PathsUp); the smallest route is taken. Tight where the heads attend
// diffusely (random BERT-base-sized weights: 9.203 against sigma_1 = 2.795, where the
// super-blocks give 61.5); far looser than the super-blocks where they are sharp (MiniLM,
// N = 64: 26.70 against 3.48), so the centre norm takes the smaller.
// ---------------------------------------------------------------------------------------
// The most memory the cross term of the keys and queries keeps (every E_i, N D^2 doubles:
// 0.6 GB at BERT-base size).
constexpr double kFactoredCrossBytes = 1.5e9;

struct FactoredParts {
  UpperBound value{kInf}, keys{kInf}, queries{kInf};
  UpperBound keys_and_queries{kInf};  // >= ||K + Q||, with their cross term
  UpperBound crossed{kInf};           // >= ||J||: the values' mean with K + Q, cross terms and all (PathsUp)
  UpperBound Total() const { return Min(value + Min(keys + queries, keys_and_queries), crossed); }
};

// >= ||K + Q|| from Phi = [alpha_i g^h_i] (keys: ||Phi|| <= phi) and the queries' blocks E_j
// (||E_j|| <= e_j), through the transpose: column token j of (K + Q)^T u is
// Phi^T z_j + E_j^T u_j, (z_j)_{hi} = a^h_ij . u_i / alpha_i, and sum_j ||z_j||^2 =
// sum_i ||A_i^T u_i||^2 / alpha_i^2 <= ||u||^2. So for unit u
//   ||(K + Q)^T u||^2 <= phi^2 sum_j ||z_j||^2 + sum_j e_j^2 ||u_j||^2 + 2 sum_j c_j ||z_j|| ||u_j||
//                     <= phi^2 + theta max_j c_j + max_j (e_j^2 + c_j / theta)   (any theta > 0)
// with c_j >= ||Phi E_j^T|| (2 z w <= theta z^2 + w^2 / theta). The keys' rows and the queries'
// blocks are nearly orthogonal where the heads attend diffusely, and c_j << phi e_j there.
UpperBound KeysAndQueriesUp(double phi, const std::vector<double>& e, const std::vector<double>& c) {
  double e2_max = 0, c_max = 0;
  for (size_t j = 0; j < e.size(); ++j) {
    e2_max = std::max(e2_max, MulUp(e[j], e[j]));
    c_max = std::max(c_max, c[j]);
  }
  if (!std::isfinite(phi) || !std::isfinite(e2_max) || !std::isfinite(c_max)) return UpperBound(kInf);
  double best = kInf;  // >= ||(K + Q)^T u||^2
  for (double theta = 1.0 / 16; theta <= 16; theta *= 2) {
    double rest = 0;
    for (size_t j = 0; j < e.size(); ++j) rest = std::max(rest, AddUp(MulUp(e[j], e[j]), DivUp(c[j], theta)));
    best = std::min(best, AddUp(AddUp(MulUp(phi, phi), MulUp(theta, c_max)), rest));
  }
  return UpperBound(SqrtUp(best));
}

// >= ||J|| with the values split as V = Vbar + Vs, Vbar = Pbar (x) W (W = sum_h W_h) and
// ||Vs|| <= spread: column token j of Vbar^T u is W^T r_j, r_j = sum_i Pbar_ij u_i with
// sum_j ||r_j||^2 <= ||Pbar||^2, and that of (K + Q)^T u is Phi^T z_j + E_j^T u_j
// (KeysAndQueriesUp), so for unit u
//   ||(Vbar + K + Q)^T u||^2 <= ||Vbar||^2 + ||K + Q||^2 + 2 sum_j ||r_j|| (x1 ||z_j|| + x2_j ||u_j||)
//                            <= mean^2 + kq^2 + 2 ||Pbar|| (x1 + max_j x2_j),
// with x1 >= ||W Phi^T||, x2_j >= ||W E_j^T||, mean >= ||Pbar|| ||W||, kq >= ||K + Q||; then
// ||J|| <= that + spread. Random weights put W, the keys' rows and the queries' blocks in
// nearly orthogonal directions (BERT-base size: ||Phi W^T|| = 4.78 against ||Phi|| ||W|| = 9.08).
UpperBound PathsUp(UpperBound mean, UpperBound kq, UpperBound spread, UpperBound p_bar, double x1,
                   const std::vector<double>& x2) {
  const double x2_max = *std::max_element(x2.begin(), x2.end());
  const double cross = MulUp(2.0, MulUp(p_bar.value(), AddUp(x1, x2_max)));
  const double sq = AddUp(AddUp(MulUp(mean.value(), mean.value()), MulUp(kq.value(), kq.value())), cross);
  if (!std::isfinite(sq)) return UpperBound(kInf);
  return UpperBound(SqrtUp(sq)) + spread;
}

FactoredParts FactoredHeadsBound(const CentreState& S, const AttentionLayer& L, int threads, Deadline deadline) {
  FactoredParts out;
  const int n = S.n, d = S.d, hs = S.heads;
  if (!S.dot || S.ln || S.identity) return out;
  // The values.
  IntervalMatrix p_sum = S.head[0].p, w_sum = S.head[0].w;
  for (int h = 1; h < hs; ++h) {
    p_sum = p_sum + S.head[h].p;
    w_sum = w_sum + S.head[h].w;
  }
  const IntervalMatrix p_bar = Scale(Interval(1.0) / Interval(double(hs)), p_sum);
  std::vector<double> p_norm(hs), dev_norm(hs), w_norm(hs);
  ParallelFor(hs, WorkerCount(threads, hs), [&](int h, int) {
    p_norm[h] = NormL2UpperGram(S.head[h].p, 1).value();
    dev_norm[h] = NormL2UpperGram(S.head[h].p - p_bar, 1).value();
    w_norm[h] = NormL2UpperGram(S.head[h].w, 1).value();
  });
  if (Past(deadline)) return out;
  const UpperBound wo_norm = NormL2UpperGram(L.wo, threads);
  const UpperBound wo_wv = MulNonneg(wo_norm, NormL2UpperGram(Eigen::MatrixXd(L.wv.transpose()), threads));
  UpperBound spread_heads(0.0), whole_heads(0.0);
  for (int h = 0; h < hs; ++h) {
    spread_heads = spread_heads + MulNonneg(UpperBound(dev_norm[h]), UpperBound(w_norm[h]));
    whole_heads = whole_heads + MulNonneg(UpperBound(p_norm[h]), UpperBound(w_norm[h]));
  }
  // ||(I (x) Wo) blockdiag_h(D_h (x) I) (I (x) Wv)|| <= ||[s_h Wo_h]_h|| ||[(||D_h|| / s_h) Wv_h]_h||
  // for any s_h > 0 (one factor's columns, the other's rows scaled): s_h = 1 and
  // s_h = sqrt(||D_h||) besides the common max_h ||D_h||.
  const auto scaled_pair = [&](const std::vector<double>& dn) {
    const int dv = L.head_dim_v;
    std::vector<Interval> col_scale(size_t(hs) * dv), row_scale(size_t(hs) * dv);
    for (int h = 0; h < hs; ++h)
      for (int c = 0; c < dv; ++c) {
        col_scale[size_t(h) * dv + c] = Sqrt(Interval(dn[h]));
        row_scale[size_t(h) * dv + c] = Interval(dn[h]);
      }
    const IntervalMatrix wo_t = IntervalMatrix::Point(Eigen::MatrixXd(L.wo.transpose())), wv = IntervalMatrix::Point(L.wv);
    const UpperBound rows_only = MulNonneg(wo_norm, NormL2UpperGram(ScaleRows(wv, row_scale), threads));
    const UpperBound split = MulNonneg(NormL2UpperGram(ScaleRows(wo_t, col_scale), threads),
                                       NormL2UpperGram(ScaleRows(wv, col_scale), threads));
    return Min(rows_only, split);
  };
  const UpperBound spread = Min(Min(MulNonneg(wo_wv, UpperBound(*std::max_element(dev_norm.begin(), dev_norm.end()))), spread_heads),
                                scaled_pair(dev_norm));
  const UpperBound p_bar_norm = NormL2UpperGram(p_bar, threads), w_sum_norm = NormL2UpperGram(w_sum, threads);
  const UpperBound mean = MulNonneg(p_bar_norm, w_sum_norm);
  out.value = Min(Min(mean + spread, MulNonneg(wo_wv, UpperBound(*std::max_element(p_norm.begin(), p_norm.end())))),
                  Min(whole_heads, scaled_pair(p_norm)));
  // Per query token i: alpha_i >= ||A_i|| and ||E_i||.
  IntervalMatrix bt_stack(Eigen::MatrixXd::Zero(long(hs) * n, d), Eigen::MatrixXd::Zero(long(hs) * n, d));
  for (int h = 0; h < hs; ++h) {
    bt_stack.mid.middleRows(long(h) * n, n) = S.head[h].bt.mid;
    bt_stack.rad.middleRows(long(h) * n, n) = S.head[h].bt.rad;
  }
  const double mb_f = NormFrobeniusUpper(bt_stack.mid).value(), rb_f = NormFrobeniusUpper(bt_stack.rad).value();
  std::vector<double> alpha(n, kInf), e_norm(n, kInf);
  // For the cross term: every E_i's floating midpoint, a bound on its norm and on its
  // distance to E_i (Frobenius), where they fit in memory.
  const bool keep_e = double(n) * d * d * sizeof(double) <= kFactoredCrossBytes;
  std::vector<Eigen::MatrixXd> e_mids(keep_e ? n : 0);
  std::vector<double> e_mid_norm(n, kInf), e_dist(n, kInf);
  const auto t_rows = std::chrono::steady_clock::now();
  ParallelFor(n, WorkerCount(threads, n), [&](int i, int) {
    if (Past(deadline)) return;
    IntervalMatrix a_stack(Eigen::MatrixXd::Zero(long(hs) * n, d), Eigen::MatrixXd::Zero(long(hs) * n, d));
    for (int h = 0; h < hs; ++h) {
      const HeadCentre& H = S.head[h];
      const IntervalMatrix a = ScaledDifferenceRows(H.u, 0, n, H.ubar, i, H.p.mid.row(i).transpose().array(),
                                                    H.p.rad.row(i).transpose().array());
      a_stack.mid.middleRows(long(h) * n, n) = a.mid;
      a_stack.rad.middleRows(long(h) * n, n) = a.rad;
    }
    alpha[i] = NormL2UpperGram(a_stack, 1).value();
    // E_i = a^T bt about fl(Ma^T Mb): one GEMM, its rounding (SumErrorF, |Ma|^T |Mb| <=
    // ||Ma||_F ||Mb||_F) and the radii norm-wise (|Ma|^T Rb + Ra^T |Mb| + Ra^T Rb).
    const double ma_f = NormFrobeniusUpper(a_stack.mid).value(), ra_f = NormFrobeniusUpper(a_stack.rad).value();
    Eigen::MatrixXd e_mid = a_stack.mid.transpose() * bt_stack.mid;
    e_mid_norm[i] = NormL2UpperGram(e_mid, 1).value();
    e_dist[i] = AddUp(SumErrorF(double(hs) * n, MulUp(ma_f, mb_f), d, d),
                      AddUp(MulUp(ma_f, rb_f), MulUp(ra_f, AddUp(mb_f, rb_f))));
    e_norm[i] = AddUp(e_mid_norm[i], e_dist[i]);
    if (keep_e) e_mids[i] = std::move(e_mid);
  });
  const double rows_s = SecondsSince(t_rows);
  if (Past(deadline)) return out;
  out.queries = UpperBound(*std::max_element(e_norm.begin(), e_norm.end()));
  // The keys: Phi = [alpha_i g^h_i] over (h, i).
  IntervalMatrix g_stack(Eigen::MatrixXd::Zero(long(hs) * n, d), Eigen::MatrixXd::Zero(long(hs) * n, d));
  std::vector<Interval> scale(size_t(hs) * n);
  for (int h = 0; h < hs; ++h) {
    g_stack.mid.middleRows(long(h) * n, n) = S.head[h].g.mid;
    g_stack.rad.middleRows(long(h) * n, n) = S.head[h].g.rad;
    for (int i = 0; i < n; ++i) scale[size_t(h) * n + i] = Interval(alpha[i]);
  }
  const IntervalMatrix phi = ScaleRows(g_stack, scale);
  const UpperBound phi_norm = NormL2UpperGram(phi, threads);
  // Or with Wo taken out: K = (I (x) Wo) [K_h]_h, K_h's blocks P_ij (v_j - vbar_i) g_i^T, so
  // ||K|| <= ||Wo|| ||Phi'||, Phi' the rows alpha^h_i g^h_i, alpha^h_i >= ||[P_ij (v_j - vbar_i)]_j||.
  std::vector<Interval> head_scale(size_t(hs) * n);
  ParallelFor(hs, WorkerCount(threads, hs), [&](int h, int) {
    const HeadCentre& H = S.head[h];
    for (int i = 0; i < n; ++i) {
      const IntervalMatrix a = ScaledDifferenceRows(H.v, 0, n, H.vbar, i, H.p.mid.row(i).transpose().array(),
                                                    H.p.rad.row(i).transpose().array());
      head_scale[size_t(h) * n + i] = Interval(NormL2UpperGram(a, 1).value());
    }
  });
  out.keys = Min(phi_norm, MulNonneg(wo_norm, NormL2UpperGram(ScaleRows(g_stack, head_scale), threads)));
  // The cross terms (KeysAndQueriesUp, PathsUp), where the rows' pass fits again before the
  // deadline (per token the same GEMM and Gram, and a D x D GEMM and Gram for W E_j^T):
  //   ||Phi E_j^T|| <= ||fl(Phi_mid Em_j^T)|| + its rounding + ||Phi|| dist_j + ||Phi_rad||_F (||Em_j|| + dist_j),
  //   ||W E_j^T||   <= ||fl(W_mid Em_j^T)|| + its rounding + ||W|| dist_j + ||W_rad||_F ||E_j||,
  //   ||W Phi^T||   <= ||fl(W_mid Phi_mid^T)|| + its rounding + ||W|| ||Phi_rad||_F + ||Phi|| ||W_rad||_F.
  // The tokens go in decreasing ||E_j||, a pair at a time, and stop where the terms so far
  // (the rest taken as 0, which gives lower values of both bounds) already lose to the
  // paths summed: sharp heads (MiniLM: keys and queries 29.1 against 19.0 at N = 64).
  if (keep_e && std::isfinite(phi_norm.value()) && 1.8 * rows_s < SecondsLeft(deadline)) {
    const double phi_mid_f = NormFrobeniusUpper(phi.mid).value(), phi_rad_f = NormFrobeniusUpper(phi.rad).value();
    const double w_mid_f = NormFrobeniusUpper(w_sum.mid).value(), w_rad_f = NormFrobeniusUpper(w_sum.rad).value();
    const Eigen::MatrixXd w_phi = w_sum.mid * phi.mid.transpose();
    double x1 = AddUp(NormL2UpperGram(w_phi, threads).value(), SumErrorF(d, MulUp(w_mid_f, phi_mid_f), d, double(hs) * n));
    x1 = AddUp(x1, AddUp(MulUp(w_sum_norm.value(), phi_rad_f), MulUp(phi_norm.value(), w_rad_f)));
    const UpperBound separate = out.keys + UpperBound(*std::max_element(e_norm.begin(), e_norm.end()));
    const UpperBound summed = out.value + separate;
    std::vector<int> order(n);
    for (int j = 0; j < n; ++j) order[j] = j;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return e_norm[a] > e_norm[b]; });
    std::vector<double> c(n, 0.0), x2(n, 0.0);
    const int workers = WorkerCount(threads, n);
    UpperBound kq(kInf), crossed(kInf);
    for (int t = 0; t < n; t += workers) {
      const int batch = std::min(workers, n - t);
      ParallelFor(batch, batch, [&](int b, int) {
        const int j = order[t + b];
        const double em_f = NormFrobeniusUpper(e_mids[j]).value();
        const Eigen::MatrixXd phi_e = phi.mid * e_mids[j].transpose();
        const double cj = AddUp(NormL2UpperGram(phi_e, 1).value(), SumErrorF(d, MulUp(phi_mid_f, em_f), double(hs) * n, d));
        c[j] = AddUp(cj, AddUp(MulUp(phi_norm.value(), e_dist[j]), MulUp(phi_rad_f, AddUp(e_mid_norm[j], e_dist[j]))));
        const Eigen::MatrixXd w_e = w_sum.mid * e_mids[j].transpose();
        const double xj = AddUp(NormL2UpperGram(w_e, 1).value(), SumErrorF(d, MulUp(w_mid_f, em_f), d, d));
        x2[j] = AddUp(xj, AddUp(MulUp(w_sum_norm.value(), e_dist[j]), MulUp(w_rad_f, e_norm[j])));
      });
      kq = Min(separate, KeysAndQueriesUp(phi_norm.value(), e_norm, c));
      crossed = PathsUp(mean, kq, spread, p_bar_norm, x1, x2);
      if (Past(deadline) || !(Min(out.value + kq, crossed).value() < summed.value())) break;
      if (t + batch >= n) {
        out.keys_and_queries = KeysAndQueriesUp(phi_norm.value(), e_norm, c);
        out.crossed = crossed;
      }
    }
  }
  return out;
}

}  // namespace

IntervalMatrix CentreJacobianEnclosure(const AttentionLayer& L, const Eigen::MatrixXd& x0, const CentreNormOptions& o) {
  CheckInputs(L, x0, o);
  const CentreState S = EncloseCentre(L, x0, o);
  return AssembleBlock(S, 0, S.n, 0, S.n, o.threads);
}

namespace {

void CheckBasis(const Eigen::MatrixXd& x0, const Eigen::MatrixXd& v, const Eigen::MatrixXd& y) {
  const long nd = long(x0.rows()) * x0.cols();
  if (v.rows() != nd || y.rows() != nd || v.cols() != y.cols() || v.cols() < 1)
    throw std::invalid_argument("deflation: V and Y must both be (N D) x k with k >= 1");
}

// The report of a deflated run before its pass: the method and the token groups.
CentreNormReport DeflatedReport(const CentreNormOptions& o, int n, int d) {
  CentreNormReport rep;
  const int g = GroupTokens(o, n, d);
  rep.method = "deflated_super_block";
  rep.groups = (n + g - 1) / g;
  rep.group_tokens = g;
  rep.frobenius_blocks = long(g) * d > o.block_limit;
  return rep;
}

BlockAssembler AssemblerOf(const CentreState& S, int threads) {
  return [&S, threads](int r0, int r1, int c0, int c1, IntervalMatrix* out) {
    AssembleBlockInto(S, r0, r1, c0, c1, threads, out);
  };
}

}  // namespace

UpperBound DeflatedCentreNormUpperBound(const AttentionLayer& L, const Eigen::MatrixXd& x0, const Eigen::MatrixXd& v,
                                        const Eigen::MatrixXd& y, const CentreNormOptions& o, CentreNormReport* report) {
  CheckInputs(L, x0, o);
  CheckBasis(x0, v, y);
  const CentreState S = EncloseCentre(L, x0, o);
  CentreNormReport rep = DeflatedReport(o, S.n, S.d);
  UpperBound bound = DeflatedSuperBlockBound(AssemblerOf(S, o.threads), S.n, S.d, v, y, rep.group_tokens, o, &rep);
  if (!std::isfinite(bound.value())) rep.timed_out = true;
  if (report) *report = rep;
  return bound;
}

UpperBound DeflatedPostLnCentreNormUpperBound(const AttentionLayer& mha, const Eigen::MatrixXd& x0,
                                              const std::vector<IntervalMatrix>& left, const Eigen::MatrixXd& v,
                                              const Eigen::MatrixXd& y, const CentreNormOptions& opts,
                                              CentreNormReport* report, UpperBound* mha_frobenius) {
  CentreNormOptions o = opts;
  o.mha_only = true;
  CheckInputs(mha, x0, o);
  const int n = int(x0.rows()), d = int(x0.cols());
  CheckBasis(x0, v, y);
  if (long(left.size()) != n) throw std::invalid_argument("post-LN deflation: one J_LN enclosure per token");
  for (const IntervalMatrix& l : left)
    if (l.rows() != d || l.cols() != d) throw std::invalid_argument("post-LN deflation: J_LN enclosures must be D x D");
  const auto t0 = std::chrono::steady_clock::now();
  const CentreState S = EncloseCentre(mha, x0, o);
  double mha_f2 = 0;  // >= ||J_MHA(X0)||_F^2, summed over the blocks as they are assembled
  // Block (I, K) of blockdiag(J_LN) (I + J_MHA): row token i's rows times its J_LN enclosure.
  const BlockAssembler block = [&](int r0, int r1, int c0, int c1, IntervalMatrix* result) {
    IntervalMatrix m = AssembleBlock(S, r0, r1, c0, c1, o.threads);
    const double f = NormFrobeniusUpper(m).value();
    mha_f2 = AddUp(mha_f2, MulUp(f, f));
    if (r0 == c0) m = m + IntervalMatrix::Point(Eigen::MatrixXd::Identity(m.rows(), m.cols()));
    IntervalMatrix out(Eigen::MatrixXd::Zero(m.rows(), m.cols()), Eigen::MatrixXd::Zero(m.rows(), m.cols()));
    ParallelFor(r1 - r0, WorkerCount(o.threads, r1 - r0), [&](int t, int) {
      const IntervalMatrix rows(m.mid.middleRows(long(t) * d, d), m.rad.middleRows(long(t) * d, d));
      const IntervalMatrix prod = Mul(left[r0 + t], rows);
      out.mid.middleRows(long(t) * d, d) = prod.mid;
      out.rad.middleRows(long(t) * d, d) = prod.rad;
    });
    *result = std::move(out);
  };
  CentreNormReport rep = DeflatedReport(o, n, d);
  UpperBound bound = DeflatedSuperBlockBound(block, n, d, v, y, rep.group_tokens, o, &rep);
  if (!std::isfinite(bound.value())) rep.timed_out = true;
  if (mha_frobenius) *mha_frobenius = rep.timed_out ? UpperBound(kInf) : UpperBound(SqrtUp(mha_f2));
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (report) *report = rep;
  return bound;
}

UpperBound CentreJacobianNormUpperBound(const AttentionLayer& L, const Eigen::MatrixXd& x0, const CentreNormOptions& o,
                                        CentreNormReport* report) {
  CheckInputs(L, x0, o);
  const auto t0 = std::chrono::steady_clock::now();
  const CentreState S = EncloseCentre(L, x0, o);
  const int n = S.n, d = S.d;
  // Above the dense size, the heads factored first (seconds): a bound in hand whatever the
  // super-blocks get, and the centre norm alone where the caller leaves them out.
  // With a deadline and the super-blocks too, only where they are predicted to certify
  // fewer than a quarter of their blocks densely: at MiniLM's sharp heads the factored
  // bound loses (31.5 against 12.4 at N = 128), and its 3 s there cost the super-blocks
  // about 10 dense blocks.
  const auto dense_share = [&] {
    const double least = CentreNormMinimumSecondsEstimate(L, n, o), all = CentreNormSecondsEstimate(L, n, o);
    return all > least ? (SecondsLeft(o.deadline) - least) / (all - least) : 1.0;
  };
  const bool factor = long(n) * d > o.dense_limit && FactoredHeadsApply(L, o) && !Past(o.deadline) &&
                      (!o.super_blocks || o.deadline == Deadline::max() || dense_share() < 0.25);
  FactoredParts factored;
  double factored_s = 0;
  if (factor) {
    const auto t_factored = std::chrono::steady_clock::now();
    factored = FactoredHeadsBound(S, L, o.threads, o.deadline);
    factored_s = SecondsSince(t_factored);
  }
  const UpperBound factored_total = factored.Total();
  CentreNormReport rep;
  UpperBound bound(kInf);
  if (Past(o.deadline)) {
    rep.timed_out = true;
  } else if (factor && !o.super_blocks) {
    rep.method = "factored_heads";
  } else if (long(n) * d <= o.dense_limit) {
    rep.method = "dense";
    rep.group_tokens = n;
    const auto t_assembly = std::chrono::steady_clock::now();
    const IntervalMatrix j = AssembleBlock(S, 0, n, 0, n, o.threads);
    rep.assembly_seconds = SecondsSince(t_assembly);
    bound = NormL2UpperGram(j, o.threads, &rep.estimate, o.deadline, &rep.gram);
  } else if (const int k = BasisDescribesTheEnclosure(L, o) ? DeflationVectorsThatFit(L, n, o, 0.0) : 0; k > 0) {
    rep = DeflatedReport(o, n, d);
    const auto t_basis = std::chrono::steady_clock::now();
    // The operator the enclosure describes: centre_norm never composes a post-LN.
    // The basis gets at most twice its idle time (0.5 s at least: small layers' bases are
    // all set-up); cut there, the machine is so loaded that the plain super-blocks run.
    const double cap_s = std::max(0.5, 2 * IdleBasisSeconds(double(n) * d, k));
    // k was sized for an idle machine of the models' pace; a loaded or slower one shows in
    // the basis's own time: every 16 steps, past 1.35x the idle model, the run is resized to
    // what fits at the pace seen (an EPYC ran 1.5x the model and sized k = 767 for 80 s,
    // of which 86 could be used).
    int asked = k;
    const auto resize = [&](int steps, double seconds) {
      const double nd = double(n) * d, ratio = seconds / IdleBasisSeconds(nd, steps);
      if (ratio <= 1.35) return asked;
      const int fit = DeflationVectorsThatFit(L, n, o, -IdleBasisSeconds(nd, steps), ratio);
      asked = fit == 0 ? 0 : std::min(asked, std::max(steps + 1, fit));  // 0: the plain super-blocks
      return asked;
    };
    const DeflationBasis basis =
        DeflationBasisOf(L.WithoutPostLayerNorm(), x0, k, o.threads, BasisDeadline(o.deadline, cap_s), resize);
    rep.deflation_basis_seconds = SecondsSince(t_basis);
    // Fewer columns of V and Y serve as well (DeflationVectorsAfterBasis).
    const int kept = int(basis.v.cols()) < asked ? 0 : DeflationVectorsAfterBasis(L, n, o, asked, rep.deflation_basis_seconds);
    if (kept == 0) {
      bound = PlainSuperBlockBound(S, o, rep);
    } else {
      // At most three probes, each with fewer columns than the last.
      for (int cols = kept, attempt = 0; cols > 0 && attempt < 3; ++attempt) {
        rep.deflation_abandoned = false;
        rep.exact_blocks = 0;
        int fewer = 0;
        bound = DeflatedSuperBlockBound(AssemblerOf(S, o.threads), n, d, basis.v.leftCols(cols), basis.y.leftCols(cols),
                                        rep.group_tokens, o, &rep, /*may_abandon=*/true, &fewer);
        cols = rep.deflation_abandoned && fewer < cols ? fewer : 0;
      }
      if (rep.deflation_abandoned) {
        rep.exact_blocks = 0;
        bound = PlainSuperBlockBound(S, o, rep);
      } else if (!std::isfinite(bound.value())) {
        rep.timed_out = true;
      }
    }
  } else {
    bound = PlainSuperBlockBound(S, o, rep);
  }
  // A deadline that passed inside a Gram or Cholesky step shows as +inf there.
  if (Past(o.deadline) && !std::isfinite(bound.value())) rep.timed_out = true;
  if (rep.timed_out) bound = UpperBound(kInf);
  if (factor) {
    rep.factored = factored_total.value();
    rep.factored_value = factored.value.value();
    rep.factored_keys = factored.keys.value();
    rep.factored_queries = factored.queries.value();
    rep.factored_keys_and_queries = factored.keys_and_queries.value();
    rep.factored_crossed = factored.crossed.value();
    rep.factored_seconds = factored_s;
    if (std::isfinite(rep.factored) && !(bound.value() <= rep.factored)) {
      bound = factored_total;
      rep.factored_won = true;
      rep.timed_out = false;
    }
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (report) *report = rep;
  return bound;
}

CentreInfNormBounds CentreJacobianInfNormBounds(const AttentionLayer& L, const Eigen::MatrixXd& x0,
                                                const CentreNormOptions& o) {
  CheckInputs(L, x0, o);
  const auto t0 = std::chrono::steady_clock::now();
  CentreInfNormBounds out;
  const CentreState S = EncloseCentre(L, x0, o);
  const int n = S.n, d = S.d, nd = n * d;
  const int g = GroupTokens(o, n, d);  // tokens per tile side: tiles of at most block_limit^2 entries
  // Per row: floating sums of the nonnegative terms max(0, |m| - r) and |m| + r over all nd
  // columns, accumulated tile by tile (at most nd + 1 roundings per term in all).
  std::vector<double> lo_sum(nd, 0.0), hi_sum(nd, 0.0);
  IntervalMatrix blk;  // one tile's storage, reused
  for (int r0 = 0; r0 < n && !out.timed_out; r0 += g) {
    const int r1 = std::min(n, r0 + g);
    for (int c0 = 0; c0 < n; c0 += g) {
      if (Past(o.deadline)) {
        out.timed_out = true;
        break;
      }
      const int c1 = std::min(n, c0 + g);
      AssembleBlockInto(S, r0, r1, c0, c1, o.threads, &blk);
      // Vectorised, in round to nearest: each term max(0, |m| - r) and |m| + r carries one
      // rounding (max keeps the sign, so a negative difference still gives 0).
      const Eigen::VectorXd lo = (blk.mid.array().abs() - blk.rad.array()).max(0.0).rowwise().sum();
      const Eigen::VectorXd hi = (blk.mid.array().abs() + blk.rad.array()).rowwise().sum();
      for (Eigen::Index r = 0; r < blk.mid.rows(); ++r) {
        lo_sum[size_t(r0) * d + r] += lo(r);
        hi_sum[size_t(r0) * d + r] += hi(r);
      }
    }
  }
  if (!out.timed_out) {
    // Each row sum adds nd terms, every term carrying at most one rounding of its own: the
    // exact sum of the terms lies within the computed sum times (1 -+ gamma_{nd+1}), give
    // or take nd eta.
    const double gamma = GammaUp(double(nd) + 1);
    const double eta = MulUp(double(nd) + 1, kEta);
    double best_lo = -1, best_hi = 0;
    for (int r = 0; r < nd; ++r) {
      const double lo = std::max(0.0, SubDown(MulDown(lo_sum[r], SubDown(1.0, gamma)), eta));
      const double hi = AddUp(DivUp(hi_sum[r], SubDown(1.0, gamma)), eta);
      if (lo > best_lo) {
        best_lo = lo;
        out.row = r;
      }
      best_hi = std::max(best_hi, hi);
    }
    out.lower = LowerBound(best_lo);
    out.upper = UpperBound(best_hi);
  }
  if (out.timed_out) out = CentreInfNormBounds{UpperBound(kInf), LowerBound(0.0), -1, 0, true};
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

double CentreInfNormSecondsEstimate(const AttentionLayer& L, int tokens) {
  const double n = tokens, d = L.d_model, h = L.heads;
  return 2.5e-9 * n * n * h * d * d * (L.layer_norm ? 1.5 : 1.0);
}

namespace {
// Seconds per (token pair x head x D^2) of the fused assembly (bench/centre_norm_bench).
constexpr double kFusedAssemblySeconds = 5e-10;
// Seconds per flop of the factored heads' per-token products (measured: FactoredHeadsBound).
constexpr double kFactoredSecondsPerFlop = 1.0 / 3e10;
}  // namespace

double CentreNormSecondsEstimate(const AttentionLayer& L, int tokens, const CentreNormOptions& o) {
  const double n = tokens, d = L.d_model, h = L.heads, nd = n * d;
  const bool gemm = o.gemm_assembly && L.kind == AttentionKind::kDot;
  // measured: D = 384, H = 12 (the fused assembly: 2.2e-10, 4.6e-10 and 3.2e-10 at N = 32,
  // 64 and 128, taken at the largest; the general one 6.5e-9 at N = 32)
  const double assembly = (gemm ? kFusedAssemblySeconds : 6.5e-9) * n * n * h * d * d;
  const double flops = kGramFlopsPerSecond;
  if (long(tokens) * L.d_model <= o.dense_limit) return assembly + (nd * nd * nd * (0.5 + 1.0 / 3)) / flops;
  const int g = GroupTokens(o, tokens, L.d_model);
  const double groups = std::ceil(n / g), m = g * d;
  if (long(g) * L.d_model > o.block_limit) return assembly;
  return assembly + groups * groups * m * m * m * (0.5 + 1.0 / 3) / flops;
}

bool FactoredHeadsApply(const AttentionLayer& L, const CentreNormOptions& o) {
  return o.factored_heads && L.kind == AttentionKind::kDot && (!L.layer_norm.has_value() || o.mha_only);
}

double FactoredHeadsSecondsEstimate(const AttentionLayer& L, int tokens) {
  const double n = tokens, d = L.d_model, h = L.heads;
  // Per query token: ||A_i|| (a D x D Gram of H N rows) and E_i (one GEMM of H N x D x D),
  // both in double (measured 9.0 s at BERT-base size, 2 cores); then the heads' enclosure.
  // The cross terms are left out: they run only where the time left holds 1.8 times the
  // rows' pass (measured: 18.2 s in all at BERT-base size on the 2-core EPYC). Counted in,
  // the variation's reserve grew by 6 s at BERT-base size and its refinement lost more
  // (0.1%, 120 s: 85.12 against 68.21) than the cross terms gain.
  return kFactoredSecondsPerFlop * n * (4 * h * n * d * d) + kFusedAssemblySeconds * h * n * n * d;
}

double CentreNormMinimumSecondsEstimate(const AttentionLayer& L, int tokens, const CentreNormOptions& o) {
  if (long(tokens) * L.d_model <= o.dense_limit) return CentreNormSecondsEstimate(L, tokens, o);
  const double n = tokens, d = L.d_model, h = L.heads;
  const bool gemm = o.gemm_assembly && L.kind == AttentionKind::kDot;
  return (gemm ? kFusedAssemblySeconds : 6.5e-9) * n * n * h * d * d;  // super-blocks: the assembly; the dense blocks are anytime
}

}  // namespace lipcert
