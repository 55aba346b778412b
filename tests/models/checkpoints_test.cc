// LoadModel on the real checkpoints exported by scripts/gen_test_vectors.py (PyTorch,
// HuggingFace transformers) into tests/data/checkpoints/.
#include <gtest/gtest.h>

#include <filesystem>

#include "models/inspect.h"
#include "models/loader.h"
#include "models/safetensors.h"

namespace lipcert {
namespace {

namespace fs = std::filesystem;

fs::path CheckpointDir() { return fs::path(LIPCERT_SOURCE_DIR) / "tests" / "data" / "checkpoints"; }

struct Expected {
  const char* name;
  const char* preset;
  size_t layers;
  AttentionKind kind;
  int d, heads, dk, dv;
  bool causal;
  double ln_eps;       // 0: no LayerNorm
  const char* biases;  // which of q, k, v, o are present
};

std::string Biases(const AttentionLayer& L) {
  std::string s;
  if (L.bq.size()) s += "q";
  if (L.bk.size()) s += "k";
  if (L.bv.size()) s += "v";
  if (L.bo.size()) s += "o";
  return s;
}

const AttentionKind kDot = AttentionKind::kDot, kL2 = AttentionKind::kL2;
const Expected kExpected[] = {
    {"bert", "bert", 2, kDot, 12, 2, 6, 6, false, 0, "qkvo"},
    {"gpt2", "gpt2", 2, kDot, 8, 2, 4, 4, true, 1e-5, "qkvo"},
    {"gpt2-large", "gpt2", 2, kDot, 32, 4, 8, 8, true, 1e-5, "qkvo"},
    {"native-dot", "native", 1, kDot, 8, 2, 4, 4, false, 0, "qkvo"},
    {"native-dot-causal", "native", 1, kDot, 6, 2, 3, 3, true, 0, "qkvo"},
    {"native-dot-ln", "native", 1, kDot, 8, 2, 4, 4, false, 1e-5, "qkvo"},
    {"native-dot-ln-large", "native", 1, kDot, 32, 4, 8, 8, true, 1e-5, "qkvo"},
    {"native-dot-nobias", "native", 1, kDot, 4, 2, 2, 2, false, 0, ""},
    {"native-dot-rect", "native", 1, kDot, 6, 2, 3, 5, false, 0, "qv"},
    {"native-l2", "native", 1, kL2, 8, 2, 4, 4, false, 0, ""},
    {"native-l2-causal", "native", 1, kL2, 6, 2, 3, 3, true, 0, "vo"},
    {"native-l2-ln", "native", 1, kL2, 8, 2, 4, 4, false, 1e-5, "vo"},
    {"torch-mha", "torch-mha", 1, kDot, 8, 2, 4, 4, false, 0, "qkvo"},
};

class CheckpointTest : public ::testing::TestWithParam<Expected> {};

TEST_P(CheckpointTest, LoadsWithTheRightShapes) {
  const Expected& e = GetParam();
  const fs::path dir = CheckpointDir() / e.name;
  // Committed test data: missing is a failure, never a skip.
  ASSERT_TRUE(fs::exists(dir / "model.safetensors")) << "committed checkpoint missing: " << dir;
  const LoadedModel m = LoadModel(dir.string());
  EXPECT_EQ(m.preset, e.preset);
  EXPECT_EQ(m.sha256.size(), 64u);
  ASSERT_EQ(m.layers.size(), e.layers);
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const AttentionLayer& L = m.layers[i];
    SCOPED_TRACE("layer " + std::to_string(i));
    EXPECT_EQ(m.layer_indices[i], int(i));
    EXPECT_EQ(L.kind, e.kind);
    EXPECT_EQ(L.d_model, e.d);
    EXPECT_EQ(L.heads, e.heads);
    EXPECT_EQ(L.head_dim_qk, e.dk);
    EXPECT_EQ(L.head_dim_v, e.dv);
    EXPECT_EQ(L.causal, e.causal);
    EXPECT_EQ(L.layer_norm.has_value(), e.ln_eps > 0);
    if (L.layer_norm) {
      EXPECT_EQ(L.layer_norm->eps, e.ln_eps);
    }
    EXPECT_EQ(Biases(L), e.biases);
    EXPECT_EQ(ValidateLayer(L), "");
    EXPECT_GT(L.wq.norm(), 0.0);
  }
  // Picking one layer gives the same layer as loading all.
  LoadOptions o;
  o.layer = int(e.layers) - 1;
  const LoadedModel last = LoadModel(dir.string(), o);
  ASSERT_EQ(last.layers.size(), 1u);
  EXPECT_EQ(last.layers[0].wo, m.layers.back().wo);
  EXPECT_EQ(InspectJson(m)["layers"].size(), e.layers);
}

INSTANTIATE_TEST_SUITE_P(Data, CheckpointTest, ::testing::ValuesIn(kExpected),
                         [](const ::testing::TestParamInfo<Expected>& info) {
                           std::string s = info.param.name;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

TEST(CheckpointTest, Gpt2WeightsAreTheTransposedConv1DBlocks) {
  const fs::path dir = CheckpointDir() / "gpt2";
  ASSERT_TRUE(fs::exists(dir / "model.safetensors")) << "committed checkpoint missing: " << dir;
  const std::string file = (dir / "model.safetensors").string();
  const SafetensorsFile raw = ReadSafetensors(file);
  const LoadedModel m = LoadModel(dir.string());
  const Eigen::MatrixXd c_attn = TensorAsMatrix(raw.tensors.at("h.1.attn.c_attn.weight"), file, "c_attn");
  const Eigen::MatrixXd c_proj = TensorAsMatrix(raw.tensors.at("h.1.attn.c_proj.weight"), file, "c_proj");
  const AttentionLayer& L = m.layers.at(1);
  EXPECT_EQ(L.wq, c_attn.leftCols(8).transpose());
  EXPECT_EQ(L.wk, c_attn.middleCols(8, 8).transpose());
  EXPECT_EQ(L.wv, c_attn.rightCols(8).transpose());
  EXPECT_EQ(L.wo, c_proj.transpose());
}

TEST(CheckpointTest, EveryStoredCheckpointLoads) {
  ASSERT_TRUE(fs::exists(CheckpointDir())) << "committed checkpoints missing: " << CheckpointDir();
  int n = 0;
  for (const auto& entry : fs::directory_iterator(CheckpointDir())) {
    if (!fs::exists(entry.path() / "model.safetensors")) continue;
    SCOPED_TRACE(entry.path().string());
    EXPECT_NO_THROW(LoadModel(entry.path().string()));
    ++n;
  }
  // Every committed checkpoint folder (tests/data/checkpoints) holds a model that loads,
  // and each is one of kExpected.
  EXPECT_EQ(n, int(std::size(kExpected)));
}

}  // namespace
}  // namespace lipcert
