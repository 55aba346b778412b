// The CPU back end: threads over points, each point's state computed once, then the
// shared driver (kernels/lanczos.h) run on that point alone with Eigen vectors as slots.
#include <cmath>
#include <string>

#include "kernels/backends.h"
#include "kernels/cpu_layer.h"
#include "kernels/lanczos.h"
#include "interval/parallel.h"

namespace lipcert::kernels_internal {
namespace {

template <class T>
double DotAcc(const RowMat<T>& a, const RowMat<T>& b) {
  const Eigen::Index n = a.size();
  if constexpr (std::is_same_v<T, double>) {
    return Eigen::Map<const Eigen::VectorXd>(a.data(), n).dot(Eigen::Map<const Eigen::VectorXd>(b.data(), n));
  } else {
    // float vectors, double accumulation in blocks of float partial sums.
    double acc = 0;
    const T* pa = a.data();
    const T* pb = b.data();
    constexpr Eigen::Index kBlock = 256;
    for (Eigen::Index i = 0; i < n; i += kBlock) {
      const Eigen::Index len = std::min(kBlock, n - i);
      using V = Eigen::Matrix<T, Eigen::Dynamic, 1>;
      acc += double(Eigen::Map<const V>(pa + i, len).dot(Eigen::Map<const V>(pb + i, len)));
    }
    return acc;
  }
}

template <class T>
class CpuEvaluator final : public JacobianEvaluator {
 public:
  CpuEvaluator(const AttentionLayer& layer, int tokens, const EvaluatorOptions& o)
      : JacobianEvaluator(tokens, layer.d_model), L_(layer, tokens), opts_(o), dopts_(DriverOptionsOf(o)) {
    name_ = std::string("cpu-") + DTypeToString(o.dtype) + "-" +
            std::to_string(WorkerCount(o.threads, 1 << 20)) + "t";
  }

  const char* name() const override { return name_.c_str(); }

  void Forward(const double* x, int batch, double* y) override {
    Run(batch, [&](Worker& w, int b) {
      Load(x, b, w.st.x);
      Evaluate(L_, w.st, w.ws);
      ForwardOutput(L_, w.st, w.ws, w.a);
      Store(w.a, b, y);
    });
  }

  void Jvp(const double* x, const double* v, int batch, double* out) override {
    Run(batch, [&](Worker& w, int b) {
      Load(x, b, w.st.x);
      Evaluate(L_, w.st, w.ws);
      Load(v, b, w.a);
      kernels_internal::Jvp(L_, w.st, w.ws, w.a, w.b);
      Store(w.b, b, out);
    });
  }

  void Vjp(const double* x, const double* u, int batch, double* out) override {
    Run(batch, [&](Worker& w, int b) {
      Load(x, b, w.st.x);
      Evaluate(L_, w.st, w.ws);
      Load(u, b, w.a);
      kernels_internal::Vjp(L_, w.st, w.ws, w.a, w.b);
      Store(w.b, b, out);
    });
  }

  void PairGradient(const double* x, const double* u, const double* v, int batch, double* grad) override {
    Run(batch, [&](Worker& w, int b) {
      Load(x, b, w.st.x);
      Evaluate(L_, w.st, w.ws);
      Load(u, b, w.a);
      Load(v, b, w.b);
      VjpTangent(L_, w.st, w.ws, w.a, w.b, w.c);
      Store(w.c, b, grad);
    });
  }

  std::unique_ptr<PointProducts> ProductsAt(const double* x) override { return std::make_unique<Products>(this, x); }

  TopSingular TopSingularValues(const double* x, int batch, bool want_grad, const double* v0) override {
    const size_t nd = size_t(point_size());
    TopSingular r;
    r.sigma.assign(batch, 0);
    r.u.assign(batch * nd, 0);
    r.v.assign(batch * nd, 0);
    if (want_grad) r.grad.assign(batch * nd, 0);
    r.iterations.assign(batch, 0);
    r.converged.assign(batch, 0);
    Run(batch, [&](Worker& w, int b) {
      Load(x, b, w.st.x);
      Evaluate(L_, w.st, w.ws);
      RowMat<T>& start = w.slots[0];
      bool have_start = false;
      if (v0) {
        Load(v0, b, start);
        have_start = start.squaredNorm() > 0 && start.allFinite();
      }
      if (!have_start) {
        DefaultStartVector(b, int(nd), w.dbuf.data());
        start = Eigen::Map<const RowMat<double>>(w.dbuf.data(), tokens(), width()).cast<T>();
      }
      PointOps ops{this, &w};
      const DriverResult dr = RunTopSingular(ops, dopts_);
      const RowMat<T>& v = w.slots[dopts_.result_slot()];
      kernels_internal::Jvp(L_, w.st, w.ws, v, w.a);  // J v
      const double sigma = std::sqrt(DotAcc(w.a, w.a));
      if (sigma > 0) w.a *= T(1 / sigma);
      r.sigma[b] = sigma;
      r.iterations[b] = dr.iterations[0];
      r.converged[b] = dr.converged[0];
      Store(w.a, b, r.u.data());
      Store(v, b, r.v.data());
      if (want_grad) {
        VjpTangent(L_, w.st, w.ws, w.a, v, w.c);
        Store(w.c, b, r.grad.data());
      }
    });
    return r;
  }

