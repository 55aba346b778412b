// ||J(X0)||_inf certified from both sides, streamed in token tiles from the same enclosure.
#include "certify/centre/internal.h"
#include "certify/time_model.h"
#include "interval/norms.h"
#include "interval/parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>


namespace lipcert {
using namespace centre_internal;

CentreInfNormBounds CentreJacobianInfNormBounds(const AttentionLayer& L, const Eigen::MatrixXd& x0,
                                                const CentreNormOptions& o) {
  CheckInputs(L, x0, o);
  const auto t0 = std::chrono::steady_clock::now();
  CentreInfNormBounds out;
  const CentreState S = EncloseCentre(L, x0, o);
  const int n = S.n, d = S.d, nd = n * d;
  const int g = GroupTokens(o, n, d);  // tokens per tile side: tiles of at most block_limit^2 entries
  // Per row: floating sums of the nonnegative terms max(0, |m| - r) and |m| + r over all nd
  // columns, accumulated tile by tile (at most nd + 1 roundings per term in all).
  std::vector<double> lo_sum(nd, 0.0), hi_sum(nd, 0.0);
  IntervalMatrix blk;  // one tile's storage, reused
  for (int r0 = 0; r0 < n && !out.timed_out; r0 += g) {
    const int r1 = std::min(n, r0 + g);
    for (int c0 = 0; c0 < n; c0 += g) {
      if (Past(DeadlineOf(o))) {
        out.timed_out = true;
        break;
      }
      const int c1 = std::min(n, c0 + g);
      AssembleBlockInto(S, r0, r1, c0, c1, o.threads, &blk);
      // Vectorised, in round to nearest: each term max(0, |m| - r) and |m| + r carries one
      // rounding (max keeps the sign, so a negative difference still gives 0). The tile's
      // row tokens in parallel: each row's sum is the same whichever worker takes it.
      ParallelFor(r1 - r0, WorkerCount(o.threads, r1 - r0), [&](int t, int) {
        Eigen::VectorXd lo = Eigen::VectorXd::Zero(d), hi = Eigen::VectorXd::Zero(d);
        AddAbsRowSums(blk.mid.middleRows(Eigen::Index(t) * d, d), blk.rad.middleRows(Eigen::Index(t) * d, d), hi, &lo);
        for (Eigen::Index r = 0; r < d; ++r) {
          lo_sum[size_t(r0 + t) * d + r] += lo(r);
          hi_sum[size_t(r0 + t) * d + r] += hi(r);
        }
      });
    }
  }
  if (!out.timed_out) {
    // Each row sum adds nd terms, every term carrying at most one rounding of its own: the
    // exact sum of the terms lies within the computed sum times (1 -+ gamma_{nd+1}), give
    // or take nd eta.
    const double gamma = GammaUp(double(nd) + 1);
    const double eta = MulUp(double(nd) + 1, kEta);
    double best_lo = -1, best_hi = 0;
    for (int r = 0; r < nd; ++r) {
      const double lo = std::max(0.0, SubDown(MulDown(lo_sum[r], SubDown(1.0, gamma)), eta));
      const double hi = AddUp(DivUp(hi_sum[r], SubDown(1.0, gamma)), eta);
      if (lo > best_lo) {
        best_lo = lo;
        out.row = r;
      }
      best_hi = std::max(best_hi, hi);
    }
    out.lower = LowerBound(best_lo);
    out.upper = UpperBound(best_hi);
  }
  if (out.timed_out) out = CentreInfNormBounds{UpperBound(kInf), LowerBound(0.0), -1, 0, true};
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

double CentreInfNormSecondsEstimate(const AttentionLayer& L, int tokens) {
  const double n = tokens, d = L.d_model, h = L.heads;
  return time_model::kInfAssemblySeconds * n * n * h * d * d * (L.layer_norm ? time_model::kInfLayerNormFactor : 1.0) *
         IntervalSlowdown();
}

}  // namespace lipcert
