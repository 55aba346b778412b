// The post-LN sublayer LN(X + MHA(X)) in models/forward.h: Evaluate against an independent
// composition, Jvp against central differences, Vjp as Jvp's adjoint, DenseJacobian as the
// composition J_LN(Y) (I + J_MHA), the loader's bert preset and ValidateLayer's exclusivity.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "models/forward.h"
#include "models/loader.h"
#include "models/random_layer.h"
#include "tests/common/test_scale.h"

namespace lipcert {
namespace {

AttentionLayer RandomPostLn(AttentionKind kind, bool causal, std::mt19937_64& rng) {
  RandomLayerSpec spec;
  spec.kind = kind;
  spec.causal = causal;
  spec.biases = true;
  spec.layer_norm = true;
  spec.d = 5;
  spec.heads = 2;
  spec.dk = 3;
  AttentionLayer L = RandomAttentionLayer(spec, rng);
  L.post_layer_norm = L.layer_norm;
  L.layer_norm.reset();
  return L;
}

// LN row by row, written out independently of models/forward.h.
Eigen::MatrixXd LayerNormRows(const LayerNormParams& ln, const Eigen::MatrixXd& y) {
  Eigen::MatrixXd z(y.rows(), y.cols());
  for (Eigen::Index i = 0; i < y.rows(); ++i) {
    const Eigen::RowVectorXd c = y.row(i).array() - y.row(i).mean();
    const double sigma = std::sqrt(c.squaredNorm() / double(y.cols()) + ln.eps);
    z.row(i) = (c / sigma).cwiseProduct(ln.gamma.transpose()) + ln.beta.transpose();
  }
  return z;
}

TEST(PostLayerNormForward, MatchesCompositionDifferencesAndAdjoint) {
  std::mt19937_64 rng(17);
  std::normal_distribution<double> g;
  const long cases = testing::Count(12);
  long checked = 0;
  for (long c = 0; c < cases; ++c) {
    const AttentionLayer L = RandomPostLn(c % 2 ? AttentionKind::kL2 : AttentionKind::kDot, c % 3 == 0, rng);
    ASSERT_EQ(ValidateLayer(L), "");
    const AttentionLayer mha = L.WithoutPostLayerNorm();
    const int n = 3 + int(c % 3), d = L.d_model;
    const Eigen::MatrixXd x = Eigen::MatrixXd::NullaryExpr(n, d, [&] { return g(rng); });
    const Eigen::MatrixXd v = Eigen::MatrixXd::NullaryExpr(n, d, [&] { return g(rng); });
    const Eigen::MatrixXd u = Eigen::MatrixXd::NullaryExpr(n, d, [&] { return g(rng); });
    // Evaluate == LN(X + MHA(X)).
    const Eigen::MatrixXd y = Forward<double>(L, x);
    const Eigen::MatrixXd ref = LayerNormRows(*L.post_layer_norm, x + Forward<double>(mha, x));
    EXPECT_LT((y - ref).norm(), 1e-12 * (1 + ref.norm()));
    // Jvp == central differences.
    const LayerState<double> s = Evaluate<double>(L, x);
    const Eigen::MatrixXd jv = Jvp<double>(L, s, v);
    const double h = 1e-5;
    const Eigen::MatrixXd fd = (Forward<double>(L, x + h * v) - Forward<double>(L, x - h * v)) / (2 * h);
    EXPECT_LT((jv - fd).norm(), 1e-6 * (1 + jv.norm())) << "case " << c;
    // <u, J v> == <J^T u, v>.
    const double a = (u.array() * jv.array()).sum();
    const double b = (Vjp<double>(L, s, u).array() * v.array()).sum();
    EXPECT_NEAR(a, b, 1e-10 * (1 + std::abs(a)));
    // DenseJacobian == J_LN(Y) (I + J_MHA(X)).
    const Eigen::MatrixXd jf = DenseJacobian<double>(L, x);
    const Eigen::MatrixXd jm = DenseJacobian<double>(mha, x);
    Eigen::MatrixXd jln = Eigen::MatrixXd::Zero(n * d, n * d);  // J_LN(Y) by central differences
    const Eigen::MatrixXd yy = x + Forward<double>(mha, x);
    for (int col = 0; col < n * d; ++col) {
      Eigen::MatrixXd e = Eigen::MatrixXd::Zero(n, d);
      e(col / d, col % d) = 1e-6;
      const Eigen::MatrixXd dz = (LayerNormRows(*L.post_layer_norm, yy + e) - LayerNormRows(*L.post_layer_norm, yy - e)) / 2e-6;
      for (int r = 0; r < n * d; ++r) jln(r, col) = dz(r / d, r % d);
    }
    const Eigen::MatrixXd comp = jln * (Eigen::MatrixXd::Identity(n * d, n * d) + jm);
    EXPECT_LT((jf - comp).norm(), 1e-6 * (1 + jf.norm())) << "case " << c;
    ++checked;
  }
  EXPECT_EQ(checked, cases);
}

TEST(PostLayerNormForward, ValidateRefusesBothPlacements) {
  std::mt19937_64 rng(3);
  AttentionLayer L = RandomPostLn(AttentionKind::kDot, false, rng);
  L.layer_norm = L.post_layer_norm;
  EXPECT_NE(ValidateLayer(L).find("post_ln"), std::string::npos);
  L.layer_norm.reset();
  L.post_layer_norm->gamma.resize(2);
  EXPECT_EQ(ValidateLayer(L).rfind("post_ln.weight", 0), 0u) << ValidateLayer(L);
}

TEST(PostLayerNormForward, BertPresetLoadsThePostLn) {
  const std::filesystem::path dir = std::filesystem::path(LIPCERT_SOURCE_DIR) / "tests/data/checkpoints/bert";
  // Committed test data: missing is a failure, never a skip.
  ASSERT_TRUE(std::filesystem::exists(dir / "model.safetensors")) << "committed checkpoint missing: " << dir;
  const LoadedModel m = LoadModel(dir.string());
  ASSERT_EQ(m.layers.size(), 2u);
  for (const AttentionLayer& L : m.layers) {
    ASSERT_TRUE(L.post_ln());
    EXPECT_FALSE(L.layer_norm.has_value());
    EXPECT_EQ(L.post_layer_norm->eps, 1e-12);  // config.json layer_norm_eps
    EXPECT_EQ(L.post_layer_norm->gamma.size(), 12);
    EXPECT_EQ(ValidateLayer(L), "");
  }
  EXPECT_EQ(m.layers[1].tensor_names.at("post_ln.weight"), "encoder.layer.1.attention.output.LayerNorm.weight");
}

}  // namespace
}  // namespace lipcert
