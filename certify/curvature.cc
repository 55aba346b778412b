#include "certify/curvature.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "interval/interval.h"
#include "interval/interval_matrix.h"
#include "interval/norms.h"
#include "interval/softmax.h"

namespace lipcert {
namespace curvature_internal {

// A real number x with |x - m| <= r: midpoint-radius scalar arithmetic for the Gram's
// small dense blocks. Each result's midpoint is the round-to-nearest value and its radius
// adds the operands' propagated radii and the rounding error (u |m| for + and -, u |m| + eta
// for x), every radius term stepped up one ulp after its round-to-nearest evaluation.
struct Ball {
  double m = 0, r = 0;
  Ball() = default;
  Ball(double v) : m(v), r(0) {}  // NOLINT: exact constants (Eigen's Zero, Identity)
  Ball(double mid, double rad) : m(mid), r(rad) {}
};

inline double U(double x) { return NextUp(x); }
inline Ball operator+(const Ball& a, const Ball& b) {
  const double s = a.m + b.m;
  return Ball(s, U(U(a.r + b.r) + U(kUnitRoundoff * std::fabs(s))));
}
inline Ball operator-(const Ball& a) { return Ball(-a.m, a.r); }
inline Ball operator-(const Ball& a, const Ball& b) { return a + (-b); }
inline Ball operator*(const Ball& a, const Ball& b) {
  const double p = a.m * b.m;
  double r = U(kUnitRoundoff * std::fabs(p)) + kEta;
  if (b.r != 0) r = U(r + U(std::fabs(a.m) * b.r));
  if (a.r != 0) r = U(r + U(a.r * U(std::fabs(b.m) + b.r)));
  return Ball(p, U(r));
}
inline Ball& operator+=(Ball& a, const Ball& b) { return a = a + b; }
inline Ball& operator-=(Ball& a, const Ball& b) { return a = a - b; }
inline Ball& operator*=(Ball& a, const Ball& b) { return a = a * b; }
// Eigen's product kernels compare scalars with zero (imag(alpha) == 0).
inline bool operator==(const Ball& a, const Ball& b) { return a.m == b.m && a.r == b.r; }
inline bool operator!=(const Ball& a, const Ball& b) { return !(a == b); }

}  // namespace curvature_internal
}  // namespace lipcert

namespace Eigen {
template <>
struct NumTraits<lipcert::curvature_internal::Ball> : GenericNumTraits<lipcert::curvature_internal::Ball> {
  using Real = lipcert::curvature_internal::Ball;
  using NonInteger = lipcert::curvature_internal::Ball;
  using Literal = lipcert::curvature_internal::Ball;
  using Nested = lipcert::curvature_internal::Ball;
  enum { IsComplex = 0, IsInteger = 0, IsSigned = 1, RequireInitialization = 1, ReadCost = 2, AddCost = 8, MulCost = 12 };
};
}  // namespace Eigen

