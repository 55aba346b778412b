// The CUDA engine against the CPU engine, for every layer kind and both compute types.
// Skipped (with the reason) when lipcert was built without CUDA or no device is present.
//
// Tolerances (relative to the largest entry of the CPU result):
//   f64: products 1e-10, sigma 1e-8 (rel_tol 1e-10 on both), PairGradient 1e-6 (CUDA uses
//        a central difference of the VJP, error ~ eps^(2/3) times the third derivative);
//   f32: products 1e-4, sigma 1e-4, PairGradient 2e-2, against the f64 CPU engine.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/engine.h"
#include "tests/kernels/test_layers.h"

namespace lipcert {
namespace {

using testing::AllEngineCases;
using testing::EngineCase;
using testing::EngineCaseName;
using testing::RandomLayer;
using testing::RandomPoints;

constexpr int kN = 8, kD = 16, kH = 4;

double MaxAbsDiff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}
double MaxAbs(const std::vector<double>& a) {
  double m = 0;
  for (double v : a) m = std::max(m, std::abs(v));
  return m;
}

class CudaEngineTest : public ::testing::TestWithParam<EngineCase> {
 protected:
  void SetUp() override {
    if (!CudaAvailable()) GTEST_SKIP() << "CUDA engine not tested: " << CudaUnavailableReason();
    layer_ = RandomLayer(GetParam().c, kD, kH, 23);
    EngineOptions o;
    o.rel_tol = 1e-10;
    o.threads = 2;
    cpu_ = MakeJacobianEngine(layer_, kN, o);  // f64 reference
    o.device = Device::kCuda;
    o.dtype = GetParam().dtype;
    o.rel_tol = f64() ? 1e-10 : 1e-6;
    cuda_ = MakeJacobianEngine(layer_, kN, o);
  }
  bool f64() const { return GetParam().dtype == DType::kF64; }

  AttentionLayer layer_;
  std::unique_ptr<JacobianEngine> cpu_, cuda_;
};

TEST_P(CudaEngineTest, ProductsMatchCpu) {
  // Two batch sizes: the device buffers grow between the calls.
  for (int batch : {2, 7}) {
    const std::vector<double> x = RandomPoints(batch, kN, kD, 31 + batch);
    const std::vector<double> w = RandomPoints(batch, kN, kD, 41 + batch);
    std::vector<double> a(x.size()), b(x.size());
    const double tol = f64() ? 1e-10 : 1e-4;
    cpu_->Forward(x.data(), batch, a.data());
    cuda_->Forward(x.data(), batch, b.data());
    EXPECT_LE(MaxAbsDiff(a, b), tol * MaxAbs(a)) << "forward, batch " << batch;
    cpu_->Jvp(x.data(), w.data(), batch, a.data());
    cuda_->Jvp(x.data(), w.data(), batch, b.data());
    EXPECT_LE(MaxAbsDiff(a, b), tol * MaxAbs(a)) << "jvp, batch " << batch;
    cpu_->Vjp(x.data(), w.data(), batch, a.data());
    cuda_->Vjp(x.data(), w.data(), batch, b.data());
    EXPECT_LE(MaxAbsDiff(a, b), tol * MaxAbs(a)) << "vjp, batch " << batch;
  }
}

TEST_P(CudaEngineTest, PairGradientMatchesCpu) {
  const int batch = 3;
  const std::vector<double> x = RandomPoints(batch, kN, kD, 51);
  const std::vector<double> u = RandomPoints(batch, kN, kD, 52);
  const std::vector<double> v = RandomPoints(batch, kN, kD, 53);
  std::vector<double> a(x.size()), b(x.size());
  cpu_->PairGradient(x.data(), u.data(), v.data(), batch, a.data());
  cuda_->PairGradient(x.data(), u.data(), v.data(), batch, b.data());
  EXPECT_LE(MaxAbsDiff(a, b), (f64() ? 1e-6 : 2e-2) * MaxAbs(a));
}

TEST_P(CudaEngineTest, TopSingularMatchesCpu) {
  const int batch = 5;
  const std::vector<double> x = RandomPoints(batch, kN, kD, 61);
  const TopSingular a = cpu_->TopSingularValues(x.data(), batch, true);
  const TopSingular b = cuda_->TopSingularValues(x.data(), batch, true);
  const size_t nd = size_t(kN) * kD;
  for (int p = 0; p < batch; ++p) {
    EXPECT_TRUE(b.converged[p]) << "point " << p;
    EXPECT_NEAR(b.sigma[p], a.sigma[p], (f64() ? 1e-8 : 1e-4) * a.sigma[p]) << "point " << p;
    double dot = 0;
    for (size_t i = 0; i < nd; ++i) dot += a.v[p * nd + i] * b.v[p * nd + i];
    EXPECT_NEAR(std::abs(dot), 1.0, f64() ? 1e-6 : 1e-2) << "point " << p;
  }
  // The gradient depends on the sign of (u, v) only through the product u v^T, which is
  // sign-invariant; compare it directly.
  EXPECT_LE(MaxAbsDiff(a.grad, b.grad), (f64() ? 1e-5 : 5e-2) * MaxAbs(a.grad));
}

TEST_P(CudaEngineTest, PowerIterationMatchesCpu) {
  const int batch = 3;
  const std::vector<double> x = RandomPoints(batch, kN, kD, 71);
  EngineOptions o;
  o.method = SingularMethod::kPower;
  o.rel_tol = 0;
  o.max_iters = 30;
  o.dtype = GetParam().dtype;
  const TopSingular a = MakeJacobianEngine(layer_, kN, o)->TopSingularValues(x.data(), batch, false);
  o.device = Device::kCuda;
  const TopSingular b = MakeJacobianEngine(layer_, kN, o)->TopSingularValues(x.data(), batch, false);
  EXPECT_EQ(a.iterations, b.iterations);
  for (int p = 0; p < batch; ++p)
    EXPECT_NEAR(b.sigma[p], a.sigma[p], (f64() ? 1e-10 : 1e-4) * a.sigma[p]) << "point " << p;
}

INSTANTIATE_TEST_SUITE_P(AllKinds, CudaEngineTest, ::testing::ValuesIn(AllEngineCases()), EngineCaseName);

}  // namespace
}  // namespace lipcert
