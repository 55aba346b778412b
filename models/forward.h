// Exact forward pass, Jacobian-vector and vector-Jacobian products of an AttentionLayer,
// templated on the scalar so that tests can run the same code in MPFR (mpfr::mpreal).
// Nothing here forms the (ND) x (ND) Jacobian except DenseJacobian, meant for small sizes.
//
// Data flow for one head (see docs/math.md):
//   Q, K, V  ->  S = logits  ->  P = softmax_row(S) (masked)  ->  head = P V
// and the JVP / VJP follow the same steps forwards / backwards.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/attention_layer.h"

namespace lipcert {

// How a scalar type is read as a double (used only to pick the softmax stability shift,
// which any value leaves mathematically unchanged). Specialise for other scalars
// (mpfr::mpreal in tests, interval types in interval/).
template <class T>
struct ScalarToDouble {
  static double Get(const T& v) { return static_cast<double>(v); }
};

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
template <class T>
using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;

namespace detail {

template <class T>
Mat<T> Cast(const Eigen::MatrixXd& m) {
  return m.template cast<T>();
}

// Adds a bias row vector to every row; a size-0 bias is absent.
template <class T>
void AddBias(Mat<T>& m, const Eigen::VectorXd& b) {
  if (b.size() == 0) return;
  const Vec<T> bt = b.template cast<T>();
  m.rowwise() += bt.transpose();
}

// Per-head intermediate quantities at one point X (the LayerNorm output when present).
template <class T>
struct HeadState {
  Mat<T> q, k, v;  // (N, dk), (N, dk), (N, dv)
  Mat<T> p;        // (N, N) attention probabilities (0 where masked)
};

template <class T>
struct LayerNormState {
  Mat<T> xhat;   // (N, D) normalised rows
  Vec<T> sigma;  // (N) sqrt(var + eps)
};

// Value-path matrix (dv, D): Wv_h for dot, Wv_h A_h for l2, A_h = Wq_h^T Wq_h / sqrt(dk),
// formed in T so that an MPFR or interval evaluation is of the exact layer.
template <class T>
Mat<T> ValueMatrix(const AttentionLayer& L, int h) {
  using std::sqrt;
  const Mat<T> wv = Cast<T>(L.wv_head(h));
  if (L.kind == AttentionKind::kDot) return wv;
  const Mat<T> wq = Cast<T>(L.wq_head(h));
  const Mat<T> a = wq.transpose() * wq;
  return Mat<T>(wv * a) / sqrt(T(double(L.head_dim_qk)));
}

template <class T>
HeadState<T> ComputeHead(const AttentionLayer& L, int h, const Mat<T>& x) {
  using std::exp;
  using std::sqrt;
  const int n = int(x.rows());
  HeadState<T> s;
  const T scale = T(1) / sqrt(T(L.head_dim_qk));
  s.q = x * Cast<T>(L.wq_head(h)).transpose();
  Mat<T> logits(n, n);
  if (L.kind == AttentionKind::kDot) {
    if (L.bq.size()) AddBias(s.q, Eigen::VectorXd(L.bq.segment(h * L.head_dim_qk, L.head_dim_qk)));
    s.k = x * Cast<T>(L.wk_head(h)).transpose();
    if (L.bk.size()) AddBias(s.k, Eigen::VectorXd(L.bk.segment(h * L.head_dim_qk, L.head_dim_qk)));
    logits = s.q * s.k.transpose() * scale;
  } else {
    s.k = s.q;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) logits(i, j) = -(s.q.row(i) - s.q.row(j)).squaredNorm() * scale;
  }
  s.v = x * ValueMatrix<T>(L, h).transpose();
  if (L.bv.size()) AddBias(s.v, Eigen::VectorXd(L.bv.segment(h * L.head_dim_v, L.head_dim_v)));
  s.p = Mat<T>::Zero(n, n);
  for (int i = 0; i < n; ++i) {
    const int jmax = L.causal ? i + 1 : n;
    // Any shift is exact mathematically; the row maximum keeps exp from overflowing.
    double shift = ScalarToDouble<T>::Get(logits(i, 0));
    for (int j = 1; j < jmax; ++j) shift = std::max(shift, ScalarToDouble<T>::Get(logits(i, j)));
    const T m = T(shift);
    T z = T(0);
    for (int j = 0; j < jmax; ++j) z += (s.p(i, j) = exp(logits(i, j) - m));
    for (int j = 0; j < jmax; ++j) s.p(i, j) /= z;
  }
  return s;
}

template <class T>
Mat<T> LayerNormForward(const LayerNormParams& ln, const Mat<T>& x, LayerNormState<T>* st) {
  using std::sqrt;
  const int n = int(x.rows()), d = int(x.cols());
  st->xhat.resize(n, d);
  st->sigma.resize(n);
  Mat<T> z(n, d);
  for (int i = 0; i < n; ++i) {
    const T mean = x.row(i).sum() / T(d);
    Vec<T> c = (x.row(i).array() - mean).matrix().transpose();
    const T var = c.squaredNorm() / T(d);
    st->sigma(i) = sqrt(var + T(ln.eps));
    st->xhat.row(i) = (c / st->sigma(i)).transpose();
    for (int j = 0; j < d; ++j) z(i, j) = T(ln.gamma(j)) * st->xhat(i, j) + T(ln.beta(j));
  }
  return z;
}

// d LayerNorm along dx (rows independent).
template <class T>
Mat<T> LayerNormJvp(const LayerNormParams& ln, const LayerNormState<T>& st, const Mat<T>& dx) {
  const int n = int(dx.rows()), d = int(dx.cols());
  Mat<T> dz(n, d);
  for (int i = 0; i < n; ++i) {
    const T mdx = dx.row(i).sum() / T(d);
    const T mxd = st.xhat.row(i).dot(dx.row(i)) / T(d);
    for (int j = 0; j < d; ++j)
      dz(i, j) = T(ln.gamma(j)) * (dx(i, j) - mdx - st.xhat(i, j) * mxd) / st.sigma(i);
  }
  return dz;
}

template <class T>
Mat<T> LayerNormVjp(const LayerNormParams& ln, const LayerNormState<T>& st, const Mat<T>& gz) {
  const int n = int(gz.rows()), d = int(gz.cols());
  Mat<T> gx(n, d);
  for (int i = 0; i < n; ++i) {
    Vec<T> g(d);
    for (int j = 0; j < d; ++j) g(j) = T(ln.gamma(j)) * gz(i, j);
    const T mg = g.sum() / T(d);
    const T mgx = g.dot(st.xhat.row(i).transpose()) / T(d);
    for (int j = 0; j < d; ++j) gx(i, j) = (g(j) - mg - st.xhat(i, j) * mgx) / st.sigma(i);
  }
  return gx;
}

}  // namespace detail

