// The plain super-blocks: ||J||_2 <= ||B||_2 for the matrix B of bounds on the token
// groups' blocks, anytime after one pass of Frobenius norms.
#include "certify/centre/internal.h"

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "interval/norms.h"

namespace lipcert {
namespace centre_internal {

namespace {

// The order in which the super-blocks get their dense certificates: decreasing share
// u_I B_IK v_K of ||B||_2, with (u, v) B's top singular pair (floating power iteration on
// B^T B: it only orders the work, every B_IK stays a bound whatever the order).
std::vector<std::pair<int, int>> BlocksByShare(const Eigen::MatrixXd& b) {
  const Eigen::Index groups = b.rows();
  Eigen::VectorXd v = Eigen::VectorXd::Ones(groups), u = b * v;
  for (int it = 0; it < 100 && u.norm() > 0; ++it) {
    v = b.transpose() * u;
    v /= v.norm();
    u = b * v;
  }
  std::vector<std::pair<int, int>> order;
  std::vector<double> share;
  for (int i = 0; i < groups; ++i)
    for (int k = 0; k < groups; ++k) order.push_back({i, k});
  for (const auto& [i, k] : order) share.push_back(u(i) * b(i, k) * v(k));
  std::vector<size_t> idx(order.size());
  for (size_t t = 0; t < idx.size(); ++t) idx[t] = t;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return share[x] > share[y]; });
  std::vector<std::pair<int, int>> sorted;
  for (const size_t t : idx) sorted.push_back(order[t]);
  return sorted;
}

}  // namespace

// ||J||_2 <= ||B||_2, B_IK >= ||J_IK||_2 (the norm of a block matrix is at most the norm
// of the matrix of its block norms), in two passes:
//   1. every B_IK is the block's Frobenius norm (one assembly each): a bound once it ends;
//   2. the blocks in decreasing share of ||B|| (BlocksByShare) are assembled again and get
//      their dense certificate, min(Frobenius, dense), while the assembly and the Gram
//      certificate are predicted to fit before the deadline.
// Anytime after the first pass: the deadline costs tightness, not the bound.
UpperBound PlainSuperBlockBound(const CentreState& S, const CentreNormOptions& o, CentreNormReport& rep) {
  const int n = S.n, d = S.d;
  const int g = GroupTokens(o, n, d);
  const int groups = (n + g - 1) / g;
  rep.method = "super_block";
  rep.groups = groups;
  rep.group_tokens = g;
  rep.frobenius_blocks = long(g) * d > o.block_limit;
  auto assemble = [&](int ir, int kc, IntervalMatrix* blk) {
    const auto t_block = std::chrono::steady_clock::now();
    AssembleBlockInto(S, ir * g, std::min(n, (ir + 1) * g), kc * g, std::min(n, (kc + 1) * g), o.threads, blk);
    const double s = SecondsSince(t_block);
    rep.assembly_seconds += s;
    return s;
  };
  Eigen::MatrixXd b(groups, groups);
  IntervalMatrix blk;  // one block's storage, reused (no fresh pages per block)
  GramWorkspace workspace;  // and its certificate's
  double assembly_s = 0;  // per block, the largest measured
  for (int ir = 0; ir < groups; ++ir)
    for (int kc = 0; kc < groups; ++kc) {
      if (Past(DeadlineOf(o))) {
        rep.timed_out = true;
        return UpperBound(kInf);
      }
      assembly_s = std::max(assembly_s, assemble(ir, kc, &blk));
      b(ir, kc) = NormFrobeniusUpper(blk).value();
    }
  if (!rep.frobenius_blocks) {
    const double m = double(g) * d;
    double gram_s = m * m * m * (0.5 + 1.0 / 3) / kGramFlopsPerSecond;  // per block (model, then measured)
    for (const auto& [ir, kc] : BlocksByShare(b)) {
      // A stop keeps the Frobenius norms of the blocks not yet certified (a bound either way).
      if (assembly_s + gram_s > SecondsLeft(o.deadline) || StopRequested(o.stop)) break;
      assemble(ir, kc, &blk);
      const auto t_gram = std::chrono::steady_clock::now();
      const double dense = NormL2UpperGram(blk, o.threads, nullptr, o.deadline, &rep.gram, &workspace,
                                           GramPrecision::kSingle, o.stop)
                               .value();
      gram_s = SecondsSince(t_gram);
      if (!std::isfinite(dense)) continue;  // the deadline passed inside: the Frobenius norm stays
      ++rep.exact_blocks;
      b(ir, kc) = std::min(b(ir, kc), dense);
    }
  }
  return NormL2UpperNonneg(b);
}

}  // namespace centre_internal

}  // namespace lipcert
