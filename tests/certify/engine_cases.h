// Random engine test cases (layer, set, norm) and witnessed lower bounds over them, shared
// by the engine tests.
#pragma once

#include <random>

#include "certify/input_set.h"
#include "tests/certify/test_util.h"

namespace lipcert {
namespace testing_util {

struct Case {
  AttentionLayer layer;
  InputSet set;
  NormKind norm;
};

inline Case RandomCase(std::mt19937_64& rng) {
  Case c;
  c.layer = RandomLayer(rng);
  c.set = RandomSet(rng, std::uniform_int_distribution<int>(1, 4)(rng), c.layer.d_model);
  c.norm = std::uniform_int_distribution<int>(0, 1)(rng) ? NormKind::kL2 : NormKind::kLinf;
  return c;
}

// The largest witnessed value over a few samples of the set.
inline double WitnessedLower(std::mt19937_64& rng, const Case& c, int samples) {
  double best = JacobianNormMp(c.layer, c.set.center, c.norm);
  for (int s = 0; s < samples; ++s) {
    const Eigen::MatrixXd x = SamplePoint(rng, c.set, s % 2 == 0);
    best = std::max(best, JacobianNormMp(c.layer, x, c.norm));
    const Eigen::MatrixXd y = SamplePoint(rng, c.set, s % 3 == 0);
    if ((x - y).norm() > 0) best = std::max(best, DifferenceQuotientMp(c.layer, x, y, c.norm));
  }
  return best;
}

}  // namespace testing_util
}  // namespace lipcert
