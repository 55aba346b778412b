#include "models/npy.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/models/test_util.h"

namespace lipcert {
namespace {

using testing::ExpectInputError;

std::string NpyHeader(int major, const std::string& dict) {
  std::string s("\x93NUMPY", 6);
  s.push_back(char(major));
  s.push_back('\0');
  const size_t n = dict.size();
  s.push_back(char(n & 0xff));
  s.push_back(char((n >> 8) & 0xff));
  if (major >= 2) {
    s.push_back(char((n >> 16) & 0xff));
    s.push_back(char((n >> 24) & 0xff));
  }
  return s + dict;
}

std::string F64Bytes(std::initializer_list<double> values) {
  std::string s;
  for (double v : values) {
    uint64_t u;
    std::memcpy(&u, &v, 8);
    for (int i = 0; i < 8; ++i) s.push_back(char((u >> (8 * i)) & 0xff));
  }
  return s;
}

// Bytes numpy 1.x writes for np.save(f, np.array([[1.5, -2.0], [0.25, 3.0]])) and for
// np.save(f, np.array([1.5, -2.0], dtype=np.float32)).
const std::string kNumpy2x2 =
    std::string("\x93NUMPY\x01\x00v\x00", 10) + "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }" +
    std::string(58, ' ') + "\n" + F64Bytes({1.5, -2.0, 0.25, 3.0});
const std::string kNumpyF32 = std::string("\x93NUMPY\x01\x00v\x00", 10) +
                              "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }" + std::string(60, ' ') +
                              "\n" + std::string("\x00\x00\xc0?\x00\x00\x00\xc0", 8);

TEST(NpyTest, ReadsWhatNumpyWrites) {
  const Tensor t = ParseNpy(kNumpy2x2, "a.npy");
  EXPECT_EQ(t.dtype, "F64");
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(t.values, (std::vector<double>{1.5, -2.0, 0.25, 3.0}));
  const Tensor f = ParseNpy(kNumpyF32, "f.npy");
  EXPECT_EQ(f.dtype, "F32");
  EXPECT_EQ(f.shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(f.values, (std::vector<double>{1.5, -2.0}));
}

TEST(NpyTest, WritesWhatNumpyWrites) {
  EXPECT_EQ(EncodeNpy(Tensor{"F64", {2, 2}, {1.5, -2.0, 0.25, 3.0}}), kNumpy2x2);
  EXPECT_EQ(EncodeNpy(Tensor{"F32", {2}, {1.5, -2.0}}), kNumpyF32);
}

TEST(NpyTest, Versions2And3AndDoubleQuotes) {
  const std::string data = F64Bytes({1, 2, 3, 4, 5, 6});
  for (int major : {2, 3}) {
    const Tensor t =
        ParseNpy(NpyHeader(major, "{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (1, 2, 3)}\n") + data, "v.npy");
    EXPECT_EQ(t.shape, (std::vector<int64_t>{1, 2, 3})) << major;
    EXPECT_EQ(t.values[5], 6.0);
  }
}

TEST(NpyTest, RoundTripThroughFile) {
  testing::TempDir dir;
  const Tensor t{"F64", {3, 2}, {0.1, -0.2, 1e-300, 4, 5, 6}};
  WriteNpy(dir.File("x.npy"), t);
  const Tensor r = ReadNpy(dir.File("x.npy"));
  EXPECT_EQ(r.values, t.values);
  EXPECT_EQ(r.shape, t.shape);
}

TEST(NpyTest, MalformedFiles) {
  const std::string good = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }\n";
  const std::string data = F64Bytes({1, 2});
  ExpectInputError([&] { ParseNpy("", "e.npy"); }, "e.npy", "magic");
  ExpectInputError([&] { ParseNpy("PK\x03\x04 not numpy", "z.npy"); }, "z.npy", "magic");
  ExpectInputError([&] { ParseNpy(NpyHeader(4, good) + data, "v.npy"); }, "v.npy", "version", "4");
  ExpectInputError([&] { ParseNpy(NpyHeader(1, good).substr(0, 20), "t.npy"); }, "t.npy", "header", "past the end");
  ExpectInputError([&] { ParseNpy(NpyHeader(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }") + data, "i.npy"); },
                   "i.npy", "descr", "<i8");
  ExpectInputError([&] { ParseNpy(NpyHeader(1, "{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }") + data, "b.npy"); },
                   "b.npy", "descr");
  ExpectInputError([&] { ParseNpy(NpyHeader(1, "{'descr': '<f8', 'fortran_order': True, 'shape': (2,), }") + data, "f.npy"); },
                   "f.npy", "fortran_order");
  ExpectInputError([&] { ParseNpy(NpyHeader(1, good) + data + "x", "s.npy"); }, "s.npy", "shape", "data bytes");
  ExpectInputError([&] { ParseNpy(NpyHeader(1, good) + data.substr(0, 12), "s.npy"); }, "s.npy", "shape");
  ExpectInputError([&] { ParseNpy(NpyHeader(1, "{'descr': '<f8', 'shape': (2,), }") + data, "m.npy"); }, "m.npy", "header",
                   "fortran_order");
  ExpectInputError([&] { ParseNpy(NpyHeader(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), } junk") + data, "j.npy"); },
                   "j.npy", "header");
  ExpectInputError([&] { ParseNpy(NpyHeader(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (-2,), }") + data, "n.npy"); },
                   "n.npy", "header");
  ExpectInputError(
      [&] {
        ParseNpy(NpyHeader(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296), }") + data,
                 "o.npy");
      },
      "o.npy", "shape");
  ExpectInputError([&] { ParseNpy(NpyHeader(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,"), "u.npy"); }, "u.npy",
                   "header");
  ExpectInputError([&] { ParseNpy(NpyHeader(1, "{'descr': '<f8, 'fortran_order': False, 'shape': (2,) }") + data, "q.npy"); },
                   "q.npy", "header");
}

}  // namespace
}  // namespace lipcert
