// The time model's fit (certify/time_model.h), reproducible: the calibration probe's
// seconds here (the reference constants kReference*ProbeSeconds are these on the reference
// machine, idle), then each model against a measured run of the kernel it predicts, with
// the rate that run implies (the constant to refit):
//   centred: CentredBound on random dot layers (D = 16, 2 heads) at a few N, its
//            operations (CentredEngineOperations) per measured second against
//            kCentredOperationsPerSecond.
//
//   build/bench/time_model_bench [--runs 5] [--tokens 16,32,64]
#include <cstdio>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "certify/centred_engine.h"
#include "certify/run_control.h"
#include "certify/time_model.h"
#include "models/random_layer.h"

namespace {

std::vector<int> IntList(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoi(item));
  if (out.empty()) throw std::invalid_argument("--tokens: empty list");
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lipcert;
  int runs = 5;
  std::vector<int> tokens = {16, 32, 64};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--runs") runs = std::stoi(value);
    else if (flag == "--tokens") tokens = IntList(value);
    else {
      std::fprintf(stderr, "time_model_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  // The probe, several times: its spread is the calibration's noise on this machine.
  std::printf("probe (best of %d runs each; reference: interval %.3g s, GEMM %.3g s)\n", time_model::kProbeRuns,
              time_model::kReferenceIntervalProbeSeconds, time_model::kReferenceGemmProbeSeconds);
  for (int r = 0; r < runs; ++r) std::printf("  %s\n", CalibrationSummary(MeasureCalibration()).c_str());
  const MachineCalibration& cal = Calibration();
  // The centred engine's model against CentredBound.
  std::printf("centred engine (reference rate %.3g operations/s)\n", time_model::kCentredOperationsPerSecond);
  std::printf("  %6s %12s %12s %12s %14s\n", "N", "operations", "predicted_s", "measured_s", "implied_rate");
  std::mt19937_64 rng(7);
  RandomLayerSpec spec;
  spec.d = 16;
  spec.heads = 2;
  spec.dk = 8;
  const AttentionLayer L = RandomAttentionLayer(spec, rng);
  for (int n : tokens) {
    TokenCover cover;
    cover.center = Eigen::MatrixXd::Random(n, L.d_model) * 0.5;
    cover.radius = Eigen::VectorXd::Constant(n, 1e-3);
    cover.frobenius = UpperBound(1e-3 * std::sqrt(double(n)));
    BoundOptions o;
    o.dense_limit = n * L.d_model;
    o.threads = 1;
    double best = kInf;
    for (int r = 0; r < std::max(1, runs / 2); ++r) best = std::min(best, Timed([&] { return CentredBound(L, cover, o); }).second);
    const double ops = CentredEngineOperations(L, n);
    std::printf("  %6d %12.4g %12.4g %12.4g %14.4g\n", n, ops, CentredEngineSeconds(L, n), best,
                ops / best * cal.interval_slowdown);
  }
  return 0;
}
