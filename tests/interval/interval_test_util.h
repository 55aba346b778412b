// Shared helpers for the interval/ tests: MPFR references at 256 bits, adversarial
// double generators, and the LIPCERT_TEST_SCALE count multiplier.
#pragma once

#include <mpfr.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "tests/common/test_scale.h"

namespace lipcert::testing {

struct Prec {
  mpfr_prec_t bits;
};

// An MPFR number at 256 bits (or another precision).
class Big {
 public:
  Big() : Big(Prec{256}) {}
  explicit Big(Prec p) { mpfr_init2(v_, p.bits); mpfr_set_zero(v_, 1); }
  explicit Big(double d) : Big(d, Prec{256}) {}
  Big(double d, Prec p) { mpfr_init2(v_, p.bits); mpfr_set_d(v_, d, MPFR_RNDN); }
  Big(const Big&) = delete;
  Big& operator=(const Big&) = delete;
  ~Big() { mpfr_clear(v_); }
  mpfr_ptr get() { return v_; }
  mpfr_srcptr get() const { return v_; }
  // <0, 0, >0 as this <, ==, > d. NaN compares as "unordered": returns 2.
  int Cmp(double d) const {
    if (std::isnan(d) || mpfr_nan_p(v_)) return 2;
    return mpfr_cmp_d(v_, d);
  }
  double ToDouble(mpfr_rnd_t r = MPFR_RNDN) const { return mpfr_get_d(v_, r); }

 private:
  mpfr_t v_;
};

// [lo, hi] = the 256-bit downward and upward roundings of f(x), from one evaluation
// (the ternary value says on which side the round-to-nearest result fell).
inline void EncloseUnary(int (*f)(mpfr_ptr, mpfr_srcptr, mpfr_rnd_t), double x, Big* lo, Big* hi) {
  Big bx(x);
  const int t = f(lo->get(), bx.get(), MPFR_RNDN);
  mpfr_set(hi->get(), lo->get(), MPFR_RNDN);
  if (t > 0) mpfr_nextbelow(lo->get());
  if (t < 0) mpfr_nextabove(hi->get());
}

// True iff lo <= exact (the exact value is enclosed from below by lo): checked by
// comparing with the 256-bit downward rounding of the exact value (equivalent, since lo
// is itself a 256-bit number).
inline bool BelowOrEqual(double lo, const Big& exact_down) { const int c = exact_down.Cmp(lo); return c != 2 && c >= 0; }
inline bool AboveOrEqual(double hi, const Big& exact_up) { const int c = exact_up.Cmp(hi); return c != 2 && c <= 0; }

// Adversarial doubles: random bit patterns over the full exponent range (subnormals
// included), values near 0, near overflow, small integers and halves (ties), powers of
// two, and the special values +-0, +-DBL_MIN, +-denorm_min, +-DBL_MAX. Always finite.
class AdversarialDoubles {
 public:
  explicit AdversarialDoubles(std::uint64_t seed) : rng_(seed) {}
  double Next() {
    const int cat = static_cast<int>(rng_() % 10);
    double x = 0;
    switch (cat) {
      case 0:
      case 1: {  // random finite bit pattern
        do {
          x = std::bit_cast<double>(rng_());
        } while (!std::isfinite(x));
        break;
      }
      case 2:
        x = Uniform(-1, 1);
        break;
      case 3:
        x = std::ldexp(Uniform(-1, 1), static_cast<int>(rng_() % 60) - 30);
        break;
      case 4: {  // subnormal
        std::uint64_t b = rng_() & ((std::uint64_t{1} << 52) - 1);
        x = std::bit_cast<double>(b);
        break;
      }
      case 5:  // near the underflow threshold
        x = std::ldexp(Uniform(0.5, 4), -1022 - static_cast<int>(rng_() % 8));
        break;
      case 6:  // near overflow
        x = std::numeric_limits<double>::max() * Uniform(0.25, 1.0);
        break;
      case 7:  // small integers and halves (ties in sums and products)
        x = static_cast<double>(static_cast<int>(rng_() % 64) - 32) * 0.5;
        break;
      case 8:  // powers of two and neighbours
        x = std::ldexp(1.0, static_cast<int>(rng_() % 2000) - 1000);
        if (rng_() % 2) x = std::nextafter(x, (rng_() % 2) ? 1e308 : 0.0);
        break;
      default: {
        static const double specials[] = {0.0,
                                          1.0,
                                          3.0,
                                          0x1p-53,
                                          1.0 + 0x1p-52,
                                          std::numeric_limits<double>::min(),
                                          std::numeric_limits<double>::denorm_min(),
                                          std::numeric_limits<double>::max(),
                                          0x1.fffffffffffffp-1,
                                          0x1p-1074 * 3};
        x = specials[rng_() % 10];
      }
    }
    return (rng_() % 2) ? -x : x;
  }
  // A second operand related to a (cancellation, ties, near-equal) or independent.
  double Related(double a) {
    switch (rng_() % 6) {
      case 0:
        return -a;  // exact cancellation
      case 1:
        return -std::nextafter(a, 0.0);  // near cancellation
      case 2:
        return std::ldexp(a, -53) * ((rng_() % 2) ? 1 : -1);  // a tie against a
      case 3:
        return a * Uniform(0.5, 2.0);
      default:
        return Next();
    }
  }
  double Uniform(double lo, double hi) {
    return lo + (hi - lo) * (static_cast<double>(rng_() >> 11) * 0x1p-53);
  }
  std::uint64_t Bits() { return rng_(); }

 private:
  std::mt19937_64 rng_;
};

}  // namespace lipcert::testing
