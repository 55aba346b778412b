#include "certify/dense_jacobian.h"

#include <atomic>

#include "interval/parallel.h"

namespace lipcert {

// The dense enclosure of J_MHA at the z-centre (ND x ND, row-major token blocks). Block
// rows are independent: they are filled in parallel, heads added in order within each.
IntervalMatrix DenseMhaJacobian(const AttentionLayer& L, const std::vector<HeadGeometry>& geo, int threads,
                                const std::vector<FactorBounds>& centre, int n, int d,
                                std::chrono::steady_clock::time_point deadline, bool* timed_out) {
  std::atomic<bool> late{false};
  Eigen::MatrixXd mid = Eigen::MatrixXd::Zero(n * d, n * d), rad = Eigen::MatrixXd::Zero(n * d, n * d);
  auto accumulate = [&](int i, int j, const IntervalMatrix& blk) {
    IntervalMatrix cur(mid.block(i * d, j * d, d, d), rad.block(i * d, j * d, d, d));
    cur = cur + blk;
    mid.block(i * d, j * d, d, d) = cur.mid;
    rad.block(i * d, j * d, d, d) = cur.rad;
  };
  auto row_of = [](const IntervalMatrix& m, int r) { return IntervalMatrix(m.mid.row(r), m.rad.row(r)); };
  std::vector<IntervalMatrix> p0(L.heads), ubar(L.heads), bbar(L.heads);
  for (int h = 0; h < L.heads; ++h) {
    p0[h] = IntervalMatrix::FromBounds(centre[h].p_lo, centre[h].p_hi);
    ubar[h] = Mul(p0[h], geo[h].u);
    bbar[h] = Mul(p0[h], geo[h].b);
  }
  ParallelFor(n, WorkerCount(threads, n), [&](int i, int) {
    if (late.load(std::memory_order_relaxed) || std::chrono::steady_clock::now() >= deadline) {
      late = true;
      return;
    }
    const int len = L.causal ? i + 1 : n;
    for (int h = 0; h < L.heads; ++h) {
      const HeadGeometry& G = geo[h];
      // a_ik and b_ik rows for k < len.
      std::vector<IntervalMatrix> a(len), b(len);
      const IntervalMatrix ui = row_of(ubar[h], i), bi = row_of(bbar[h], i);
      for (int k = 0; k < len; ++k) {
        a[k] = row_of(G.u, k) - ui;  // 1 x D
        b[k] = row_of(G.b, k) - bi;
        if (!G.dot) b[k] = Scale(Interval(2.0), b[k]);
      }
      IntervalMatrix e_i = IntervalMatrix::Point(Eigen::MatrixXd::Zero(d, d));
      for (int k = 0; k < len; ++k) e_i = e_i + Scale(p0[h](i, k), Mul(a[k].transpose(), b[k]));
      const IntervalMatrix gi = row_of(G.g, i);
      for (int j = 0; j < len; ++j) {
        IntervalMatrix gij = gi;  // dot: Wk^T q_i / sqrt(dk)
        if (!G.dot) gij = Scale(Interval(2.0), gi - row_of(G.g, j));
        IntervalMatrix blk = Scale(p0[h](i, j), G.w + Mul(a[j].transpose(), gij));
        if (i == j) blk = blk + e_i;
        accumulate(i, j, blk);
      }
    }
  });
  *timed_out = late;
  return IntervalMatrix(std::move(mid), std::move(rad));
}

// J = I + J_M blockdiag(L_j) for the LayerNorm sublayer (block columns in parallel).
IntervalMatrix ComposeWithLayerNorm(const IntervalMatrix& jm, const std::vector<IntervalMatrix>& ln, int threads, int n, int d,
                                    bool add_identity, std::chrono::steady_clock::time_point deadline,
                                    bool* timed_out) {
  std::atomic<bool> late{false};
  Eigen::MatrixXd mid = Eigen::MatrixXd::Zero(n * d, n * d), rad = Eigen::MatrixXd::Zero(n * d, n * d);
  ParallelFor(n, WorkerCount(threads, n), [&](int j, int) {
    if (late.load(std::memory_order_relaxed) || std::chrono::steady_clock::now() >= deadline) {
      late = true;
      return;
    }
    const IntervalMatrix col(jm.mid.middleCols(j * d, d), jm.rad.middleCols(j * d, d));
    const IntervalMatrix prod = Mul(col, ln[j]);
    mid.middleCols(j * d, d) = prod.mid;
    rad.middleCols(j * d, d) = prod.rad;
  });
  *timed_out = late;
  IntervalMatrix out(std::move(mid), std::move(rad));
  if (!add_identity) return out;
  return out + IntervalMatrix::Point(Eigen::MatrixXd::Identity(n * d, n * d));
}

}  // namespace lipcert
