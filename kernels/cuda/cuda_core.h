// Host-facing interface of the CUDA back end (no CUDA syntax here: raw host pointers and
// an opaque implementation). The device code (kernels/cuda/*.cu) mirrors kernels/cpu_layer.h
// step by step: the same products, done as cuBLAS strided-batched GEMMs over all points
// (and per head), plus simple kernels for the row-wise softmax algebra, LayerNorm and the
// vector operations of the shared Lanczos driver (kernels/lanczos.h).
#pragma once

#include <memory>
#include <string>

namespace lipcert::cuda {

// Number of CUDA devices; 0 with *error set when the runtime reports a failure.
int DeviceCount(std::string* error);

// The layer as plain row-major double arrays (the layout of kernels_internal::CpuLayer).
struct LayerDesc {
  bool l2 = false;       // kL2 (tied query/key, logits -||q_i - q_j||^2 / sqrt(dk))
  bool causal = false;   // mask j > i
  int tokens = 0, d = 0, heads = 0, dk = 0, dv = 0;
  const double* wq = nullptr;  // (H dk, D)
  const double* wk = nullptr;  // (H dk, D); ignored for l2
  const double* m = nullptr;   // (H dv, D): value path, Wv_h (dot) or Wv_h A_h (l2)
  const double* wo = nullptr;  // (D, H dv)
  const double* bq = nullptr;  // (H dk) or null
  const double* bk = nullptr;  // (H dk) or null
  const double* bv = nullptr;  // (H dv) or null
  const double* bo = nullptr;  // (D) or null
  const double* ln_gamma = nullptr;  // (D); null = no LayerNorm sublayer
  const double* ln_beta = nullptr;   // (D)
  double ln_eps = 0;
};

// Device state: weights, the layer state at `batch` points and `slots` vectors of N*D per
// point. Host arrays are double, batch*N*D, point-major. Throws std::runtime_error with
// file and line on any CUDA or cuBLAS failure.
class Core {
 public:
  Core(const LayerDesc& layer, bool f64, int slots);
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // Uploads x and evaluates the state (LayerNorm, Q, K, V, P) at every point.
  void SetPoints(const double* x, int batch);
  int batch() const;
  void Forward(double* y);                    // y = f(x)
  void Upload(int slot, const double* host);  // slot <- host
  void Download(int slot, double* host);      // host <- slot
  void Jvp(int src, int dst);                 // slot_dst = J slot_src
  void Vjp(int src, int dst);                 // slot_dst = J^T slot_src

  // The driver's operations (kernels/lanczos.h), over all points of the batch.
  void ApplyNormal(int src, int dst);
  void Dots(int w, int m, double* c);
  void SubtractCombination(int w, int m, const double* c);
  void Norms(int s, double* out);
  void Scale(int src, int dst, const double* f);
  void Combine(int m, const double* c, int dst, const unsigned char* mask);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace lipcert::cuda
