// The rigorous witness value against 256-bit MPFR: it must never exceed the exact value
// and must be within 1e-10 relative of it, for every kind of layer.
#include "certify/witness_eval.h"

#include <gtest/gtest.h>
#include <mpreal.h>

#include <cstdlib>
#include <random>
#include <unsupported/Eigen/MPRealSupport>

#include "models/forward.h"
#include "tests/common/random_layer.h"
#include "tests/common/test_scale.h"

namespace lipcert {

template <>
struct ScalarToDouble<mpfr::mpreal> {
  static double Get(const mpfr::mpreal& v) { return v.toDouble(); }
};

namespace {

struct LayerSpec {
  const char* name;
  AttentionKind kind;
  bool causal, bias, layer_norm;
};

AttentionLayer RandomLayer(const LayerSpec& spec, int d, int heads, int dk, std::mt19937_64& rng) {
  return testing::RandomLayer(RandomLayerSpec{spec.kind, spec.causal, spec.bias, spec.layer_norm, d, heads, dk}, rng);
}

const LayerSpec kSpecs[] = {
    {"dot", AttentionKind::kDot, false, false, false},
    {"l2", AttentionKind::kL2, false, false, false},
    {"dot-causal", AttentionKind::kDot, true, false, false},
    {"dot-bias", AttentionKind::kDot, false, true, false},
    {"l2-bias-causal", AttentionKind::kL2, true, true, false},
    {"dot-layernorm", AttentionKind::kDot, false, true, true},
    {"l2-layernorm", AttentionKind::kL2, false, false, true},
};

// ||J(x) v|| / ||v|| at 256 bits.
mpfr::mpreal ExactRatio(const AttentionLayer& L, const Eigen::MatrixXd& x, const Eigen::MatrixXd& v,
                        NormKind norm) {
  using mpfr::mpreal;
  using M = Eigen::Matrix<mpreal, Eigen::Dynamic, Eigen::Dynamic>;
  const M xm = x.cast<mpreal>(), vm = v.cast<mpreal>();
  const M y = Jvp<mpreal>(L, Evaluate<mpreal>(L, xm), vm);
  if (norm == NormKind::kL2) {
    mpreal a = 0, b = 0;
    for (Eigen::Index k = 0; k < y.size(); ++k) a += y(k) * y(k), b += vm(k) * vm(k);
    return mpfr::sqrt(a) / mpfr::sqrt(b);
  }
  mpreal a = 0, b = 0;
  for (Eigen::Index k = 0; k < y.size(); ++k) a = mpfr::max(a, mpfr::abs(y(k))), b = mpfr::max(b, mpfr::abs(vm(k)));
  return a / b;
}

class WitnessEvalTest : public ::testing::TestWithParam<LayerSpec> {
 protected:
  void SetUp() override { mpfr::mpreal::set_default_prec(256); }
};

TEST_P(WitnessEvalTest, BelowAndCloseToMpfr) {
  const LayerSpec spec = GetParam();
  std::mt19937_64 rng(42);
  std::normal_distribution<double> nd(0, 1);
  const int reps = int(testing::Count(4));
  for (int rep = 0; rep < reps; ++rep) {
    const int n = 2 + rep % 4, d = 4, heads = 2, dk = 2;
    const AttentionLayer L = RandomLayer(spec, d, heads, dk, rng);
    const double spread = rep % 2 ? 3.0 : 1.0;  // larger inputs: peaked softmax
    Eigen::MatrixXd x(n, d), v(n, d);
    for (int k = 0; k < x.size(); ++k) x(k) = spread * nd(rng), v(k) = nd(rng);
    for (NormKind norm : {NormKind::kL2, NormKind::kLinf}) {
      const Eigen::MatrixXd dir = norm == NormKind::kL2 ? v : Eigen::MatrixXd(v.cwiseSign());
      for (ExpBackend be : {ExpBackend::kMpfr, ExpBackend::kFastWidened}) {
        const double lb = WitnessLowerBound(L, x, dir, norm, be).value();
        const mpfr::mpreal exact = ExactRatio(L, x, dir, norm);
        SCOPED_TRACE(std::string(spec.name) + " rep " + std::to_string(rep) + " norm " +
                     NormKindToString(norm) + " " + ExpBackendName(be));
        EXPECT_LE(mpfr::mpreal(lb), exact);
        EXPECT_GE(lb, exact.toDouble() * (1 - 1e-10));
        EXPECT_GT(lb, 0);
      }
    }
    // The enclosure holds the exact JVP entrywise.
    Eigen::MatrixXd lo, hi;
    EncloseJvp(L, x, v, ExpBackend::kMpfr, &lo, &hi);
    using M = Eigen::Matrix<mpfr::mpreal, Eigen::Dynamic, Eigen::Dynamic>;
    const M xm = x.cast<mpfr::mpreal>();
    const M y = Jvp<mpfr::mpreal>(L, Evaluate<mpfr::mpreal>(L, xm), M(v.cast<mpfr::mpreal>()));
    Eigen::MatrixXd slo, shi;  // the independent scalar-interval evaluation
    EncloseJvpScalar(L, x, v, ExpBackend::kMpfr, &slo, &shi);
    for (Eigen::Index k = 0; k < y.size(); ++k) {
      EXPECT_LE(mpfr::mpreal(lo(k)), y(k));
      EXPECT_GE(mpfr::mpreal(hi(k)), y(k));
      EXPECT_LE(mpfr::mpreal(slo(k)), y(k));
      EXPECT_GE(mpfr::mpreal(shi(k)), y(k));
      EXPECT_LE(hi(k) - lo(k), 1e-10 * (1 + std::abs(y(k).toDouble())));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, WitnessEvalTest, ::testing::ValuesIn(kSpecs),
                         [](const ::testing::TestParamInfo<LayerSpec>& info) {
                           std::string s = info.param.name;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

TEST(WitnessEval, ScalingVScalesNothing) {
  std::mt19937_64 rng(7);
  const AttentionLayer L = RandomLayer(kSpecs[0], 3, 1, 3, rng);
  Eigen::MatrixXd x = Eigen::MatrixXd::Random(3, 3), v = Eigen::MatrixXd::Random(3, 3);
  const double a = WitnessLowerBound(L, x, v, NormKind::kL2).value();
  const double b = WitnessLowerBound(L, x, 1024 * v, NormKind::kL2).value();
  EXPECT_NEAR(a, b, 1e-12 * a);
}

TEST(WitnessEval, RejectsBadInputs) {
  std::mt19937_64 rng(7);
  const AttentionLayer L = RandomLayer(kSpecs[0], 3, 1, 3, rng);
  const Eigen::MatrixXd x = Eigen::MatrixXd::Random(2, 3);
  EXPECT_THROW(WitnessLowerBound(L, x, Eigen::MatrixXd::Zero(2, 3), NormKind::kL2), std::invalid_argument);
  EXPECT_THROW(WitnessLowerBound(L, x, Eigen::MatrixXd::Ones(3, 3), NormKind::kL2), std::invalid_argument);
  EXPECT_THROW(WitnessLowerBound(L, Eigen::MatrixXd::Ones(2, 4), Eigen::MatrixXd::Ones(2, 4), NormKind::kL2),
               std::invalid_argument);
}

TEST(CertainlyInSet, BoundaryAndOutside) {
  for (SetKind kind : {SetKind::kBall, SetKind::kTokens, SetKind::kBox}) {
    InputSet set;
    set.kind = kind;
    set.center = Eigen::MatrixXd::Constant(2, 2, 0.1);
    set.radius = 1;
    SCOPED_TRACE(SetKindToString(kind));
    Eigen::MatrixXd x = set.center;
    EXPECT_TRUE(CertainlyInSet(set, x));
    // Exactly representable boundary point with an exactly representable offset.
    x(0, 0) = set.center(0, 0) + 0.5;
    EXPECT_TRUE(CertainlyInSet(set, x));
    Eigen::MatrixXd far = set.center;
    far(1, 1) += 1.0 + 1e-9;
    EXPECT_FALSE(CertainlyInSet(set, far));
    Eigen::MatrixXd sp = set.center + Eigen::MatrixXd::Constant(2, 2, 0.7);
    // F-norm 1.4 > 1; row norms 0.99 <= 1; entries 0.7 <= 1.
    EXPECT_EQ(CertainlyInSet(set, sp), kind != SetKind::kBall);
    EXPECT_FALSE(CertainlyInSet(set, Eigen::MatrixXd::Zero(3, 2)));
  }
}

}  // namespace
}  // namespace lipcert
