// Batched Jacobian-norm evaluator: forward pass, Jacobian-vector and vector-Jacobian
// products of an AttentionLayer at many points at once, the top singular triple of the
// Jacobian J(X) at each point, and the gradient of sigma_1 with respect to X.
//
// Everything follows the closed-form structure of the layer (models/forward.h is the
// per-point reference); no autodiff, and no (N*D) x (N*D) matrix is ever formed.
// Two back ends sit behind one interface, chosen at run time: CPU (Eigen, threads over
// points, float32 or float64) and CUDA (cuBLAS strided-batched GEMMs plus simple fused
// kernels; only when built with CUDA and a device is present).
//
// Layout of every array argument: `batch` points one after the other, each point an
// N x D row-major matrix (token i is row i), i.e. element (b, i, a) at b*N*D + i*D + a.
// Inputs and outputs are double in the interface whatever the compute type (DType).
//
// Naming: this is the *uncertified* evaluator (floating point, no bound direction); the
// certified bound engines live in certify/ (block_norm, centred, branch_and_bound, ...).
//
// The singular values found here are NOT certified: they are witnessed lower bounds only
// after a rigorous re-evaluation (the certify/ layer does that). What is guaranteed, up to
// floating-point rounding, is sigma = ||J v|| for the returned unit vector v, hence
// sigma <= ||J||_2.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/attention_layer.h"

namespace lipcert {

enum class Device { kCpu, kCuda };
enum class DType { kF32, kF64 };
// How the top singular pair is found.
enum class SingularMethod {
  kLanczos,  // restarted Lanczos on J^T J with full reorthogonalisation (default)
  kPower,    // plain power iteration on J^T J (for comparison and fixed-work runs)
};

const char* DeviceToString(Device d);  // "cpu" | "cuda"
bool StringToDevice(const std::string& s, Device* d);
const char* DTypeToString(DType t);  // "f32" | "f64"
bool StringToDType(const std::string& s, DType* t);
const char* SingularMethodToString(SingularMethod m);  // "lanczos" | "power"
bool StringToSingularMethod(const std::string& s, SingularMethod* m);

// True when lipcert was built with CUDA and a CUDA device is present.
bool CudaAvailable();
// Why CUDA is not available ("" when it is).
std::string CudaUnavailableReason();
// kCuda when CudaAvailable(), else kCpu.
Device DefaultDevice();

struct EvaluatorOptions {
  Device device = Device::kCpu;    // back end; validation refuses one that was not built
  DType dtype = DType::kF64;       // compute type (interface arrays stay double)
  int threads = 0;                 // CPU worker threads over points; 0 = hardware concurrency
  // Stopping rule: the Ritz residual ||J^T J v - theta v|| <= rel_tol * theta, theta = sigma^2
  // (see docs/kernels.md). 0 runs exactly max_iters products (fixed work).
  double rel_tol = 1e-6;
  int max_iters = 500;             // cap on J^T J products per point
  int krylov_dim = 24;             // Lanczos basis size before a restart (>= 2)
  SingularMethod method = SingularMethod::kLanczos;  // Lanczos or power iteration
};

// Result of TopSingularValues for `batch` points.
struct TopSingular {
  std::vector<double> sigma;               // (B) sigma = ||J v||, the top singular value estimate
  std::vector<double> u, v;                // (B*N*D) unit vectors, J v = sigma u
  std::vector<double> grad;                // (B*N*D) grad_X sigma_1 (empty unless asked)
  std::vector<int> iterations;             // (B) J^T J products used at each point
  std::vector<unsigned char> converged;    // (B) 1 when the stopping rule was met
};

// Number of floating-point operations in the GEMMs of one call of each primitive at one
// point (2*m*n*k per m x n x k product; element-wise work is not counted).
struct GemmFlops {
  double evaluate = 0;       // forward state (projections, logits, P V, output)
  double jvp = 0;            // one J v
  double vjp = 0;            // one J^T u
  double pair_gradient = 0;  // one grad_X <u, J v> (CPU: exact tangent of the VJP)
  double normal_cpu = 0;     // one J^T J v as the CPU evaluator does it (Wo^T Wo fused without LN)
};
GemmFlops CountGemmFlops(const AttentionLayer& layer, int tokens);

// J(X) v and J(X)^T u at one point, many times (a Lanczos run at one centre). Made by
// JacobianEvaluator::ProductsAt, which it must not outlive.
class PointProducts {
 public:
  virtual ~PointProducts() = default;
  virtual void Jvp(const double* v, double* out) = 0;  // out = J(X) v
  virtual void Vjp(const double* u, double* out) = 0;  // out = J(X)^T u
};

class JacobianEvaluator {
 public:
  virtual ~JacobianEvaluator() = default;

  // f(X) at each point.
  virtual void Forward(const double* x, int batch, double* y) = 0;
  // out = J(X_b) v_b at each point b.
  virtual void Jvp(const double* x, const double* v, int batch, double* out) = 0;
  // out = J(X_b)^T u_b at each point b.
  virtual void Vjp(const double* x, const double* u, int batch, double* out) = 0;
  // grad = grad_X <u_b, J(X_b) v_b> with u, v held fixed (= d/dt J(X + t v)^T u at t = 0).
  // For the l_inf norm take u = e_r (a row of J) and v = a sign vector s.
  virtual void PairGradient(const double* x, const double* u, const double* v, int batch,
                            double* grad) = 0;
  // Top singular value and vectors of J(X_b) at each point; v0 (B*N*D, optional) seeds the
  // iteration (else a fixed pseudo-random start per point). With want_grad, also
  // grad_X sigma_1 = PairGradient(x, u, v) (envelope theorem; valid for a simple sigma_1).
  virtual TopSingular TopSingularValues(const double* x, int batch, bool want_grad,
                                        const double* v0 = nullptr) = 0;

  // Products at the one point x (N*D, copied): the default calls Jvp and Vjp with a batch of
  // one, which set the point up every time; the CPU back end sets it up once (at
  // N D = 24576 a J^T J product took 18 ms the first way and 6 ms the second).
  virtual std::unique_ptr<PointProducts> ProductsAt(const double* x);

  virtual const char* name() const = 0;  // e.g. "cpu-f64-4t", "cuda-f32"
  int tokens() const { return tokens_; }
  int width() const { return width_; }
  int point_size() const { return tokens_ * width_; }  // N*D

 protected:
  JacobianEvaluator(int tokens, int width) : tokens_(tokens), width_(width) {}

 private:
  int tokens_, width_;
};

// Checks the layer and the options; throws std::invalid_argument naming the bad field
// ("evaluator.device: cuda was requested but lipcert was built without CUDA").
std::unique_ptr<JacobianEvaluator> MakeJacobianEvaluator(const AttentionLayer& layer, int tokens,
                                                         const EvaluatorOptions& options);

// The fixed pseudo-random start vector used when TopSingularValues gets no v0 (unit norm,
// per point; the same on every back end).
void DefaultStartVector(int point_index, int size, double* out);


}  // namespace lipcert
