// Checks the trained zoo layers (models/zoo, scripts/train_zoo.py) loaded by LoadModel against
// the torch model they were exported from: tests/data/zoo/<m>-layer<i>-expected.safetensors holds
// the torch float64 sublayer outputs y0..y3 at the centres x0..x3 of
// models/zoo/<m>-layer<i>-centres.safetensors, and J v, J^T u at x0 (tensors v, jv, u, jtu).
// Relative tolerance 1e-12 (Frobenius norms).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include "models/forward.h"
#include "models/loader.h"
#include "models/safetensors.h"

namespace lipcert {
namespace {

namespace fs = std::filesystem;

constexpr double kRelTol = 1e-12;

fs::path SourceDir() { return fs::path(LIPCERT_SOURCE_DIR); }

double RelDiff(const Eigen::MatrixXd& got, const Eigen::MatrixXd& want) {
  return (got - want).norm() / want.norm();
}

// For RecordProperty (visible with --gtest_output=xml).
std::string Sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", v);
  return buf;
}

Eigen::MatrixXd Get(const SafetensorsFile& f, const std::string& file, const std::string& name) {
  const auto it = f.tensors.find(name);
  if (it == f.tensors.end()) throw InputError(file, name, "missing");
  return TensorAsMatrix(it->second, file, name);
}

class ZooTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooTest, MatchesTorch) {
  const std::string stem = GetParam();  // "dot-layer0"
  const std::string layer_file = (SourceDir() / "models" / "zoo" / (stem + ".safetensors")).string();
  const std::string centres_file = (SourceDir() / "models" / "zoo" / (stem + "-centres.safetensors")).string();
  const std::string expected_file = (SourceDir() / "tests" / "data" / "zoo" / (stem + "-expected.safetensors")).string();
  const LoadedModel m = LoadModel(layer_file);
  EXPECT_EQ(m.preset, "native");
  ASSERT_EQ(m.layers.size(), 1u);
  const AttentionLayer& L = m.layers[0];
  EXPECT_EQ(L.kind, stem.rfind("dot", 0) == 0 ? AttentionKind::kDot : AttentionKind::kL2);
  EXPECT_EQ(L.d_model, 64);
  EXPECT_EQ(L.heads, 4);
  EXPECT_TRUE(L.causal);
  EXPECT_TRUE(L.residual());
  const SafetensorsFile centres = ReadSafetensors(centres_file);
  const SafetensorsFile expected = ReadSafetensors(expected_file);
  double worst_forward = 0;
  for (int c = 0; c < 4; ++c) {
    // (append, not "x" + to_string: GCC 12 warns -Wrestrict on that form, a false positive)
    std::string xc = "x", yc = "y";
    xc += std::to_string(c);
    yc += std::to_string(c);
    const Eigen::MatrixXd x = Get(centres, centres_file, xc);
    EXPECT_EQ(x.rows(), 32);
    const double rel = RelDiff(Forward(L, x), Get(expected, expected_file, yc));
    worst_forward = std::max(worst_forward, rel);
    EXPECT_LE(rel, kRelTol) << xc;
  }
  const LayerState<double> s = Evaluate(L, Get(centres, centres_file, "x0"));
  const double rel_jv = RelDiff(Jvp(L, s, Get(expected, expected_file, "v")), Get(expected, expected_file, "jv"));
  const double rel_jtu = RelDiff(Vjp(L, s, Get(expected, expected_file, "u")), Get(expected, expected_file, "jtu"));
  EXPECT_LE(rel_jv, kRelTol);
  EXPECT_LE(rel_jtu, kRelTol);
  RecordProperty("rel_diff_forward", Sci(worst_forward));
  RecordProperty("rel_diff_jvp", Sci(rel_jv));
  RecordProperty("rel_diff_vjp", Sci(rel_jtu));
}

INSTANTIATE_TEST_SUITE_P(Zoo, ZooTest,
                         ::testing::Values("dot-layer0", "dot-layer1", "l2-layer0", "l2-layer1"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace lipcert