namespace lipcert {

bool CurvatureOptions::IsValid(std::string* message) const {
  if (threads < 1) {
    if (message) *message = "threads: must be >= 1";
    return false;
  }
  if (!(time_limit_seconds >= 0)) {
    if (message) *message = "time_limit_seconds: must be >= 0";
    return false;
  }
  if (max_gram_size < 1) {
    if (message) *message = "max_gram_size: must be >= 1";
    return false;
  }
  return true;
}

namespace {

using curvature_internal::Ball;
using BMat = Eigen::Matrix<Ball, Eigen::Dynamic, Eigen::Dynamic>;
using BVec = Eigen::Matrix<Ball, Eigen::Dynamic, 1>;

BMat ToBall(const IntervalMatrix& a) {
  BMat b(a.rows(), a.cols());
  for (Eigen::Index i = 0; i < a.rows(); ++i)
    for (Eigen::Index j = 0; j < a.cols(); ++j) b(i, j) = Ball(a.mid(i, j), a.rad(i, j));
  return b;
}
BMat ToBall(const Eigen::MatrixXd& a) { return a.cast<Ball>(); }

// diag(x) - X^T p - X p: tr(M(m) X) = m . Tau(X, p) for M(m) = diag(m) - m p^T - p m^T.
BVec Tau(const BMat& x, const BVec& p) { return BVec(x.diagonal()) - x.transpose() * p - x * p; }

// Per head h, at the centre: probabilities, centred-value weights and the D-vectors.
struct HeadData {
  BMat p;      // (N, N) softmax rows (0 where masked)
  BMat v;      // (N, dv) values
  BMat kap;    // (N, D) rows kappa_j = Wq^T k_j / sqrt(dk)  (the query's logit gradient)
  BMat g;      // (N, D) rows g_i = Wk^T q_i / sqrt(dk)      (the keys' logit gradient)
  BMat wv;     // (dv, D)
  BMat wq, wk; // (dk, D): Omega = Wq^T Wk / sqrt(dk) is applied through them (rank dk)
  Ball s;      // 1/sqrt(dk)
};

// Cross quantities of a head pair (h, h').
struct PairData {
  BMat kk;      // kap_h kap_h'^T        (N, N)
  BMat kg;      // kap_h g_h'^T          (N, N)
  BMat gk;      // g_h kap_h'^T          (N, N)
  BMat gg;      // g_h g_h'^T            (N, N)
  BMat kv;      // kap_h Wv_h'^T         (N, dv')
  BMat gv;      // g_h Wv_h'^T           (N, dv')
  BMat vv;      // Wv_h Wv_h'^T          (dv, dv')
  Ball oo, oot; // <Om_h, Om_h'>, <Om_h, Om_h'^T>
  // Omega_h' seen from head h's vectors:
  BMat kok;     // kap_h Om' kap_h^T     (N, N)
  BMat kog;     // kap_h Om' g_h^T       (N, N)   column i: r for row i
  BMat kotg;    // kap_h Om'^T g_h^T     (N, N)   column i: t for row i
  BVec gog;     // (g_h Om' g_h^T)_ii    (N)
  BMat phi1;    // kap_h Om' Wv_h^T      (N, dv)
  BMat phi2;    // g_h Om' Wv_h^T        (N, dv)  row i: (Wv Om'^T g_i)^T
  BMat phi3;    // kap_h Om'^T Wv_h^T    (N, dv)
  BMat phi4;    // g_h Om'^T Wv_h^T      (N, dv)  row i: (Wv Om' g_i)^T
};

PairData MakePair(const HeadData& a, const HeadData& b) {
  PairData d;
  d.kk = a.kap * b.kap.transpose();
  d.kg = a.kap * b.g.transpose();
  d.gk = a.g * b.kap.transpose();
  d.gg = a.g * b.g.transpose();
  d.kv = a.kap * b.wv.transpose();
  d.gv = a.g * b.wv.transpose();
  d.vv = a.wv * b.wv.transpose();
  // <Om_a, Om_b> = s^2 <Wq_a Wq_b^T, Wk_a Wk_b^T>,  <Om_a, Om_b^T> = s^2 <Wq_a Wk_b^T, Wk_a Wq_b^T>.
  const Ball ss = a.s * b.s;
  d.oo = BMat(a.wq * b.wq.transpose()).cwiseProduct(BMat(a.wk * b.wk.transpose())).sum() * ss;
  d.oot = BMat(a.wq * b.wk.transpose()).cwiseProduct(BMat(a.wk * b.wq.transpose())).sum() * ss;
  // x Om_b = s (x Wq_b^T) Wk_b and x Om_b^T = s (x Wk_b^T) Wq_b: (N, D) each.
  const BMat ko = BMat(a.kap * b.wq.transpose()) * b.wk * b.s, kot = BMat(a.kap * b.wk.transpose()) * b.wq * b.s;
  const BMat go = BMat(a.g * b.wq.transpose()) * b.wk * b.s, got = BMat(a.g * b.wk.transpose()) * b.wq * b.s;
  d.kok = ko * a.kap.transpose();
  d.kog = ko * a.g.transpose();
  d.kotg = kot * a.g.transpose();
  d.gog.resize(a.g.rows());
  for (Eigen::Index i = 0; i < a.g.rows(); ++i) d.gog(i) = go.row(i).dot(a.g.row(i));
  d.phi1 = ko * a.wv.transpose();
  d.phi2 = go * a.wv.transpose();
  d.phi3 = kot * a.wv.transpose();
  d.phi4 = got * a.wv.transpose();
  return d;
}

BMat Outer(const BVec& x, const BVec& y) { return x * y.transpose(); }

// x Pi with Pi = diag(p) - p p^T, in O(N^2).
BMat MulPi(const BMat& x, const BVec& p) { return BMat(x * p.asDiagonal()) - Outer(BVec(x * p), p); }
// tr(x y) in O(N^2).
Ball TraceProduct(const BMat& x, const BMat& y) {
  Ball t(0.0);
  for (Eigen::Index j = 0; j < x.rows(); ++j)
    for (Eigen::Index k = 0; k < x.cols(); ++k) t += x(j, k) * y(k, j);
  return t;
}

// Term (5) of the derivation: the kernel K with <Lam M Lam^T, Omega' term> = 2 m^T K m'.
BMat K5(const PairData& d, const BVec& p, int i, int ip, bool same, const BVec& r, const BVec& t, const Ball& gog) {
  const int n = int(p.size());
  BMat k = BMat::Zero(n, n);
  if (same) {
    k.col(i) += Tau(d.kok, p);
    k += BMat(r.asDiagonal()) - BMat::Identity(n, n) * p.dot(r) - Outer(r, p);
  }
  BVec e = BVec::Zero(n);
  e(ip) = Ball(1.0);
  k.col(i) += e * (t(ip) - p.dot(t)) - t * p(ip);
  k += (Outer(e, e) - Outer(e, p) - BMat::Identity(n, n) * p(ip)) * gog;
  return k;
}

// Term (6): <Lam Pi Ups^T + sym, Omega' term> for all (c, c'), with primed centred values mmp.
BMat B6(const PairData& d, const BMat& pi, int i, int ip, bool same, const BMat& mmp) {
  const BVec phi2 = d.phi2.row(i).transpose(), phi4 = d.phi4.row(i).transpose();
  const BVec piip = pi.row(ip).transpose();
  const BVec row_ip = mmp.transpose() * piip;  // Pi[ip,:] Mm'
  BMat out = Outer(phi2, row_ip) + Outer(BVec(d.phi3.transpose() * piip), BVec(mmp.row(i).transpose())) +
             Outer(phi4, row_ip);
  if (same) out += d.phi1.transpose() * pi * mmp;
  return out * Ball(2.0);
}

struct RowHead {
  BVec p;
  BMat pi;  // diag(p) - p p^T
  BMat mm;  // (N, dv) columns m^c = p o (v_c - p.v_c)
};

RowHead MakeRowHead(const HeadData& hd, int i) {
  RowHead r;
  r.p = hd.p.row(i).transpose();
  r.pi = BMat(r.p.asDiagonal()) - Outer(r.p, r.p);
  const BVec vbar = hd.v.transpose() * r.p;
  r.mm = hd.v;
  for (Eigen::Index j = 0; j < r.mm.rows(); ++j)
    for (Eigen::Index c = 0; c < r.mm.cols(); ++c) r.mm(j, c) = r.p(j) * (hd.v(j, c) - vbar(c));
  return r;
}

// The dv x dv' block of Gt = [<Y^{ih}_c, Y^{i'h'}_c'>_F] (docs/engines.md, "Certified
// curvature at the centre", terms (1)-(6)); d = PairData(h, h'), e = PairData(h', h).
BMat PairBlock(const RowHead& a, const RowHead& b, const PairData& d, const PairData& e, int i, int ip) {
  const int n = int(a.p.size());
  const bool same = i == ip;
  const BVec& p = a.p;
  const BVec& pp = b.p;
  // A = Lam^T Lam'
  BMat A = BMat::Identity(n, n) * d.gg(i, ip);
  if (same) A += d.kk;
  A.col(i) += d.kg.col(ip);
  A.row(ip) += d.gk.row(i);
  // (1)
  const BVec Ap = A * pp, ATp = A.transpose() * p;
  const Ball alpha = p.dot(Ap);
  BMat K1 = A.cwiseProduct(A) - BMat(Ap.asDiagonal() * A) * Ball(2.0) - BMat(A * ATp.asDiagonal()) * Ball(2.0) +
            A * (Ball(2.0) * alpha) + Outer(Ap, ATp) * Ball(2.0);
  BMat blk = a.mm.transpose() * K1 * b.mm;
  // (2): 2 tr(M A Pi' C^T), C = Lam^T Ups'
  {
    const BVec y = A * b.pi.col(i);
    const BMat K2 = BMat(y.asDiagonal()) - BMat::Identity(n, n) * p.dot(y) - Outer(y, p);
    const BVec gam_p = d.gv.row(i).transpose();
    blk += (a.mm.transpose() * (K2 * d.kv + Outer(Tau(MulPi(A, pp), p), gam_p))) * Ball(2.0);
  }
  // (2'): roles swapped
  {
    const BVec y = A.transpose() * a.pi.col(ip);
    const BMat K2 = BMat(y.asDiagonal()) - BMat::Identity(n, n) * pp.dot(y) - Outer(y, pp);
    const BVec gam_t = e.gv.row(ip).transpose();
    blk += ((K2 * e.kv + Outer(Tau(MulPi(A.transpose(), p), pp), gam_t)).transpose() * b.mm) * Ball(2.0);
  }
  // (3)
  {
    blk += d.vv * (Ball(2.0) * TraceProduct(a.pi, MulPi(A, pp)));
    const BMat& Bp = d.kv;   // kap_h Wv_h'^T
    const BMat& Bt = e.kv;   // kap_h' Wv_h^T
    const BVec gam_p = d.gv.row(i).transpose(), gam_t = e.gv.row(ip).transpose();
    const BVec pipp_i = a.pi * BVec(b.pi.col(i));     // (Pi Pi')[:, i]
    const BVec ppip_ip = b.pi * BVec(a.pi.col(ip));   // (Pi' Pi)[:, i']
    const BMat t3 = Outer(BVec(Bt.transpose() * b.pi.col(i)), BVec(Bp.transpose() * a.pi.col(ip))) +
                    Outer(gam_t, BVec(Bp.transpose() * pipp_i)) + Outer(BVec(Bt.transpose() * ppip_ip), gam_p) +
                    Outer(gam_t, gam_p) * TraceProduct(a.pi, b.pi);
    blk += t3 * Ball(2.0);
  }
  // (4)
  if (same) blk += (a.mm.transpose() * b.mm) * (Ball(2.0) * d.oo);
  blk += Outer(BVec(a.mm.row(ip).transpose()), BVec(b.mm.row(i).transpose())) * (Ball(2.0) * d.oot);
  // (5) and (5')
  blk += (a.mm.transpose() * K5(d, p, i, ip, same, d.kog.col(i), d.kotg.col(i), d.gog(i)) * b.mm) * Ball(2.0);
  blk += (b.mm.transpose() * K5(e, pp, ip, i, same, e.kog.col(ip), e.kotg.col(ip), e.gog(ip)) * a.mm).transpose() *
         Ball(2.0);
  // (6) and (6')
  blk += B6(d, a.pi, i, ip, same, b.mm);
  blk += B6(e, b.pi, ip, i, same, a.mm).transpose();
  return blk;
}

}  // namespace

namespace {

// Upper bound on the 2-norm of each row of w (w's rows are the projection's output coordinates).
Eigen::VectorXd RowNormsUp(const Eigen::MatrixXd& w) {
  Eigen::VectorXd out(w.rows());
  for (Eigen::Index c = 0; c < w.rows(); ++c) {
    double s = 0;
    for (Eigen::Index j = 0; j < w.cols(); ++j) s = AddUp(s, MulUp(w(c, j), w(c, j)));
    out(c) = SqrtUp(s);
  }
  return out;
}

// Enclosure of X W^T (+ bias) over the per-token balls ||x_i - x0_i||_2 <= radius(i): the centre's
// product, each coordinate (i, c) widened by radius(i) ||w_c||_2 (Cauchy-Schwarz, rounded up).
// A zero radius leaves the centre's enclosure untouched.
IntervalMatrix ProjectCover(const Eigen::MatrixXd& x0, const Eigen::VectorXd& radius, const Eigen::MatrixXd& w) {
  IntervalMatrix out = Mul(x0, Eigen::MatrixXd(w.transpose()));
  if (radius.size() == 0 || radius.maxCoeff() == 0) return out;
  const Eigen::VectorXd wn = RowNormsUp(w);
  for (Eigen::Index i = 0; i < out.rows(); ++i) {
    if (radius(i) == 0) continue;
    for (Eigen::Index c = 0; c < out.cols(); ++c) out.rad(i, c) = AddUp(out.rad(i, c), MulUp(radius(i), wn(c)));
  }
  return out;
}

// "" when the curvature applies to this layer, centre and cover, else why not.
std::string CurvatureRefusal(const AttentionLayer& L, const Eigen::MatrixXd& x0, const Eigen::VectorXd& radius,
                             const CurvatureOptions& opts) {
  std::string message;
  if (!opts.IsValid(&message)) return message;
  if (L.kind != AttentionKind::kDot) return "curvature: only dot-product attention is supported";
  if (L.layer_norm || L.post_layer_norm) return "curvature: only MHA alone is supported (no LayerNorm sublayer)";
  const long n = x0.rows();
  if (x0.cols() != L.d_model || n < 1) return "curvature: x0 must have d_model columns and at least one row";
  if (radius.size() != 0 && (radius.size() != n || !(radius.minCoeff() >= 0)))
    return "curvature: the cover's radii must be N values >= 0";
  if (radius.size() != 0 && !std::isfinite(radius.maxCoeff())) return "curvature: the cover's radius is unbounded";
  if (n * L.d_model > opts.max_gram_size)
    return "curvature: N * D = " + std::to_string(n * L.d_model) + " exceeds max_gram_size";
  return "";
}

// Each head's enclosures over the cover (queries, keys, values, softmax ranges and the logits'
// gradients); the logits' radii and the softmax ranges' widths go to `out` as diagnostics.
std::vector<HeadData> HeadsOverCover(const AttentionLayer& L, const Eigen::MatrixXd& x0, const Eigen::VectorXd& radius,
                                     const Ball& sb, const Interval& s, CurvatureBound* out) {
  const int n = int(x0.rows()), H = L.heads, dk = L.head_dim_qk, dv = L.head_dim_v;
  std::vector<HeadData> heads(H);
  long entries = 0;
  for (int h = 0; h < H; ++h) {
    auto with_bias = [&](IntervalMatrix m, const Eigen::VectorXd& b, int width) {
      if (b.size() == 0) return m;
      Eigen::MatrixXd rows = b.segment(h * width, width).transpose().replicate(n, 1);
      return m + IntervalMatrix::Point(rows);
    };
    const IntervalMatrix q = with_bias(ProjectCover(x0, radius, Eigen::MatrixXd(L.wq_head(h))), L.bq, dk);
    const IntervalMatrix k = with_bias(ProjectCover(x0, radius, Eigen::MatrixXd(L.wk_head(h))), L.bk, dk);
    const IntervalMatrix v = with_bias(ProjectCover(x0, radius, Eigen::MatrixXd(L.wv_head(h))), L.bv, dv);
    const IntervalMatrix logits = Scale(s, Mul(q, k.transpose()));
    const ProbabilityMatrixBounds pb = SoftmaxRowsRange(logits, L.causal);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < (L.causal ? i + 1 : n); ++j) {
        out->logit_radius_max = std::max(out->logit_radius_max, logits.rad(i, j));
        out->logit_radius_mean += logits.rad(i, j);
        out->softmax_width_max = std::max(out->softmax_width_max, pb.hi(i, j) - pb.lo(i, j));
        out->softmax_width_mean += pb.hi(i, j) - pb.lo(i, j);
        ++entries;
      }
    HeadData& hd = heads[h];
    hd.p = ToBall(IntervalMatrix::FromBounds(pb.lo, pb.hi));
    hd.v = ToBall(v);
    const BMat wq = ToBall(Eigen::MatrixXd(L.wq_head(h))), wk = ToBall(Eigen::MatrixXd(L.wk_head(h)));
    hd.wv = ToBall(Eigen::MatrixXd(L.wv_head(h)));
    hd.kap = (ToBall(k) * wq) * sb;
    hd.g = (ToBall(q) * wk) * sb;
    hd.wq = wq;
    hd.wk = wk;
    hd.s = sb;
  }
  out->logit_radius_mean /= double(std::max(1L, entries));
  out->softmax_width_mean /= double(std::max(1L, entries));
  return heads;
}

// The heads' Gram Gt over (i, h, c) x (i', h', c'): the upper block triangle on the threads,
// mirrored. False when the time limit (counted from t0) passed first.
bool HeadSpaceGram(const std::vector<HeadData>& heads, int n, int dv, const CurvatureOptions& opts,
                   std::chrono::steady_clock::time_point t0, IntervalMatrix* gt) {
  const int H = int(heads.size());
  std::vector<PairData> pairs(size_t(H) * H);
  for (int h = 0; h < H; ++h)
    for (int hp = 0; hp < H; ++hp) pairs[size_t(h) * H + hp] = MakePair(heads[h], heads[hp]);
  std::vector<RowHead> rows(size_t(n) * H);
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < H; ++h) rows[size_t(i) * H + h] = MakeRowHead(heads[h], i);
  const long nt = long(n) * H * dv;
  Eigen::MatrixXd gmid = Eigen::MatrixXd::Zero(nt, nt), grad = Eigen::MatrixXd::Zero(nt, nt);
  const int units = n * H;
  std::atomic<bool> timed_out{false};
  auto over_time = [&]() {
    return opts.time_limit_seconds > 0 &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > opts.time_limit_seconds;
  };
  auto work = [&](int t) {
    RequireRoundToNearest();
    for (int a = t; a < units; a += opts.threads) {
      if (timed_out || over_time()) {
        timed_out = true;
        return;
      }
      const int i = a / H, h = a % H;
      for (int b = a; b < units; ++b) {
        const int ip = b / H, hp = b % H;
        const BMat blk = PairBlock(rows[a], rows[b], pairs[size_t(h) * H + hp], pairs[size_t(hp) * H + h], i, ip);
        for (int c = 0; c < dv; ++c)
          for (int cp = 0; cp < dv; ++cp) {
            // An overflow (NaN midpoint or radius) becomes the whole line: [0 +- inf].
            const bool ok = std::isfinite(blk(c, cp).m) && blk(c, cp).r >= 0;
            const double m = ok ? blk(c, cp).m : 0.0, r = ok ? blk(c, cp).r : kInf;
            gmid(long(a) * dv + c, long(b) * dv + cp) = m;
            grad(long(a) * dv + c, long(b) * dv + cp) = r;
            gmid(long(b) * dv + cp, long(a) * dv + c) = m;
            grad(long(b) * dv + cp, long(a) * dv + c) = r;
          }
      }
    }
  };
  if (opts.threads == 1) {
    work(0);
  } else {
    std::vector<std::thread> pool;
    for (int t = 0; t < opts.threads; ++t) pool.emplace_back(work, t);
    for (auto& th : pool) th.join();
  }
  if (timed_out || over_time()) return false;
  *gt = IntervalMatrix(std::move(gmid), std::move(grad));
  return true;
}

