#include "interval/fp_environment.h"

#include <atomic>
#include <cfenv>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "interval/rounding.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define LIPCERT_FP_MXCSR 1
#elif defined(__aarch64__)
#define LIPCERT_FP_FPCR 1
#endif

namespace lipcert {

namespace {

std::atomic<std::uint64_t> g_repairs{0};

#if defined(LIPCERT_FP_MXCSR)
constexpr std::uint32_t kFtz = 1u << 15;          // flush-to-zero (results)
constexpr std::uint32_t kDaz = 1u << 6;           // denormals-are-zero (inputs)
constexpr std::uint32_t kRoundBits = 3u << 13;    // SSE rounding control, 00 = nearest
constexpr std::uint32_t kControl = kFtz | kDaz | kRoundBits;
std::uint32_t ReadControl() { return _mm_getcsr(); }
void WriteControl(std::uint32_t v) { _mm_setcsr(v); }
#elif defined(LIPCERT_FP_FPCR)
constexpr std::uint32_t kFz = 1u << 24;           // FPCR.FZ flushes inputs and results
constexpr std::uint32_t kRoundBits = 3u << 22;    // FPCR.RMode, 00 = nearest
constexpr std::uint32_t kControl = kFz | kRoundBits;
std::uint32_t ReadControl() {
  std::uint64_t v;
  asm volatile("mrs %0, fpcr" : "=r"(v));
  return std::uint32_t(v);
}
void WriteControl(std::uint32_t v) {
  const std::uint64_t w = v;
  asm volatile("msr fpcr, %0" : : "r"(w));
}
#else
constexpr std::uint32_t kControl = 0;
std::uint32_t ReadControl() { return 0; }
void WriteControl(std::uint32_t) {}
#endif

FpFlag Flag(bool on) { return on ? FpFlag::kOn : FpFlag::kOff; }

// Round-to-nearest and gradual underflow, observed on the arithmetic itself. Opaque()
// keeps the compiler from folding the operations at compile time. Only normal numbers
// are compared (DAZ makes a comparison read a subnormal operand as zero too).
bool ArithmeticProbe() {
  const double t = Opaque(0x1p-60);
  const bool nearest = Opaque(1.0 + t) == 1.0 && Opaque(-1.0 - t) == -1.0 && Opaque(1.0 - t) == 1.0;
  // 2^-1022 * 0.5 = 2^-1023 is a subnormal result (0 under FTZ), scaled back up.
  const bool no_ftz = Opaque(Opaque(Opaque(0x1p-1022) * 0.5) * 0x1p100) == 0x1p-923;
  // 2^-1074 is a subnormal input (read as 0 under DAZ).
  const bool no_daz = Opaque(Opaque(0x1p-1074) * 0x1p100) == 0x1p-974;
  return nearest && no_ftz && no_daz;
}

const char* RoundingModeName(int mode) {
  switch (mode) {
    case FE_TONEAREST: return "FE_TONEAREST";
#ifdef FE_UPWARD
    case FE_UPWARD: return "FE_UPWARD";
#endif
#ifdef FE_DOWNWARD
    case FE_DOWNWARD: return "FE_DOWNWARD";
#endif
#ifdef FE_TOWARDZERO
    case FE_TOWARDZERO: return "FE_TOWARDZERO";
#endif
    default: return "unknown";
  }
}

}  // namespace

const char* FpFlagToString(FpFlag f) {
  switch (f) {
    case FpFlag::kOff: return "off";
    case FpFlag::kOn: return "on";
    case FpFlag::kUnknown: return "unknown";
  }
  return "unknown";
}

bool FpEnvironment::IsSound() const {
  return rounding_mode == FE_TONEAREST && register_round_to_nearest != FpFlag::kOff &&
         flush_to_zero != FpFlag::kOn && denormals_are_zero != FpFlag::kOn && arithmetic_probe_ok;
}

std::string FpEnvironment::Describe() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "rounding mode %s, control-register rounding %s, flush-to-zero %s, "
                "denormals-are-zero %s, arithmetic probe %s",
                RoundingModeName(rounding_mode),
                register_round_to_nearest == FpFlag::kOn    ? "nearest"
                : register_round_to_nearest == FpFlag::kOff ? "NOT nearest"
                                                       : "unknown",
                FpFlagToString(flush_to_zero), FpFlagToString(denormals_are_zero),
                arithmetic_probe_ok ? "ok" : "FAILED");
  return buf;
}

FpEnvironment CurrentFpEnvironment() {
  FpEnvironment e;
  e.rounding_mode = std::fegetround();
#if defined(LIPCERT_FP_MXCSR)
  const std::uint32_t c = ReadControl();
  e.register_round_to_nearest = Flag((c & kRoundBits) == 0);
  e.flush_to_zero = Flag((c & kFtz) != 0);
  e.denormals_are_zero = Flag((c & kDaz) != 0);
#elif defined(LIPCERT_FP_FPCR)
  const std::uint32_t c = ReadControl();
  e.register_round_to_nearest = Flag((c & kRoundBits) == 0);
  e.flush_to_zero = Flag((c & kFz) != 0);
  e.denormals_are_zero = e.flush_to_zero;
#endif
  e.arithmetic_probe_ok = ArithmeticProbe();
  return e;
}

void RequireSoundFpEnvironment() {
  const FpEnvironment e = CurrentFpEnvironment();
  if (!e.IsSound())
    throw std::runtime_error(
        "lipcert: the floating-point environment breaks the rounding model (needs "
        "round-to-nearest with flush-to-zero and denormals-are-zero off; "
        "docs/rounding-model.md): " + e.Describe());
}

ScopedSoundFpEnvironment::ScopedSoundFpEnvironment(FpPolicy policy) : entry_(CurrentFpEnvironment()) {
  if (entry_.IsSound()) return;
  if (policy == FpPolicy::kRefuse)
    throw std::runtime_error(
        "lipcert: refusing certified arithmetic: the floating-point environment breaks "
        "the rounding model (needs round-to-nearest with flush-to-zero and "
        "denormals-are-zero off; docs/rounding-model.md): " + entry_.Describe());
  saved_control_ = ReadControl();
  std::fesetround(FE_TONEAREST);
  WriteControl(ReadControl() & ~kControl);
  repaired_ = true;
  g_repairs.fetch_add(1, std::memory_order_relaxed);
  const FpEnvironment now = CurrentFpEnvironment();
  if (!now.IsSound()) {
    // An architecture whose flush controls we cannot reach: nothing certified can run.
    std::fprintf(stderr, "lipcert: could not establish the rounding model's floating-point "
                         "environment (%s); aborting\n", now.Describe().c_str());
    std::abort();
  }
}

ScopedSoundFpEnvironment::~ScopedSoundFpEnvironment() {
  if (!repaired_) return;
  std::fesetround(entry_.rounding_mode);
  WriteControl((ReadControl() & ~kControl) | (saved_control_ & kControl));
}

std::uint64_t FpEnvironmentRepairs() { return g_repairs.load(std::memory_order_relaxed); }

}  // namespace lipcert
