// LayerNorm kernels and their launchers (kernels/cuda/layer_norm.cuh).
#include "kernels/cuda/layer_norm.cuh"

#include "kernels/cuda/common.cuh"

namespace lipcert::cuda {
namespace {

template <class T>
__global__ void LnForwardKernel(const T* x, const T* gamma, const T* beta, T eps, T* z, T* xhat, T* sigma,
                          int rows, int d) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const T* xr = x + (long long)r * d;
  T* xh = xhat + (long long)r * d;
  T* zr = z + (long long)r * d;
  T mean = 0;
  for (int j = 0; j < d; ++j) mean += xr[j];
  mean /= T(d);
  T ss = 0;
  for (int j = 0; j < d; ++j) {
    const T c = xr[j] - mean;
    xh[j] = c;
    ss += c * c;
  }
  const T sig = Sqrt(ss / T(d) + eps);
  sigma[r] = sig;
  for (int j = 0; j < d; ++j) {
    xh[j] /= sig;
    zr[j] = gamma[j] * xh[j] + beta[j];
  }
}

template <class T>
__global__ void LnJvpKernel(const T* xhat, const T* sigma, const T* gamma, const T* dx, T* dz, int rows, int d) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const T* xh = xhat + (long long)r * d;
  const T* dxr = dx + (long long)r * d;
  T* dzr = dz + (long long)r * d;
  T mdx = 0, mxd = 0;
  for (int j = 0; j < d; ++j) {
    mdx += dxr[j];
    mxd += xh[j] * dxr[j];
  }
  mdx /= T(d);
  mxd /= T(d);
  for (int j = 0; j < d; ++j) dzr[j] = gamma[j] * (dxr[j] - mdx - xh[j] * mxd) / sigma[r];
}

// out = u + J_LN^T gz.
template <class T>
__global__ void LnVjpResidualKernel(const T* xhat, const T* sigma, const T* gamma, const T* gz, const T* u, T* out,
                              int rows, int d) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const T* xh = xhat + (long long)r * d;
  const T* g = gz + (long long)r * d;
  const T* ur = u + (long long)r * d;
  T* o = out + (long long)r * d;
  T mg = 0, mgx = 0;
  for (int j = 0; j < d; ++j) {
    const T gj = gamma[j] * g[j];
    mg += gj;
    mgx += gj * xh[j];
  }
  mg /= T(d);
  mgx /= T(d);
  for (int j = 0; j < d; ++j) o[j] = ur[j] + (gamma[j] * g[j] - mg - xh[j] * mgx) / sigma[r];
}

}  // namespace

template <class T>
void LnForward(const T* x, const T* gamma, const T* beta, T eps, T* z, T* xhat, T* sigma, int rows, int d) {
  LnForwardKernel<T><<<Blocks(rows), kThreads>>>(x, gamma, beta, eps, z, xhat, sigma, rows, d);
  LIPCERT_KERNEL_CHECK();
}

template <class T>
void LnJvp(const T* xhat, const T* sigma, const T* gamma, const T* dx, T* dz, int rows, int d) {
  LnJvpKernel<T><<<Blocks(rows), kThreads>>>(xhat, sigma, gamma, dx, dz, rows, d);
  LIPCERT_KERNEL_CHECK();
}

template <class T>
void LnVjpResidual(const T* xhat, const T* sigma, const T* gamma, const T* gz, const T* u, T* out, int rows, int d) {
  LnVjpResidualKernel<T><<<Blocks(rows), kThreads>>>(xhat, sigma, gamma, gz, u, out, rows, d);
  LIPCERT_KERNEL_CHECK();
}

template void LnForward<float>(const float*, const float*, const float*, float, float*, float*, float*, int, int);
template void LnForward<double>(const double*, const double*, const double*, double, double*, double*, double*, int,
                                int);
template void LnJvp<float>(const float*, const float*, const float*, const float*, float*, int, int);
template void LnJvp<double>(const double*, const double*, const double*, const double*, double*, int, int);
template void LnVjpResidual<float>(const float*, const float*, const float*, const float*, const float*, float*, int,
                                   int);
template void LnVjpResidual<double>(const double*, const double*, const double*, const double*, const double*,
                                    double*, int, int);

}  // namespace lipcert::cuda
