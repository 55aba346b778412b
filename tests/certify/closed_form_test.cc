// Closed-form bounds: the Lambert W upper bound and Kim et al.'s published values.
#include <gtest/gtest.h>

#include "certify/closed_form.h"

#include <cmath>
#include <utility>

#include "tests/certify/test_util.h"

namespace lipcert {
namespace {

using namespace testing_util;

TEST(ClosedFormTest, LambertW0UpperIsTightAndAbove) {
  for (double x : {0.0, 1e-300, 1e-8, 0.5, 1.0, 2.718281828459045, 10.0, 1e3, 1e300}) {
    const double w = LambertW0Upper(x);
    EXPECT_GE(w * std::exp(w), x * (1 - 1e-15));  // W0(x) <= w
    if (x > 0 && x < 1e300) {
      EXPECT_LE(w, std::nextafter(w, 0.0) + 1e-12 * w + 1e-300);
    }
  }
  EXPECT_NEAR(LambertW0Upper(1.0), 0.5671432904097838, 1e-14);
}

TEST(ClosedFormTest, KimBoundMatchesPublishedValuesForUnitWeights) {
  // D = H = 1, unit weights: the bound is sqrt(N) (4 W0((N-1)/e) + 1); attention-math.md
  // quotes 2.11, 5.40, 11.52, 18.68 at N = 2, 10, 100, 1000 for the per-token quantity.
  AttentionLayer L;
  L.kind = AttentionKind::kL2;
  L.d_model = L.heads = L.head_dim_qk = L.head_dim_v = 1;
  L.wq = L.wk = L.wv = L.wo = Eigen::MatrixXd::Ones(1, 1);
  for (auto [n, expected] : {std::pair{2, 2.11}, {10, 5.40}, {100, 11.52}, {1000, 18.68}}) {
    InputSet s;
    s.center = Eigen::MatrixXd::Zero(n, 1);
    s.radius = 1;
    const auto b = ClosedFormBounds(L, s, NormKind::kL2);
    ASSERT_EQ(b.size(), 1u);
    EXPECT_NEAR(b[0].upper.value() / std::sqrt(double(n)), expected, 0.01) << "N = " << n;
  }
}

}  // namespace
}  // namespace lipcert
