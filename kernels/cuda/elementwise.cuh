// Element-wise kernels of the CUDA back end: conversions from and to the host's doubles,
// row biases and in-place sums. Each launcher checks its launch.
#pragma once

namespace lipcert::cuda {

template <class T>
void FromDouble(const double* in, T* out, long long n);  // out = T(in), n elements
template <class T>
void ToDouble(const T* in, double* out, long long n);    // out = double(in)
template <class T>
void AddRowBias(T* m, const T* bias, long long rows, int cols);  // m[r, c] += bias[c]
template <class T>
void AddInPlace(T* y, const T* x, long long n);  // y += x

}  // namespace lipcert::cuda
