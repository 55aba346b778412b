#include "certify/branch_and_bound.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <queue>

#include "certify/block_norm_engine.h"
#include "certify/centred_engine.h"

namespace lipcert {

UpperBound BestStructuredBound(const AttentionLayer& layer, const TokenCover& cover, const BoundOptions& opts) {
  UpperBound best = BlockNormUpperBound(layer, cover, opts);
  if (CentredEngineRefusal(layer, int(cover.center.rows()), opts).empty())
    best = Min(best, CentredUpperBound(layer, cover, opts));
  return best;
}

namespace {

struct Piece {
  Eigen::MatrixXd lo, hi;  // the box; the piece is box intersected with the set
  double upper = 0;        // certified bound over the piece
  bool operator<(const Piece& o) const { return upper < o.upper; }
};

// Per token the smaller of two valid balls: the box's and the set's.
TokenCover CoverOfPiece(const InputSet& set, const Eigen::MatrixXd& lo, const Eigen::MatrixXd& hi) {
  const TokenCover whole = CoverOf(set);
  TokenCover c = whole;
  // ||X - C||_F^2 <= ||X - X0||_F^2 + sum of the re-centred tokens' radii^2.
  double moved2 = 0;
  for (Eigen::Index i = 0; i < lo.rows(); ++i) {
    double s = 0;
    Eigen::RowVectorXd mid(lo.cols());
    for (Eigen::Index j = 0; j < lo.cols(); ++j) {
      mid(j) = 0.5 * lo(i, j) + 0.5 * hi(i, j);
      const double half = std::max(SubUp(hi(i, j), mid(j)), SubUp(mid(j), lo(i, j)));
      s = AddUp(s, MulUp(half, half));
    }
    const double r = SqrtUp(s);
    if (r < whole.radius(i)) {
      c.center.row(i) = mid;
      c.radius(i) = r;
      moved2 = AddUp(moved2, MulUp(r, r));
    }
  }
  c.frobenius = UpperBound(SqrtUp(AddUp(MulUp(whole.frobenius.value(), whole.frobenius.value()), moved2)));
  return c;
}

// True only when the box certainly misses the set (distances rounded down).
bool CertainlyDisjoint(const InputSet& set, const Eigen::MatrixXd& lo, const Eigen::MatrixXd& hi) {
  auto gap = [&](Eigen::Index i, Eigen::Index j) {
    const double c = set.center(i, j);
    if (c < lo(i, j)) return SubDown(lo(i, j), c);
    if (c > hi(i, j)) return SubDown(c, hi(i, j));
    return 0.0;
  };
  switch (set.kind) {
    case SetKind::kBall: {
      double s = 0;
      for (Eigen::Index i = 0; i < lo.rows(); ++i)
        for (Eigen::Index j = 0; j < lo.cols(); ++j) s = AddDown(s, MulDown(gap(i, j), gap(i, j)));
      return s > MulUp(set.radius, set.radius);
    }
    case SetKind::kTokens:
      for (Eigen::Index i = 0; i < lo.rows(); ++i) {
        double s = 0;
        for (Eigen::Index j = 0; j < lo.cols(); ++j) s = AddDown(s, MulDown(gap(i, j), gap(i, j)));
        if (s > MulUp(set.radius, set.radius)) return true;
      }
      return false;
    case SetKind::kBox: return false;
  }
  return false;
}

}  // namespace

BranchAndBoundResult BranchAndBound(const AttentionLayer& layer, const InputSet& set, LowerBound lower,
                                    const BranchAndBoundOptions& opts) {
  const auto start = Clock::now();
  auto elapsed = [&] { return ElapsedSeconds(start); };
  BoundOptions bo;
  bo.norm = opts.norm;
  bo.dense_limit = std::min(opts.dense_limit, kPieceDenseLimit);
  bo.exclude_residual = opts.exclude_residual;
  bo.by_work = opts.by_work;
  bo.stop = opts.stop;

  BranchAndBoundResult res;
  std::priority_queue<Piece> open;
  // The box hull: every set kind lies within radius of the centre in every coordinate.
  Piece root{set.center.array() - set.radius, set.center.array() + set.radius, 0};
  double piece_seconds = opts.root_seconds;
  if (std::isfinite(opts.root_upper.value())) {
    root.upper = opts.root_upper.value();
  } else {
    root.upper = BestStructuredBound(layer, CoverOf(set), bo).value();
    piece_seconds = elapsed();
  }
  // Pieces bounded after the time limit come back +inf from the engines (then the parent's
  // bound stands); the root above ran without a deadline.
  bo.deadline = After(start, opts.time_limit_s);
  // A split bounds two pieces: only start one that can finish within the time limit.
  res.pieces_explored = 1;
  open.push(root);
  double best = root.upper;
  if (opts.on_improvement) opts.on_improvement(UpperBound(best), 1, 1);
  const double target = lower.value() > 0 ? MulDown(lower.value(), 1 + opts.tolerance) : -1;
  while (!open.empty()) {
    const Piece top = open.top();
    if (top.upper <= target) {
      res.tolerance_reached = true;
      break;
    }
    if (StopRequested(opts.stop)) {
      res.stopped = true;
      break;
    }
    if (res.pieces_explored >= opts.max_pieces) {
      res.pieces_spent = true;
      break;
    }
    if (!opts.by_work && elapsed() + 2 * piece_seconds >= opts.time_limit_s) break;
    // Split the widest coordinate.
    Eigen::Index bi = 0, bj = 0;
    double w = -1;
    for (Eigen::Index i = 0; i < top.lo.rows(); ++i)
      for (Eigen::Index j = 0; j < top.lo.cols(); ++j)
        if (top.hi(i, j) - top.lo(i, j) > w) {
          w = top.hi(i, j) - top.lo(i, j);
          bi = i;
          bj = j;
        }
    const double cut = 0.5 * top.lo(bi, bj) + 0.5 * top.hi(bi, bj);
    if (!(cut > top.lo(bi, bj) && cut < top.hi(bi, bj))) {
      res.exhausted = true;
      break;
    }
    open.pop();
    for (int side = 0; side < 2; ++side) {
      Piece child{top.lo, top.hi, 0};
      (side ? child.lo(bi, bj) : child.hi(bi, bj)) = cut;
      ++res.pieces_explored;
      if (CertainlyDisjoint(set, child.lo, child.hi)) continue;
      // A child is a subset of its parent: its bound may also be capped by the parent's.
      child.upper = std::min(top.upper, BestStructuredBound(layer, CoverOfPiece(set, child.lo, child.hi), bo).value());
      open.push(child);
    }
    if (open.empty()) break;
    if (open.top().upper < best) {
      best = open.top().upper;
      if (opts.on_improvement) opts.on_improvement(UpperBound(best), res.pieces_explored, int(open.size()));
    }
  }
  res.open_pieces = int(open.size());
  res.upper = UpperBound(open.empty() ? root.upper : open.top().upper);
  return res;
}

}  // namespace lipcert
