// Closed-form certificates: the published bounds, with every weight norm bounded
// rigorously. They are the baselines every other engine must beat.
//
//   closed_form/castin   dot-product attention on B_R^N (Castin, Ablin, Peyre, ICML 2024):
//       Lip(head | B_R^N) <= sqrt(3) ||V||_2 (||A||_2^2 R^4 (4N + 1) + N)^{1/2},
//       A = Wq_h^T Wk_h / sqrt(dk), V = Wv_h; biases enter by augmenting every token with a
//       constant 1 (R -> sqrt(R^2 + 1)); heads combine through ||Wo_h||_2. Norm 2, no mask.
//   closed_form/kim      L2 attention (Kim, Papamakarios, Mnih, ICML 2021, Theorem 3.2), global:
//       Lip_2 <= sqrt(N)/sqrt(dk) (4 W0((N-1)/e) + 1) sqrt(sum_h ||Wq_h||^4 ||Wv_h||^2) ||Wo||_2.
//       The value path X A_h Wv_h^T carries A_h = Wq_h^T Wq_h / sqrt(dk), hence ||Wq_h||^4:
//       with ||Wq_h||^2 as transcribed in the notes the bound fails already at N = 1
//       (J = Wo Wv A), which the soundness test caught. Norm 2, no mask.
//   closed_form/kim_inf  the same paper's l_inf bound, for L2 attention without LayerNorm:
//       Lip_inf <= (4 W0((N-1)/e) + 1/sqrt(dk)) ||Wo||_inf max_h ||Wq_h||_1 ||Wq_h||_inf max_h ||Wv_h||_inf
//       (nn.Linear convention; the paper's W^Q = Wq^T). Computed in a form never above it:
//       with y = Z Wq_h^T / dk^(1/4) the head is (I (x) Wo_h Wv_h Wq_h^T / dk^(1/4)) g(y), g the
//       unit-weight L2 attention on dk dimensions, ||J_g||_inf <= 1 + 4 sqrt(dk) W0((N-1)/e)
//       (docs/engines.md), and the heads combine by a sum or through ||Wo||_inf and a max.
// With the sublayer X + MHA(LN(X)) both become 1 + ell * bound, ell >= sup ||J_LN|| over
// the set, and R is the largest token norm of LN(X) over the set.
#pragma once

#include <optional>
#include <string>

#include "certify/input_set.h"
#include "certify/token_cover.h"
#include "interval/rounding.h"
#include "models/attention_layer.h"

namespace lipcert {

struct ClosedFormBound {
  std::string name;   // "closed_form/castin", "closed_form/kim", "closed_form/kim_inf"
  UpperBound upper{kInf};
};

// Castin et al.'s bound on sup ||J_MHA||_2 over the cover z of MHA's input (dot-product
// attention without a mask; the LayerNorm, if any, is not in it).
UpperBound CastinMhaUpperBound(const AttentionLayer& layer, const TokenCover& z);

// The closed-form bounds that apply to this layer, set and norm (possibly none).
std::vector<ClosedFormBound> ClosedFormBounds(const AttentionLayer& layer, const InputSet& set,
                                              NormKind norm);

// Upper bound on the principal branch W0(x) of the Lambert W function, x >= 0.
double LambertW0Upper(double x);

}  // namespace lipcert
