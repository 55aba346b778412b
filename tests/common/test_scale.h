// LIPCERT_TEST_SCALE multiplies the case counts of the property tests (default 1).
#pragma once

#include <cstdlib>

namespace lipcert::testing {

inline double TestScale() {
  const char* s = std::getenv("LIPCERT_TEST_SCALE");
  if (!s) return 1.0;
  const double v = std::atof(s);
  return v > 0 ? v : 1.0;
}

// `base` cases scaled by LIPCERT_TEST_SCALE, at least 1.
inline long Count(long base) {
  const double c = static_cast<double>(base) * TestScale();
  return c < 1 ? 1 : static_cast<long>(c);
}

}  // namespace lipcert::testing
