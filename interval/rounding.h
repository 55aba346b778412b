// Directed rounding without touching the floating-point environment.
//
// Rounding model (docs/rounding-model.md has the proofs and the platform assumptions):
//   * Every double operation in this project is evaluated in IEEE 754 binary64,
//     round-to-nearest-even (the default mode; lipcert calls fesetround only to restore
//     it, interval/fp_environment.h).
//   * A directed result is obtained from the round-to-nearest result plus an exact
//     error term (TwoSum for + and -, FMA for x, / and sqrt): if the error is positive
//     (negative) the result is stepped one ulp up (down). The result is the correctly
//     rounded upward (downward) value wherever the error term is exact, and one ulp
//     wider in the subnormal range where it is not. No mode is switched around an
//     operation, so the functions are immune to compilers moving operations across
//     fesetround (GCC bug 34678).
//   * The calling thread must round to nearest with gradual underflow (no FTZ/DAZ). The
//     entry points of interval/ establish that with ScopedSoundFpEnvironment
//     (interval/fp_environment.h); RequireRoundToNearest() asserts it.
#pragma once

#if defined(__FAST_MATH__)
#error "lipcert interval/: -ffast-math (or -Ofast) breaks the rounding model; build without it"
#endif
#if defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__
#error "lipcert interval/: -ffinite-math-only breaks the rounding model (infinities are used)"
#endif
#if !defined(LIPCERT_ROUNDING_MATH)
#error "lipcert interval/: LIPCERT_ROUNDING_MATH is not defined: compile with the project's flags (-frounding-math -fno-fast-math -DLIPCERT_ROUNDING_MATH=1)"
#endif
#if defined(__FLT_EVAL_METHOD__) && __FLT_EVAL_METHOD__ != 0
#error "lipcert interval/: needs FLT_EVAL_METHOD == 0 (SSE2 doubles, no x87 excess precision)"
#endif

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace lipcert {

static_assert(std::numeric_limits<double>::is_iec559, "IEEE 754 binary64 required");
static_assert(std::numeric_limits<double>::digits == 53, "binary64 required");
static_assert(std::numeric_limits<double>::has_denorm == std::denorm_present,
              "gradual underflow required");

// Unit roundoff of round-to-nearest binary64 and the smallest subnormal.
inline constexpr double kUnitRoundoff = 0x1p-53;  // u
inline constexpr double kEta = 0x1p-1074;         // eta
inline constexpr double kMaxDouble = std::numeric_limits<double>::max();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// Below this magnitude the FMA error term of x, / and sqrt may be inexact; the
// functions then step one ulp outward unconditionally (sound, one ulp wide).
inline constexpr double kExactErrorThreshold = 0x1p-900;

// One string for the certificate: which rounding model produced the numbers.
const char* RoundingModelName();

// Aborts (in every build type) when the calling thread is not in round-to-nearest or has
// flush-to-zero / denormals-are-zero on (FpEnvironment::IsSound()).
void RequireRoundToNearest();

// Keeps the compiler from reasoning about v (CGAL-style opacification).
inline double Opaque(double v) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("" : "+x"(v));
#elif defined(__GNUC__)
  asm volatile("" : "+r"(v));
#endif
  return v;
}

// The next double towards +inf / -inf (NaN stays NaN, +inf stays +inf).
constexpr double NextUp(double x) {
  if (x != x || x == kInf) return x;
  if (x == -kInf) return -kMaxDouble;
  if (x == 0.0) return 0x1p-1074;
  std::uint64_t b = std::bit_cast<std::uint64_t>(x);
  b = x > 0 ? b + 1 : b - 1;
  return std::bit_cast<double>(b);
}
constexpr double NextDown(double x) { return -NextUp(-x); }

namespace rounding_internal {
// Round-to-nearest result s = fl(a+b) overflowed although a and b are finite.
inline double OverflowUp(double s) { return s > 0 ? kInf : -kMaxDouble; }
}  // namespace rounding_internal

// ---- + and - -----------------------------------------------------------------------
// Smallest double >= a + b (exact sum). NaN in, NaN out.
inline double AddUp(double a, double b) {
  const double s = a + b;
  if (!std::isfinite(s)) {
    if (std::isfinite(a) && std::isfinite(b)) return rounding_internal::OverflowUp(s);
    return s;  // an infinite operand: exact (or NaN)
  }
  const double bb = s - a;
  double e = (a - (s - bb)) + (b - bb);  // TwoSum: a + b == s + e exactly
  if (!std::isfinite(e)) {
    // Spurious overflow inside TwoSum (only for operands near DBL_MAX): the halves are
    // exact there and give the error of the half sum, which has the same sign.
    const double ha = a * 0.5, hb = b * 0.5, hs = ha + hb, hbb = hs - ha;
    e = (ha - (hs - hbb)) + (hb - hbb);
    if (!std::isfinite(e)) return NextUp(s);  // never seen; stepping is still sound
  }
  return e > 0 ? NextUp(s) : s;
}
inline double AddDown(double a, double b) { return -AddUp(-a, -b); }
inline double SubUp(double a, double b) { return AddUp(a, -b); }
inline double SubDown(double a, double b) { return -AddUp(-a, b); }

