#include "certify/token_cover.h"

#include <algorithm>

namespace lipcert {

UpperBound JointRadiusUp(const TokenCover& cover) {
  double s = 0;
  for (Eigen::Index i = 0; i < cover.radius.size(); ++i) s = AddUp(s, MulUp(cover.radius(i), cover.radius(i)));
  return UpperBound(std::min(cover.frobenius.value(), SqrtUp(s)));
}

TokenCover CoverOf(const InputSet& set) {
  TokenCover c;
  c.center = set.center;
  c.radius = Eigen::VectorXd::Constant(set.tokens(), set.TokenRadius());
  c.frobenius = UpperBound(set.FrobeniusRadius());
  return c;
}

}  // namespace lipcert