// G = (I (x) Wo) Gt (I (x) Wo)^T, block by block (Gt's (i, i') block is (H dv) x (H dv)).
// Gt is consumed: the (N D)^2 matrices dominate the memory.
IntervalMatrix OutputGram(IntervalMatrix gt, const AttentionLayer& L, int n) {
  const int dm = L.d_model;
  const long nd = long(n) * dm, hv = long(L.heads) * L.head_dim_v;
  Eigen::MatrixXd m2 = Eigen::MatrixXd::Zero(nd, nd), r2 = Eigen::MatrixXd::Zero(nd, nd);
  const Eigen::MatrixXd wo = L.wo, wot = L.wo.transpose();
  for (int i = 0; i < n; ++i) {
    // Wo * (block row i of Gt): D x (N H dv)
    const IntervalMatrix row(gt.mid.middleRows(i * hv, hv), gt.rad.middleRows(i * hv, hv));
    const IntervalMatrix left = Mul(wo, row);
    for (int ip = i; ip < n; ++ip) {
      const IntervalMatrix blk(left.mid.middleCols(ip * hv, hv), left.rad.middleCols(ip * hv, hv));
      const IntervalMatrix g = Mul(blk, wot);
      m2.block(long(i) * dm, long(ip) * dm, dm, dm) = g.mid;
      r2.block(long(i) * dm, long(ip) * dm, dm, dm) = g.rad;
      if (ip != i) {
        m2.block(long(ip) * dm, long(i) * dm, dm, dm) = g.mid.transpose();
        r2.block(long(ip) * dm, long(i) * dm, dm, dm) = g.rad.transpose();
      }
    }
  }
  gt = IntervalMatrix();
  return SymmetrizeEnclosure(IntervalMatrix(std::move(m2), std::move(r2)));
}

