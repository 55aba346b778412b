// The second-order variation of a head over the cover (docs/engines.md, "Second-order
// variation"): its forms per row, and the choice of one form per row that makes the
// largest column small.
#include "certify/variation/internal.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "interval/elementary.h"
#include "interval/softmax.h"

namespace lipcert {

using namespace variation_internal;

// max of P (1 - 2P)^+ over lo <= P <= hi (rounded up; its peak is 1/8 at P = 1/4).
static double MaxOfPTimesOneMinusTwoP(double lo, double hi) {
  const double x = std::clamp(0.25, lo, hi);
  return x >= 0.5 ? 0.0 : MulUp(x, SubUp(1.0, MulDown(2.0, x)));
}

// Row i's terms (SecondOrderHeadUp): the largest ||a_ij||, the query motion's spread beta,
// ab2, T2's diagonal share, and per key k: gamma_k^2, the variance weights W_k, T1's signed
// and unsigned key parts, T2's off-diagonal share and (l2) T3.
struct RowTerms {
  double a_max, beta, ab2, t2_diag;
  const Eigen::VectorXd &gamma2, &w, &signed_k, &unsigned_k, &t2_off, &t3_row;
};

// Row i of L in its five forms (5 x n, zero beyond len), from one of two bounds on T1:
//  - split: sum_j P_j a_j delta_j^2 with delta = delta_q + delta_k (query and key motion),
//    (1 + theta) ab2 t_i + sum_k gamma_k^2 (signed_k + unsigned_k / theta) t_k;
//  - whole: A_i Var_i(ds) <= 2 A_i beta^2 t_i + 2 A_i sum_k W_k gamma_k^2 t_k.
static Eigen::MatrixXd RowForms(const RowTerms& r, int i, int len, int n) {
  Eigen::MatrixXd forms = Eigen::MatrixXd::Zero(5, n);
  int f = 0;
  for (const double theta : {-1.0, 0.5, 1.0, 2.0, 4.0}) {  // -1: the whole bound
    Eigen::VectorXd row(len);
    double diag;
    if (theta < 0) {
      for (int k = 0; k < len; ++k) row(k) = MulUp(MulUp(2.0, r.a_max), MulUp(r.gamma2(k), r.w(k)));
      diag = MulUp(MulUp(2.0, r.a_max), MulUp(r.beta, r.beta));
    } else {
      for (int k = 0; k < len; ++k) row(k) = MulUp(r.gamma2(k), AddUp(r.signed_k(k), DivUp(r.unsigned_k(k), theta)));
      diag = MulUp(1.0 + theta, r.ab2);
    }
    for (int k = 0; k < len; ++k) row(k) = AddUp(AddUp(row(k), r.t2_off(k)), r.t3_row(k));
    row(i) = AddUp(row(i), AddUp(diag, r.t2_diag));
    forms.row(f++).head(len) = row.transpose();
  }
  return forms;
}

SecondOrderHead SecondOrderHeadUp(const HeadGeometry& G, const FactorBounds& F, const Eigen::VectorXd& rho,
                                  bool causal) {
  const int n = int(rho.size());
  SecondOrderHead out;
  out.forms.resize(n);
  double cross = 0;
  for (int i = 0; i < n; ++i) {
    const int len = causal ? i + 1 : n;
    const Eigen::VectorXd cap = F.p_hi.row(i).head(len).transpose(), a = F.a_sup.row(i).head(len).transpose();
    const double beta = SqrtUp(RowSpreadUp(G, F, rho, i, len).b2);
    const double a_max = a.maxCoeff();
    // The keys' logit motion y_k = g_ik . U_k: |y_k| <= gamma_k sqrt(t_k) (dot: g_ik = g_i).
    Eigen::VectorXd gamma2(len);
    for (int k = 0; k < len; ++k) gamma2(k) = MulUp(F.g_sup(i, k), F.g_sup(i, k));
    const double gamma_max = F.g_sup.row(i).head(len).maxCoeff();
    // a_bar >= sum_j P_ij ||a_ij||, ab2 >= sum_j P_ij ||a_ij|| ||b_ij||^2.
    const double a_bar = SimplexWeightedSumUp(cap, a, len);
    const double ab2 = std::min(QueryMomentUp(F, i, len, 2), MulUp(a_max, MulUp(beta, beta)));
    // Var_i(y) <= sum_j P_ij y_j^2, and also <= 2 sum_j P_ij (1 - P_ij) y_j^2 (from
    // Var = 1/2 sum_jk P_ij P_ik (y_j - y_k)^2); the row takes the smaller weights.
    Eigen::VectorXd w_p = cap, w_q(len);
    for (int j = 0; j < len; ++j) w_q(j) = MulUp(2.0, MaxOfPTimesOneMinusP(F.p_lo(i, j), F.p_hi(i, j)));
    const Eigen::VectorXd& w = w_q.sum() < w_p.sum() ? w_q : w_p;
    // T1's key part, signed: sum_j P_j a_j (y_j - ybar)^2 <= sum_k P_k (2 ||a_k|| (1 - 2P_k)^+ + a_bar) y_k^2;
    // unsigned (for the cross term): sum_j P_j ||a_j|| (y_j - ybar)^2 <= sum_k P_k (2 ||a_k|| + 2 a_bar) y_k^2,
    // or A_i Var_i(y) <= A_i sum_k W_k y_k^2, whichever the row finds smaller.
    Eigen::VectorXd signed_k(len), unsigned_1(len), unsigned_2(len);
    for (int k = 0; k < len; ++k) {
      signed_k(k) = AddUp(MulUp(MulUp(2.0, a(k)), MaxOfPTimesOneMinusTwoP(F.p_lo(i, k), F.p_hi(i, k))), MulUp(cap(k), a_bar));
      unsigned_1(k) = MulUp(cap(k), MulUp(2.0, AddUp(a(k), a_bar)));
      unsigned_2(k) = MulUp(a_max, w(k));
    }
    const Eigen::VectorXd& unsigned_k = unsigned_1.sum() < unsigned_2.sum() ? unsigned_1 : unsigned_2;
    // T2 <= 2 ||W_h|| sqrt(Var) sqrt(sum_k W_k t_k) with sqrt(Var) <= beta sqrt(t_i) + sqrt(sum_k W_k gamma_k^2 t_k):
    // <= ||W_h|| beta (t_i + W t) + ||W_h|| sum_k W_k (gamma_k^2 / gamma_max + gamma_max) t_k.
    const double t2_diag = MulUp(G.w_norm, beta);
    Eigen::VectorXd t2_off(len);
    for (int k = 0; k < len; ++k) {
      const double g_part = gamma_max > 0 ? AddUp(DivUp(gamma2(k), gamma_max), gamma_max) : 0.0;
      t2_off(k) = MulUp(MulUp(G.w_norm, AddUp(beta, g_part)), w(k));
    }
    // T3 = sum_j P_ij a_ij e_ij with e_ij the logits' second derivative. Dot: 2 U_i^T Wq^T Wk U_j / sqrt(dk),
    // a cross term below. L2: -2 ||Wq (U_i - U_j)||^2 / sqrt(dk), |e_ij| <= 4 c_g (t_i + t_j), linear in t.
    Eigen::VectorXd t3_row = Eigen::VectorXd::Zero(len);
    if (!G.dot) {
      double pa_sum = 0;
      for (int j = 0; j < len; ++j) {
        t3_row(j) = MulUp(MulUp(4.0, G.c_g), F.pa(i, j));
        pa_sum = AddUp(pa_sum, F.pa(i, j));
      }
      t3_row(i) = AddUp(t3_row(i), MulUp(MulUp(4.0, G.c_g), pa_sum));
    }
    // Row i of L in its forms (RowForms; SecondOrderColumnsUp picks one form per row).
    RowTerms terms{a_max, beta, ab2, t2_diag, gamma2, w, signed_k, unsigned_k, t2_off, t3_row};
    out.forms[i] = RowForms(terms, i, len, n);
    if (G.dot) {
      double pa2 = 0;
      for (int j = 0; j < len; ++j) pa2 = AddUp(pa2, MulUp(F.pa(i, j), F.pa(i, j)));
      cross = std::max(cross, SqrtUp(pa2));
    }
  }
  // Dot: ||T3_i|| <= 2 c_b sqrt(t_i) sum_j pa_ij sqrt(t_j), whose norm over i is at most
  // 2 c_b max_i ||row i of pa||_2.
  out.cross = G.dot ? MulUp(MulUp(2.0, G.c_b), cross) : 0.0;
  return out;
}

// pick[h][i]: the form of row i of head h.
using FormPicks = std::vector<std::vector<int>>;

// The bound from the picks, rounded up.
static double PickedBoundUp(const std::vector<SecondOrderHead>& heads, const FormPicks& pick, int n) {
  const int h_count = int(heads.size());
  Eigen::VectorXd columns = Eigen::VectorXd::Zero(n);
  double cross = 0;
  for (int h = 0; h < h_count; ++h) {
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int i = 0; i < n; ++i) {
        const double v = heads[h].forms[i](pick[h][i], j);
        s = AddUp(s, MulUp(v, v));
      }
      columns(j) = AddUp(columns(j), SqrtUp(s));
    }
    cross = AddUp(cross, heads[h].cross);
  }
  return AddUp(columns.maxCoeff(), cross);
}

