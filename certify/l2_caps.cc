#include "certify/l2_caps.h"

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

}  // namespace lipcert
