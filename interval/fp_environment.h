// The floating-point environment the rounding model needs, checked where certified
// arithmetic runs (docs/rounding-model.md, "Floating-point environment at run time").
//
// interval/ computes directed results from round-to-nearest results plus exact error
// terms (TwoSum, FMA). That is sound only while the calling thread
//   * rounds to nearest (fegetround() == FE_TONEAREST, and on x86-64 the SSE rounding
//     field of MXCSR, which fesetround sets too but _mm_setcsr can set alone), and
//   * keeps gradual underflow: no flush-to-zero of results (FTZ, MXCSR bit 15) and no
//     denormals-are-zero on inputs (DAZ, MXCSR bit 6). A program linked with -ffast-math
//     gets both from GCC's crtfastmath.o at start-up; any library may set them.
// The environment is per thread. ScopedSoundFpEnvironment establishes it for a scope
// (the entry points of interval/, every ParallelFor item) and puts the caller's state
// back on exit; each repair is counted process-wide (FpEnvironmentRepairs()) so that a
// certificate can say its environment had to be repaired.
#pragma once

#include <cstdint>
#include <string>

namespace lipcert {

// A control bit that this architecture may or may not let us read.
enum class FpFlag { kOff, kOn, kUnknown };
const char* FpFlagToString(FpFlag f);  // "off" / "on" / "unknown"

// The calling thread's floating-point environment, as far as the rounding model cares.
struct FpEnvironment {
  int rounding_mode = -1;  // fegetround()
  // The vector unit's own rounding field: x86-64 MXCSR bits 13-14 == 0, aarch64 FPCR.RMode.
  FpFlag register_round_to_nearest = FpFlag::kUnknown;
  FpFlag flush_to_zero = FpFlag::kUnknown;       // x86-64: MXCSR bit 15; aarch64: FPCR.FZ
  FpFlag denormals_are_zero = FpFlag::kUnknown;  // x86-64: MXCSR bit 6; aarch64: FPCR.FZ
  // Behavioural probe, on every architecture: 1 + 2^-60, -1 - 2^-60 and 1 - 2^-60 round
  // to +-1; (2^-1022 * 0.5) * 2^100 gives 2^-923 (fails under FTZ); 2^-1074 * 2^100
  // gives 2^-974 (fails under DAZ).
  bool arithmetic_probe_ok = false;

  // Round-to-nearest, no FTZ/DAZ, probe passed.
  bool IsSound() const;
  // One line naming every field, e.g. "rounding mode FE_DOWNWARD, ..., flush-to-zero on, ...".
  std::string Describe() const;
};

// Reads the calling thread's environment.
FpEnvironment CurrentFpEnvironment();

// How a guard treats an unsound environment.
enum class FpPolicy {
  kRepair,  // set round-to-nearest, clear FTZ/DAZ, count the repair (the default)
  kRefuse,  // throw std::runtime_error naming what is wrong; nothing is changed
};

// For its scope, the calling thread runs in round-to-nearest with FTZ and DAZ off. On
// exit the caller's rounding mode and FTZ/DAZ bits are put back if they were changed
// (exception flags raised inside the scope are kept). Nesting is free: an inner guard
// finds a sound environment and changes nothing. Not copyable; one thread only.
// Place it before the scope's floating-point work reads its operands (the guards of
// interval/ sit at the top of functions taking matrices/vectors by reference, which the
// compiler cannot load before the guard's out-of-line constructor has run).
class ScopedSoundFpEnvironment {
 public:
  explicit ScopedSoundFpEnvironment(FpPolicy policy = FpPolicy::kRepair);
  ~ScopedSoundFpEnvironment();
  ScopedSoundFpEnvironment(const ScopedSoundFpEnvironment&) = delete;
  ScopedSoundFpEnvironment& operator=(const ScopedSoundFpEnvironment&) = delete;

  // True when the environment at entry was unsound and this guard repaired it.
  bool repaired() const { return repaired_; }
  // The caller's environment at entry.
  const FpEnvironment& entry() const { return entry_; }

 private:
  FpEnvironment entry_;
  bool repaired_ = false;
  std::uint32_t saved_control_ = 0;  // x86-64: MXCSR at entry; aarch64: FPCR
};

// Throws std::runtime_error when the calling thread's environment is unsound (the strict
// policy without a scope).
void RequireSoundFpEnvironment();

// Number of repairs made by every ScopedSoundFpEnvironment in this process so far.
// A certificate compares the count before and after its computation.
std::uint64_t FpEnvironmentRepairs();

}  // namespace lipcert
