// A program linked WITH -ffast-math (so GCC/clang add crtfastmath.o, which turns on
// FTZ/DAZ before main) that then uses the guard: scripts/interval-matrix.sh builds it by
// hand, bypassing CMake's flag stripping. Exit 0: the start-up state was unsound (the
// probe is meaningful), ScopedSoundFpEnvironment and ParallelFor repaired it (an
// error-free subnormal TwoSum is exact), and the caller's FTZ/DAZ came back afterwards.
// Exit 1 with a message otherwise; exit 77 where start-up was already sound (nothing
// to check, e.g. a toolchain without crtfastmath.o).
#include <bit>
#include <cstdint>
#include <cstdio>

#include "interval/fp_environment.h"
#include "interval/parallel.h"
#include "interval/rounding.h"

namespace {

constexpr double kA = 0x1p-1022, kB = -3 * 0x1p-1074;
constexpr double kExactSum = 0x1p-1022 - 3 * 0x1p-1074;

double SumUpNow() {
  volatile double a = kA, b = kB;
  volatile double up = lipcert::AddUp(lipcert::Opaque(a), lipcert::Opaque(b));
  return up;
}

}  // namespace

int main() {
  using namespace lipcert;
  const FpEnvironment start = CurrentFpEnvironment();
  std::printf("fastmath-link-probe: at start of main: %s\n", start.Describe().c_str());
  if (start.IsSound()) {
    std::printf("fastmath-link-probe: start-up environment is sound; nothing to check\n");
    return 77;
  }
  const double raw = SumUpNow();
  double guarded = -1;
  bool repaired = false;
  {
    const ScopedSoundFpEnvironment guard;
    repaired = guard.repaired();
    volatile double v = SumUpNow();
    guarded = v;
  }
  double items[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  ParallelFor(8, 4, [&](int i, int) { items[i] = SumUpNow(); });
  const FpEnvironment after = CurrentFpEnvironment();
  int bad = 0;
  if (!repaired) { std::printf("FAIL: guard did not repair\n"); ++bad; }
  // Compare bit patterns: the caller's DAZ would make a comparison read subnormals as 0.
  auto same = [](double x) { return std::bit_cast<std::uint64_t>(x) == std::bit_cast<std::uint64_t>(kExactSum); };
  if (!same(guarded)) { std::printf("FAIL: guarded AddUp is not the exact sum\n"); ++bad; }
  for (int i = 0; i < 8; ++i)
    if (!same(items[i])) { std::printf("FAIL: ParallelFor item %d is not the exact sum\n", i); ++bad; }
  if (after.IsSound()) { std::printf("FAIL: the caller's environment was not restored\n"); ++bad; }
  std::printf("fastmath-link-probe: unguarded AddUp %s the exact subnormal sum; guarded and "
              "ParallelFor results %s; %llu repairs\n",
              same(raw) ? "gave" : "MISSED", bad ? "WRONG" : "exact",
              static_cast<unsigned long long>(FpEnvironmentRepairs()));
  return bad ? 1 : 0;
}
