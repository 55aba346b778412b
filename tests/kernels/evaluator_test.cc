// The batched Jacobian-norm evaluator (kernels/evaluator.h), one suite for every back end:
// each operation at each point against the per-point reference of models/forward.h
// (Evaluate, Jvp, Vjp, DenseJacobian and its SVD), for every layer kind, in f64 and f32.
// The CUDA instances exist only in a build with CUDA and skip themselves, with the reason,
// when no device is present.
//
// Tolerances are per operation and per back end / compute type (Tolerances below); all are
// relative (to the largest entry of the reference, or to sigma_1).
#include "kernels/evaluator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "models/forward.h"
#include "tests/kernels/test_layers.h"

namespace lipcert {
namespace {

using testing::AllEvaluatorCases;
using testing::AllLayerCases;
using testing::EvaluatorCase;
using testing::EvaluatorCaseName;
using testing::PointAt;
using testing::RandomLayer;
using testing::RandomPoints;

constexpr int kN = 4, kD = 6, kH = 2;  // N*D = 24: dense SVD is cheap

double MaxAbs(const Eigen::MatrixXd& m) { return m.cwiseAbs().maxCoeff(); }

// Per-operation tolerances of one back end and compute type.
struct Tolerances {
  double product;          // Forward, Jvp, Vjp: max |error| / max |reference|
  double pair_gradient;    // PairGradient against central differences of the reference
  double rel_tol_sigma;    // stopping rule of the singular-value tests
  double rel_tol_grad;     // stopping rule of the sigma-gradient test
  double sigma;            // |sigma - sigma_1(dense)| / sigma_1
  double unit;             // | ||u|| - 1 |, | ||v|| - 1 |
  double jv_residual;      // ||J v - sigma u|| / sigma_1 (J dense)
  double jtu_residual;     // ||J^T u - sigma v|| / sigma_1 (what the stopping rule allows)
  double sigma_gradient;   // grad sigma_1 . w against central differences of dense sigma_1
  double power;            // fixed-work power iteration against the same iteration on dense J
};

Tolerances TolerancesFor(Device device, DType dtype) {
  const bool f64 = dtype == DType::kF64;
  if (device == Device::kCpu)
    return f64 ? Tolerances{1e-12, 1e-6, 1e-9, 1e-12, 1e-9, 1e-12, 1e-12, 1e-7, 1e-5, 1e-10}
               : Tolerances{1e-4, 1e-3, 1e-6, 1e-6, 1e-5, 1e-6, 1e-5, 1e-3, 2e-2, 1e-4};
  // CUDA: PairGradient is a central difference of the VJP on the device (error ~ eps^(2/3)
  // times the third derivative), hence the looser gradient tolerances.
  return f64 ? Tolerances{1e-10, 1e-5, 1e-9, 1e-10, 1e-8, 1e-10, 1e-10, 1e-7, 1e-4, 1e-9}
             : Tolerances{1e-4, 2e-2, 1e-6, 1e-6, 1e-4, 1e-5, 1e-4, 1e-3, 5e-2, 1e-3};
}

class EvaluatorTest : public ::testing::TestWithParam<EvaluatorCase> {
 protected:
  void SetUp() override {
    if (GetParam().device == Device::kCuda && !CudaAvailable())
      GTEST_SKIP() << "CUDA evaluator not tested: " << CudaUnavailableReason();
    layer_ = RandomLayer(GetParam().c, kD, kH, 17);
    opts_.device = GetParam().device;
    opts_.dtype = GetParam().dtype;
    opts_.threads = 2;
    tol_ = TolerancesFor(GetParam().device, GetParam().dtype);
  }

