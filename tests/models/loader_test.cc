#include "models/loader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>

#include "models/forward.h"
#include "models/inspect.h"
#include "models/safetensors.h"
#include "models/sha256.h"
#include "tests/models/test_util.h"

namespace lipcert {
namespace {

using testing::ExpectInputError;
using testing::TempDir;
using Tensors = std::map<std::string, Tensor>;
using Meta = std::map<std::string, std::string>;

Eigen::MatrixXd Rand(std::mt19937_64& rng, int r, int c) {
  std::normal_distribution<double> normal(0.0, 0.5);
  Eigen::MatrixXd m(r, c);
  for (int i = 0; i < r; ++i)
    for (int j = 0; j < c; ++j) m(i, j) = normal(rng);
  return m;
}
Eigen::VectorXd RandV(std::mt19937_64& rng, int n) { return Rand(rng, n, 1).col(0); }

void WriteConfig(const TempDir& dir, const std::string& json) {
  std::ofstream(dir.File("config.json")) << json;
}

// Row-wise softmax with an optional causal mask, straight from the definition.
Eigen::MatrixXd SoftmaxRows(Eigen::MatrixXd s, bool causal) {
  for (int i = 0; i < s.rows(); ++i) {
    double mx = -INFINITY;
    for (int j = 0; j < s.cols(); ++j)
      if (!causal || j <= i) mx = std::max(mx, s(i, j));
    double sum = 0;
    for (int j = 0; j < s.cols(); ++j) {
      s(i, j) = (!causal || j <= i) ? std::exp(s(i, j) - mx) : 0.0;
      sum += s(i, j);
    }
    s.row(i) /= sum;
  }
  return s;
}

// Multi-head attention from per-token projections q, k, v (N, H*d) laid out head after head.
Eigen::MatrixXd HeadsConcat(const Eigen::MatrixXd& q, const Eigen::MatrixXd& k, const Eigen::MatrixXd& v, int heads,
                            bool causal) {
  const int dk = int(q.cols()) / heads, dv = int(v.cols()) / heads;
  Eigen::MatrixXd out(q.rows(), v.cols());
  for (int h = 0; h < heads; ++h) {
    const Eigen::MatrixXd s = q.middleCols(h * dk, dk) * k.middleCols(h * dk, dk).transpose() / std::sqrt(double(dk));
    out.middleCols(h * dv, dv) = SoftmaxRows(s, causal) * v.middleCols(h * dv, dv);
  }
  return out;
}

// ---------------------------------------------------------------- native

struct NativeFixture {
  Eigen::MatrixXd wq, wk, wv, wo;
  Eigen::VectorXd bq, bk, bv, bo, g, b;
  Tensors tensors;
};

// D = 4, H = 2, dk = 3, dv = 2.
NativeFixture MakeNative(uint64_t seed) {
  std::mt19937_64 rng(seed);
  NativeFixture f;
  f.wq = Rand(rng, 6, 4);
  f.wk = Rand(rng, 6, 4);
  f.wv = Rand(rng, 4, 4);
  f.wo = Rand(rng, 4, 4);
  f.bq = RandV(rng, 6);
  f.bk = RandV(rng, 6);
  f.bv = RandV(rng, 4);
  f.bo = RandV(rng, 4);
  f.g = RandV(rng, 4);
  f.b = RandV(rng, 4);
  f.tensors = {{"q.weight", MatrixTensor(f.wq)}, {"k.weight", MatrixTensor(f.wk)}, {"v.weight", MatrixTensor(f.wv)},
               {"o.weight", MatrixTensor(f.wo)}, {"q.bias", VectorTensor(f.bq)},   {"k.bias", VectorTensor(f.bk)},
               {"v.bias", VectorTensor(f.bv)},   {"o.bias", VectorTensor(f.bo)}};
  return f;
}

TEST(LoaderTest, NativeDotWithBiasesAndLayerNorm) {
  TempDir dir;
  NativeFixture f = MakeNative(1);
  f.tensors["ln.weight"] = VectorTensor(f.g);
  f.tensors["ln.bias"] = VectorTensor(f.b);
  const std::string p = dir.File("m.safetensors");
  WriteSafetensors(p, f.tensors, {{"kind", "dot"}, {"heads", "2"}, {"causal", "true"}, {"ln_eps", "1e-6"}});
  const LoadedModel m = LoadModel(p);
  EXPECT_EQ(m.preset, "native");
  EXPECT_EQ(m.path, p);
  EXPECT_EQ(m.sha256, Sha256HexOfFile(p));
  ASSERT_EQ(m.layers.size(), 1u);
  EXPECT_EQ(m.layer_indices, std::vector<int>{0});
  const AttentionLayer& L = m.layers[0];
  EXPECT_EQ(L.kind, AttentionKind::kDot);
  EXPECT_EQ(L.d_model, 4);
  EXPECT_EQ(L.heads, 2);
  EXPECT_EQ(L.head_dim_qk, 3);
  EXPECT_EQ(L.head_dim_v, 2);
  EXPECT_TRUE(L.causal);
  EXPECT_EQ(L.wq, f.wq);
  EXPECT_EQ(L.wk, f.wk);
  EXPECT_EQ(L.wv, f.wv);
  EXPECT_EQ(L.wo, f.wo);
  EXPECT_EQ(L.bq, f.bq);
  EXPECT_EQ(L.bk, f.bk);
  EXPECT_EQ(L.bv, f.bv);
  EXPECT_EQ(L.bo, f.bo);
  ASSERT_TRUE(L.layer_norm.has_value());
  EXPECT_EQ(L.layer_norm->gamma, f.g);
  EXPECT_EQ(L.layer_norm->beta, f.b);
  EXPECT_EQ(L.layer_norm->eps, 1e-6);
  EXPECT_EQ(L.tensor_names.at("wq"), "q.weight");
  EXPECT_EQ(L.tensor_names.at("heads"), "__metadata__.heads");
  EXPECT_EQ(ValidateLayer(L), "");
}

TEST(LoaderTest, NativeL2TiedKeyAndDefaults) {
  TempDir dir;
  NativeFixture f = MakeNative(2);
  Tensors t = {{"q.weight", MatrixTensor(f.wq)}, {"v.weight", MatrixTensor(f.wv)}, {"o.weight", MatrixTensor(f.wo)}};
  const std::string p = dir.File("l2.safetensors");
  WriteSafetensors(p, t, {{"kind", "l2"}, {"heads", "2"}});
  const AttentionLayer L = LoadModel(p).layers.at(0);
  EXPECT_EQ(L.kind, AttentionKind::kL2);
  EXPECT_EQ(L.wk, f.wq);
  EXPECT_EQ(L.tensor_names.at("wk"), "q.weight (tied)");
  EXPECT_FALSE(L.causal);
  EXPECT_FALSE(L.has_bias());
  EXPECT_FALSE(L.residual());

  // An explicit k.weight equal to q.weight is accepted; a different one is not.
  t["k.weight"] = MatrixTensor(f.wq);
  WriteSafetensors(p, t, {{"kind", "l2"}, {"heads", "2"}});
  EXPECT_EQ(LoadModel(p).layers.at(0).wk, f.wq);
  t["k.weight"] = MatrixTensor(f.wk);
  WriteSafetensors(p, t, {{"kind", "l2"}, {"heads", "2"}});
  ExpectInputError([&] { LoadModel(p); }, p, "k.weight", "differs from q.weight");
  t["k.weight"] = MatrixTensor(f.wq);
  t["q.bias"] = VectorTensor(f.bq);
  WriteSafetensors(p, t, {{"kind", "l2"}, {"heads", "2"}});
  ExpectInputError([&] { LoadModel(p); }, p, "q.bias", "no query/key bias");
}

TEST(LoaderTest, NativeMetadataErrors) {
  TempDir dir;
  const NativeFixture f = MakeNative(3);
  const std::string p = dir.File("m.safetensors");
  auto expect = [&](const Meta& meta, const std::string& field, const std::string& fragment, LoadOptions o = {}) {
    WriteSafetensors(p, f.tensors, meta);
    ExpectInputError([&] { LoadModel(p, o); }, p, field, fragment);
  };
  expect({{"heads", "2"}}, "__metadata__.kind", "missing");
  expect({{"kind", "softmax"}, {"heads", "2"}}, "__metadata__.kind", "softmax");
  expect({{"kind", "dot"}}, "heads", "unknown");
  expect({{"kind", "dot"}, {"heads", "two"}}, "__metadata__.heads", "not a positive integer");
  expect({{"kind", "dot"}, {"heads", "4"}}, "q.weight", "do not split into 4 heads");
  expect({{"kind", "dot"}, {"heads", "2"}, {"causal", "yes"}}, "__metadata__.causal", "yes");
  expect({{"kind", "dot"}, {"heads", "2"}, {"head_dim_qk", "2"}}, "__metadata__.head_dim_qk", "disagrees");
  expect({{"kind", "dot"}, {"heads", "2"}, {"head_dim_v", "3"}}, "__metadata__.head_dim_v", "disagrees");
  expect({{"kind", "dot"}, {"heads", "2"}, {"ln_eps", "1e-5"}}, "__metadata__.ln_eps", "no ln.weight");
  LoadOptions three;
  three.heads = 3;
  expect({{"kind", "dot"}, {"heads", "2"}}, "heads", "--heads says 3 heads", three);
}

TEST(LoaderTest, HeadsOptionMustAgreeWithMetadata) {
  TempDir dir;
  const NativeFixture f = MakeNative(4);
  const std::string p = dir.File("m.safetensors");
  WriteSafetensors(p, f.tensors, {{"kind", "dot"}, {"heads", "2"}});
  LoadOptions o;
  o.heads = 1;
  ExpectInputError([&] { LoadModel(p, o); }, p, "heads", "--heads says 1 heads but __metadata__.heads says 2");
  o.heads = 2;
  EXPECT_EQ(LoadModel(p, o).layers[0].heads, 2);
  // Without metadata, --heads alone decides.
  WriteSafetensors(p, f.tensors, {{"kind", "dot"}});
  o.heads = 1;
  const AttentionLayer L = LoadModel(p, o).layers[0];
  EXPECT_EQ(L.heads, 1);
  EXPECT_EQ(L.head_dim_qk, 6);
  EXPECT_EQ(L.tensor_names.at("heads"), "--heads");
}

TEST(LoaderTest, NativeTensorErrors) {
  TempDir dir;
  const std::string p = dir.File("m.safetensors");
  const Meta meta = {{"kind", "dot"}, {"heads", "2"}};
  {
    NativeFixture f = MakeNative(5);
    f.tensors.erase("o.weight");
    WriteSafetensors(p, f.tensors, meta);
    ExpectInputError([&] { LoadModel(p); }, p, "o.weight", "missing tensor");
  }
  {
    NativeFixture f = MakeNative(5);
    f.tensors.erase("k.weight");
    WriteSafetensors(p, f.tensors, meta);
    ExpectInputError([&] { LoadModel(p); }, p, "k.weight", "missing tensor");
  }
  {
    NativeFixture f = MakeNative(5);
    f.tensors["o.weight"] = MatrixTensor(Eigen::MatrixXd::Ones(4, 3));
    WriteSafetensors(p, f.tensors, meta);
    ExpectInputError([&] { LoadModel(p); }, p, "o.weight", "expected 4 x 4, got 4 x 3");
  }
  {
    NativeFixture f = MakeNative(5);
    f.tensors["v.bias"] = VectorTensor(Eigen::VectorXd::Ones(3));
    WriteSafetensors(p, f.tensors, meta);
    ExpectInputError([&] { LoadModel(p); }, p, "v.bias", "expected length 4");
  }
  {
    NativeFixture f = MakeNative(5);
    f.tensors["q.weight"].shape = {2, 3, 4};
    WriteSafetensors(p, f.tensors, meta);
    ExpectInputError([&] { LoadModel(p); }, p, "q.weight", "2-D");
  }
  {
    NativeFixture f = MakeNative(5);
    f.tensors["ln.weight"] = VectorTensor(Eigen::VectorXd::Ones(4));
    WriteSafetensors(p, f.tensors, meta);
    ExpectInputError([&] { LoadModel(p); }, p, "ln.bias", "missing tensor");
  }
  {
    // NaN weights: written by hand since WriteSafetensors refuses them.
    NativeFixture f = MakeNative(5);
    f.tensors["v.weight"].values[3] = 12345.0;
    std::string bytes = EncodeSafetensors(f.tensors, meta);
    const double marker = 12345.0, nan = std::nan("");
    const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(&marker), 8));
    ASSERT_NE(at, std::string::npos);
    std::memcpy(bytes.data() + at, &nan, 8);
    testing::WriteBytes(p, bytes);
    ExpectInputError([&] { LoadModel(p); }, p, "v.weight", "NaN value at flat index 3");
  }
}

