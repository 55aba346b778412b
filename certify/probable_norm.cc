#include "certify/probable_norm.h"

#include <algorithm>
#include <chrono>

#include "certify/run_control.h"
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "interval/fp_environment.h"
#include "kernels/evaluator.h"
#include "models/forward.h"

namespace lipcert {

namespace {

using RowMajorXd = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The relative enlargement of every Ritz value for the floating-point Lanczos run (see the
// header): far above the k u ||A|| that full reorthogonalisation leaves.
constexpr double kRitzMargin = 1e-8;

// The theorem's constant.
constexpr double kKwConstant = 1.648;

// Largest eigenvalue of the symmetric tridiagonal matrix diag(a), offdiag(b).
double TopRitzValue(const std::vector<double>& a, const std::vector<double>& b, int m) {
  if (m == 1) return a[0];
  Eigen::VectorXd diag = Eigen::Map<const Eigen::VectorXd>(a.data(), m);
  Eigen::VectorXd sub = Eigen::Map<const Eigen::VectorXd>(b.data(), m - 1);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es;
  es.computeFromTridiagonal(diag, sub, Eigen::EigenvaluesOnly);
  return es.eigenvalues()(m - 1);
}

uint64_t DrawSeed(uint64_t seed) {
  if (seed != 0) return seed;
  std::random_device rd;
  uint64_t s = (uint64_t(rd()) << 32) ^ uint64_t(rd());
  return s == 0 ? 1 : s;
}

}  // namespace

std::string ProbableNormOptions::IsValid() const {
  if (!(failure_probability > 0 && failure_probability < 1))
    return "probabilistic.failure_probability: must be in (0, 1)";
  if (max_krylov < 2) return "probabilistic.max_krylov: must be >= 2";
  if (!(target_ratio >= 1)) return "probabilistic.target_ratio: must be >= 1";
  if (!(time_limit_s > 0)) return "probabilistic.time_limit: must be positive";
  return "";
}

double KuczynskiWozniakowskiEpsilon(double n, int k, double delta) {
  if (k < 1 || !(delta > 0) || !(n >= 1)) return 1.0;
  // ln(1.648 sqrt(n) / delta), enlarged by a few ulps for the rounding of log.
  const double arg = DivUp(MulUp(kKwConstant, SqrtUp(n)), delta);
  const double l = std::log(arg);
  const double l_up = l > 0 ? l * (1 + 8 * kUnitRoundoff) + 1e-300 : l;
  const double root = DivUp(l_up, double(2 * k - 1));
  if (!(root < 1)) return 1.0;
  return std::max(0.0, MulUp(root, root));
}

JacobianProducts JacobianProductsOf(const AttentionLayer& layer, const Eigen::MatrixXd& x0, int threads) {
  const int tokens = int(x0.rows()), d = layer.d_model;
  JacobianProducts p;
  if (layer.post_ln()) {
    auto state = std::make_shared<const LayerState<double>>(Evaluate<double>(layer, x0));
    p.jvp = [layer, state, tokens, d](const double* v, double* out) {
      Eigen::Map<RowMajorXd>(out, tokens, d) = Jvp<double>(layer, *state, Eigen::MatrixXd(Eigen::Map<const RowMajorXd>(v, tokens, d)));
    };
    p.vjp = [layer, state, tokens, d](const double* u, double* out) {
      Eigen::Map<RowMajorXd>(out, tokens, d) = Vjp<double>(layer, *state, Eigen::MatrixXd(Eigen::Map<const RowMajorXd>(u, tokens, d)));
    };
    return p;
  }
  EvaluatorOptions eo;
  eo.device = Device::kCpu;
  eo.dtype = DType::kF64;
  eo.threads = std::max(1, threads);
  // The evaluator and its products at x0, owned together (the products must not outlive it).
  struct Owned {
    std::unique_ptr<JacobianEvaluator> eval;
    std::unique_ptr<PointProducts> at_x0;
  };
  auto owned = std::make_shared<Owned>();
  owned->eval = MakeJacobianEvaluator(layer, tokens, eo);
  const RowMajorXd x(x0);
  owned->at_x0 = owned->eval->ProductsAt(x.data());
  p.jvp = [owned](const double* v, double* out) { owned->at_x0->Jvp(v, out); };
  p.vjp = [owned](const double* u, double* out) { owned->at_x0->Vjp(u, out); };
  return p;
}

std::function<void(const double*, double*)> NormalProduct(const AttentionLayer& layer, const Eigen::MatrixXd& x0,
                                                          int threads) {
  const JacobianProducts p = JacobianProductsOf(layer, x0, threads);
  const long n = long(x0.rows()) * layer.d_model;
  return [p, n](const double* v, double* out) {
    std::vector<double> jv(static_cast<size_t>(n));
    p.jvp(v, jv.data());
    p.vjp(jv.data(), out);
  };
}

ProbableUpperBound ProbableJacobianNormUpper(const AttentionLayer& layer, const Eigen::MatrixXd& x0,
                                             const ProbableNormOptions& o) {
  if (const std::string e = o.IsValid(); !e.empty()) throw std::invalid_argument(e);
  if (x0.cols() != layer.d_model) throw std::invalid_argument("centre: width does not match the layer's d_model");
  const ScopedSoundFpEnvironment fp_guard;  // round to nearest, FTZ/DAZ off
  const auto start = std::chrono::steady_clock::now();
  const int tokens = int(x0.rows());
  const long n = long(tokens) * layer.d_model;
  const int kmax = int(std::min<long>(o.max_krylov, n));
  // Every step the run could stop at gets delta / max_krylov (union bound).
  const double delta_step = o.failure_probability / double(o.max_krylov);

  const auto apply_normal = NormalProduct(layer, x0, 1);

  ProbableUpperBound r;
  r.failure_probability = o.failure_probability;
  r.seed = DrawSeed(o.seed);
  std::mt19937_64 rng(r.seed);
  std::normal_distribution<double> gauss(0.0, 1.0);
  Eigen::MatrixXd basis(n, kmax);
  for (long i = 0; i < n; ++i) basis(i, 0) = gauss(rng);  // uniform direction on the sphere
  basis.col(0).normalize();

  std::vector<double> alpha, beta;
  Eigen::VectorXd w(n);
  // The Krylov space K_m(A, b) while it grows; once it is (numerically) invariant the run
  // goes on from a random vector orthogonal to it, which only enlarges the space: the
  // theorem is then applied to the Krylov part alone, and at m = n the space is all of
  // R^n, where theta is lambda_1 itself (eps = 0).
  int krylov_part = kmax;
  auto orthogonalise = [&](int m, Eigen::VectorXd* v) {  // against columns 0..m-1, twice
    for (int pass = 0; pass < 2; ++pass) {
      const Eigen::VectorXd c = basis.leftCols(m).transpose() * *v;
      v->noalias() -= basis.leftCols(m) * c;
    }
  };
  for (int j = 0; j < kmax; ++j) {
    apply_normal(basis.col(j).data(), w.data());
    alpha.push_back(basis.col(j).dot(w));
    orthogonalise(j + 1, &w);  // full reorthogonalisation: w keeps only what is new
    const double b = w.norm();
    const int m = j + 1;
    r.steps = m;
    const double theta = std::max(0.0, TopRitzValue(alpha, beta, m));
    r.ritz_sigma = std::max(r.ritz_sigma, std::sqrt(theta));
    const double eps = m == n ? 0.0 : KuczynskiWozniakowskiEpsilon(double(n), std::min(m, krylov_part) - 1, delta_step);
    if (eps < 1) {
      const double bound = SqrtUp(DivUp(MulUp(theta, 1 + kRitzMargin), SubDown(1.0, eps)));
      if (bound < r.value) {
        r.value = bound;
        r.epsilon = eps;
        r.krylov_dim = m;
      }
    }
    if (r.value <= o.target_ratio * r.ritz_sigma || m == kmax) break;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds >= o.time_limit_s || StopRequested(o.stop)) {
      r.stopped_by_time = true;
      break;
    }
    if (b > 1e-13 * std::max(theta, 1e-300)) {
      beta.push_back(b);
      basis.col(j + 1) = w / b;
      continue;
    }
    // Invariant: restart from a fresh random direction (beta = 0 splits T into blocks).
    krylov_part = std::min(krylov_part, m);
    Eigen::VectorXd v(n);
    for (long i = 0; i < n; ++i) v(i) = gauss(rng);
    orthogonalise(m, &v);
    if (!(v.norm() > 0)) break;
    beta.push_back(0.0);
    basis.col(j + 1) = v / v.norm();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace lipcert
