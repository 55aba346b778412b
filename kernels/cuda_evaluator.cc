// The CUDA back end behind JacobianEvaluator: all points of a call in lock step on the
// device (kernels/cuda/cuda_core.h), driven by the same host-side Lanczos driver as the
// CPU evaluator. Compiled only when lipcert is built with CUDA.
#if defined(LIPCERT_HAVE_CUDA)

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "kernels/cpu_layer.h"
#include "kernels/cuda/cuda_core.h"
#include "kernels/lanczos.h"

namespace lipcert::kernels_internal {
namespace {

class CudaEvaluator final : public JacobianEvaluator {
 public:
  CudaEvaluator(const AttentionLayer& layer, int tokens, const EvaluatorOptions& o)
      : JacobianEvaluator(tokens, layer.d_model), host_(layer, tokens), opts_(o), dopts_(DriverOptionsOf(o)) {
    io_a_ = dopts_.slots();
    io_b_ = io_a_ + 1;
    cuda::LayerDesc desc;
    desc.l2 = layer.kind == AttentionKind::kL2;
    desc.causal = layer.causal;
    desc.tokens = tokens;
    desc.d = layer.d_model;
    desc.heads = layer.heads;
    desc.dk = layer.head_dim_qk;
    desc.dv = layer.head_dim_v;
    desc.wq = host_.wq.data();
    desc.wk = host_.wk.data();
    desc.m = host_.m.data();
    desc.wo = host_.wo.data();
    if (host_.bq.size()) desc.bq = host_.bq.data();
    if (host_.bk.size()) desc.bk = host_.bk.data();
    if (host_.bv.size()) desc.bv = host_.bv.data();
    if (host_.bo.size()) desc.bo = host_.bo.data();
    if (host_.ln) {
      desc.ln_gamma = host_.gamma.data();
      desc.ln_beta = host_.beta.data();
      desc.ln_eps = double(host_.eps);
    }
    core_ = std::make_unique<cuda::Core>(desc, o.dtype == DType::kF64, io_b_ + 1);
    name_ = std::string("cuda-") + DTypeToString(o.dtype);
  }

  const char* name() const override { return name_.c_str(); }

  void Forward(const double* x, int batch, double* y) override {
    if (batch <= 0) return;
    core_->SetPoints(x, batch);
    core_->Forward(y);
  }

  void Jvp(const double* x, const double* v, int batch, double* out) override {
    if (batch <= 0) return;
    core_->SetPoints(x, batch);
    core_->Upload(io_a_, v);
    core_->Jvp(io_a_, io_b_);
    core_->Download(io_b_, out);
  }

  void Vjp(const double* x, const double* u, int batch, double* out) override {
    if (batch <= 0) return;
    core_->SetPoints(x, batch);
    core_->Upload(io_a_, u);
    core_->Vjp(io_a_, io_b_);
    core_->Download(io_b_, out);
  }

  // Central difference of the VJP along v: (J(x + h v)^T u - J(x - h v)^T u) / (2 h) with
  // h = eps^(1/3) (1 + ||x||) / ||v|| per point (eps of the compute type): truncation
  // O(h^2), rounding O(eps / h), i.e. about eps^(2/3) relative (1e-11 in f64, 1e-5 in f32).
  void PairGradient(const double* x, const double* u, const double* v, int batch, double* grad) override {
    if (batch <= 0) return;
    const size_t nd = size_t(point_size());
    const double eps = opts_.dtype == DType::kF64 ? std::numeric_limits<double>::epsilon()
                                                  : double(std::numeric_limits<float>::epsilon());
    std::vector<double> h(batch), xs(batch * nd), plus(batch * nd), minus(batch * nd);
    for (int b = 0; b < batch; ++b) {
      double nx = 0, nv = 0;
      for (size_t i = 0; i < nd; ++i) nx += x[b * nd + i] * x[b * nd + i], nv += v[b * nd + i] * v[b * nd + i];
      h[b] = nv > 0 ? std::cbrt(eps) * (1 + std::sqrt(nx)) / std::sqrt(nv) : 0;
    }
    for (int sign : {1, -1}) {
      for (int b = 0; b < batch; ++b)
        for (size_t i = 0; i < nd; ++i) xs[b * nd + i] = x[b * nd + i] + sign * h[b] * v[b * nd + i];
      Vjp(xs.data(), u, batch, sign > 0 ? plus.data() : minus.data());
    }
    for (int b = 0; b < batch; ++b)
      for (size_t i = 0; i < nd; ++i)
        grad[b * nd + i] = h[b] > 0 ? (plus[b * nd + i] - minus[b * nd + i]) / (2 * h[b]) : 0;
  }

