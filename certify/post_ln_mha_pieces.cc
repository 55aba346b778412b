// MHA's pieces for the post-LN variation (certify/post_ln_variation.h): its certified bound,
// centre norm, variation and the variation's mean along the segment, from its certificate or
// from the centre_norm engine; and the heads before Wo.
#include <cmath>
#include <stdexcept>

#include "certify/centred_engine.h"
#include "certify/post_ln_variation.h"
#include "interval/rounding.h"

namespace lipcert {

MhaPieces MhaPiecesOf(const Certificate& c) {
  MhaPieces m;
  m.upper = c.upper_bound;
  for (const EngineResult& e : c.engines) {
    if (e.id != EngineId::kCentreNorm || !e.applied || !std::isfinite(e.upper.value()) || !e.centre_norm) continue;
    if (e.centre_norm->centre.value() < m.centre.value()) m.centre = e.centre_norm->centre;
    if (e.centre_norm->variation.value() < m.variation.value()) m.variation = e.centre_norm->variation;
    if (e.centre_norm->mean_variation.value() < m.mean_variation.value()) m.mean_variation = e.centre_norm->mean_variation;
  }
  return m;
}

MhaPieces MhaPiecesOver(const AttentionLayer& mha, const TokenCover& cover, NormKind p, int threads) {
  BoundOptions o;
  o.norm = p;
  o.threads = threads;
  const EngineBound e = CentreNormBound(mha, cover, o, 1L << 30);
  MhaPieces m;
  m.upper = e.upper;
  if (!std::isfinite(e.upper.value()) || e.terms.empty()) return m;
  if (e.centre_norm) m.mean_variation = e.centre_norm->mean_variation;
  m.centre = e.terms.at(0).value;
  double v = 0;  // the terms after the centre are the variation's
  for (size_t i = 1; i < e.terms.size(); ++i) v = AddUp(v, e.terms[i].value.value());
  m.variation = UpperBound(v);
  return m;
}

AttentionLayer HeadsBeforeWo(const AttentionLayer& mha) {
  if (mha.wo.rows() != mha.d_model || mha.wo.cols() != mha.d_model)
    throw std::invalid_argument("HeadsBeforeWo: Wo is not D x D");
  AttentionLayer h = mha;
  h.wo = Eigen::MatrixXd::Identity(mha.d_model, mha.d_model);
  if (h.bo.size()) h.bo.setZero();
  return h;
}

}  // namespace lipcert
