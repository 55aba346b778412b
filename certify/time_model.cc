#include "certify/time_model.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <random>

#include "certify/run_control.h"
#include "interval/fp_environment.h"
#include "interval/interval_matrix.h"

namespace lipcert {

namespace {

Eigen::MatrixXd RandomMatrix(int n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  Eigen::MatrixXd m(n, n);
  for (Eigen::Index k = 0; k < m.size(); ++k) m.data()[k] = u(rng);
  return m;
}

// The best of a few timed runs of fn (one thread: the models' constants are per core of
// the reference machine run as the engines run).
template <class F>
double BestSeconds(F&& fn) {
  double best = kInf;
  for (int r = 0; r < time_model::kProbeRuns; ++r) best = std::min(best, Timed(fn).second);
  return best;
}

}  // namespace

MachineCalibration MeasureCalibration() {
  using namespace time_model;
  const ScopedSoundFpEnvironment fp_guard;  // the interval product needs the rounding model
  const auto start = Clock::now();
  std::mt19937_64 rng(1);
  const IntervalMatrix a = IntervalMatrix::Ball(RandomMatrix(kIntervalProbeSize, rng), 1e-3);
  const IntervalMatrix b = IntervalMatrix::Ball(RandomMatrix(kIntervalProbeSize, rng), 1e-3);
  const Eigen::MatrixXd x = RandomMatrix(kGemmProbeSize, rng), y = RandomMatrix(kGemmProbeSize, rng);
  double sink = 0;
  MachineCalibration c;
  c.interval_probe_s = BestSeconds([&] {
    const IntervalMatrix p = Mul(a, b);
    sink += p.mid(0, 0);
    return 0;
  });
  c.gemm_probe_s = BestSeconds([&] {
    const Eigen::MatrixXd p = x * y;
    sink += p(0, 0);
    return 0;
  });
  c.interval_slowdown = c.interval_probe_s / kReferenceIntervalProbeSeconds;
  c.gemm_slowdown = c.gemm_probe_s / kReferenceGemmProbeSeconds;
  c.probe_seconds = ElapsedSeconds(start);
  c.measured = sink == sink;  // keeps the products from being optimised away
  return c;
}

const MachineCalibration& Calibration() {
  static std::once_flag once;
  static MachineCalibration c;
  std::call_once(once, [] { c = MeasureCalibration(); });
  return c;
}

double CentredEngineOperations(const AttentionLayer& layer, int tokens) {
  const double n = tokens, d = layer.d_model, h = layer.heads, nd = n * d;
  const double dk = layer.head_dim_qk, dv = layer.head_dim_v;
  double ops = time_model::kCentredOperationsPerEntry * nd * nd + nd * nd * nd / 3;
  // The LayerNorm composition: N interval products (ND x D) (D x D), three GEMMs each.
  if (layer.layer_norm) ops += 6.0 * n * nd * d * d;
  // Factor bounds per head (geometry GEMMs, logit boxes, the tangent plane, two covers).
  ops += h * (2.0 * n * d * (2 * dk + dv) + 2.0 * d * d * (dk + dv) + 40.0 * n * n * (dk + d));
  return ops;
}

double CentredEngineSeconds(const AttentionLayer& layer, int tokens) {
  return CentredEngineOperations(layer, tokens) / time_model::kCentredOperationsPerSecond *
         Calibration().interval_slowdown;
}

double PostLnComposeSeconds(int tokens, int d_model) {
  const double nd = double(tokens) * d_model;
  return 6.0 * d_model * nd * nd / time_model::kPostLnComposeOperationsPerSecond * Calibration().interval_slowdown;
}

std::string CalibrationSummary(const MachineCalibration& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "interval probe %.3g s (slowdown %.3g against the reference), GEMM probe %.3g s (slowdown %.3g); "
                "probe %.3g s",
                c.interval_probe_s, c.interval_slowdown, c.gemm_probe_s, c.gemm_slowdown, c.probe_seconds);
  return buf;
}

}  // namespace lipcert
