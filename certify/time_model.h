// The cost models of certify/ in one place. Each predicts a stage's seconds from its sizes:
// (operations of a kernel class) x (seconds per operation on the reference machine) x
// (this machine's slowdown for that class). The seconds per operation are named constants
// fitted on the reference machine; the slowdown is measured once per process, on first
// use, by a short probe of the same kernel classes (MachineCalibration: interval matrix
// products and double GEMMs, about 25 ms of work, its wall-clock time longer on a loaded
// machine), so that a loaded or slower machine gets budgets sized for itself, not for the
// reference. bench/time_model_bench.cc
// prints the probe and each model against measured runs of the kernel it predicts: that is
// how the constants are refit (on the reference machine, idle).
//
// Under a work budget (certify/run_control.h) no stage consults this module.
#pragma once

#include <string>

#include "certify/calibration.h"
#include "models/attention_layer.h"

namespace lipcert {

// Measured on the first call (thread-safe), then the same for the process.
const MachineCalibration& Calibration();
// The probe itself (uncached): what Calibration() measures.
MachineCalibration MeasureCalibration();

namespace time_model {

// The probes, and their seconds on the reference machine idle (its thread's CPU seconds:
// a 2-core Xeon, Cooper Lake, -march=native; refit with bench/time_model_bench.cc). Each
// probe runs its products back to back and is timed as a whole, long enough (tens of
// scheduler slices on a loaded machine) for the wall clock to read the load.
inline constexpr int kIntervalProbeSize = 128;   // Mul of two n x n interval matrices,
inline constexpr int kIntervalProbeReps = 32;    // this many times
inline constexpr int kGemmProbeSize = 256;       // n x n double GEMM,
inline constexpr int kGemmProbeReps = 16;        // this many times
inline constexpr double kReferenceIntervalProbeSeconds = 0.0125;
inline constexpr double kReferenceGemmProbeSeconds = 0.011;

// The dense `centred` engine (certify/centred_engine.h): about 1e4 operations per entry of
// its ND x ND enclosure (blocks and the norm certificate's products; measured from N*D = 256
// to 2048), the Cholesky's (ND)^3 / 3, the LayerNorm composition and the heads' factor
// bounds, at this rate on the reference machine. Optimistic on purpose: the engine is not
// started only when even an idle machine could not finish before the deadline.
inline constexpr double kCentredOperationsPerEntry = 1e4;
inline constexpr double kCentredOperationsPerSecond = 1e10;
// The post-LN deflated centre's composition with J_LN: 6 D (N D)^2 interval operations.
inline constexpr double kPostLnComposeOperationsPerSecond = 2.5e10;

// The centre norm (certify/centre/; docs/engines.md, "Centre norm"), 2 cores, idle:
// its assembly per (token pair x head x D^2): the fused SIMD assembly (dot-product MHA;
// measured 2.2e-10, 4.6e-10 and 3.2e-10 at D = 384, H = 12, N = 32, 64, 128, taken at the
// largest), the general one (6.5e-9 at N = 32), and the inf norm's row sums (times 1.5
// with a LayerNorm);
inline constexpr double kFusedAssemblySeconds = 5e-10;
inline constexpr double kGeneralAssemblySeconds = 6.5e-9;
inline constexpr double kInfAssemblySeconds = 2.5e-9;
inline constexpr double kInfLayerNormFactor = 1.5;
// the Gram matrix and Cholesky factor of a dense certificate, (5/6) m^3 flops for m x m at
// half the rate measured (1.2e11 flop/s at N = 16, 9.6e10 for the super-blocks'
// single-precision blocks at N = 64);
inline constexpr double kGramFlopsPerSecond = 6e10;
// the factored heads' per-token products (measured 9.0 s at BERT-base size);
inline constexpr double kFactoredSecondsPerFlop = 1.0 / 3e10;
// the deflated super-blocks: kPlainShare of the plain super-blocks' model, kSecondsPerVector
// (N D)^2 per Lanczos vector and kSecondsPerVector2 N D k^2 (the reorthogonalisation and
// the blocks' Grams), and one J^T J product of the basis kSecondsPerProduct (N D)^2 (MiniLM
// layer 0, N = 32 and 64, k = 300 to 1000; docs/engines.md, "Deflation").
inline constexpr double kPlainShare = 0.68;
inline constexpr double kSecondsPerVector = 6.6e-11;
inline constexpr double kSecondsPerVector2 = 2.2e-10;
inline constexpr double kSecondsPerProduct = 1.1e-11;

// The margins the schedulers keep on these models (not fitted: chosen, docs/engines.md):
inline constexpr double kDeflationMargin = 1.3;        // the deflated route is not anytime
inline constexpr double kModelScatter = 1.35;          // a basis within this of its model reads no load
inline constexpr double kFactoredCrossMargin = 1.8;    // the cross terms run where 1.8x the rows' pass fits
inline constexpr double kCentreNormReserve = 1.6;      // the variation leaves the centre norm 1.6x its least time
inline constexpr double kFactoredAloneShare = 0.8;     // super-blocks above 0.8 of the window: factored heads alone

}  // namespace time_model

// This machine's slowdowns (Calibration()), for the models written elsewhere.
double IntervalSlowdown();
double GemmSlowdown();

// Predicted operations of the centred engine on `tokens` tokens (sizes only).
double CentredEngineOperations(const AttentionLayer& layer, int tokens);
// Predicted seconds of the centred engine here (CentredEngineOperations at the reference
// rate, times this machine's interval slowdown).
double CentredEngineSeconds(const AttentionLayer& layer, int tokens);
// Predicted seconds of the post-LN composition J_LN (I + J_MHA) into every super-block.
double PostLnComposeSeconds(int tokens, int d_model);

// The calibration as a line of text (for progress lines and the bench).
std::string CalibrationSummary(const MachineCalibration& c);

}  // namespace lipcert
