// The run-time floating-point environment (interval/fp_environment.h): a thread with
// flush-to-zero / denormals-are-zero or a non-nearest rounding mode gets correct,
// MPFR-checked results through ScopedSoundFpEnvironment and ParallelFor; the strict
// policy throws; the caller's state is restored.
#include "interval/fp_environment.h"

#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <cfenv>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "interval/elementary.h"
#include "interval/interval_matrix.h"
#include "interval/norms.h"
#include "interval/parallel.h"
#include "interval/rounding.h"
#include "interval/softmax.h"
#include "tests/interval/interval_test_util.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define LIPCERT_TEST_MXCSR 1
#endif

namespace lipcert {
namespace {

using testing::Big;

constexpr std::uint32_t kFtz = 1u << 15, kDaz = 1u << 6;

// a + b is the subnormal 2^-1022 - 3 * 2^-1074, exactly representable: TwoSum is
// error-free and AddUp(a, b) == AddDown(a, b) == a + b in a sound environment. Under FTZ
// the sum flushes to 0 (AddUp = 0 < a + b); under DAZ b reads as 0 (AddDown = a > a + b).
constexpr double kA = 0x1p-1022, kB = -3 * 0x1p-1074;
constexpr double kExactSum = 0x1p-1022 - 3 * 0x1p-1074;

// Sets MXCSR FTZ/DAZ in the calling thread (x86 only).
void SetFlush(std::uint32_t bits) {
#if defined(LIPCERT_TEST_MXCSR)
  _mm_setcsr((_mm_getcsr() & ~(kFtz | kDaz)) | bits);
#else
  (void)bits;
#endif
}
std::uint32_t FlushBits() {
#if defined(LIPCERT_TEST_MXCSR)
  return _mm_getcsr() & (kFtz | kDaz);
#else
  return 0;
#endif
}

// AddUp / AddDown of kA, kB evaluated now, in the calling thread's environment. The
// operands come through volatile reads and the results leave through volatile writes, so
// the compiler can neither fold the sums nor move them across the guard's calls.
struct SumResult {
  double up, down;
};
SumResult SumNow() {
  volatile double a = kA, b = kB;
  volatile double up = AddUp(Opaque(a), Opaque(b));
  volatile double down = AddDown(Opaque(a), Opaque(b));
  return {up, down};
}

// Runs fn in a fresh thread (so the test thread's environment stays clean).
template <class Fn>
void InThread(Fn fn) {
  std::thread t(fn);
  t.join();
}

TEST(FpEnvironmentTest, ProcessAndNewThreadsAreSound) {
  // The main thread: false in a binary linked with crtfastmath.o (-ffast-math at link).
  const FpEnvironment e = CurrentFpEnvironment();
  EXPECT_TRUE(e.IsSound()) << e.Describe();
  EXPECT_EQ(e.rounding_mode, FE_TONEAREST);
  EXPECT_TRUE(e.arithmetic_probe_ok);
#if defined(LIPCERT_TEST_MXCSR)
  EXPECT_EQ(e.flush_to_zero, FpFlag::kOff) << e.Describe();
  EXPECT_EQ(e.denormals_are_zero, FpFlag::kOff) << e.Describe();
  EXPECT_EQ(e.register_round_to_nearest, FpFlag::kOn);
#endif
  FpEnvironment t;
  InThread([&] { t = CurrentFpEnvironment(); });
  EXPECT_TRUE(t.IsSound()) << t.Describe();
  // The reference values hold here.
  const SumResult s = SumNow();
  EXPECT_EQ(s.up, kExactSum);
  EXPECT_EQ(s.down, kExactSum);
}

TEST(FpEnvironmentTest, ReferenceSumIsExactPerMpfr) {
  Big x(kA), y(kB), z;
  mpfr_add(z.get(), x.get(), y.get(), MPFR_RNDN);  // exact at 256 bits
  EXPECT_EQ(z.Cmp(kExactSum), 0);
  EXPECT_GT(kExactSum, 0.0);
  EXPECT_LT(kExactSum, 0x1p-1022);  // subnormal
}

#if defined(LIPCERT_TEST_MXCSR)

TEST(FpEnvironmentTest, FlushToZeroBreaksTwoSumAndTheGuardRepairsIt) {
  SumResult raw{}, guarded{};
  FpEnvironment inside, after;
  bool repaired = false;
  std::uint32_t bits_after = 0;
  const std::uint64_t before = FpEnvironmentRepairs();
  InThread([&] {
    SetFlush(kFtz);
    raw = SumNow();
    {
      const ScopedSoundFpEnvironment guard;
      repaired = guard.repaired();
      inside = CurrentFpEnvironment();
      guarded = SumNow();
    }
    after = CurrentFpEnvironment();
    bits_after = FlushBits();
  });
  // Unguarded under FTZ the "upper bound" is 0, below the exact sum: unsound.
  EXPECT_EQ(raw.up, 0.0);
  EXPECT_LT(raw.up, kExactSum);
  // Guarded: the error-free result.
  EXPECT_TRUE(repaired);
  EXPECT_TRUE(inside.IsSound()) << inside.Describe();
  EXPECT_EQ(guarded.up, kExactSum);
  EXPECT_EQ(guarded.down, kExactSum);
  // The caller's FTZ is back after the scope; the repair was counted.
  EXPECT_EQ(bits_after, kFtz);
  EXPECT_EQ(after.flush_to_zero, FpFlag::kOn);
  EXPECT_FALSE(after.IsSound());
  EXPECT_GE(FpEnvironmentRepairs(), before + 1);
}

TEST(FpEnvironmentTest, DenormalsAreZeroBreaksTwoSumAndTheGuardRepairsIt) {
  SumResult raw{}, guarded{};
  std::uint32_t bits_after = 0;
  FpEnvironment entry;
  InThread([&] {
    SetFlush(kDaz);
    raw = SumNow();
    {
      const ScopedSoundFpEnvironment guard;
      entry = guard.entry();
      guarded = SumNow();
    }
    bits_after = FlushBits();
  });
  // Unguarded under DAZ b reads as 0: the "lower bound" is 2^-1022, above the exact sum.
  EXPECT_EQ(raw.down, kA);
  EXPECT_GT(raw.down, kExactSum);
  EXPECT_EQ(entry.denormals_are_zero, FpFlag::kOn);
  EXPECT_FALSE(entry.arithmetic_probe_ok);
  EXPECT_EQ(guarded.up, kExactSum);
  EXPECT_EQ(guarded.down, kExactSum);
  EXPECT_EQ(bits_after, kDaz);
}

// The guarded entry points of interval/ repair the environment themselves: interval
// matrix sums and products on subnormal data, in a thread with FTZ and DAZ on, enclose
// the exact (MPFR) values. Unguarded, the sum's enclosure would be the point 0.
TEST(FpEnvironmentTest, IntervalMatrixEntryPointsAreCorrectUnderFtzDaz) {
  Eigen::MatrixXd a(2, 2), b(2, 2);
  a << kA, 0x1p-1060, 3.0, -0x1p-1040;
  b << kB, 0x1p-1070, 0x1p-1050, 5 * 0x1p-1074;
  IntervalMatrix sum, prod;
  std::uint32_t bits_after = 0;
  InThread([&] {
    SetFlush(kFtz | kDaz);
    sum = IntervalMatrix::Point(a) + IntervalMatrix::Point(b);
    prod = Mul(a, b);
    bits_after = FlushBits();
  });
  EXPECT_EQ(bits_after, kFtz | kDaz);  // each entry point put the caller's state back
  EXPECT_EQ(sum.mid(0, 0), kExactSum);
  int checked = 0;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      Big x(a(i, j)), y(b(i, j)), s;
      mpfr_add(s.get(), x.get(), y.get(), MPFR_RNDN);  // exact at 256 bits
      EXPECT_TRUE(testing::BelowOrEqual(SubDown(sum.mid(i, j), sum.rad(i, j)), s)) << i << j;
      EXPECT_TRUE(testing::AboveOrEqual(AddUp(sum.mid(i, j), sum.rad(i, j)), s)) << i << j;
      Big p, t;
      for (int k = 0; k < 2; ++k) {
        Big u(a(i, k)), v(b(k, j));
        mpfr_mul(t.get(), u.get(), v.get(), MPFR_RNDN);  // exact: 106 bits < 256
        mpfr_add(p.get(), p.get(), t.get(), MPFR_RNDN);
      }
      EXPECT_TRUE(testing::BelowOrEqual(SubDown(prod.mid(i, j), prod.rad(i, j)), p)) << i << j;
      EXPECT_TRUE(testing::AboveOrEqual(AddUp(prod.mid(i, j), prod.rad(i, j)), p)) << i << j;
      ++checked;
    }
  EXPECT_EQ(checked, 4);
}

// Softmax ranges and norm bounds are guarded entry points: in a thread with FTZ, DAZ
// and upward rounding they return the same bits as in a sound thread (whose results the
// softmax and norm tests check against MPFR and witnesses), also where the exponentials
// and the data are subnormal.
TEST(FpEnvironmentTest, SoftmaxAndNormsGiveTheSameBitsInASpoiledThread) {
  Eigen::VectorXd l(4), u(4);
  l << 0.0, -740.0, -744.0, -20.0;  // e^-740 ~ 2^-1067.6: subnormal terms
  u << 0.5, -739.0, -743.5, -19.0;
  Eigen::MatrixXd m(3, 3);
  m << 1.0, 0x1p-1050, -2.0, 0x1p-1070, 3.0, 0.5, -1.0, 7 * 0x1p-1074, 2.0;
  const ProbabilityBounds clean = SoftmaxRange(l, u);
  const UpperBound clean_norm = NormL2Upper(m), clean_crude = NormL2UpperCrude(m);
  const LowerBound clean_lower = NormL2Lower(m);
  ProbabilityBounds spoiled;
  double spoiled_norm = 0, spoiled_crude = 0, spoiled_lower = 0;
  InThread([&] {
    SetFlush(kFtz | kDaz);
    std::fesetround(FE_UPWARD);
    spoiled = SoftmaxRange(l, u);
    spoiled_norm = NormL2Upper(m).value();
    spoiled_crude = NormL2UpperCrude(m).value();
    spoiled_lower = NormL2Lower(m).value();
  });
  // p_1 ~ e^-739 ~ 2^-1066: its upper bound is a subnormal DivUp (0 under FTZ: unsound).
  EXPECT_GT(clean.hi[1], 0.0);
  EXPECT_LT(clean.hi[1], 0x1p-1000);
  int compared = 0;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(std::bit_cast<std::uint64_t>(spoiled.lo[i]), std::bit_cast<std::uint64_t>(clean.lo[i])) << i;
    EXPECT_EQ(std::bit_cast<std::uint64_t>(spoiled.hi[i]), std::bit_cast<std::uint64_t>(clean.hi[i])) << i;
    ++compared;
  }
  EXPECT_EQ(compared, 4);
  EXPECT_EQ(spoiled_norm, clean_norm.value());
  EXPECT_EQ(spoiled_crude, clean_crude.value());
  EXPECT_EQ(spoiled_lower, clean_lower.value());
  EXPECT_LE(clean_lower.value(), clean_norm.value());
}

