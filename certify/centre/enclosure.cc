// The layer at the centre X0, enclosed once per head (probabilities, values, the rows of
// the logits' gradients, W_h) and per token (the LayerNorm factor): what every assembly of
// J(X0) reads.
#include "certify/centre/internal.h"

#include <Eigen/Dense>
#include <vector>

#include "certify/layer_norm_enclosure.h"
#include "interval/parallel.h"
#include "interval/softmax.h"

namespace lipcert {
namespace centre_internal {

namespace {

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

WStacks WStacksOf(const std::vector<HeadCentre>& heads, int d) {
  const Eigen::Index dd = Eigen::Index(d) * d, hs = Eigen::Index(heads.size());
  WStacks w{RowMajorXd(hs, dd), RowMajorXd(hs, dd)};
  for (Eigen::Index h = 0; h < hs; ++h) {
    w.mid.row(h) = Eigen::Map<const Eigen::RowVectorXd>(heads[h].w.mid.data(), dd);
    w.rad.row(h) = Eigen::Map<const Eigen::RowVectorXd>(heads[h].w.rad.data(), dd);
  }
  return w;
}

}  // namespace

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

}  // namespace centre_internal

}  // namespace lipcert
