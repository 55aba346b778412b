#include "certify/search_oracle.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <vector>

#include "certify/run_control.h"
#include "interval/parallel.h"
#include "models/forward.h"

namespace lipcert::search_parts {

using Eigen::MatrixXd;
using RowMajorXd = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

Oracle::Oracle(const AttentionLayer& layer, int tokens, double rel_tol, int max_iters)
    : layer_(layer), n_(tokens), d_(layer.d_model) {
  EvaluatorOptions eo;
  eo.device = Device::kCpu;
  eo.dtype = DType::kF64;
  eo.threads = 1;
  eo.rel_tol = rel_tol;
  eo.max_iters = max_iters;
  engine_ = MakeJacobianEvaluator(layer, tokens, eo);
}

MatrixXd Oracle::Jv(const MatrixXd& x, const MatrixXd& v) const {
  RowMajorXd out(n_, d_);
  engine_->Jvp(RowMajorXd(x).data(), RowMajorXd(v).data(), 1, out.data());
  return out;
}

MatrixXd Oracle::JTu(const MatrixXd& x, const MatrixXd& u) const {
  RowMajorXd out(n_, d_);
  engine_->Vjp(RowMajorXd(x).data(), RowMajorXd(u).data(), 1, out.data());
  return out;
}

MatrixXd Oracle::PairGradient(const MatrixXd& x, const MatrixXd& u, const MatrixXd& v) const {
  RowMajorXd out(n_, d_);
  engine_->PairGradient(RowMajorXd(x).data(), RowMajorXd(u).data(), RowMajorXd(v).data(), 1, out.data());
  return out;
}

void Oracle::TopSingular(const MatrixXd& x, const MatrixXd* v0, double* sigma, MatrixXd* u, MatrixXd* v) const {
  const RowMajorXd xr(x);
  RowMajorXd v0r;
  if (v0) v0r = *v0;
  const lipcert::TopSingular t = engine_->TopSingularValues(xr.data(), 1, false, v0 ? v0r.data() : nullptr);
  *sigma = t.sigma[0];
  *u = Eigen::Map<const RowMajorXd>(t.u.data(), n_, d_);
  *v = Eigen::Map<const RowMajorXd>(t.v.data(), n_, d_);
}

void Oracle::RowAbsSums(const MatrixXd& x, int first, int count, double* out) const {
  const int nd = n_ * d_;
  const RowMajorXd xr(x);
  std::vector<double> xs(size_t(count) * nd), us(size_t(count) * nd, 0.0), rows(size_t(count) * nd);
  for (int k = 0; k < count; ++k) {
    std::copy(xr.data(), xr.data() + nd, xs.begin() + size_t(k) * nd);
    us[size_t(k) * nd + first + k] = 1;  // e_r, r = first + k, in the row-major flattening
  }
  engine_->Vjp(xs.data(), us.data(), count, rows.data());
  for (int k = 0; k < count; ++k) {
    double s = 0;
    for (int c = 0; c < nd; ++c) s += std::abs(rows[size_t(k) * nd + c]);
    out[k] = s;
  }
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
  std::vector<double> sums(nd, -1.0);  // -1: not computed
  std::atomic<bool> cut{false};
  ParallelFor(blocks, int(oracles.size()), [&](int k, int worker) {
    if (k > 0 && (StopRequested(stop) || std::chrono::steady_clock::now() >= deadline)) {
      cut = true;
      return;
    }
    const int first = int((long(k) * stride) % blocks) * kBlock;
    oracles[worker]->RowAbsSums(x, first, std::min(kBlock, nd - first), sums.data() + first);
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
