#include "kernels/bench.h"

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "models/random_layer.h"

namespace lipcert {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// GFLOP/s of a plain Eigen GEMM (256^3, the compute type) run on `threads` threads at
// once: an estimate of what the machine's GEMMs can reach without MKL-class kernels.
template <class T>
double EigenGemmPeak(int threads) {
  using M = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  const int n = 256, reps = 8;
  std::vector<double> rate(threads, 0);
  auto work = [&](int t) {
    M a = M::Random(n, n), b = M::Random(n, n), c(n, n);
    c.noalias() = a * b;  // warm-up
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) c.noalias() += a * b;
    rate[t] = 2.0 * n * n * n * reps / Seconds(t0, Clock::now()) + 0 * c(0, 0);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  double total = 0;
  for (double r : rate) total += r;
  return total / 1e9;
}

// The evaluator the options ask for, on the bench's layer.
std::unique_ptr<JacobianEvaluator> BenchEvaluator(const AttentionLayer& L, const BenchOptions& o) {
  EvaluatorOptions eo;
  eo.device = o.device;
  eo.dtype = o.dtype;
  eo.threads = o.threads;
  eo.rel_tol = o.rel_tol;
  eo.max_iters = o.max_iters;
  eo.method = o.method;
  return MakeJacobianEvaluator(L, o.n, eo);
}

// The last batch's result, and how many whole batches ran in how many seconds.
struct TimedBatches {
  TopSingular last;
  int reps = 0;
  double elapsed = 0;
};

// Warm-up on two points (as the baseline does), then whole batches until min_seconds.
TimedBatches TimeBatches(JacobianEvaluator& evaluator, const std::vector<double>& x, const BenchOptions& o) {
  evaluator.TopSingularValues(x.data(), std::min(2, o.batch), false);
  TimedBatches t;
  const auto t0 = Clock::now();
  do {
    t.last = evaluator.TopSingularValues(x.data(), o.batch, false);
    ++t.reps;
    t.elapsed = Seconds(t0, Clock::now());
  } while (t.elapsed < o.min_seconds);
  return t;
}

// One batch's totals: J^T J products, convergence, GEMM flops and singular values.
struct BatchTotals {
  double iters = 0, flops = 0, smax = 0, smean = 0;
  int imax = 0, conv = 0;
};

BatchTotals TotalsOf(const TopSingular& r, const GemmFlops& gf, const BenchOptions& o) {
  const double normal = o.device == Device::kCpu ? gf.normal_cpu : gf.jvp + gf.vjp;  // one J^T J v
  BatchTotals t;
  for (int b = 0; b < o.batch; ++b) {
    t.iters += r.iterations[b];
    t.imax = std::max(t.imax, r.iterations[b]);
    t.conv += r.converged[b];
    t.flops += gf.evaluate + r.iterations[b] * normal + gf.jvp;
    t.smax = std::max(t.smax, r.sigma[b]);
    t.smean += r.sigma[b] / o.batch;
  }
  return t;
}

// The printed report; its last line is "points_per_s=<number>".
std::string FormatBench(const BenchOptions& o, const char* evaluator_name, const TimedBatches& run,
                        const BatchTotals& t, int workers, double peak) {
  const double points_per_s = double(o.batch) * run.reps / run.elapsed;
  const double gflops = t.flops * run.reps / run.elapsed / 1e9;
  std::ostringstream os;
  char buf[512];
  os << "lipcert bench: top singular value of the Jacobian at random points\n";
  std::snprintf(buf, sizeof buf, "layer       : %s attention, N=%d D=%d H=%d (dk=dv=%d), weights N(0,1)/sqrt(D), points N(0,1)\n",
                AttentionKindToString(o.kind), o.n, o.d, o.heads, o.d / o.heads);
  os << buf;
  std::snprintf(buf, sizeof buf, "evaluator   : %s  device=%s dtype=%s threads=%d method=%s rel_tol=%g max_iters=%d\n",
                evaluator_name, DeviceToString(o.device), DTypeToString(o.dtype), o.threads,
                SingularMethodToString(o.method), o.rel_tol, o.max_iters);
  os << buf;
  os << "simd        : " << Eigen::SimdInstructionSetsInUse() << "\n";
  std::snprintf(buf, sizeof buf, "batch       : %d points x %d repetitions in %.3f s\n", o.batch, run.reps, run.elapsed);
  os << buf;
  std::snprintf(buf, sizeof buf, "iterations  : mean %.1f, max %d J^T J products per point; converged %d/%d\n",
                t.iters / o.batch, t.imax, t.conv, o.batch);
  os << buf;
  std::snprintf(buf, sizeof buf, "sigma       : max %.6g, mean %.6g\n", t.smax, t.smean);
  os << buf;
  std::snprintf(buf, sizeof buf, "gemm flops  : %.3g per point, %.2f GFLOP/s achieved", t.flops / o.batch, gflops);
  os << buf;
  if (peak > 0) {
    std::snprintf(buf, sizeof buf, " (plain Eigen GEMM 256^3 on %d threads: %.2f GFLOP/s)", workers, peak);
    os << buf;
  }
  os << "\n";
  std::snprintf(buf, sizeof buf, "points_per_s=%.6g", points_per_s);
  os << buf;
  return os.str();
}

}  // namespace

std::string RunEvaluatorBench(const BenchOptions& o) {
  if (o.n < 1 || o.d < 1 || o.heads < 1 || o.d % o.heads != 0)
    throw std::invalid_argument("bench: need n, d, heads >= 1 with heads dividing d");
  if (o.batch < 1) throw std::invalid_argument("bench.batch: must be at least 1");
  std::mt19937_64 rng(0);
  std::normal_distribution<double> nd(0.0, 1.0);
  const AttentionLayer L = RandomAttentionLayer({o.kind, false, false, false, o.d, o.heads, o.d / o.heads}, rng);
  std::vector<double> x(size_t(o.batch) * o.n * o.d);
  for (double& v : x) v = nd(rng);

  auto evaluator = BenchEvaluator(L, o);
  const TimedBatches run = TimeBatches(*evaluator, x, o);
  const BatchTotals totals = TotalsOf(run.last, CountGemmFlops(L, o.n), o);
  // The machine's plain GEMM rate beside the achieved one (CPU only).
  const int workers = o.device == Device::kCpu
                          ? (o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency())))
                          : 1;
  const double peak = o.device == Device::kCpu
                          ? (o.dtype == DType::kF32 ? EigenGemmPeak<float>(workers) : EigenGemmPeak<double>(workers))
                          : 0;
  return FormatBench(o, evaluator->name(), run, totals, workers, peak);
}

}  // namespace lipcert
