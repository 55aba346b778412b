#include "certify/search_ascent.h"

#include <algorithm>
#include <cmath>

#include "certify/run_control.h"
#include "certify/search_candidates.h"

namespace lipcert::search_parts {

using Eigen::MatrixXd;

AscentResult Ascend(const Oracle& o, const InputSet& set, const Candidate& start, NormKind norm,
                    int max_steps, std::chrono::steady_clock::time_point deadline, const std::atomic<bool>* stop) {
  AscentResult res;
  res.x = start.x;
  TopParams tp;
  tp.iters = 10;
  res.pair = start.pair.value >= 0 ? start.pair : ComputeTop(o, res.x, norm, nullptr, tp);
  const double scale = SetScale(set);
  if (!(scale > 0)) return res;
  double eta = 0.1 * scale;
  for (int step = 0; step < max_steps; ++step) {
    if (StopRequested(stop) || Clock::now() >= deadline) break;
    const MatrixXd g = PairGradient(o, res.x, res.pair);
    const double gn = g.norm();
    if (!(gn > 0) || !std::isfinite(gn)) break;
    bool accepted = false;
    for (int tries = 0; tries < 12 && !accepted && Clock::now() < deadline; ++tries) {
      const MatrixXd xt = set.Project(res.x + (eta / gn) * g);
      if ((xt - res.x).norm() <= 1e-13 * scale) break;  // stationary on the boundary
      const Pair pt = ComputeTop(o, xt, norm, &res.pair, tp);
      ++res.evaluations;
      if (pt.value > res.pair.value * (1 + 1e-13)) {
        res.x = xt;
        res.pair = pt;
        accepted = true;
        eta = std::min(eta * 1.6, scale);
      } else {
        eta *= 0.3;
      }
    }
    if (!accepted) break;
    ++res.steps;
  }
  return res;
}

}  // namespace lipcert::search_parts
