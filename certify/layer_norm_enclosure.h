// Rigorous enclosure of one LayerNorm row at a point x (D entries):
//   mean = sum_a x_a / D,  c_a = x_a - mean,  sigma = sqrt(sum_a c_a^2 / D + eps),
//   xhat_a = c_a / sigma,  z_a = gamma_a xhat_a + beta_a.
// Shared by the Jacobian bounds (the cover's centre) and the witness re-evaluation.
#pragma once

#include <Eigen/Dense>
#include <vector>

#include "interval/interval.h"
#include "models/attention_layer.h"

namespace lipcert {

struct LayerNormRowEnclosure {
  std::vector<Interval> centred;  // c_a = x_a - mean
  Interval sigma;                 // sqrt(mean of c^2 + eps)
  std::vector<Interval> xhat;     // c_a / sigma
  std::vector<Interval> z;        // gamma_a xhat_a + beta_a
};

inline LayerNormRowEnclosure EncloseLayerNormRow(const LayerNormParams& ln, const Eigen::RowVectorXd& x) {
  const Eigen::Index d = x.size();
  const Interval dd{double(d)};
  Interval sum(0.0);
  for (Eigen::Index a = 0; a < d; ++a) sum += Interval(x(a));
  const Interval mean = sum / dd;
  LayerNormRowEnclosure r;
  r.centred.resize(d);
  Interval sq(0.0);
  for (Eigen::Index a = 0; a < d; ++a) {
    r.centred[a] = Interval(x(a)) - mean;
    sq += Sqr(r.centred[a]);
  }
  r.sigma = Sqrt(sq / dd + Interval(ln.eps));
  r.xhat.resize(d);
  r.z.resize(d);
  for (Eigen::Index a = 0; a < d; ++a) {
    r.xhat[a] = r.centred[a] / r.sigma;
    r.z[a] = Interval(ln.gamma(a)) * r.xhat[a] + Interval(ln.beta(a));
  }
  return r;
}

}  // namespace lipcert
