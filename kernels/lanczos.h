// The top-singular-pair driver shared by every back end: restarted Lanczos on J^T J with
// full reorthogonalisation (or plain power iteration), written against a small batched
// "vector slots" interface so that the CPU (one point at a time) and CUDA (all points in
// lock step) run exactly the same algorithm. Scalars (Ritz values, coefficients) live on
// the host in double; vectors live in the back end's slots, in its compute type.
//
// Ops concept (b runs over the ops' batch, slot s is a vector of N*D per point):
//   int batch() const;
//   void ApplyNormal(int src, int dst, const unsigned char* active);  // dst = J^T J src
//   void Dots(int w, int m, double* c);          // c[b*m + i] = <slot_i[b], slot_w[b]>, i < m
//   void SubtractCombination(int w, int m, const double* c);  // slot_w[b] -= sum_i c[b*m+i] slot_i[b]
//   void Norms(int s, double* out);              // out[b] = ||slot_s[b]||
//   void Scale(int src, int dst, const double* f);  // slot_dst[b] = f[b] * slot_src[b] (src may = dst)
//   void Combine(int m, const double* c, int dst, const unsigned char* mask);
//                                                // slot_dst[b] = sum_i c[b*m+i] slot_i[b] where mask[b]
// Slots used: 0 .. k-1 the Krylov basis (k = krylov_dim, or 1 for power iteration),
// k the work vector, k+1 the result. The caller puts the start vector in slot 0 and reads
// the unit result vector from slot k+1.
//
// Stopping rule (both methods): the residual of the Ritz pair (theta, y) of J^T J,
// ||J^T J y - theta y|| <= rel_tol * theta. For Lanczos the residual is the standard
// estimate beta_j |s_j| (exact in exact arithmetic). It implies that some eigenvalue
// lambda of J^T J has |lambda - theta| <= rel_tol * theta, i.e. some singular value lies
// within a relative rel_tol / 2 (to first order) of sqrt(theta); with a gap delta below
// lambda_1 the error is at most residual^2 / delta.
#pragma once

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/evaluator.h"

namespace lipcert::kernels_internal {

struct DriverOptions {
  double rel_tol = 1e-6;  // residual criterion, see above
  int max_iters = 500;    // J^T J products per point
  int krylov_dim = 24;    // Lanczos basis size
  SingularMethod method = SingularMethod::kLanczos;

