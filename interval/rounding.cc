#include "interval/rounding.h"

#include <cfenv>
#include <cstdio>
#include <cstdlib>

#include "interval/fp_environment.h"

namespace lipcert {

const char* RoundingModelName() {
  return "binary64 round-to-nearest + exact error terms (TwoSum/FMA) + one-ulp directed "
         "step; FPU mode never changed; midpoint-radius GEMM with gamma_k radius "
         "(docs/rounding-model.md)";
}

void RequireRoundToNearest() {
  const FpEnvironment e = CurrentFpEnvironment();
  if (!e.IsSound()) {
    std::fprintf(stderr,
                 "lipcert: interval/ requires round-to-nearest with flush-to-zero and "
                 "denormals-are-zero off in every thread, found %s; aborting (certificates "
                 "would be unsound)\n",
                 e.Describe().c_str());
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
