#include "models/sha256.h"

#include <gtest/gtest.h>

#include "tests/models/test_util.h"

namespace lipcert {
namespace {

// Known answers: FIPS 180-2 appendix B / NIST CSHA examples, and (for the padding
// boundaries) values from an independent implementation (Python's hashlib).
TEST(Sha256Test, NistVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                      "mnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, PaddingBoundaries) {
  const std::pair<int, const char*> cases[] = {
      {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
      {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
      {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
      {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
      {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
      {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
      {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"}};
  for (const auto& [n, hex] : cases) EXPECT_EQ(Sha256Hex(std::string(size_t(n), 'a')), hex) << n;
}

TEST(Sha256Test, IncrementalUpdatesMatchOneShot) {
  std::string msg;
  for (int i = 0; i < 300; ++i) msg.push_back(char(i * 37 + 11));
  const std::string whole = Sha256Hex(msg);
  for (size_t cut1 = 0; cut1 <= msg.size(); cut1 += 7)
    for (size_t cut2 = cut1; cut2 <= msg.size(); cut2 += 29) {
      Sha256 h;
      h.Update(std::string_view(msg).substr(0, cut1));
      h.Update(std::string_view(msg).substr(cut1, cut2 - cut1));
      h.Update(std::string_view(msg).substr(cut2));
      const auto d = h.Final();
      std::string hex;
      for (uint8_t b : d) {
        const char* digits = "0123456789abcdef";
        hex += digits[b >> 4];
        hex += digits[b & 15];
      }
      ASSERT_EQ(hex, whole) << cut1 << " " << cut2;
    }
}

TEST(Sha256Test, FileHashMatchesBytesHash) {
  testing::TempDir dir;
  // Larger than the 1 MiB read chunk, so that the chunk boundary is crossed.
  std::string bytes((1 << 20) + 12345, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char((i * 2654435761u) >> 13);
  testing::WriteBytes(dir.File("f.bin"), bytes);
  EXPECT_EQ(Sha256HexOfFile(dir.File("f.bin")), Sha256Hex(bytes));
  testing::WriteBytes(dir.File("a.bin"), "abc");
  EXPECT_EQ(Sha256HexOfFile(dir.File("a.bin")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  testing::ExpectInputError([&] { Sha256HexOfFile(dir.File("missing")); }, dir.File("missing"), "file");
}

}  // namespace
}  // namespace lipcert
