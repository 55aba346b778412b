// `lipcert bench`: throughput of the evaluator's top-singular-value search at random points
// of a random layer (weights N(0,1)/sqrt(D), like the torch baseline in
// bench/torch_jacobian_baseline.py; points N(0,1)).
#pragma once

#include <string>

#include "kernels/evaluator.h"

namespace lipcert {

struct BenchOptions {
  int n = 16;                           // tokens N
  int d = 64;                           // model width D
  int heads = 4;                        // H (dk = dv = D / H)
  int batch = 64;                       // points per call
  AttentionKind kind = AttentionKind::kDot;  // dot or l2
  Device device = DefaultDevice();      // cpu or cuda
  DType dtype = DType::kF32;            // compute type
  int threads = 2;                      // CPU worker threads
  double rel_tol = 1e-6;                // evaluator stopping rule (0: exactly max_iters products)
  int max_iters = 500;                  // cap on J^T J products per point
  SingularMethod method = SingularMethod::kLanczos;  // lanczos or power
  double min_seconds = 0.5;             // repeat the batch until this much time has passed
};

// Runs the benchmark and returns the printed report, `openssl speed` style; its last line
// is exactly "points_per_s=<number>". Throws std::invalid_argument for bad options.
std::string RunEvaluatorBench(const BenchOptions& options);

}  // namespace lipcert
