// CPU kernels of the Jacobian-norm evaluator, templated on the compute type (float or double): the state of
// the layer at one point, and J v, J^T u and the tangent of J^T u along v at that point,
// each a handful of GEMMs over all heads at once plus row-wise softmax algebra. Mirrors
// models/forward.h step by step (which stays the reference); the CUDA kernels mirror this.
// Internal to kernels/.
#pragma once

#include <Eigen/Dense>
#include <cmath>
#include <vector>

#include "models/attention_layer.h"
#include "models/forward.h"

namespace lipcert::kernels_internal {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using RowVec = Eigen::Matrix<T, 1, Eigen::Dynamic>;
template <class T>
using ColVec = Eigen::Matrix<T, Eigen::Dynamic, 1>;

// The weights in the compute type, laid out for the products below.
template <class T>
struct CpuLayer {
  AttentionKind kind = AttentionKind::kDot;
  bool causal = false;
  int n = 0, d = 0, heads = 0, dk = 0, dv = 0;
  T scale = 1;              // 1 / sqrt(dk)
  RowMat<T> wq, wk, m, wo;  // (H dk, D), (H dk, D), (H dv, D) value path, (D, H dv)
  RowMat<T> wq_t, wk_t, m_t, wo_t;
  RowMat<T> wo_gram;         // (H dv, H dv) = Wo^T Wo: J^T J without the output round trip
  RowVec<T> bq, bk, bv, bo;  // size 0 when absent
  bool ln = false;
  RowVec<T> gamma, beta;
  T eps = 0;

  CpuLayer(const AttentionLayer& L, int tokens) {
    kind = L.kind;
    causal = L.causal;
    n = tokens;
    d = L.d_model;
    heads = L.heads;
    dk = L.head_dim_qk;
    dv = L.head_dim_v;
    scale = T(1.0 / std::sqrt(double(dk)));
    wq = L.wq.cast<T>();
    wk = L.wk.cast<T>();
    Eigen::MatrixXd mv(heads * dv, d);
    for (int h = 0; h < heads; ++h) mv.middleRows(h * dv, dv) = detail::ValueMatrix<double>(L, h);
    m = mv.cast<T>();
    wo = L.wo.cast<T>();
    wo_gram = (L.wo.transpose() * L.wo).cast<T>();
    wq_t = wq.transpose();
    wk_t = wk.transpose();
    m_t = m.transpose();
    wo_t = wo.transpose();
    if (L.bq.size()) bq = L.bq.transpose().cast<T>();
    if (L.bk.size()) bk = L.bk.transpose().cast<T>();
    if (L.bv.size()) bv = L.bv.transpose().cast<T>();
    if (L.bo.size()) bo = L.bo.transpose().cast<T>();
    if (L.layer_norm) {
      ln = true;
      gamma = L.layer_norm->gamma.transpose().cast<T>();
      beta = L.layer_norm->beta.transpose().cast<T>();
      eps = T(L.layer_norm->eps);
    }
  }
  bool dot() const { return kind == AttentionKind::kDot; }
};

// Everything J v and J^T u need at one point.
template <class T>
struct PointState {
  RowMat<T> x, z, xhat;  // input, MHA input (LayerNorm(x) or x), normalised rows
  ColVec<T> sigma;       // LayerNorm sqrt(var + eps) per row
  RowMat<T> q, k, v;     // (N, H dk), (N, H dk) (dot only), (N, H dv)
  std::vector<RowMat<T>> p;  // per head (N, N) probabilities, 0 where masked
};

// Scratch, allocated once per worker.
template <class T>
struct Workspace {
  RowMat<T> dz, dq, dk, dv, head;  // (N,D) (N,Hdk) (N,Hdk) (N,Hdv) (N,Hdv)
  RowMat<T> g, dp, gp, dgp, gs, dgs, sym, dsym;  // (N,N)
  RowMat<T> gh, gq, gk, gv, dgq, dgk, dgv, gz, dgz;
  ColVec<T> r, dr;

