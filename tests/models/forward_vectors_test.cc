// Checks LoadModel + Forward / Jvp / Vjp / DenseJacobian against reference vectors computed by
// torch in float64 (scripts/gen_test_vectors.py, scripts/train_zoo.py; see docs/zoo.md):
//   tests/data/vectors/<case>.safetensors   x, y, v, jv, u, jtu (+ jacobian); metadata preset,
//                                           layer, kind, heads, causal, residual
//   tests/data/checkpoints/<case>/          the checkpoint (model.safetensors + config.json)
// Every comparison is relative: ||got - want||_F / ||want||_F <= 1e-12.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "models/forward.h"
#include "models/loader.h"
#include "models/safetensors.h"

namespace lipcert {
namespace {

namespace fs = std::filesystem;

constexpr double kRelTol = 1e-12;

fs::path SourceDir() { return fs::path(LIPCERT_SOURCE_DIR); }

// Names of the vector files (without extension), sorted.
std::vector<std::string> VectorCases() {
  std::vector<std::string> cases;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(SourceDir() / "tests" / "data" / "vectors", ec))
    if (e.path().extension() == ".safetensors") cases.push_back(e.path().stem().string());
  std::sort(cases.begin(), cases.end());
  return cases;
}

double RelDiff(const Eigen::MatrixXd& got, const Eigen::MatrixXd& want) {
  return (got - want).norm() / want.norm();
}

// For RecordProperty (visible with --gtest_output=xml).
std::string Sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", v);
  return buf;
}

const std::string& Meta(const SafetensorsFile& f, const std::string& key) {
  static const std::string empty;
  const auto it = f.metadata.find(key);
  EXPECT_NE(it, f.metadata.end()) << "metadata key " << key;
  return it == f.metadata.end() ? empty : it->second;
}

Eigen::MatrixXd Get(const SafetensorsFile& f, const std::string& file, const std::string& name) {
  const auto it = f.tensors.find(name);
  if (it == f.tensors.end()) throw InputError(file, name, "missing");
  return TensorAsMatrix(it->second, file, name);
}

// The data must be there: an empty folder would make the parameterised suite vacuous.
TEST(ForwardVectors, AllCasesPresent) {
  const std::vector<std::string> cases = VectorCases();
  for (const char* want : {"native-dot", "native-dot-causal", "native-dot-ln", "native-l2", "native-l2-causal",
                           "native-l2-ln", "torch-mha", "bert", "gpt2", "gpt2-large", "native-dot-ln-large"})
    EXPECT_NE(std::find(cases.begin(), cases.end(), want), cases.end()) << want;
}

class ForwardVectorsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    vec_path_ = (SourceDir() / "tests" / "data" / "vectors" / (GetParam() + ".safetensors")).string();
    ckpt_path_ = (SourceDir() / "tests" / "data" / "checkpoints" / GetParam()).string();
    vec_ = ReadSafetensors(vec_path_);
    preset_ = Meta(vec_, "preset");
    layer_index_ = std::stoi(Meta(vec_, "layer"));
    LoadOptions opts;
    opts.preset = preset_;
    opts.layer = layer_index_;
    model_ = LoadModel(ckpt_path_, opts);
    // The stored bert references are MHA alone (BertSelfAttention + BertSelfOutput.dense,
    // before its LayerNorm); the post-LN sublayer is checked in post_layer_norm_forward_test.cc.
    if (Meta(vec_, "reference").find("BertSelfOutput.dense") != std::string::npos)
      model_.layers[0].post_layer_norm.reset();
    ASSERT_EQ(model_.layers.size(), 1u);
    x_ = Get(vec_, vec_path_, "x");
  }

  const AttentionLayer& layer() const { return model_.layers[0]; }

  std::string vec_path_, ckpt_path_, preset_;
  int layer_index_ = 0;
  SafetensorsFile vec_;
  LoadedModel model_;
  Eigen::MatrixXd x_;
};