// ---------------------------------------------------------------- torch-mha

TEST(LoaderTest, TorchMhaSplitsInProjAndMatchesReference) {
  TempDir dir;
  std::mt19937_64 rng(7);
  const int d = 6, heads = 3, n = 5;
  const Eigen::MatrixXd win = Rand(rng, 3 * d, d), wout = Rand(rng, d, d);
  const Eigen::VectorXd bin = RandV(rng, 3 * d), bout = RandV(rng, d);
  const std::string p = dir.File("mha.safetensors");
  WriteSafetensors(p, {{"self_attn.in_proj_weight", MatrixTensor(win)},
                       {"self_attn.in_proj_bias", VectorTensor(bin)},
                       {"self_attn.out_proj.weight", MatrixTensor(wout)},
                       {"self_attn.out_proj.bias", VectorTensor(bout)}},
                   {{"heads", "3"}});
  const LoadedModel m = LoadModel(p);
  EXPECT_EQ(m.preset, "torch-mha");
  const AttentionLayer& L = m.layers.at(0);
  EXPECT_EQ(L.d_model, d);
  EXPECT_EQ(L.heads, heads);
  EXPECT_EQ(L.head_dim_qk, 2);
  EXPECT_FALSE(L.causal);
  EXPECT_FALSE(L.residual());
  EXPECT_EQ(L.wq, win.topRows(d));
  EXPECT_EQ(L.wk, win.middleRows(d, d));
  EXPECT_EQ(L.wv, win.bottomRows(d));
  EXPECT_EQ(L.bk, bin.segment(d, d));
  EXPECT_EQ(L.wo, wout);
  EXPECT_EQ(L.bo, bout);
  EXPECT_EQ(L.tensor_names.at("wk"), "self_attn.in_proj_weight[6:12]");

  // nn.MultiheadAttention's own computation, from the stacked weights.
  const Eigen::MatrixXd x = Rand(rng, n, d);
  const Eigen::MatrixXd qkv = (x * win.transpose()).rowwise() + bin.transpose();
  const Eigen::MatrixXd ref =
      (HeadsConcat(qkv.leftCols(d), qkv.middleCols(d, d), qkv.rightCols(d), heads, false) * wout.transpose()).rowwise() +
      bout.transpose();
  EXPECT_LT((Forward<double>(L, x) - ref).cwiseAbs().maxCoeff(), 1e-12);
}

