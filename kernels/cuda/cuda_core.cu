// CUDA back end of the Jacobian-norm evaluator. Each step mirrors kernels/cpu_layer.h; comments
// name the CPU function a block corresponds to. Layouts (row-major, point-major):
//   x, z, xhat, dz, gz, slots : (B, N, D)
//   Q, K, dQ, dK, gQ, gK      : (B, N, H dk)     head h = columns [h dk, (h+1) dk)
//   V, dV, head, gH, gV       : (B, N, H dv)
//   P, dS, G, gp, gs          : (B, H, N, N)
//   sigma                     : (B, N)
// Every kernel is deliberately simple (one thread per row or per element; one block per
// reduction) so that it is correct by inspection.
#include "kernels/cuda/cuda_core.h"

#include <cuda_runtime.h>
#if !defined(LIPCERT_CUDA_BUILTIN_GEMM)
#include <cublas_v2.h>
#endif

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace lipcert::cuda {
namespace {

#define LIPCERT_CUDA_CHECK(expr)                                                                 \
  do {                                                                                           \
    cudaError_t err_ = (expr);                                                                   \
    if (err_ != cudaSuccess)                                                                     \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + \
                               #expr + ": " + cudaGetErrorString(err_));                         \
  } while (0)

#if !defined(LIPCERT_CUDA_BUILTIN_GEMM)
#define LIPCERT_CUBLAS_CHECK(expr)                                                               \
  do {                                                                                           \
    cublasStatus_t st_ = (expr);                                                                 \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                            \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + \
                               #expr + ": cuBLAS status " + std::to_string(int(st_)));           \
  } while (0)
#endif

#define LIPCERT_KERNEL_CHECK() LIPCERT_CUDA_CHECK(cudaGetLastError())

constexpr int kThreads = 256;  // block size of every kernel (a power of two: reductions)

inline int Blocks(long long n) { return int((n + kThreads - 1) / kThreads); }

__device__ inline float Exp(float v) { return expf(v); }
__device__ inline double Exp(double v) { return exp(v); }
__device__ inline float Sqrt(float v) { return sqrtf(v); }
__device__ inline double Sqrt(double v) { return sqrt(v); }

// ---- device buffers ----

template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  void Resize(size_t count) {
    if (count <= n) return;
    if (p) LIPCERT_CUDA_CHECK(cudaFree(p));
    p = nullptr;
    n = 0;
    LIPCERT_CUDA_CHECK(cudaMalloc(&p, (count ? count : 1) * sizeof(T)));
    n = count;
  }
};

// ---- element-wise and conversion kernels ----

template <class T>
__global__ void FromDouble(const double* in, T* out, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = T(in[i]);
}

template <class T>
__global__ void ToDouble(const T* in, double* out, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = double(in[i]);
}

// m[r, c] += bias[c].
template <class T>
__global__ void AddRowBias(T* m, const T* bias, long long rows, int cols) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < rows * cols) m[i] += bias[i % cols];
}

