#include "certify/witness_eval.h"

#include "certify/layer_norm_enclosure.h"

#include <cmath>
#include <stdexcept>

#include "interval/interval.h"
#include "interval/interval_matrix.h"
#include "models/forward.h"  // the scalar hooks below specialise its templates

namespace lipcert {
namespace witness_internal {

// The exp back end of the evaluation running on this thread.
thread_local ExpBackend tls_exp_backend = ExpBackend::kMpfr;

// A thin adapter that lets models/forward.h run on interval/'s Interval: Eigen-friendly
// construction from double and int, arithmetic, and exp / sqrt found by ADL.
struct RI {
  Interval v;
  RI() = default;
  explicit RI(double d) : v(d) {}
  explicit RI(int d) : v(double(d)) {}
  explicit RI(const Interval& i) : v(i) {}
};
inline RI operator+(const RI& a, const RI& b) { return RI(a.v + b.v); }
inline RI operator-(const RI& a, const RI& b) { return RI(a.v - b.v); }
inline RI operator*(const RI& a, const RI& b) { return RI(a.v * b.v); }
inline RI operator/(const RI& a, const RI& b) { return RI(a.v / b.v); }
inline RI operator-(const RI& a) { return RI(-a.v); }
inline RI& operator+=(RI& a, const RI& b) { return a = a + b; }
inline RI& operator-=(RI& a, const RI& b) { return a = a - b; }
inline RI& operator*=(RI& a, const RI& b) { return a = a * b; }
inline RI& operator/=(RI& a, const RI& b) { return a = a / b; }
// Identity of the enclosures (Eigen compares scalars only to skip work, never to decide).
inline bool operator==(const RI& a, const RI& b) { return a.v.lo == b.v.lo && a.v.hi == b.v.hi; }
inline bool operator!=(const RI& a, const RI& b) { return !(a == b); }
inline RI exp(const RI& a) { return RI(Exp(a.v, tls_exp_backend)); }
inline RI sqrt(const RI& a) { return RI(Sqrt(a.v)); }

}  // namespace witness_internal

// The softmax shift: any value is exact mathematically; the midpoint keeps exp in range.
template <>
struct ScalarToDouble<witness_internal::RI> {
  static double Get(const witness_internal::RI& a) {
    const double m = 0.5 * a.v.lo + 0.5 * a.v.hi;
    return std::isfinite(m) ? m : 0.0;
  }
};

}  // namespace lipcert

namespace Eigen {
template <>
struct NumTraits<lipcert::witness_internal::RI> : GenericNumTraits<double> {
  using RI = lipcert::witness_internal::RI;
  typedef RI Real;
  typedef RI NonInteger;
  typedef RI Nested;
  typedef RI Literal;
  enum {
    IsComplex = 0,
    IsInteger = 0,
    IsSigned = 1,
    RequireInitialization = 1,
    ReadCost = 2,
    AddCost = 10,
    MulCost = 20
  };
  static inline int digits10() { return 15; }
};
}  // namespace Eigen