TEST(LoaderTest, TorchMhaSeveralLayersHeadsFromConfigAndLayerSelection) {
  TempDir dir;
  std::mt19937_64 rng(8);
  Tensors t;
  std::vector<Eigen::MatrixXd> win;
  for (int i = 0; i < 3; ++i) {
    win.push_back(Rand(rng, 12, 4));
    t["layers." + std::to_string(i) + ".self_attn.in_proj_weight"] = MatrixTensor(win.back());
    t["layers." + std::to_string(i) + ".self_attn.out_proj.weight"] = MatrixTensor(Rand(rng, 4, 4));
  }
  const std::string p = dir.File("enc.safetensors");
  WriteSafetensors(p, t);
  ExpectInputError([&] { LoadModel(p); }, p, "heads", "unknown");
  WriteConfig(dir, R"({"num_heads": 2})");
  const LoadedModel all = LoadModel(p);
  EXPECT_EQ(all.layer_indices, (std::vector<int>{0, 1, 2}));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(all.layers[size_t(i)].wq, win[size_t(i)].topRows(4));
    EXPECT_EQ(all.layers[size_t(i)].heads, 2);
    EXPECT_FALSE(all.layers[size_t(i)].has_bias());
  }
  LoadOptions o;
  o.layer = 2;
  const LoadedModel one = LoadModel(p, o);
  ASSERT_EQ(one.layers.size(), 1u);
  EXPECT_EQ(one.layer_indices, std::vector<int>{2});
  EXPECT_EQ(one.layers[0].wv, win[2].bottomRows(4));
  o.layer = 3;
  ExpectInputError([&] { LoadModel(p, o); }, p, "layer", "layer 3 not found (layers: 0, 1, 2)");
}