#endif  // LIPCERT_TEST_MXCSR

TEST(FpEnvironmentTest, NonNearestRoundingModeIsRepairedAndRestored) {
  for (const int mode : {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO}) {
    double raw = 0, guarded = 0;
    int mode_inside = -1, mode_after = -1;
    bool repaired = false;
    InThread([&] {
      std::fesetround(mode);
      // 1 + 2^-60 (upward) or 1 - 2^-60 (downward, toward zero) is 1 only in nearest.
      volatile double one = 1.0, tiny = mode == FE_UPWARD ? 0x1p-60 : -0x1p-60;
      volatile double r = Opaque(one) + Opaque(tiny);
      raw = r;
      {
        const ScopedSoundFpEnvironment guard;
        repaired = guard.repaired();
        mode_inside = std::fegetround();
        volatile double g = Opaque(one) + Opaque(tiny);
        guarded = g;
      }
      mode_after = std::fegetround();
    });
    EXPECT_NE(raw, 1.0) << "mode " << mode;  // the thread really rounded away from nearest
    EXPECT_TRUE(repaired) << mode;
    EXPECT_EQ(mode_inside, FE_TONEAREST) << mode;
    EXPECT_EQ(guarded, 1.0) << mode;  // 1 +- 2^-60 rounds to 1 in round-to-nearest
    EXPECT_EQ(mode_after, mode);
  }
}

