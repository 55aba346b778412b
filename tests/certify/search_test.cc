// The witnessed lower-bound search: witnesses lie in the set, their rigorous value is
// below their floating value, which is below the true norm at the point; the search beats
// the centre, and on the 1-D examples of the theory it reaches the known constructions.
#include "certify/search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>

#include "certify/search_oracle.h"
#include "certify/witness_eval.h"
#include "models/centre.h"
#include "models/forward.h"
#include "models/loader.h"
#include "tests/common/random_layer.h"
#include "tests/common/test_scale.h"

namespace lipcert {
namespace {

// The true norm at x from the dense Jacobian.
double TrueNorm(const AttentionLayer& L, const Eigen::MatrixXd& x, NormKind norm) {
  const Eigen::MatrixXd jac = DenseJacobian<double>(L, x);
  if (norm == NormKind::kL2) return Eigen::JacobiSVD<Eigen::MatrixXd>(jac).singularValues()(0);
  return jac.cwiseAbs().rowwise().sum().maxCoeff();
}

// d, heads and dk as given, Wq/Wk at wscale.
AttentionLayer RandomLayer(AttentionKind kind, bool causal, bool bias, bool ln, int d, int heads, int dk,
                           std::mt19937_64& rng, double wscale = 1.0) {
  return testing::RandomLayer(RandomLayerSpec{kind, causal, bias, ln, d, heads, dk, wscale}, rng);
}

// The post-LN sublayer LN(X + MHA(X)) of a random layer (its LayerNorm moved behind).
AttentionLayer RandomPostLnLayer(AttentionKind kind, bool causal, bool bias, int d, int heads, int dk,
                                 std::mt19937_64& rng, double wscale = 1.0) {
  AttentionLayer L = RandomLayer(kind, causal, bias, true, d, heads, dk, rng, wscale);
  L.post_layer_norm = L.layer_norm;
  L.layer_norm.reset();
  EXPECT_EQ(ValidateLayer(L), "");
  return L;
}

// D = H = dk = 1 with unit value/output weights and query/key weight sqrt(a) (A = a).
AttentionLayer OneDimLayer(AttentionKind kind, double a) {
  AttentionLayer L;
  L.kind = kind;
  L.d_model = L.heads = L.head_dim_qk = L.head_dim_v = 1;
  L.wq = L.wk = Eigen::MatrixXd::Constant(1, 1, std::sqrt(a));
  L.wv = L.wo = Eigen::MatrixXd::Ones(1, 1);
  return L;
}

InputSet MakeSet(SetKind kind, const Eigen::MatrixXd& centre, double r) {
  InputSet s;
  s.kind = kind;
  s.center = centre;
  s.radius = r;
  return s;
}

SearchOptions QuickOptions(NormKind norm, double seconds) {
  SearchOptions o;
  o.norm = norm;
  o.time_limit_s = seconds;
  o.starts = 8;
  o.max_steps = 60;
  o.max_rounds = 1;
  o.threads = 2;
  return o;
}

// A bit-exact fingerprint of a result: the witness's x and v, value and lower bound.
uint64_t Fingerprint(const SearchResult& r) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&](double t) {
    uint64_t b;
    std::memcpy(&b, &t, sizeof b);
    h = (h ^ b) * 1099511628211ULL;
  };
  for (Eigen::Index k = 0; k < r.best.x.size(); ++k) mix(r.best.x.data()[k]);
  for (Eigen::Index k = 0; k < r.best.v.size(); ++k) mix(r.best.v.data()[k]);
  mix(r.best.value);
  mix(r.best.lower_bound.value());
  return h;
}