TEST(LoaderTest, TorchMhaShapeErrors) {
  TempDir dir;
  const std::string p = dir.File("mha.safetensors");
  WriteSafetensors(p, {{"in_proj_weight", MatrixTensor(Eigen::MatrixXd::Ones(8, 4))},
                       {"out_proj.weight", MatrixTensor(Eigen::MatrixXd::Ones(4, 4))}},
                   {{"heads", "1"}});
  ExpectInputError([&] { LoadModel(p); }, p, "in_proj_weight", "(3D, D)");
  WriteSafetensors(p, {{"in_proj_weight", MatrixTensor(Eigen::MatrixXd::Ones(12, 4))},
                       {"in_proj_bias", VectorTensor(Eigen::VectorXd::Ones(4))},
                       {"out_proj.weight", MatrixTensor(Eigen::MatrixXd::Ones(4, 4))}},
                   {{"heads", "1"}});
  ExpectInputError([&] { LoadModel(p); }, p, "in_proj_bias", "expected length 12");
  WriteSafetensors(p, {{"in_proj_weight", MatrixTensor(Eigen::MatrixXd::Ones(12, 4))}}, {{"heads", "1"}});
  ExpectInputError([&] { LoadModel(p); }, p, "out_proj.weight", "missing tensor");
}

// ---------------------------------------------------------------- bert

