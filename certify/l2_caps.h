// Bounds on one L2 head's attention blocks (norm 2) that hold for every input, so they do
// not grow with the set (Kim et al.'s argument, applied per block; docs/engines.md, "L2
// attention: bounds that do not grow with the set"). With d_ij = ||q_i - q_j||, c = sqrt(dk)
// and the query's own key in every row, P_ij d_ij^2 <= c W0(1/e), sum_k P_ik d_ik^2 <=
// c W0((len-1)/e) =: s, ||a_ij|| <= ||V|| (d_ij + sqrt(s)) with V = Wo_h Wv_h Wq_h^T / sqrt(dk),
// and ||g_ij|| <= 2 ||Wq_h|| d_ij / sqrt(dk). With k = 2 ||V|| ||Wq_h|| / sqrt(dk):
//   ||P_ij a_ij g_ij^T|| <= k (c W0(1/e) + sqrt(c W0(1/e) s)),  ||E_i|| <= k s,
//   sum_j P_ij ||a_ij|| ||g_ij|| <= k (s + sqrt(s) sqrt(s)) = 2 k s.
// (Notation of certify/head_factors.h.)
#pragma once

#include "interval/rounding.h"
#include "models/attention_layer.h"

namespace lipcert {

// For a query row with len unmasked keys (the query's own among them), for every input:
// ||P_ij a_ij g_ij^T||_2 <= block, ||E_i||_2 <= diagonal, sum_j P_ij ||a_ij|| ||g_ij|| <= row_sum.
struct L2BlockCaps {
  UpperBound block{kInf}, diagonal{kInf}, row_sum{kInf};
};

// The per-head constants, from which the caps of every row length follow.
struct L2HeadCaps {
  double k = 0;   // 2 ||V||_2 ||Wq_h||_2 / sqrt(dk), rounded up
  double c = 0;   // sqrt(dk), rounded up
  double w1 = 0;  // c W0(1/e), rounded up
  // >= c W0((len - 1)/e): the bound s on sum_k P_ik d_ik^2.
  double Spread(int len) const;
  L2BlockCaps For(int len) const;
};

L2HeadCaps CapsOfL2Head(const AttentionLayer& layer, int h);

// The caps of head h for rows with len unmasked keys. Throws std::invalid_argument for a
// dot layer.
L2BlockCaps L2AttentionCaps(const AttentionLayer& layer, int head, int len);

// The whole attention Jacobian at once, for every input of n tokens (norm 2; docs/engines.md,
// "L2 attention: one operator bound for every input"). Head h is J_h = V_h T_h Wq_h token by
// token, T_h acting on the queries Q = X Wq_h^T:
//   (T dQ)_i = sum_k P_ik dq_k + (2/c) Cov_i dq_i + (2/c) sum_k P_ik (q_k - qbar_i)(q_i - q_k)^T dq_k,
// with ||P||_2 <= sqrt(1 + (n-1)/2) (P_ik <= 1/2 off the diagonal), ||Cov_i|| <= s and,
// by Cauchy-Schwarz over the pairs (i, k), the last term <= (2/c) sqrt(s (n-1) c W0(1/e)).
// All of it is free of c:
//   ||T|| <= sqrt((n+1)/2) + 2 W0((n-1)/e) + 2 sqrt((n-1) W0(1/e) W0((n-1)/e)).
// The heads combine by a sum or through the concatenation: sum_h V_h T_h Wq_h =
// [V_1 .. V_H] diag(T_h) [Wq_1; ..; Wq_H], so each path gets the smaller of
// sum_h ||V_h Wq_h|| (value) or sum_h ||V_h|| ||Wq_h|| (logit) and ||[V_1 .. V_H]|| ||Wq||.
struct L2OperatorCap {
  UpperBound value_path{kInf};  // ||sum_h P^h (x) V_h Wq_h||
  UpperBound logit_path{kInf};  // the rest of J_MHA
  UpperBound total{kInf};       // value_path + logit_path >= ||J_MHA(X)|| for every X
};

// Throws std::invalid_argument for a dot layer or n < 1.
L2OperatorCap L2AttentionOperatorCap(const AttentionLayer& layer, int n);

}  // namespace lipcert
