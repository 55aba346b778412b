// Factories of the back ends behind MakeJacobianEvaluator (internal to kernels/). Each is
// called with a validated layer and options.
#pragma once

#include <memory>

#include "kernels/evaluator.h"

namespace lipcert::kernels_internal {

std::unique_ptr<JacobianEvaluator> MakeCpuEvaluator(const AttentionLayer& layer, int tokens,
                                                    const EvaluatorOptions& options);
#if defined(LIPCERT_HAVE_CUDA)
std::unique_ptr<JacobianEvaluator> MakeCudaEvaluator(const AttentionLayer& layer, int tokens,
                                                     const EvaluatorOptions& options);
#endif

}  // namespace lipcert::kernels_internal