// sum_h sqrt(col2[h]): the columns' sums in floating point.
static Eigen::VectorXd ColumnSums(const std::vector<Eigen::VectorXd>& col2, int n) {
  Eigen::VectorXd sums = Eigen::VectorXd::Zero(n);
  for (size_t h = 0; h < col2.size(); ++h) sums += col2[h].cwiseSqrt();
  return sums;
}

// Coordinate descent on sum_j (column sum / scale)^16, a smooth stand-in for the largest:
// up to three sweeps over every row's forms, pick and col2 updated in place.
static void DescendPicks(const std::vector<SecondOrderHead>& heads, FormPicks& pick, std::vector<Eigen::VectorXd>& col2,
                         int n) {
  const int h_count = int(heads.size());
  auto surrogate = [&](const Eigen::VectorXd& sums, double scale) {
    return (sums / scale).array().pow(16.0).sum();
  };
  Eigen::VectorXd sums = ColumnSums(col2, n);
  for (int sweep = 0; sweep < 3; ++sweep) {
    const double scale = sums.maxCoeff();
    double current = surrogate(sums, scale);
    bool moved = false;
    for (int h = 0; h < h_count; ++h)
      for (int i = 0; i < n; ++i) {
        const Eigen::MatrixXd& forms = heads[h].forms[i];
        for (int f = 0; f < forms.rows(); ++f) {
          if (f == pick[h][i]) continue;
          const Eigen::VectorXd trial2 =
              (col2[h] - forms.row(pick[h][i]).transpose().cwiseAbs2() + forms.row(f).transpose().cwiseAbs2())
                  .cwiseMax(0.0);
          const Eigen::VectorXd trial_sums = sums - col2[h].cwiseSqrt() + trial2.cwiseSqrt();
          const double value = surrogate(trial_sums, scale);
          if (value < current) {
            current = value;
            col2[h] = trial2;
            sums = trial_sums;
            pick[h][i] = f;
            moved = true;
          }
        }
      }
    if (!moved) break;
    sums = ColumnSums(col2, n);  // (drops the updates' rounding drift)
  }
}