void CheckWitness(const AttentionLayer& L, const InputSet& set, NormKind norm, const SearchResult& r) {
  const Witness& w = r.best;
  ASSERT_EQ(w.x.rows(), set.tokens());
  EXPECT_TRUE(set.Contains(w.x, 1e-12));
  EXPECT_TRUE(CertainlyInSet(set, w.x));
  EXPECT_GT(w.lower_bound.value(), 0);
  EXPECT_LE(w.lower_bound.value(), w.value);
  EXPECT_GE(w.lower_bound.value(), w.value * (1 - 1e-9));
  const double truth = TrueNorm(L, w.x, norm);
  EXPECT_LE(w.value, truth * (1 + 1e-9));
  // The direction's own value, recomputed here.
  const Eigen::MatrixXd jv = Jvp<double>(L, Evaluate<double>(L, w.x), w.v);
  const double ratio = norm == NormKind::kL2 ? jv.norm() / w.v.norm()
                                             : jv.cwiseAbs().maxCoeff() / w.v.cwiseAbs().maxCoeff();
  EXPECT_NEAR(ratio, w.value, 1e-12 * (1 + w.value));
  // Never below the centre.
  EXPECT_GE(w.value, TrueNorm(L, set.center, norm) * (1 - 1e-9));
  EXPECT_GT(r.points_evaluated, 0);
  EXPECT_FALSE(w.origin.empty());
}

struct Case {
  const char* name;
  AttentionKind kind;
  bool causal, bias, ln;
  SetKind set;
  NormKind norm;
  bool post_ln = false;  // the LayerNorm behind: LN(X + MHA(X))
};

class SearchInvariants : public ::testing::TestWithParam<Case> {};

TEST_P(SearchInvariants, WitnessIsSoundAndBeatsCentre) {
  const Case c = GetParam();
  std::mt19937_64 rng(2024);
  for (int rep = 0; rep < testing::Count(1); ++rep) {
    const int n = 6 + rep % 2, d = 3;  // N*D > 16: the engine's iterative path
    const AttentionLayer L = c.post_ln ? RandomPostLnLayer(c.kind, c.causal, c.bias, d, 2, 2, rng, 1.5)
                                       : RandomLayer(c.kind, c.causal, c.bias, c.ln, d, 2, 2, rng, 1.5);
    Eigen::MatrixXd centre = Eigen::MatrixXd::Random(n, d);
    const double r = c.set == SetKind::kBox ? 0.5 : 1.0;
    const InputSet set = MakeSet(c.set, centre, r);
    SearchOptions o = QuickOptions(c.norm, 2.0);
    o.seed = 11 + rep;
    const SearchResult res = SearchLowerBound(L, set, o);
    SCOPED_TRACE(std::string(c.name) + " best " + std::to_string(res.best.value) + " from " + res.best.origin);
    CheckWitness(L, set, c.norm, res);
    // Ascent improves on the screened points on these random layers.
    EXPECT_GT(res.ascent_steps, 0);
  }
}