Tensors BertTensors(std::mt19937_64& rng, const std::string& prefix, int layers, int d) {
  Tensors t;
  for (int i = 0; i < layers; ++i) {
    const std::string l = prefix + "encoder.layer." + std::to_string(i) + ".";
    for (const char* part : {"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"}) {
      t[l + part + ".weight"] = MatrixTensor(Rand(rng, d, d));
      t[l + part + ".bias"] = VectorTensor(RandV(rng, d));
    }
    // The post-LN of LN(X + MHA(X)), read into post_layer_norm.
    t[l + "attention.output.LayerNorm.weight"] = VectorTensor(RandV(rng, d));
    t[l + "attention.output.LayerNorm.bias"] = VectorTensor(RandV(rng, d));
    // Parameters the loader must ignore.
    t[l + "intermediate.dense.weight"] = MatrixTensor(Rand(rng, 2 * d, d));
  }
  t[prefix + "embeddings.word_embeddings.weight"] = MatrixTensor(Rand(rng, 10, d));
  return t;
}

TEST(LoaderTest, BertWithPrefixAndConfig) {
  TempDir dir;
  std::mt19937_64 rng(9);
  const Tensors t = BertTensors(rng, "bert.", 2, 8);
  const std::string p = dir.File("model.safetensors");
  WriteSafetensors(p, t);
  WriteConfig(dir, R"({"model_type": "bert", "num_attention_heads": 4, "hidden_size": 8, "position_embedding_type": "absolute"})");
  const LoadedModel m = LoadModel(dir.path().string());  // a folder: model.safetensors inside
  EXPECT_EQ(m.path, p);
  EXPECT_EQ(m.preset, "bert");
  EXPECT_EQ(m.layer_indices, (std::vector<int>{0, 1}));
  for (int i = 0; i < 2; ++i) {
    const AttentionLayer& L = m.layers[size_t(i)];
    const std::string l = "bert.encoder.layer." + std::to_string(i) + ".";
    EXPECT_EQ(L.heads, 4);
    EXPECT_EQ(L.head_dim_qk, 2);
    EXPECT_FALSE(L.causal);
    EXPECT_FALSE(L.residual());
    EXPECT_EQ(L.wq, TensorAsMatrix(t.at(l + "attention.self.query.weight"), "", ""));
    EXPECT_EQ(L.wk, TensorAsMatrix(t.at(l + "attention.self.key.weight"), "", ""));
    EXPECT_EQ(L.wv, TensorAsMatrix(t.at(l + "attention.self.value.weight"), "", ""));
    EXPECT_EQ(L.wo, TensorAsMatrix(t.at(l + "attention.output.dense.weight"), "", ""));
    EXPECT_EQ(L.bo, TensorAsVector(t.at(l + "attention.output.dense.bias"), "", ""));
    EXPECT_EQ(L.tensor_names.at("bv"), l + "attention.self.value.bias");
  }
}

TEST(LoaderTest, BertWithoutPrefixSkipsIntegerBuffers) {
  TempDir dir;
  std::mt19937_64 rng(10);
  Tensors t = BertTensors(rng, "", 1, 4);
  const std::string p = dir.File("bert.safetensors");
  // An int64 position_ids buffer, as some BERT checkpoints carry: written by hand.
  std::string bytes = EncodeSafetensors(t);
  {
    // Rebuild with an extra I64 tensor appended to the buffer.
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[size_t(i)]);
    std::string header = bytes.substr(8, n);
    while (!header.empty() && header.back() == ' ') header.pop_back();
    const uint64_t buffer_size = bytes.size() - 8 - n;
    header.pop_back();  // the closing brace
    header += R"(,"embeddings.position_ids":{"dtype":"I64","shape":[1,2],"data_offsets":[)" + std::to_string(buffer_size) +
              "," + std::to_string(buffer_size + 16) + "]}}";
    std::string len;
    for (int i = 0; i < 8; ++i) len.push_back(char((uint64_t(header.size()) >> (8 * i)) & 0xff));
    bytes = len + header + bytes.substr(8 + n) + std::string(16, '\0');
  }
  testing::WriteBytes(p, bytes);
  ExpectInputError([&] { LoadModel(p); }, p, "heads", "num_attention_heads");
  LoadOptions o;
  o.heads = 2;
  const LoadedModel m = LoadModel(p, o);
  EXPECT_EQ(m.preset, "bert");
  EXPECT_EQ(m.layers.at(0).wq, TensorAsMatrix(t.at("encoder.layer.0.attention.self.query.weight"), "", ""));
}

