#include "certify/closed_form.h"

#include <cmath>

#include "certify/jacobian_bounds.h"
#include "interval/elementary.h"
#include "interval/norms.h"

namespace lipcert {

double LambertW0Upper(double x) {
  if (x <= 0) return 0.0;
  // Newton on w e^w = x in double, then step up until w e^w >= x is proven.
  double w = x < 1 ? x : std::log(x);
  for (int i = 0; i < 100; ++i) {
    const double f = w * std::exp(w) - x;
    w -= f / (std::exp(w) * (w + 1));
  }
  if (!(w > 0)) w = x;
  // w e^w is increasing on w >= 0: if the lower bound of w e^w is >= x then W0(x) <= w.
  while (MulDown(w, ExpLower(w)) < x) w = AddUp(w, std::max(std::fabs(w) * 1e-15, 1e-300));
  return w;
}

namespace {

double MaxTokenNormUp(const TokenCover& c) {
  double r = 0;
  for (Eigen::Index i = 0; i < c.center.rows(); ++i) {
    double s = 0;
    for (Eigen::Index j = 0; j < c.center.cols(); ++j) s = AddUp(s, MulUp(c.center(i, j), c.center(i, j)));
    r = std::max(r, AddUp(SqrtUp(s), c.radius(i)));
  }
  return r;
}

// Stacks a bias column onto a weight block: [W b] (biases absent -> zero column).
Eigen::MatrixXd Augment(const Eigen::MatrixXd& w, const Eigen::VectorXd& b, int off) {
  Eigen::MatrixXd a(w.rows(), w.cols() + 1);
  a.leftCols(w.cols()) = w;
  a.col(w.cols()) = b.size() ? Eigen::VectorXd(b.segment(off, w.rows())) : Eigen::VectorXd::Zero(w.rows());
  return a;
}

}  // namespace

UpperBound CastinMhaUpperBound(const AttentionLayer& L, const TokenCover& z) {
  const int n = int(z.center.rows());
  const bool bias = L.has_bias();
  double r = MaxTokenNormUp(z);
  if (bias) r = SqrtUp(AddUp(MulUp(r, r), 1.0));
  const double r4 = MulUp(MulUp(r, r), MulUp(r, r));
  const double inv_sqrt_dk = DivUp(1.0, SqrtDown(double(L.head_dim_qk)));
  double total = 0;
  for (int h = 0; h < L.heads; ++h) {
    const int oq = h * L.head_dim_qk, ov = h * L.head_dim_v;
    Eigen::MatrixXd wq = L.wq_head(h), wk = L.wk_head(h), wv = L.wv_head(h);
    if (bias) {
      wq = Augment(wq, L.bq, oq);
      wk = Augment(wk, L.bk, oq);
      wv = Augment(wv, L.bv, ov);
    }
    // ||A||_2 <= ||Wq^T Wk||_2 / sqrt(dk), from k x k certificates (k = dk).
    const double a = MulUp(ProductNormL2Upper(wq, wk).value(), inv_sqrt_dk);
    const double inner = AddUp(MulUp(MulUp(MulUp(a, a), r4), double(4 * n + 1)), double(n));
    const double head = MulUp(MulUp(SqrtUp(3.0), NormL2Upper(wv).value()), SqrtUp(inner));
    total = AddUp(total, MulUp(NormL2Upper(Eigen::MatrixXd(L.wo_head(h))).value(), head));
  }
  return UpperBound(total);
}

namespace {

UpperBound Kim(const AttentionLayer& L, int n) {
  const double w0 = LambertW0Upper(DivUp(double(n - 1), ExpLower(1.0)));
  const double factor = AddUp(MulUp(4.0, w0), 1.0);
  double s = 0;
  for (int h = 0; h < L.heads; ++h) {
    const double q = NormL2Upper(Eigen::MatrixXd(L.wq_head(h))).value();
    const double v = NormL2Upper(Eigen::MatrixXd(L.wv_head(h))).value();
    // ||A_h|| <= ||Wq_h||^2 / sqrt(dk) carries the query weight twice (see closed_form.h).
    const double q2 = MulUp(q, q);
    s = AddUp(s, MulUp(MulUp(q2, q2), MulUp(v, v)));
  }
  const double pre = DivUp(SqrtUp(double(n)), SqrtDown(double(L.head_dim_qk)));
  return UpperBound(MulUp(MulUp(MulUp(pre, factor), SqrtUp(s)), NormL2Upper(L.wo).value()));
}

// Kim et al.'s l_inf bound (docs/engines.md, "Kim et al.'s l_inf bound"), in the form
//   Lip_inf <= (4 W0((N-1)/e) + 1/sqrt(dk)) min( sum_h ||Wo_h Wv_h Wq_h^T||_inf ||Wq_h||_inf,
//                                                ||Wo||_inf max_h ||Wv_h Wq_h^T||_inf ||Wq_h||_inf ),
// which is never above the published ||Wo||_inf max_h ||Wq_h||_1 ||Wq_h||_inf max_h ||Wv_h||_inf
// (nn.Linear convention) times the same factor.
UpperBound KimInf(const AttentionLayer& L, int n) {
  const double w0 = LambertW0Upper(DivUp(double(n - 1), ExpLower(1.0)));
  const double factor = AddUp(MulUp(4.0, w0), DivUp(1.0, SqrtDown(double(L.head_dim_qk))));
  double sum = 0, max_head = 0;
  for (int h = 0; h < L.heads; ++h) {
    const IntervalMatrix vq = Mul(Eigen::MatrixXd(L.wv_head(h)), Eigen::MatrixXd(L.wq_head(h).transpose()));
    const double q = NormInf(Eigen::MatrixXd(L.wq_head(h))).value();
    const double ovq = NormInfUpper(Mul(Eigen::MatrixXd(L.wo_head(h)), vq)).value();
    sum = AddUp(sum, MulUp(ovq, q));
    max_head = std::max(max_head, MulUp(NormInfUpper(vq).value(), q));
  }
  const double heads = std::min(sum, MulUp(NormInf(L.wo).value(), max_head));
  return UpperBound(MulUp(factor, heads));
}

}  // namespace

std::vector<ClosedFormBound> ClosedFormBounds(const AttentionLayer& L, const InputSet& set, NormKind norm) {
  std::vector<ClosedFormBound> out;
  if (L.causal) return out;
  if (L.post_ln()) return out;  // these forms bound MHA alone; see certify/post_layer_norm.h
  if (norm == NormKind::kLinf) {
    // The sublayer would need sup ||J_LN||_inf over the set; only bare L2 attention here.
    if (L.kind == AttentionKind::kL2 && !L.layer_norm) out.push_back({"closed_form/kim_inf", KimInf(L, set.tokens())});
    return out;
  }
  if (norm != NormKind::kL2) return out;
  double ell = 1;
  const TokenCover z = MhaInputCover(L, CoverOf(set), &ell);
  auto wrap = [&](UpperBound mha) {
    return L.layer_norm ? UpperBound(AddUp(1.0, MulUp(ell, mha.value()))) : mha;
  };
  if (L.kind == AttentionKind::kDot) out.push_back({"closed_form/castin", wrap(CastinMhaUpperBound(L, z))});
  if (L.kind == AttentionKind::kL2) out.push_back({"closed_form/kim", wrap(Kim(L, set.tokens()))});
  return out;
}

}  // namespace lipcert