TEST(FpEnvironmentTest, StrictPolicyThrowsAndChangesNothing) {
  std::string what;
  int mode_after = -1;
  bool sound_refused = true;
  InThread([&] {
    {
      // Sound: the strict guard accepts.
      const ScopedSoundFpEnvironment ok(FpPolicy::kRefuse);
      sound_refused = ok.repaired();
    }
    std::fesetround(FE_UPWARD);
    try {
      const ScopedSoundFpEnvironment guard(FpPolicy::kRefuse);
    } catch (const std::runtime_error& e) {
      what = e.what();
    }
    mode_after = std::fegetround();
  });
  EXPECT_FALSE(sound_refused);
  EXPECT_NE(what.find("refusing certified arithmetic"), std::string::npos) << what;
  EXPECT_NE(what.find("FE_UPWARD"), std::string::npos) << what;
  EXPECT_EQ(mode_after, FE_UPWARD);  // refused, not repaired

  bool threw = false;
  InThread([&] {
    std::fesetround(FE_DOWNWARD);
    try {
      RequireSoundFpEnvironment();
    } catch (const std::runtime_error&) {
      threw = true;
    }
  });
  EXPECT_TRUE(threw);
  EXPECT_NO_THROW(RequireSoundFpEnvironment());
}

// ParallelFor runs every item under the guard: in a calling thread (and hence in the
// share of work it does itself) with FTZ/DAZ and upward rounding, each item computes the
// error-free subnormal sum; afterwards the caller's environment is back.
TEST(FpEnvironmentTest, ParallelForItemsRunSound) {
  constexpr int kItems = 64;
  std::vector<double> up(kItems, -1), down(kItems, -1);
  std::vector<int> sound(kItems, 0);
  std::uint32_t bits_after = 0;
  int mode_after = -1;
  InThread([&] {
    SetFlush(kFtz | kDaz);
    std::fesetround(FE_UPWARD);
    ParallelFor(kItems, 4, [&](int i, int worker) {
      // A worker thread spoils its own environment: the next item's guard repairs it.
      if (worker != 0 && i % 2) {
        SetFlush(kFtz);
        std::fesetround(FE_DOWNWARD);
        return;
      }
      sound[i] = CurrentFpEnvironment().IsSound();
      const SumResult s = SumNow();
      up[i] = s.up;
      down[i] = s.down;
    });
    bits_after = FlushBits();
    mode_after = std::fegetround();
  });
  int computed = 0;
  for (int i = 0; i < kItems; ++i) {
    if (up[i] == -1) continue;  // an item that only spoiled its worker
    EXPECT_EQ(sound[i], 1) << i;
    EXPECT_EQ(up[i], kExactSum) << i;
    EXPECT_EQ(down[i], kExactSum) << i;
    ++computed;
  }
  EXPECT_GE(computed, kItems / 2);
  EXPECT_EQ(mode_after, FE_UPWARD);
#if defined(LIPCERT_TEST_MXCSR)
  EXPECT_EQ(bits_after, kFtz | kDaz);
#endif
}

