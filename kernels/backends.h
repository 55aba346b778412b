// Factories of the back ends behind MakeJacobianEngine (internal to kernels/). Each is
// called with a validated layer and options.
#pragma once

#include <memory>

#include "kernels/engine.h"

namespace lipcert::kernels_internal {

std::unique_ptr<JacobianEngine> MakeCpuEngine(const AttentionLayer& layer, int tokens,
                                              const EngineOptions& options);
#if defined(LIPCERT_HAVE_CUDA)
std::unique_ptr<JacobianEngine> MakeCudaEngine(const AttentionLayer& layer, int tokens,
                                               const EngineOptions& options);
#endif

}  // namespace lipcert::kernels_internal