double SecondOrderColumnsUp(const std::vector<SecondOrderHead>& heads) {
  const int h_count = int(heads.size());
  if (h_count == 0) return 0.0;
  const int n = int(heads[0].forms.size());
  // pick[h][i]: the form of row i of head h; col2[h](j): sum_i L_h(i, j)^2 in floating point.
  FormPicks pick(h_count, std::vector<int>(n, 0));
  std::vector<Eigen::VectorXd> col2(h_count, Eigen::VectorXd::Zero(n));
  for (int h = 0; h < h_count; ++h)
    for (int i = 0; i < n; ++i) {
      Eigen::Index best;
      heads[h].forms[i].rowwise().squaredNorm().minCoeff(&best);
      pick[h][i] = int(best);
      col2[h] += heads[h].forms[i].row(best).transpose().cwiseAbs2();
    }
  double best = PickedBoundUp(heads, pick, n);
  if (!std::isfinite(best)) return best;
  // Second start: each row's form by its sum of squares weighted by (column sum / largest)^8
  // of the first picks; the descent starts from the better of the two.
  {
    const Eigen::VectorXd sums = ColumnSums(col2, n);
    const Eigen::VectorXd weight = (sums / sums.maxCoeff()).array().pow(8.0).matrix();
    const auto first_pick = pick;
    const auto first_col2 = col2;
    for (int h = 0; h < h_count; ++h) {
      col2[h].setZero();
      for (int i = 0; i < n; ++i) {
        Eigen::Index f;
        (heads[h].forms[i].cwiseAbs2() * weight).minCoeff(&f);
        pick[h][i] = int(f);
        col2[h] += heads[h].forms[i].row(f).transpose().cwiseAbs2();
      }
    }
    const double second = PickedBoundUp(heads, pick, n);
    if (second < best) {
      best = second;
    } else {
      pick = first_pick;
      col2 = first_col2;
    }
  }
  DescendPicks(heads, pick, col2, n);
  return std::min(best, PickedBoundUp(heads, pick, n));
}

}  // namespace lipcert