const Case kCases[] = {
    {"dot_ball_2", AttentionKind::kDot, false, false, false, SetKind::kBall, NormKind::kL2},
    {"dot_tokens_inf", AttentionKind::kDot, false, false, false, SetKind::kTokens, NormKind::kLinf},
    {"l2_box_2", AttentionKind::kL2, false, false, false, SetKind::kBox, NormKind::kL2},
    {"l2_tokens_inf", AttentionKind::kL2, false, false, false, SetKind::kTokens, NormKind::kLinf},
    {"dot_causal_bias_tokens_2", AttentionKind::kDot, true, true, false, SetKind::kTokens, NormKind::kL2},
    {"dot_ln_ball_2", AttentionKind::kDot, false, true, true, SetKind::kBall, NormKind::kL2},
    {"l2_ln_box_inf", AttentionKind::kL2, false, false, true, SetKind::kBox, NormKind::kLinf},
    {"dot_post_ln_ball_2", AttentionKind::kDot, false, true, false, SetKind::kBall, NormKind::kL2, true},
    {"dot_causal_post_ln_tokens_inf", AttentionKind::kDot, true, true, false, SetKind::kTokens, NormKind::kLinf, true},
    {"l2_post_ln_box_2", AttentionKind::kL2, false, true, false, SetKind::kBox, NormKind::kL2, true},
};
INSTANTIATE_TEST_SUITE_P(Kinds, SearchInvariants, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(Search, DeterministicAcrossThreadCounts) {
  std::mt19937_64 rng(5);
  const AttentionLayer L = RandomLayer(AttentionKind::kDot, false, true, false, 3, 2, 2, rng, 1.5);
  const InputSet set = MakeSet(SetKind::kTokens, Eigen::MatrixXd::Random(4, 3), 1.0);
  SearchOptions o = QuickOptions(NormKind::kL2, 60);  // rounds, not time, stop it
  o.threads = 1;
  const SearchResult a = SearchLowerBound(L, set, o);
  o.threads = 3;
  const SearchResult b = SearchLowerBound(L, set, o);
  EXPECT_EQ(a.best.x, b.best.x);
  EXPECT_EQ(a.best.value, b.best.value);
  EXPECT_EQ(a.points_evaluated, b.points_evaluated);
  o.seed = 2;
  const SearchResult c = SearchLowerBound(L, set, o);
  // Another seed draws other samples (the structured starts may still win).
  auto sample_value = [](const SearchResult& r) {
    for (const auto& [origin, v] : r.best_by_origin)
      if (origin == "sample") return v;
    return -1.0;
  };
  EXPECT_GT(sample_value(a), 0);
  EXPECT_NE(sample_value(a), sample_value(c));
}

TEST(Search, IterativeAgreesWithDenseSvd) {
  std::mt19937_64 rng(9);
  const AttentionLayer L = RandomLayer(AttentionKind::kL2, false, false, true, 4, 2, 2, rng);
  const Eigen::MatrixXd x = Eigen::MatrixXd::Random(5, 4);
  for (NormKind norm : {NormKind::kL2, NormKind::kLinf}) {
    const TopDirection dense = TopDirectionAt(L, x, norm, 1000);
    const TopDirection iter = TopDirectionAt(L, x, norm, 0);
    const double truth = TrueNorm(L, x, norm);
    EXPECT_NEAR(dense.value, truth, 1e-12 * truth);
    EXPECT_LE(iter.value, truth * (1 + 1e-12));
    // Lanczos converges to sigma_1; Hager's estimator may stop at a smaller row.
    if (norm == NormKind::kL2) EXPECT_NEAR(iter.value, truth, 1e-7 * truth);
    else EXPECT_GE(iter.value, 0.5 * truth);
  }
}

TEST(Search, RejectsBadOptionsAndSets) {
  const AttentionLayer L = OneDimLayer(AttentionKind::kDot, 1.0);
  const InputSet set = MakeSet(SetKind::kTokens, Eigen::MatrixXd::Zero(3, 1), 1.0);
  SearchOptions o;
  o.starts = 0;
  EXPECT_NE(ValidateSearchOptions(o).find("starts"), std::string::npos);
  EXPECT_THROW(SearchLowerBound(L, set, o), std::invalid_argument);
  o = SearchOptions();
  o.time_limit_s = -1;
  EXPECT_THROW(SearchLowerBound(L, set, o), std::invalid_argument);
  EXPECT_THROW(SearchLowerBound(L, MakeSet(SetKind::kBall, Eigen::MatrixXd::Zero(3, 2), 1.0), SearchOptions()),
               std::invalid_argument);
}

TEST(Search, ZeroRadiusGivesTheCentre) {
  std::mt19937_64 rng(3);
  const AttentionLayer L = RandomLayer(AttentionKind::kDot, false, false, false, 2, 1, 2, rng);
  const InputSet set = MakeSet(SetKind::kBall, Eigen::MatrixXd::Random(3, 2), 0.0);
  const SearchResult r = SearchLowerBound(L, set, QuickOptions(NormKind::kL2, 1.0));
  EXPECT_EQ(r.best.x, set.center);
  EXPECT_NEAR(r.best.value, TrueNorm(L, set.center, NormKind::kL2), 1e-10);
}

// L2 attention, D = H = 1, unit weights, N = 2: the search reaches the brute-force grid
// maximum of sigma_1 (translation invariance: only x_2 - x_1 matters).
TEST(Search, L2AttentionN2MatchesGrid) {
  const AttentionLayer L = OneDimLayer(AttentionKind::kL2, 1.0);
  double grid = 0;
  for (int i = 0; i <= 4000; ++i) {
    Eigen::MatrixXd x(2, 1);
    x << 0, 4.0 * i / 4000;
    grid = std::max(grid, TrueNorm(L, x, NormKind::kL2));
  }
  const InputSet set = MakeSet(SetKind::kTokens, Eigen::MatrixXd::Zero(2, 1), 3.0);
  const SearchResult r = SearchLowerBound(L, set, QuickOptions(NormKind::kL2, 5.0));
  CheckWitness(L, set, NormKind::kL2, r);
  EXPECT_GE(r.best.lower_bound.value(), grid - 1e-6) << "grid " << grid;
}

// L2 attention, D = H = 1, unit weights, l_inf norm: x_1 = 0 and the other tokens split
// at +-sqrt(y), y = 1 + W0((N-1)/e), has row-sum 4 W0 + (2 - y)/y (Kim et al.'s
// tightness construction); the search must reach at least that.
double LambertW0(double z) {
  double w = std::log1p(z);
  for (int k = 0; k < 100; ++k) w -= (w * std::exp(w) - z) / (std::exp(w) * (w + 1));
  return w;
}

TEST(Search, L2AttentionInfNormReachesKimConstruction) {
  const AttentionLayer L = OneDimLayer(AttentionKind::kL2, 1.0);
  for (int n : {3, 10, 11}) {
    const double w0 = LambertW0((n - 1) / std::exp(1.0)), y = 1 + w0;
    Eigen::MatrixXd x = Eigen::MatrixXd::Zero(n, 1);
    for (int i = 1; i < n; ++i) x(i, 0) = (i % 2 ? 1 : -1) * std::sqrt(y);
    const double construction = TrueNorm(L, x, NormKind::kLinf);
    if (n % 2 == 1) {
      EXPECT_NEAR(construction, 4 * w0 + (2 - y) / y, 1e-9);
    }
    const InputSet set = MakeSet(SetKind::kTokens, Eigen::MatrixXd::Zero(n, 1), 3.0);
    SearchOptions o = QuickOptions(NormKind::kLinf, 5.0);
    const SearchResult r = SearchLowerBound(L, set, o);
    SCOPED_TRACE("N = " + std::to_string(n));
    CheckWitness(L, set, NormKind::kLinf, r);
    EXPECT_GE(r.best.lower_bound.value(), construction * (1 - 1e-9)) << "search " << r.best.value;
    std::printf("[ l2 inf N=%d ] construction %.6f search %.6f (%s)\n", n, construction, r.best.value,
                r.best.origin.c_str());
  }
}

// Dot-product attention, d = 1, A = a: x_1 = R, x_2..N = R/2 gives
// ||J|| >= (sqrt(N-1)/2)(1 + log(N-1)/2) when N - 1 <= exp(a R^2 / 4) (Castin et al.).
TEST(Search, DotAttentionReachesUnbalancedMass) {
  const double a = 1.0, radius = 4.0;
  const AttentionLayer L = OneDimLayer(AttentionKind::kDot, a);
  for (int n : {5, 10}) {
    ASSERT_LE(n - 1, std::exp(a * radius * radius / 4));
    Eigen::MatrixXd x = Eigen::MatrixXd::Constant(n, 1, radius / 2);
    x(0, 0) = radius;
    const double construction = TrueNorm(L, x, NormKind::kL2);
    const double formula = std::sqrt(n - 1.0) / 2 * (1 + std::log(n - 1.0) / 2);
    EXPECT_GE(construction, formula);
    const InputSet set = MakeSet(SetKind::kTokens, Eigen::MatrixXd::Zero(n, 1), radius);
    const SearchResult r = SearchLowerBound(L, set, QuickOptions(NormKind::kL2, 5.0));
    SCOPED_TRACE("N = " + std::to_string(n));
    CheckWitness(L, set, NormKind::kL2, r);
    EXPECT_GE(r.best.lower_bound.value(), construction * (1 - 1e-9));
    std::printf("[ dot N=%d ] formula %.6f construction %.6f search %.6f (%s)\n", n, formula, construction,
                r.best.value, r.best.origin.c_str());
  }
}

// Same seed and max_rounds: bit-identical witnesses, on a trained zoo layer (N*D = 2048,
// the engine's iterative path), whatever the thread count.
TEST(Search, ZooLayerIsDeterministic) {
  const std::string dir = std::string(LIPCERT_SOURCE_DIR) + "/models/zoo/";
  const LoadedModel m = LoadModel(dir + "dot-layer0.safetensors");
  ASSERT_EQ(m.layers.size(), 1u);
  const AttentionLayer& L = m.layers[0];
  const Eigen::MatrixXd x0 = LoadCentre(dir + "dot-layer0-centres.safetensors:x0", 32, L.d_model);
  InputSet set = MakeSet(SetKind::kBall, x0, 0.01 * x0.norm());
  int checked = 0;
  for (NormKind norm : {NormKind::kL2, NormKind::kLinf}) {
    SearchOptions o;
    o.norm = norm;
    o.time_limit_s = 600;  // rounds, not time, stop it
    o.starts = 4;
    o.max_steps = 4;
    o.max_rounds = 2;
    o.threads = 1;
    const SearchResult a = SearchLowerBound(L, set, o);
    const SearchResult b = SearchLowerBound(L, set, o);
    o.threads = 2;
    const SearchResult c = SearchLowerBound(L, set, o);
    SCOPED_TRACE(NormKindToString(norm));
    EXPECT_EQ(Fingerprint(a), Fingerprint(b));
    EXPECT_EQ(Fingerprint(a), Fingerprint(c));
    EXPECT_EQ(a.points_evaluated, c.points_evaluated);
    EXPECT_EQ(a.ascent_steps, c.ascent_steps);
    EXPECT_GT(a.best.lower_bound.value(), 0);
    std::printf("[ zoo %s ] value %.17g lower %.17g origin %s points %d steps %d fingerprint %016llx\n",
                NormKindToString(norm), a.best.value, a.best.lower_bound.value(), a.best.origin.c_str(),
                a.points_evaluated, a.ascent_steps, (unsigned long long)Fingerprint(a));
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

// The exact l_inf norm at a point from all N*D rows of J (batched VJPs) equals the dense
// Jacobian's largest row sum, for any worker count.
TEST(Search, ExactInfNormMatchesDenseRowSums) {
  std::mt19937_64 rng(31);
  int checked = 0;
  for (bool ln : {false, true}) {
    const AttentionLayer L = RandomLayer(ln ? AttentionKind::kL2 : AttentionKind::kDot, !ln, !ln, ln, 12, 3, 4, rng, 1.5);
    const Eigen::MatrixXd x = Eigen::MatrixXd::Random(23, 12);  // N*D = 276, not a multiple of the block
    const double truth = TrueNorm(L, x, NormKind::kLinf);
    const TopDirection one = ExactInfDirectionAt(L, x, 1);
    const TopDirection three = ExactInfDirectionAt(L, x, 3);
    EXPECT_NEAR(one.value, truth, 1e-12 * truth);
    EXPECT_EQ(one.value, three.value);
    EXPECT_EQ(one.v, three.v);
    // v is the sign vector of the row e_r picks out: <e_r, J v> is the value.
    const Eigen::MatrixXd jv = Jvp<double>(L, Evaluate<double>(L, x), one.v);
    EXPECT_NEAR((jv.array() * one.u.array()).sum(), one.value, 1e-12 * truth);
    EXPECT_EQ(one.v.cwiseAbs().minCoeff(), 1.0);
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

// With --norm inf the witness is never below the exact norm at the centre, also where
// N*D is past the dense limits (screening 16, polish 256) and Hager's estimator decides.
TEST(Search, InfWitnessIsAtLeastTheCentresExactNorm) {
  std::mt19937_64 rng(17);
  int checked = 0;
  for (double radius : {0.0, 0.05}) {
    const AttentionLayer L = RandomLayer(AttentionKind::kDot, true, true, true, 16, 4, 4, rng, 2.0);
    const InputSet set = MakeSet(SetKind::kBall, Eigen::MatrixXd::Random(20, 16), radius);  // N*D = 320
    const double centre = TrueNorm(L, set.center, NormKind::kLinf);
    SearchOptions o = QuickOptions(NormKind::kLinf, 600);
    o.starts = 2;
    o.max_steps = 2;
    o.structured = false;
    const SearchResult r = SearchLowerBound(L, set, o);
    SCOPED_TRACE("radius " + std::to_string(radius) + " best " + std::to_string(r.best.value) + " from " +
                 r.best.origin);
    EXPECT_GE(r.best.value, centre * (1 - 1e-12));
    EXPECT_GE(r.best.lower_bound.value(), centre * (1 - 1e-9));
    EXPECT_LE(r.best.lower_bound.value(), r.best.value);
    EXPECT_TRUE(CertainlyInSet(set, r.best.x));
    double centre_value = -1;
    for (const auto& [origin, v] : r.best_by_origin)
      if (origin == "centre") centre_value = v;
    EXPECT_NEAR(centre_value, centre, 1e-12 * centre);
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

// Given the centre's largest row (as the centre_norm engine names it), the search takes it
// instead of the N*D rows: its witness is the exact centre norm; a row out of range is
// refused with the field's name.
TEST(Search, GivenCentreRowGivesTheCentresExactNorm) {
  std::mt19937_64 rng(18);
  const AttentionLayer L = RandomLayer(AttentionKind::kDot, true, true, true, 16, 4, 4, rng, 2.0);
  const InputSet set = MakeSet(SetKind::kBall, Eigen::MatrixXd::Random(20, 16), 0.0);
  const TopDirection exact = ExactInfDirectionAt(L, set.center, 1);
  int row = -1;
  exact.u.transpose().reshaped().maxCoeff(&row);  // u = e_r, row-major flattening i*D + a
  SearchOptions o = QuickOptions(NormKind::kLinf, 600);
  o.starts = 2;
  o.max_steps = 2;
  o.structured = false;
  o.exact_inf_centre = false;
  o.centre_inf_row = row;
  const SearchResult r = SearchLowerBound(L, set, o);
  EXPECT_GE(r.best.lower_bound.value(), exact.value * (1 - 1e-9));
  o.centre_inf_row = int(set.center.size());
  EXPECT_THROW(
      {
        try {
          SearchLowerBound(L, set, o);
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("centre_inf_row"), std::string::npos);
          throw;
        }
      },
      std::invalid_argument);
}

// stop_at: once the target is reached after screening the search ends with no ascent; an
// unreachable target leaves it to its rounds; a target <= 0 is refused.
TEST(Search, StopsOnceTheTargetIsReached) {
  std::mt19937_64 rng(19);
  const AttentionLayer L = RandomLayer(AttentionKind::kDot, false, false, false, 8, 2, 4, rng, 1.0);
  const InputSet set = MakeSet(SetKind::kBall, Eigen::MatrixXd::Random(4, 8), 0.1);
  SearchOptions o = QuickOptions(NormKind::kL2, 600);
  o.max_rounds = 3;
  const SearchResult full = SearchLowerBound(L, set, o);
  EXPECT_GT(full.ascent_steps, 0);
  o.stop_at = 1e-300;
  const SearchResult early = SearchLowerBound(L, set, o);
  EXPECT_EQ(early.ascent_steps, 0);
  EXPECT_EQ(early.rounds, 0);
  EXPECT_GT(early.best.lower_bound.value(), 0);
  o.stop_at = 0;
  EXPECT_NE(ValidateSearchOptions(o).find("stop_at"), std::string::npos);
}

// The oracle's products on the post-LN sublayer (the kernels' MHA composed with the
// LayerNorm) and on the pre-LN one (the kernels alone) agree with models/forward.h: J v,
// J^T u, and grad_X <u, J(X) v> against central differences of <u, J(X + t delta) v>.
TEST(SearchOracle, ProductsAndPairGradientFollowTheSublayer) {
  std::mt19937_64 rng(41);
  int checked = 0;
  for (int c = 0; c < 4 * testing::Count(1); ++c) {
    const bool post = c % 2 == 0;
    const AttentionKind kind = (c / 2) % 2 ? AttentionKind::kL2 : AttentionKind::kDot;
    const int n = 5, d = 6;
    const AttentionLayer L = post ? RandomPostLnLayer(kind, c % 3 == 1, true, d, 2, 3, rng, 1.5)
                                  : RandomLayer(kind, c % 3 == 1, true, true, d, 2, 3, rng, 1.5);
    const search_parts::Oracle o(L, n, 1e-13, 3000);
    const Eigen::MatrixXd x = 1.5 * Eigen::MatrixXd::Random(n, d);
    const Eigen::MatrixXd u = Eigen::MatrixXd::Random(n, d), v = Eigen::MatrixXd::Random(n, d);
    const Eigen::MatrixXd delta = Eigen::MatrixXd::Random(n, d);
    const LayerState<double> s = Evaluate<double>(L, x);
    const Eigen::MatrixXd jv = Jvp<double>(L, s, v), jtu = Vjp<double>(L, s, u);
    SCOPED_TRACE(std::string(post ? "post-LN " : "pre-LN ") + (kind == AttentionKind::kDot ? "dot" : "l2"));
    EXPECT_LE((o.Jv(x, v) - jv).norm(), 1e-12 * (1 + jv.norm()));
    EXPECT_LE((o.JTu(x, u) - jtu).norm(), 1e-12 * (1 + jtu.norm()));
    const auto pair = [&](double t) {
      const Eigen::MatrixXd xt = x + t * delta;
      return (u.array() * Jvp<double>(L, Evaluate<double>(L, xt), v).array()).sum();
    };
    const double h = 1e-5;
    const double fd = (pair(h) - pair(-h)) / (2 * h);
    const Eigen::MatrixXd g = o.PairGradient(x, u, v);
    const double analytic = (g.array() * delta.array()).sum();
    EXPECT_NEAR(analytic, fd, 1e-6 * (1 + std::abs(fd)));
    EXPECT_GT(std::abs(fd), 1e-3);  // a real derivative, not two zeros
    // The top singular value (Lanczos on the composed products) is the dense one.
    double sigma = 0;
    Eigen::MatrixXd tu, tv;
    o.TopSingular(x, nullptr, &sigma, &tu, &tv);
    const double truth = TrueNorm(L, x, NormKind::kL2);
    EXPECT_NEAR(sigma, truth, 1e-7 * truth);
    EXPECT_NEAR((Jvp<double>(L, s, tv) - sigma * tu).norm(), 0, 1e-6 * truth);
    // The next singular triples by deflation: the dense second and third singular values.
    const Eigen::VectorXd sv = Eigen::JacobiSVD<Eigen::MatrixXd>(DenseJacobian<double>(L, x)).singularValues();
    std::vector<Eigen::MatrixXd> found = {tv};
    for (int k = 1; k < 3; ++k) {
      double sk = 0;
      Eigen::MatrixXd uk, vk;
      o.NextSingular(x, found, &sk, &uk, &vk);
      EXPECT_NEAR(sk, sv(k), 1e-6 * truth) << "singular value " << k + 1;
      for (const Eigen::MatrixXd& f : found) EXPECT_NEAR(f.cwiseProduct(vk).sum(), 0, 1e-9);
      found.push_back(vk);
    }
    // Row sums from the batched rows: the dense Jacobian's.
    const Eigen::MatrixXd jac = DenseJacobian<double>(L, x);
    std::vector<double> sums(n * d);
    std::vector<int> rows(n * d);
    std::iota(rows.begin(), rows.end(), 0);
    o.RowAbsSums(x, rows.data(), n * d, sums.data());
    // The post-LN scan order is a permutation of the rows, largest |gamma_a| / sigma_i first.
    const std::vector<int> order = o.RowOrder(x);
    EXPECT_EQ(order.size(), post ? size_t(n * d) : 0u);
    if (post) EXPECT_TRUE(std::is_permutation(order.begin(), order.end(), rows.begin()));
    for (int r = 0; r < n * d; ++r) EXPECT_NEAR(sums[r], jac.row(r).cwiseAbs().sum(), 1e-12 * (1 + sums[r]));
    ++checked;
  }
  EXPECT_EQ(checked, 4 * testing::Count(1));
}

// The post-LN sublayer past the dense limits (N*D = 320, screening 16, polish 256): the
// witness is never below the centre's own norm, in the l_inf norm its exact largest row
// (all N*D rows of J_f), in norm 2 its sigma_1; with the centre's row given, that row.
TEST(Search, PostLnWitnessIsAtLeastTheCentresNorm) {
  std::mt19937_64 rng(43);
  int checked = 0;
  for (NormKind norm : {NormKind::kLinf, NormKind::kL2}) {
    for (double radius : {0.0, 0.05}) {
      const AttentionLayer L = RandomPostLnLayer(AttentionKind::kDot, false, true, 16, 4, 4, rng, 2.0);
      const InputSet set = MakeSet(SetKind::kBall, Eigen::MatrixXd::Random(20, 16), radius);
      const double centre = TrueNorm(L, set.center, norm);
      SearchOptions o = QuickOptions(norm, 600);
      o.starts = 2;
      o.max_steps = 2;
      o.structured = false;
      const SearchResult r = SearchLowerBound(L, set, o);
      SCOPED_TRACE(std::string(NormKindToString(norm)) + " radius " + std::to_string(radius) + " best " +
                   std::to_string(r.best.value) + " from " + r.best.origin);
      EXPECT_GE(r.best.value, centre * (1 - 1e-9));
      EXPECT_GE(r.best.lower_bound.value(), centre * (1 - 1e-9));
      EXPECT_LE(r.best.lower_bound.value(), r.best.value);
      EXPECT_LE(r.best.value, TrueNorm(L, r.best.x, norm) * (1 + 1e-9));
      EXPECT_TRUE(CertainlyInSet(set, r.best.x));
      if (norm == NormKind::kLinf) {
        const TopDirection exact = ExactInfDirectionAt(L, set.center, 2);
        EXPECT_NEAR(exact.value, centre, 1e-12 * centre);
        int row = -1;
        exact.u.transpose().reshaped().maxCoeff(&row);
        o.exact_inf_centre = false;
        o.centre_inf_row = row;
        const SearchResult given = SearchLowerBound(L, set, o);
        EXPECT_GE(given.best.lower_bound.value(), centre * (1 - 1e-9));
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4);
}

// On the post-LN sublayer the ascent climbs J_f's own norm: from the centre of a ball its
// witness beats the centre's sigma_1 by more than rounding.
TEST(Search, PostLnAscentClimbsTheSublayersNorm) {
  std::mt19937_64 rng(47);
  const AttentionLayer L = RandomPostLnLayer(AttentionKind::kDot, false, true, 8, 2, 4, rng, 2.0);
  const InputSet set = MakeSet(SetKind::kBall, Eigen::MatrixXd::Random(6, 8), 0.3);
  const double centre = TrueNorm(L, set.center, NormKind::kL2);
  SearchOptions o = QuickOptions(NormKind::kL2, 600);
  o.structured = false;
  o.max_rounds = 2;
  const SearchResult r = SearchLowerBound(L, set, o);
  CheckWitness(L, set, NormKind::kL2, r);
  EXPECT_GT(r.ascent_steps, 0);
  EXPECT_GT(r.best.lower_bound.value(), centre * 1.01) << "centre " << centre << " search " << r.best.value;
  std::printf("[ post-LN ascent ] centre %.6f search %.6f (%s)\n", centre, r.best.value, r.best.origin.c_str());
}

}  // namespace
}  // namespace lipcert