  void Resize(const CpuLayer<T>& L) {
    const int n = L.n, hq = L.heads * L.dk, hv = L.heads * L.dv;
    dz.resize(n, L.d), gz.resize(n, L.d), dgz.resize(n, L.d);
    dq.resize(n, hq), dk.resize(n, hq), gq.resize(n, hq), gk.resize(n, hq), dgq.resize(n, hq),
        dgk.resize(n, hq);
    dv.resize(n, hv), head.resize(n, hv), gh.resize(n, hv), gv.resize(n, hv), dgv.resize(n, hv);
    for (RowMat<T>* a : {&g, &dp, &gp, &dgp, &gs, &dgs, &sym, &dsym}) a->resize(n, n);
    r.resize(n), dr.resize(n);
  }
};

// ---- LayerNorm, row-wise (same formulas as models/forward.h) ----

template <class T>
void LayerNormForward(const CpuLayer<T>& L, PointState<T>& s) {
  const int n = L.n, d = L.d;
  s.z.resize(n, d), s.xhat.resize(n, d), s.sigma.resize(n);
  for (int i = 0; i < n; ++i) {
    const T mean = s.x.row(i).sum() / T(d);
    s.xhat.row(i) = s.x.row(i).array() - mean;
    const T var = s.xhat.row(i).squaredNorm() / T(d);
    s.sigma(i) = std::sqrt(var + L.eps);
    s.xhat.row(i) /= s.sigma(i);
    s.z.row(i) = L.gamma.cwiseProduct(s.xhat.row(i)) + L.beta;
  }
}

template <class T>
void LayerNormJvp(const CpuLayer<T>& L, const PointState<T>& s, const RowMat<T>& dx, RowMat<T>& dz) {
  const int d = L.d;
  for (int i = 0; i < L.n; ++i) {
    const T mdx = dx.row(i).sum() / T(d);
    const T mxd = s.xhat.row(i).dot(dx.row(i)) / T(d);
    dz.row(i) = L.gamma.cwiseProduct((dx.row(i).array() - mdx).matrix() - s.xhat.row(i) * mxd) /
                s.sigma(i);
  }
}

// out = J_LN^T gz (+ out when accumulate).
template <class T>
void LayerNormVjp(const CpuLayer<T>& L, const PointState<T>& s, const RowMat<T>& gz, RowMat<T>& out,
                  bool accumulate) {
  const int d = L.d;
  for (int i = 0; i < L.n; ++i) {
    const RowVec<T> g = L.gamma.cwiseProduct(gz.row(i));
    const T mg = g.sum() / T(d);
    const T mgx = g.dot(s.xhat.row(i)) / T(d);
    const RowVec<T> gx = ((g.array() - mg).matrix() - s.xhat.row(i) * mgx) / s.sigma(i);
    if (accumulate) out.row(i) += gx;
    else out.row(i) = gx;
  }
}

// out = d/dt J_LN(x + t dx)^T gz(t) at t = 0, with gz'(0) = dgz.
template <class T>
void LayerNormVjpTangent(const CpuLayer<T>& L, const PointState<T>& s, const RowMat<T>& dx,
                         const RowMat<T>& gz, const RowMat<T>& dgz, RowMat<T>& out) {
  const int d = L.d;
  for (int i = 0; i < L.n; ++i) {
    const T sig = s.sigma(i);
    const auto xh = s.xhat.row(i);
    const RowVec<T> g = L.gamma.cwiseProduct(gz.row(i));
    const RowVec<T> dg = L.gamma.cwiseProduct(dgz.row(i));
    const T mg = g.sum() / T(d), dmg = dg.sum() / T(d);
    const T mgx = g.dot(xh) / T(d);
    const T mdx = dx.row(i).sum() / T(d);
    const T dsig = xh.dot(dx.row(i)) / T(d);  // d sigma
    const RowVec<T> dxh = ((dx.row(i).array() - mdx).matrix() - xh * dsig) / sig;
    const T dmgx = (dg.dot(xh) + g.dot(dxh)) / T(d);
    const RowVec<T> gx = ((g.array() - mg).matrix() - xh * mgx) / sig;
    out.row(i) = ((dg.array() - dmg).matrix() - dxh * mgx - xh * dmgx) / sig - gx * (dsig / sig);
  }
}

// ---- attention ----

// Row-wise softmax of the logits already in p (masked entries ignored and set to 0).
template <class T>
void SoftmaxRows(const CpuLayer<T>& L, RowMat<T>& p) {
  const int n = L.n;
  for (int i = 0; i < n; ++i) {
    const int jmax = L.causal ? i + 1 : n;
    T mx = p(i, 0);
    for (int j = 1; j < jmax; ++j) mx = std::max(mx, p(i, j));
    T z = 0;
    for (int j = 0; j < jmax; ++j) z += (p(i, j) = std::exp(p(i, j) - mx));
    const T inv = T(1) / z;
    for (int j = 0; j < jmax; ++j) p(i, j) *= inv;
    for (int j = jmax; j < n; ++j) p(i, j) = 0;
  }
}

// Computes the state at s.x (set by the caller).
template <class T>
void Evaluate(const CpuLayer<T>& L, PointState<T>& s, Workspace<T>& w) {
  const int n = L.n;
  if (L.ln) LayerNormForward(L, s);
  else s.z = s.x;
  s.q.noalias() = s.z * L.wq_t;
  if (L.bq.size()) s.q.rowwise() += L.bq;
  if (L.dot()) {
    s.k.noalias() = s.z * L.wk_t;
    if (L.bk.size()) s.k.rowwise() += L.bk;
  }
  s.v.noalias() = s.z * L.m_t;
  if (L.bv.size()) s.v.rowwise() += L.bv;
  s.p.resize(L.heads);
  for (int h = 0; h < L.heads; ++h) {
    RowMat<T>& p = s.p[h];
    p.resize(n, n);
    const auto qh = s.q.middleCols(h * L.dk, L.dk);
    if (L.dot()) {
      p.noalias() = qh * s.k.middleCols(h * L.dk, L.dk).transpose();
      p *= L.scale;
    } else {
      // -||q_i - q_j||^2 / sqrt(dk) from the Gram matrix G = Q Q^T.
      w.g.noalias() = qh * qh.transpose();
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) p(i, j) = -(w.g(i, i) + w.g(j, j) - T(2) * w.g(i, j)) * L.scale;
    }
    SoftmaxRows(L, p);
  }
}

