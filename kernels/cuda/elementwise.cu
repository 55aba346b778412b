// Element-wise kernels and their launchers (kernels/cuda/elementwise.cuh).
#include "kernels/cuda/elementwise.cuh"

#include "kernels/cuda/common.cuh"

namespace lipcert::cuda {
namespace {

template <class T>
__global__ void FromDoubleKernel(const double* in, T* out, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = T(in[i]);
}

template <class T>
__global__ void ToDoubleKernel(const T* in, double* out, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = double(in[i]);
}

// m[r, c] += bias[c].
template <class T>
__global__ void AddRowBiasKernel(T* m, const T* bias, long long rows, int cols) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < rows * cols) m[i] += bias[i % cols];
}

// y += x.
template <class T>
__global__ void AddInPlaceKernel(T* y, const T* x, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

}  // namespace

template <class T>
void FromDouble(const double* in, T* out, long long n) {
  FromDoubleKernel<T><<<Blocks(n), kThreads>>>(in, out, n);
  LIPCERT_KERNEL_CHECK();
}

template <class T>
void ToDouble(const T* in, double* out, long long n) {
  ToDoubleKernel<T><<<Blocks(n), kThreads>>>(in, out, n);
  LIPCERT_KERNEL_CHECK();
}

template <class T>
void AddRowBias(T* m, const T* bias, long long rows, int cols) {
  AddRowBiasKernel<T><<<Blocks(rows * cols), kThreads>>>(m, bias, rows, cols);
  LIPCERT_KERNEL_CHECK();
}

template <class T>
void AddInPlace(T* y, const T* x, long long n) {
  AddInPlaceKernel<T><<<Blocks(n), kThreads>>>(y, x, n);
  LIPCERT_KERNEL_CHECK();
}

template void FromDouble<float>(const double*, float*, long long);
template void FromDouble<double>(const double*, double*, long long);
template void ToDouble<float>(const float*, double*, long long);
template void ToDouble<double>(const double*, double*, long long);
template void AddRowBias<float>(float*, const float*, long long, int);
template void AddRowBias<double>(double*, const double*, long long, int);
template void AddInPlace<float>(float*, const float*, long long);
template void AddInPlace<double>(double*, const double*, long long);

}  // namespace lipcert::cuda
