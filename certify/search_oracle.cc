#include "certify/search_oracle.h"

#include <algorithm>
#include <functional>
#include <atomic>
#include <cmath>
#include <numeric>
#include <vector>

#include "certify/run_control.h"
#include "interval/parallel.h"
#include "kernels/lanczos.h"
#include "models/forward.h"

namespace lipcert::search_parts {

using Eigen::MatrixXd;
using RowMajorXd = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

Oracle::Oracle(const AttentionLayer& layer, int tokens, double rel_tol, int max_iters)
    : layer_(layer),
      n_(tokens),
      d_(layer.d_model),
      rel_tol_(rel_tol),
      max_iters_(max_iters),
      post_ln_(layer.post_ln()) {
  EvaluatorOptions eo;
  eo.device = Device::kCpu;
  eo.dtype = DType::kF64;
  eo.threads = 1;
  eo.rel_tol = rel_tol;
  eo.max_iters = max_iters;
  // The CPU back end copies the weights it needs: the temporary may go.
  engine_ = MakeJacobianEvaluator(post_ln_ ? layer.WithoutPostLayerNorm() : layer, tokens, eo);
}

Oracle::~Oracle() = default;

MatrixXd Oracle::MhaJv(const MatrixXd& x, const MatrixXd& v) const {
  RowMajorXd out(n_, d_);
  engine_->Jvp(RowMajorXd(x).data(), RowMajorXd(v).data(), 1, out.data());
  return out;
}

MatrixXd Oracle::MhaJTu(const MatrixXd& x, const MatrixXd& u) const {
  RowMajorXd out(n_, d_);
  engine_->Vjp(RowMajorXd(x).data(), RowMajorXd(u).data(), 1, out.data());
  return out;
}

const Oracle::PostLnRows& Oracle::RowsAt(const MatrixXd& x) const {
  if (rows_.x.rows() == x.rows() && rows_.x.cols() == x.cols() && rows_.x == x) return rows_;
  RowMajorXd mha(n_, d_);
  engine_->Forward(RowMajorXd(x).data(), 1, mha.data());
  const MatrixXd y = x + MatrixXd(mha);
  const LayerNormParams& ln = *layer_.post_layer_norm;
  rows_.x = x;
  rows_.yhat.resize(n_, d_);
  rows_.sigma.resize(n_);
  for (int i = 0; i < n_; ++i) {
    const Eigen::RowVectorXd c = y.row(i).array() - y.row(i).mean();
    rows_.sigma(i) = std::sqrt(c.squaredNorm() / d_ + ln.eps);
    rows_.yhat.row(i) = c / rows_.sigma(i);
  }
  return rows_;
}

// Row i: J_LN w = gamma o (w~ - yhat <yhat, w>/D) / sigma, w~ = w - mean(w).
MatrixXd Oracle::LnJv(const PostLnRows& r, const MatrixXd& w) const {
  const Eigen::RowVectorXd gamma = layer_.post_layer_norm->gamma.transpose();
  MatrixXd out(n_, d_);
  for (int i = 0; i < n_; ++i) {
    const double m = r.yhat.row(i).dot(w.row(i)) / d_;
    const Eigen::RowVectorXd wc = w.row(i).array() - w.row(i).mean();
    out.row(i) = gamma.cwiseProduct(wc - m * r.yhat.row(i)) / r.sigma(i);
  }
  return out;
}

// Row i: J_LN^T u = (u~ - mean(u~) - yhat <yhat, u~>/D) / sigma, u~ = gamma o u (the
// projection I - 11^T/D - yhat yhat^T/D is symmetric).
MatrixXd Oracle::LnJTu(const PostLnRows& r, const MatrixXd& u) const {
  const Eigen::RowVectorXd gamma = layer_.post_layer_norm->gamma.transpose();
  MatrixXd out(n_, d_);
  for (int i = 0; i < n_; ++i) {
    const Eigen::RowVectorXd ug = gamma.cwiseProduct(u.row(i));
    const double m = r.yhat.row(i).dot(ug) / d_;
    out.row(i) = ((ug.array() - ug.mean()).matrix() - m * r.yhat.row(i)) / r.sigma(i);
  }
  return out;
}

// Row i, with u~ = gamma o u, B = <u~, yhat>, m = <yhat, w>/D and
// phi = <u, J_LN w> = (<u~, w~> - m B) / sigma: the derivative of phi along delta, from
// d sigma = <yhat, delta>/D, d yhat = (delta~ - yhat <yhat, delta>/D) / sigma, is <grad, delta>
// with grad = yhat (2 m B / (D sigma^2) - phi / (D sigma)) - B w~ / (D sigma^2) - m (u~ - mean u~) / sigma^2.
MatrixXd Oracle::LnPairGradient(const PostLnRows& r, const MatrixXd& u, const MatrixXd& w) const {
  const Eigen::RowVectorXd gamma = layer_.post_layer_norm->gamma.transpose();
  MatrixXd out(n_, d_);
  for (int i = 0; i < n_; ++i) {
    const double s = r.sigma(i), dd = d_;
    const Eigen::RowVectorXd ug = gamma.cwiseProduct(u.row(i));
    const Eigen::RowVectorXd uc = ug.array() - ug.mean();
    const Eigen::RowVectorXd wc = w.row(i).array() - w.row(i).mean();
    const Eigen::RowVectorXd& yh = r.yhat.row(i);
    const double b = ug.dot(yh), m = yh.dot(w.row(i)) / dd;
    const double phi = (ug.dot(wc) - m * b) / s;
    out.row(i) = yh * (2 * m * b / (dd * s * s) - phi / (dd * s)) - wc * (b / (dd * s * s)) - uc * (m / (s * s));
  }
  return out;
}

MatrixXd Oracle::Jv(const MatrixXd& x, const MatrixXd& v) const {
  if (!post_ln_) return MhaJv(x, v);
  const MatrixXd w = v + MhaJv(x, v);
  return LnJv(RowsAt(x), w);
}

MatrixXd Oracle::JTu(const MatrixXd& x, const MatrixXd& u) const {
  if (!post_ln_) return MhaJTu(x, u);
  const MatrixXd w = LnJTu(RowsAt(x), u);
  return w + MhaJTu(x, w);
}

MatrixXd Oracle::PairGradient(const MatrixXd& x, const MatrixXd& u, const MatrixXd& v) const {
  RowMajorXd out(n_, d_);
  if (!post_ln_) {
    engine_->PairGradient(RowMajorXd(x).data(), RowMajorXd(u).data(), RowMajorXd(v).data(), 1, out.data());
    return out;
  }
  const PostLnRows& r = RowsAt(x);
  const MatrixXd w = LnJTu(r, u);  // <u, J_LN (v + J_MHA v)> = <w, v> + <w, J_MHA v>
  engine_->PairGradient(RowMajorXd(x).data(), RowMajorXd(w).data(), RowMajorXd(v).data(), 1, out.data());
  const MatrixXd g = LnPairGradient(r, u, v + MhaJv(x, v));  // through Y = X + MHA(X)
  return MatrixXd(out) + g + MhaJTu(x, g);
}

namespace {

// The shared top-singular driver (kernels/lanczos.h) on J_f^T J_f for one point, its
// slots Eigen matrices, J_f applied through a function.
struct NormalOps {
  std::vector<MatrixXd> slots;
  std::function<MatrixXd(const MatrixXd&)> normal;  // v -> J^T J v
  int batch() const { return 1; }
  void ApplyNormal(int src, int dst, const unsigned char* active) {
    if (active[0]) slots[dst] = normal(slots[src]);
  }
  void Dots(int w, int m, double* c) {
    for (int i = 0; i < m; ++i) c[i] = slots[i].cwiseProduct(slots[w]).sum();
  }
  void SubtractCombination(int w, int m, const double* c) {
    for (int i = 0; i < m; ++i) slots[w] -= c[i] * slots[i];
  }
  void Norms(int s, double* out) { out[0] = slots[s].norm(); }
  void Scale(int src, int dst, const double* f) { slots[dst] = f[0] * slots[src]; }
  void Combine(int m, const double* c, int dst, const unsigned char* mask) {
    if (!mask[0]) return;
    MatrixXd acc = c[0] * slots[0];
    for (int i = 1; i < m; ++i) acc += c[i] * slots[i];
    slots[dst] = acc;
  }
};

}  // namespace

void Oracle::TopSingular(const MatrixXd& x, const MatrixXd* v0, double* sigma, MatrixXd* u, MatrixXd* v) const {
  if (!post_ln_) {
    const RowMajorXd xr(x);
    RowMajorXd v0r;
    if (v0) v0r = *v0;
    const lipcert::TopSingular t = engine_->TopSingularValues(xr.data(), 1, false, v0 ? v0r.data() : nullptr);
    *sigma = t.sigma[0];
    *u = Eigen::Map<const RowMajorXd>(t.u.data(), n_, d_);
    *v = Eigen::Map<const RowMajorXd>(t.v.data(), n_, d_);
    return;
  }
  LanczosTop(x, {}, v0, sigma, u, v);
}

void Oracle::NextSingular(const MatrixXd& x, const std::vector<MatrixXd>& found, double* sigma, MatrixXd* u,
                          MatrixXd* v) const {
  if (found.empty()) return TopSingular(x, nullptr, sigma, u, v);
  LanczosTop(x, found, nullptr, sigma, u, v);
}

void Oracle::LanczosTop(const MatrixXd& x, const std::vector<MatrixXd>& found, const MatrixXd* v0, double* sigma,
                        MatrixXd* u, MatrixXd* v) const {
  const PostLnRows* r = post_ln_ ? &RowsAt(x) : nullptr;
  const std::unique_ptr<PointProducts> mha = engine_->ProductsAt(RowMajorXd(x).data());
  RowMajorXd buf(n_, d_), res(n_, d_);
  const auto mha_jv = [&](const MatrixXd& t) {
    buf = t;
    mha->Jvp(buf.data(), res.data());
    return MatrixXd(res);
  };
  const auto mha_jtu = [&](const MatrixXd& t) {
    buf = t;
    mha->Vjp(buf.data(), res.data());
    return MatrixXd(res);
  };
  const auto jv = [&](const MatrixXd& t) { return r ? LnJv(*r, t + mha_jv(t)) : mha_jv(t); };
  const auto jtu = [&](const MatrixXd& t) {
    if (!r) return mha_jtu(t);
    const MatrixXd w = LnJTu(*r, t);
    return MatrixXd(w + mha_jtu(w));
  };
  // P t = t - sum_k <f_k, t> f_k, twice (the f_k orthonormal up to the Lanczos tolerance).
  const auto project = [&](MatrixXd t) {
    for (int pass = 0; pass < 2; ++pass)
      for (const MatrixXd& f : found) t -= f.cwiseProduct(t).sum() * f;
    return t;
  };
  kernels_internal::DriverOptions dopts;
  dopts.rel_tol = rel_tol_;
  dopts.max_iters = max_iters_;
  NormalOps ops;
  ops.slots.assign(dopts.slots(), MatrixXd::Zero(n_, d_));
  ops.normal = [&](const MatrixXd& t) { return found.empty() ? jtu(jv(t)) : project(jtu(jv(project(t)))); };
  if (v0 && v0->rows() == n_ && v0->cols() == d_ && v0->allFinite() && v0->norm() > 0) {
    ops.slots[0] = *v0;
  } else {
    RowMajorXd start(n_, d_);
    DefaultStartVector(int(found.size()), n_ * d_, start.data());
    ops.slots[0] = start;
  }
  if (!found.empty()) ops.slots[0] = project(ops.slots[0]);
  kernels_internal::RunTopSingular(ops, dopts);
  *v = found.empty() ? ops.slots[dopts.result_slot()] : project(ops.slots[dopts.result_slot()]);
  const double vn = v->norm();
  if (vn > 0) *v /= vn;
  const MatrixXd jvv = jv(*v);
  *sigma = jvv.norm();
  *u = *sigma > 0 ? MatrixXd(jvv / *sigma) : MatrixXd(MatrixXd::Zero(n_, d_));
}

void Oracle::RowAbsSums(const MatrixXd& x, const int* rows, int count, double* out) const {
  const int nd = n_ * d_;
  const RowMajorXd xr(x);
  std::vector<double> xs(size_t(count) * nd), us(size_t(count) * nd, 0.0), res(size_t(count) * nd);
  const PostLnRows* ln = post_ln_ ? &RowsAt(x) : nullptr;
  for (int k = 0; k < count; ++k) {
    std::copy(xr.data(), xr.data() + nd, xs.begin() + size_t(k) * nd);
    const int r = rows[k];  // e_r in the row-major flattening i*D + a
    if (!ln) {
      us[size_t(k) * nd + r] = 1;
      continue;
    }
    // Post-LN: row r of J_f is w + J_MHA^T w with w = J_LN^T e_r (token r / D's row only).
    MatrixXd e = MatrixXd::Zero(n_, d_);
    e(r / d_, r % d_) = 1;
    const RowMajorXd w = LnJTu(*ln, e);
    std::copy(w.data(), w.data() + nd, us.begin() + size_t(k) * nd);
  }
  engine_->Vjp(xs.data(), us.data(), count, res.data());
  for (int k = 0; k < count; ++k) {
    double s = 0;
    for (int c = 0; c < nd; ++c) s += std::abs(res[size_t(k) * nd + c] + (ln ? us[size_t(k) * nd + c] : 0.0));
    out[k] = s;
  }
}

std::vector<int> Oracle::RowOrder(const MatrixXd& x) const {
  if (!post_ln_) return {};
  const PostLnRows& r = RowsAt(x);
  const Eigen::VectorXd& gamma = layer_.post_layer_norm->gamma;
  std::vector<int> order(size_t(n_) * d_);
  std::iota(order.begin(), order.end(), 0);
  const auto weight = [&](int row) { return std::abs(gamma(row % d_)) / r.sigma(row / d_); };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weight(a) > weight(b); });
  return order;
}

