#include "certify/l2_caps.h"

#include <algorithm>
#include <stdexcept>

#include "certify/closed_form.h"
#include "interval/elementary.h"
#include "interval/interval_matrix.h"
#include "interval/norms.h"

namespace lipcert {

double L2HeadCaps::Spread(int len) const { return MulUp(c, LambertW0Upper(DivUp(double(len - 1), ExpLower(1.0)))); }

L2BlockCaps L2HeadCaps::For(int len) const {
  const double s = Spread(len);
  return L2BlockCaps{UpperBound(MulUp(k, AddUp(w1, SqrtUp(MulUp(w1, s))))), UpperBound(MulUp(k, s)),
                     UpperBound(MulUp(2.0, MulUp(k, s)))};
}

L2HeadCaps CapsOfL2Head(const AttentionLayer& L, int h) {
  L2HeadCaps caps;
  const Eigen::MatrixXd wq = L.wq_head(h);
  const Interval inv_sqrt_dk = Interval(1.0) / Sqrt(Interval(double(L.head_dim_qk)));
  const IntervalMatrix v = Scale(inv_sqrt_dk, Mul(Mul(L.wo_head(h), L.wv_head(h)), Eigen::MatrixXd(wq.transpose())));
  caps.k = MulUp(MulUp(MulUp(2.0, NormL2UpperInterval(v).value()), NormL2Upper(wq).value()), inv_sqrt_dk.hi);
  caps.c = SqrtUp(double(L.head_dim_qk));
  caps.w1 = MulUp(caps.c, LambertW0Upper(DivUp(1.0, ExpLower(1.0))));
  return caps;
}

L2BlockCaps L2AttentionCaps(const AttentionLayer& layer, int head, int len) {
  if (layer.kind != AttentionKind::kL2) throw std::invalid_argument("L2AttentionCaps: not an l2 layer");
  return CapsOfL2Head(layer, head).For(len);
}

L2OperatorCap L2AttentionOperatorCap(const AttentionLayer& L, int n) {
  if (L.kind != AttentionKind::kL2) throw std::invalid_argument("L2AttentionOperatorCap: not an l2 layer");
  if (n < 1) throw std::invalid_argument("L2AttentionOperatorCap: no tokens");
  const Interval inv_sqrt_dk = Interval(1.0) / Sqrt(Interval(double(L.head_dim_qk)));
  // The weights: V_h = Wo_h Wv_h Wq_h^T / sqrt(dk) (output values per query coordinate).
  double sum_v_wq = 0, sum_v_times_wq = 0;
  IntervalMatrix v_cat;
  v_cat.mid = Eigen::MatrixXd(L.d_model, L.heads * L.head_dim_qk);
  v_cat.rad = Eigen::MatrixXd(L.d_model, L.heads * L.head_dim_qk);
  for (int h = 0; h < L.heads; ++h) {
    const Eigen::MatrixXd wq = L.wq_head(h);
    const IntervalMatrix v = Scale(inv_sqrt_dk, Mul(Mul(L.wo_head(h), L.wv_head(h)), Eigen::MatrixXd(wq.transpose())));
    v_cat.mid.middleCols(h * L.head_dim_qk, L.head_dim_qk) = v.mid;
    v_cat.rad.middleCols(h * L.head_dim_qk, L.head_dim_qk) = v.rad;
    sum_v_wq = AddUp(sum_v_wq, NormL2UpperInterval(Mul(v, wq)).value());
    sum_v_times_wq = AddUp(sum_v_times_wq, MulUp(NormL2UpperInterval(v).value(), NormL2Upper(wq).value()));
  }
  const double through_cat = MulUp(NormL2UpperInterval(v_cat).value(), NormL2Upper(L.wq).value());
  // The universal factors, free of the weights and of sqrt(dk).
  const double wn = LambertW0Upper(DivUp(double(n - 1), ExpLower(1.0)));
  const double w1 = LambertW0Upper(DivUp(1.0, ExpLower(1.0)));
  const double p_norm = SqrtUp(AddUp(1.0, DivUp(double(n - 1), 2.0)));
  const double logit = AddUp(MulUp(2.0, wn), MulUp(2.0, SqrtUp(MulUp(double(n - 1), MulUp(w1, wn)))));
  L2OperatorCap cap;
  cap.value_path = UpperBound(MulUp(p_norm, std::min(sum_v_wq, through_cat)));
  cap.logit_path = UpperBound(MulUp(logit, std::min(sum_v_times_wq, through_cat)));
  cap.total = UpperBound(AddUp(cap.value_path.value(), cap.logit_path.value()));
  return cap;
}

}  // namespace lipcert