// The certified sup of the curvature over the per-token balls (radius empty or all zero: at x0).
CurvatureBound CurvatureOverTokenBalls(const AttentionLayer& L, const Eigen::MatrixXd& x0,
                                       const Eigen::VectorXd& radius, const CurvatureOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  CurvatureBound out;
  auto done = [&]() {
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  };
  out.message = CurvatureRefusal(L, x0, radius, opts);
  if (!out.message.empty()) return done();
  RequireRoundToNearest();
  const int n = int(x0.rows());
  const Interval s = InvSqrt(Interval(double(L.head_dim_qk)));
  const Ball sb(0.5 * s.lo + 0.5 * s.hi, curvature_internal::U(std::max(SubUp(s.hi, 0.5 * s.lo + 0.5 * s.hi),
                                                   SubUp(0.5 * s.lo + 0.5 * s.hi, s.lo))));
  const std::vector<HeadData> heads = HeadsOverCover(L, x0, radius, sb, s, &out);
  IntervalMatrix gt;
  if (!HeadSpaceGram(heads, n, L.head_dim_v, opts, t0, &gt)) {
    out.message = "curvature: time limit reached";
    return done();
  }
  const IntervalMatrix G = OutputGram(std::move(gt), L, n);
  NormL2Report report;
  const UpperBound lam = LambdaMaxUpper(G, NormL2Options{}, &report);
  out.estimate = std::sqrt(std::max(0.0, report.estimate));
  out.gram_radius_norm = report.radius_norm;
  out.upper = SqrtUpper(UpperBound(std::max(0.0, lam.value())));
  return done();
}

}  // namespace