  TopSingular TopSingularValues(const double* x, int batch, bool want_grad, const double* v0) override {
    const size_t nd = size_t(point_size());
    TopSingular r;
    r.sigma.assign(batch, 0);
    r.u.assign(batch * nd, 0);
    r.v.assign(batch * nd, 0);
    r.iterations.assign(batch, 0);
    r.converged.assign(batch, 0);
    if (batch <= 0) return r;
    core_->SetPoints(x, batch);
    // Start vectors: v0 where given and nonzero, else the shared default.
    std::vector<double> start(batch * nd);
    for (int b = 0; b < batch; ++b) {
      double ss = 0;
      if (v0)
        for (size_t i = 0; i < nd; ++i) ss += v0[b * nd + i] * v0[b * nd + i];
      if (v0 && ss > 0 && std::isfinite(ss)) std::copy(v0 + b * nd, v0 + (b + 1) * nd, start.begin() + b * nd);
      else DefaultStartVector(b, int(nd), start.data() + b * nd);
    }
    core_->Upload(0, start.data());
    CoreOps ops{core_.get()};
    const DriverResult dr = RunTopSingular(ops, dopts_);
    const int R = dopts_.result_slot();
    core_->Download(R, r.v.data());
    core_->Jvp(R, io_a_);
    core_->Download(io_a_, r.u.data());
    for (int b = 0; b < batch; ++b) {
      double ss = 0;
      for (size_t i = 0; i < nd; ++i) ss += r.u[b * nd + i] * r.u[b * nd + i];
      const double sigma = std::sqrt(ss);
      r.sigma[b] = sigma;
      if (sigma > 0)
        for (size_t i = 0; i < nd; ++i) r.u[b * nd + i] /= sigma;
    }
    r.iterations = dr.iterations;
    r.converged = dr.converged;
    if (want_grad) {
      r.grad.assign(batch * nd, 0);
      PairGradient(x, r.u.data(), r.v.data(), batch, r.grad.data());
    }
    return r;
  }

 private:
  struct CoreOps {
    cuda::Core* c;
    int batch() const { return c->batch(); }
    void ApplyNormal(int src, int dst, const unsigned char*) { c->ApplyNormal(src, dst); }
    void Dots(int w, int m, double* out) { c->Dots(w, m, out); }
    void SubtractCombination(int w, int m, const double* coef) { c->SubtractCombination(w, m, coef); }
    void Norms(int s, double* out) { c->Norms(s, out); }
    void Scale(int src, int dst, const double* f) { c->Scale(src, dst, f); }
    void Combine(int m, const double* coef, int dst, const unsigned char* mask) { c->Combine(m, coef, dst, mask); }
  };

  CpuLayer<double> host_;  // row-major double weights (and the l2 value path) to upload
  EvaluatorOptions opts_;
  DriverOptions dopts_;
  int io_a_ = 0, io_b_ = 0;  // two slots for Jvp / Vjp arguments and results
  std::unique_ptr<cuda::Core> core_;
  std::string name_;
};

}  // namespace

std::unique_ptr<JacobianEvaluator> MakeCudaEvaluator(const AttentionLayer& layer, int tokens,
                                                     const EvaluatorOptions& options) {
  return std::make_unique<CudaEvaluator>(layer, tokens, options);
}

}  // namespace lipcert::kernels_internal

#endif  // LIPCERT_HAVE_CUDA