// y = f(x) at the evaluated state.
template <class T>
void ForwardOutput(const CpuLayer<T>& L, const PointState<T>& s, Workspace<T>& w, RowMat<T>& y) {
  for (int h = 0; h < L.heads; ++h)
    w.head.middleCols(h * L.dv, L.dv).noalias() = s.p[h] * s.v.middleCols(h * L.dv, L.dv);
  y.noalias() = w.head * L.wo_t;
  if (L.bo.size()) y.rowwise() += L.bo;
  if (L.ln) y += s.x;
}

// Tangent of P^h along the already computed w.dq, w.dk: dst = P o (dS - rowdot(P, dS)).
template <class T>
void SoftmaxTangent(const CpuLayer<T>& L, const PointState<T>& s, Workspace<T>& w, int h, RowMat<T>& dst) {
  const int n = L.n;
  const auto qh = s.q.middleCols(h * L.dk, L.dk);
  const auto dqh = w.dq.middleCols(h * L.dk, L.dk);
  if (L.dot()) {
    dst.noalias() = dqh * s.k.middleCols(h * L.dk, L.dk).transpose();
    dst.noalias() += qh * w.dk.middleCols(h * L.dk, L.dk).transpose();
    dst *= L.scale;
  } else {
    // dS_ij = -2/sqrt(dk) (q_i - q_j).(dq_i - dq_j) with G = Q dQ^T.
    w.g.noalias() = qh * dqh.transpose();
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        dst(i, j) = T(-2) * L.scale * (w.g(i, i) - w.g(i, j) - w.g(j, i) + w.g(j, j));
  }
  const RowMat<T>& p = s.p[h];
  for (int i = 0; i < n; ++i) {
    const T mean = p.row(i).dot(dst.row(i));
    dst.row(i) = p.row(i).cwiseProduct((dst.row(i).array() - mean).matrix());
  }
}

// Projections of the MHA input tangent w.dz.
template <class T>
void ProjectTangent(const CpuLayer<T>& L, Workspace<T>& w) {
  w.dq.noalias() = w.dz * L.wq_t;
  if (L.dot()) w.dk.noalias() = w.dz * L.wk_t;
  w.dv.noalias() = w.dz * L.m_t;
}

