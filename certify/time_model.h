// The cost models of certify/ in one place. Each predicts a stage's seconds from its sizes:
// (operations of a kernel class) x (seconds per operation on the reference machine) x
// (this machine's slowdown for that class). The seconds per operation are named constants
// fitted on the reference machine; the slowdown is measured once per process, on first
// use, by a short probe of the same kernel class (MachineCalibration: a few interval
// matrix products and double GEMMs, tens of milliseconds), so that a loaded or slower
// machine gets budgets sized for itself, not for the reference. bench/time_model_bench.cc
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

// The probes' seconds on the reference machine (refit with bench/time_model_bench.cc).
inline constexpr int kIntervalProbeSize = 96;    // Mul of two n x n interval matrices
inline constexpr int kGemmProbeSize = 192;       // n x n double GEMM
inline constexpr int kProbeRuns = 3;             // best of
inline constexpr double kReferenceIntervalProbeSeconds = 2.0e-3;
inline constexpr double kReferenceGemmProbeSeconds = 1.0e-3;

// The dense `centred` engine (certify/centred_engine.h): about 1e4 operations per entry of
// its ND x ND enclosure (blocks and the norm certificate's products; measured from N*D = 256
// to 2048), the Cholesky's (ND)^3 / 3, the LayerNorm composition and the heads' factor
// bounds, at this rate on the reference machine. Optimistic on purpose: the engine is not
// started only when even an idle machine could not finish before the deadline.
inline constexpr double kCentredOperationsPerEntry = 1e4;
inline constexpr double kCentredOperationsPerSecond = 1e10;
// The post-LN deflated centre's composition with J_LN: 6 D (N D)^2 interval operations.
inline constexpr double kPostLnComposeOperationsPerSecond = 2.5e10;

}  // namespace time_model

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
