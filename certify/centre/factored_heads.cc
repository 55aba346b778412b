// The heads factored: dot-product MHA alone at any size, in seconds (docs/engines.md,
// "Centre norm: the heads factored"). J = V + K + Q with block (i, j)
//   V_ij = sum_h P^h_ij W_h                  (the values, W_h = Wo_h Wv_h)
//   K_ij = sum_h a^h_ij g^h_i^T              (the keys: token j's key moves logit s_ij)
//   Q_ij = delta_ij E_i, E_i = sum_h A_i^hT Bt^h  (the queries: block diagonal)
// and ||J|| <= ||V|| + ||K|| + max_i ||E_i||, each bounded through the heads' factors:
//   ||V|| <= ||Pbar|| ||sum_h W_h|| + min(||Wo|| ||Wv|| max_h ||P_h - Pbar||, sum_h ||P_h - Pbar|| ||W_h||),
//            Pbar = mean_h P_h (also ||Wo|| ||Wv|| max_h ||P_h|| and sum_h ||P_h|| ||W_h||):
//            sum_h D_h (x) Wo_h Wv_h = (I (x) Wo) blockdiag_h(D_h (x) I) (I (x) Wv);
//   ||K|| <= ||Phi||, Phi the (H N) x D stack of the rows alpha_i g^h_i, alpha_i >= ||A_i||,
//            A_i = [a^h_ij]_{j,h} (D x N H): ||K x||^2 = sum_i ||A_i y_i||^2 with
//            (y_i)_{jh} = g^h_i . x_j, so <= sum_j x_j^T (sum_{i,h} alpha_i^2 g g^T) x_j.
// (and the same with Wo taken out, per-head alpha^h_i). The three paths are nearly
// orthogonal where the heads attend diffusely, so the keys and the queries also get one
// bound with their cross term (KeysAndQueriesUp), and the values' mean with both another
// (PathsUp); the smallest route is taken. Tight where the heads attend
// diffusely (random BERT-base-sized weights: 9.203 against sigma_1 = 2.795, where the
// super-blocks give 61.5); far looser than the super-blocks where they are sharp (MiniLM,
// N = 64: 26.70 against 3.48), so the centre norm takes the smaller.

#include "certify/centre/internal.h"

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "interval/norms.h"
#include "interval/parallel.h"