// Everything the JVP and VJP need at one point, computed once.
template <class T>
struct LayerState {
  Mat<T> x;                               // the input
  Mat<T> z;                               // MHA input: LayerNorm(x) or x
  detail::LayerNormState<T> ln;           // valid when the layer has LayerNorm
  std::vector<detail::HeadState<T>> heads;
  Mat<T> y;                               // the output f(x)
  detail::LayerNormState<T> post_ln;      // valid when the layer has a post-LN: state at x + MHA(x)
};

template <class T>
LayerState<T> Evaluate(const AttentionLayer& L, const Mat<T>& x) {
  LayerState<T> s;
  s.x = x;
  s.z = L.layer_norm ? detail::LayerNormForward(*L.layer_norm, x, &s.ln) : x;
  Mat<T> out = Mat<T>::Zero(x.rows(), L.d_model);
  for (int h = 0; h < L.heads; ++h) {
    s.heads.push_back(detail::ComputeHead(L, h, s.z));
    out += s.heads.back().p * s.heads.back().v * detail::Cast<T>(L.wo_head(h)).transpose();
  }
  detail::AddBias(out, L.bo);
  s.y = L.layer_norm ? Mat<T>(x + out) : out;
  if (L.post_layer_norm) s.y = detail::LayerNormForward(*L.post_layer_norm, Mat<T>(x + out), &s.post_ln);
  return s;
}

template <class T>
Mat<T> Forward(const AttentionLayer& L, const Mat<T>& x) {
  return Evaluate(L, x).y;
}

