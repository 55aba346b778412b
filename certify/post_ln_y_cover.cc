#include "certify/post_ln_y_cover.h"

#include <algorithm>
#include <stdexcept>

#include "certify/attention_displacement.h"
#include "certify/post_layer_norm.h"
#include "interval/interval_matrix.h"
#include "interval/rounding.h"
#include "interval/vector_norms.h"

namespace lipcert {

namespace {

// Rows w_i - mean(w_i) enclosed, w_i = fl(c_i / ||c_i||) for the centred rows c_i of yc
// (any w works: the bound divides by ||w_i||); *w_norm >= ||w_i||.
IntervalMatrix CentredDirections(const Eigen::MatrixXd& yc, Eigen::VectorXd* w_norm) {
  const Eigen::Index n = yc.rows(), d = yc.cols();
  Eigen::MatrixXd lo(n, d), hi(n, d);
  w_norm->resize(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    Eigen::RowVectorXd c = yc.row(i).array() - yc.row(i).mean();
    const double cn = c.norm();
    const Eigen::RowVectorXd w = cn > 0 ? Eigen::RowVectorXd(c / cn) : Eigen::RowVectorXd::Zero(d);
    Interval sum(0.0);
    double w2 = 0;
    for (Eigen::Index a = 0; a < d; ++a) {
      sum = sum + Interval(w(a));
      w2 = AddUp(w2, MulUp(w(a), w(a)));
    }
    (*w_norm)(i) = SqrtUp(w2);
    const Interval mean = sum / Interval(double(d));
    for (Eigen::Index a = 0; a < d; ++a) {
      const Interval e = Interval(w(a)) - mean;
      lo(i, a) = e.lo;
      hi(i, a) = e.hi;
    }
  }
  return IntervalMatrix::FromBounds(lo, hi);
}

}  // namespace

MhaInput PostLnFactorsOver(const AttentionLayer& L, const TokenCover& y_cover, NormKind p) {
  AttentionLayer ln_only = L.WithoutPostLayerNorm();
  ln_only.layer_norm = *L.post_layer_norm;
  return MhaInputOver(ln_only, y_cover, p);
}

TokenCover PostLnYCover(const AttentionLayer& L, const TokenCover& cover, const Eigen::VectorXd& displacement,
                        ExpBackend exp_backend, UpperBound moved_frobenius) {
  if (!L.post_ln() || L.layer_norm) throw std::invalid_argument("PostLnYCover: the layer must be a post-LN sublayer");
  const Eigen::Index n = cover.center.rows();
  if (displacement.size() != n) throw std::invalid_argument("PostLnYCover: one displacement per token");
  const YEnclosure y0 = EncloseY(L, cover.center, exp_backend);
  TokenCover yc;
  yc.center = y0.centre;
  yc.radius.resize(n);
  const double joint = JointRadiusUp(cover).value();
  Eigen::VectorXd moved = displacement;
  AttentionDisplacement own;
  Eigen::VectorXd w_norm;
  IntervalMatrix dirs;
  const bool moving = joint > 0 && y0.finite;
  if (moving) {
    dirs = CentredDirections(y0.centre, &w_norm);
    own = AttentionDisplacementOver(L.WithoutPostLayerNorm(), cover, &dirs);
    moved = moved.cwiseMin(own.norm);
  }
  double moved2 = 0;
  for (Eigen::Index i = 0; i < n; ++i) {
    moved2 = AddUp(moved2, MulUp(moved(i), moved(i)));
    yc.radius(i) = AddUp(AddUp(cover.radius(i), moved(i)), y0.err(i));
  }
  // ||Y - Yc||_F <= ||X - X0||_F + ||M(X) - M(X0)||_F + ||err||_F, the middle one at most the
  // norm of the displacements (they bound each row).
  const double moved_f = std::min(SqrtUp(moved2), moved_frobenius.value());
  yc.frobenius = UpperBound(AddUp(AddUp(joint, moved_f), y0.err_frobenius));
  if (!moving) return yc;
  yc.centred_lo.resize(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    const IntervalMatrix wi(dirs.mid.row(i).transpose(), dirs.rad.row(i).transpose());
    const double toward = Dot(IntervalMatrix::Point(y0.centre.row(i).transpose()), wi).lo;
    const double wt = NormUpOfMagnitudes(RowMagnitude(dirs, i), VectorNorm::kTwo);
    const double sideways = AddUp(MulUp(wt, AddUp(cover.radius(i), y0.err(i))), std::min(own.along(i), MulUp(wt, moved(i))));
    yc.centred_lo(i) = w_norm(i) > 0 ? std::max(0.0, DivDown(SubDown(toward, sideways), w_norm(i))) : 0.0;
  }
  return yc;
}

TokenCover PostLnYCoverAtPoint(const AttentionLayer& L, const Eigen::MatrixXd& x0) {
  const Eigen::Index n = x0.rows();
  return PostLnYCover(L, TokenCover{x0, Eigen::VectorXd::Zero(n), UpperBound(0), {}}, Eigen::VectorXd::Zero(n));
}

}  // namespace lipcert
