// The GEMM of the CUDA back end (kernels/cuda/gemm.cuh), built in or through cuBLAS.
#include "kernels/cuda/gemm.cuh"

#include "kernels/cuda/common.cuh"

#if !defined(LIPCERT_CUDA_BUILTIN_GEMM)
#include <cublas_v2.h>
#endif

namespace lipcert::cuda {

#if defined(LIPCERT_CUDA_BUILTIN_GEMM)
namespace {

// ---- row-major GEMM, built in (LIPCERT_CUDA_GEMM=builtin: no cuBLAS at run time) ----
// Same contract as the cuBLAS version below: row-major C (m x n) = alpha op(A) op(B) +
// beta C for `batch` matrices at the given strides (0: the same matrix for every batch);
// C is not read when beta == 0. One 16 x 16 tile of C per block, k in 16-wide steps
// through shared memory; accumulation in T, like cublas{S,D}gemm.
constexpr int kGemmTile = 16;

template <class T>
__global__ void GemmTiledKernel(bool ta, bool tb, int m, int n, int k, T alpha, const T* a, int lda,
                                long long sa, const T* b, int ldb, long long sb, T beta, T* c, int ldc,
                                long long sc, int batch) {
  __shared__ T as[kGemmTile][kGemmTile + 1], bs[kGemmTile][kGemmTile + 1];
  const int ty = threadIdx.y, tx = threadIdx.x;
  const int i = blockIdx.x * kGemmTile + ty;  // row of C
  const int j = blockIdx.y * kGemmTile + tx;  // column of C
  for (int z = blockIdx.z; z < batch; z += gridDim.z) {
    const T* az = a + z * sa;
    const T* bz = b + z * sb;
    T acc = T(0);
    for (int p0 = 0; p0 < k; p0 += kGemmTile) {
      const int pa = p0 + tx, pb = p0 + ty;  // as[ty][tx] = A(i, pa), bs[ty][tx] = B(pb, j)
      as[ty][tx] = (i < m && pa < k) ? (ta ? az[(long long)pa * lda + i] : az[(long long)i * lda + pa]) : T(0);
      bs[ty][tx] = (pb < k && j < n) ? (tb ? bz[(long long)j * ldb + pb] : bz[(long long)pb * ldb + j]) : T(0);
      __syncthreads();
      for (int q = 0; q < kGemmTile; ++q) acc += as[ty][q] * bs[q][tx];
      __syncthreads();
    }
    if (i < m && j < n) {
      T* cij = c + z * sc + (long long)i * ldc + j;
      *cij = beta == T(0) ? alpha * acc : alpha * acc + beta * *cij;
    }
  }
}


}  // namespace

GemmHandle CreateGemmHandle() { return nullptr; }
void DestroyGemmHandle(GemmHandle) {}

template <class T>
void GemmRM(GemmHandle, bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
            long long sa, const T* b, int ldb, long long sb, T beta, T* c, int ldc, long long sc, int batch) {
  const dim3 block(kGemmTile, kGemmTile);
  const dim3 grid((m + kGemmTile - 1) / kGemmTile, (n + kGemmTile - 1) / kGemmTile, batch < 65535 ? batch : 65535);
  GemmTiledKernel<T><<<grid, block>>>(trans_a, trans_b, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
                                      batch);
  LIPCERT_KERNEL_CHECK();
}
#else
#define LIPCERT_CUBLAS_CHECK(expr)                                                               \
  do {                                                                                           \
    cublasStatus_t st_ = (expr);                                                                 \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                            \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + \
                               #expr + ": cuBLAS status " + std::to_string(int(st_)));           \
  } while (0)

namespace {

// ---- row-major GEMM through column-major cuBLAS (LIPCERT_CUDA_GEMM=cublas, default) ----
// Row-major C (m x n) = alpha op(A) op(B) + beta C for `batch` matrices at the given
// strides; lda/ldb/ldc are row-major leading dimensions (elements between rows). A
// row-major matrix is the column-major transpose with the same leading dimension, so
// C^T = op(B)^T op(A)^T is one column-major GEMM with the operands swapped.
inline cublasStatus_t GemmSB(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                             int k, const float* alpha, const float* a, int lda, long long sa, const float* b,
                             int ldb, long long sb, const float* beta, float* c, int ldc, long long sc,
                             int batch) {
  return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch);
}
inline cublasStatus_t GemmSB(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                             int k, const double* alpha, const double* a, int lda, long long sa,
                             const double* b, int ldb, long long sb, const double* beta, double* c, int ldc,
                             long long sc, int batch) {
  return cublasDgemmStridedBatched(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch);
}

}  // namespace

GemmHandle CreateGemmHandle() {
  cublasHandle_t handle = nullptr;
  LIPCERT_CUBLAS_CHECK(cublasCreate(&handle));
  return handle;
}

void DestroyGemmHandle(GemmHandle handle) {
  if (handle) cublasDestroy(static_cast<cublasHandle_t>(handle));
}

template <class T>
void GemmRM(GemmHandle handle, bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
            long long sa, const T* b, int ldb, long long sb, T beta, T* c, int ldc, long long sc, int batch) {
  const cublasOperation_t oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  LIPCERT_CUBLAS_CHECK(GemmSB(static_cast<cublasHandle_t>(handle), ob, oa, n, m, k, &alpha, b, ldb, sb, a, lda, sa,
                              &beta, c, ldc, sc, batch));
}
#endif  // LIPCERT_CUDA_BUILTIN_GEMM

template void GemmRM<float>(GemmHandle, bool, bool, int, int, int, float, const float*, int, long long, const float*,
                            int, long long, float, float*, int, long long, int);
template void GemmRM<double>(GemmHandle, bool, bool, int, int, int, double, const double*, int, long long,
                             const double*, int, long long, double, double*, int, long long, int);

}  // namespace lipcert::cuda
