// The dense certificate of ||M||_2: a floating Gram matrix, a Lanczos estimate of its
// largest eigenvalue and a Cholesky factorisation of s I - G that proves the bound.
#include "certify/centre/internal.h"

#include <Eigen/Cholesky>
#include <Eigen/Eigenvalues>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "interval/fp_environment.h"
#include "interval/norms.h"
#include "interval/parallel.h"

namespace lipcert {
namespace centre_internal {

namespace {

// fn(c0, cn) over the column chunks [c0, c0 + cn) of a matrix with `cols` columns, on
// `threads` workers: the element-wise passes over a block that does not fit in cache.
template <typename Fn>
void ForColumnChunks(Eigen::Index cols, int threads, Fn&& fn) {
  constexpr Eigen::Index kChunk = 64;
  const int chunks = int((cols + kChunk - 1) / kChunk);
  ParallelFor(chunks, WorkerCount(threads, chunks), [&](int c, int) {
    const Eigen::Index c0 = c * kChunk;
    fn(c0, std::min(kChunk, cols - c0));
  });
}

// fl(m^T m) into *g (of_rows: fl(m m^T), by tiles of m's rows, without a transposed copy),
// exactly symmetric (each lower tile mirrored by the task that computed it), tiles on
// `threads` workers; *g keeps its storage when it already has the size.
template <typename Matrix>
void GramInto(const Matrix& m, int threads, Deadline deadline, Matrix* g, bool of_rows = false) {
  const Eigen::Index n = of_rows ? m.rows() : m.cols(), tile = 256;
  const int nt = int((n + tile - 1) / tile);
  std::vector<std::pair<int, int>> tasks;
  for (int a = 0; a < nt; ++a)
    for (int b = 0; b <= a; ++b) tasks.push_back({a, b});
  g->resize(n, n);
  ParallelFor(int(tasks.size()), WorkerCount(threads, int(tasks.size())), [&](int t, int) {
    const auto [a, b] = tasks[t];
    if (Past(deadline)) return;  // the caller checks the deadline again and discards g
    const Eigen::Index ra = std::min(tile, n - a * tile), rb = std::min(tile, n - b * tile);
    auto lower = g->block(a * tile, b * tile, ra, rb);
    if (of_rows)
      lower.noalias() = m.middleRows(a * tile, ra) * m.middleRows(b * tile, rb).transpose();
    else
      lower.noalias() = m.middleCols(a * tile, ra).transpose() * m.middleCols(b * tile, rb);
    if (a != b) {
      g->block(b * tile, a * tile, rb, ra) = lower.transpose();
    } else {
      for (Eigen::Index c = 0; c < ra; ++c)
        for (Eigen::Index r = 0; r < c; ++r) lower(r, c) = lower(c, r);
    }
  });
}

// Floating estimate of lambda_max of a symmetric matrix (Lanczos, full reorthogonalisation).
// The products g v by column tiles on `threads` workers (g = g^T: each tile gives its
// entries of g^T v as dot products down contiguous columns).
double LanczosLambdaMax(const Eigen::MatrixXd& g, int threads, int max_steps = 120, double tol = 1e-13) {
  const Eigen::Index n = g.rows();
  const int k_max = int(std::min<Eigen::Index>(max_steps, n));
  Eigen::MatrixXd v(n, k_max + 1);
  Eigen::VectorXd alpha(k_max), beta(k_max + 1);
  v.col(0) = Eigen::VectorXd::Ones(n) / std::sqrt(double(n));
  for (Eigen::Index i = 0; i < n; ++i) v(i, 0) *= 1.0 + 0.1 * std::sin(double(i));  // break symmetry
  v.col(0).normalize();
  constexpr Eigen::Index kTile = 256;
  const int tiles = int((n + kTile - 1) / kTile);
  Eigen::VectorXd w(n);
  double theta = 0;
  for (int k = 0; k < k_max; ++k) {
    ParallelFor(tiles, WorkerCount(threads, tiles), [&](int t, int) {
      const Eigen::Index c0 = t * kTile, cn = std::min(kTile, n - c0);
      w.segment(c0, cn).noalias() = g.middleCols(c0, cn).transpose() * v.col(k);
    });
    alpha(k) = v.col(k).dot(w);
    for (int pass = 0; pass < 2; ++pass) w -= v.leftCols(k + 1) * (v.leftCols(k + 1).transpose() * w);
    beta(k + 1) = w.norm();
    Eigen::MatrixXd t = Eigen::MatrixXd::Zero(k + 1, k + 1);
    for (int i = 0; i <= k; ++i) {
      t(i, i) = alpha(i);
      if (i < k) t(i, i + 1) = t(i + 1, i) = beta(i + 1);
    }
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(t);
    const Eigen::Index top = k;  // eigenvalues ascending
    theta = es.eigenvalues()(top);
    const double resid = std::fabs(beta(k + 1) * es.eigenvectors()(k, top));
    if (resid <= tol * std::fabs(theta) || beta(k + 1) <= 1e-300) break;
    v.col(k + 1) = w / beta(k + 1);
  }
  return theta;
}

// Lower Cholesky factor of c in place (the strict upper triangle is left as it was),
// right-looking by tiles of kTile: the diagonal tile by Eigen's LLT, the panel below it by
// a triangular solve, the trailing lower tiles by GEMM updates, both on `threads` workers.
// Every entry is still a - sum l l (over k) divided by a diagonal entry, or the square root
// of such a difference, only summed in another order: Higham's Thm 10.3 bound
// |c - R^T R| <= gamma_{n+1} |R^T||R| holds as for the unblocked algorithm. False when a
// diagonal tile is not positive definite or the deadline passed.
bool ParallelCholesky(Eigen::MatrixXd& c, int threads, Deadline deadline) {
  constexpr Eigen::Index kTile = 256;
  const Eigen::Index n = c.rows();
  const int nt = int((n + kTile - 1) / kTile);
  auto start = [&](int t) { return Eigen::Index(t) * kTile; };
  auto size = [&](int t) { return std::min(kTile, n - start(t)); };
  for (int k = 0; k < nt; ++k) {
    if (Past(deadline)) return false;
    const Eigen::Index k0 = start(k), bk = size(k);
    Eigen::Ref<Eigen::MatrixXd> ckk = c.block(k0, k0, bk, bk);
    Eigen::LLT<Eigen::Ref<Eigen::MatrixXd>, Eigen::Lower> llt(ckk);
    if (llt.info() != Eigen::Success) return false;
    const int below = nt - k - 1;
    if (below == 0) break;
    ParallelFor(below, WorkerCount(threads, below), [&](int t, int) {
      const int i = k + 1 + t;
      auto panel = c.block(start(i), k0, size(i), bk);
      c.block(k0, k0, bk, bk).triangularView<Eigen::Lower>().transpose().solveInPlace<Eigen::OnTheRight>(panel);
    });
    std::vector<std::pair<int, int>> tiles;
    for (int i = k + 1; i < nt; ++i)
      for (int j = k + 1; j <= i; ++j) tiles.push_back({i, j});
    ParallelFor(int(tiles.size()), WorkerCount(threads, int(tiles.size())), [&](int t, int) {
      const auto [i, j] = tiles[t];
      c.block(start(i), start(j), size(i), size(j)).noalias() -=
          c.block(start(i), k0, size(i), bk) * c.block(start(j), k0, size(j), bk).transpose();
    });
  }
  return true;
}

// The float format's unit roundoff and underflow unit.
constexpr double kUnitRoundoffSingle = 0x1p-24, kEtaSingle = 0x1p-150;

// The floating Gram matrix of m's smaller side into ws.gram (n x n, n = min(rows, cols)): in
// double, or that of fl32(m) in float, converted (exactly) to double.
void FloatGramInto(const Eigen::MatrixXd& m, int threads, Deadline deadline, bool single, GramWorkspace& ws) {
  const bool tall = m.rows() >= m.cols();
  const Eigen::Index n = tall ? m.cols() : m.rows();
  Eigen::MatrixXd& a = ws.gram;
  if (single) {
    if (tall) {
      ws.single.resize(m.rows(), m.cols());
      ForColumnChunks(m.cols(), threads, [&](Eigen::Index c0, Eigen::Index cn) {
        ws.single.middleCols(c0, cn) = m.middleCols(c0, cn).cast<float>();
      });
    } else {
      ws.single = m.transpose().cast<float>();
    }
    GramInto(ws.single, threads, deadline, &ws.gram_single);
    a.resize(n, n);
    ForColumnChunks(n, threads, [&](Eigen::Index c0, Eigen::Index cn) {
      a.middleCols(c0, cn) = ws.gram_single.middleCols(c0, cn).cast<double>();  // exact
    });
  } else if (tall) {
    GramInto(m, threads, deadline, &a);
  } else {
    GramInto(m, threads, deadline, &a, /*of_rows=*/true);
  }
}

// Certified lambda_max(m^T m) for a point matrix m (entries of moderate size: see below);
// the Gram matrix and the factor in ws.
double GramLambdaMaxUp(const Eigen::MatrixXd& m, int threads, double* estimate, Deadline deadline, GramStats* stats,
                       GramWorkspace& ws, GramPrecision precision) {
  RequireRoundToNearest();
  // The smaller Gram matrix; its error |fl(G) - G| <= gamma_k |m|^T |m| <= gamma_k c c^T
  // (c the column norms, Cauchy-Schwarz) has ||.||_2 <= gamma_k ||m||_F^2, plus k n eta.
  const bool tall = m.rows() >= m.cols();
  const Eigen::Index k = tall ? m.rows() : m.cols();
  const Eigen::Index n = tall ? m.cols() : m.rows();
  const double fro = NormFrobeniusUpper(m).value();
  const double fro2 = MulUp(fro, fro);
  if (fro2 == 0) return 0.0;
  const bool single = precision == GramPrecision::kSingle;
  // In single precision the Gram matrix is that of m32 = fl32(m), with |m - m32| <= u32 |m|
  // + eta32 entrywise (round to nearest; m is scaled to max |m_ij| in [1, 2), so nothing
  // overflows), hence ||m||_2 <= ||m32||_2 + conv and ||m32||_F <= (1 + u32) ||m||_F + conv,
  // conv = u32 ||m||_F + sqrt(k n) eta32. Its float products and sums: gamma_k(u32) and
  // k n eta32, as above.
  const double conv = single ? AddUp(MulUp(kUnitRoundoffSingle, fro), MulUp(SqrtUp(double(k) * double(n)), kEtaSingle))
                             : 0.0;
  double gram_err;
  if (single) {
    const double ku = MulUp(double(k), kUnitRoundoffSingle);
    if (!(ku < 1.0)) return kInf;
    const double gamma = DivUp(ku, SubDown(1.0, ku));
    const double fro32 = AddUp(MulUp(fro, AddUp(1.0, kUnitRoundoffSingle)), conv);
    gram_err = AddUp(MulUp(gamma, MulUp(fro32, fro32)), MulUp(double(k) * double(n), kEtaSingle));
  } else {
    gram_err = AddUp(MulUp(GammaUp(double(k)), fro2), MulUp(double(k) * double(n), kEta));
  }
  auto t = std::chrono::steady_clock::now();
  FloatGramInto(m, threads, deadline, single, ws);
  const Eigen::MatrixXd& a = ws.gram;
  stats->gram_seconds += SecondsSince(t);
  if (Past(deadline)) return kInf;
  t = std::chrono::steady_clock::now();
  // The estimate needs to be as close as the margin tau below: in single precision the
  // Gram matrix's own rounding (about 1e-4 relative) dwarfs a margin of 1e-8.
  const double theta = LanczosLambdaMax(a, threads, 120, single ? 1e-9 : 1e-13);
  stats->lanczos_seconds += SecondsSince(t);
  if (estimate) *estimate = theta;
  const double diag_max = a.diagonal().maxCoeff();
  // Cholesky of s I - G succeeds => s I - G + dA + dD >= 0 with |dA| <= gamma_{n+1} |R^T||R|
  // (Higham Thm 10.3, any summation order, so also the tiled ParallelCholesky), hence
  // lambda_max(G) <= s + gamma_{n+1} ||R||_F^2 + max_i |dD_ii| (rounding of s - G_ii).
  Eigen::MatrixXd& c = ws.factor;
  double tau = std::max(single ? 1e-8 : 1e-10, 64.0 * double(n) * kUnitRoundoff);
  for (int attempt = 0; attempt < 12; ++attempt, tau *= 8) {
    if (Past(deadline)) return kInf;
    const double s = MulUp(std::max(theta, 0.0), 1.0 + 2 * tau) + tau * diag_max * 1e-3;
    c.resize(n, n);  // same size: the storage is kept
    ForColumnChunks(n, threads, [&](Eigen::Index c0, Eigen::Index cn) { c.middleCols(c0, cn) = -a.middleCols(c0, cn); });
    double diag_err = 0;
    for (Eigen::Index i = 0; i < n; ++i) {
      c(i, i) = s - a(i, i);
      diag_err = std::max(diag_err, MulUp(kUnitRoundoff, std::fabs(c(i, i))));
    }
    t = std::chrono::steady_clock::now();
    ++stats->cholesky_attempts;
    const bool factored = ParallelCholesky(c, threads, deadline);
    stats->cholesky_seconds += SecondsSince(t);
    if (!factored || !(c.diagonal().array() > 0).all()) continue;
    // ||R||_F^2 over the factor (the lower triangle; the strict upper one still holds -G):
    // the vectorised Frobenius bound, +inf or NaN for an entry that is not finite.
    c.triangularView<Eigen::StrictlyUpper>().setZero();
    const double r = NormFrobeniusUpper(c).value();
    if (!(r < kInf)) continue;
    const double chol_err = AddUp(MulUp(GammaUp(double(n + 1)), MulUp(r, r)), diag_err);
    const double lambda = AddUp(AddUp(s, chol_err), gram_err);
    if (!single) return lambda;
    const double norm = AddUp(SqrtUp(lambda), conv);  // ||m||_2 <= ||m32||_2 + conv
    return MulUp(norm, norm);
  }
  return kInf;
}

}  // namespace

}  // namespace centre_internal

using namespace centre_internal;

UpperBound NormL2UpperGram(const Eigen::MatrixXd& m, int threads, double* estimate,
                           std::chrono::steady_clock::time_point deadline_at, GramStats* stats, GramWorkspace* workspace,
                           GramPrecision precision, const std::atomic<bool>* stop) {
  const Deadline deadline{deadline_at, stop};
  GramStats local_stats;
  if (!stats) stats = &local_stats;
  GramWorkspace local_ws;
  GramWorkspace& ws = workspace ? *workspace : local_ws;
  if (m.size() == 0) return UpperBound(0.0);
  // Per column: finite, and the largest magnitude.
  Eigen::VectorXd col_max(m.cols());
  std::vector<char> col_flag(m.cols(), 0);
  ForColumnChunks(m.cols(), threads, [&](Eigen::Index c0, Eigen::Index cn) {
    for (Eigen::Index c = c0; c < c0 + cn; ++c) {
      col_flag[c] = !m.col(c).allFinite();
      col_max[c] = col_flag[c] ? 0.0 : m.col(c).cwiseAbs().maxCoeff();
    }
  });
  if (std::find(col_flag.begin(), col_flag.end(), 1) != col_flag.end()) return UpperBound(kInf);
  // Scale by 2^-e so that max |m_ij| is in [1, 2) (exact unless entries become subnormal,
  // which adds at most sqrt(rows cols) eta / 2 to the norm).
  const double amax = col_max.maxCoeff();
  if (amax == 0.0) return UpperBound(0.0);
  const int e = std::ilogb(amax);
  // Products with powers of two: exact unless a result is subnormal or zero. Every such
  // result of a nonzero entry counts as inexact (only the term below is added for it).
  Eigen::MatrixXd& ms = ws.scaled;
  ms.resize(m.rows(), m.cols());
  bool inexact = false;
  if (std::abs(e) < 1000) {
    const double factor = std::ldexp(1.0, -e);
    ForColumnChunks(m.cols(), threads, [&](Eigen::Index c0, Eigen::Index cn) {
      for (Eigen::Index c = c0; c < c0 + cn; ++c) {
        ms.col(c) = m.col(c) * factor;
        col_flag[c] = ((ms.col(c).array().abs() < std::numeric_limits<double>::min()) && (m.col(c).array() != 0.0)).any();
      }
    });
    inexact = std::find(col_flag.begin(), col_flag.end(), 1) != col_flag.end();
  } else {
    for (Eigen::Index i = 0; i < m.size(); ++i) {
      ms.data()[i] = std::ldexp(m.data()[i], -e);
      inexact |= std::ldexp(ms.data()[i], e) != m.data()[i];
    }
  }
  double est = 0;
  double ns = SqrtUp(std::max(0.0, GramLambdaMaxUp(ms, threads, &est, deadline, stats, ws, precision)));
  if (inexact) ns = AddUp(ns, MulUp(SqrtUp(double(m.rows()) * double(m.cols())), kEta));
  const double scale = std::ldexp(1.0, e);
  if (estimate) *estimate = std::sqrt(std::max(est, 0.0)) * scale;
  return UpperBound(std::isfinite(scale) ? MulUp(ns, scale) : kInf);
}

UpperBound NormL2UpperGram(const IntervalMatrix& a, int threads, double* estimate,
                           std::chrono::steady_clock::time_point deadline_at, GramStats* stats, GramWorkspace* workspace,
                           GramPrecision precision, const std::atomic<bool>* stop) {
  if (a.mid.size() == 0) return UpperBound(0.0);
  if (!a.rad.allFinite()) return UpperBound(kInf);
  // The radius is rounding-sized: its Frobenius norm (one pass) is enough unless it is not
  // negligible, when the Collatz-Wielandt bound below is tried as well.
  UpperBound rad = a.rad.maxCoeff() == 0.0 ? UpperBound(0.0) : NormFrobeniusUpper(a.rad);
  const UpperBound mid = NormL2UpperGram(a.mid, threads, estimate, deadline_at, stats, workspace, precision, stop);
  if (rad.value() > 1e-9 * mid.value()) rad = Min(rad, NormL2UpperNonneg(a.rad));
  const UpperBound total = mid + rad;
  // The crude norms (three passes over a) only when the certificate failed.
  if (std::isfinite(total.value()) || Past(Deadline{deadline_at, stop})) return total;
  return Min(total, NormL2UpperCrude(a));
}

}  // namespace lipcert