TEST(FpEnvironmentTest, NumericsTagCarriesTheRepairCount) {
  const std::uint64_t before = CurrentNumericsTag().fp_environment_repairs;
  EXPECT_EQ(before, FpEnvironmentRepairs());
  InThread([&] {
    std::fesetround(FE_UPWARD);
    const ScopedSoundFpEnvironment guard;
    const ScopedSoundFpEnvironment nested;  // finds a sound environment: no repair
    EXPECT_FALSE(nested.repaired());
  });
  EXPECT_EQ(CurrentNumericsTag().fp_environment_repairs, before + 1);
}

#if defined(LIPCERT_TEST_MXCSR)
TEST(FpEnvironmentDeathTest, RequireRoundToNearestRefusesFlushToZero) {
  EXPECT_DEATH(
      {
        SetFlush(kFtz);
        RequireRoundToNearest();
      },
      "flush-to-zero on");
}
#endif

TEST(FpEnvironmentTest, FlagNamesAndDescription) {
  EXPECT_STREQ(FpFlagToString(FpFlag::kOff), "off");
  EXPECT_STREQ(FpFlagToString(FpFlag::kOn), "on");
  EXPECT_STREQ(FpFlagToString(FpFlag::kUnknown), "unknown");
  const std::string d = CurrentFpEnvironment().Describe();
  EXPECT_NE(d.find("FE_TONEAREST"), std::string::npos) << d;
  EXPECT_NE(d.find("probe ok"), std::string::npos) << d;
}

}  // namespace
}  // namespace lipcert
