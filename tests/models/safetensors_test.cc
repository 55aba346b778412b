#include "models/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "tests/models/test_util.h"

namespace lipcert {
namespace {

using testing::ExpectInputError;
using testing::TempDir;
using testing::WriteBytes;

std::string U64LE(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
  return s;
}

// A file from a raw header text and buffer.
std::string Raw(const std::string& header, const std::string& buffer) { return U64LE(header.size()) + header + buffer; }

std::string F32Bytes(std::initializer_list<float> values) {
  std::string s;
  for (float f : values) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    for (int i = 0; i < 4; ++i) s.push_back(char((u >> (8 * i)) & 0xff));
  }
  return s;
}

std::string U16Bytes(std::initializer_list<uint16_t> values) {
  std::string s;
  for (uint16_t u : values) {
    s.push_back(char(u & 0xff));
    s.push_back(char(u >> 8));
  }
  return s;
}

Tensor RandomTensor(std::mt19937_64& rng, std::vector<int64_t> shape, const std::string& dtype) {
  std::normal_distribution<double> normal;
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  for (size_t i = 0; i < n; ++i) t.values.push_back(normal(rng));
  return t;
}

TEST(SafetensorsTest, RoundTripF64IsExact) {
  TempDir dir;
  std::mt19937_64 rng(1);
  std::map<std::string, Tensor> tensors = {{"a", RandomTensor(rng, {3, 5}, "F64")},
                                           {"b.weight", RandomTensor(rng, {7}, "F64")},
                                           {"scalar", RandomTensor(rng, {}, "F64")},
                                           {"empty", RandomTensor(rng, {0, 4}, "F64")},
                                           {"cube", RandomTensor(rng, {2, 3, 4}, "F64")}};
  tensors["a"].values[0] = std::numeric_limits<double>::denorm_min();
  tensors["a"].values[1] = -std::numeric_limits<double>::max();
  const std::map<std::string, std::string> meta = {{"kind", "dot"}, {"heads", "2"}};
  const std::string path = dir.File("rt.safetensors");
  WriteSafetensors(path, tensors, meta);
  const SafetensorsFile f = ReadSafetensors(path);
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const Tensor& r = f.tensors.at(name);
    EXPECT_EQ(r.dtype, "F64") << name;
    EXPECT_EQ(r.shape, t.shape) << name;
    EXPECT_EQ(r.values, t.values) << name;
  }
  // No temporary file is left behind.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST(SafetensorsTest, RoundTripF32RoundsToNearestFloat) {
  TempDir dir;
  std::mt19937_64 rng(2);
  const Tensor t = RandomTensor(rng, {4, 6}, "F32");
  const std::string path = dir.File("f32.safetensors");
  WriteSafetensors(path, {{"w", t}});
  const SafetensorsFile f = ReadSafetensors(path);
  const Tensor& r = f.tensors.at("w");
  EXPECT_EQ(r.dtype, "F32");
  for (size_t i = 0; i < t.values.size(); ++i) EXPECT_EQ(r.values[i], double(float(t.values[i])));
}

TEST(SafetensorsTest, RoundTripF16AndBF16ExactValues) {
  TempDir dir;
  Tensor h{"F16", {2, 3}, {1.0, -2.0, 65504.0, std::ldexp(1.0, -24), 0.333251953125, -0.0}};
  Tensor b{"BF16", {4}, {1.0, -3.0, 3.140625, std::ldexp(1.0, -133)}};
  const std::string path = dir.File("half.safetensors");
  WriteSafetensors(path, {{"h", h}, {"b", b}});
  const SafetensorsFile f = ReadSafetensors(path);
  EXPECT_EQ(f.tensors.at("h").values, h.values);
  EXPECT_TRUE(std::signbit(f.tensors.at("h").values[5]));
  EXPECT_EQ(f.tensors.at("b").values, b.values);
  EXPECT_EQ(f.tensors.at("h").dtype, "F16");
  EXPECT_EQ(f.tensors.at("b").dtype, "BF16");
}