  int basis() const { return method == SingularMethod::kPower ? 1 : krylov_dim; }
  int work_slot() const { return basis(); }
  int result_slot() const { return basis() + 1; }
  int slots() const { return basis() + 2; }
};

inline DriverOptions DriverOptionsOf(const EvaluatorOptions& o) {
  DriverOptions d;
  d.rel_tol = o.rel_tol;
  d.max_iters = o.max_iters;
  d.krylov_dim = o.krylov_dim;
  d.method = o.method;
  return d;
}

struct DriverResult {
  std::vector<int> iterations;            // J^T J products per point
  std::vector<unsigned char> converged;   // stopping rule met
};

// Largest eigenpair of the symmetric tridiagonal matrix with diagonal a[0..m-1] and
// off-diagonal b[0..m-2]; returns theta and writes the unit eigenvector to s[0..m-1].
inline double TopRitzPair(const double* a, const double* b, int m, double* s) {
  if (m == 1) {
    s[0] = 1;
    return a[0];
  }
  Eigen::VectorXd diag = Eigen::Map<const Eigen::VectorXd>(a, m);
  Eigen::VectorXd sub = Eigen::Map<const Eigen::VectorXd>(b, m - 1);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es;
  es.computeFromTridiagonal(diag, sub, Eigen::ComputeEigenvectors);
  const Eigen::VectorXd y = es.eigenvectors().col(m - 1);
  for (int i = 0; i < m; ++i) s[i] = y(i);
  return es.eigenvalues()(m - 1);
}

template <class Ops>
DriverResult RunPower(Ops& ops, const DriverOptions& o) {
  const int nb = ops.batch(), W = o.work_slot(), R = o.result_slot();
  DriverResult r;
  r.iterations.assign(nb, 0);
  r.converged.assign(nb, 0);
  std::vector<unsigned char> active(nb, 1), finish(nb, 0), zero(nb, 0);
  std::vector<double> nrm(nb), theta(nb), neg_theta(nb), res(nb), f(nb), one(nb, 1.0);
  ops.Norms(0, nrm.data());
  for (int b = 0; b < nb; ++b) f[b] = nrm[b] > 0 ? 1 / nrm[b] : 0;
  ops.Scale(0, 0, f.data());
  int n_active = nb;
  while (n_active > 0) {
    ops.ApplyNormal(0, W, active.data());
    ops.Dots(W, 1, theta.data());  // Rayleigh quotient theta = <v, J^T J v>
    ops.SubtractCombination(W, 1, theta.data());
    ops.Norms(W, res.data());      // residual ||J^T J v - theta v||
    for (int b = 0; b < nb; ++b) neg_theta[b] = -theta[b];
    ops.SubtractCombination(W, 1, neg_theta.data());  // back to J^T J v
    bool any = false;
    for (int b = 0; b < nb; ++b) {
      finish[b] = 0;
      f[b] = 0;
      if (!active[b]) continue;
      ++r.iterations[b];
      const double nw = std::sqrt(res[b] * res[b] + theta[b] * theta[b]);  // ||J^T J v||
      const bool conv = res[b] <= o.rel_tol * theta[b];
      if (conv) r.converged[b] = 1;
      // A zero J^T J v means v lies in the null space: nothing more to find.
      if (conv || nw == 0 || r.iterations[b] >= o.max_iters) finish[b] = 1, any = true;
      f[b] = nw > 0 ? 1 / nw : 0;
    }
    // A point whose J^T J v vanished keeps v itself as its answer (saved before the
    // scaling below zeroes slot 0); the others take the new iterate.
    for (int b = 0; b < nb; ++b) zero[b] = finish[b] && f[b] == 0;
    if (any) ops.Combine(1, one.data(), R, zero.data());
    ops.Scale(W, 0, f.data());
    if (any) {
      for (int b = 0; b < nb; ++b) zero[b] = finish[b] && f[b] != 0;
      ops.Combine(1, one.data(), R, zero.data());
      for (int b = 0; b < nb; ++b)
        if (finish[b]) active[b] = 0, --n_active;
    }
  }
  return r;
}

template <class Ops>
DriverResult RunLanczos(Ops& ops, const DriverOptions& o) {
  const int nb = ops.batch(), k = o.basis(), W = o.work_slot(), R = o.result_slot();
  DriverResult r;
  r.iterations.assign(nb, 0);
  r.converged.assign(nb, 0);
  std::vector<unsigned char> active(nb, 1), mask(nb, 0), finish(nb, 0);
  std::vector<double> nrm(nb), f(nb);
  std::vector<double> alpha(size_t(nb) * k), beta(size_t(nb) * k);
  std::vector<double> c(size_t(nb) * k), c2(size_t(nb) * k), coef(size_t(nb) * k), s(k);
  ops.Norms(0, nrm.data());
  for (int b = 0; b < nb; ++b) f[b] = nrm[b] > 0 ? 1 / nrm[b] : 0;
  ops.Scale(0, 0, f.data());
  int n_active = nb;
  while (n_active > 0) {
    for (int j = 0; j < k && n_active > 0; ++j) {
      const int m = j + 1;
      ops.ApplyNormal(j, W, active.data());
      // Classical Gram-Schmidt against the whole basis, twice ("twice is enough").
      ops.Dots(W, m, c.data());
      ops.SubtractCombination(W, m, c.data());
      ops.Dots(W, m, c2.data());
      ops.SubtractCombination(W, m, c2.data());
      ops.Norms(W, nrm.data());
      bool any_mask = false;
      for (int b = 0; b < nb; ++b) {
        mask[b] = finish[b] = 0;
        if (!active[b]) continue;
        alpha[size_t(b) * k + j] = c[size_t(b) * m + j] + c2[size_t(b) * m + j];
        beta[size_t(b) * k + j] = nrm[b];
        ++r.iterations[b];
        const double theta = TopRitzPair(&alpha[size_t(b) * k], &beta[size_t(b) * k], m, s.data());
        const double res = nrm[b] * std::abs(s[j]);
        const bool conv = res <= o.rel_tol * theta;
        if (conv) r.converged[b] = 1;
        if (conv || r.iterations[b] >= o.max_iters) finish[b] = 1;
        if (finish[b] || j == k - 1) {
          mask[b] = 1;
          any_mask = true;
          for (int i = 0; i < m; ++i) coef[size_t(b) * m + i] = s[i];
        }
      }
      if (any_mask) ops.Combine(m, coef.data(), R, mask.data());
      for (int b = 0; b < nb; ++b)
        if (finish[b]) active[b] = 0, --n_active;
      if (j == k - 1) {
        // Explicit restart from the current Ritz vector.
        ops.Norms(R, nrm.data());
        for (int b = 0; b < nb; ++b) f[b] = active[b] && nrm[b] > 0 ? 1 / nrm[b] : 0;
        ops.Scale(R, 0, f.data());
      } else {
        for (int b = 0; b < nb; ++b) f[b] = active[b] && nrm[b] > 0 ? 1 / nrm[b] : 0;
        ops.Scale(W, j + 1, f.data());
      }
    }
  }
  return r;
}

// Runs the chosen method, then normalises the result slot.
template <class Ops>
DriverResult RunTopSingular(Ops& ops, const DriverOptions& o) {
  DriverResult r = o.method == SingularMethod::kPower ? RunPower(ops, o) : RunLanczos(ops, o);
  const int nb = ops.batch(), R = o.result_slot();
  std::vector<double> nrm(nb), f(nb);
  ops.Norms(R, nrm.data());
  for (int b = 0; b < nb; ++b) f[b] = nrm[b] > 0 ? 1 / nrm[b] : 0;
  ops.Scale(R, R, f.data());
  return r;
}

}  // namespace lipcert::kernels_internal
