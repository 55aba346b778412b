#include "interval/elementary.h"

#include <mpfr.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "interval/fp_environment.h"

namespace lipcert {

namespace {

std::atomic<ExpBackend> g_default_backend{ExpBackend::kFastWidened};

// A per-thread MPFR scratch variable at 53 bits (MPFR's own caches are thread-local in
// Debian's build; mpfr_t values must not be shared between threads).
struct MpfrScratch {
  mpfr_t x, y;
  MpfrScratch() {
    mpfr_init2(x, 53);
    mpfr_init2(y, 53);
  }
  ~MpfrScratch() {
    mpfr_clear(x);
    mpfr_clear(y);
  }
};
MpfrScratch& Scratch() {
  thread_local MpfrScratch s;
  return s;
}

// MPFR's exponent range is wider than binary64's, so the 53-bit result is rounded a
// second time by mpfr_get_d in the same direction when it lands in the subnormal or
// overflow range. Two roundings in the same direction still bound the exact value.
double MpfrExp(double v, mpfr_rnd_t rnd) {
  MpfrScratch& s = Scratch();
  mpfr_set_d(s.x, v, MPFR_RNDN);  // exact
  mpfr_exp(s.y, s.x, rnd);
  return mpfr_get_d(s.y, rnd);
}
double MpfrLog(double v, mpfr_rnd_t rnd) {
  MpfrScratch& s = Scratch();
  mpfr_set_d(s.x, v, MPFR_RNDN);
  mpfr_log(s.y, s.x, rnd);
  return mpfr_get_d(s.y, rnd);
}

// log(DBL_MAX) = 709.78...; above this exp overflows.
constexpr double kExpOverflowArg = 709.79;
// exp(x) < 2^-1075 (rounds to 0 in every direction but up) below this.
constexpr double kExpUnderflowArg = -745.2;

double FastExpUpper(double x) {
  if (x != x) return x;
  if (x == -kInf) return 0.0;
  if (x > kExpOverflowArg) return kInf;
  if (x < kExpUnderflowArg) return 0x1p-1074;  // exp(x) < 2^-1075 < eta
  const double y = std::exp(x);
  if (std::isinf(y)) return kInf;
  return NextUp(NextUp(y));
}

double FastExpLower(double x) {
  if (x != x) return x;
  if (x == kInf) return kInf;
  if (x < kExpUnderflowArg) return 0.0;
  const double y = std::exp(x);
  if (std::isinf(y)) return NextDown(NextDown(kMaxDouble));  // true value >= DBL_MAX - 1 ulp
  const double l = NextDown(NextDown(y));
  return l > 0 ? l : 0.0;  // never negative
}

double FastLogUpper(double x) {
  if (x != x || x < 0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0) return -kInf;
  if (x == kInf) return kInf;
  if (x == 1.0) return 0.0;  // exact
  return NextUp(NextUp(std::log(x)));
}

double FastLogLower(double x) {
  if (x != x || x < 0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0) return -kInf;
  if (x == kInf) return kInf;
  if (x == 1.0) return 0.0;
  return NextDown(NextDown(std::log(x)));
}

}  // namespace

const char* ExpBackendName(ExpBackend b) {
  switch (b) {
    case ExpBackend::kMpfr:
      return "mpfr-53-directed";
    case ExpBackend::kFastWidened:
      return "libm-rn-widened-2ulp";
  }
  return "unknown";
}

bool StringToExpBackend(const std::string& s, ExpBackend* b) {
  if (s == "mpfr" || s == ExpBackendName(ExpBackend::kMpfr)) {
    *b = ExpBackend::kMpfr;
    return true;
  }
  if (s == "fast" || s == ExpBackendName(ExpBackend::kFastWidened)) {
    *b = ExpBackend::kFastWidened;
    return true;
  }
  return false;
}

ExpBackend DefaultExpBackend() { return g_default_backend.load(std::memory_order_relaxed); }
void SetDefaultExpBackend(ExpBackend b) { g_default_backend.store(b, std::memory_order_relaxed); }

double ExpUpper(double x, ExpBackend b) {
  return b == ExpBackend::kMpfr ? MpfrExp(x, MPFR_RNDU) : FastExpUpper(x);
}
double ExpLower(double x, ExpBackend b) {
  if (b == ExpBackend::kMpfr) {
    const double r = MpfrExp(x, MPFR_RNDD);
    return r > 0 ? r : 0.0;  // -0 -> 0
  }
  return FastExpLower(x);
}
double LogUpper(double x, ExpBackend b) {
  if (b == ExpBackend::kMpfr) {
    if (x != x || x < 0) return std::numeric_limits<double>::quiet_NaN();
    return MpfrLog(x, MPFR_RNDU);
  }
  return FastLogUpper(x);
}
double LogLower(double x, ExpBackend b) {
  if (b == ExpBackend::kMpfr) {
    if (x != x || x < 0) return std::numeric_limits<double>::quiet_NaN();
    return MpfrLog(x, MPFR_RNDD);
  }
  return FastLogLower(x);
}

Interval Exp(const Interval& x, ExpBackend b) {
  return Interval::Unchecked(ExpLower(x.lo, b), ExpUpper(x.hi, b));
}

Interval Log(const Interval& x, ExpBackend b) {
  if (x.hi < 0) {
    std::fprintf(stderr, "lipcert: Log of negative interval %s\n", x.ToString().c_str());
    std::abort();
  }
  const double lo = x.lo <= 0 ? -kInf : LogLower(x.lo, b);
  return Interval::Unchecked(lo, LogUpper(x.hi, b));
}

NumericsTag CurrentNumericsTag(ExpBackend b) {
  return {RoundingModelName(), ExpBackendName(b), FpEnvironmentRepairs()};
}

}  // namespace lipcert
