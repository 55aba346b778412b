#include "models/centre.h"

#include <gtest/gtest.h>

#include "models/npy.h"
#include "models/safetensors.h"
#include "tests/models/test_util.h"

namespace lipcert {
namespace {

using testing::ExpectInputError;
using testing::TempDir;

Eigen::MatrixXd Sample(int n, int d) {
  Eigen::MatrixXd m(n, d);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) m(i, j) = 0.5 * i - 0.25 * j + 0.125;
  return m;
}

TEST(CentreTest, Zero) {
  const Eigen::MatrixXd z = LoadCentre("zero", 3, 4);
  EXPECT_EQ(z.rows(), 3);
  EXPECT_EQ(z.cols(), 4);
  EXPECT_EQ(z.norm(), 0.0);
  ExpectInputError([] { LoadCentre("zero", 0, 4); }, "centre", "tokens");
  ExpectInputError([] { LoadCentre("zero", 2, 0); }, "centre", "d_model");
}

TEST(CentreTest, NpyTwoAndThreeDimensional) {
  TempDir dir;
  const Eigen::MatrixXd x = Sample(3, 4);
  Tensor t = MatrixTensor(x);
  WriteNpy(dir.File("x2.npy"), t);
  EXPECT_EQ(LoadCentre(dir.File("x2.npy"), 3, 4), x);
  EXPECT_EQ(LoadCentre(dir.File("x2.npy"), 0, 4), x);  // N from the file
  t.shape = {1, 3, 4};
  WriteNpy(dir.File("x3.npy"), t);
  EXPECT_EQ(LoadCentre(dir.File("x3.npy"), 3, 4), x);
  Tensor f = MatrixTensor(x, "F32");
  WriteNpy(dir.File("f.npy"), f);
  EXPECT_EQ(LoadCentre(dir.File("f.npy"), 3, 4), x);  // these values are exact in float
}

TEST(CentreTest, NpyErrors) {
  TempDir dir;
  const std::string p = dir.File("x.npy");
  WriteNpy(p, MatrixTensor(Sample(3, 4)));
  ExpectInputError([&] { LoadCentre(p, 3, 5); }, p, "values", "D = 4");
  ExpectInputError([&] { LoadCentre(p, 2, 4); }, p, "values", "N = 3");
  Tensor bad = MatrixTensor(Sample(3, 4));
  bad.values[5] = std::nan("");
  WriteNpy(p, bad);
  ExpectInputError([&] { LoadCentre(p, 3, 4); }, p, "values", "non-finite value at flat index 5");
  bad.values[5] = -INFINITY;
  WriteNpy(p, bad);
  ExpectInputError([&] { LoadCentre(p, 3, 4); }, p, "values", "non-finite");
  Tensor batch{"F64", {2, 1, 4}, std::vector<double>(8, 0.0)};
  WriteNpy(p, batch);
  ExpectInputError([&] { LoadCentre(p, 1, 4); }, p, "values", "(2, 1, 4)");
  WriteNpy(p, Tensor{"F64", {4}, std::vector<double>(4, 0.0)});
  ExpectInputError([&] { LoadCentre(p, 1, 4); }, p, "values", "(N, D)");
  WriteNpy(p, Tensor{"F64", {0, 4}, {}});
  ExpectInputError([&] { LoadCentre(p, 0, 4); }, p, "values", "no tokens");
  ExpectInputError([&] { LoadCentre(dir.File("missing.npy"), 1, 4); }, dir.File("missing.npy"), "file");
}

TEST(CentreTest, SafetensorsByName) {
  TempDir dir;
  const std::string p = dir.File("c.safetensors");
  const Eigen::MatrixXd x = Sample(2, 3);
  Tensor x3 = MatrixTensor(x);
  x3.shape = {1, 2, 3};
  WriteSafetensors(p, {{"x0", MatrixTensor(x)}, {"batch", x3}, {"wide", MatrixTensor(Sample(2, 5))}});
  EXPECT_EQ(LoadCentre(p + ":x0", 2, 3), x);
  EXPECT_EQ(LoadCentre(p + ":batch", 2, 3), x);
  ExpectInputError([&] { LoadCentre(p + ":wide", 2, 3); }, p, "wide", "D = 5");
  ExpectInputError([&] { LoadCentre(p + ":nope", 2, 3); }, p, "nope", "missing tensor");
  ExpectInputError([&] { LoadCentre(p, 2, 3); }, p, "centre", "3 tensors");
  const std::string one = dir.File("one.safetensors");
  WriteSafetensors(one, {{"only", MatrixTensor(x)}});
  EXPECT_EQ(LoadCentre(one, 2, 3), x);
  ExpectInputError([&] { LoadCentre(dir.File("c.txt"), 2, 3); }, dir.File("c.txt"), "centre");
}

}  // namespace
}  // namespace lipcert
