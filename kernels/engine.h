// Deprecated: the batched Jacobian-norm evaluator moved to kernels/evaluator.h (the
// certified bound engines are in certify/). Kept only so that existing includes compile.
#pragma once

#include "kernels/evaluator.h"
