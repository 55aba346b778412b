// The deflation's basis (Lanczos vectors of J^T J) and its time model: how many vectors fit
// before a deadline, and the basis's own deadline.
#include "certify/centre/internal.h"

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>
#include <stdexcept>
#include <vector>

#include "certify/probable_norm.h"
#include "interval/parallel.h"

namespace lipcert {
namespace centre_internal {

namespace {

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
// The basis's products keep the centre's state (PointProducts) and its Lanczos steps
// reorthogonalise once, which the per-vector term counts. The constants are scaled by the
// running machine's calibration (certify/time_model.h).

// The constants (kPlainShare, kSecondsPerVector, kSecondsPerVector2, kSecondsPerProduct)
// are in certify/time_model.h, scaled here by the calibrated GEMM slowdown (the basis and
// the blocks' products are GEMMs and evaluator products).
using time_model::kPlainShare;
using time_model::kSecondsPerVector;
using time_model::kSecondsPerVector2;
using time_model::kSecondsPerProduct;

// The Lanczos basis of k vectors on an idle machine: its reorthogonalisation and its k

// The plain super-blocks' share of the time (kPlainShare times their model).
double PlainSuperBlockSeconds(const AttentionLayer& L, int n, const CentreNormOptions& o) {
  CentreNormOptions plain = o;
  plain.deflation_vectors = 0;
  return kPlainShare * CentreNormSecondsEstimate(L, n, plain);
}

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

// J^T J products through the evaluator.
double IdleBasisSeconds(double nd, int k) {
  return (kSecondsPerVector2 * nd * double(k) * k + kSecondsPerProduct * nd * nd * k) * GemmSlowdown();
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
  const double load = ratio <= time_model::kModelScatter ? 1.0 : ratio;
  const double budget = SecondsLeft(o.deadline) / (time_model::kDeflationMargin * load) - PlainSuperBlockSeconds(L, n, o);
  if (!(budget > 0)) return 0;
  const int kept = int(std::min<double>(k, std::floor(budget / (kSecondsPerVector * nd * nd * GemmSlowdown()))));
  // Under 3x load (three runs on 2 cores) MiniLM N = 32 kept 56 and 131 of about 600
  // vectors, and the blocks' certificates then ran out of time: 14.8 and 15.1 against the
  // plain super-blocks' 6.353. Fewer than half of k then meant the plain super-blocks; now
  // the deflated pass's second block measures the pace (and retries with fewer columns or
  // gives up), so any kMinDeflationVectors are tried: a slower machine reads as load too
  // (an EPYC's basis ran 1.5x its idle model), and the model's k left it none.
  return kept >= std::min(kMinDeflationVectors, k) ? kept : 0;
}

}  // namespace centre_internal

using namespace centre_internal;

int DeflationVectorsThatFit(const AttentionLayer& L, int n, const CentreNormOptions& o, double extra_seconds,
                            double slowdown) {
  const double nd = double(n) * L.d_model;
  const int asked = int(std::min<double>(o.deflation_vectors, nd));
  if (asked <= 0 || o.deadline == std::chrono::steady_clock::time_point::max()) return std::max(asked, 0);
  // The largest k with kSecondsPerVector (N D)^2 k + kSecondsPerVector2 N D k^2 <= budget.
  const double budget = SecondsLeft(o.deadline) / (time_model::kDeflationMargin * std::max(1.0, slowdown)) -
                        PlainSuperBlockSeconds(L, n, o) - extra_seconds;
  if (!(budget > 0)) return 0;
  const double a = kSecondsPerVector * nd * nd * GemmSlowdown(), b = kSecondsPerVector2 * nd * GemmSlowdown();
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

DeflationBasis DeflationBasisOf(const AttentionLayer& layer, const Eigen::MatrixXd& x0, int k, int threads,
                                std::chrono::steady_clock::time_point deadline_at,
                                const std::function<int(int steps, double seconds)>& resize,
                                const std::atomic<bool>* stop) {
  const Deadline deadline{deadline_at, stop};
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

}  // namespace lipcert
