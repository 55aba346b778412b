// CUDA back end of the Jacobian-norm evaluator. Each step mirrors kernels/cpu_layer.h; comments
// name the CPU function a block corresponds to. Layouts (row-major, point-major):
//   x, z, xhat, dz, gz, slots : (B, N, D)
//   Q, K, dQ, dK, gQ, gK      : (B, N, H dk)     head h = columns [h dk, (h+1) dk)
//   V, dV, head, gH, gV       : (B, N, H dv)
//   P, dS, G, gp, gs          : (B, H, N, N)
//   sigma                     : (B, N)
// Every kernel is deliberately simple (one thread per row or per element; one block per
// reduction) so that it is correct by inspection. One file per operation, each with its
// launchers: elementwise, layer_norm, softmax, l2_logits, slot_ops (the driver's vector
// operations) and gemm; this file holds the layer state and the steps made of them.
#include "kernels/cuda/cuda_core.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/l2_logits.cuh"
#include "kernels/cuda/layer_norm.cuh"
#include "kernels/cuda/slot_ops.cuh"
#include "kernels/cuda/softmax.cuh"

namespace lipcert::cuda {
namespace {

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
    handle_ = CreateGemmHandle();
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
  ~CoreT() override { DestroyGemmHandle(handle_); }

  int batch() const override { return b_; }

  void SetPoints(const double* x, int batch) override {
    Reserve(batch);
    b_ = batch;
    const long long nd = (long long)b_ * n_ * d_;
    HostToDevice(x, x_.p, nd);
    const int rows = b_ * n_;
    // CPU: Evaluate.
    if (ln_) {
      LnForward<T>(x_.p, gamma_.p, beta_.p, T(L_.ln_eps), z_.p, xhat_.p, sigma_.p, rows, d_);
    } else {
      LIPCERT_CUDA_CHECK(cudaMemcpy(z_.p, x_.p, nd * sizeof(T), cudaMemcpyDeviceToDevice));
    }
    Project(z_.p, q_.p, k_.p, v_.p);
    if (bq_.p) AddRowBias<T>(q_.p, bq_.p, rows, hq_);
    if (!L_.l2 && bk_.p) AddRowBias<T>(k_.p, bk_.p, rows, hq_);
    if (bv_.p) AddRowBias<T>(v_.p, bv_.p, rows, hv_);
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
    if (L_.l2) L2Logits<T>(g_.p, p_.p, mats, n_, scale_);
    SoftmaxRows<T>(p_.p, mats * n_, n_, L_.causal);
  }