namespace lipcert {
namespace {

using witness_internal::RI;

void CheckInputs(const AttentionLayer& layer, const Eigen::MatrixXd& x, const Eigen::MatrixXd& v) {
  if (x.cols() != layer.d_model || x.rows() < 1)
    throw std::invalid_argument("witness: x must be N x " + std::to_string(layer.d_model));
  if (v.rows() != x.rows() || v.cols() != x.cols())
    throw std::invalid_argument("witness: v must have the shape of x");
  if (!x.allFinite() || !v.allFinite()) throw std::invalid_argument("witness: x or v is not finite");
  if (v.cwiseAbs().maxCoeff() == 0) throw std::invalid_argument("witness: v is zero");
}

}  // namespace

void EncloseJvpScalar(const AttentionLayer& layer, const Eigen::MatrixXd& x, const Eigen::MatrixXd& v,
                      ExpBackend exp_backend, Eigen::MatrixXd* lo, Eigen::MatrixXd* hi) {
  CheckInputs(layer, x, v);
  RequireRoundToNearest();
  const ExpBackend saved = witness_internal::tls_exp_backend;
  witness_internal::tls_exp_backend = exp_backend;
  const Mat<RI> xi = x.cast<RI>();
  const Mat<RI> vi = v.cast<RI>();
  const LayerState<RI> s = Evaluate<RI>(layer, xi);
  const Mat<RI> y = Jvp<RI>(layer, s, vi);
  witness_internal::tls_exp_backend = saved;
  lo->resize(y.rows(), y.cols());
  hi->resize(y.rows(), y.cols());
  for (Eigen::Index j = 0; j < y.cols(); ++j)
    for (Eigen::Index i = 0; i < y.rows(); ++i) {
      (*lo)(i, j) = y(i, j).v.lo;
      (*hi)(i, j) = y(i, j).v.hi;
    }
}

void EncloseForward(const AttentionLayer& layer, const Eigen::MatrixXd& x, ExpBackend exp_backend,
                    Eigen::MatrixXd* lo, Eigen::MatrixXd* hi) {
  CheckInputs(layer, x, Eigen::MatrixXd::Ones(x.rows(), x.cols()));
  RequireRoundToNearest();
  const ExpBackend saved = witness_internal::tls_exp_backend;
  witness_internal::tls_exp_backend = exp_backend;
  const Mat<RI> y = Forward<RI>(layer, Mat<RI>(x.cast<RI>()));
  witness_internal::tls_exp_backend = saved;
  lo->resize(y.rows(), y.cols());
  hi->resize(y.rows(), y.cols());
  for (Eigen::Index j = 0; j < y.cols(); ++j)
    for (Eigen::Index i = 0; i < y.rows(); ++i) {
      (*lo)(i, j) = y(i, j).v.lo;
      (*hi)(i, j) = y(i, j).v.hi;
    }
}

// ---------------------------------------------------------------------------------------
// The same evaluation (models/forward.h: Evaluate, then Jvp) with every matrix product an
// interval GEMM (interval/interval_matrix.h) and only the elementwise steps (LayerNorm,
// softmax, its derivative) in scalar intervals: hundreds of times faster on wide layers.
// ---------------------------------------------------------------------------------------
namespace {

using IM = IntervalMatrix;

IM FromIntervals(const std::vector<Interval>& e, Eigen::Index rows, Eigen::Index cols) {
  Eigen::MatrixXd lo(rows, cols), hi(rows, cols);
  for (Eigen::Index i = 0; i < rows; ++i)
    for (Eigen::Index j = 0; j < cols; ++j) {
      lo(i, j) = e[i * cols + j].lo;
      hi(i, j) = e[i * cols + j].hi;
    }
  return IM::FromBounds(lo, hi);
}

IM AddBias(const IM& m, const Eigen::VectorXd& b, int off, int len) {
  if (b.size() == 0) return m;
  return m + IM::Point(b.segment(off, len).transpose().replicate(m.rows(), 1));
}

Interval InvSqrtDk(int dk) { return Interval(1.0) / Sqrt(Interval(double(dk))); }

// The post-LN step of the JVP: given enclosures of y = x + MHA(x) and dy = v + J_MHA v,
// encloses J_LN(y) dy row by row, J_LN(y) dy = gamma * (dy - mean(dy) - yhat mean(yhat dy)) / sigma(y).
IM PostLayerNormJvp(const LayerNormParams& ln, const IM& y, const IM& dy) {
  const Eigen::Index n = y.rows(), d = y.cols();
  const Interval dd{double(d)};
  std::vector<Interval> out(n * d);
  for (Eigen::Index i = 0; i < n; ++i) {
    Interval sum(0.0);
    for (Eigen::Index a = 0; a < d; ++a) sum += y(i, a);
    const Interval mean = sum / dd;
    std::vector<Interval> c(d);
    Interval sq(0.0);
    for (Eigen::Index a = 0; a < d; ++a) {
      c[a] = y(i, a) - mean;
      sq += Sqr(c[a]);
    }
    const Interval sigma = Sqrt(sq / dd + Interval(ln.eps));
    Interval dsum(0.0), mxd(0.0);
    std::vector<Interval> yhat(d);
    for (Eigen::Index a = 0; a < d; ++a) {
      yhat[a] = c[a] / sigma;
      dsum += dy(i, a);
      mxd += yhat[a] * dy(i, a);
    }
    const Interval dmean = dsum / dd;
    mxd = mxd / dd;
    for (Eigen::Index a = 0; a < d; ++a)
      out[i * d + a] = Interval(ln.gamma(a)) * (dy(i, a) - dmean - yhat[a] * mxd) / sigma;
  }
  return FromIntervals(out, n, d);
}

// The pre-LN step of the JVP, row by row: z = gamma * (x - mean) / sigma + beta into *z and
// its JVP along v into *dz.
void PreLayerNormJvp(const LayerNormParams& ln, const Eigen::MatrixXd& x, const Eigen::MatrixXd& v, IM* z, IM* dz) {
  const Eigen::Index n = x.rows(), d = x.cols();
  std::vector<Interval> ze(n * d), dze(n * d);
  const Interval dd{double(d)};
  for (Eigen::Index i = 0; i < n; ++i) {
    const LayerNormRowEnclosure r = EncloseLayerNormRow(ln, x.row(i));
    Interval dsum(0.0), mxd(0.0);
    for (Eigen::Index a = 0; a < d; ++a) {
      dsum += Interval(v(i, a));
      mxd += r.xhat[a] * Interval(v(i, a));
    }
    const Interval dmean = dsum / dd;
    mxd = mxd / dd;
    for (Eigen::Index a = 0; a < d; ++a) {
      ze[i * d + a] = r.z[a];
      dze[i * d + a] = Interval(ln.gamma(a)) * (Interval(v(i, a)) - dmean - r.xhat[a] * mxd) / r.sigma;
    }
  }
  *z = FromIntervals(ze, n, d);
  *dz = FromIntervals(dze, n, d);
}

// Head h's logits s (row-major N x N) and their JVP ds, from its queries q and their JVP dq.
void HeadLogitsJvp(const AttentionLayer& L, int h, const IM& z, const IM& dz, const IM& q, const IM& dq,
                   const Interval& scale, std::vector<Interval>* s, std::vector<Interval>* ds) {
  const Eigen::Index n = z.rows();
  const int dk = L.head_dim_qk;
  s->assign(n * n, Interval(0.0));
  ds->assign(n * n, Interval(0.0));
  if (L.kind == AttentionKind::kDot) {
    const Eigen::MatrixXd wk = L.wk_head(h);
    const IM k = AddBias(Mul(z, Eigen::MatrixXd(wk.transpose())), L.bk, h * dk, dk);
    const IM dk_ = Mul(dz, Eigen::MatrixXd(wk.transpose()));
    const IM sm = Scale(scale, Mul(q, k.transpose()));
    const IM dsm = Scale(scale, Mul(dq, k.transpose()) + Mul(q, dk_.transpose()));
    for (Eigen::Index i = 0; i < n; ++i)
      for (Eigen::Index j = 0; j < n; ++j) {
        (*s)[i * n + j] = sm(i, j);
        (*ds)[i * n + j] = dsm(i, j);
      }
    return;
  }
  // s_ij = -||q_i - q_j||^2 / sqrt(dk), ds_ij = -2 (q_i - q_j).(dq_i - dq_j) / sqrt(dk).
  for (Eigen::Index i = 0; i < n; ++i)
    for (Eigen::Index j = 0; j < n; ++j) {
      Interval sq(0.0), dot(0.0);
      for (int c = 0; c < dk; ++c) {
        const Interval e = q(i, c) - q(j, c);
        sq += Sqr(e);
        dot += e * (dq(i, c) - dq(j, c));
      }
      (*s)[i * n + j] = -(sq * scale);
      (*ds)[i * n + j] = Interval(-2.0) * dot * scale;
    }
}

// P = softmax_row(s) (masked) into *pm and dP_ij = P_ij (ds_ij - sum_k P_ik ds_ik) into *dpm.
void SoftmaxJvp(const std::vector<Interval>& s, const std::vector<Interval>& ds, Eigen::Index n, bool causal,
                ExpBackend exp_backend, IM* pm, IM* dpm) {
  std::vector<Interval> p(n * n, Interval(0.0)), dp(n * n, Interval(0.0));
  for (Eigen::Index i = 0; i < n; ++i) {
    const Eigen::Index len = causal ? i + 1 : n;
    double shift = -kInf;
    for (Eigen::Index j = 0; j < len; ++j) shift = std::max(shift, 0.5 * s[i * n + j].lo + 0.5 * s[i * n + j].hi);
    if (!std::isfinite(shift)) shift = 0;
    Interval zsum(0.0);
    for (Eigen::Index j = 0; j < len; ++j) zsum += (p[i * n + j] = Exp(s[i * n + j] - Interval(shift), exp_backend));
    Interval mean(0.0);
    for (Eigen::Index j = 0; j < len; ++j) {
      p[i * n + j] = p[i * n + j] / zsum;
      mean += p[i * n + j] * ds[i * n + j];
    }
    for (Eigen::Index j = 0; j < len; ++j) dp[i * n + j] = p[i * n + j] * (ds[i * n + j] - mean);
  }
  *pm = FromIntervals(p, n, n);
  *dpm = FromIntervals(dp, n, n);
}

}  // namespace

void EncloseJvp(const AttentionLayer& L, const Eigen::MatrixXd& x, const Eigen::MatrixXd& v,
                ExpBackend exp_backend, Eigen::MatrixXd* lo, Eigen::MatrixXd* hi) {
  CheckInputs(L, x, v);
  RequireRoundToNearest();
  const Eigen::Index n = x.rows();
  IM z = IM::Point(x), dz = IM::Point(v);
  if (L.layer_norm) PreLayerNormJvp(*L.layer_norm, x, v, &z, &dz);  // and its JVP, row by row
  IM dout = IM::Point(Eigen::MatrixXd::Zero(n, L.d_model));
  IM out = dout;  // MHA(x) itself, needed only by a post-LN layer
  for (int h = 0; h < L.heads; ++h) {
    const int dk = L.head_dim_qk;
    const Interval scale = InvSqrtDk(dk);
    const Eigen::MatrixXd wq = L.wq_head(h), wv = L.wv_head(h), wo = L.wo_head(h);
    const IM q = AddBias(Mul(z, Eigen::MatrixXd(wq.transpose())), L.bq, h * dk, dk);
    const IM dq = Mul(dz, Eigen::MatrixXd(wq.transpose()));
    // Values: V = Z Wv^T (dot) or Z A Wv^T = ((Z Wq^T) Wq / sqrt(dk)) Wv^T (l2), + bv.
    IM val, dval;
    if (L.kind == AttentionKind::kDot) {
      val = Mul(z, Eigen::MatrixXd(wv.transpose()));
      dval = Mul(dz, Eigen::MatrixXd(wv.transpose()));
    } else {
      val = Mul(Scale(scale, Mul(q, wq)), Eigen::MatrixXd(wv.transpose()));
      dval = Mul(Scale(scale, Mul(dq, wq)), Eigen::MatrixXd(wv.transpose()));
    }
    val = AddBias(val, L.bv, h * L.head_dim_v, L.head_dim_v);
    // Logits and their JVP, then the softmax and its JVP.
    std::vector<Interval> s, ds;
    HeadLogitsJvp(L, h, z, dz, q, dq, scale, &s, &ds);
    IM pm, dpm;
    SoftmaxJvp(s, ds, n, L.causal, exp_backend, &pm, &dpm);
    const IM dhead = Mul(dpm, val) + Mul(pm, dval);
    dout = dout + Mul(dhead, Eigen::MatrixXd(wo.transpose()));
    if (L.post_layer_norm) out = out + Mul(Mul(pm, val), Eigen::MatrixXd(wo.transpose()));
  }
  if (L.layer_norm) dout = dout + IM::Point(v);
  if (L.post_layer_norm) {  // J_f v = J_LN(y) (v + J_MHA v), y = x + MHA(x)
    if (L.bo.size()) out = out + IM::Point(L.bo.transpose().replicate(n, 1));
    dout = PostLayerNormJvp(*L.post_layer_norm, IM::Point(x) + out, IM::Point(v) + dout);
  }
  *lo = dout.Lower();
  *hi = dout.Upper();
}

LowerBound WitnessLowerBound(const AttentionLayer& layer, const Eigen::MatrixXd& x,
                             const Eigen::MatrixXd& v, NormKind norm, ExpBackend exp_backend) {
  Eigen::MatrixXd lo, hi;
  EncloseJvp(layer, x, v, exp_backend, &lo, &hi);
  const auto mig = [&](Eigen::Index i, Eigen::Index j) {
    return Interval::Unchecked(lo(i, j), hi(i, j)).Mig();  // NaN never: checked inputs
  };
  if (norm == NormKind::kL2) {
    double num2 = 0, den2 = 0;  // lower bound on ||Y||_F^2, upper bound on ||v||_F^2
    for (Eigen::Index j = 0; j < v.cols(); ++j)
      for (Eigen::Index i = 0; i < v.rows(); ++i) {
        const double m = mig(i, j);
        num2 = AddDown(num2, MulDown(m, m));
        den2 = AddUp(den2, MulUp(v(i, j), v(i, j)));
      }
    const double num = num2 > 0 ? SqrtDown(num2) : 0.0;
    const double den = SqrtUp(den2);
    if (!(num > 0)) return LowerBound(0);
    return LowerBound(std::max(0.0, DivDown(num, den)));
  }
  double num = 0;
  for (Eigen::Index j = 0; j < v.cols(); ++j)
    for (Eigen::Index i = 0; i < v.rows(); ++i) num = std::max(num, mig(i, j));
  const double den = v.cwiseAbs().maxCoeff();  // exact
  return LowerBound(std::max(0.0, DivDown(num, den)));
}

bool CertainlyInSet(const InputSet& set, const Eigen::MatrixXd& x) {
  if (x.rows() != set.center.rows() || x.cols() != set.center.cols() || !x.allFinite()) return false;
  // |x - x0| rounded upwards, entrywise.
  Eigen::MatrixXd d(x.rows(), x.cols());
  for (Eigen::Index j = 0; j < x.cols(); ++j)
    for (Eigen::Index i = 0; i < x.rows(); ++i)
      d(i, j) = std::max(std::fabs(SubUp(x(i, j), set.center(i, j))),
                         std::fabs(SubDown(x(i, j), set.center(i, j))));
  const double r = set.radius;
  auto sum_sq_up = [](const auto& m) {
    double s = 0;
    for (Eigen::Index k = 0; k < m.size(); ++k) s = AddUp(s, MulUp(m(k), m(k)));
    return s;
  };
  switch (set.kind) {
    case SetKind::kBall: return SqrtUp(sum_sq_up(d.reshaped())) <= r;
    case SetKind::kTokens:
      for (Eigen::Index i = 0; i < d.rows(); ++i) {
        const Eigen::RowVectorXd row = d.row(i);
        if (!(SqrtUp(sum_sq_up(row)) <= r)) return false;
      }
      return true;
    case SetKind::kBox: return d.maxCoeff() <= r;
  }
  return false;
}

}  // namespace lipcert