// y += x.
template <class T>
__global__ void AddInPlace(T* y, const T* x, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

// ---- LayerNorm (CPU: LayerNormForward / LayerNormJvp / LayerNormVjp), one thread per row ----

template <class T>
__global__ void LnForward(const T* x, const T* gamma, const T* beta, T eps, T* z, T* xhat, T* sigma,
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
__global__ void LnJvp(const T* xhat, const T* sigma, const T* gamma, const T* dx, T* dz, int rows, int d) {
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
__global__ void LnVjpResidual(const T* xhat, const T* sigma, const T* gamma, const T* gz, const T* u, T* out,
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

// ---- attention (CPU: Evaluate / SoftmaxTangent / SoftmaxVjp / Vjp) ----

// Logits of l2 heads from the Gram matrix G = Q_h Q_h^T: P_ij = -(G_ii + G_jj - 2 G_ij) scale.
template <class T>
__global__ void L2Logits(const T* g, T* p, long long mats, int n, T scale) {
  long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= mats * n * n) return;
  const long long base = (e / (n * n)) * n * n;
  const int i = int((e / n) % n), j = int(e % n);
  p[e] = -(g[base + (long long)i * n + i] + g[base + (long long)j * n + j] - T(2) * g[e]) * scale;
}

// dS_ij = -2 scale (G_ii - G_ij - G_ji + G_jj) with G = Q_h dQ_h^T.
template <class T>
__global__ void L2LogitTangent(const T* g, T* ds, long long mats, int n, T scale) {
  long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= mats * n * n) return;
  const long long base = (e / (n * n)) * n * n;
  const int i = int((e / n) % n), j = int(e % n);
  ds[e] = T(-2) * scale *
          (g[base + (long long)i * n + i] - g[e] - g[base + (long long)j * n + i] + g[base + (long long)j * n + j]);
}

// Row-wise softmax of the logits in p, causal mask j <= i (i = row index within its matrix).
template <class T>
__global__ void SoftmaxRows(T* p, long long rows, int n, bool causal) {
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
__global__ void SoftmaxCentre(const T* p, const T* in, T* out, long long rows, int n) {
  long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const T* pr = p + r * n;
  const T* ir = in + r * n;
  T* orow = out + r * n;
  T mean = 0;
  for (int j = 0; j < n; ++j) mean += pr[j] * ir[j];
  for (int j = 0; j < n; ++j) orow[j] = pr[j] * (ir[j] - mean);
}

// l2 VJP: sym = gs + gs^T per (b, h) matrix, rsum = its row sums.
template <class T>
__global__ void Symmetrize(const T* gs, T* sym, T* rsum, long long rows, int n) {
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
__global__ void L2GradQFix(T* gq, const T* q, const T* rsum, long long bn, int n, int heads, int dk, T scale) {
  long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const int hq = heads * dk;
  if (e >= bn * hq) return;
  const long long row = e / hq;  // b N + i
  const int col = int(e % hq), h = col / dk;
  const long long b = row / n;
  const int i = int(row % n);
  gq[e] -= T(2) * scale * rsum[(b * heads + h) * n + i] * q[e];
}

// ---- the driver's vector operations (CPU: CpuEvaluator::PointOps) ----

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

#if defined(LIPCERT_CUDA_BUILTIN_GEMM)
// ---- row-major GEMM, built in (LIPCERT_CUDA_GEMM=builtin: no cuBLAS at run time) ----
// Same contract as the cuBLAS version below: row-major C (m x n) = alpha op(A) op(B) +
// beta C for `batch` matrices at the given strides (0: the same matrix for every batch);
// C is not read when beta == 0. One 16 x 16 tile of C per block, k in 16-wide steps
// through shared memory; accumulation in T, like cublas{S,D}gemm.
using GemmHandle = void*;  // stands in for the cuBLAS handle; unused
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

using GemmHandle = cublasHandle_t;

template <class T>
void GemmRM(cublasHandle_t h, bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
            long long sa, const T* b, int ldb, long long sb, T beta, T* c, int ldc, long long sc, int batch) {
  const cublasOperation_t oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  LIPCERT_CUBLAS_CHECK(GemmSB(h, ob, oa, n, m, k, &alpha, b, ldb, sb, a, lda, sa, &beta, c, ldc, sc, batch));
}

#endif  // LIPCERT_CUDA_BUILTIN_GEMM

}  // namespace

struct Core::Impl {
  virtual ~Impl() = default;
  virtual void SetPoints(const double* x, int batch) = 0;
  virtual int batch() const = 0;
  virtual void Forward(double* y) = 0;
  virtual void Upload(int slot, const double* host) = 0;
  virtual void Download(int slot, double* host) = 0;
  virtual void Jvp(int src, int dst) = 0;
  virtual void Vjp(int src, int dst) = 0;
  virtual void ApplyNormal(int src, int dst) = 0;
  virtual void Dots(int w, int m, double* c) = 0;
  virtual void SubtractCombination(int w, int m, const double* c) = 0;
  virtual void Norms(int s, double* out) = 0;
  virtual void Scale(int src, int dst, const double* f) = 0;
  virtual void Combine(int m, const double* c, int dst, const unsigned char* mask) = 0;
};

namespace {

template <class T>
class CoreT final : public Core::Impl {
 public:
  CoreT(const LayerDesc& L, int slots) : L_(L), nslots_(slots) {
    n_ = L.tokens;
    d_ = L.d;
    h_ = L.heads;
    dk_ = L.dk;
    dv_ = L.dv;
    hq_ = h_ * dk_;
    hv_ = h_ * dv_;
    scale_ = T(1.0 / std::sqrt(double(dk_)));
#if !defined(LIPCERT_CUDA_BUILTIN_GEMM)
    LIPCERT_CUBLAS_CHECK(cublasCreate(&handle_));
#endif
    Put(wq_, L.wq, size_t(hq_) * d_);
    if (!L.l2) Put(wk_, L.wk, size_t(hq_) * d_);
    Put(m_, L.m, size_t(hv_) * d_);
    Put(wo_, L.wo, size_t(d_) * hv_);
    if (L.bq) Put(bq_, L.bq, hq_);
    if (L.bk) Put(bk_, L.bk, hq_);
    if (L.bv) Put(bv_, L.bv, hv_);
    if (L.bo) Put(bo_, L.bo, d_);
    ln_ = L.ln_gamma != nullptr;
    if (ln_) {
      Put(gamma_, L.ln_gamma, d_);
      Put(beta_, L.ln_beta, d_);
    }
  }
  ~CoreT() override {
#if !defined(LIPCERT_CUDA_BUILTIN_GEMM)
    if (handle_) cublasDestroy(handle_);
#endif
  }

  int batch() const override { return b_; }

  void SetPoints(const double* x, int batch) override {
    Reserve(batch);
    b_ = batch;
    const long long nd = (long long)b_ * n_ * d_;
    HostToDevice(x, x_.p, nd);
    const int rows = b_ * n_;
    // CPU: Evaluate.
    if (ln_) {
      LnForward<T><<<Blocks(rows), kThreads>>>(x_.p, gamma_.p, beta_.p, T(L_.ln_eps), z_.p, xhat_.p,
                                               sigma_.p, rows, d_);
      LIPCERT_KERNEL_CHECK();
    } else {
      LIPCERT_CUDA_CHECK(cudaMemcpy(z_.p, x_.p, nd * sizeof(T), cudaMemcpyDeviceToDevice));
    }
    Project(z_.p, q_.p, k_.p, v_.p);
    if (bq_.p) AddBias(q_.p, bq_.p, rows, hq_);
    if (!L_.l2 && bk_.p) AddBias(k_.p, bk_.p, rows, hq_);
    if (bv_.p) AddBias(v_.p, bv_.p, rows, hv_);
    const long long nn = (long long)n_ * n_, mats = (long long)b_ * h_;
    for (int h = 0; h < h_; ++h) {
      if (!L_.l2) {
        GemmRM<T>(handle_, false, true, n_, n_, dk_, scale_, q_.p + h * dk_, hq_, (long long)n_ * hq_,
                  k_.p + h * dk_, hq_, (long long)n_ * hq_, T(0), p_.p + h * nn, n_, h_ * nn, b_);
      } else {
        GemmRM<T>(handle_, false, true, n_, n_, dk_, T(1), q_.p + h * dk_, hq_, (long long)n_ * hq_,
                  q_.p + h * dk_, hq_, (long long)n_ * hq_, T(0), g_.p + h * nn, n_, h_ * nn, b_);
      }
    }
    if (L_.l2) {
      L2Logits<T><<<Blocks(mats * nn), kThreads>>>(g_.p, p_.p, mats, n_, scale_);
      LIPCERT_KERNEL_CHECK();
    }
    SoftmaxRows<T><<<Blocks(mats * n_), kThreads>>>(p_.p, mats * n_, n_, L_.causal);
    LIPCERT_KERNEL_CHECK();
  }

  void Forward(double* y) override {
    // CPU: ForwardOutput.
    const long long nn = (long long)n_ * n_;
    for (int h = 0; h < h_; ++h)
      GemmRM<T>(handle_, false, false, n_, dv_, n_, T(1), p_.p + h * nn, n_, h_ * nn, v_.p + h * dv_, hv_,
                (long long)n_ * hv_, T(0), head_.p + h * dv_, hv_, (long long)n_ * hv_, b_);
    T* out = tmp_.p;
    GemmRM<T>(handle_, false, true, b_ * n_, d_, hv_, T(1), head_.p, hv_, 0, wo_.p, hv_, 0, T(0), out, d_, 0, 1);
    if (bo_.p) AddBias(out, bo_.p, b_ * n_, d_);
    const long long nd = (long long)b_ * n_ * d_;
    if (ln_) {
      AddInPlace<T><<<Blocks(nd), kThreads>>>(out, x_.p, nd);
      LIPCERT_KERNEL_CHECK();
    }
    DeviceToHost(out, y, nd);
  }

  void Upload(int slot, const double* host) override { HostToDevice(host, Slot(slot), PointElems()); }
  void Download(int slot, double* host) override { DeviceToHost(Slot(slot), host, PointElems()); }
  void Jvp(int src, int dst) override { JvpPtr(Slot(src), Slot(dst)); }
  void Vjp(int src, int dst) override { VjpPtr(Slot(src), Slot(dst)); }
  void ApplyNormal(int src, int dst) override {
    JvpPtr(Slot(src), tmp_.p);
    VjpPtr(tmp_.p, Slot(dst));
  }

  void Dots(int w, int m, double* c) override {
    DotsKernel<T><<<dim3(m, b_), kThreads>>>(slots_.p, SlotStride(), w, m, n_ * d_, dred_.p);
    LIPCERT_KERNEL_CHECK();
    LIPCERT_CUDA_CHECK(cudaMemcpy(c, dred_.p, sizeof(double) * m * b_, cudaMemcpyDeviceToHost));
  }
  void SubtractCombination(int w, int m, const double* c) override {
    LIPCERT_CUDA_CHECK(cudaMemcpy(dcoef_.p, c, sizeof(double) * m * b_, cudaMemcpyHostToDevice));
    SubtractKernel<T><<<dim3(Blocks(n_ * d_), b_), kThreads>>>(slots_.p, SlotStride(), w, m, n_ * d_, dcoef_.p);
    LIPCERT_KERNEL_CHECK();
  }
  void Norms(int s, double* out) override {
    // <slot_s, slot_s> through DotsKernel with m = 1 reading slot s as "slot 0 + s".
    DotsKernel<T><<<dim3(1, b_), kThreads>>>(slots_.p + s * SlotStride(), SlotStride(), 0, 1, n_ * d_, dred_.p);
    LIPCERT_KERNEL_CHECK();
    LIPCERT_CUDA_CHECK(cudaMemcpy(out, dred_.p, sizeof(double) * b_, cudaMemcpyDeviceToHost));
    for (int b = 0; b < b_; ++b) out[b] = std::sqrt(out[b]);
  }
  void Scale(int src, int dst, const double* f) override {
    LIPCERT_CUDA_CHECK(cudaMemcpy(dcoef_.p, f, sizeof(double) * b_, cudaMemcpyHostToDevice));
    ScaleKernel<T><<<dim3(Blocks(n_ * d_), b_), kThreads>>>(slots_.p, SlotStride(), src, dst, n_ * d_, dcoef_.p);
    LIPCERT_KERNEL_CHECK();
  }
  void Combine(int m, const double* c, int dst, const unsigned char* mask) override {
    LIPCERT_CUDA_CHECK(cudaMemcpy(dcoef_.p, c, sizeof(double) * m * b_, cudaMemcpyHostToDevice));
    LIPCERT_CUDA_CHECK(cudaMemcpy(dmask_.p, mask, b_, cudaMemcpyHostToDevice));
    CombineKernel<T><<<dim3(Blocks(n_ * d_), b_), kThreads>>>(slots_.p, SlotStride(), m, dst, n_ * d_, dcoef_.p,
                                                              dmask_.p);
    LIPCERT_KERNEL_CHECK();
  }

 private:
  long long PointElems() const { return (long long)b_ * n_ * d_; }
  long long SlotStride() const { return (long long)cap_ * n_ * d_; }
  T* Slot(int s) {
    if (s < 0 || s >= nslots_) throw std::runtime_error("cuda core: slot index out of range");
    return slots_.p + s * SlotStride();
  }

  void Put(DevBuf<T>& buf, const double* host, size_t n) {
    buf.Resize(n);
    HostToDevice(host, buf.p, (long long)n);
  }
  void HostToDevice(const double* host, T* dev, long long n) {
    staging_.Resize(size_t(n));
    LIPCERT_CUDA_CHECK(cudaMemcpy(staging_.p, host, sizeof(double) * n, cudaMemcpyHostToDevice));
    FromDouble<T><<<Blocks(n), kThreads>>>(staging_.p, dev, n);
    LIPCERT_KERNEL_CHECK();
  }
  void DeviceToHost(const T* dev, double* host, long long n) {
    staging_.Resize(size_t(n));
    ToDouble<T><<<Blocks(n), kThreads>>>(dev, staging_.p, n);
    LIPCERT_KERNEL_CHECK();
    LIPCERT_CUDA_CHECK(cudaMemcpy(host, staging_.p, sizeof(double) * n, cudaMemcpyDeviceToHost));
  }
  void AddBias(T* m, const T* bias, long long rows, int cols) {
    AddRowBias<T><<<Blocks(rows * cols), kThreads>>>(m, bias, rows, cols);
    LIPCERT_KERNEL_CHECK();
  }

  void Reserve(int batch) {
    if (batch <= cap_) return;
    cap_ = batch;
    const size_t nd = size_t(cap_) * n_ * d_, bq = size_t(cap_) * n_ * hq_, bv = size_t(cap_) * n_ * hv_;
    const size_t bnn = size_t(cap_) * h_ * n_ * n_;
    for (DevBuf<T>* b : {&x_, &z_, &xhat_, &dz_, &gz_, &tmp_}) b->Resize(nd);
    sigma_.Resize(size_t(cap_) * n_);
    for (DevBuf<T>* b : {&q_, &k_, &dq_, &dkey_, &gq_, &gk_}) b->Resize(bq);
    for (DevBuf<T>* b : {&v_, &dval_, &head_, &gh_, &gv_}) b->Resize(bv);
    for (DevBuf<T>* b : {&p_, &ds_, &g_, &gp_, &sym_}) b->Resize(bnn);
    rsum_.Resize(size_t(cap_) * h_ * n_);
    slots_.Resize(size_t(nslots_) * nd);
    LIPCERT_CUDA_CHECK(cudaMemset(slots_.p, 0, sizeof(T) * size_t(nslots_) * nd));
    const size_t red = size_t(cap_) * (nslots_ + 1);
    dred_.Resize(red);
    dcoef_.Resize(red);
    dmask_.Resize(size_t(cap_));
  }

  // q = z Wq^T, k = z Wk^T (dot), v = z M^T over all B N rows (CPU: Evaluate / ProjectTangent).
  void Project(const T* z, T* q, T* k, T* v) {
    const int rows = b_ * n_;
    GemmRM<T>(handle_, false, true, rows, hq_, d_, T(1), z, d_, 0, wq_.p, d_, 0, T(0), q, hq_, 0, 1);
    if (!L_.l2) GemmRM<T>(handle_, false, true, rows, hq_, d_, T(1), z, d_, 0, wk_.p, d_, 0, T(0), k, hq_, 0, 1);
    GemmRM<T>(handle_, false, true, rows, hv_, d_, T(1), z, d_, 0, m_.p, d_, 0, T(0), v, hv_, 0, 1);
  }

  // ds_ <- dP for every head, from dq_, dk_ (CPU: SoftmaxTangent).
  void SoftmaxTangentAll() {
    const long long nn = (long long)n_ * n_, mats = (long long)b_ * h_;
    const long long sq = (long long)n_ * hq_;
    for (int h = 0; h < h_; ++h) {
      if (!L_.l2) {
        GemmRM<T>(handle_, false, true, n_, n_, dk_, scale_, dq_.p + h * dk_, hq_, sq, k_.p + h * dk_, hq_, sq,
                  T(0), ds_.p + h * nn, n_, h_ * nn, b_);
        GemmRM<T>(handle_, false, true, n_, n_, dk_, scale_, q_.p + h * dk_, hq_, sq, dkey_.p + h * dk_, hq_, sq,
                  T(1), ds_.p + h * nn, n_, h_ * nn, b_);
      } else {
        GemmRM<T>(handle_, false, true, n_, n_, dk_, T(1), q_.p + h * dk_, hq_, sq, dq_.p + h * dk_, hq_, sq,
                  T(0), g_.p + h * nn, n_, h_ * nn, b_);
      }
    }
    if (L_.l2) {
      L2LogitTangent<T><<<Blocks(mats * nn), kThreads>>>(g_.p, ds_.p, mats, n_, scale_);
      LIPCERT_KERNEL_CHECK();
    }
    SoftmaxCentre<T><<<Blocks(mats * n_), kThreads>>>(p_.p, ds_.p, ds_.p, mats * n_, n_);
    LIPCERT_KERNEL_CHECK();
  }

  // out = J dx (CPU: Jvp).
  void JvpPtr(const T* dx, T* out) {
    const int rows = b_ * n_;
    const T* dz = dx;
    if (ln_) {
      LnJvp<T><<<Blocks(rows), kThreads>>>(xhat_.p, sigma_.p, gamma_.p, dx, dz_.p, rows, d_);
      LIPCERT_KERNEL_CHECK();
      dz = dz_.p;
    }
    Project(dz, dq_.p, dkey_.p, dval_.p);
    SoftmaxTangentAll();
    const long long nn = (long long)n_ * n_, sv = (long long)n_ * hv_;
    for (int h = 0; h < h_; ++h) {
      GemmRM<T>(handle_, false, false, n_, dv_, n_, T(1), ds_.p + h * nn, n_, h_ * nn, v_.p + h * dv_, hv_, sv,
                T(0), head_.p + h * dv_, hv_, sv, b_);
      GemmRM<T>(handle_, false, false, n_, dv_, n_, T(1), p_.p + h * nn, n_, h_ * nn, dval_.p + h * dv_, hv_, sv,
                T(1), head_.p + h * dv_, hv_, sv, b_);
    }
    GemmRM<T>(handle_, false, true, rows, d_, hv_, T(1), head_.p, hv_, 0, wo_.p, hv_, 0, T(0), out, d_, 0, 1);
    if (ln_) {
      const long long nd = (long long)rows * d_;
      AddInPlace<T><<<Blocks(nd), kThreads>>>(out, dx, nd);
      LIPCERT_KERNEL_CHECK();
    }
  }

  // out = J^T u (CPU: Vjp). out must not alias u.
  void VjpPtr(const T* u, T* out) {
    const int rows = b_ * n_;
    const long long nn = (long long)n_ * n_, mats = (long long)b_ * h_;
    const long long sq = (long long)n_ * hq_, sv = (long long)n_ * hv_;
    GemmRM<T>(handle_, false, false, rows, hv_, d_, T(1), u, d_, 0, wo_.p, hv_, 0, T(0), gh_.p, hv_, 0, 1);
    for (int h = 0; h < h_; ++h) {
      GemmRM<T>(handle_, false, true, n_, n_, dv_, T(1), gh_.p + h * dv_, hv_, sv, v_.p + h * dv_, hv_, sv, T(0),
                gp_.p + h * nn, n_, h_ * nn, b_);
      GemmRM<T>(handle_, true, false, n_, dv_, n_, T(1), p_.p + h * nn, n_, h_ * nn, gh_.p + h * dv_, hv_, sv,
                T(0), gv_.p + h * dv_, hv_, sv, b_);
    }
    SoftmaxCentre<T><<<Blocks(mats * n_), kThreads>>>(p_.p, gp_.p, gp_.p, mats * n_, n_);  // gp <- gs
    LIPCERT_KERNEL_CHECK();
    const T* gs = gp_.p;
    if (!L_.l2) {
      for (int h = 0; h < h_; ++h) {
        GemmRM<T>(handle_, false, false, n_, dk_, n_, scale_, gs + h * nn, n_, h_ * nn, k_.p + h * dk_, hq_, sq,
                  T(0), gq_.p + h * dk_, hq_, sq, b_);
        GemmRM<T>(handle_, true, false, n_, dk_, n_, scale_, gs + h * nn, n_, h_ * nn, q_.p + h * dk_, hq_, sq,
                  T(0), gk_.p + h * dk_, hq_, sq, b_);
      }
    } else {
      Symmetrize<T><<<Blocks(mats * n_), kThreads>>>(gs, sym_.p, rsum_.p, mats * n_, n_);
      LIPCERT_KERNEL_CHECK();
      for (int h = 0; h < h_; ++h)
        GemmRM<T>(handle_, false, false, n_, dk_, n_, T(2) * scale_, sym_.p + h * nn, n_, h_ * nn,
                  q_.p + h * dk_, hq_, sq, T(0), gq_.p + h * dk_, hq_, sq, b_);
      L2GradQFix<T><<<Blocks((long long)rows * hq_), kThreads>>>(gq_.p, q_.p, rsum_.p, rows, n_, h_, dk_, scale_);
      LIPCERT_KERNEL_CHECK();
    }
    T* gz = ln_ ? gz_.p : out;
    GemmRM<T>(handle_, false, false, rows, d_, hq_, T(1), gq_.p, hq_, 0, wq_.p, d_, 0, T(0), gz, d_, 0, 1);
    if (!L_.l2)
      GemmRM<T>(handle_, false, false, rows, d_, hq_, T(1), gk_.p, hq_, 0, wk_.p, d_, 0, T(1), gz, d_, 0, 1);
    GemmRM<T>(handle_, false, false, rows, d_, hv_, T(1), gv_.p, hv_, 0, m_.p, d_, 0, T(1), gz, d_, 0, 1);
    if (ln_) {
      LnVjpResidual<T><<<Blocks(rows), kThreads>>>(xhat_.p, sigma_.p, gamma_.p, gz_.p, u, out, rows, d_);
      LIPCERT_KERNEL_CHECK();
    }
  }

  LayerDesc L_;
  int nslots_ = 0;
  int n_ = 0, d_ = 0, h_ = 0, dk_ = 0, dv_ = 0, hq_ = 0, hv_ = 0;
  T scale_ = 1;
  bool ln_ = false;
  int cap_ = 0, b_ = 0;
  GemmHandle handle_ = nullptr;
  DevBuf<T> wq_, wk_, m_, wo_, bq_, bk_, bv_, bo_, gamma_, beta_;
  DevBuf<T> x_, z_, xhat_, sigma_, q_, k_, v_, p_;
  DevBuf<T> dz_, dq_, dkey_, dval_, ds_, g_, head_, gh_, gp_, gv_, gq_, gk_, sym_, rsum_, gz_, tmp_;
  DevBuf<T> slots_;
  DevBuf<double> staging_, dred_, dcoef_;
  DevBuf<unsigned char> dmask_;
};

}  // namespace

int DeviceCount(std::string* error) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (error) *error = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && error) *error = "no CUDA device present";
  return n;
}

Core::Core(const LayerDesc& layer, bool f64, int slots) {
  if (f64) impl_ = std::make_unique<CoreT<double>>(layer, slots);
  else impl_ = std::make_unique<CoreT<float>>(layer, slots);
}
Core::~Core() = default;
void Core::SetPoints(const double* x, int batch) { impl_->SetPoints(x, batch); }
int Core::batch() const { return impl_->batch(); }
void Core::Forward(double* y) { impl_->Forward(y); }
void Core::Upload(int slot, const double* host) { impl_->Upload(slot, host); }
void Core::Download(int slot, double* host) { impl_->Download(slot, host); }
void Core::Jvp(int src, int dst) { impl_->Jvp(src, dst); }
void Core::Vjp(int src, int dst) { impl_->Vjp(src, dst); }
void Core::ApplyNormal(int src, int dst) { impl_->ApplyNormal(src, dst); }
void Core::Dots(int w, int m, double* c) { impl_->Dots(w, m, c); }
void Core::SubtractCombination(int w, int m, const double* c) { impl_->SubtractCombination(w, m, c); }
void Core::Norms(int s, double* out) { impl_->Norms(s, out); }
void Core::Scale(int src, int dst, const double* f) { impl_->Scale(src, dst, f); }
void Core::Combine(int m, const double* c, int dst, const unsigned char* mask) {
  impl_->Combine(m, c, dst, mask);
}

}  // namespace lipcert::cuda
