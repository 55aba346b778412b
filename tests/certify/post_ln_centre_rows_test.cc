// The post-LN centre from the LayerNorm's rows (certify/post_ln_centre_rows.h): every split
// dominates ||blockdiag(D_i)(I + J)||_2 (SVD in double, and MPFR Jacobians for a real layer),
// with every row heavy it is that norm to 1e-9 (so 0.8 times it fails), setting the large rows
// apart beats the crude centre where the LayerNorm has outlier gains, and post_ln_variation
// takes it only at its own Y centre.
#include "certify/post_ln_centre_rows.h"

#include <gtest/gtest.h>
#include <mpreal.h>

#include <random>
#include <unsupported/Eigen/MPRealSupport>

#include "certify/post_layer_norm.h"
#include "certify/post_ln_variation.h"
#include "models/forward.h"
#include "tests/certify/test_util.h"
#include "tests/common/test_scale.h"

namespace lipcert {

namespace {

double Sigma1(const Eigen::MatrixXd& j) { return Eigen::JacobiSVD<Eigen::MatrixXd>(j).singularValues()(0); }

// A LayerNorm-shaped block: diag(g) (I - 11^T/d - yhat yhat^T/d), g with one or two outlier gains.
Eigen::MatrixXd LayerNormLike(int d, std::mt19937_64& rng) {
  std::normal_distribution<double> nd;
  std::uniform_real_distribution<double> u(0.5, 1.5);
  Eigen::VectorXd y = Eigen::VectorXd::NullaryExpr(d, [&] { return nd(rng); });
  y.array() -= y.mean();
  y *= std::sqrt(double(d)) / y.norm();
  Eigen::VectorXd g = Eigen::VectorXd::NullaryExpr(d, [&] { return u(rng); });
  g(std::uniform_int_distribution<int>(0, d - 1)(rng)) *= 5;
  g(std::uniform_int_distribution<int>(0, d - 1)(rng)) *= 3;
  const Eigen::MatrixXd p = Eigen::MatrixXd::Identity(d, d) - Eigen::MatrixXd::Constant(d, d, 1.0 / d) - y * y.transpose() / d;
  return g.asDiagonal() * p;
}

struct RowsCase {
  std::vector<IntervalMatrix> ln;
  IntervalMatrix jm;
  Eigen::VectorXd rows;  // >= ||J_i|| over the enclosure
  UpperBound centre{kInf};
  double exact = 0;  // ||blockdiag(D_i)(I + J)|| at the midpoints
};

RowsCase RandomRowsCase(long c, std::mt19937_64& rng) {
  std::normal_distribution<double> nd;
  const int n = 2 + int(c % 4), d = 4 + int(c % 5);
  RowsCase s;
  constexpr double kRad = 1e-12;
  Eigen::MatrixXd dmat = Eigen::MatrixXd::Zero(n * d, n * d);
  for (int i = 0; i < n; ++i) {
    const Eigen::MatrixXd di = LayerNormLike(d, rng);
    s.ln.push_back(IntervalMatrix(di, Eigen::MatrixXd::Constant(d, d, kRad)));
    dmat.block(i * d, i * d, d, d) = di;
  }
  const Eigen::MatrixXd j = Eigen::MatrixXd::NullaryExpr(n * d, n * d, [&] { return 0.3 * nd(rng) / std::sqrt(double(n * d)); });
  s.jm = IntervalMatrix(j, Eigen::MatrixXd::Constant(n * d, n * d, kRad));
  // Every member within the radii: ||J + E|| <= ||J|| + ||E||_F, ||E||_F <= nd kRad (margins 1e-9).
  const double e = n * d * kRad;
  s.rows.resize(n);
  for (int i = 0; i < n; ++i) s.rows(i) = (Sigma1(j.middleRows(i * d, d)) + e) * (1 + 1e-9);
  s.centre = UpperBound((Sigma1(j) + e) * (1 + 1e-9));
  s.exact = Sigma1(dmat * (Eigen::MatrixXd::Identity(n * d, n * d) + j));
  return s;
}

TEST(PostLnCentreRows, EverySplitDominatesAndAllRowsHeavyIsExact) {
  std::mt19937_64 rng(4101);
  const long cases = testing::Count(40);
  long checked = 0, tighter = 0;
  for (long c = 0; c < cases; ++c) {
    const RowsCase s = RandomRowsCase(c, rng);
    const int nd = int(s.jm.rows()), n = int(s.ln.size());
    double crude = 0, best = kInf;
    for (const int k : {0, n, 2 * n, nd / 2, nd}) {
      const LayerNormRowSplit r = LayerNormRowSplitCentreUp(s.ln, s.jm, s.rows, s.centre, {k}, 1);
      ASSERT_TRUE(std::isfinite(r.upper.value())) << "case " << c << " K " << k;
      EXPECT_EQ(r.heavy_rows, k);
      // Over the enclosure the norm is at most exact + sum of radius terms (about 1e-10 here).
      EXPECT_GE(r.upper.value(), s.exact * (1 - 1e-12)) << "case " << c << " K " << k;
      EXPECT_LE(r.heavy_norm.value(), r.upper.value());
      if (k == 0) crude = r.upper.value();
      if (k == nd) EXPECT_LE(r.upper.value(), s.exact * (1 + 1e-9) + 1e-8) << "case " << c << ": every row heavy";
      if (k > 0 && k < nd) best = std::min(best, r.upper.value());
    }
    // Several K at once keep the least.
    const LayerNormRowSplit all = LayerNormRowSplitCentreUp(s.ln, s.jm, s.rows, s.centre, {0, n, 2 * n}, 1);
    EXPECT_LE(all.upper.value(), crude);
    tighter += best < 0.9 * crude;
    ++checked;
  }
  EXPECT_EQ(checked, cases);
  // Outlier gains: setting their rows apart beats max_i ||D_i|| ||diag(w)(I + J)|| by 10% or more.
  EXPECT_GE(tighter, cases * 3 / 4);
}

// WeightedCentreUp >= ||diag(w)(I + J)||_2 (SVD) for weights in [0, 1] and the exact row-block
// and whole norms of J (scaled so that the identity matters or not); the identity apart
// (max w + the weighted split of J alone) gives the least value in some case, and the bound
// at 0.8 times its value is below the exact norm in some case.
TEST(PostLnCentreRows, WeightedCentreDominatesTheSvd) {
  std::mt19937_64 rng(3612);
  std::normal_distribution<double> nd;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const long cases = testing::Count(40);
  long checked = 0, apart_won = 0, fails = 0;
  for (long c = 0; c < cases; ++c) {
    const int n = 2 + int(c % 7), d = 2 + int(c % 3);
    const double scale = c % 2 ? 0.2 : 3.0;
    const Eigen::MatrixXd j = Eigen::MatrixXd::NullaryExpr(n * d, n * d, [&] { return scale * nd(rng) / (n * d); });
    Eigen::VectorXd w = Eigen::VectorXd::NullaryExpr(n, [&] { return c % 3 ? u(rng) : 1.0; });
    w(0) = 1.0;
    Eigen::VectorXd rows(n);
    for (int i = 0; i < n; ++i) rows(i) = Sigma1(j.middleRows(i * d, d)) * (1 + 1e-12);
    const double whole = Sigma1(j) * (1 + 1e-12);
    Eigen::MatrixXd wrows = Eigen::MatrixXd::Zero(n * d, n * d);
    for (int i = 0; i < n; ++i) wrows.block(i * d, i * d, d, d) = w(i) * Eigen::MatrixXd::Identity(d, d);
    const double exact = Sigma1(wrows * (Eigen::MatrixXd::Identity(n * d, n * d) + j));
    const double bound = WeightedCentreUp(w, rows, whole);
    EXPECT_GE(bound, exact * (1 - 1e-12)) << "case " << c;
    // The identity in every block only: the split of I + J, blockwise.
    double all_rows = 0;
    for (int i = 0; i < n; ++i) all_rows += std::pow(w(i) * (1 + rows(i)), 2);
    const double together = std::min(1 + whole, std::sqrt(all_rows));
    if (bound < together * (1 - 1e-9)) ++apart_won;
    if (0.8 * bound < exact) ++fails;
    ++checked;
  }
  EXPECT_EQ(checked, cases);
  EXPECT_GT(apart_won, 0);
  EXPECT_GT(fails, 0);
  std::printf("weighted centre: the identity apart smaller in %ld of %ld cases, 0.8 x below the exact in %ld\n",
              apart_won, cases, fails);
}

TEST(PostLnCentreRows, RefusesWhatItCannotBound) {
  std::mt19937_64 rng(4102);
  RowsCase s = RandomRowsCase(3, rng);
  EXPECT_FALSE(std::isfinite(LayerNormRowSplitCentreUp({}, s.jm, s.rows, s.centre, {0}, 1).upper.value()));
  IntervalMatrix small(Eigen::MatrixXd::Zero(3, 3), Eigen::MatrixXd::Zero(3, 3));
  EXPECT_FALSE(std::isfinite(LayerNormRowSplitCentreUp(s.ln, small, s.rows, s.centre, {0}, 1).upper.value()));
  s.jm.mid(0, 0) = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(std::isfinite(LayerNormRowSplitCentreUp(s.ln, s.jm, s.rows, s.centre, {0}, 1).upper.value()));
}

// On real post-LN layers without a certified centre (centre_l2 = +inf), PostLnVariationInputsFor
// fills rows_centre; it dominates ||J_f(X0)||_2 (MPFR) and the bound takes it as its centre term,
// and with its Y centre moved the bound falls back to the crude centre.
TEST(PostLnCentreRows, VariationTakesItOnlyAtItsOwnYCentre) {
  mpfr::mpreal::set_default_prec(256);
  using M = Eigen::Matrix<mpfr::mpreal, Eigen::Dynamic, Eigen::Dynamic>;
  std::mt19937_64 rng(4103);
  std::normal_distribution<double> g;
  const long cases = testing::Count(6);
  long checked = 0;
  for (long c = 0; c < cases; ++c) {
    const AttentionLayer L = testing_util::RandomPostLn(int(c), rng);
    InputSet set;
    set.center = Eigen::MatrixXd::NullaryExpr(2 + c % 3, L.d_model, [&] { return 2 * g(rng); });
    set.radius = 1e-3;
    const TokenCover cover = CoverOf(set);
    const AttentionLayer mha = L.WithoutPostLayerNorm();
    const MhaPieces m2 = MhaPiecesOver(mha, cover, NormKind::kL2, 1);
    PostLnVariationInputs in = PostLnVariationInputsFor(L, set, NormKind::kL2, m2, m2, UpperBound(kInf), 1,
                                                        std::chrono::steady_clock::time_point::max(), 1L << 30);
    ASSERT_TRUE(std::isfinite(in.rows_centre.upper.value())) << "case " << c;
    const Eigen::MatrixXd jf0 =
        DenseJacobian<mpfr::mpreal>(L, M(set.center.cast<mpfr::mpreal>())).unaryExpr([](const mpfr::mpreal& v) {
          return v.toDouble();
        });
    // The enclosure of Y0 moves the exact centre by rounding only (1e-6 relative, as the centre test).
    EXPECT_GE(in.rows_centre.upper.value(), Sigma1(jf0) * (1 - 1e-6)) << "case " << c;
    const EngineBound b = PostLnVariationBound(L, cover, in);
    ASSERT_TRUE(std::isfinite(b.upper.value())) << "case " << c << ": " << b.note;
    const bool rows_won = b.terms.at(0).name.find("LayerNorm's rows") != std::string::npos;
    EXPECT_EQ(b.terms.at(0).value.value() == in.rows_centre.upper.value(), rows_won) << "case " << c;
    EXPECT_EQ(b.note.find("K " + std::to_string(in.rows_centre.heavy_rows)) != std::string::npos, rows_won) << b.note;
    in.rows_centre_y(0, 0) += 1e-3;
    const EngineBound moved = PostLnVariationBound(L, cover, in);
    EXPECT_NE(moved.terms.at(0).name.find("crude"), std::string::npos) << "case " << c;
    EXPECT_GE(moved.terms.at(0).value.value(), b.terms.at(0).value.value());
    ++checked;
  }
  EXPECT_EQ(checked, cases);
}

}  // namespace

}  // namespace lipcert
