// Row-wise softmax of the CUDA back end (CPU: Evaluate / SoftmaxTangent / SoftmaxVjp in
// kernels/cpu_layer.h), one thread per row of N. Each launcher checks its launch.
#pragma once

namespace lipcert::cuda {

// Softmax of every row of the logits in p (rows of length n), causal mask j <= i.
template <class T>
void SoftmaxRows(T* p, long long rows, int n, bool causal);
// out_ij = p_ij (in_ij - sum_k p_ik in_ik), row by row (in == out allowed): the softmax's
// tangent, and its transpose.
template <class T>
void SoftmaxCentre(const T* p, const T* in, T* out, long long rows, int n);

}  // namespace lipcert::cuda
