// The deflated super-block bound: ||J||_2 from k deflation vectors and the super-blocks of
// the deflated J, for the layer at its centre and for the post-LN sublayer.
#include "certify/centre/internal.h"

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <vector>

#include "interval/fp_environment.h"
#include "interval/norms.h"
#include "interval/parallel.h"

namespace lipcert {
namespace centre_internal {

namespace {

// out += sign * a * b in floating point (round to nearest), the columns of b split over the
// workers. sign is +1 or -1 (exact), which SumErrorF's error model assumes.
template <class A, class B>
void GemmInto(const A& a, const B& b, double sign, Eigen::Ref<Eigen::MatrixXd> out, int threads) {
  if (sign != 1.0 && sign != -1.0) throw std::invalid_argument("GemmInto: sign must be +1 or -1");
  const int workers = WorkerCount(threads, int(std::min<Eigen::Index>(b.cols(), 8)));
  const Eigen::Index chunk = (b.cols() + workers - 1) / workers;
  ParallelFor(workers, workers, [&](int t, int) {
    const Eigen::Index c0 = t * chunk, width = std::min(chunk, b.cols() - c0);
    if (width > 0) out.middleCols(c0, width).noalias() += sign * (a * b.middleCols(c0, width));
  });
}

void CheckBasis(const Eigen::MatrixXd& x0, const Eigen::MatrixXd& v, const Eigen::MatrixXd& y) {
  const long nd = long(x0.rows()) * x0.cols();
  if (v.rows() != nd || y.rows() != nd || v.cols() != y.cols() || v.cols() < 1)
    throw std::invalid_argument("deflation: V and Y must both be (N D) x k with k >= 1");
}

// Row offset and row count of token group t (g tokens of width d, n tokens in all).
std::pair<long, long> GroupRows(int t, int n, int g, int d) {
  return std::pair<long, long>{long(t) * g * d, long(std::min(n, (t + 1) * g) - t * g) * d};
}

// How many deflation vectors would fit at the pace of the probe block (0: fewer than
// kMinDeflationVectors). Every block again, with a margin of 1.2: per block, the certificate
// and the assembly, and the GEMMs at k' / k of their time.
int FewerVectorsAtPace(const CentreNormOptions& o, int groups, int k, double block_rest_s, double assembly_s,
                       double gram_s) {
  const double per_block = SecondsLeft(o.deadline) / (1.2 * double(groups * groups));
  const double gemm_s = std::max(block_rest_s - assembly_s, 1e-9);
  const double fits = double(k) * (per_block - gram_s - assembly_s) / gemm_s;
  const int kept = int(std::max(0.0, std::floor(std::min(fits, 0.9 * k))));  // a real step down
  return kept >= kMinDeflationVectors ? kept : 0;
}

// The bound from the pass's sums (DeflatedSuperBlockBound): alpha, beta and gamma from
// fl(D), fl(E^T Y), their error terms per row group and the block bounds b, and the
// parts into the report.
UpperBound CombineDeflated(const Eigen::MatrixXd& d_fl, const Eigen::MatrixXd& ety_fl, const std::vector<double>& d_abs,
                           const std::vector<double>& d_enc, const std::vector<double>& ety_abs,
                           const std::vector<double>& ety_enc, const Eigen::MatrixXd& b, const Eigen::MatrixXd& y,
                           double eps, int n, int g, int d, CentreNormReport* rep) {
  const int k = int(d_fl.cols());  // the columns of V
  const long nd = long(n) * d;
  const int groups = (n + g - 1) / g;
  auto rows = [&](int t) { return GroupRows(t, n, g, d); };
  // Each entry of D and E^T Y sums nd products (the blocks' GEMMs and their accumulation).
  double d_err = 0, ety_err = 0;
  for (int t = 0; t < groups; ++t) {
    const double m = double(rows(t).second);
    d_err = AddUp(d_err, AddUp(SumErrorF(double(nd), d_abs[t], m, k), d_enc[t]));
    ety_err = AddUp(ety_err, AddUp(SumErrorF(double(nd), ety_abs[t], m, k), ety_enc[t]));
  }
  const double d_norm = AddUp(NormFrobeniusUpper(d_fl).value(), d_err);
  const double gamma_root = NormL2UpperNonneg(b).value();
  const double alpha_root = AddUp(NormL2Upper(y).value(), d_norm);
  const double beta = AddUp(AddUp(NormL2Upper(ety_fl).value(), ety_err), MulUp(d_norm, gamma_root));
  const double alpha = MulUp(alpha_root, alpha_root), gamma = MulUp(gamma_root, gamma_root);
  const double half_sum = DivUp(AddUp(alpha, gamma), 2.0);
  const double half_diff = DivUp(std::max(SubUp(alpha, gamma), SubUp(gamma, alpha)), 2.0);
  const double lambda = AddUp(half_sum, SqrtUp(AddUp(MulUp(half_diff, half_diff), MulUp(beta, beta))));
  rep->deflation_vectors = k;  // the columns of V (fewer than asked when the deadline cut the Lanczos run)
  rep->deflated_top = alpha_root;
  rep->deflated_rest = gamma_root;
  rep->deflation_coupling = beta;
  rep->deflation_orthogonality = eps;
  return UpperBound(SqrtUp(MulUp(lambda, AddUp(1.0, MulUp(eps, AddUp(1.0, eps))))));
}

}  // namespace

// A Frobenius-norm bound on the rounding error of a floating sum of `terms` terms per entry
// (products rounded once, or addends), in any order, with or without FMA: entrywise
// |fl(s) - s| <= gamma_terms sum |terms| + 2 terms eta (Higham, eq. 3.13, with underflow), so
// ||fl(S) - S||_F <= gamma_terms ||sum |terms| ||_F + 2 terms eta sqrt(rows cols), where
// abs_terms_f >= || sum |terms| ||_F.
double SumErrorF(double terms, double abs_terms_f, double rows, double cols) {
  return AddUp(MulUp(GammaUp(terms), abs_terms_f), MulUp(MulUp(2.0 * terms, kEta), SqrtUp(MulUp(rows, cols))));
}

// ||J||_2 from k deflation vectors V (nd x k), any Y (nd x k, J V in floating point) and
// G x G token groups (docs/engines.md, "Deflation"). With E = J - Y V^T, every unit x splits
// as x = V a + w (a = V^T x, w = x - V a), and
//   J x = Y a + E V a + E w = (Y + D) a + E w,   D = E V,
//   ||J x||^2 <= alpha ||a||^2 + 2 beta ||a|| ||w|| + gamma ||w||^2
//            <= lambda_max([[alpha, beta], [beta, gamma]]) (||a||^2 + ||w||^2),
// with alpha^1/2 >= ||Y + D||, gamma^1/2 >= ||E|| (super-blocks: E_IK = J_IK - Y_I V_K^T) and
// beta >= ||(Y + D)^T E|| <= ||E^T Y|| + ||D|| ||E||; and ||a||^2 + ||w||^2 =
// x^T (I + V (V^T V - I) V^T) x <= 1 + eps (1 + eps), eps >= ||V^T V - I||.
// One pass over the blocks: each enclosure [M +- R] of J_IK gives the floating
// F = fl(M - Y_I V_K^T), and ||E_IK - F||_F <= ||R||_F + the rounding of F; then D and E^T Y
// are accumulated from F by floating GEMMs, their rounding and the F - E terms bounded
// norm-wise. Three GEMMs of m x m x k per block and the block's Gram certificate.
// `block(r0, r1, c0, c1, &out)` encloses the block of J for tokens [r0, r1) x [c0, c1) in
// out (every entry written; out's storage is reused from block to block).
// With may_abandon, the second block's time (the first is slowed by first-touch pages) is a
// probe of the machine's present speed: when
// every block at that pace would not fit before the deadline, the pass stops there (+inf,
// rep->deflation_abandoned) so that the caller can run the anytime plain super-blocks (a
// deflated block left with its Frobenius norm costs far more than a plain one), or the pass
// again with fewer columns: *fewer_vectors is how many would fit at that pace (the GEMMs'
// time scales with k, the assembly's and the certificate's do not), 0 when that is under
// kMinDeflationVectors.
UpperBound DeflatedSuperBlockBound(const BlockAssembler& block, int n, int d, const Eigen::MatrixXd& v,
                                   const Eigen::MatrixXd& y, int g, const CentreNormOptions& o, CentreNormReport* rep,
                                   bool may_abandon, int* fewer_vectors) {
  if (fewer_vectors) *fewer_vectors = 0;
  const ScopedSoundFpEnvironment fp_guard;
  const int k = int(v.cols());
  const long nd = long(n) * d;
  const int groups = (n + g - 1) / g;
  auto rows = [&](int t) { return GroupRows(t, n, g, d); };
  if (!v.allFinite() || !y.allFinite()) return UpperBound(kInf);  // no bound from a basis that overflowed
  const IntervalMatrix vtv = Mul(Eigen::MatrixXd(v.transpose()), v);
  const double eps = NormL2UpperInterval(vtv - IntervalMatrix::Point(Eigen::MatrixXd::Identity(k, k))).value();
  const double v_norm = SqrtUp(AddUp(1.0, eps));  // >= ||V||_2, and so >= ||V_K||_2
  std::vector<double> y_f(groups), v_f(groups);   // >= ||Y_I||_F, ||V_I||_F
  for (int t = 0; t < groups; ++t) {
    const auto [r, m] = rows(t);
    y_f[t] = NormFrobeniusUpper(Eigen::MatrixXd(y.middleRows(r, m))).value();
    v_f[t] = NormFrobeniusUpper(Eigen::MatrixXd(v.middleRows(r, m))).value();
  }
  // fl(sum_K F_IK V_K) and fl(sum_I F_IK^T Y_I), and what bounds their distance from D and
  // E^T Y: per row group, sum ||F|| ||.||_F (rounding) and sum ||E - F|| ||.|| (the enclosure).
  Eigen::MatrixXd d_fl = Eigen::MatrixXd::Zero(nd, k), ety_fl = Eigen::MatrixXd::Zero(nd, k);
  std::vector<double> d_abs(groups, 0.0), d_enc(groups, 0.0), ety_abs(groups, 0.0), ety_enc(groups, 0.0);
  Eigen::MatrixXd b(groups, groups);
  const double m_max = double(g) * d;
  // Per block, modelled then measured: the Gram certificate, and the rest (the assembly and
  // the three GEMMs). A block gets its certificate when that and the rest of every block
  // still to come fit before the deadline (anytime, as the plain super-blocks).
  double gram_s = m_max * m_max * m_max * (0.5 + 1.0 / 3) / kGramFlopsPerSecond * GemmSlowdown(), rest_s = 0;
  const bool frobenius = long(g) * d > o.block_limit;
  IntervalMatrix blk;        // one block's storage, reused (no fresh pages per block)
  GramWorkspace workspace;  // and its certificate's
  int done = 0;
  for (int i = 0; i < groups; ++i) {
    const auto [ri, mi] = rows(i);
    for (int c = 0; c < groups; ++c) {
      if (Past(DeadlineOf(o))) return UpperBound(kInf);
      const auto [rc, mc] = rows(c);
      const auto t_rest = std::chrono::steady_clock::now();
      block(i * g, std::min(n, (i + 1) * g), c * g, std::min(n, (c + 1) * g), &blk);
      const double assembly_s = SecondsSince(t_rest);
      const double m_f = NormFrobeniusUpper(blk.mid).value();
      const double r_f = NormFrobeniusUpper(blk.rad).value();  // +inf for a NaN radius
      Eigen::MatrixXd& f = blk.mid;  // F, in place of M
      GemmInto(y.middleRows(ri, mi), v.middleRows(rc, mc).transpose(), -1.0, f, o.threads);
      // ||E_IK - F||_F <= ||R||_F + the rounding of F's k + 1 terms (|M| + |Y_I| |V_K|^T).
      const double rho = AddUp(r_f, SumErrorF(k + 1, AddUp(m_f, MulUp(y_f[i], v_f[c])), double(mi), double(mc)));
      const double f_f = NormFrobeniusUpper(f).value();
      GemmInto(f, v.middleRows(rc, mc), 1.0, d_fl.middleRows(ri, mi), o.threads);
      GemmInto(f.transpose(), y.middleRows(ri, mi), 1.0, ety_fl.middleRows(rc, mc), o.threads);
      d_abs[i] = AddUp(d_abs[i], MulUp(f_f, v_f[c]));
      d_enc[i] = AddUp(d_enc[i], MulUp(rho, v_norm));
      ety_abs[c] = AddUp(ety_abs[c], MulUp(f_f, y_f[i]));
      ety_enc[c] = AddUp(ety_enc[c], MulUp(rho, y_f[i]));
      const double block_rest_s = SecondsSince(t_rest);
      rest_s = std::max(rest_s, block_rest_s);
      const double left = std::chrono::duration<double>(o.deadline - std::chrono::steady_clock::now()).count();
      double dense = kInf;
      if (!frobenius && gram_s + rest_s * double(groups * groups - done - 1) <= left) {
        const auto t_block = std::chrono::steady_clock::now();
        dense = NormL2UpperGram(f, o.threads, nullptr, o.deadline, &rep->gram, &workspace, GramPrecision::kSingle, o.stop)
                    .value();
        gram_s = SecondsSince(t_block);
      }
      if (std::isfinite(dense)) ++rep->exact_blocks;
      b(i, c) = AddUp(std::isfinite(dense) ? dense : f_f, rho);
      ++done;
      if (may_abandon && done == std::min(2, groups * groups - 1) && !frobenius &&
          1.15 * (block_rest_s + gram_s) * double(groups * groups - done) > SecondsLeft(o.deadline)) {
        rep->deflation_abandoned = true;
        if (fewer_vectors) *fewer_vectors = FewerVectorsAtPace(o, groups, k, block_rest_s, assembly_s, gram_s);
        return UpperBound(kInf);
      }
    }
  }
  if (!b.allFinite()) return UpperBound(kInf);  // a block that overflowed
  return CombineDeflated(d_fl, ety_fl, d_abs, d_enc, ety_abs, ety_enc, b, y, eps, n, g, d, rep);
}

// The report of a deflated run before its pass: the method and the token groups.
CentreNormReport DeflatedReport(const CentreNormOptions& o, int n, int d) {
  CentreNormReport rep;
  const int g = GroupTokens(o, n, d);
  rep.method = "deflated_super_block";
  rep.groups = (n + g - 1) / g;
  rep.group_tokens = g;
  rep.frobenius_blocks = long(g) * d > o.block_limit;
  return rep;
}

BlockAssembler AssemblerOf(const CentreState& S, int threads) {
  return [&S, threads](int r0, int r1, int c0, int c1, IntervalMatrix* out) {
    AssembleBlockInto(S, r0, r1, c0, c1, threads, out);
  };
}

}  // namespace centre_internal

using namespace centre_internal;

UpperBound DeflatedCentreNormUpperBound(const AttentionLayer& L, const Eigen::MatrixXd& x0, const Eigen::MatrixXd& v,
                                        const Eigen::MatrixXd& y, const CentreNormOptions& o, CentreNormReport* report) {
  CheckInputs(L, x0, o);
  CheckBasis(x0, v, y);
  const CentreState S = EncloseCentre(L, x0, o);
  CentreNormReport rep = DeflatedReport(o, S.n, S.d);
  UpperBound bound = DeflatedSuperBlockBound(AssemblerOf(S, o.threads), S.n, S.d, v, y, rep.group_tokens, o, &rep);
  if (!std::isfinite(bound.value())) rep.timed_out = true;
  if (report) *report = rep;
  return bound;
}

UpperBound DeflatedPostLnCentreNormUpperBound(const AttentionLayer& mha, const Eigen::MatrixXd& x0,
                                              const std::vector<IntervalMatrix>& left, const Eigen::MatrixXd& v,
                                              const Eigen::MatrixXd& y, const CentreNormOptions& opts,
                                              CentreNormReport* report, UpperBound* mha_frobenius) {
  CentreNormOptions o = opts;
  o.mha_only = true;
  CheckInputs(mha, x0, o);
  const int n = int(x0.rows()), d = int(x0.cols());
  CheckBasis(x0, v, y);
  if (long(left.size()) != n) throw std::invalid_argument("post-LN deflation: one J_LN enclosure per token");
  for (const IntervalMatrix& l : left)
    if (l.rows() != d || l.cols() != d) throw std::invalid_argument("post-LN deflation: J_LN enclosures must be D x D");
  const auto t0 = std::chrono::steady_clock::now();
  const CentreState S = EncloseCentre(mha, x0, o);
  double mha_f2 = 0;  // >= ||J_MHA(X0)||_F^2, summed over the blocks as they are assembled
  // Block (I, K) of blockdiag(J_LN) (I + J_MHA): row token i's rows times its J_LN enclosure.
  const BlockAssembler block = [&](int r0, int r1, int c0, int c1, IntervalMatrix* result) {
    IntervalMatrix m = AssembleBlock(S, r0, r1, c0, c1, o.threads);
    const double f = NormFrobeniusUpper(m).value();
    mha_f2 = AddUp(mha_f2, MulUp(f, f));
    if (r0 == c0) m = m + IntervalMatrix::Point(Eigen::MatrixXd::Identity(m.rows(), m.cols()));
    IntervalMatrix out(Eigen::MatrixXd::Zero(m.rows(), m.cols()), Eigen::MatrixXd::Zero(m.rows(), m.cols()));
    ParallelFor(r1 - r0, WorkerCount(o.threads, r1 - r0), [&](int t, int) {
      const IntervalMatrix rows(m.mid.middleRows(long(t) * d, d), m.rad.middleRows(long(t) * d, d));
      const IntervalMatrix prod = Mul(left[r0 + t], rows);
      out.mid.middleRows(long(t) * d, d) = prod.mid;
      out.rad.middleRows(long(t) * d, d) = prod.rad;
    });
    *result = std::move(out);
  };
  CentreNormReport rep = DeflatedReport(o, n, d);
  UpperBound bound = DeflatedSuperBlockBound(block, n, d, v, y, rep.group_tokens, o, &rep);
  if (!std::isfinite(bound.value())) rep.timed_out = true;
  if (mha_frobenius) *mha_frobenius = rep.timed_out ? UpperBound(kInf) : UpperBound(SqrtUp(mha_f2));
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (report) *report = rep;
  return bound;
}

}  // namespace lipcert