// w.head = the tangent of the concatenated heads along dx (J dx before the output projection).
template <class T>
void JvpHeads(const CpuLayer<T>& L, const PointState<T>& s, Workspace<T>& w, const RowMat<T>& dx) {
  if (L.ln) LayerNormJvp(L, s, dx, w.dz);
  else w.dz = dx;
  ProjectTangent(L, w);
  for (int h = 0; h < L.heads; ++h) {
    SoftmaxTangent(L, s, w, h, w.dp);
    auto dhead = w.head.middleCols(h * L.dv, L.dv);
    dhead.noalias() = w.dp * s.v.middleCols(h * L.dv, L.dv);
    dhead.noalias() += s.p[h] * w.dv.middleCols(h * L.dv, L.dv);
  }
}

// out = J(x) dx.
template <class T>
void Jvp(const CpuLayer<T>& L, const PointState<T>& s, Workspace<T>& w, const RowMat<T>& dx, RowMat<T>& out) {
  JvpHeads(L, s, w, dx);
  out.noalias() = w.head * L.wo_t;
  if (L.ln) out += dx;
}

// gs = P o (gp - rowdot(P, gp)).
template <class T>
void SoftmaxVjp(const RowMat<T>& p, const RowMat<T>& gp, RowMat<T>& gs) {
  for (int i = 0; i < p.rows(); ++i) {
    const T mean = p.row(i).dot(gp.row(i));
    gs.row(i) = p.row(i).cwiseProduct((gp.row(i).array() - mean).matrix());
  }
}

// out = J(x)^T u given w.gh = u Wo (the cotangent of the concatenated heads); `u` is
// needed only for the residual of the LayerNorm sublayer.
template <class T>
void VjpFromHeads(const CpuLayer<T>& L, const PointState<T>& s, Workspace<T>& w, const RowMat<T>& u,
                  RowMat<T>& out) {
  const int n = L.n;
  for (int h = 0; h < L.heads; ++h) {
    const auto ghh = w.gh.middleCols(h * L.dv, L.dv);
    const auto qh = s.q.middleCols(h * L.dk, L.dk);
    const RowMat<T>& p = s.p[h];
    w.gp.noalias() = ghh * s.v.middleCols(h * L.dv, L.dv).transpose();
    w.gv.middleCols(h * L.dv, L.dv).noalias() = p.transpose() * ghh;
    SoftmaxVjp(p, w.gp, w.gs);
    auto gqh = w.gq.middleCols(h * L.dk, L.dk);
    if (L.dot()) {
      gqh.noalias() = w.gs * s.k.middleCols(h * L.dk, L.dk);
      gqh *= L.scale;
      auto gkh = w.gk.middleCols(h * L.dk, L.dk);
      gkh.noalias() = w.gs.transpose() * qh;
      gkh *= L.scale;
    } else {
      // gq = 2/sqrt(dk) ((gs + gs^T) Q - diag(r) Q), r = row sums of gs + gs^T.
      w.sym = w.gs + w.gs.transpose();
      w.r = w.sym.rowwise().sum();
      gqh.noalias() = w.sym * qh;
      for (int i = 0; i < n; ++i) gqh.row(i) = T(2) * L.scale * (gqh.row(i) - w.r(i) * qh.row(i));
    }
  }
  w.gz.noalias() = w.gq * L.wq;
  if (L.dot()) w.gz.noalias() += w.gk * L.wk;
  w.gz.noalias() += w.gv * L.m;
  if (L.ln) {
    out = u;
    LayerNormVjp(L, s, w.gz, out, /*accumulate=*/true);
  } else {
    out = w.gz;
  }
}

// out = J(x)^T u.
template <class T>
void Vjp(const CpuLayer<T>& L, const PointState<T>& s, Workspace<T>& w, const RowMat<T>& u, RowMat<T>& out) {
  w.gh.noalias() = u * L.wo;
  VjpFromHeads(L, s, w, u, out);
}

// out = J^T J dx. Without LayerNorm the output projection and the VJP's first product fuse
// into one product with Wo^T Wo (one (N, H dv) x (H dv, H dv) GEMM instead of two with D).
// tmp: scratch (N, D).
template <class T>
void NormalProduct(const CpuLayer<T>& L, const PointState<T>& s, Workspace<T>& w, const RowMat<T>& dx,
                   RowMat<T>& tmp, RowMat<T>& out) {
  JvpHeads(L, s, w, dx);
  if (!L.ln) {
    w.gh.noalias() = w.head * L.wo_gram;
    VjpFromHeads(L, s, w, dx /*unused without LayerNorm*/, out);
    return;
  }
  tmp.noalias() = w.head * L.wo_t;
  tmp += dx;
  w.gh.noalias() = tmp * L.wo;
  VjpFromHeads(L, s, w, tmp, out);
}