MatrixXd Oracle::Dense(const MatrixXd& x) const { return DenseJacobian<double>(layer_, x); }

MatrixXd Oracle::ReferenceJv(const MatrixXd& x, const MatrixXd& v) const {
  return lipcert::Jvp<double>(layer_, Evaluate<double>(layer_, x), v);
}

MatrixXd SignOf(const MatrixXd& m) {
  return m.unaryExpr([](double t) { return t < 0 ? -1.0 : 1.0; });
}

Pair ComputeTop(const Oracle& o, const MatrixXd& x, NormKind norm, const Pair* warm, const TopParams& tp) {
  const int n = int(x.rows()), d = int(x.cols()), nd = n * d;
  Pair p;
  if (nd <= tp.exact_up_to) {
    const MatrixXd jac = o.Dense(x);
    auto unflat = [&](const Eigen::VectorXd& f) {
      MatrixXd m(n, d);
      for (int k = 0; k < nd; ++k) m(k / d, k % d) = f(k);
      return m;
    };
    if (norm == NormKind::kL2) {
      Eigen::BDCSVD<MatrixXd> svd(jac, Eigen::ComputeThinU | Eigen::ComputeThinV);
      p.v = unflat(svd.matrixV().col(0));
      p.v /= p.v.norm();
      const MatrixXd w = o.ReferenceJv(x, p.v);
      p.value = w.norm();
      p.u = p.value > 0 ? MatrixXd(w / p.value) : unflat(svd.matrixU().col(0));
    } else {
      Eigen::Index r;
      jac.cwiseAbs().rowwise().sum().maxCoeff(&r);
      p.row = int(r);
      p.u = MatrixXd::Zero(n, d);
      p.u(r / d, r % d) = 1;
      p.v = SignOf(unflat(jac.row(r).transpose()));
      p.value = jac.row(r).cwiseAbs().sum();
    }
    return p;
  }
  if (norm == NormKind::kL2) {
    const bool use_warm = warm && warm->v.rows() == n && warm->v.norm() > 0;
    o.TopSingular(x, use_warm ? &warm->v : nullptr, &p.value, &p.u, &p.v);
    return p;
  }
  // kLinf: Hager's estimator of ||B||_1 with B = J^T (= ||J||_inf), rows of J through VJPs.
  int r = (warm && warm->row >= 0 && warm->row < nd) ? warm->row : -1;
  MatrixXd e = r >= 0 ? MatrixXd(MatrixXd::Zero(n, d)) : MatrixXd(MatrixXd::Constant(n, d, 1.0 / nd));
  if (r >= 0) e(r / d, r % d) = 1;
  double best = -1;
  int best_row = -1;
  MatrixXd best_sign;
  for (int it = 0; it < std::max(2, tp.iters / 3); ++it) {
    const MatrixXd y = o.JTu(x, e);  // J^T e; for e = e_r, row r of J
    const MatrixXd xi = SignOf(y);
    if (r >= 0) {
      const double val = y.cwiseAbs().sum();
      if (val > best) best = val, best_row = r, best_sign = xi;
    }
    const MatrixXd z = o.Jv(x, xi);
    Eigen::Index i, j;
    const double zmax = z.cwiseAbs().maxCoeff(&i, &j);
    const int next = int(i) * d + int(j);
    if (r >= 0 && (next == r || zmax <= (z.array() * e.array()).sum())) break;
    r = next;
    e.setZero();
    e(r / d, r % d) = 1;
    if (it + 1 == std::max(2, tp.iters / 3)) {  // evaluate the last proposed row too
      const MatrixXd y2 = o.JTu(x, e);
      const double val = y2.cwiseAbs().sum();
      if (val > best) best = val, best_row = r, best_sign = SignOf(y2);
    }
  }
  p.row = best_row;
  p.value = best;
  p.v = best_sign;
  p.u = MatrixXd::Zero(n, d);
  p.u(best_row / d, best_row % d) = 1;
  return p;
}

