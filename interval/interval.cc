#include "interval/interval.h"

#include <cstdio>
#include <cstdlib>

namespace lipcert {

Interval::Interval(double lo_, double hi_) : lo(lo_), hi(hi_) {
  if (!(lo_ <= hi_)) {
    std::fprintf(stderr, "lipcert: invalid interval [%.17g, %.17g]\n", lo_, hi_);
    std::abort();
  }
}

std::string Interval::ToString() const {
  char buf[80];
  std::snprintf(buf, sizeof buf, "[%.17g, %.17g]", lo, hi);
  return buf;
}

Interval operator+(const Interval& a, const Interval& b) {
  return Interval::Unchecked(AddDown(a.lo, b.lo), AddUp(a.hi, b.hi));
}

Interval operator-(const Interval& a, const Interval& b) {
  return Interval::Unchecked(SubDown(a.lo, b.hi), SubUp(a.hi, b.lo));
}

Interval operator-(const Interval& a) { return Interval::Unchecked(-a.hi, -a.lo); }

Interval operator*(const Interval& a, const Interval& b) {
  // Four endpoint products (0 * inf == 0 in MulUp/MulDown), each rounded outward.
  const double lo = std::min(std::min(MulDown(a.lo, b.lo), MulDown(a.lo, b.hi)),
                             std::min(MulDown(a.hi, b.lo), MulDown(a.hi, b.hi)));
  const double hi = std::max(std::max(MulUp(a.lo, b.lo), MulUp(a.lo, b.hi)),
                             std::max(MulUp(a.hi, b.lo), MulUp(a.hi, b.hi)));
  return Interval::Unchecked(lo, hi);
}

namespace {
// Quotient endpoint with the conventions x/inf == 0 and inf/inf handled by the caller.
double DivEndDown(double a, double b) {
  if (std::isinf(a) && std::isinf(b)) return -kInf;  // unbounded / unbounded: give up
  return DivDown(a, b);
}
double DivEndUp(double a, double b) {
  if (std::isinf(a) && std::isinf(b)) return kInf;
  return DivUp(a, b);
}
}  // namespace

Interval operator/(const Interval& a, const Interval& b) {
  if (b.lo <= 0 && b.hi >= 0) return Interval::Entire();
  const double lo = std::min(std::min(DivEndDown(a.lo, b.lo), DivEndDown(a.lo, b.hi)),
                             std::min(DivEndDown(a.hi, b.lo), DivEndDown(a.hi, b.hi)));
  const double hi = std::max(std::max(DivEndUp(a.lo, b.lo), DivEndUp(a.lo, b.hi)),
                             std::max(DivEndUp(a.hi, b.lo), DivEndUp(a.hi, b.hi)));
  return Interval::Unchecked(lo, hi);
}

Interval Hull(const Interval& a, const Interval& b) {
  return Interval::Unchecked(std::min(a.lo, b.lo), std::max(a.hi, b.hi));
}

Interval Sqr(const Interval& x) {
  const double mig = x.Mig(), mag = x.Mag();
  return Interval::Unchecked(MulDown(mig, mig), MulUp(mag, mag));
}

Interval Sqrt(const Interval& x) {
  if (x.hi < 0) {
    std::fprintf(stderr, "lipcert: Sqrt of negative interval %s\n", x.ToString().c_str());
    std::abort();
  }
  const double lo = x.lo <= 0 ? 0.0 : SqrtDown(x.lo);
  return Interval::Unchecked(lo, SqrtUp(x.hi));
}

Interval Recip(const Interval& x) { return Interval(1.0) / x; }

Interval InvSqrt(const Interval& x) {
  if (!(x.lo >= 0)) return Interval::Entire();
  const double lo = x.hi == kInf ? 0.0 : DivDown(1.0, SqrtUp(x.hi));
  const double hi = x.lo == 0 ? kInf : DivUp(1.0, SqrtDown(x.lo));
  return Interval::Unchecked(lo, hi);
}

Interval TOneMinusTRange(const Interval& x) {
  // f(t) = t (1 - t) increases on t <= 1/2 and decreases on t >= 1/2. Enclose f at the
  // endpoints by interval products (exact point operands, so only rounding widens them).
  auto f = [](double t) { return Interval(t) * (Interval(1.0) - Interval(t)); };
  const Interval fa = f(x.lo), fb = f(x.hi);
  double lo = std::min(fa.lo, fb.lo);
  double hi;
  if (x.hi <= 0.5) {
    hi = fb.hi;
  } else if (x.lo >= 0.5) {
    hi = fa.hi;
  } else {
    hi = 0.25;
  }
  if (std::isinf(x.lo) || std::isinf(x.hi)) lo = -kInf;
  hi = std::min(hi, 0.25);  // the global maximum of t(1 - t)
  return Interval::Unchecked(lo, hi);
}

}  // namespace lipcert
