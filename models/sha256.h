// SHA-256 (FIPS 180-4), used to fingerprint checkpoints in certificates.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace lipcert {

// Incremental hasher: Update any number of times, then Final once.
class Sha256 {
 public:
  Sha256();
  void Update(std::string_view bytes);
  std::array<uint8_t, 32> Final();

 private:
  void Block(const uint8_t* p);
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> pending_;
  size_t pending_size_ = 0;
  uint64_t total_bytes_ = 0;
};

// Lower-case hex digest of bytes.
std::string Sha256Hex(std::string_view bytes);
// Lower-case hex digest of a file's contents, read in chunks. Throws InputError(path, "file", ...).
std::string Sha256HexOfFile(const std::string& path);
// The running program's build: the hex digest of its executable (/proc/self/exe), computed
// once; "unknown" where it cannot be read. Journals of sweeps and audits carry it, so that
// a rebuilt lipcert certifies their points again instead of resuming another build's results.
const std::string& ExecutableSha256();

}  // namespace lipcert