TEST(LoaderTest, BertErrors) {
  TempDir dir;
  std::mt19937_64 rng(11);
  Tensors t = BertTensors(rng, "bert.", 1, 4);
  const std::string p = dir.File("model.safetensors");
  WriteSafetensors(p, t);
  WriteConfig(dir, R"({"num_attention_heads": 2, "position_embedding_type": "relative_key"})");
  ExpectInputError([&] { LoadModel(p); }, dir.File("config.json"), "position_embedding_type", "relative_key");
  WriteConfig(dir, R"({"num_attention_heads": 2, "hidden_size": 6})");
  ExpectInputError([&] { LoadModel(p); }, dir.File("config.json"), "hidden_size", "disagrees");
  WriteConfig(dir, R"({"num_attention_heads": 2.5})");
  ExpectInputError([&] { LoadModel(p); }, dir.File("config.json"), "num_attention_heads", "positive integer");
  WriteConfig(dir, R"({"num_attention_heads": 2,)");
  ExpectInputError([&] { LoadModel(p); }, dir.File("config.json"), "json", "invalid JSON");
  WriteConfig(dir, R"({"num_attention_heads": 2, "is_decoder": true})");
  EXPECT_TRUE(LoadModel(p).layers.at(0).causal);
  Tensors rel = t;
  rel["bert.encoder.layer.0.attention.self.distance_embedding.weight"] = MatrixTensor(Rand(rng, 3, 4));
  WriteSafetensors(p, rel);
  ExpectInputError([&] { LoadModel(p); }, p, "bert.encoder.layer.0.attention.self.distance_embedding.weight",
                   "relative position");
  t.erase("bert.encoder.layer.0.attention.self.key.weight");
  WriteSafetensors(p, t);
  ExpectInputError([&] { LoadModel(p); }, p, "bert.encoder.layer.0.attention.self.key.weight", "missing tensor");
}

// ---------------------------------------------------------------- gpt2