CurvatureBound CentreCurvatureUpperBound(const AttentionLayer& L, const Eigen::MatrixXd& x0,
                                         const CurvatureOptions& opts) {
  return CurvatureOverTokenBalls(L, x0, Eigen::VectorXd(), opts);
}

CurvatureBound CoverCurvatureUpperBound(const AttentionLayer& L, const TokenCover& cover,
                                        const CurvatureOptions& opts) {
  return CurvatureOverTokenBalls(L, cover.center, cover.radius, opts);
}

CurvatureBound CoverCurvatureUpperBound(const AttentionLayer& L, const InputSet& set, const CurvatureOptions& opts) {
  return CoverCurvatureUpperBound(L, CoverOf(set), opts);
}

EngineBound CurvatureVariationBound(UpperBound centre_norm, const TokenCover& cover,
                                    const CurvatureBound& cover_curvature) {
  EngineBound b;
  const UpperBound variation = MulNonneg(JointRadiusUp(cover), cover_curvature.upper);
  b.terms = {BoundTerm{"centre", centre_norm}, BoundTerm{"curvature x radius", variation}};
  b.upper = centre_norm + variation;
  if (!cover_curvature.message.empty()) b.note = cover_curvature.message;
  return b;
}

namespace {

// max_i ||row i||_2 over the enclosure, rounded up.
double MaxRowNormUp(const IntervalMatrix& a) {
  double best = 0;
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    double s = 0;
    for (Eigen::Index j = 0; j < a.cols(); ++j) {
      const double m = AddUp(std::fabs(a.mid(i, j)), a.rad(i, j));
      s = AddUp(s, MulUp(m, m));
    }
    best = std::max(best, SqrtUp(s));
  }
  return best;
}

}  // namespace

