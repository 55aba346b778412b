// LayerNorm of the CUDA back end (CPU: LayerNormForward / LayerNormJvp / LayerNormVjp in
// kernels/cpu_layer.h), one thread per row of D. Each launcher checks its launch.
#pragma once

namespace lipcert::cuda {

// z = gamma xhat + beta with xhat = (x - mean) / sigma, sigma = sqrt(var + eps) kept per row.
template <class T>
void LnForward(const T* x, const T* gamma, const T* beta, T eps, T* z, T* xhat, T* sigma, int rows, int d);
// dz = J_LN dx at the rows of xhat and sigma.
template <class T>
void LnJvp(const T* xhat, const T* sigma, const T* gamma, const T* dx, T* dz, int rows, int d);
// out = u + J_LN^T gz.
template <class T>
void LnVjpResidual(const T* xhat, const T* sigma, const T* gamma, const T* gz, const T* u, T* out, int rows, int d);

}  // namespace lipcert::cuda
