// Softmax kernels and their launchers (kernels/cuda/softmax.cuh).
#include "kernels/cuda/softmax.cuh"

#include "kernels/cuda/common.cuh"

namespace lipcert::cuda {
namespace {
// Row-wise softmax of the logits in p, causal mask j <= i (i = row index within its matrix).
template <class T>
__global__ void SoftmaxRowsKernel(T* p, long long rows, int n, bool causal) {
  long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int i = int(r % n);
  const int jmax = causal ? i + 1 : n;
  T* row = p + r * n;
  T mx = row[0];
  for (int j = 1; j < jmax; ++j) mx = row[j] > mx ? row[j] : mx;
  T z = 0;
  for (int j = 0; j < jmax; ++j) {
    row[j] = Exp(row[j] - mx);
    z += row[j];
  }
  const T inv = T(1) / z;
  for (int j = 0; j < jmax; ++j) row[j] *= inv;
  for (int j = jmax; j < n; ++j) row[j] = 0;
}

// out_ij = p_ij (in_ij - sum_k p_ik in_ik), row by row (in == out allowed).
template <class T>
__global__ void SoftmaxCentreKernel(const T* p, const T* in, T* out, long long rows, int n) {
  long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const T* pr = p + r * n;
  const T* ir = in + r * n;
  T* orow = out + r * n;
  T mean = 0;
  for (int j = 0; j < n; ++j) mean += pr[j] * ir[j];
  for (int j = 0; j < n; ++j) orow[j] = pr[j] * (ir[j] - mean);
}


}  // namespace

template <class T>
void SoftmaxRows(T* p, long long rows, int n, bool causal) {
  SoftmaxRowsKernel<T><<<Blocks(rows), kThreads>>>(p, rows, n, causal);
  LIPCERT_KERNEL_CHECK();
}

template <class T>
void SoftmaxCentre(const T* p, const T* in, T* out, long long rows, int n) {
  SoftmaxCentreKernel<T><<<Blocks(rows), kThreads>>>(p, in, out, rows, n);
  LIPCERT_KERNEL_CHECK();
}

template void SoftmaxRows<float>(float*, long long, int, bool);
template void SoftmaxRows<double>(double*, long long, int, bool);
template void SoftmaxCentre<float>(const float*, const float*, float*, long long, int);
template void SoftmaxCentre<double>(const double*, const double*, double*, long long, int);

}  // namespace lipcert::cuda