UpperBound ThirdDerivativeUpperBound(const AttentionLayer& L, const Eigen::MatrixXd& x0, double radius) {
  if (L.kind != AttentionKind::kDot || L.layer_norm || L.post_layer_norm || !(radius >= 0)) return UpperBound(kInf);
  RequireRoundToNearest();
  const int n = int(x0.rows()), dk = L.head_dim_qk, dv = L.head_dim_v;
  const Interval s = InvSqrt(Interval(double(dk)));
  double total = 0;
  for (int h = 0; h < L.heads; ++h) {
    auto with_bias = [&](IntervalMatrix m, const Eigen::VectorXd& b, int width) {
      if (b.size() == 0) return m;
      Eigen::MatrixXd rows = b.segment(h * width, width).transpose().replicate(n, 1);
      return m + IntervalMatrix::Point(rows);
    };
    const Eigen::MatrixXd wq = L.wq_head(h), wk = L.wk_head(h), wv = L.wv_head(h), wo = L.wo_head(h);
    const double nq = NormL2Upper(wq).value(), nk = NormL2Upper(wk).value(), nv = NormL2Upper(wv).value();
    const double no = NormL2Upper(wo).value();
    const double nov = NormL2UpperInterval(Mul(wo, wv)).value();
    // Over the ball every token moves by at most `radius`.
    const double qmax = AddUp(MaxRowNormUp(with_bias(Mul(x0, Eigen::MatrixXd(wq.transpose())), L.bq, dk)),
                              MulUp(nq, radius));
    const double kmax = AddUp(MaxRowNormUp(with_bias(Mul(x0, Eigen::MatrixXd(wk.transpose())), L.bk, dk)),
                              MulUp(nk, radius));
    const double vmax = AddUp(MaxRowNormUp(with_bias(Mul(x0, Eigen::MatrixXd(wv.transpose())), L.bv, dv)),
                              MulUp(nv, radius));
    // Centred magnitudes (at most twice the largest): values Wo_h v_j, the logits' first and
    // second derivatives along a unit U (every token moving by at most 1), the value motion.
    const double xs = MulUp(2.0, MulUp(no, vmax));
    const double l1 = MulUp(MulUp(2.0, s.hi), AddUp(MulUp(nq, kmax), MulUp(qmax, nk)));
    const double l2 = MulUp(MulUp(4.0, s.hi), MulUp(nq, nk));
    const double cs = MulUp(2.0, nov);
    // d^3 E[x] = 3 k3(x, l', l'') + k4(x, l', l', l') and 3 d^2 E[c] = 3 (Cov(c, l'') + k3(c, l', l')),
    // with |k3| <= XYZ, |k4(x, y, y, y)| <= 4 X Y^3, |Cov| <= XY.
    double row = MulUp(3.0, MulUp(xs, MulUp(l1, l2)));
    row = AddUp(row, MulUp(4.0, MulUp(xs, MulUp(l1, MulUp(l1, l1)))));
    row = AddUp(row, MulUp(3.0, MulUp(cs, AddUp(l2, MulUp(l1, l1)))));
    total = AddUp(total, row);
  }
  // Rows: ||(r_i)_i||_2 <= sqrt(N) max_i r_i.
  return UpperBound(MulUp(SqrtUp(double(n)), total));
}