  void Forward(double* y) override {
    // CPU: ForwardOutput.
    const long long nn = (long long)n_ * n_;
    for (int h = 0; h < h_; ++h)
      GemmRM<T>(handle_, false, false, n_, dv_, n_, T(1), p_.p + h * nn, n_, h_ * nn, v_.p + h * dv_, hv_,
                (long long)n_ * hv_, T(0), head_.p + h * dv_, hv_, (long long)n_ * hv_, b_);
    T* out = tmp_.p;
    GemmRM<T>(handle_, false, true, b_ * n_, d_, hv_, T(1), head_.p, hv_, 0, wo_.p, hv_, 0, T(0), out, d_, 0, 1);
    if (bo_.p) AddRowBias<T>(out, bo_.p, b_ * n_, d_);
    const long long nd = (long long)b_ * n_ * d_;
    if (ln_) AddInPlace<T>(out, x_.p, nd);
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
    SlotDots<T>(slots_.p, SlotStride(), w, m, b_, n_ * d_, dred_.p);
    LIPCERT_CUDA_CHECK(cudaMemcpy(c, dred_.p, sizeof(double) * m * b_, cudaMemcpyDeviceToHost));
  }
  void SubtractCombination(int w, int m, const double* c) override {
    LIPCERT_CUDA_CHECK(cudaMemcpy(dcoef_.p, c, sizeof(double) * m * b_, cudaMemcpyHostToDevice));
    SlotSubtract<T>(slots_.p, SlotStride(), w, m, b_, n_ * d_, dcoef_.p);
  }
  void Norms(int s, double* out) override {
    // <slot_s, slot_s> through SlotDots with m = 1 reading slot s as "slot 0 + s".
    SlotDots<T>(slots_.p + s * SlotStride(), SlotStride(), 0, 1, b_, n_ * d_, dred_.p);
    LIPCERT_CUDA_CHECK(cudaMemcpy(out, dred_.p, sizeof(double) * b_, cudaMemcpyDeviceToHost));
    for (int b = 0; b < b_; ++b) out[b] = std::sqrt(out[b]);
  }
  void Scale(int src, int dst, const double* f) override {
    LIPCERT_CUDA_CHECK(cudaMemcpy(dcoef_.p, f, sizeof(double) * b_, cudaMemcpyHostToDevice));
    SlotScale<T>(slots_.p, SlotStride(), src, dst, b_, n_ * d_, dcoef_.p);
  }
  void Combine(int m, const double* c, int dst, const unsigned char* mask) override {
    LIPCERT_CUDA_CHECK(cudaMemcpy(dcoef_.p, c, sizeof(double) * m * b_, cudaMemcpyHostToDevice));
    LIPCERT_CUDA_CHECK(cudaMemcpy(dmask_.p, mask, b_, cudaMemcpyHostToDevice));
    SlotCombine<T>(slots_.p, SlotStride(), m, dst, b_, n_ * d_, dcoef_.p, dmask_.p);
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
    FromDouble<T>(staging_.p, dev, n);
  }
  void DeviceToHost(const T* dev, double* host, long long n) {
    staging_.Resize(size_t(n));
    ToDouble<T>(dev, staging_.p, n);
    LIPCERT_CUDA_CHECK(cudaMemcpy(host, staging_.p, sizeof(double) * n, cudaMemcpyDeviceToHost));
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
    if (L_.l2) L2LogitTangent<T>(g_.p, ds_.p, mats, n_, scale_);
    SoftmaxCentre<T>(p_.p, ds_.p, ds_.p, mats * n_, n_);
  }

  // out = J dx (CPU: Jvp).
  void JvpPtr(const T* dx, T* out) {
    const int rows = b_ * n_;
    const T* dz = dx;
    if (ln_) {
      LnJvp<T>(xhat_.p, sigma_.p, gamma_.p, dx, dz_.p, rows, d_);
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
    if (ln_) AddInPlace<T>(out, dx, (long long)rows * d_);
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
    SoftmaxCentre<T>(p_.p, gp_.p, gp_.p, mats * n_, n_);  // gp <- gs
    const T* gs = gp_.p;
    if (!L_.l2) {
      for (int h = 0; h < h_; ++h) {
        GemmRM<T>(handle_, false, false, n_, dk_, n_, scale_, gs + h * nn, n_, h_ * nn, k_.p + h * dk_, hq_, sq,
                  T(0), gq_.p + h * dk_, hq_, sq, b_);
        GemmRM<T>(handle_, true, false, n_, dk_, n_, scale_, gs + h * nn, n_, h_ * nn, q_.p + h * dk_, hq_, sq,
                  T(0), gk_.p + h * dk_, hq_, sq, b_);
      }
    } else {
      Symmetrize<T>(gs, sym_.p, rsum_.p, mats * n_, n_);
      for (int h = 0; h < h_; ++h)
        GemmRM<T>(handle_, false, false, n_, dk_, n_, T(2) * scale_, sym_.p + h * nn, n_, h_ * nn,
                  q_.p + h * dk_, hq_, sq, T(0), gq_.p + h * dk_, hq_, sq, b_);
      L2GradQFix<T>(gq_.p, q_.p, rsum_.p, rows, n_, h_, dk_, scale_);
    }
    T* gz = ln_ ? gz_.p : out;
    GemmRM<T>(handle_, false, false, rows, d_, hq_, T(1), gq_.p, hq_, 0, wq_.p, d_, 0, T(0), gz, d_, 0, 1);
    if (!L_.l2)
      GemmRM<T>(handle_, false, false, rows, d_, hq_, T(1), gk_.p, hq_, 0, wk_.p, d_, 0, T(1), gz, d_, 0, 1);
    GemmRM<T>(handle_, false, false, rows, d_, hv_, T(1), gv_.p, hv_, 0, m_.p, d_, 0, T(1), gz, d_, 0, 1);
    if (ln_) LnVjpResidual<T>(xhat_.p, sigma_.p, gamma_.p, gz_.p, u, out, rows, d_);
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