  AttentionLayer layer_;
  EvaluatorOptions opts_;
  Tolerances tol_;
};

TEST_P(EvaluatorTest, ForwardJvpVjpMatchReference) {
  auto ev = MakeJacobianEvaluator(layer_, kN, opts_);
  int checked = 0;
  // Two batch sizes on one evaluator: its buffers grow between the calls.
  for (int batch : {2, int(testing::Count(7))}) {
    const std::vector<double> x = RandomPoints(batch, kN, kD, 1 + batch);
    const std::vector<double> dx = RandomPoints(batch, kN, kD, 2 + batch);
    const std::vector<double> gu = RandomPoints(batch, kN, kD, 3 + batch);
    std::vector<double> y(x.size()), jv(x.size()), ju(x.size());
    ev->Forward(x.data(), batch, y.data());
    ev->Jvp(x.data(), dx.data(), batch, jv.data());
    ev->Vjp(x.data(), gu.data(), batch, ju.data());
    for (int b = 0; b < batch; ++b) {
      const LayerState<double> s = Evaluate(layer_, PointAt(x, b, kN, kD));
      const Eigen::MatrixXd ry = s.y;
      const Eigen::MatrixXd rjv = Jvp(layer_, s, PointAt(dx, b, kN, kD));
      const Eigen::MatrixXd rju = Vjp(layer_, s, PointAt(gu, b, kN, kD));
      ASSERT_GT(MaxAbs(rjv), 0) << "point " << b;
      EXPECT_LE(MaxAbs(PointAt(y, b, kN, kD) - ry), tol_.product * MaxAbs(ry)) << "forward, point " << b;
      EXPECT_LE(MaxAbs(PointAt(jv, b, kN, kD) - rjv), tol_.product * MaxAbs(rjv)) << "jvp, point " << b;
      EXPECT_LE(MaxAbs(PointAt(ju, b, kN, kD) - rju), tol_.product * MaxAbs(rju)) << "vjp, point " << b;
      ++checked;
    }
  }
  EXPECT_GE(checked, 9);
}

// Products at one point, many times (the deflation's Lanczos basis): the same values as
// the reference at every call, with the point's buffer overwritten after ProductsAt.
TEST_P(EvaluatorTest, ProductsAtOnePointMatchReference) {
  auto ev = MakeJacobianEvaluator(layer_, kN, opts_);
  std::vector<double> x = RandomPoints(1, kN, kD, 5);
  const LayerState<double> s = Evaluate(layer_, PointAt(x, 0, kN, kD));
  const std::unique_ptr<PointProducts> at_x = ev->ProductsAt(x.data());
  std::fill(x.begin(), x.end(), 0.0);  // copied: the products keep the point they were given
  int checked = 0;
  for (int call = 0; call < 4; ++call) {
    const std::vector<double> v = RandomPoints(1, kN, kD, 40 + call), u = RandomPoints(1, kN, kD, 50 + call);
    std::vector<double> jv(v.size()), ju(u.size());
    at_x->Jvp(v.data(), jv.data());
    at_x->Vjp(u.data(), ju.data());
    const Eigen::MatrixXd rjv = Jvp(layer_, s, PointAt(v, 0, kN, kD));
    const Eigen::MatrixXd rju = Vjp(layer_, s, PointAt(u, 0, kN, kD));
    ASSERT_GT(MaxAbs(rjv), 0) << "call " << call;
    EXPECT_LE(MaxAbs(PointAt(jv, 0, kN, kD) - rjv), tol_.product * MaxAbs(rjv)) << "jvp, call " << call;
    EXPECT_LE(MaxAbs(PointAt(ju, 0, kN, kD) - rju), tol_.product * MaxAbs(rju)) << "vjp, call " << call;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

TEST_P(EvaluatorTest, PairGradientMatchesCentralDifferences) {
  const int batch = 3;
  auto ev = MakeJacobianEvaluator(layer_, kN, opts_);
  const std::vector<double> x = RandomPoints(batch, kN, kD, 5);
  const std::vector<double> u = RandomPoints(batch, kN, kD, 6);
  const std::vector<double> v = RandomPoints(batch, kN, kD, 7);
  std::vector<double> g(x.size());
  ev->PairGradient(x.data(), u.data(), v.data(), batch, g.data());
  const double h = 1e-5;
  int checked = 0;
  for (int b = 0; b < batch; ++b) {
    const Eigen::MatrixXd xb = PointAt(x, b, kN, kD), ub = PointAt(u, b, kN, kD), vb = PointAt(v, b, kN, kD);
    const Eigen::MatrixXd gb = PointAt(g, b, kN, kD);
    // (1) d/dt J(x + t v)^T u, central difference of the reference VJP.
    const Eigen::MatrixXd fd = (Vjp(layer_, Evaluate(layer_, Eigen::MatrixXd(xb + h * vb)), ub) -
                                Vjp(layer_, Evaluate(layer_, Eigen::MatrixXd(xb - h * vb)), ub)) /
                               (2 * h);
    ASSERT_GT(MaxAbs(fd), 0) << "point " << b;
    EXPECT_LE(MaxAbs(gb - fd), tol_.pair_gradient * MaxAbs(fd)) << "point " << b;
    // (2) directional derivatives of <u, J(x) v> along random w.
    for (int k = 0; k < 3; ++k) {
      const Eigen::MatrixXd w = PointAt(RandomPoints(1, kN, kD, 100 + k), 0, kN, kD);
      auto pair = [&](const Eigen::MatrixXd& xx) {
        return (ub.array() * Jvp(layer_, Evaluate(layer_, xx), vb).array()).sum();
      };
      const double d = (pair(xb + h * w) - pair(xb - h * w)) / (2 * h);
      const double got = (gb.array() * w.array()).sum();
      EXPECT_NEAR(got, d, tol_.pair_gradient * (std::abs(d) + gb.norm() * w.norm() * 1e-2))
          << "point " << b << " direction " << k;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * batch);
}

TEST_P(EvaluatorTest, TopSingularMatchesDenseSvd) {
  const int batch = int(testing::Count(3));
  opts_.rel_tol = tol_.rel_tol_sigma;
  auto ev = MakeJacobianEvaluator(layer_, kN, opts_);
  const std::vector<double> x = RandomPoints(batch, kN, kD, 4);
  const TopSingular r = ev->TopSingularValues(x.data(), batch, false);
  ASSERT_EQ(r.sigma.size(), size_t(batch));
  ASSERT_EQ(r.u.size(), x.size());
  ASSERT_EQ(r.v.size(), x.size());
  for (int b = 0; b < batch; ++b) {
    const Eigen::MatrixXd j = DenseJacobian(layer_, PointAt(x, b, kN, kD));
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(j);
    const double s1 = svd.singularValues()(0);
    ASSERT_GT(s1, 0);
    const Eigen::Map<const Eigen::VectorXd> u(&r.u[size_t(b) * kN * kD], kN * kD);
    const Eigen::Map<const Eigen::VectorXd> v(&r.v[size_t(b) * kN * kD], kN * kD);
    EXPECT_TRUE(r.converged[b]) << "point " << b << " iterations " << r.iterations[b];
    EXPECT_NEAR(r.sigma[b], s1, tol_.sigma * s1) << "point " << b;
    EXPECT_NEAR(v.norm(), 1.0, tol_.unit);
    EXPECT_NEAR(u.norm(), 1.0, tol_.unit);
    // J v = sigma u (by construction, checked with the dense J) and J^T u = sigma v (the
    // stopping rule: residual <= rel_tol sigma^2, i.e. ||J^T u - sigma v|| <= rel_tol sigma).
    EXPECT_LE((j * v - r.sigma[b] * u).norm(), tol_.jv_residual * s1);
    EXPECT_LE((j.transpose() * u - r.sigma[b] * v).norm(), tol_.jtu_residual * s1);
  }
}

TEST_P(EvaluatorTest, SigmaGradientMatchesCentralDifferences) {
  const int batch = 2;
  opts_.rel_tol = tol_.rel_tol_grad;
  auto ev = MakeJacobianEvaluator(layer_, kN, opts_);
  const std::vector<double> x = RandomPoints(batch, kN, kD, 8);
  const TopSingular r = ev->TopSingularValues(x.data(), batch, /*want_grad=*/true);
  ASSERT_EQ(r.grad.size(), x.size());
  auto sigma1 = [&](const Eigen::MatrixXd& xx) {
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(DenseJacobian(layer_, xx));
    return svd.singularValues()(0);
  };
  const double h = 1e-5;
  int checked = 0;
  for (int b = 0; b < batch; ++b) {
    const Eigen::MatrixXd xb = PointAt(x, b, kN, kD), gb = PointAt(r.grad, b, kN, kD);
    ASSERT_GT(gb.norm(), 0) << "point " << b;
    for (int k = 0; k < 3; ++k) {
      const Eigen::MatrixXd w = PointAt(RandomPoints(1, kN, kD, 200 + k), 0, kN, kD);
      const double d = (sigma1(xb + h * w) - sigma1(xb - h * w)) / (2 * h);
      const double got = (gb.array() * w.array()).sum();
      EXPECT_NEAR(got, d, tol_.sigma_gradient * (std::abs(d) + gb.norm() * w.norm() * 1e-2))
          << "point " << b << " direction " << k;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * batch);
}

TEST_P(EvaluatorTest, FixedWorkPowerIterationMatchesDenseIteration) {
  // rel_tol 0: exactly max_iters products of J^T J from the default start vector; the
  // same iteration with the dense J gives the expected sigma = ||J v||.
  const int batch = 3, iters = 30, nd = kN * kD;
  opts_.method = SingularMethod::kPower;
  opts_.rel_tol = 0;
  opts_.max_iters = iters;
  const std::vector<double> x = RandomPoints(batch, kN, kD, 71);
  const TopSingular r = MakeJacobianEvaluator(layer_, kN, opts_)->TopSingularValues(x.data(), batch, false);
  EXPECT_EQ(r.iterations, std::vector<int>(batch, iters));
  for (int b = 0; b < batch; ++b) {
    const Eigen::MatrixXd j = DenseJacobian(layer_, PointAt(x, b, kN, kD));
    Eigen::VectorXd v(nd);
    DefaultStartVector(b, nd, v.data());
    for (int it = 0; it < iters; ++it) v = (j.transpose() * (j * v)).normalized();
    const double expected = (j * v).norm();
    ASSERT_GT(expected, 0);
    EXPECT_NEAR(r.sigma[b], expected, tol_.power * expected) << "point " << b;
  }
}

TEST_P(EvaluatorTest, LargerSizeWithRestartsMatchesDenseSvd) {
  // N*D = 8*16 = 128, 4 heads, Krylov dimension 8: exercises Lanczos restarts.
  const int n = 8, d = 16;
  const AttentionLayer L = RandomLayer(GetParam().c, d, 4, 5);
  const std::vector<double> x = RandomPoints(2, n, d, 12);
  opts_.krylov_dim = 8;
  opts_.rel_tol = tol_.rel_tol_sigma;
  const TopSingular r = MakeJacobianEvaluator(L, n, opts_)->TopSingularValues(x.data(), 2, false);
  for (int b = 0; b < 2; ++b) {
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(DenseJacobian(L, PointAt(x, b, n, d)));
    const double s1 = svd.singularValues()(0);
    EXPECT_TRUE(r.converged[b]) << "point " << b << " iterations " << r.iterations[b];
    // The top singular value may be close to the second one at this size: 10x the slack.
    EXPECT_NEAR(r.sigma[b], s1, 10 * tol_.sigma * s1) << "point " << b;
  }
}

TEST_P(EvaluatorTest, ThreadsGiveTheSameResultAsOneThread) {
  if (GetParam().device != Device::kCpu) GTEST_SKIP() << "threads is an option of the CPU back end";
  const int batch = 5;
  const std::vector<double> x = RandomPoints(batch, kN, kD, 9);
  opts_.threads = 1;
  const TopSingular one = MakeJacobianEvaluator(layer_, kN, opts_)->TopSingularValues(x.data(), batch, true);
  opts_.threads = 3;
  const TopSingular three = MakeJacobianEvaluator(layer_, kN, opts_)->TopSingularValues(x.data(), batch, true);
  ASSERT_EQ(one.sigma.size(), size_t(batch));
  EXPECT_EQ(one.sigma, three.sigma);
  EXPECT_EQ(one.u, three.u);
  EXPECT_EQ(one.v, three.v);
  EXPECT_EQ(one.grad, three.grad);
  EXPECT_EQ(one.iterations, three.iterations);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, EvaluatorTest, ::testing::ValuesIn(AllEvaluatorCases()),
                         EvaluatorCaseName);

// ---- not parameterised ----

TEST(EvaluatorOptionsTest, RefusesBadOptionsNamingTheField) {
  const AttentionLayer L = RandomLayer(AllLayerCases()[0], kD, kH, 1);
  int refused = 0;
  auto expect_throw = [&](EvaluatorOptions o, int tokens, const std::string& field,
                          const AttentionLayer* layer = nullptr) {
    try {
      MakeJacobianEvaluator(layer ? *layer : L, tokens, o);
      ADD_FAILURE() << "no exception for " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      ++refused;
    }
  };
  EvaluatorOptions o;
  expect_throw(o, 0, "evaluator.tokens");
  o.threads = -1;
  expect_throw(o, kN, "evaluator.threads");
  o = EvaluatorOptions();
  o.rel_tol = -1;
  expect_throw(o, kN, "evaluator.rel_tol");
  o = EvaluatorOptions();
  o.max_iters = 0;
  expect_throw(o, kN, "evaluator.max_iters");
  o = EvaluatorOptions();
  o.krylov_dim = 1;
  expect_throw(o, kN, "evaluator.krylov_dim");
  AttentionLayer bad = L;
  bad.wq.resize(1, 1);
  expect_throw(EvaluatorOptions(), kN, "evaluator.layer", &bad);
  EXPECT_EQ(refused, 6);
  if (!CudaAvailable()) {
    o = EvaluatorOptions();
    o.device = Device::kCuda;
    expect_throw(o, kN, "evaluator.device");
    EXPECT_EQ(DefaultDevice(), Device::kCpu);
  }
}

TEST(EvaluatorOptionsTest, EnumStringsRoundTrip) {
  for (Device d : {Device::kCpu, Device::kCuda}) {
    Device back;
    ASSERT_TRUE(StringToDevice(DeviceToString(d), &back));
    EXPECT_EQ(back, d);
  }
  for (DType t : {DType::kF32, DType::kF64}) {
    DType back;
    ASSERT_TRUE(StringToDType(DTypeToString(t), &back));
    EXPECT_EQ(back, t);
  }
  for (SingularMethod m : {SingularMethod::kLanczos, SingularMethod::kPower}) {
    SingularMethod back;
    ASSERT_TRUE(StringToSingularMethod(SingularMethodToString(m), &back));
    EXPECT_EQ(back, m);
  }
  EXPECT_FALSE(StringToDevice("gpu", nullptr));
}

TEST(EvaluatorTopSingularTest, PowerAndLanczosAgreeAndSeedingWithTheAnswerConvergesAtOnce) {
  const AttentionLayer L = RandomLayer(AllLayerCases()[0], kD, kH, 3);
  const std::vector<double> x = RandomPoints(2, kN, kD, 11);
  EvaluatorOptions o;
  o.rel_tol = 1e-10;
  const TopSingular lz = MakeJacobianEvaluator(L, kN, o)->TopSingularValues(x.data(), 2, false);
  o.method = SingularMethod::kPower;
  o.max_iters = 20000;
  const TopSingular pw = MakeJacobianEvaluator(L, kN, o)->TopSingularValues(x.data(), 2, false);
  for (int b = 0; b < 2; ++b) {
    EXPECT_NEAR(lz.sigma[b], pw.sigma[b], 1e-8 * lz.sigma[b]);
    EXPECT_LE(lz.iterations[b], pw.iterations[b]);
  }
  o = EvaluatorOptions();
  const TopSingular seeded =
      MakeJacobianEvaluator(L, kN, o)->TopSingularValues(x.data(), 2, false, lz.v.data());
  for (int b = 0; b < 2; ++b) {
    EXPECT_LE(seeded.iterations[b], 2);
    EXPECT_NEAR(seeded.sigma[b], lz.sigma[b], 1e-9 * lz.sigma[b]);
  }
}

}  // namespace
}  // namespace lipcert