TaylorJacobianBound TaylorJacobianUpperBound(const AttentionLayer& L, const Eigen::MatrixXd& x0, double radius,
                                             UpperBound centre_norm, const CurvatureBound& curvature) {
  TaylorJacobianBound b;
  b.message = curvature.message;
  b.centre = centre_norm;
  b.curvature = MulNonneg(UpperBound(radius), curvature.upper);
  b.remainder = MulNonneg(UpperBound(MulUp(0.5, MulUp(radius, radius))), ThirdDerivativeUpperBound(L, x0, radius));
  b.total = b.centre + b.curvature + b.remainder;
  return b;
}

double CurvatureLowerEstimate(const AttentionLayer& L, const Eigen::MatrixXd& x0, int starts, int iterations,
                              unsigned seed, Eigen::MatrixXd* argmax) {
  const LayerState<double> s0 = Evaluate<double>(L, x0);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const double eps = 1e-5 * std::max(1.0, x0.norm() / std::sqrt(double(x0.size())));
  double best = 0;
  for (int st = 0; st < starts; ++st) {
    Eigen::MatrixXd u(x0.rows(), x0.cols());
    for (Eigen::Index k = 0; k < u.size(); ++k) u(k) = gauss(rng);
    // Every other start moves two tokens only: the maximiser often pairs a query with a key.
    if (st % 2 == 1 && x0.rows() > 1) {
      const int a = int(rng() % x0.rows()), b = int(rng() % x0.rows());
      for (Eigen::Index r = 0; r < u.rows(); ++r)
        if (r != a && r != b) u.row(r).setZero();
    }
    u /= u.norm();
    double value = 0;
    for (int it = 0; it < iterations; ++it) {
      const Eigen::MatrixXd q = SecondDirectional<double>(L, s0, u);
      value = q.norm();
      if (value == 0) break;
      if (value > best) {
        best = value;
        if (argmax) *argmax = u;
      }
      const Eigen::MatrixXd w = q / value;
      // H_w u by a central difference of J^T w along u.
      const Eigen::MatrixXd xp = x0 + eps * u, xm = x0 - eps * u;
      const Eigen::MatrixXd hu =
          (Vjp<double>(L, Evaluate<double>(L, xp), w) - Vjp<double>(L, Evaluate<double>(L, xm), w)) / (2 * eps);
      const double hn = hu.norm();
      if (!(hn > 0)) break;
      u = hu / hn;
    }
    const Eigen::MatrixXd q = SecondDirectional<double>(L, s0, u);
    if (q.norm() > best) {
      best = q.norm();
      if (argmax) *argmax = u;
    }
  }
  return best;
}

