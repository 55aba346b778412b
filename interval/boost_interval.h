// Boost.Interval on the project's mode-free rounding.
//
// Boost.Interval's default policy for double switches the FPU rounding mode and is sound
// only with -frounding-math and opacified operands (GCC bug 34678), and never in a thread
// that did not set the mode. ModeFreeRounding implements Boost's Rounding concept with
// the directed operations of interval/rounding.h and the elementary functions of
// interval/elementary.h instead, so `BoostInterval` can be used from any thread and under
// any optimisation level. Use it where Boost's interval algorithms serve (hull,
// intersect, width, subset tests, transcendental functions); the engines use the plain
// `Interval` struct (interval/interval.h), which converts both ways.
#pragma once

#include <boost/numeric/interval.hpp>

#include "interval/elementary.h"
#include "interval/interval.h"

namespace lipcert {

struct ModeFreeRounding {
  // Boost's "unprotect" machinery: there is no mode to protect, so the unprotected
  // rounding is this same class.
  typedef ModeFreeRounding unprotected_rounding;

  template <class U>
  double conv_down(U const& v) {
    return static_cast<double>(v);  // only exact conversions (double, int < 2^53) are used
  }
  template <class U>
  double conv_up(U const& v) {
    return static_cast<double>(v);
  }
  double add_down(double x, double y) { return AddDown(x, y); }
  double add_up(double x, double y) { return AddUp(x, y); }
  double sub_down(double x, double y) { return SubDown(x, y); }
  double sub_up(double x, double y) { return SubUp(x, y); }
  double mul_down(double x, double y) { return MulDown(x, y); }
  double mul_up(double x, double y) { return MulUp(x, y); }
  double div_down(double x, double y) { return DivDown(x, y); }
  double div_up(double x, double y) { return DivUp(x, y); }
  double median(double x, double y) { return 0.5 * x + 0.5 * y; }  // any point inside
  double sqrt_down(double x) { return SqrtDown(x); }
  double sqrt_up(double x) { return SqrtUp(x); }
  double int_down(double x) { return std::floor(x); }
  double int_up(double x) { return std::ceil(x); }
  double exp_down(double x) { return ExpLower(x); }
  double exp_up(double x) { return ExpUpper(x); }
  double log_down(double x) { return LogLower(x); }
  double log_up(double x) { return LogUpper(x); }
};

using BoostInterval = boost::numeric::interval<
    double, boost::numeric::interval_lib::policies<
                boost::numeric::interval_lib::save_state_nothing<ModeFreeRounding>,
                boost::numeric::interval_lib::checking_strict<double>>>;

inline BoostInterval ToBoost(const Interval& x) { return BoostInterval(x.lo, x.hi); }
inline Interval FromBoost(const BoostInterval& x) { return Interval(x.lower(), x.upper()); }

}  // namespace lipcert
