#include "kernels/evaluator.h"

#include <cmath>
#include <random>
#include <stdexcept>

#include "kernels/backends.h"
#if defined(LIPCERT_HAVE_CUDA)
#include "kernels/cuda/cuda_core.h"
#endif

namespace lipcert {

const char* DeviceToString(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }
bool StringToDevice(const std::string& s, Device* d) {
  if (s == "cpu") *d = Device::kCpu;
  else if (s == "cuda") *d = Device::kCuda;
  else return false;
  return true;
}
const char* DTypeToString(DType t) { return t == DType::kF32 ? "f32" : "f64"; }
bool StringToDType(const std::string& s, DType* t) {
  if (s == "f32") *t = DType::kF32;
  else if (s == "f64") *t = DType::kF64;
  else return false;
  return true;
}
const char* SingularMethodToString(SingularMethod m) {
  return m == SingularMethod::kPower ? "power" : "lanczos";
}
bool StringToSingularMethod(const std::string& s, SingularMethod* m) {
  if (s == "lanczos") *m = SingularMethod::kLanczos;
  else if (s == "power") *m = SingularMethod::kPower;
  else return false;
  return true;
}

std::string CudaUnavailableReason() {
#if defined(LIPCERT_HAVE_CUDA)
  std::string why;
  const int n = cuda::DeviceCount(&why);
  if (n > 0) return "";
  return why.empty() ? "no CUDA device present" : why;
#else
  return "lipcert was built without CUDA (configure with -DLIPCERT_CUDA=ON and a CUDA toolkit)";
#endif
}

bool CudaAvailable() { return CudaUnavailableReason().empty(); }

Device DefaultDevice() { return CudaAvailable() ? Device::kCuda : Device::kCpu; }

GemmFlops CountGemmFlops(const AttentionLayer& L, int tokens) {
  const double n = tokens, d = L.d_model, h = L.heads, dk = L.head_dim_qk, dv = L.head_dim_v;
  const double hq = h * dk, hv = h * dv;
  const bool dot = L.kind == AttentionKind::kDot;
  const double proj_q = 2 * n * d * hq, proj_v = 2 * n * d * hv;
  const double nnk = 2 * n * n * dk * h, nnv = 2 * n * n * dv * h;  // one N x N x d product, all heads
  GemmFlops f;
  f.evaluate = proj_q * (dot ? 2 : 1) + proj_v + nnk + nnv + 2 * n * hv * d;
  f.jvp = proj_q * (dot ? 2 : 1) + proj_v + nnk * (dot ? 2 : 1) + 2 * nnv + 2 * n * hv * d;
  f.vjp = 2 * n * d * hv + 2 * nnv + nnk * (dot ? 2 : 1) + 2 * n * hq * d * (dot ? 2 : 1) + 2 * n * hv * d;
  f.pair_gradient = proj_q * (dot ? 2 : 1) + proj_v + nnk * (dot ? 2 : 1)  // tangent of the state
                    + 2 * n * d * hv + 4 * nnv                             // gh, gp, dgp, gv, dgv
                    + nnk * (dot ? 6 : 3)                                  // gq, dgq (, gk, dgk)
                    + 2 * (2 * n * hq * d * (dot ? 2 : 1) + 2 * n * hv * d);  // gz and dgz
  f.normal_cpu = f.jvp + f.vjp - (L.layer_norm ? 0 : 2 * (2 * n * hv * d) - 2 * n * hv * hv);
  return f;
}

void DefaultStartVector(int point_index, int size, double* out) {
  std::mt19937_64 rng(0x9E3779B97F4A7C15ull ^ (uint64_t(point_index) * 0xBF58476D1CE4E5B9ull));
  // Uniform in [-1, 1) from the top 53 bits: the same on every standard library.
  double ss = 0;
  for (int i = 0; i < size; ++i) {
    out[i] = double(rng() >> 11) * 0x1.0p-52 - 1.0;
    ss += out[i] * out[i];
  }
  const double inv = ss > 0 ? 1 / std::sqrt(ss) : 0;
  for (int i = 0; i < size; ++i) out[i] *= inv;
}

namespace {

// The default ProductsAt: the point kept, each product a batch of one.
class BatchOfOneProducts final : public PointProducts {
 public:
  BatchOfOneProducts(JacobianEvaluator* e, const double* x) : e_(e), x_(x, x + e->point_size()) {}
  void Jvp(const double* v, double* out) override { e_->Jvp(x_.data(), v, 1, out); }
  void Vjp(const double* u, double* out) override { e_->Vjp(x_.data(), u, 1, out); }

 private:
  JacobianEvaluator* e_;
  std::vector<double> x_;
};

}  // namespace

std::unique_ptr<PointProducts> JacobianEvaluator::ProductsAt(const double* x) {
  return std::make_unique<BatchOfOneProducts>(this, x);
}

namespace {

[[noreturn]] void Bad(const std::string& field, const std::string& msg) {
  throw std::invalid_argument("evaluator." + field + ": " + msg);
}

}  // namespace

std::unique_ptr<JacobianEvaluator> MakeJacobianEvaluator(const AttentionLayer& layer, int tokens,
                                                         const EvaluatorOptions& o) {
  const std::string bad_layer = ValidateLayer(layer);
  if (!bad_layer.empty()) Bad("layer", bad_layer);
  if (tokens < 1) Bad("tokens", "must be at least 1, got " + std::to_string(tokens));
  if (o.threads < 0) Bad("threads", "must be >= 0 (0 = hardware concurrency), got " + std::to_string(o.threads));
  if (!(o.rel_tol >= 0) || !std::isfinite(o.rel_tol)) Bad("rel_tol", "must be finite and >= 0");
  if (o.max_iters < 1) Bad("max_iters", "must be at least 1, got " + std::to_string(o.max_iters));
  if (o.krylov_dim < 2 || o.krylov_dim > 256)
    Bad("krylov_dim", "must be in [2, 256], got " + std::to_string(o.krylov_dim));
  if (o.device == Device::kCuda) {
#if defined(LIPCERT_HAVE_CUDA)
    const std::string why = CudaUnavailableReason();
    if (!why.empty()) Bad("device", "cuda was requested but is unavailable: " + why);
    return kernels_internal::MakeCudaEvaluator(layer, tokens, o);
#else
    Bad("device", "cuda was requested but lipcert was built without CUDA "
                  "(configure with -DLIPCERT_CUDA=ON and a CUDA toolkit)");
#endif
  }
  return kernels_internal::MakeCpuEvaluator(layer, tokens, o);
}

}  // namespace lipcert