TEST(LoaderTest, Gpt2TransposesConv1DAndMatchesReference) {
  TempDir dir;
  std::mt19937_64 rng(12);
  const int d = 6, heads = 2, n = 5;
  Tensors t;
  std::vector<Eigen::MatrixXd> c_attn, c_proj;
  std::vector<Eigen::VectorXd> b_attn, b_proj, g, b;
  for (int i = 0; i < 2; ++i) {
    const std::string l = "transformer.h." + std::to_string(i) + ".";
    c_attn.push_back(Rand(rng, d, 3 * d));  // Conv1D: (in, out)
    c_proj.push_back(Rand(rng, d, d));
    b_attn.push_back(RandV(rng, 3 * d));
    b_proj.push_back(RandV(rng, d));
    g.push_back(Eigen::VectorXd::Ones(d) + RandV(rng, d));
    b.push_back(RandV(rng, d));
    t[l + "attn.c_attn.weight"] = MatrixTensor(c_attn.back());
    t[l + "attn.c_attn.bias"] = VectorTensor(b_attn.back());
    t[l + "attn.c_proj.weight"] = MatrixTensor(c_proj.back());
    t[l + "attn.c_proj.bias"] = VectorTensor(b_proj.back());
    t[l + "ln_1.weight"] = VectorTensor(g.back());
    t[l + "ln_1.bias"] = VectorTensor(b.back());
    t[l + "ln_2.weight"] = VectorTensor(RandV(rng, d));
    t[l + "mlp.c_fc.weight"] = MatrixTensor(Rand(rng, d, 4 * d));
  }
  t["transformer.wte.weight"] = MatrixTensor(Rand(rng, 11, d));
  const std::string p = dir.File("gpt2.safetensors");
  WriteSafetensors(p, t);
  WriteConfig(dir, R"({"model_type": "gpt2", "n_head": 2, "n_embd": 6, "layer_norm_epsilon": 1e-05})");
  LoadOptions o;
  o.layer = 1;
  const LoadedModel m = LoadModel(p, o);
  EXPECT_EQ(m.preset, "gpt2");
  EXPECT_EQ(m.layer_indices, std::vector<int>{1});
  const AttentionLayer& L = m.layers.at(0);
  EXPECT_EQ(L.d_model, d);
  EXPECT_EQ(L.heads, heads);
  EXPECT_EQ(L.head_dim_qk, 3);
  EXPECT_TRUE(L.causal);
  ASSERT_TRUE(L.residual());
  EXPECT_EQ(L.layer_norm->eps, 1e-5);
  EXPECT_EQ(L.layer_norm->gamma, g[1]);
  EXPECT_EQ(L.wq, c_attn[1].leftCols(d).transpose());
  EXPECT_EQ(L.wk, c_attn[1].middleCols(d, d).transpose());
  EXPECT_EQ(L.wv, c_attn[1].rightCols(d).transpose());
  EXPECT_EQ(L.wo, c_proj[1].transpose());
  EXPECT_EQ(L.bv, b_attn[1].tail(d));
  EXPECT_EQ(L.tensor_names.at("wk"), "transformer.h.1.attn.c_attn.weight[:, 6:12]^T");

  // GPT-2's block computation in Conv1D layout: x + c_proj(attn(c_attn(ln_1(x)))).
  const Eigen::MatrixXd x = Rand(rng, n, d);
  Eigen::MatrixXd ln(n, d);
  for (int i = 0; i < n; ++i) {
    const double mean = x.row(i).mean();
    const double var = (x.row(i).array() - mean).square().mean();
    ln.row(i) = ((x.row(i).array() - mean) / std::sqrt(var + 1e-5)).matrix().cwiseProduct(g[1].transpose()) + b[1].transpose();
  }
  const Eigen::MatrixXd qkv = (ln * c_attn[1]).rowwise() + b_attn[1].transpose();
  const Eigen::MatrixXd attn = HeadsConcat(qkv.leftCols(d), qkv.middleCols(d, d), qkv.rightCols(d), heads, true);
  const Eigen::MatrixXd ref = x + ((attn * c_proj[1]).rowwise() + b_proj[1].transpose());
  EXPECT_LT((Forward<double>(L, x) - ref).cwiseAbs().maxCoeff(), 1e-12);

  const LoadedModel both = LoadModel(p);
  EXPECT_EQ(both.layer_indices, (std::vector<int>{0, 1}));
  EXPECT_EQ(both.layers[0].wo, c_proj[0].transpose());
}

TEST(LoaderTest, Gpt2Errors) {
  TempDir dir;
  std::mt19937_64 rng(13);
  Tensors t = {{"h.0.attn.c_attn.weight", MatrixTensor(Rand(rng, 4, 12))},
               {"h.0.attn.c_proj.weight", MatrixTensor(Rand(rng, 4, 4))},
               {"h.0.ln_1.weight", VectorTensor(RandV(rng, 4))},
               {"h.0.ln_1.bias", VectorTensor(RandV(rng, 4))}};
  const std::string p = dir.File("g.safetensors");
  WriteSafetensors(p, t);
  ExpectInputError([&] { LoadModel(p); }, p, "heads", "n_head");
  WriteConfig(dir, R"({"n_head": 2, "scale_attn_by_inverse_layer_idx": true})");
  ExpectInputError([&] { LoadModel(p); }, dir.File("config.json"), "scale_attn_by_inverse_layer_idx");
  WriteConfig(dir, R"({"n_head": 2, "layer_norm_epsilon": -1})");
  ExpectInputError([&] { LoadModel(p); }, dir.File("config.json"), "layer_norm_epsilon");
  WriteConfig(dir, R"({"n_head": 2})");
  EXPECT_EQ(LoadModel(p).layers.at(0).layer_norm->eps, 1e-5);
  EXPECT_FALSE(LoadModel(p).layers.at(0).has_bias());
  t["h.0.attn.c_attn.weight"] = MatrixTensor(Rand(rng, 12, 4));  // nn.Linear layout by mistake
  WriteSafetensors(p, t);
  ExpectInputError([&] { LoadModel(p); }, p, "h.0.attn.c_attn.weight", "Conv1D shape (D, 3D)");
  t["h.0.attn.c_attn.weight"] = MatrixTensor(Rand(rng, 4, 12));
  t.erase("h.0.ln_1.bias");
  WriteSafetensors(p, t);
  ExpectInputError([&] { LoadModel(p); }, p, "h.0.ln_1.bias", "missing tensor");
}

// ---------------------------------------------------------------- presets