 private:
  struct Worker {
    PointState<T> st;
    Workspace<T> ws;
    RowMat<T> a, b, c, tmp;
    std::vector<RowMat<T>> slots;
    std::vector<double> dbuf;
  };

  // One worker, the point's state evaluated once; each product on the calling thread.
  class Products final : public PointProducts {
   public:
    Products(const CpuEvaluator* e, const double* x) : e_(e) {
      e_->Prepare(w_);
      e_->Load(x, 0, w_.st.x);
      Evaluate(e_->L_, w_.st, w_.ws);
    }
    void Jvp(const double* v, double* out) override {
      e_->Load(v, 0, w_.a);
      kernels_internal::Jvp(e_->L_, w_.st, w_.ws, w_.a, w_.b);
      e_->Store(w_.b, 0, out);
    }
    void Vjp(const double* u, double* out) override {
      e_->Load(u, 0, w_.a);
      kernels_internal::Vjp(e_->L_, w_.st, w_.ws, w_.a, w_.b);
      e_->Store(w_.b, 0, out);
    }

   private:
    const CpuEvaluator* e_;
    Worker w_;
  };

  // The driver's slots for one point (batch of 1).
  struct PointOps {
    CpuEvaluator* e;
    Worker* w;
    int batch() const { return 1; }
    RowMat<T>& S(int i) { return w->slots[i]; }
    void ApplyNormal(int src, int dst, const unsigned char*) {
      NormalProduct(e->L_, w->st, w->ws, S(src), w->tmp, S(dst));
    }
    void Dots(int wi, int m, double* c) {
      for (int i = 0; i < m; ++i) c[i] = DotAcc(S(i), S(wi));
    }
    void SubtractCombination(int wi, int m, const double* c) {
      for (int i = 0; i < m; ++i) S(wi) -= T(c[i]) * S(i);
    }
    void Norms(int s, double* out) { out[0] = std::sqrt(DotAcc(S(s), S(s))); }
    void Scale(int src, int dst, const double* f) {
      if (src == dst) S(dst) *= T(f[0]);
      else S(dst) = T(f[0]) * S(src);
    }
    void Combine(int m, const double* c, int dst, const unsigned char* mask) {
      if (!mask[0]) return;
      S(dst) = T(c[0]) * S(0);
      for (int i = 1; i < m; ++i) S(dst) += T(c[i]) * S(i);
    }
  };

  template <class Fn>
  void Run(int batch, Fn&& fn) {
    if (batch <= 0) return;
    const int nw = WorkerCount(opts_.threads, batch);
    std::vector<Worker> workers(nw);
    for (Worker& w : workers) Prepare(w);
    ParallelFor(batch, nw, [&](int b, int worker) { fn(workers[worker], b); });
  }

  void Prepare(Worker& w) const {
    w.ws.Resize(L_);
    for (RowMat<T>* m : {&w.a, &w.b, &w.c, &w.tmp}) m->resize(tokens(), width());
    w.slots.assign(dopts_.slots(), RowMat<T>::Zero(tokens(), width()));
    w.dbuf.resize(point_size());
  }

  void Load(const double* src, int b, RowMat<T>& dst) const {
    dst = Eigen::Map<const RowMat<double>>(src + size_t(b) * point_size(), tokens(), width()).cast<T>();
  }
  void Store(const RowMat<T>& src, int b, double* dst) const {
    Eigen::Map<RowMat<double>>(dst + size_t(b) * point_size(), tokens(), width()) = src.template cast<double>();
  }

  CpuLayer<T> L_;
  EvaluatorOptions opts_;
  DriverOptions dopts_;
  std::string name_;
};

}  // namespace

std::unique_ptr<JacobianEvaluator> MakeCpuEvaluator(const AttentionLayer& layer, int tokens,
                                                    const EvaluatorOptions& options) {
  if (options.dtype == DType::kF32) return std::make_unique<CpuEvaluator<float>>(layer, tokens, options);
  return std::make_unique<CpuEvaluator<double>>(layer, tokens, options);
}

}  // namespace lipcert::kernels_internal
