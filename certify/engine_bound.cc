#include "certify/engine_bound.h"

namespace lipcert {

std::string BoundOptions::IsValid() const {
  if (threads < 0) return "threads: must be >= 0";
  if (dense_limit < 0) return "dense_limit: must be >= 0";
  if (deflation_vectors < 0) return "deflation_vectors: must be >= 0";
  return "";
}

EngineBound TimedOutBound(const std::string& engine) {
  EngineBound b;
  b.timed_out = true;
  b.note = engine + ": deadline passed before the bound was complete";
  return b;
}

bool DeadlinePassed(const BoundOptions& opts) {
  if (StopRequested(opts.stop)) return true;
  return opts.deadline != std::chrono::steady_clock::time_point::max() &&
         std::chrono::steady_clock::now() >= opts.deadline;
}

}  // namespace lipcert
