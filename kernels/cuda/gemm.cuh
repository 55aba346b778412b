// Row-major strided-batched GEMM of the CUDA back end: through cuBLAS (LIPCERT_CUDA_GEMM=
// cublas, the default) or a built-in tiled kernel (LIPCERT_CUDA_GEMM=builtin: no cuBLAS at
// run time). Both throw std::runtime_error with file and line on a failure.
#pragma once

namespace lipcert::cuda {

// The GEMM's context: the cuBLAS handle, or null for the built-in kernel.
using GemmHandle = void*;
GemmHandle CreateGemmHandle();
void DestroyGemmHandle(GemmHandle handle);  // null: nothing to do

// Row-major C (m x n) = alpha op(A) op(B) + beta C for `batch` matrices at the given
// strides (0: the same matrix for every batch); lda/ldb/ldc are row-major leading
// dimensions (elements between rows). C is not read when beta == 0.
template <class T>
void GemmRM(GemmHandle handle, bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
            long long sa, const T* b, int ldb, long long sb, T beta, T* c, int ldc, long long sc, int batch);

}  // namespace lipcert::cuda
