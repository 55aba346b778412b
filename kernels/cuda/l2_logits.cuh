// The logits of L2 attention heads in the CUDA back end (CPU: Evaluate / SoftmaxTangent /
// Vjp in kernels/cpu_layer.h): logits from the Gram matrix of the queries, their tangent,
// and the two steps of their VJP. Each launcher checks its launch.
#pragma once

namespace lipcert::cuda {

// P_ij = -(G_ii + G_jj - 2 G_ij) scale for `mats` N x N matrices G = Q_h Q_h^T.
template <class T>
void L2Logits(const T* g, T* p, long long mats, int n, T scale);
// dS_ij = -2 scale (G_ii - G_ij - G_ji + G_jj) with G = Q_h dQ_h^T.
template <class T>
void L2LogitTangent(const T* g, T* ds, long long mats, int n, T scale);
// VJP: sym = gs + gs^T per (b, h) matrix, rsum = its row sums (rows = B H N).
template <class T>
void Symmetrize(const T* gs, T* sym, T* rsum, long long rows, int n);
// VJP: gQ[b, i, h dk + c] -= 2 scale rsum[(b H + h) N + i] Q[b, i, h dk + c] (bn = B N).
template <class T>
void L2GradQFix(T* gq, const T* q, const T* rsum, long long bn, int n, int heads, int dk, T scale);

}  // namespace lipcert::cuda