namespace lipcert {
namespace centre_internal {

namespace {

// The most memory the cross term of the keys and queries keeps (every E_i, N D^2 doubles:
// 0.6 GB at BERT-base size).
constexpr double kFactoredCrossBytes = 1.5e9;

// >= ||K + Q|| from Phi = [alpha_i g^h_i] (keys: ||Phi|| <= phi) and the queries' blocks E_j
// (||E_j|| <= e_j), through the transpose: column token j of (K + Q)^T u is
// Phi^T z_j + E_j^T u_j, (z_j)_{hi} = a^h_ij . u_i / alpha_i, and sum_j ||z_j||^2 =
// sum_i ||A_i^T u_i||^2 / alpha_i^2 <= ||u||^2. So for unit u
//   ||(K + Q)^T u||^2 <= phi^2 sum_j ||z_j||^2 + sum_j e_j^2 ||u_j||^2 + 2 sum_j c_j ||z_j|| ||u_j||
//                     <= phi^2 + theta max_j c_j + max_j (e_j^2 + c_j / theta)   (any theta > 0)
// with c_j >= ||Phi E_j^T|| (2 z w <= theta z^2 + w^2 / theta). The keys' rows and the queries'
// blocks are nearly orthogonal where the heads attend diffusely, and c_j << phi e_j there.
UpperBound KeysAndQueriesUp(double phi, const std::vector<double>& e, const std::vector<double>& c) {
  double e2_max = 0, c_max = 0;
  for (size_t j = 0; j < e.size(); ++j) {
    e2_max = std::max(e2_max, MulUp(e[j], e[j]));
    c_max = std::max(c_max, c[j]);
  }
  if (!std::isfinite(phi) || !std::isfinite(e2_max) || !std::isfinite(c_max)) return UpperBound(kInf);
  double best = kInf;  // >= ||(K + Q)^T u||^2
  for (double theta = 1.0 / 16; theta <= 16; theta *= 2) {
    double rest = 0;
    for (size_t j = 0; j < e.size(); ++j) rest = std::max(rest, AddUp(MulUp(e[j], e[j]), DivUp(c[j], theta)));
    best = std::min(best, AddUp(AddUp(MulUp(phi, phi), MulUp(theta, c_max)), rest));
  }
  return UpperBound(SqrtUp(best));
}

// >= ||J|| with the values split as V = Vbar + Vs, Vbar = Pbar (x) W (W = sum_h W_h) and
// ||Vs|| <= spread: column token j of Vbar^T u is W^T r_j, r_j = sum_i Pbar_ij u_i with
// sum_j ||r_j||^2 <= ||Pbar||^2, and that of (K + Q)^T u is Phi^T z_j + E_j^T u_j
// (KeysAndQueriesUp), so for unit u
//   ||(Vbar + K + Q)^T u||^2 <= ||Vbar||^2 + ||K + Q||^2 + 2 sum_j ||r_j|| (x1 ||z_j|| + x2_j ||u_j||)
//                            <= mean^2 + kq^2 + 2 ||Pbar|| (x1 + max_j x2_j),
// with x1 >= ||W Phi^T||, x2_j >= ||W E_j^T||, mean >= ||Pbar|| ||W||, kq >= ||K + Q||; then
// ||J|| <= that + spread. Random weights put W, the keys' rows and the queries' blocks in
// nearly orthogonal directions (BERT-base size: ||Phi W^T|| = 4.78 against ||Phi|| ||W|| = 9.08).
UpperBound PathsUp(UpperBound mean, UpperBound kq, UpperBound spread, UpperBound p_bar, double x1,
                   const std::vector<double>& x2) {
  const double x2_max = *std::max_element(x2.begin(), x2.end());
  const double cross = MulUp(2.0, MulUp(p_bar.value(), AddUp(x1, x2_max)));
  const double sq = AddUp(AddUp(MulUp(mean.value(), mean.value()), MulUp(kq.value(), kq.value())), cross);
  if (!std::isfinite(sq)) return UpperBound(kInf);
  return UpperBound(SqrtUp(sq)) + spread;
}

// The values' bound and what the cross terms reuse: W = sum_h W_h, ||Wo||, the spread of the
// heads' P_h about Pbar, ||Pbar||, ||W|| and the mean's bound ||Pbar|| ||W||.
struct FactoredValues {
  IntervalMatrix w_sum;
  UpperBound wo_norm{kInf}, spread{kInf}, p_bar_norm{kInf}, w_sum_norm{kInf}, mean{kInf}, value{kInf};
};

// ||(I (x) Wo) blockdiag_h(D_h (x) I) (I (x) Wv)|| <= ||[s_h Wo_h]_h|| ||[(||D_h|| / s_h) Wv_h]_h||
// for any s_h > 0 (one factor's columns, the other's rows scaled): s_h = 1 and
// s_h = sqrt(||D_h||) besides the common max_h ||D_h||; dn[h] >= ||D_h||.
UpperBound ScaledPairUp(const AttentionLayer& L, UpperBound wo_norm, const std::vector<double>& dn, int threads) {
  const int hs = L.heads;
  const int dv = L.head_dim_v;
  std::vector<Interval> col_scale(size_t(hs) * dv), row_scale(size_t(hs) * dv);
  for (int h = 0; h < hs; ++h)
    for (int c = 0; c < dv; ++c) {
      col_scale[size_t(h) * dv + c] = Sqrt(Interval(dn[h]));
      row_scale[size_t(h) * dv + c] = Interval(dn[h]);
    }
  const IntervalMatrix wo_t = IntervalMatrix::Point(Eigen::MatrixXd(L.wo.transpose())), wv = IntervalMatrix::Point(L.wv);
  const UpperBound rows_only = MulNonneg(wo_norm, NormL2UpperGram(ScaleRows(wv, row_scale), threads));
  const UpperBound split = MulNonneg(NormL2UpperGram(ScaleRows(wo_t, col_scale), threads),
                                     NormL2UpperGram(ScaleRows(wv, col_scale), threads));
  return Min(rows_only, split);
}

// The values: ||V|| through Pbar, the heads' spread about it and W. False (and *v
// unfinished) when the deadline passed after the heads' norms.
bool FactoredValuesBound(const CentreState& S, const AttentionLayer& L, int threads, Deadline deadline,
                         FactoredValues* v) {
  const int hs = S.heads;
  IntervalMatrix p_sum = S.head[0].p, w_sum = S.head[0].w;
  for (int h = 1; h < hs; ++h) {
    p_sum = p_sum + S.head[h].p;
    w_sum = w_sum + S.head[h].w;
  }
  const IntervalMatrix p_bar = Scale(Interval(1.0) / Interval(double(hs)), p_sum);
  std::vector<double> p_norm(hs), dev_norm(hs), w_norm(hs);
  ParallelFor(hs, WorkerCount(threads, hs), [&](int h, int) {
    p_norm[h] = NormL2UpperGram(S.head[h].p, 1).value();
    dev_norm[h] = NormL2UpperGram(S.head[h].p - p_bar, 1).value();
    w_norm[h] = NormL2UpperGram(S.head[h].w, 1).value();
  });
  if (Past(deadline)) return false;
  const UpperBound wo_norm = NormL2UpperGram(L.wo, threads);
  const UpperBound wo_wv = MulNonneg(wo_norm, NormL2UpperGram(Eigen::MatrixXd(L.wv.transpose()), threads));
  UpperBound spread_heads(0.0), whole_heads(0.0);
  for (int h = 0; h < hs; ++h) {
    spread_heads = spread_heads + MulNonneg(UpperBound(dev_norm[h]), UpperBound(w_norm[h]));
    whole_heads = whole_heads + MulNonneg(UpperBound(p_norm[h]), UpperBound(w_norm[h]));
  }
  const UpperBound spread = Min(Min(MulNonneg(wo_wv, UpperBound(*std::max_element(dev_norm.begin(), dev_norm.end()))), spread_heads),
                                ScaledPairUp(L, wo_norm, dev_norm, threads));
  const UpperBound p_bar_norm = NormL2UpperGram(p_bar, threads), w_sum_norm = NormL2UpperGram(w_sum, threads);
  const UpperBound mean = MulNonneg(p_bar_norm, w_sum_norm);
  v->value = Min(Min(mean + spread, MulNonneg(wo_wv, UpperBound(*std::max_element(p_norm.begin(), p_norm.end())))),
                 Min(whole_heads, ScaledPairUp(L, wo_norm, p_norm, threads)));
  v->w_sum = std::move(w_sum);
  v->wo_norm = wo_norm;
  v->spread = spread;
  v->p_bar_norm = p_bar_norm;
  v->w_sum_norm = w_sum_norm;
  v->mean = mean;
  return true;
}

// Per query token i: alpha_i >= ||A_i|| and ||E_i||; for the cross term, every E_i's
// floating midpoint, a bound on its norm and on its distance to E_i (Frobenius), where they
// fit in memory; and the pass's seconds.
struct QueryRows {
  std::vector<double> alpha, e_norm, e_mid_norm, e_dist;
  std::vector<Eigen::MatrixXd> e_mids;
  bool keep_e = false;
  double seconds = 0;
};

QueryRows QueryRowsOf(const CentreState& S, int threads, Deadline deadline) {
  const int n = S.n, d = S.d, hs = S.heads;
  IntervalMatrix bt_stack(Eigen::MatrixXd::Zero(long(hs) * n, d), Eigen::MatrixXd::Zero(long(hs) * n, d));
  for (int h = 0; h < hs; ++h) {
    bt_stack.mid.middleRows(long(h) * n, n) = S.head[h].bt.mid;
    bt_stack.rad.middleRows(long(h) * n, n) = S.head[h].bt.rad;
  }
  const double mb_f = NormFrobeniusUpper(bt_stack.mid).value(), rb_f = NormFrobeniusUpper(bt_stack.rad).value();
  QueryRows q;
  q.alpha.assign(n, kInf);
  q.e_norm.assign(n, kInf);
  q.keep_e = double(n) * d * d * sizeof(double) <= kFactoredCrossBytes;
  q.e_mids.resize(q.keep_e ? n : 0);
  q.e_mid_norm.assign(n, kInf);
  q.e_dist.assign(n, kInf);
  const auto t_rows = std::chrono::steady_clock::now();
  ParallelFor(n, WorkerCount(threads, n), [&](int i, int) {
    if (Past(deadline)) return;
    IntervalMatrix a_stack(Eigen::MatrixXd::Zero(long(hs) * n, d), Eigen::MatrixXd::Zero(long(hs) * n, d));
    for (int h = 0; h < hs; ++h) {
      const HeadCentre& H = S.head[h];
      const IntervalMatrix a = ScaledDifferenceRows(H.u, 0, n, H.ubar, i, H.p.mid.row(i).transpose().array(),
                                                    H.p.rad.row(i).transpose().array());
      a_stack.mid.middleRows(long(h) * n, n) = a.mid;
      a_stack.rad.middleRows(long(h) * n, n) = a.rad;
    }
    q.alpha[i] = NormL2UpperGram(a_stack, 1).value();
    // E_i = a^T bt about fl(Ma^T Mb): one GEMM, its rounding (SumErrorF, |Ma|^T |Mb| <=
    // ||Ma||_F ||Mb||_F) and the radii norm-wise (|Ma|^T Rb + Ra^T |Mb| + Ra^T Rb).
    const double ma_f = NormFrobeniusUpper(a_stack.mid).value(), ra_f = NormFrobeniusUpper(a_stack.rad).value();
    Eigen::MatrixXd e_mid = a_stack.mid.transpose() * bt_stack.mid;
    q.e_mid_norm[i] = NormL2UpperGram(e_mid, 1).value();
    q.e_dist[i] = AddUp(SumErrorF(double(hs) * n, MulUp(ma_f, mb_f), d, d),
                        AddUp(MulUp(ma_f, rb_f), MulUp(ra_f, AddUp(mb_f, rb_f))));
    q.e_norm[i] = AddUp(q.e_mid_norm[i], q.e_dist[i]);
    if (q.keep_e) q.e_mids[i] = std::move(e_mid);
  });
  q.seconds = SecondsSince(t_rows);
  return q;
}

// The keys: Phi = [alpha_i g^h_i] over (h, i), its norm, and ||K|| (the smaller of ||Phi||
// and the same with Wo taken out).
struct KeyRows {
  IntervalMatrix phi;
  UpperBound phi_norm{kInf}, keys{kInf};
};

KeyRows KeysBound(const CentreState& S, const std::vector<double>& alpha, UpperBound wo_norm, int threads) {
  const int n = S.n, d = S.d, hs = S.heads;
  IntervalMatrix g_stack(Eigen::MatrixXd::Zero(long(hs) * n, d), Eigen::MatrixXd::Zero(long(hs) * n, d));
  std::vector<Interval> scale(size_t(hs) * n);
  for (int h = 0; h < hs; ++h) {
    g_stack.mid.middleRows(long(h) * n, n) = S.head[h].g.mid;
    g_stack.rad.middleRows(long(h) * n, n) = S.head[h].g.rad;
    for (int i = 0; i < n; ++i) scale[size_t(h) * n + i] = Interval(alpha[i]);
  }
  KeyRows k;
  k.phi = ScaleRows(g_stack, scale);
  k.phi_norm = NormL2UpperGram(k.phi, threads);
  // Or with Wo taken out: K = (I (x) Wo) [K_h]_h, K_h's blocks P_ij (v_j - vbar_i) g_i^T, so
  // ||K|| <= ||Wo|| ||Phi'||, Phi' the rows alpha^h_i g^h_i, alpha^h_i >= ||[P_ij (v_j - vbar_i)]_j||.
  std::vector<Interval> head_scale(size_t(hs) * n);
  ParallelFor(hs, WorkerCount(threads, hs), [&](int h, int) {
    const HeadCentre& H = S.head[h];
    for (int i = 0; i < n; ++i) {
      const IntervalMatrix a = ScaledDifferenceRows(H.v, 0, n, H.vbar, i, H.p.mid.row(i).transpose().array(),
                                                    H.p.rad.row(i).transpose().array());
      head_scale[size_t(h) * n + i] = Interval(NormL2UpperGram(a, 1).value());
    }
  });
  k.keys = Min(k.phi_norm, MulNonneg(wo_norm, NormL2UpperGram(ScaleRows(g_stack, head_scale), threads)));
  return k;
}

// The cross terms (KeysAndQueriesUp, PathsUp), where the rows' pass fits again before the
// deadline (per token the same GEMM and Gram, and a D x D GEMM and Gram for W E_j^T):
//   ||Phi E_j^T|| <= ||fl(Phi_mid Em_j^T)|| + its rounding + ||Phi|| dist_j + ||Phi_rad||_F (||Em_j|| + dist_j),
//   ||W E_j^T||   <= ||fl(W_mid Em_j^T)|| + its rounding + ||W|| dist_j + ||W_rad||_F ||E_j||,
//   ||W Phi^T||   <= ||fl(W_mid Phi_mid^T)|| + its rounding + ||W|| ||Phi_rad||_F + ||Phi|| ||W_rad||_F.
// The tokens go in decreasing ||E_j||, a pair at a time, and stop where the terms so far
// (the rest taken as 0, which gives lower values of both bounds) already lose to the
// paths summed: sharp heads (MiniLM: keys and queries 29.1 against 19.0 at N = 64).
void AddCrossTerms(const CentreState& S, const FactoredValues& v, const QueryRows& q, const KeyRows& keys,
                   int threads, Deadline deadline, FactoredParts* out) {
  const int n = S.n, d = S.d, hs = S.heads;
  const IntervalMatrix& phi = keys.phi;
  const IntervalMatrix& w_sum = v.w_sum;
  const UpperBound phi_norm = keys.phi_norm;
  const double phi_mid_f = NormFrobeniusUpper(phi.mid).value(), phi_rad_f = NormFrobeniusUpper(phi.rad).value();
  const double w_mid_f = NormFrobeniusUpper(w_sum.mid).value(), w_rad_f = NormFrobeniusUpper(w_sum.rad).value();
  const Eigen::MatrixXd w_phi = w_sum.mid * phi.mid.transpose();
  double x1 = AddUp(NormL2UpperGram(w_phi, threads).value(), SumErrorF(d, MulUp(w_mid_f, phi_mid_f), d, double(hs) * n));
  x1 = AddUp(x1, AddUp(MulUp(v.w_sum_norm.value(), phi_rad_f), MulUp(phi_norm.value(), w_rad_f)));
  const UpperBound separate = out->keys + UpperBound(*std::max_element(q.e_norm.begin(), q.e_norm.end()));
  const UpperBound summed = out->value + separate;
  std::vector<int> order(n);
  for (int j = 0; j < n; ++j) order[j] = j;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return q.e_norm[a] > q.e_norm[b]; });
  std::vector<double> c(n, 0.0), x2(n, 0.0);
  const int workers = WorkerCount(threads, n);
  UpperBound kq(kInf), crossed(kInf);
  for (int t = 0; t < n; t += workers) {
    const int batch = std::min(workers, n - t);
    ParallelFor(batch, batch, [&](int b, int) {
      const int j = order[t + b];
      const double em_f = NormFrobeniusUpper(q.e_mids[j]).value();
      const Eigen::MatrixXd phi_e = phi.mid * q.e_mids[j].transpose();
      const double cj = AddUp(NormL2UpperGram(phi_e, 1).value(), SumErrorF(d, MulUp(phi_mid_f, em_f), double(hs) * n, d));
      c[j] = AddUp(cj, AddUp(MulUp(phi_norm.value(), q.e_dist[j]), MulUp(phi_rad_f, AddUp(q.e_mid_norm[j], q.e_dist[j]))));
      const Eigen::MatrixXd w_e = w_sum.mid * q.e_mids[j].transpose();
      const double xj = AddUp(NormL2UpperGram(w_e, 1).value(), SumErrorF(d, MulUp(w_mid_f, em_f), d, d));
      x2[j] = AddUp(xj, AddUp(MulUp(v.w_sum_norm.value(), q.e_dist[j]), MulUp(w_rad_f, q.e_norm[j])));
    });
    kq = Min(separate, KeysAndQueriesUp(phi_norm.value(), q.e_norm, c));
    crossed = PathsUp(v.mean, kq, v.spread, v.p_bar_norm, x1, x2);
    if (Past(deadline) || !(Min(out->value + kq, crossed).value() < summed.value())) break;
    if (t + batch >= n) {
      out->keys_and_queries = KeysAndQueriesUp(phi_norm.value(), q.e_norm, c);
      out->crossed = crossed;
    }
  }
}

}  // namespace

FactoredParts FactoredHeadsBound(const CentreState& S, const AttentionLayer& L, int threads, Deadline deadline) {
  FactoredParts out;
  if (!S.dot || S.ln || S.identity) return out;
  FactoredValues values;
  if (!FactoredValuesBound(S, L, threads, deadline, &values)) return out;
  out.value = values.value;
  const QueryRows rows = QueryRowsOf(S, threads, deadline);
  if (Past(deadline)) return out;
  out.queries = UpperBound(*std::max_element(rows.e_norm.begin(), rows.e_norm.end()));
  const KeyRows keys = KeysBound(S, rows.alpha, values.wo_norm, threads);
  out.keys = keys.keys;
  if (rows.keep_e && std::isfinite(keys.phi_norm.value()) &&
      time_model::kFactoredCrossMargin * rows.seconds < SecondsLeft(deadline))
    AddCrossTerms(S, values, rows, keys, threads, deadline, &out);
  return out;
}

}  // namespace centre_internal

}  // namespace lipcert
