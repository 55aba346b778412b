// What the time model (certify/time_model.h) measured of this machine: a struct of its own
// so that the certificate can record it without the models.
#pragma once

namespace lipcert {

// This machine against the reference, per kernel class: slowdown = the probe's seconds here
// / the probe's seconds on the reference machine (> 1: slower, a loaded machine included).
// The wall-clock seconds read the load as well as the speed (a probe that shares its cores
// runs longer); the thread's CPU seconds read the speed alone.
struct MachineCalibration {
  bool measured = false;
  double interval_probe_s = 0;      // the interval probe's wall-clock seconds here
  double interval_probe_cpu_s = 0;  // and its thread's CPU seconds
  double gemm_probe_s = 0;          // the double GEMM probe's wall-clock seconds here
  double gemm_probe_cpu_s = 0;
  double interval_slowdown = 1;     // interval_probe_s / the reference's
  double gemm_slowdown = 1;         // gemm_probe_s / the reference's
  double probe_seconds = 0;         // the whole probe, wall clock
};

}  // namespace lipcert