namespace {

// D^3 f(X0)[U, U, U] by a central difference of D^2 f[U, U] along U.
Eigen::MatrixXd ThirdDirectionalFd(const AttentionLayer& L, const Eigen::MatrixXd& x0, const Eigen::MatrixXd& u,
                                   double eps) {
  const Eigen::MatrixXd a = SecondDirectional<double>(L, Evaluate<double>(L, Eigen::MatrixXd(x0 + eps * u)), u);
  const Eigen::MatrixXd b = SecondDirectional<double>(L, Evaluate<double>(L, Eigen::MatrixXd(x0 - eps * u)), u);
  return (a - b) / (2 * eps);
}

}  // namespace

double ThirdDerivativeLowerEstimate(const AttentionLayer& L, const Eigen::MatrixXd& x0, int starts, int iterations,
                                   unsigned seed, const Eigen::MatrixXd& start, Eigen::MatrixXd* argmax) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const double eps = 1e-3 * std::max(1e-3, x0.norm() / std::sqrt(double(x0.size())));
  double best = 0;
  auto consider = [&](const Eigen::MatrixXd& u, double value) {
    if (value > best) {
      best = value;
      if (argmax) *argmax = u;
    }
  };
  for (int st = 0; st < starts + (start.size() ? 1 : 0); ++st) {
    Eigen::MatrixXd u(x0.rows(), x0.cols());
    if (st == starts) {
      u = start;
    } else {
      for (Eigen::Index k = 0; k < u.size(); ++k) u(k) = gauss(rng);
      if (st % 2 == 1 && x0.rows() > 1) {
        const int a = int(rng() % x0.rows()), b = int(rng() % x0.rows());
        for (Eigen::Index r = 0; r < u.rows(); ++r)
          if (r != a && r != b) u.row(r).setZero();
      }
    }
    if (!(u.norm() > 0)) continue;
    u /= u.norm();
    for (int it = 0; it < iterations; ++it) {
      const Eigen::MatrixXd t = ThirdDirectionalFd(L, x0, u, eps);
      const double value = t.norm();
      consider(u, value);
      if (!(value > 0)) break;
      const Eigen::MatrixXd w = t / value;
      // D^3 <w, f>[U, U, .] = d^2/ds^2 J(X0 + s U)^T w, a second central difference.
      const Eigen::MatrixXd hu = (Vjp<double>(L, Evaluate<double>(L, Eigen::MatrixXd(x0 + eps * u)), w) -
                                  2.0 * Vjp<double>(L, Evaluate<double>(L, x0), w) +
                                  Vjp<double>(L, Evaluate<double>(L, Eigen::MatrixXd(x0 - eps * u)), w)) /
                                 (eps * eps);
      const double hn = hu.norm();
      if (!(hn > 0)) break;
      u = hu / hn;
    }
    consider(u, ThirdDirectionalFd(L, x0, u, eps).norm());
  }
  return best;
}

}  // namespace lipcert
