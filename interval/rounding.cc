#include "interval/rounding.h"

#include <cfenv>
#include <cstdio>
#include <cstdlib>

namespace lipcert {

const char* RoundingModelName() {
  return "binary64 round-to-nearest + exact error terms (TwoSum/FMA) + one-ulp directed "
         "step; FPU mode never changed; midpoint-radius GEMM with gamma_k radius "
         "(docs/rounding-model.md)";
}

void RequireRoundToNearest() {
  if (std::fegetround() != FE_TONEAREST) {
    std::fprintf(stderr,
                 "lipcert: interval/ requires round-to-nearest in every thread, found "
                 "rounding mode %d; aborting (certificates would be unsound)\n",
                 std::fegetround());
    std::abort();
  }
}

double GammaUp(double k) {
  const double ku = MulUp(k, kUnitRoundoff);
  if (!(ku < 1.0)) return kInf;
  return DivUp(ku, SubDown(1.0, ku));
}

UpperBound MulNonneg(UpperBound a, UpperBound b) {
  if (a.value() < 0 || b.value() < 0) {
    std::fprintf(stderr, "lipcert: MulNonneg(UpperBound) on a negative bound\n");
    std::abort();
  }
  return UpperBound(MulUp(a.value(), b.value()));
}

LowerBound MulNonneg(LowerBound a, LowerBound b) {
  if (a.value() < 0 || b.value() < 0) {
    std::fprintf(stderr, "lipcert: MulNonneg(LowerBound) on a negative bound\n");
    std::abort();
  }
  return LowerBound(MulDown(a.value(), b.value()));
}

}  // namespace lipcert
