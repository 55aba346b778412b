// Certified upper bounds on sup_{X in S} ||J_f(X)|| through the Jacobian's block structure
// (docs/engines.md derives every inequality used). One header for the callers of the
// structured engines; each idea lives in its own file:
//   certify/token_cover.h        TokenCover, CoverOf, JointRadiusUp
//   certify/engine_bound.h       BoundOptions (with its deadline), BoundTerm, EngineBound
//   certify/layer_norm_cover.h   the cover of the MHA input through LayerNorm
//   certify/head_factors.h       per-head geometry, softmax ranges, factor bounds
//   certify/l2_caps.h            radius-free bounds of L2 heads
//   certify/dense_jacobian.h     the dense interval Jacobian at a centre
//   certify/block_norm_engine.h  engine `block_norm` (any size, norm 2 or inf)
//   certify/centred_engine.h     engine `centred` (norm 2, N*D <= dense_limit)
//   interval/vector_norms.h      the rigorous norm and distance helpers they share
#pragma once

#include "certify/block_norm_engine.h"
#include "certify/centred_engine.h"
#include "certify/engine_bound.h"
#include "certify/head_factors.h"
#include "certify/l2_caps.h"
#include "certify/layer_norm_cover.h"
#include "certify/token_cover.h"