// J(x) dx.
template <class T>
Mat<T> Jvp(const AttentionLayer& L, const LayerState<T>& s, const Mat<T>& dx) {
  using std::sqrt;
  const Mat<T> dz = L.layer_norm ? detail::LayerNormJvp(*L.layer_norm, s.ln, dx) : dx;
  const int n = int(dx.rows());
  const T scale = T(1) / sqrt(T(L.head_dim_qk));
  Mat<T> dout = Mat<T>::Zero(n, L.d_model);
  for (int h = 0; h < L.heads; ++h) {
    const auto& hs = s.heads[h];
    const Mat<T> dq = dz * detail::Cast<T>(L.wq_head(h)).transpose();
    Mat<T> ds(n, n);
    if (L.kind == AttentionKind::kDot) {
      const Mat<T> dk = dz * detail::Cast<T>(L.wk_head(h)).transpose();
      ds = (dq * hs.k.transpose() + hs.q * dk.transpose()) * scale;
    } else {
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j)
          ds(i, j) = T(-2) * scale * (hs.q.row(i) - hs.q.row(j)).dot(dq.row(i) - dq.row(j));
    }
    Mat<T> dp(n, n);
    for (int i = 0; i < n; ++i) {
      const T mean = hs.p.row(i).dot(ds.row(i));
      for (int j = 0; j < n; ++j) dp(i, j) = hs.p(i, j) * (ds(i, j) - mean);
    }
    const Mat<T> dv = dz * detail::ValueMatrix<T>(L, h).transpose();
    dout += (dp * hs.v + hs.p * dv) * detail::Cast<T>(L.wo_head(h)).transpose();
  }
  if (L.post_layer_norm) return detail::LayerNormJvp(*L.post_layer_norm, s.post_ln, Mat<T>(dx + dout));
  return L.layer_norm ? Mat<T>(dx + dout) : dout;
}

// J(x)^T u.
template <class T>
Mat<T> Vjp(const AttentionLayer& L, const LayerState<T>& s, const Mat<T>& u_out) {
  using std::sqrt;
  // Post-LN: J^T u = (I + J_MHA^T) J_LN(y)^T u; below u is J_LN(y)^T u.
  const Mat<T> u = L.post_layer_norm ? detail::LayerNormVjp(*L.post_layer_norm, s.post_ln, u_out) : u_out;
  const int n = int(u.rows());
  const T scale = T(1) / sqrt(T(L.head_dim_qk));
  Mat<T> gz = Mat<T>::Zero(n, L.d_model);
  for (int h = 0; h < L.heads; ++h) {
    const auto& hs = s.heads[h];
    const Mat<T> gh = u * detail::Cast<T>(L.wo_head(h));  // (N, dv)
    const Mat<T> gp = gh * hs.v.transpose();                // (N, N)
    const Mat<T> gv = hs.p.transpose() * gh;                // (N, dv)
    Mat<T> gs(n, n);
    for (int i = 0; i < n; ++i) {
      const T mean = hs.p.row(i).dot(gp.row(i));
      for (int j = 0; j < n; ++j) gs(i, j) = hs.p(i, j) * (gp(i, j) - mean);
    }
    Mat<T> gq;
    if (L.kind == AttentionKind::kDot) {
      gq = gs * hs.k * scale;
      const Mat<T> gk = gs.transpose() * hs.q * scale;
      gz += gk * detail::Cast<T>(L.wk_head(h));
    } else {
      const Vec<T> r = gs.rowwise().sum() + gs.colwise().sum().transpose();
      gq = T(-2) * scale * (r.asDiagonal() * hs.q - gs * hs.q - gs.transpose() * hs.q);
    }
    gz += gq * detail::Cast<T>(L.wq_head(h));
    gz += gv * detail::ValueMatrix<T>(L, h);
  }
  if (L.post_layer_norm) return Mat<T>(u + gz);
  if (!L.layer_norm) return gz;
  return u + detail::LayerNormVjp(*L.layer_norm, s.ln, gz);
}

// The full (N*D) x (N*D) Jacobian, row-major flattening (index i*D + a). Small sizes only.
template <class T>
Mat<T> DenseJacobian(const AttentionLayer& L, const Mat<T>& x) {
  const LayerState<T> s = Evaluate(L, x);
  const int n = int(x.rows()), d = int(x.cols());
  Mat<T> jac(n * d, n * d);
  for (int c = 0; c < n * d; ++c) {
    Mat<T> e = Mat<T>::Zero(n, d);
    e(c / d, c % d) = T(1);
    const Mat<T> col = Jvp(L, s, e);
    for (int r = 0; r < n * d; ++r) jac(r, c) = col(r / d, r % d);
  }
  return jac;
}

}  // namespace lipcert