Pair ExactInfTop(const std::vector<std::unique_ptr<Oracle>>& oracles, const MatrixXd& x,
                 std::chrono::steady_clock::time_point deadline, bool* complete, const std::atomic<bool>* stop) {
  const int n = int(x.rows()), d = int(x.cols()), nd = n * d;
  constexpr int kBlock = 32;  // rows per engine call
  const int blocks = (nd + kBlock - 1) / kBlock;
  // Visit the blocks with a stride coprime to their count, so that a run cut short by the
  // deadline has seen rows of every part of the sequence.
  int stride = std::max(1, int(std::sqrt(double(blocks))));
  while (std::gcd(stride, blocks) != 1) ++stride;
  // The post-LN sublayer's rows in their oracle's order (likely largest first) instead.
  std::vector<int> order = oracles.front()->RowOrder(x);
  const bool ordered = !order.empty();
  if (!ordered) {
    order.resize(nd);
    std::iota(order.begin(), order.end(), 0);
  }
  std::vector<double> sums(nd, -1.0);  // -1: not computed
  std::atomic<bool> cut{false};
  ParallelFor(blocks, int(oracles.size()), [&](int k, int worker) {
    if (k > 0 && (StopRequested(stop) || std::chrono::steady_clock::now() >= deadline)) {
      cut = true;
      return;
    }
    const int first = ordered ? k * kBlock : int((long(k) * stride) % blocks) * kBlock;
    const int count = std::min(kBlock, nd - first);
    std::vector<double> block(count);
    oracles[worker]->RowAbsSums(x, order.data() + first, count, block.data());
    for (int j = 0; j < count; ++j) sums[order[first + j]] = block[j];
  });
  if (complete) *complete = !cut;
  const int r = int(std::max_element(sums.begin(), sums.end()) - sums.begin());
  return InfRowPair(*oracles.front(), x, r);
}

Pair InfRowPair(const Oracle& o, const MatrixXd& x, int r) {
  const int n = int(x.rows()), d = int(x.cols());
  Pair p;
  p.row = r;
  p.u = MatrixXd::Zero(n, d);
  p.u(r / d, r % d) = 1;
  const MatrixXd row = o.JTu(x, p.u);  // row r of J
  p.v = SignOf(row);
  p.value = row.cwiseAbs().sum();
  return p;
}

MatrixXd PairGradient(const Oracle& o, const MatrixXd& x, const Pair& p) {
  if (!(p.v.cwiseAbs().maxCoeff() > 0)) return MatrixXd::Zero(x.rows(), x.cols());
  return o.PairGradient(x, p.u, p.v);
}

}  // namespace lipcert::search_parts
