// The CPU engine against the per-point reference models/forward.h, for every layer kind
// and both compute types.
#include "kernels/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "models/forward.h"
#include "tests/kernels/test_layers.h"

namespace lipcert {
namespace {

using testing::AllLayerCases;
using testing::AllEngineCases;
using testing::EngineCase;
using testing::EngineCaseName;
using testing::PointAt;
using testing::RandomLayer;
using testing::RandomPoints;

constexpr int kN = 4, kD = 6, kH = 2;  // N*D = 24: dense SVD is cheap

double MaxAbs(const Eigen::MatrixXd& m) { return m.cwiseAbs().maxCoeff(); }

class EngineTest : public ::testing::TestWithParam<EngineCase> {
 protected:
  void SetUp() override {
    layer_ = RandomLayer(GetParam().c, kD, kH, 17);
    opts_.dtype = GetParam().dtype;
    opts_.threads = 2;
  }
  bool f64() const { return GetParam().dtype == DType::kF64; }
  // Relative tolerance of one product against the double reference.
  double ProductTol() const { return f64() ? 1e-12 : 1e-4; }

  AttentionLayer layer_;
  EngineOptions opts_;
};

TEST_P(EngineTest, ForwardJvpVjpMatchReference) {
  const int batch = int(testing::Count(3));
  auto eng = MakeJacobianEngine(layer_, kN, opts_);
  const std::vector<double> x = RandomPoints(batch, kN, kD, 1);
  const std::vector<double> dx = RandomPoints(batch, kN, kD, 2);
  const std::vector<double> gu = RandomPoints(batch, kN, kD, 3);
  std::vector<double> y(x.size()), jv(x.size()), ju(x.size());
  eng->Forward(x.data(), batch, y.data());
  eng->Jvp(x.data(), dx.data(), batch, jv.data());
  eng->Vjp(x.data(), gu.data(), batch, ju.data());
  for (int b = 0; b < batch; ++b) {
    const Eigen::MatrixXd xb = PointAt(x, b, kN, kD);
    const LayerState<double> s = Evaluate(layer_, xb);
    const Eigen::MatrixXd ry = s.y;
    const Eigen::MatrixXd rjv = Jvp(layer_, s, Eigen::MatrixXd(PointAt(dx, b, kN, kD)));
    const Eigen::MatrixXd rju = Vjp(layer_, s, Eigen::MatrixXd(PointAt(gu, b, kN, kD)));
    EXPECT_LE(MaxAbs(PointAt(y, b, kN, kD) - ry), ProductTol() * MaxAbs(ry)) << "forward, point " << b;
    EXPECT_LE(MaxAbs(PointAt(jv, b, kN, kD) - rjv), ProductTol() * MaxAbs(rjv)) << "jvp, point " << b;
    EXPECT_LE(MaxAbs(PointAt(ju, b, kN, kD) - rju), ProductTol() * MaxAbs(rju)) << "vjp, point " << b;
  }
}

TEST_P(EngineTest, TopSingularMatchesDenseSvd) {
  const int batch = int(testing::Count(3));
  opts_.rel_tol = f64() ? 1e-9 : 1e-6;
  auto eng = MakeJacobianEngine(layer_, kN, opts_);
  const std::vector<double> x = RandomPoints(batch, kN, kD, 4);
  const TopSingular r = eng->TopSingularValues(x.data(), batch, false);
  ASSERT_EQ(r.sigma.size(), size_t(batch));
  for (int b = 0; b < batch; ++b) {
    const Eigen::MatrixXd j = DenseJacobian(layer_, Eigen::MatrixXd(PointAt(x, b, kN, kD)));
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(j);
    const double s1 = svd.singularValues()(0);
    const Eigen::Map<const Eigen::VectorXd> u(&r.u[size_t(b) * kN * kD], kN * kD);
    const Eigen::Map<const Eigen::VectorXd> v(&r.v[size_t(b) * kN * kD], kN * kD);
    EXPECT_TRUE(r.converged[b]) << "point " << b << " iterations " << r.iterations[b];
    EXPECT_NEAR(r.sigma[b], s1, (f64() ? 1e-9 : 1e-5) * s1) << "point " << b;
    EXPECT_NEAR(v.norm(), 1.0, f64() ? 1e-12 : 1e-6);
    EXPECT_NEAR(u.norm(), 1.0, f64() ? 1e-12 : 1e-6);
    // J v = sigma u (by construction, checked with the dense J) and J^T u = sigma v (the
    // stopping rule: residual <= rel_tol sigma^2, i.e. ||J^T u - sigma v|| <= rel_tol sigma).
    EXPECT_LE((j * v - r.sigma[b] * u).norm(), (f64() ? 1e-12 : 1e-5) * s1);
    EXPECT_LE((j.transpose() * u - r.sigma[b] * v).norm(), (f64() ? 1e-7 : 1e-3) * s1);
  }
}

TEST_P(EngineTest, PairGradientMatchesCentralDifferences) {
  const int batch = 2;
  auto eng = MakeJacobianEngine(layer_, kN, opts_);
  const std::vector<double> x = RandomPoints(batch, kN, kD, 5);
  const std::vector<double> u = RandomPoints(batch, kN, kD, 6);
  const std::vector<double> v = RandomPoints(batch, kN, kD, 7);
  std::vector<double> g(x.size());
  eng->PairGradient(x.data(), u.data(), v.data(), batch, g.data());
  const double h = 1e-5;
  for (int b = 0; b < batch; ++b) {
    const Eigen::MatrixXd xb = PointAt(x, b, kN, kD), ub = PointAt(u, b, kN, kD), vb = PointAt(v, b, kN, kD);
    const Eigen::MatrixXd gb = PointAt(g, b, kN, kD);
    // (1) d/dt J(x + t v)^T u, central difference of the reference VJP.
    const Eigen::MatrixXd fd = (Vjp(layer_, Evaluate(layer_, Eigen::MatrixXd(xb + h * vb)), ub) -
                                Vjp(layer_, Evaluate(layer_, Eigen::MatrixXd(xb - h * vb)), ub)) /
                               (2 * h);
    EXPECT_LE(MaxAbs(gb - fd), (f64() ? 1e-6 : 1e-3) * MaxAbs(fd)) << "point " << b;
    // (2) directional derivatives of <u, J(x) v> along random w.
    for (int k = 0; k < 3; ++k) {
      const Eigen::MatrixXd w = PointAt(RandomPoints(1, kN, kD, 100 + k), 0, kN, kD);
      auto pair = [&](const Eigen::MatrixXd& xx) {
        return (ub.array() * Jvp(layer_, Evaluate(layer_, xx), vb).array()).sum();
      };
      const double d = (pair(xb + h * w) - pair(xb - h * w)) / (2 * h);
      const double got = (gb.array() * w.array()).sum();
      EXPECT_NEAR(got, d, (f64() ? 1e-6 : 1e-3) * (std::abs(d) + gb.norm() * w.norm() * 1e-2))
          << "point " << b << " direction " << k;
    }
  }
}

TEST_P(EngineTest, SigmaGradientMatchesCentralDifferences) {
  const int batch = 2;
  opts_.rel_tol = f64() ? 1e-12 : 1e-6;
  auto eng = MakeJacobianEngine(layer_, kN, opts_);
  const std::vector<double> x = RandomPoints(batch, kN, kD, 8);
  const TopSingular r = eng->TopSingularValues(x.data(), batch, /*want_grad=*/true);
  ASSERT_EQ(r.grad.size(), x.size());
  auto sigma1 = [&](const Eigen::MatrixXd& xx) {
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(DenseJacobian(layer_, xx));
    return svd.singularValues()(0);
  };
  const double h = 1e-5;
  for (int b = 0; b < batch; ++b) {
    const Eigen::MatrixXd xb = PointAt(x, b, kN, kD), gb = PointAt(r.grad, b, kN, kD);
    for (int k = 0; k < 3; ++k) {
      const Eigen::MatrixXd w = PointAt(RandomPoints(1, kN, kD, 200 + k), 0, kN, kD);
      const double d = (sigma1(xb + h * w) - sigma1(xb - h * w)) / (2 * h);
      const double got = (gb.array() * w.array()).sum();
      EXPECT_NEAR(got, d, (f64() ? 1e-5 : 2e-2) * (std::abs(d) + gb.norm() * w.norm() * 1e-2))
          << "point " << b << " direction " << k;
    }
  }
}

TEST_P(EngineTest, ThreadsGiveTheSameResultAsOneThread) {
  const int batch = 5;
  const std::vector<double> x = RandomPoints(batch, kN, kD, 9);
  opts_.threads = 1;
  const TopSingular one = MakeJacobianEngine(layer_, kN, opts_)->TopSingularValues(x.data(), batch, true);
  opts_.threads = 3;
  const TopSingular three = MakeJacobianEngine(layer_, kN, opts_)->TopSingularValues(x.data(), batch, true);
  EXPECT_EQ(one.sigma, three.sigma);
  EXPECT_EQ(one.u, three.u);
  EXPECT_EQ(one.v, three.v);
  EXPECT_EQ(one.grad, three.grad);
  EXPECT_EQ(one.iterations, three.iterations);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, EngineTest, ::testing::ValuesIn(AllEngineCases()), EngineCaseName);

// ---- not parameterised ----

TEST(EngineOptionsTest, RefusesBadOptionsNamingTheField) {
  const AttentionLayer L = RandomLayer(AllLayerCases()[0], kD, kH, 1);
  auto expect_throw = [&](EngineOptions o, int tokens, const std::string& field,
                          const AttentionLayer* layer = nullptr) {
    try {
      MakeJacobianEngine(layer ? *layer : L, tokens, o);
      ADD_FAILURE() << "no exception for " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  EngineOptions o;
  expect_throw(o, 0, "engine.tokens");
  o.threads = -1;
  expect_throw(o, kN, "engine.threads");
  o = EngineOptions();
  o.rel_tol = -1;
  expect_throw(o, kN, "engine.rel_tol");
  o = EngineOptions();
  o.max_iters = 0;
  expect_throw(o, kN, "engine.max_iters");
  o = EngineOptions();
  o.krylov_dim = 1;
  expect_throw(o, kN, "engine.krylov_dim");
  AttentionLayer bad = L;
  bad.wq.resize(1, 1);
  expect_throw(EngineOptions(), kN, "engine.layer", &bad);
  if (!CudaAvailable()) {
    o = EngineOptions();
    o.device = Device::kCuda;
    expect_throw(o, kN, "engine.device");
    EXPECT_EQ(DefaultDevice(), Device::kCpu);
  }
}

TEST(EngineOptionsTest, EnumStringsRoundTrip) {
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
  SingularMethod m;
  EXPECT_TRUE(StringToSingularMethod("power", &m));
  EXPECT_EQ(m, SingularMethod::kPower);
  EXPECT_FALSE(StringToDevice("gpu", nullptr));
}

TEST(EngineTopSingularTest, PowerAndLanczosAgreeAndFixedWorkRunsMaxIters) {
  const AttentionLayer L = RandomLayer(AllLayerCases()[0], kD, kH, 3);
  const std::vector<double> x = RandomPoints(2, kN, kD, 11);
  EngineOptions o;
  o.rel_tol = 1e-10;
  const TopSingular lz = MakeJacobianEngine(L, kN, o)->TopSingularValues(x.data(), 2, false);
  o.method = SingularMethod::kPower;
  o.max_iters = 20000;
  const TopSingular pw = MakeJacobianEngine(L, kN, o)->TopSingularValues(x.data(), 2, false);
  for (int b = 0; b < 2; ++b) {
    EXPECT_NEAR(lz.sigma[b], pw.sigma[b], 1e-8 * lz.sigma[b]);
    EXPECT_LE(lz.iterations[b], pw.iterations[b]);
  }
  o.rel_tol = 0;
  o.max_iters = 30;
  const TopSingular fixed = MakeJacobianEngine(L, kN, o)->TopSingularValues(x.data(), 2, false);
  EXPECT_EQ(fixed.iterations, (std::vector<int>{30, 30}));
  // Seeding with the answer converges at once.
  o = EngineOptions();
  const TopSingular seeded = MakeJacobianEngine(L, kN, o)->TopSingularValues(x.data(), 2, false, lz.v.data());
  for (int b = 0; b < 2; ++b) {
    EXPECT_LE(seeded.iterations[b], 2);
    EXPECT_NEAR(seeded.sigma[b], lz.sigma[b], 1e-9 * lz.sigma[b]);
  }
}

TEST(EngineTopSingularTest, LargerSizeMatchesDenseSvdBothTypes) {
  // N*D = 8*16 = 128, 4 heads: exercises restarts (Krylov dimension 8).
  const int n = 8, d = 16;
  const AttentionLayer L = RandomLayer(AllLayerCases()[6], d, 4, 5);
  const std::vector<double> x = RandomPoints(2, n, d, 12);
  EngineOptions o;
  o.krylov_dim = 8;
  o.rel_tol = 1e-8;
  const TopSingular r64 = MakeJacobianEngine(L, n, o)->TopSingularValues(x.data(), 2, false);
  o.dtype = DType::kF32;
  o.rel_tol = 1e-6;
  const TopSingular r32 = MakeJacobianEngine(L, n, o)->TopSingularValues(x.data(), 2, false);
  for (int b = 0; b < 2; ++b) {
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(DenseJacobian(L, Eigen::MatrixXd(PointAt(x, b, n, d))));
    const double s1 = svd.singularValues()(0);
    EXPECT_NEAR(r64.sigma[b], s1, 1e-8 * s1);
    EXPECT_NEAR(r32.sigma[b], s1, 1e-4 * s1);
  }
}

}  // namespace
}  // namespace lipcert