TEST(SafetensorsTest, WriteRefusesInexactHalfAndBadTensors) {
  TempDir dir;
  const std::string path = dir.File("x.safetensors");
  ExpectInputError([&] { WriteSafetensors(path, {{"h", Tensor{"F16", {1}, {0.1}}}}); }, path, "h", "F16");
  ExpectInputError([&] { WriteSafetensors(path, {{"h", Tensor{"F16", {1}, {70000.0}}}}); }, path, "h", "F16");
  ExpectInputError([&] { WriteSafetensors(path, {{"b", Tensor{"BF16", {1}, {1.0 + 1.0 / 1024}}}}); }, path, "b", "BF16");
  ExpectInputError([&] { WriteSafetensors(path, {{"n", Tensor{"F64", {1}, {NAN}}}}); }, path, "n", "NaN");
  ExpectInputError([&] { WriteSafetensors(path, {{"s", Tensor{"F64", {2, 2}, {1, 2, 3}}}}); }, path, "s", "shape");
  ExpectInputError([&] { WriteSafetensors(path, {{"d", Tensor{"I32", {1}, {1}}}}); }, path, "d", "I32");
  ExpectInputError([&] { WriteSafetensors(path, {{"o", Tensor{"F32", {1}, {1e300}}}}); }, path, "o", "F32");
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(SafetensorsTest, HalfBitPatterns) {
  EXPECT_EQ(HalfBitsToDouble(0x3C00), 1.0);
  EXPECT_EQ(HalfBitsToDouble(0xC000), -2.0);
  EXPECT_EQ(HalfBitsToDouble(0x7BFF), 65504.0);
  EXPECT_EQ(HalfBitsToDouble(0x0400), std::ldexp(1.0, -14));   // smallest normal
  EXPECT_EQ(HalfBitsToDouble(0x0001), std::ldexp(1.0, -24));   // smallest subnormal
  EXPECT_EQ(HalfBitsToDouble(0x03FF), 1023 * std::ldexp(1.0, -24));  // largest subnormal
  EXPECT_EQ(HalfBitsToDouble(0x3555), 0.333251953125);
  EXPECT_EQ(HalfBitsToDouble(0x3BFF), 1.0 - std::ldexp(1.0, -11));
  EXPECT_EQ(HalfBitsToDouble(0x3C01), 1.0 + std::ldexp(1.0, -10));
  EXPECT_TRUE(std::signbit(HalfBitsToDouble(0x8000)));
  EXPECT_EQ(HalfBitsToDouble(0x8000), 0.0);
  EXPECT_EQ(HalfBitsToDouble(0x7C00), std::numeric_limits<double>::infinity());
  EXPECT_EQ(HalfBitsToDouble(0xFC00), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(HalfBitsToDouble(0x7E00)));
  EXPECT_TRUE(std::isnan(HalfBitsToDouble(0x7C01)));
}

TEST(SafetensorsTest, BFloat16BitPatterns) {
  EXPECT_EQ(BFloat16BitsToDouble(0x3F80), 1.0);
  EXPECT_EQ(BFloat16BitsToDouble(0xC040), -3.0);
  EXPECT_EQ(BFloat16BitsToDouble(0x4049), 3.140625);
  EXPECT_EQ(BFloat16BitsToDouble(0x7F7F), 0x1.FEp127);  // largest finite
  EXPECT_EQ(BFloat16BitsToDouble(0x0080), std::ldexp(1.0, -126));
  EXPECT_EQ(BFloat16BitsToDouble(0x0001), std::ldexp(1.0, -133));
  EXPECT_EQ(BFloat16BitsToDouble(0x7F80), std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(BFloat16BitsToDouble(0x7FC0)));
}

TEST(SafetensorsTest, DecodesHandWrittenHalfFile) {
  TempDir dir;
  const std::string path = dir.File("h.safetensors");
  const std::string header =
      R"({"h":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
      R"("f":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})";
  WriteBytes(path, Raw(header, U16Bytes({0x3C00, 0xC000, 0x0001, 0x3555}) + U16Bytes({0x4049, 0xC040}) + F32Bytes({0.1f})));
  const SafetensorsFile f = ReadSafetensors(path);
  EXPECT_EQ(f.tensors.at("h").values, (std::vector<double>{1.0, -2.0, std::ldexp(1.0, -24), 0.333251953125}));
  EXPECT_EQ(f.tensors.at("b").values, (std::vector<double>{3.140625, -3.0}));
  EXPECT_EQ(f.tensors.at("f").values, (std::vector<double>{double(0.1f)}));
  const Eigen::MatrixXd m = TensorAsMatrix(f.tensors.at("h"), path, "h");
  EXPECT_EQ(m(0, 1), -2.0);  // row-major
  EXPECT_EQ(m(1, 0), std::ldexp(1.0, -24));
}

TEST(SafetensorsTest, TensorAsMatrixAndVectorCheckRank) {
  const Tensor t{"F64", {2, 3}, {1, 2, 3, 4, 5, 6}};
  const Eigen::MatrixXd m = TensorAsMatrix(t, "f", "t");
  EXPECT_EQ(m.rows(), 2);
  EXPECT_EQ(m(1, 2), 6);
  EXPECT_EQ(m(0, 2), 3);
  ExpectInputError([&] { TensorAsVector(t, "f", "t"); }, "f", "t", "1-D");
  ExpectInputError([&] { TensorAsMatrix(Tensor{"F64", {6}, {1, 2, 3, 4, 5, 6}}, "f", "v"); }, "f", "v", "2-D");
  ExpectInputError([&] { TensorAsMatrix(Tensor{"F64", {1, 2, 3}, {1, 2, 3, 4, 5, 6}}, "f", "c"); }, "f", "c", "2-D");
  EXPECT_EQ(TensorAsVector(Tensor{"F64", {3}, {7, 8, 9}}, "f", "v")(2), 9);
  const Tensor back = MatrixTensor(m);
  EXPECT_EQ(back.values, t.values);
}

// ---- malformed files: each must be an InputError naming the file and the field ----

struct BadCase {
  const char* label;
  std::string bytes;
  std::string field;
  std::string fragment;
};

class MalformedTest : public ::testing::TestWithParam<int> {};

std::vector<BadCase> BadCases() {
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string buf8 = F32Bytes({1.0f, 2.0f});
  std::vector<BadCase> c;
  c.push_back({"empty file", "", "header", "shorter than the 8-byte"});
  c.push_back({"five bytes", std::string("\x05\0\0\0\0", 5), "header", "shorter than the 8-byte"});
  c.push_back({"header length past the end", U64LE(100) + "{}", "header", "past the end"});
  c.push_back({"header length huge", U64LE(~uint64_t(0)) + "{}", "header", "exceeds the limit"});
  c.push_back({"header length over the bound", U64LE((100ull << 20) + 1) + "{}", "header", "exceeds the limit"});
  c.push_back({"bad JSON", Raw("{\"t\": [", ""), "header", "invalid JSON"});
  c.push_back({"not an object", Raw("[1, 2]", ""), "header", "not an object"});
  c.push_back({"invalid UTF-8", Raw("{\"\xff\xfe\": 1}", ""), "header", "invalid JSON"});
  c.push_back({"duplicate key", Raw("{" + ok_entry + "," + ok_entry + "}", buf8), "header", "duplicate key 't'"});
  c.push_back({"deep nesting", Raw(std::string(5000, '[') + std::string(5000, ']'), ""), "header", "nested deeper"});
  c.push_back({"entry not an object", Raw(R"({"t": 3})", ""), "t", "must be an object"});
  c.push_back({"missing dtype", Raw(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", buf8), "t", "dtype"});
  c.push_back({"missing shape", Raw(R"({"t":{"dtype":"F32","data_offsets":[0,8]}})", buf8), "t", "shape"});
  c.push_back({"offsets arity", Raw(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", buf8), "t", "data_offsets"});
  c.push_back({"extra key", Raw(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", buf8), "t", "unexpected key"});
  c.push_back({"negative dim", Raw(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", buf8), "t", "non-negative"});
  c.push_back({"float dim", Raw(R"({"t":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", buf8), "t", "non-negative integer"});
  c.push_back({"negative offset", Raw(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[-1,8]}})", buf8), "t", "data_offsets[0]"});
  c.push_back({"unknown dtype", Raw(R"({"t":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", buf8), "t", "unknown dtype 'Q7'"});
  c.push_back({"undecodable dtype", Raw(R"({"t":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", buf8), "t", "unsupported dtype 'I32'"});
  c.push_back({"begin > end", Raw(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", buf8), "t", "begin > end"});
  c.push_back({"end past buffer", Raw(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", buf8), "t", "past the buffer"});
  c.push_back({"size mismatch", Raw(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", buf8), "t", "needs 12 bytes"});
  c.push_back({"shape overflow", Raw(R"({"t":{"dtype":"F64","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,8]}})", buf8), "t", "overflows"});
  c.push_back({"bytes overflow", Raw(R"({"t":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", buf8), "t", "overflows"});
  c.push_back({"overlap", Raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", buf8), "b", "overlap"});
  c.push_back({"NaN F32", Raw(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", F32Bytes({1.0f, NAN})), "t", "NaN value at flat index 1"});
  c.push_back({"Inf F32", Raw(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", F32Bytes({-INFINITY, 1.0f})), "t", "Inf value at flat index 0"});
  c.push_back({"NaN F16", Raw(R"({"h":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})", U16Bytes({0x7E00})), "h", "NaN"});
  c.push_back({"Inf BF16", Raw(R"({"h":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}})", U16Bytes({0xFF80})), "h", "Inf"});
  c.push_back({"metadata not strings", Raw(R"({"__metadata__":{"heads":2}})", ""), "__metadata__.heads", "string"});
  c.push_back({"metadata not object", Raw(R"({"__metadata__":[1]})", ""), "__metadata__", "object"});
  c.push_back({"empty name", Raw(R"({"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", buf8), "header", "empty name"});
  return c;
}

TEST_P(MalformedTest, IsInputErrorNamingFileAndField) {
  const BadCase c = BadCases()[size_t(GetParam())];
  SCOPED_TRACE(c.label);
  TempDir dir;
  const std::string path = dir.File("bad.safetensors");
  WriteBytes(path, c.bytes);
  ExpectInputError([&] { ReadSafetensors(path); }, path, c.field, c.fragment);
  ExpectInputError([&] { ParseSafetensors(c.bytes, "mem"); }, "mem", c.field, c.fragment);
}

INSTANTIATE_TEST_SUITE_P(AllCases, MalformedTest, ::testing::Range(0, int(BadCases().size())));

TEST(SafetensorsTest, TruncatedValidFileIsRefusedAtEveryLength) {
  std::mt19937_64 rng(3);
  const std::string bytes = EncodeSafetensors({{"a", RandomTensor(rng, {2, 3}, "F32")}, {"b", RandomTensor(rng, {4}, "F64")}},
                                              {{"kind", "dot"}});
  ASSERT_NO_THROW(ParseSafetensors(bytes, "full"));
  for (size_t n = 0; n < bytes.size(); ++n) {
    try {
      ParseSafetensors(std::string_view(bytes).substr(0, n), "cut");
      ADD_FAILURE() << "a file cut to " << n << " bytes was accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.file, "cut");
    }
  }
}

TEST(SafetensorsTest, MissingFileAndDirectory) {
  TempDir dir;
  ExpectInputError([&] { ReadSafetensors(dir.File("nope.safetensors")); }, dir.File("nope.safetensors"), "file",
                   "no such file");
  ExpectInputError([&] { ReadSafetensors(dir.path().string()); }, dir.path().string(), "file", "not a regular file");
}

TEST(SafetensorsTest, HeaderOnlyReadKeepsUndecodableTensorsAndReadsOthersLazily) {
  TempDir dir;
  const std::string path = dir.File("mixed.safetensors");
  const std::string header =
      R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},"w":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},)"
      R"("__metadata__":{"format":"pt"}})";
  WriteBytes(path, Raw(header, std::string(16, '\x01') + F32Bytes({0.5f, -4.0f})));
  ExpectInputError([&] { ReadSafetensors(path); }, path, "ids", "unsupported dtype 'I64'");
  const SafetensorsHeader h = ReadSafetensorsHeader(path);
  EXPECT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.tensors.at("ids").dtype, "I64");
  EXPECT_EQ(ReadSafetensorsTensor(path, h, "w").values, (std::vector<double>{0.5, -4.0}));
  ExpectInputError([&] { ReadSafetensorsTensor(path, h, "ids"); }, path, "ids", "unsupported dtype");
  ExpectInputError([&] { ReadSafetensorsTensor(path, h, "zz"); }, path, "zz", "missing tensor");
}

TEST(SafetensorsTest, HeaderOnlyReadChecksAgainstFileSize) {
  TempDir dir;
  const std::string path = dir.File("short.safetensors");
  WriteBytes(path, Raw(R"({"t":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", std::string(8, '\0')));
  ExpectInputError([&] { ReadSafetensorsHeader(path); }, path, "t", "past the buffer");
  WriteBytes(path, U64LE(1000) + "{}");
  ExpectInputError([&] { ReadSafetensorsHeader(path); }, path, "header", "past the end");
}

TEST(SafetensorsTest, EncodedHeaderIsPaddedToEightBytes) {
  const std::string bytes = EncodeSafetensors({{"abc", Tensor{"F64", {1}, {2.5}}}});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[size_t(i)]);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 8);
}

TEST(SafetensorsTest, ErrorTextFromTheFileIsSanitised) {
  // A tensor name with a newline must not break the one-line error.
  const std::string bytes = Raw("{\"a\\nb\":{\"dtype\":\"Q7\",\"shape\":[],\"data_offsets\":[0,0]}}", "");
  try {
    ParseSafetensors(bytes, "m");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    EXPECT_EQ(e.field, "a\nb");
  }
}

}  // namespace
}  // namespace lipcert
