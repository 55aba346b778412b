// Kernels of the L2 heads' logits and their launchers (kernels/cuda/l2_logits.cuh).
#include "kernels/cuda/l2_logits.cuh"

#include "kernels/cuda/common.cuh"

namespace lipcert::cuda {
namespace {

// Logits of l2 heads from the Gram matrix G = Q_h Q_h^T: P_ij = -(G_ii + G_jj - 2 G_ij) scale.
template <class T>
__global__ void L2LogitsKernel(const T* g, T* p, long long mats, int n, T scale) {
  long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= mats * n * n) return;
  const long long base = (e / (n * n)) * n * n;
  const int i = int((e / n) % n), j = int(e % n);
  p[e] = -(g[base + (long long)i * n + i] + g[base + (long long)j * n + j] - T(2) * g[e]) * scale;
}

// dS_ij = -2 scale (G_ii - G_ij - G_ji + G_jj) with G = Q_h dQ_h^T.
template <class T>
__global__ void L2LogitTangentKernel(const T* g, T* ds, long long mats, int n, T scale) {
  long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= mats * n * n) return;
  const long long base = (e / (n * n)) * n * n;
  const int i = int((e / n) % n), j = int(e % n);
  ds[e] = T(-2) * scale *
          (g[base + (long long)i * n + i] - g[e] - g[base + (long long)j * n + i] + g[base + (long long)j * n + j]);
}

// l2 VJP: sym = gs + gs^T per (b, h) matrix, rsum = its row sums.
template <class T>
__global__ void SymmetrizeKernel(const T* gs, T* sym, T* rsum, long long rows, int n) {
  long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const long long base = (r / n) * n * n;
  const int i = int(r % n);
  T acc = 0;
  for (int j = 0; j < n; ++j) {
    const T v = gs[base + (long long)i * n + j] + gs[base + (long long)j * n + i];
    sym[base + (long long)i * n + j] = v;
    acc += v;
  }
  rsum[r] = acc;
}

// l2 VJP: gQ[b, i, h dk + c] -= 2 scale rsum[(b H + h) N + i] Q[b, i, h dk + c].
template <class T>
__global__ void L2GradQFixKernel(T* gq, const T* q, const T* rsum, long long bn, int n, int heads, int dk, T scale) {
  long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const int hq = heads * dk;
  if (e >= bn * hq) return;
  const long long row = e / hq;  // b N + i
  const int col = int(e % hq), h = col / dk;
  const long long b = row / n;
  const int i = int(row % n);
  gq[e] -= T(2) * scale * rsum[(b * heads + h) * n + i] * q[e];
}

}  // namespace

template <class T>
void L2Logits(const T* g, T* p, long long mats, int n, T scale) {
  L2LogitsKernel<T><<<Blocks(mats * n * n), kThreads>>>(g, p, mats, n, scale);
  LIPCERT_KERNEL_CHECK();
}

template <class T>
void L2LogitTangent(const T* g, T* ds, long long mats, int n, T scale) {
  L2LogitTangentKernel<T><<<Blocks(mats * n * n), kThreads>>>(g, ds, mats, n, scale);
  LIPCERT_KERNEL_CHECK();
}

template <class T>
void Symmetrize(const T* gs, T* sym, T* rsum, long long rows, int n) {
  SymmetrizeKernel<T><<<Blocks(rows), kThreads>>>(gs, sym, rsum, rows, n);
  LIPCERT_KERNEL_CHECK();
}

template <class T>
void L2GradQFix(T* gq, const T* q, const T* rsum, long long bn, int n, int heads, int dk, T scale) {
  L2GradQFixKernel<T><<<Blocks(bn * heads * dk), kThreads>>>(gq, q, rsum, bn, n, heads, dk, scale);
  LIPCERT_KERNEL_CHECK();
}

template void L2Logits<float>(const float*, float*, long long, int, float);
template void L2Logits<double>(const double*, double*, long long, int, double);
template void L2LogitTangent<float>(const float*, float*, long long, int, float);
template void L2LogitTangent<double>(const double*, double*, long long, int, double);
template void Symmetrize<float>(const float*, float*, float*, long long, int);
template void Symmetrize<double>(const double*, double*, double*, long long, int);
template void L2GradQFix<float>(float*, const float*, const float*, long long, int, int, int, float);
template void L2GradQFix<double>(double*, const double*, const double*, long long, int, int, int, double);

}  // namespace lipcert::cuda