// out = d/dt J(x + t v)^T u at t = 0 = grad_x <u, J(x) v>: the VJP differentiated by hand
// along v (product rule through every step of Vjp above).
template <class T>
void VjpTangent(const CpuLayer<T>& L, const PointState<T>& s, Workspace<T>& w, const RowMat<T>& u,
                const RowMat<T>& v, RowMat<T>& out) {
  const int n = L.n;
  if (L.ln) LayerNormJvp(L, s, v, w.dz);
  else w.dz = v;
  ProjectTangent(L, w);
  w.gh.noalias() = u * L.wo;
  for (int h = 0; h < L.heads; ++h) {
    const auto ghh = w.gh.middleCols(h * L.dv, L.dv);
    const auto qh = s.q.middleCols(h * L.dk, L.dk);
    const auto dqh = w.dq.middleCols(h * L.dk, L.dk);
    const RowMat<T>& p = s.p[h];
    SoftmaxTangent(L, s, w, h, w.dp);  // dP
    w.gp.noalias() = ghh * s.v.middleCols(h * L.dv, L.dv).transpose();
    w.dgp.noalias() = ghh * w.dv.middleCols(h * L.dv, L.dv).transpose();
    w.gv.middleCols(h * L.dv, L.dv).noalias() = p.transpose() * ghh;
    w.dgv.middleCols(h * L.dv, L.dv).noalias() = w.dp.transpose() * ghh;
    for (int i = 0; i < n; ++i) {
      const T m = p.row(i).dot(w.gp.row(i));
      const T dm = w.dp.row(i).dot(w.gp.row(i)) + p.row(i).dot(w.dgp.row(i));
      for (int j = 0; j < n; ++j) {
        w.gs(i, j) = p(i, j) * (w.gp(i, j) - m);
        w.dgs(i, j) = w.dp(i, j) * (w.gp(i, j) - m) + p(i, j) * (w.dgp(i, j) - dm);
      }
    }
    auto gqh = w.gq.middleCols(h * L.dk, L.dk);
    auto dgqh = w.dgq.middleCols(h * L.dk, L.dk);
    if (L.dot()) {
      const auto kh = s.k.middleCols(h * L.dk, L.dk);
      const auto dkh = w.dk.middleCols(h * L.dk, L.dk);
      gqh.noalias() = w.gs * kh;
      gqh *= L.scale;
      dgqh.noalias() = w.dgs * kh;
      dgqh.noalias() += w.gs * dkh;
      dgqh *= L.scale;
      auto gkh = w.gk.middleCols(h * L.dk, L.dk);
      auto dgkh = w.dgk.middleCols(h * L.dk, L.dk);
      gkh.noalias() = w.gs.transpose() * qh;
      gkh *= L.scale;
      dgkh.noalias() = w.dgs.transpose() * qh;
      dgkh.noalias() += w.gs.transpose() * dqh;
      dgkh *= L.scale;
    } else {
      w.sym = w.gs + w.gs.transpose();
      w.dsym = w.dgs + w.dgs.transpose();
      w.r = w.sym.rowwise().sum();
      w.dr = w.dsym.rowwise().sum();
      gqh.noalias() = w.sym * qh;
      dgqh.noalias() = w.dsym * qh;
      dgqh.noalias() += w.sym * dqh;
      for (int i = 0; i < n; ++i) {
        gqh.row(i) = T(2) * L.scale * (gqh.row(i) - w.r(i) * qh.row(i));
        dgqh.row(i) = T(2) * L.scale * (dgqh.row(i) - w.dr(i) * qh.row(i) - w.r(i) * dqh.row(i));
      }
    }
  }
  w.dgz.noalias() = w.dgq * L.wq;
  if (L.dot()) w.dgz.noalias() += w.dgk * L.wk;
  w.dgz.noalias() += w.dgv * L.m;
  if (!L.ln) {
    out = w.dgz;
    return;
  }
  w.gz.noalias() = w.gq * L.wq;
  if (L.dot()) w.gz.noalias() += w.gk * L.wk;
  w.gz.noalias() += w.gv * L.m;
  LayerNormVjpTangent(L, s, v, w.gz, w.dgz, out);
}

}  // namespace lipcert::kernels_internal
