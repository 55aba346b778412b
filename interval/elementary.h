// Rigorous elementary functions behind one interface with two back ends.
//
//   kMpfr        MPFR at 53 bits with MPFR_RNDD / MPFR_RNDU: correctly rounded bounds
//                (about 1 us a call). Sound without any assumption on libm.
//   kFastWidened glibc exp/log called in round-to-nearest, widened outward by two ulps
//                (nextafter twice). Sound UNDER THE STATED ASSUMPTION that glibc's exp and
//                log are within 1 ulp of the exact value for every double input (glibc
//                documents < 0.52 ulp on x86_64; verified against MPFR in
//                tests/interval/elementary_test.cc). Under/overflow handled: the exp lower
//                bound is never negative, the upper bound of a huge argument is +inf.
//
// Every certificate records ExpBackendName() of the back end it used, together with
// RoundingModelName() (interval/rounding.h).
#pragma once

#include <cstdint>

#include "interval/interval.h"

namespace lipcert {

enum class ExpBackend { kMpfr, kFastWidened };

const char* ExpBackendName(ExpBackend b);  // "mpfr-53-directed" / "libm-rn-widened-2ulp"
// Returns false (and leaves *b alone) for a string that is not a back-end name
// ("mpfr" and "fast" are accepted as short names).
bool StringToExpBackend(const std::string& s, ExpBackend* b);

// The process-wide default used by the overloads without a back-end argument
// (kFastWidened unless changed). Thread-safe (an atomic).
ExpBackend DefaultExpBackend();
void SetDefaultExpBackend(ExpBackend b);

// Scalar bounds: ExpLower(x) <= exp(x) <= ExpUpper(x); LogLower(x) <= log(x) <= LogUpper(x)
// (log of 0 is -inf; log of a negative number is NaN, never a bound).
double ExpUpper(double x, ExpBackend b);
double ExpLower(double x, ExpBackend b);
double LogUpper(double x, ExpBackend b);
double LogLower(double x, ExpBackend b);
inline double ExpUpper(double x) { return ExpUpper(x, DefaultExpBackend()); }
inline double ExpLower(double x) { return ExpLower(x, DefaultExpBackend()); }
inline double LogUpper(double x) { return LogUpper(x, DefaultExpBackend()); }
inline double LogLower(double x) { return LogLower(x, DefaultExpBackend()); }

// Interval versions (monotone). Log of an interval reaching <= 0 has lo = -inf; hi < 0
// aborts.
Interval Exp(const Interval& x, ExpBackend b);
Interval Log(const Interval& x, ExpBackend b);
inline Interval Exp(const Interval& x) { return Exp(x, DefaultExpBackend()); }
inline Interval Log(const Interval& x) { return Log(x, DefaultExpBackend()); }

// What a certificate records about the numerics that produced it.
struct NumericsTag {
  const char* rounding_model;  // RoundingModelName()
  const char* exp_backend;     // ExpBackendName(b)
  // FpEnvironmentRepairs() when the tag was taken (interval/fp_environment.h): a
  // certificate whose count at the end exceeds the count at the start ran in a thread
  // whose FTZ/DAZ or rounding mode had to be repaired.
  std::uint64_t fp_environment_repairs;
};
NumericsTag CurrentNumericsTag(ExpBackend b);
inline NumericsTag CurrentNumericsTag() { return CurrentNumericsTag(DefaultExpBackend()); }

}  // namespace lipcert