TEST(LoaderTest, PresetDetectionAndSelection) {
  TempDir dir;
  const std::string p = dir.File("m.safetensors");
  const Tensor w = MatrixTensor(Eigen::MatrixXd::Identity(4, 4));
  const Tensor w3 = MatrixTensor(Eigen::MatrixXd::Ones(4, 12));
  WriteSafetensors(p, {{"q.weight", w}, {"h.0.attn.c_attn.weight", w3}});
  ExpectInputError([&] { LoadModel(p); }, p, "preset", "ambiguous: the tensor names match presets native, gpt2");
  LoadOptions o;
  o.preset = "llama";
  ExpectInputError([&] { LoadModel(p, o); }, p, "preset", "unknown preset 'llama'");
  o.preset = "bert";
  ExpectInputError([&] { LoadModel(p, o); }, p, "preset", "none found (tensors: h.0.attn.c_attn.weight, q.weight)");
  WriteSafetensors(p, {{"encoder.weight", w}, {"decoder.weight", w}});
  ExpectInputError([&] { LoadModel(p); }, p, "preset", "tensors: decoder.weight, encoder.weight");
  o = LoadOptions();
  o.heads = -1;
  ExpectInputError([&] { LoadModel(p, o); }, p, "heads");
  o = LoadOptions();
  o.layer = -2;
  ExpectInputError([&] { LoadModel(p, o); }, p, "layer");
  ExpectInputError([&] { LoadModel(dir.File("absent.safetensors")); }, dir.File("absent.safetensors"), "file");

  EXPECT_EQ(MatchingPresets({"bert.encoder.layer.11.attention.self.query.weight"}), std::vector<std::string>{"bert"});
  EXPECT_EQ(MatchingPresets({"encoder.layer.0.attention.self.query.weight"}), std::vector<std::string>{"bert"});
  EXPECT_EQ(MatchingPresets({"transformer.h.3.attn.c_attn.weight"}), std::vector<std::string>{"gpt2"});
  EXPECT_EQ(MatchingPresets({"attn.in_proj_weight"}), std::vector<std::string>{"torch-mha"});
  EXPECT_EQ(MatchingPresets({"in_proj_weight"}), std::vector<std::string>{"torch-mha"});
  EXPECT_TRUE(MatchingPresets({"xh.0.attn.c_attn.weight", "encoder.layer.x.attention.self.query.weight"}).empty());
}

TEST(LoaderTest, ModelsUnderTwoPrefixesAreRefused) {
  TempDir dir;
  std::mt19937_64 rng(14);
  Tensors t = BertTensors(rng, "bert.", 1, 4);
  for (auto& [k, v] : BertTensors(rng, "other.", 1, 4)) t[k] = v;
  const std::string p = dir.File("m.safetensors");
  WriteSafetensors(p, t);
  LoadOptions o;
  o.heads = 2;
  ExpectInputError([&] { LoadModel(p, o); }, p, "preset", "several prefixes");
}

// ---------------------------------------------------------------- inspect

TEST(InspectTest, TextAndJson) {
  TempDir dir;
  NativeFixture f = MakeNative(15);
  f.tensors["ln.weight"] = VectorTensor(f.g);
  f.tensors["ln.bias"] = VectorTensor(f.b);
  const std::string p = dir.File("m.safetensors");
  WriteSafetensors(p, f.tensors, {{"kind", "dot"}, {"heads", "2"}, {"causal", "true"}});
  const LoadedModel m = LoadModel(p);
  const std::string text = InspectText(m);
  for (const char* s : {"preset:  native", "dot attention, D = 4, H = 2, dk = 3, dv = 2", "causal: yes",
                        "LayerNorm: yes (eps 1e-05", "biases: q k v o", "wq <- q.weight"})
    EXPECT_NE(text.find(s), std::string::npos) << s << "\n" << text;
  EXPECT_NE(text.find(m.sha256), std::string::npos);
  const nlohmann::json j = InspectJson(m);
  EXPECT_EQ(j["preset"], "native");
  EXPECT_EQ(j["sha256"], m.sha256);
  ASSERT_EQ(j["layers"].size(), 1u);
  EXPECT_EQ(j["layers"][0]["heads"], 2);
  EXPECT_EQ(j["layers"][0]["head_dim_qk"], 3);
  EXPECT_EQ(j["layers"][0]["head_dim_v"], 2);
  EXPECT_EQ(j["layers"][0]["causal"], true);
  EXPECT_EQ(j["layers"][0]["layer_norm"]["eps"], 1e-5);
  EXPECT_EQ(j["layers"][0]["biases"]["o"], true);
  EXPECT_EQ(j["layers"][0]["tensor_names"]["wv"], "v.weight");
}

}  // namespace
}  // namespace lipcert
