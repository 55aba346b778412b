// Shared by the centre norm's files (certify/centre/): the enclosed state of the layer at
// its centre, the block assemblies and the bounds the route combines. Not a public API: the
// centre norm's entry points are in certify/centre_norm.h.
#pragma once

#include <Eigen/Dense>
#include <atomic>
#include <chrono>
#include <functional>
#include <vector>

#include "certify/centre_norm.h"
#include "certify/run_control.h"
#include "certify/time_model.h"
#include "interval/interval_matrix.h"
#include "interval/rounding.h"
#include "models/attention_layer.h"

namespace lipcert::centre_internal {

// The time models' constants are in certify/time_model.h.
using time_model::kGramFlopsPerSecond;

// The deflation's fewest vectors worth a pass (deflation_basis.cc, the time model).
inline constexpr int kMinDeflationVectors = 32;

// When the long loops end: the deadline, or a stop request (CentreNormOptions::stop), which
// ends them as the deadline would. Every loop that checks one checks both, through Past().
struct Deadline {
  std::chrono::steady_clock::time_point at = std::chrono::steady_clock::time_point::max();
  const std::atomic<bool>* stop = nullptr;
};
inline Deadline DeadlineOf(const CentreNormOptions& o) { return {o.deadline, o.stop}; }
inline bool Past(const Deadline& d) { return StopRequested(d.stop) || std::chrono::steady_clock::now() >= d.at; }
inline double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
inline double SecondsLeft(std::chrono::steady_clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
}
inline double SecondsLeft(const Deadline& d) { return SecondsLeft(d.at); }

// ---------------------------------------------------------------------------------------
// Small rigorous helpers on midpoint-radius matrices (enclosure.cc).
// ---------------------------------------------------------------------------------------
IntervalMatrix FromIntervals(const std::vector<Interval>& v, Eigen::Index rows, Eigen::Index cols);
// Rows k of x multiplied by p_k.
IntervalMatrix ScaleRows(const IntervalMatrix& x, const std::vector<Interval>& p);
IntervalMatrix ReplicateRow(const IntervalMatrix& m, Eigen::Index r, Eigen::Index rows);
IntervalMatrix RowsOf(const IntervalMatrix& m, Eigen::Index r0, Eigen::Index count);

// The LayerNorm Jacobian at one token, J_LN = diag(c) (I - 1 1^T / D - xhat xhat^T / D),
// c = gamma / sigma, kept in factored form.
struct LnFactor {
  std::vector<Interval> c, cx;  // c_a and c_a xhat_a
  IntervalMatrix ones_d, xhat_d;  // 1 x D rows: 1/D and xhat / D
};

// ---------------------------------------------------------------------------------------
// The layer at the centre, enclosed.
// ---------------------------------------------------------------------------------------
struct HeadCentre {
  IntervalMatrix p;      // (N, N) probabilities, 0 where masked
  IntervalMatrix u;      // (N, D) u_j = Wo_h v_j
  IntervalMatrix ubar;   // (N, D) P u
  IntervalMatrix g;      // (N, D) dot: Wk^T q_i / sqrt(dk); l2: 2 Wq^T q_i / sqrt(dk)
  IntervalMatrix bt;     // (N, D) rows of the diagonal term (shifted by a constant row)
  IntervalMatrix w;      // (D, D) W_h = Wo_h M_h
  IntervalMatrix v;      // (N, dv) the values v_j (dot: Wv_h z_j + bias), for the factored heads
  IntervalMatrix vbar;   // (N, dv) P v
};

using RowMajorXd = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// [vec W_h]_h (H x D^2, column-major vec in row h): mid and rad, for AssembleBlockFused.
struct WStacks {
  RowMajorXd mid, rad;
};

struct CentreState {
  int n = 0, d = 0, heads = 0;
  bool dot = true;
  bool ln = false;        // compose with the LayerNorm Jacobian
  bool identity = false;  // add I
  bool gemm = true;       // AssembleBlockFused where it applies (dot-product attention)
  std::vector<HeadCentre> head;
  WStacks w_stacks;         // when the fused assembly applies
  IntervalMatrix bt_stack;  // [bt^h]_h, (H N) x D, when the fused assembly applies
  std::vector<LnFactor> ln_factor;  // per token, when ln
};

// The layer at x0 enclosed as the options describe it (enclosure.cc).
CentreState EncloseCentre(const AttentionLayer& L, const Eigen::MatrixXd& x0, const CentreNormOptions& o);

// ---------------------------------------------------------------------------------------
// Block accumulation: sum of T interval products per entry, midpoint through plain double,
// radius bounded as in docs/engines.md ("Centre norm: block accumulation").
// ---------------------------------------------------------------------------------------
// The enclosure of a sum of T interval products per entry from the three floating sums:
// mid = fl(sum of midpoint products), rad and mag = fl(sums of the nonnegative radius and
// |midpoint| products), each term rounded at most 2T + 4 times in any order of summation:
// |fl(mid) - exact| <= gamma_T mag + T eta, and exact <= (fl + 4 T eta) / (1 - gamma_{4T+8})
// for rad and mag, so the radius (rad + eta')/shrink + g_T (mag + eta')/shrink + eta'
// (shrink = 1 - gamma_{4T+8}, eta' = (8T + 8) eta) encloses the sum around fl(mid).
// It is taken in one vectorised pass, never below that: with E0 = 2^-1000 (normal, far
// above the eta terms) every intermediate is normal, so each of the three round-to-nearest
// operations in ((rad + g_T mag) + E0) K loses at most a factor (1 - u), which
// K = (1 + 4u) / shrink (rounded up) absorbs (an FMA only removes a rounding).
struct FinishConstants {
  double g_t = 0, k = 0, e0 = 0;
};
FinishConstants FinishConstantsOf(int terms);
IntervalMatrix FinishSums(const Eigen::MatrixXd& mid, const Eigen::MatrixXd& rad_sum, const Eigen::MatrixXd& mag_sum,
                          int terms);
// x J_LN in place for a block of rows x (block_assembly.cc).
void ApplyLnInPlace(Eigen::Ref<Eigen::MatrixXd> mid, Eigen::Ref<Eigen::MatrixXd> rad, const LnFactor& f);
IntervalMatrix ApplyLn(IntervalMatrix x, const LnFactor& f);

// a_j = P_ij (u_j - ubar_i) for the rows j in [a0, a0 + len) of u (fused_assembly.cc).
IntervalMatrix ScaledDifferenceRows(const IntervalMatrix& u, int a0, int len, const IntervalMatrix& ubar, int i,
                                    const Eigen::ArrayXd& p_mid, const Eigen::ArrayXd& p_rad);
// The fused assembly of a block for dot-product attention (fused_assembly.cc).
void AssembleBlockFused(const CentreState& S, int r0, int r1, int c0, int c1, int threads, IntervalMatrix* out);
// The enclosure of rows [r0, r1) x columns [c0, c1) of J (token ranges), fused or general
// (block_assembly.cc).
void AssembleBlockInto(const CentreState& S, int r0, int r1, int c0, int c1, int threads, IntervalMatrix* out);
IntervalMatrix AssembleBlock(const CentreState& S, int r0, int r1, int c0, int c1, int threads);

// The options and the centre checked (engine.cc); tokens per super-block group.
void CheckInputs(const AttentionLayer& L, const Eigen::MatrixXd& x0, const CentreNormOptions& o);
int GroupTokens(const CentreNormOptions& o, int n, int d);

// The deflation's time model (deflation_basis.cc).
double IdleBasisSeconds(double nd, int k);
bool BasisDescribesTheEnclosure(const AttentionLayer& L, const CentreNormOptions& o);
int DeflationVectorsAfterBasis(const AttentionLayer& L, int n, const CentreNormOptions& o, int k, double basis_seconds);

// A Frobenius-norm bound on the rounding error of a floating sum of `terms` terms per entry
// (deflated_blocks.cc).
double SumErrorF(double terms, double abs_terms_f, double rows, double cols);
// `block(r0, r1, c0, c1, &out)` encloses the block of J for tokens [r0, r1) x [c0, c1).
using BlockAssembler = std::function<void(int r0, int r1, int c0, int c1, IntervalMatrix* out)>;
// The deflated super-block bound (deflated_blocks.cc).
UpperBound DeflatedSuperBlockBound(const BlockAssembler& block, int n, int d, const Eigen::MatrixXd& v,
                                   const Eigen::MatrixXd& y, int g, const CentreNormOptions& o, CentreNormReport* rep,
                                   bool may_abandon = false, int* fewer_vectors = nullptr);
// The report of a deflated run before its pass, and the assembler of S's blocks.
CentreNormReport DeflatedReport(const CentreNormOptions& o, int n, int d);
BlockAssembler AssemblerOf(const CentreState& S, int threads);

// The plain super-blocks (super_blocks.cc).
UpperBound PlainSuperBlockBound(const CentreState& S, const CentreNormOptions& o, CentreNormReport& rep);

// The heads factored (factored_heads.cc): the bound's parts.
struct FactoredParts {
  UpperBound value{kInf}, keys{kInf}, queries{kInf};
  UpperBound keys_and_queries{kInf};  // >= ||K + Q||, with their cross term
  UpperBound crossed{kInf};           // >= ||J||: the values' mean with K + Q, cross terms and all (PathsUp)
  UpperBound Total() const { return Min(value + Min(keys + queries, keys_and_queries), crossed); }
};
FactoredParts FactoredHeadsBound(const CentreState& S, const AttentionLayer& L, int threads, Deadline deadline);

}  // namespace lipcert::centre_internal
