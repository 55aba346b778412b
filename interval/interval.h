// Interval scalars: an Interval is an enclosure [lo, hi] of an unknown real number.
//
// Endpoints may be infinite (an unbounded enclosure); NaN endpoints are never produced
// from valid inputs. All operations are inclusion-isotone and return enclosures of the
// exact real result (rounding model: interval/rounding.h, docs/rounding-model.md).
// Elementary functions (exp, log) are in interval/elementary.h.
#pragma once

#include <algorithm>
#include <string>

#include "interval/rounding.h"

namespace lipcert {

struct Interval {
  double lo = 0.0;
  double hi = 0.0;

  constexpr Interval() = default;
  // The degenerate enclosure [v, v] of an exactly representable number.
  constexpr explicit Interval(double v) : lo(v), hi(v) {}
  // Aborts unless lo <= hi (NaN endpoints included): a broken enclosure is a bug.
  Interval(double lo_, double hi_);

  static Interval Entire() { return Interval(-kInf, kInf); }
  // [lo, hi] without the check (for internal use where lo <= hi is proven).
  static constexpr Interval Unchecked(double l, double h) {
    Interval r;
    r.lo = l;
    r.hi = h;
    return r;
  }

  bool Contains(double x) const { return lo <= x && x <= hi; }
  bool Contains(const Interval& o) const { return lo <= o.lo && o.hi <= hi; }
  // Upper bound on hi - lo.
  double WidthUp() const { return SubUp(hi, lo); }
  // Upper bound on max(|lo|, |hi|) (exact).
  double Mag() const { return std::max(std::fabs(lo), std::fabs(hi)); }
  // min |x| over the interval (exact).
  double Mig() const { return (lo <= 0 && hi >= 0) ? 0.0 : std::min(std::fabs(lo), std::fabs(hi)); }
  UpperBound Upper() const { return UpperBound(hi); }
  LowerBound Lower() const { return LowerBound(lo); }
  std::string ToString() const;
};

Interval operator+(const Interval& a, const Interval& b);
Interval operator-(const Interval& a, const Interval& b);
Interval operator-(const Interval& a);
Interval operator*(const Interval& a, const Interval& b);
// Division by an interval that contains 0 gives Entire() (a valid, if useless, enclosure).
Interval operator/(const Interval& a, const Interval& b);
inline Interval& operator+=(Interval& a, const Interval& b) { return a = a + b; }
inline Interval& operator-=(Interval& a, const Interval& b) { return a = a - b; }
inline Interval& operator*=(Interval& a, const Interval& b) { return a = a * b; }

// Smallest interval holding both.
Interval Hull(const Interval& a, const Interval& b);
// Exact range of x^2 (not the product x*x, which overestimates when 0 is inside).
Interval Sqr(const Interval& x);
// sqrt over x intersected with [0, inf) (a negative part is dropped; hi < 0 aborts).
Interval Sqrt(const Interval& x);
// 1/x; Entire() when 0 is inside.
Interval Recip(const Interval& x);
// 1/sqrt(x) for x > 0 (the LayerNorm scale); Entire() unless x.lo > 0.
Interval InvSqrt(const Interval& x);
// Exact range of t(1 - t) over t in x (dependency-free: max 1/4 at t = 1/2).
Interval TOneMinusTRange(const Interval& x);

}  // namespace lipcert
