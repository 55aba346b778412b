// What the time model (certify/time_model.h) measured of this machine: a struct of its own
// so that the certificate can record it without the models.
#pragma once

namespace lipcert {

// This machine against the reference, per kernel class: slowdown = the probe's seconds here
// / the probe's seconds on the reference machine (> 1: slower, a loaded machine included).
struct MachineCalibration {
  bool measured = false;
  double interval_probe_s = 0;      // the interval probe's seconds here (best of its runs)
  double gemm_probe_s = 0;          // the double GEMM probe's seconds here
  double interval_slowdown = 1;
  double gemm_slowdown = 1;
  double probe_seconds = 0;         // the whole probe, wall clock
};

}  // namespace lipcert
