// The driver's vector operations: kernels and launchers (kernels/cuda/slot_ops.cuh).
#include "kernels/cuda/slot_ops.cuh"

#include "kernels/cuda/common.cuh"

namespace lipcert::cuda {
namespace {

// out[b m + i] = <slot_i[b], slot_w[b]>; grid (m, B), one block per dot, double accumulation.
template <class T>
__global__ void DotsKernel(const T* slots, long long slot_stride, int w, int m, int nd, double* out) {
  const int i = blockIdx.x, b = blockIdx.y;
  const T* a = slots + i * slot_stride + (long long)b * nd;
  const T* v = slots + w * slot_stride + (long long)b * nd;
  double acc = 0;
  for (int t = threadIdx.x; t < nd; t += blockDim.x) acc += double(a[t]) * double(v[t]);
  __shared__ double sh[kThreads];
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[(long long)b * m + i] = sh[0];
}

// slot_w[b] -= sum_i c[b m + i] slot_i[b]; grid (blocks over nd, B).
template <class T>
__global__ void SubtractKernel(T* slots, long long slot_stride, int w, int m, int nd, const double* c) {
  const int b = blockIdx.y;
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= nd) return;
  const long long off = (long long)b * nd + t;
  double acc = 0;
  for (int i = 0; i < m; ++i) acc += c[(long long)b * m + i] * double(slots[i * slot_stride + off]);
  slots[w * slot_stride + off] = T(double(slots[w * slot_stride + off]) - acc);
}

template <class T>
__global__ void ScaleKernel(T* slots, long long slot_stride, int src, int dst, int nd, const double* f) {
  const int b = blockIdx.y;
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= nd) return;
  const long long off = (long long)b * nd + t;
  slots[dst * slot_stride + off] = T(f[b] * double(slots[src * slot_stride + off]));
}

template <class T>
__global__ void CombineKernel(T* slots, long long slot_stride, int m, int dst, int nd, const double* c,
                              const unsigned char* mask) {
  const int b = blockIdx.y;
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= nd || !mask[b]) return;
  const long long off = (long long)b * nd + t;
  double acc = 0;
  for (int i = 0; i < m; ++i) acc += c[(long long)b * m + i] * double(slots[i * slot_stride + off]);
  slots[dst * slot_stride + off] = T(acc);
}

}  // namespace

template <class T>
void SlotDots(const T* slots, long long slot_stride, int w, int m, int batch, int nd, double* out) {
  DotsKernel<T><<<dim3(m, batch), kThreads>>>(slots, slot_stride, w, m, nd, out);
  LIPCERT_KERNEL_CHECK();
}

template <class T>
void SlotSubtract(T* slots, long long slot_stride, int w, int m, int batch, int nd, const double* c) {
  SubtractKernel<T><<<dim3(Blocks(nd), batch), kThreads>>>(slots, slot_stride, w, m, nd, c);
  LIPCERT_KERNEL_CHECK();
}

template <class T>
void SlotScale(T* slots, long long slot_stride, int src, int dst, int batch, int nd, const double* f) {
  ScaleKernel<T><<<dim3(Blocks(nd), batch), kThreads>>>(slots, slot_stride, src, dst, nd, f);
  LIPCERT_KERNEL_CHECK();
}

template <class T>
void SlotCombine(T* slots, long long slot_stride, int m, int dst, int batch, int nd, const double* c,
                 const unsigned char* mask) {
  CombineKernel<T><<<dim3(Blocks(nd), batch), kThreads>>>(slots, slot_stride, m, dst, nd, c, mask);
  LIPCERT_KERNEL_CHECK();
}

template void SlotDots<float>(const float*, long long, int, int, int, int, double*);
template void SlotDots<double>(const double*, long long, int, int, int, int, double*);
template void SlotSubtract<float>(float*, long long, int, int, int, int, const double*);
template void SlotSubtract<double>(double*, long long, int, int, int, int, const double*);
template void SlotScale<float>(float*, long long, int, int, int, int, const double*);
template void SlotScale<double>(double*, long long, int, int, int, int, const double*);
template void SlotCombine<float>(float*, long long, int, int, int, int, const double*, const unsigned char*);
template void SlotCombine<double>(double*, long long, int, int, int, int, const double*, const unsigned char*);

}  // namespace lipcert::cuda