TEST_P(ForwardVectorsTest, LoadsTheDescribedLayer) {
  EXPECT_EQ(model_.preset, preset_);
  ASSERT_EQ(model_.layer_indices.size(), 1u);
  EXPECT_EQ(model_.layer_indices[0], layer_index_);
  const AttentionLayer& L = layer();
  EXPECT_EQ(AttentionKindToString(L.kind), Meta(vec_, "kind"));
  EXPECT_EQ(L.heads, std::stoi(Meta(vec_, "heads")));
  EXPECT_EQ(L.causal, Meta(vec_, "causal") == "true");
  EXPECT_EQ(L.residual(), Meta(vec_, "residual") == "true");
  EXPECT_EQ(L.d_model, x_.cols());
  EXPECT_EQ(ValidateLayer(L), "");
  // Auto-detection picks the same preset and the same numbers.
  LoadOptions automatic;
  automatic.layer = layer_index_;
  const LoadedModel again = LoadModel(ckpt_path_, automatic);
  EXPECT_EQ(again.preset, preset_);
  ASSERT_EQ(again.layers.size(), 1u);
  EXPECT_EQ(again.layers[0].wq, L.wq);
  EXPECT_EQ(again.layers[0].wo, L.wo);
}

TEST_P(ForwardVectorsTest, Forward) {
  const Eigen::MatrixXd y = Get(vec_, vec_path_, "y");
  const Eigen::MatrixXd got = Forward(layer(), x_);
  ASSERT_EQ(got.rows(), y.rows());
  ASSERT_EQ(got.cols(), y.cols());
  const double rel = RelDiff(got, y);
  RecordProperty("rel_diff", Sci(rel));
  EXPECT_LE(rel, kRelTol) << "reference: " << Meta(vec_, "reference");
}

TEST_P(ForwardVectorsTest, JvpAndVjp) {
  const LayerState<double> s = Evaluate(layer(), x_);
  const double rel_jv = RelDiff(Jvp(layer(), s, Get(vec_, vec_path_, "v")), Get(vec_, vec_path_, "jv"));
  const double rel_jtu = RelDiff(Vjp(layer(), s, Get(vec_, vec_path_, "u")), Get(vec_, vec_path_, "jtu"));
  RecordProperty("rel_diff_jvp", Sci(rel_jv));
  RecordProperty("rel_diff_vjp", Sci(rel_jtu));
  EXPECT_LE(rel_jv, kRelTol);
  EXPECT_LE(rel_jtu, kRelTol);
}

// bert: the full post-LN sublayer equals LN(x + y_ref), the stored PyTorch MHA output y_ref
// with the checkpoint's own attention.output.LayerNorm (written out here, row by row).
TEST_P(ForwardVectorsTest, BertPostLayerNormOfTheReference) {
  if (Meta(vec_, "reference").find("BertSelfOutput.dense") == std::string::npos) GTEST_SKIP() << "not bert";
  LoadOptions opts;
  opts.preset = preset_;
  opts.layer = layer_index_;
  const AttentionLayer full = LoadModel(ckpt_path_, opts).layers[0];
  ASSERT_TRUE(full.post_ln());
  const LayerNormParams& ln = *full.post_layer_norm;
  const Eigen::MatrixXd yin = x_ + Get(vec_, vec_path_, "y");
  Eigen::MatrixXd want(yin.rows(), yin.cols());
  for (Eigen::Index i = 0; i < yin.rows(); ++i) {
    const Eigen::RowVectorXd c = yin.row(i).array() - yin.row(i).mean();
    want.row(i) = (c / std::sqrt(c.squaredNorm() / double(yin.cols()) + ln.eps)).cwiseProduct(ln.gamma.transpose()) +
                  ln.beta.transpose();
  }
  EXPECT_LE(RelDiff(Forward(full, x_), want), 1e-11);
}

TEST_P(ForwardVectorsTest, DenseJacobian) {
  if (!vec_.tensors.count("jacobian")) GTEST_SKIP() << "no jacobian stored (N*D > 64)";
  const Eigen::MatrixXd want = Get(vec_, vec_path_, "jacobian");
  const Eigen::MatrixXd got = DenseJacobian(layer(), x_);
  ASSERT_EQ(got.rows(), want.rows());
  const double rel = RelDiff(got, want);
  RecordProperty("rel_diff", Sci(rel));
  EXPECT_LE(rel, kRelTol);
  // Each column separately too, so that a small wrong block cannot hide in the total.
  for (int c = 0; c < want.cols(); ++c) {
    const double ref = std::max(want.col(c).norm(), 1e-3 * want.norm() / std::sqrt(double(want.cols())));
    EXPECT_LE((got.col(c) - want.col(c)).norm() / ref, 1e-11) << "column " << c;
  }
}

std::string CaseName(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Data, ForwardVectorsTest, ::testing::ValuesIn(VectorCases()), CaseName);

}  // namespace
}  // namespace lipcert