// ---- x -------------------------------------------------------------------------------
// Upper bound on a*b; 0 * anything (including inf) is 0, the interval convention.
inline double MulUp(double a, double b) {
  if (a == 0.0 || b == 0.0) return 0.0;
  const double p = a * b;
  if (!std::isfinite(p)) {
    if (std::isfinite(a) && std::isfinite(b)) return rounding_internal::OverflowUp(p);
    return p;
  }
  if (std::fabs(p) < kExactErrorThreshold) {
    // The error term may be inexact here; a product that rounded to zero has the sign
    // of a*b, otherwise one step up is an upper bound (possibly one ulp loose).
    if (p == 0.0) return (a > 0) == (b > 0) ? 0x1p-1074 : 0.0;
    return NextUp(p);
  }
  const double e = std::fma(a, b, -p);  // exact: a*b == p + e
  return e > 0 ? NextUp(p) : p;
}
inline double MulDown(double a, double b) { return -MulUp(-a, b); }

// ---- / -------------------------------------------------------------------------------
// Upper bound on a/b for b != 0 (b == 0 gives the IEEE quotient: +-inf or NaN).
inline double DivUp(double a, double b) {
  if (b == 0.0) return a / b;
  if (a == 0.0) return 0.0;
  const double q = a / b;
  if (!std::isfinite(q)) {
    if (std::isfinite(a) && std::isfinite(b)) return rounding_internal::OverflowUp(q);
    return q;
  }
  if (std::isinf(b)) return q;  // finite / inf == 0 exactly
  if (std::fabs(q) < kExactErrorThreshold) {
    if (q == 0.0) return (a > 0) == (b > 0) ? 0x1p-1074 : 0.0;
    return NextUp(q);
  }
  if (std::fabs(a) < kExactErrorThreshold) {
    // Scale both operands by 2^600 (exact: |a| < 2^-900, and |b| = |a/q| < 1): same
    // quotient, and the remainder below is then exact.
    a *= 0x1p600;
    b *= 0x1p600;
  }
  const double r = std::fma(-q, b, a);  // exact: a - q*b
  // a/b - q == r/b: positive iff r and b have the same sign.
  const bool above = (r > 0 && b > 0) || (r < 0 && b < 0);
  return above ? NextUp(q) : q;
}
inline double DivDown(double a, double b) { return -DivUp(-a, b); }

// ---- sqrt ----------------------------------------------------------------------------
// a < 0 gives NaN.
inline double SqrtUp(double a) {
  if (!(a > 0.0) || a == kInf) return std::sqrt(a);
  const double s = std::sqrt(a);
  if (a < kExactErrorThreshold) return NextUp(s);
  const double r = std::fma(-s, s, a);  // exact: a - s^2
  return r > 0 ? NextUp(s) : s;
}
inline double SqrtDown(double a) {
  if (!(a > 0.0) || a == kInf) return std::sqrt(a);
  const double s = std::sqrt(a);
  if (a < kExactErrorThreshold) return NextDown(s);
  const double r = std::fma(-s, s, a);
  return r < 0 ? NextDown(s) : s;
}

// Cheaper upper bounds, at most one ulp looser than the Up functions: in round-to-nearest
// the exact result is less than one gap away from fl(result), so the next double up
// bounds it (overflow to +inf stays +inf; a result that underflowed to 0 steps to eta).
// Used in O(n^2) loops of the matrix code where the last ulp does not matter.
inline double AddUpLoose(double a, double b) { return NextUp(a + b); }
inline double MulUpLoose(double a, double b) { return (a == 0.0 || b == 0.0) ? 0.0 : NextUp(a * b); }
inline double DivUpLoose(double a, double b) { return a == 0.0 ? 0.0 : NextUp(a / b); }

// gamma_k = k u / (1 - k u) rounded up (Higham's constant); +inf when k u >= 1.
double GammaUp(double k);

// ---- bounds whose direction is in the type --------------------------------------------
// A certified upper bound on some real quantity. Construction is explicit so that a
// plain double (or a lower bound) is never silently taken for an upper bound.
// A NaN value becomes +inf (always a valid upper bound).
class UpperBound {
 public:
  explicit constexpr UpperBound(double v) : v_(v != v ? kInf : v) {}
  constexpr double value() const { return v_; }

 private:
  double v_;
};

// A certified (or witnessed) lower bound on some real quantity.
// A NaN value becomes -inf.
class LowerBound {
 public:
  explicit constexpr LowerBound(double v) : v_(v != v ? -kInf : v) {}
  constexpr double value() const { return v_; }

 private:
  double v_;
};

// Sums and products of bounds, rounded in the bound's direction.
inline UpperBound operator+(UpperBound a, UpperBound b) {
  return UpperBound(AddUp(a.value(), b.value()));
}
inline LowerBound operator+(LowerBound a, LowerBound b) {
  return LowerBound(AddDown(a.value(), b.value()));
}
// Valid as a bound on x*y when both quantities are >= 0 (aborts on a negative bound).
UpperBound MulNonneg(UpperBound a, UpperBound b);
LowerBound MulNonneg(LowerBound a, LowerBound b);
// Monotone maps.
inline UpperBound SqrtUpper(UpperBound a) { return UpperBound(SqrtUp(a.value())); }
inline LowerBound SqrtLower(LowerBound a) {
  return LowerBound(a.value() <= 0 ? 0.0 : SqrtDown(a.value()));
}
inline UpperBound Min(UpperBound a, UpperBound b) {
  return UpperBound(a.value() < b.value() ? a.value() : b.value());
}
inline LowerBound Max(LowerBound a, LowerBound b) {
  return LowerBound(a.value() > b.value() ? a.value() : b.value());
}
inline UpperBound Max(UpperBound a, UpperBound b) {
  return UpperBound(a.value() > b.value() ? a.value() : b.value());
}

}  // namespace lipcert
