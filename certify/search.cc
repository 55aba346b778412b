#include "certify/search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include "certify/witness_eval.h"
#include "interval/parallel.h"
#include "kernels/engine.h"
#include "models/forward.h"

namespace lipcert {
namespace {

using Clock = std::chrono::steady_clock;
using Eigen::MatrixXd;

// ---------------------------------------------------------------------------------------
// The Jacobian oracle: the only code here that computes Jacobian products. It runs on the
// batched engine (kernels/engine.h, CPU back end, one point at a time, one thread: the
// search parallelises over starts with one Oracle per worker); the dense path for tiny
// sizes uses models/forward.h.
using RowMajorXd = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

class Oracle {
 public:
  Oracle(const AttentionLayer& layer, int tokens, double rel_tol, int max_iters)
      : layer_(layer), n_(tokens), d_(layer.d_model) {
    EngineOptions eo;
    eo.device = Device::kCpu;
    eo.dtype = DType::kF64;
    eo.threads = 1;
    eo.rel_tol = rel_tol;
    eo.max_iters = max_iters;
    engine_ = MakeJacobianEngine(layer, tokens, eo);
  }
  MatrixXd Jv(const MatrixXd& x, const MatrixXd& v) const {
    RowMajorXd out(n_, d_);
    engine_->Jvp(RowMajorXd(x).data(), RowMajorXd(v).data(), 1, out.data());
    return out;
  }
  MatrixXd JTu(const MatrixXd& x, const MatrixXd& u) const {
    RowMajorXd out(n_, d_);
    engine_->Vjp(RowMajorXd(x).data(), RowMajorXd(u).data(), 1, out.data());
    return out;
  }
  // grad_X <u, J(X) v> with u, v fixed.
  MatrixXd PairGradient(const MatrixXd& x, const MatrixXd& u, const MatrixXd& v) const {
    RowMajorXd out(n_, d_);
    engine_->PairGradient(RowMajorXd(x).data(), RowMajorXd(u).data(), RowMajorXd(v).data(), 1, out.data());
    return out;
  }
  // Top singular triple (sigma = ||J v||, J v = sigma u), optionally warm-started.
  void TopSingular(const MatrixXd& x, const MatrixXd* v0, double* sigma, MatrixXd* u, MatrixXd* v) const {
    const RowMajorXd xr(x);
    RowMajorXd v0r;
    if (v0) v0r = *v0;
    const lipcert::TopSingular t = engine_->TopSingularValues(xr.data(), 1, false, v0 ? v0r.data() : nullptr);
    *sigma = t.sigma[0];
    *u = Eigen::Map<const RowMajorXd>(t.u.data(), n_, d_);
    *v = Eigen::Map<const RowMajorXd>(t.v.data(), n_, d_);
  }
  // Dense (ND) x (ND) Jacobian, row-major flattening i*D + a (small sizes).
  MatrixXd Dense(const MatrixXd& x) const { return DenseJacobian<double>(layer_, x); }
  // J v through models/forward.h (the reference, for the final value).
  MatrixXd ReferenceJv(const MatrixXd& x, const MatrixXd& v) const {
    return lipcert::Jvp<double>(layer_, Evaluate<double>(layer_, x), v);
  }

 private:
  const AttentionLayer& layer_;
  int n_, d_;
  std::unique_ptr<JacobianEngine> engine_;
};

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

MatrixXd Gaussian(int rows, int cols, std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0, 1);
  MatrixXd m(rows, cols);
  for (int j = 0; j < cols; ++j)
    for (int i = 0; i < rows; ++i) m(i, j) = nd(rng);
  return m;
}

MatrixXd SignOf(const MatrixXd& m) {
  return m.unaryExpr([](double t) { return t < 0 ? -1.0 : 1.0; });
}

// Top direction at a point, with a warm start when one is known.
struct Pair {
  double value = -1;  // floating; -1: not computed
  MatrixXd u, v;
  int row = -1;  // kLinf: the row r
};

// Engine stopping rules (relative Ritz residual, J^T J products): screening and ascent,
// and the final witness direction.
constexpr double kCheapTol = 1e-6;
constexpr int kCheapIters = 60;
constexpr double kFineTol = 1e-13;
constexpr int kFineIters = 3000;

struct TopParams {
  int dense_limit = 16;  // N*D at or below which the Jacobian is formed
  int iters = 12;        // kLinf: Hager steps = iters / 3 (kL2 follows the engine's rule)
};

Pair ComputeTop(const Oracle& o, const MatrixXd& x, NormKind norm, const Pair* warm,
                const TopParams& tp) {
  const int n = int(x.rows()), d = int(x.cols()), nd = n * d;
  Pair p;
  if (nd <= tp.dense_limit) {
    const MatrixXd jac = o.Dense(x);
    auto unflat = [&](const Eigen::VectorXd& f) {
      MatrixXd m(n, d);
      for (int k = 0; k < nd; ++k) m(k / d, k % d) = f(k);
      return m;
    };
    if (norm == NormKind::kL2) {
      Eigen::BDCSVD<MatrixXd> svd(jac, Eigen::ComputeThinU | Eigen::ComputeThinV);
      p.v = unflat(svd.matrixV().col(0));
      p.v /= p.v.norm();
      const MatrixXd w = o.ReferenceJv(x, p.v);
      p.value = w.norm();
      p.u = p.value > 0 ? MatrixXd(w / p.value) : unflat(svd.matrixU().col(0));
    } else {
      Eigen::Index r;
      jac.cwiseAbs().rowwise().sum().maxCoeff(&r);
      p.row = int(r);
      p.u = MatrixXd::Zero(n, d);
      p.u(r / d, r % d) = 1;
      p.v = SignOf(unflat(jac.row(r).transpose()));
      p.value = jac.row(r).cwiseAbs().sum();
    }
    return p;
  }
  if (norm == NormKind::kL2) {
    const bool use_warm = warm && warm->v.rows() == n && warm->v.norm() > 0;
    o.TopSingular(x, use_warm ? &warm->v : nullptr, &p.value, &p.u, &p.v);
    return p;
  }
  // kLinf: Hager's estimator of ||B||_1 with B = J^T (= ||J||_inf), rows of J through VJPs.
  int r = (warm && warm->row >= 0 && warm->row < nd) ? warm->row : -1;
  MatrixXd e = r >= 0 ? MatrixXd(MatrixXd::Zero(n, d)) : MatrixXd(MatrixXd::Constant(n, d, 1.0 / nd));
  if (r >= 0) e(r / d, r % d) = 1;
  double best = -1;
  int best_row = -1;
  MatrixXd best_sign;
  for (int it = 0; it < std::max(2, tp.iters / 3); ++it) {
    const MatrixXd y = o.JTu(x, e);  // J^T e; for e = e_r, row r of J
    const MatrixXd xi = SignOf(y);
    if (r >= 0) {
      const double val = y.cwiseAbs().sum();
      if (val > best) best = val, best_row = r, best_sign = xi;
    }
    const MatrixXd z = o.Jv(x, xi);
    Eigen::Index i, j;
    const double zmax = z.cwiseAbs().maxCoeff(&i, &j);
    const int next = int(i) * d + int(j);
    if (r >= 0 && (next == r || zmax <= (z.array() * e.array()).sum())) break;
    r = next;
    e.setZero();
    e(r / d, r % d) = 1;
    if (it + 1 == std::max(2, tp.iters / 3)) {  // evaluate the last proposed row too
      const MatrixXd y2 = o.JTu(x, e);
      const double val = y2.cwiseAbs().sum();
      if (val > best) best = val, best_row = r, best_sign = SignOf(y2);
    }
  }
  p.row = best_row;
  p.value = best;
  p.v = best_sign;
  p.u = MatrixXd::Zero(n, d);
  p.u(best_row / d, best_row % d) = 1;
  return p;
}

// Gradient of <u, J(x) v> in x (the envelope theorem makes it the gradient of the norm at
// a simple top pair): d/dt J(x + t v)^T u at t = 0, exact from the engine.
MatrixXd PairGradient(const Oracle& o, const MatrixXd& x, const Pair& p) {
  if (!(p.v.cwiseAbs().maxCoeff() > 0)) return MatrixXd::Zero(x.rows(), x.cols());
  return o.PairGradient(x, p.u, p.v);
}

struct Candidate {
  MatrixXd x;
  std::string origin;
  Pair pair;
};

// ---------------------------------------------------------------------------------------
// Samples.
MatrixXd UniformIn(const InputSet& set, std::mt19937_64& rng) {
  const int n = set.tokens(), d = set.width();
  std::uniform_real_distribution<double> u01(0, 1);
  MatrixXd g = Gaussian(n, d, rng);
  switch (set.kind) {
    case SetKind::kBall: {
      const double gn = g.norm();
      if (gn > 0) g *= set.radius * std::pow(u01(rng), 1.0 / (n * d)) / gn;
      break;
    }
    case SetKind::kTokens:
      for (int i = 0; i < n; ++i) {
        const double gn = g.row(i).norm();
        if (gn > 0) g.row(i) *= set.radius * std::pow(u01(rng), 1.0 / d) / gn;
      }
      break;
    case SetKind::kBox:
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < d; ++j) g(i, j) = set.radius * (2 * u01(rng) - 1);
      break;
  }
  return set.Project(set.center + g);
}

MatrixXd OnBoundary(const InputSet& set, std::mt19937_64& rng) {
  const int n = set.tokens(), d = set.width();
  MatrixXd g = Gaussian(n, d, rng);
  switch (set.kind) {
    case SetKind::kBall: {
      const double gn = g.norm();
      if (gn > 0) g *= set.radius / gn;
      break;
    }
    case SetKind::kTokens:
      for (int i = 0; i < n; ++i) {
        const double gn = g.row(i).norm();
        if (gn > 0) g.row(i) *= set.radius / gn;
      }
      break;
    case SetKind::kBox: g = set.radius * SignOf(g); break;  // a vertex
  }
  return set.Project(set.center + g);
}

// A typical length of a move inside the set (Frobenius).
double SetScale(const InputSet& set) {
  const double s = set.FrobeniusRadius();
  return s > 0 ? s : 0;
}

// ---------------------------------------------------------------------------------------
// Structured starts from the theory (docs/search.md, notes on attention).
struct HeadDirections {
  double score = 0;  // ||A_h|| ||V_h||: how dangerous the head can be
  double sigma_a = 0;
  std::vector<Eigen::RowVectorXd> dirs;  // unit rows of length D
};

// Top singular pair (sigma, u, v) of m by power iteration on m^T m: a start direction
// only (no bound rests on it), and cheap for wide layers where a full SVD is not.
struct TopPair {
  double sigma = 0;
  Eigen::VectorXd u, v;
};
TopPair PowerTopPair(const MatrixXd& m, int iters = 60) {
  TopPair t;
  t.v = Eigen::VectorXd::Ones(m.cols()) / std::sqrt(double(m.cols()));
  for (int k = 0; k < iters; ++k) {
    Eigen::VectorXd w = m.transpose() * (m * t.v);
    const double n = w.norm();
    if (!(n > 0)) break;
    t.v = w / n;
  }
  t.u = m * t.v;
  t.sigma = t.u.norm();
  if (t.sigma > 0) t.u /= t.sigma;
  return t;
}

HeadDirections DirectionsOfHead(const AttentionLayer& L, int h) {
  HeadDirections hd;
  const MatrixXd wq = L.wq_head(h), wk = L.wk_head(h);
  const MatrixXd a = wq.transpose() * wk / std::sqrt(double(L.head_dim_qk));
  const TopPair sa = PowerTopPair(a);
  hd.sigma_a = sa.sigma;
  MatrixXd value = L.wo_head(h) * L.wv_head(h);
  if (L.kind == AttentionKind::kL2) value = value * a;
  const TopPair sv = PowerTopPair(value);
  hd.score = hd.sigma_a * sv.sigma;
  // Largest algebraic eigenvector of the symmetric part: power iteration after a shift
  // that makes the part positive semidefinite.
  const MatrixXd sym = (a + a.transpose()) / 2;
  const MatrixXd shifted = sym + sym.norm() * MatrixXd::Identity(sym.rows(), sym.cols());
  const TopPair se = PowerTopPair(shifted);
  std::vector<Eigen::RowVectorXd> cand = {sa.v.transpose(), sa.u.transpose(), se.v.transpose(), sv.v.transpose()};
  for (auto& w : cand) {
    const double wn = w.norm();
    if (!(wn > 0)) continue;
    w /= wn;
    bool dup = false;
    for (const auto& e : hd.dirs) dup |= std::abs(e.dot(w)) > 0.999;
    if (!dup) hd.dirs.push_back(w);
  }
  return hd;
}

// x := x_k duplicated onto token j, then nudged by eps along w.
MatrixXd MassSplit(const MatrixXd& base, int k, int j, const Eigen::RowVectorXd& w, double eps) {
  MatrixXd x = base;
  x.row(j) = base.row(k) + eps * w;
  return x;
}

std::vector<Candidate> StructuredStarts(const AttentionLayer& L, const InputSet& set,
                                        std::mt19937_64& rng) {
  const int n = set.tokens(), d = set.width();
  const MatrixXd& x0 = set.center;
  const Eigen::RowVectorXd c = x0.colwise().mean();
  const double r = set.kind == SetKind::kBall ? set.radius : set.TokenRadius();
  std::vector<Candidate> out;
  auto add = [&](const MatrixXd& x, const char* origin) {
    out.push_back({set.Project(x), origin, {}});
  };
  std::vector<std::pair<double, int>> order;
  std::vector<HeadDirections> heads;
  for (int h = 0; h < L.heads; ++h) {
    heads.push_back(DirectionsOfHead(L, h));
    order.push_back({-heads.back().score, h});
  }
  std::sort(order.begin(), order.end());
  const int use_heads = std::min<int>(4, L.heads);
  std::vector<int> queries = {n - 1};  // the last query sees every token, causal or not
  if (!L.causal && n > 2) queries.push_back(0);
  for (int oh = 0; oh < use_heads; ++oh) {
    const HeadDirections& hd = heads[order[oh].second];
    std::vector<double> ts = {0.25 * r, 0.5 * r, 0.75 * r, r};
    if (hd.sigma_a > 0)
      for (double t : {0.5, 1.0, 1.5, 2.0, 3.0}) ts.push_back(t / std::sqrt(hd.sigma_a));
    for (const auto& w : hd.dirs) {
      for (double t : ts) {
        if (!(t > 0)) continue;
        // A query splitting its attention between far-apart tokens at +-t w.
        for (int q : queries) {
          MatrixXd xa(n, d), xd = x0;
          int sgn = 1;
          for (int i = 0; i < n; ++i) {
            if (i == q) {
              xa.row(i) = c;
              continue;
            }
            xa.row(i) = c + sgn * t * w;
            xd.row(i) = x0.row(i) + sgn * t * w;
            sgn = -sgn;
          }
          add(xa, "split-attention");
          add(xd, "split-attention");
        }
        // Two tokens only, the rest at the centre (what a ball's budget allows).
        if (n >= 2) {
          MatrixXd xp = x0;
          xp.row(0) += t * w;
          xp.row(n - 1) -= t * w;
          add(xp, "split-attention");
        }
        // Unbalanced mass: one token at t w, the others at alpha t w.
        for (int k : {0, n - 1}) {
          for (double alpha : {0.5, 0.25, 0.75}) {
            if (alpha != 0.5 && t != r) continue;
            MatrixXd xa(n, d);
            for (int i = 0; i < n; ++i) xa.row(i) = c + (i == k ? 1.0 : alpha) * t * w;
            add(xa, "mass-unbalanced");
            MatrixXd xm(n, d);
            for (int i = 0; i < n; ++i) xm.row(i) = c - (i == k ? 1.0 : alpha) * t * w;
            add(xm, "mass-unbalanced");
          }
          if (n == 1) break;
        }
      }
    }
  }
  // Mass splitting at the centre: duplicate token k onto j, nudge one copy.
  if (n >= 2 && !heads.empty()) {
    const auto& w = heads[order[0].second].dirs.front();
    std::uniform_int_distribution<int> pick(0, n - 1);
    for (int t = 0; t < std::min(16, n * (n - 1)); ++t) {
      const int k = pick(rng);
      int j = pick(rng);
      if (j == k) j = (k + 1) % n;
      add(MassSplit(x0, k, j, w, (t % 2 ? 0.05 : -0.05) * r), "mass-split");
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------
struct AscentResult {
  MatrixXd x;
  Pair pair;
  int steps = 0;
  int evaluations = 0;
};

AscentResult Ascend(const Oracle& o, const InputSet& set, const Candidate& start, NormKind norm,
                    int max_steps, Clock::time_point deadline) {
  AscentResult res;
  res.x = start.x;
  TopParams tp;
  tp.iters = 10;
  res.pair = start.pair.value >= 0 ? start.pair : ComputeTop(o, res.x, norm, nullptr, tp);
  const double scale = SetScale(set);
  if (!(scale > 0)) return res;
  double eta = 0.1 * scale;
  for (int step = 0; step < max_steps; ++step) {
    if (Clock::now() >= deadline) break;
    const MatrixXd g = PairGradient(o, res.x, res.pair);
    const double gn = g.norm();
    if (!(gn > 0) || !std::isfinite(gn)) break;
    bool accepted = false;
    for (int tries = 0; tries < 12 && !accepted; ++tries) {
      const MatrixXd xt = set.Project(res.x + (eta / gn) * g);
      if ((xt - res.x).norm() <= 1e-13 * scale) break;  // stationary on the boundary
      const Pair pt = ComputeTop(o, xt, norm, &res.pair, tp);
      ++res.evaluations;
      if (pt.value > res.pair.value * (1 + 1e-13)) {
        res.x = xt;
        res.pair = pt;
        accepted = true;
        eta = std::min(eta * 1.6, scale);
      } else {
        eta *= 0.3;
      }
    }
    if (!accepted) break;
    ++res.steps;
  }
  return res;
}

bool NearDuplicate(const MatrixXd& a, const MatrixXd& b, double scale) {
  return (a - b).norm() <= 1e-9 * (1 + scale);
}

}  // namespace

std::string ValidateSearchOptions(const SearchOptions& o) {
  if (!(o.time_limit_s >= 0) || !std::isfinite(o.time_limit_s)) return "time_limit_s: must be finite and >= 0";
  if (o.starts < 1) return "starts: must be >= 1";
  if (o.max_steps < 0) return "max_steps: must be >= 0";
  if (o.max_rounds < 0) return "max_rounds: must be >= 0";
  if (o.threads < 0) return "threads: must be >= 0";
  return "";
}

TopDirection TopDirectionAt(const AttentionLayer& layer, const MatrixXd& x, NormKind norm,
                            int dense_limit) {
  if (std::string e = ValidateLayer(layer); !e.empty()) throw std::invalid_argument("layer: " + e);
  if (x.cols() != layer.d_model || x.rows() < 1)
    throw std::invalid_argument("x: must be N x " + std::to_string(layer.d_model));
  const Oracle o(layer, int(x.rows()), kFineTol, kFineIters);
  TopParams tp;
  tp.dense_limit = dense_limit;
  tp.iters = 30;
  const Pair p = ComputeTop(o, x, norm, nullptr, tp);
  return {p.value, p.u, p.v};
}

SearchResult SearchLowerBound(const AttentionLayer& layer, const InputSet& set,
                              const SearchOptions& opts) {
  const auto t0 = Clock::now();
  if (std::string e = ValidateSearchOptions(opts); !e.empty())
    throw std::invalid_argument("search options: " + e);
  if (std::string e = ValidateLayer(layer); !e.empty()) throw std::invalid_argument("layer: " + e);
  if (set.width() != layer.d_model || set.tokens() < 1)
    throw std::invalid_argument("input set: centre must be N x " + std::to_string(layer.d_model));
  if (!(set.radius >= 0) || !std::isfinite(set.radius))
    throw std::invalid_argument("input set: radius must be finite and >= 0");
  const auto deadline =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts.time_limit_s));
  const int threads = opts.threads > 0 ? opts.threads : std::max(1u, std::thread::hardware_concurrency());
  // One oracle per worker for screening and ascent (cheap stopping rule), one accurate.
  std::vector<std::unique_ptr<Oracle>> oracles;
  for (int t = 0; t < threads; ++t)
    oracles.push_back(std::make_unique<Oracle>(layer, set.tokens(), kCheapTol, kCheapIters));
  const Oracle fine_oracle(layer, set.tokens(), kFineTol, kFineIters);
  const double scale = SetScale(set);
  std::mt19937_64 rng(SplitMix(opts.seed));

  SearchResult result;
  std::map<std::string, double> by_origin;
  std::vector<Candidate> elite;  // best points seen, by value, distinct
  std::atomic<int> evaluations{0};
  const size_t elite_size = std::max(4, opts.starts);

  auto record = [&](const MatrixXd& x, const std::string& origin, const Pair& p) {
    double& b = by_origin.try_emplace(origin, -1.0).first->second;
    b = std::max(b, p.value);
    for (auto& e : elite)
      if (NearDuplicate(e.x, x, scale)) {
        if (p.value > e.pair.value) e = {x, origin, p};
        return;
      }
    elite.push_back({x, origin, p});
    std::stable_sort(elite.begin(), elite.end(),
                     [](const Candidate& a, const Candidate& b) { return a.pair.value > b.pair.value; });
    if (elite.size() > elite_size) elite.pop_back();
  };

  TopParams screen;
  screen.iters = 12;
  auto evaluate_all = [&](std::vector<Candidate>& cands) {
    ParallelFor(int(cands.size()), threads, [&](int i, int worker) {
      if (i > 0 && Clock::now() >= deadline) return;
      cands[i].pair = ComputeTop(*oracles[worker], cands[i].x, opts.norm, nullptr, screen);
      evaluations.fetch_add(1);
    });
    for (const auto& c : cands)
      if (c.pair.value >= 0) record(c.x, c.origin, c.pair);
  };

  for (int round = 0; opts.max_rounds == 0 || round < opts.max_rounds; ++round) {
    if (round > 0 && Clock::now() >= deadline) break;
    std::vector<Candidate> cands;
    if (round == 0) cands.push_back({set.center, "centre", {}});
    for (int s = 0; s < opts.starts; ++s) {
      cands.push_back({UniformIn(set, rng), "sample", {}});
      cands.push_back({OnBoundary(set, rng), "boundary", {}});
    }
    if (round == 0 && opts.structured) {
      std::vector<Candidate> st = StructuredStarts(layer, set, rng);
      // Keep the list bounded for big layers: an even stride through it.
      const size_t cap = size_t(6) * opts.starts;
      if (st.size() > cap) {
        std::vector<Candidate> kept;
        for (size_t k = 0; k < cap; ++k) kept.push_back(std::move(st[k * st.size() / cap]));
        st.swap(kept);
      }
      for (auto& c : st) cands.push_back(std::move(c));
    }
    if (round > 0 && !elite.empty()) {
      // Perturbations of the best points and mass splitting of the best one.
      std::normal_distribution<double> nd(0, 1);
      for (size_t e = 0; e < std::min<size_t>(elite.size(), opts.starts); ++e) {
        const double sigma = scale * 0.2 / std::sqrt(double(set.tokens() * set.width())) *
                             std::pow(0.5, double(e % 4));
        MatrixXd noise = Gaussian(set.tokens(), set.width(), rng) * sigma;
        cands.push_back({set.Project(elite[e].x + noise), "perturb", {}});
      }
      if (set.tokens() >= 2) {
        const MatrixXd& b = elite.front().x;
        std::uniform_int_distribution<int> pick(0, set.tokens() - 1);
        const Eigen::RowVectorXd w = Gaussian(1, set.width(), rng).row(0).normalized();
        for (int t = 0; t < std::min(8, opts.starts); ++t) {
          const int k = pick(rng);
          int j = pick(rng);
          if (j == k) j = (k + 1) % set.tokens();
          cands.push_back({set.Project(MassSplit(b, k, j, w, 0.02 * set.TokenRadius() * (t % 2 ? 1 : -1))),
                           "mass-split", {}});
        }
      }
    }
    evaluate_all(cands);
    if (opts.verbose)
      std::fprintf(stderr, "search: round %d screened %zu points, best %.6g\n", round, cands.size(),
                   elite.empty() ? 0.0 : elite.front().pair.value);

    // Ascent starts: the best of each origin first, then by value.
    std::vector<Candidate> starts;
    {
      std::vector<const Candidate*> pool;
      for (const auto& c : cands)
        if (c.pair.value >= 0) pool.push_back(&c);
      for (const auto& e : elite) pool.push_back(&e);
      std::stable_sort(pool.begin(), pool.end(),
                       [](const Candidate* a, const Candidate* b) { return a->pair.value > b->pair.value; });
      std::map<std::string, int> seen;
      auto take = [&](const Candidate* c) {
        for (const auto& s : starts)
          if (NearDuplicate(s.x, c->x, scale)) return;
        starts.push_back(*c);
      };
      for (const Candidate* c : pool)
        if (int(starts.size()) < opts.starts && seen[c->origin]++ == 0) take(c);
      for (const Candidate* c : pool)
        if (int(starts.size()) < opts.starts) take(c);
    }
    std::vector<AscentResult> asc(starts.size());
    ParallelFor(int(starts.size()), threads, [&](int i, int worker) {
      asc[i] = Ascend(*oracles[worker], set, starts[i], opts.norm, opts.max_steps, deadline);
    });
    for (size_t i = 0; i < asc.size(); ++i) {
      evaluations.fetch_add(asc[i].evaluations);
      result.ascent_steps += asc[i].steps;
      const std::string origin = starts[i].origin.rfind("ascent:", 0) == 0
                                     ? starts[i].origin
                                     : "ascent:" + starts[i].origin;
      if (asc[i].steps > 0) record(asc[i].x, origin, asc[i].pair);
    }
    result.rounds = round + 1;
    if (opts.verbose)
      std::fprintf(stderr, "search: round %d ascended %zu starts, best %.6g (%s)\n", round,
                   starts.size(), elite.front().pair.value, elite.front().origin.c_str());
  }

  // Polish the top few points: accurate top direction, then the rigorous value.
  TopParams fine;
  fine.dense_limit = 256;
  fine.iters = 30;
  Witness best;
  best.value = -1;
  for (size_t e = 0; e < std::min<size_t>(3, elite.size()); ++e) {
    MatrixXd x = elite[e].x;
    // The final point must be inside the set, not merely within rounding of it.
    for (int k = 0; k < 40 && !CertainlyInSet(set, x); ++k)
      x = set.center + (x - set.center) * (1 - std::ldexp(1.0, -48 + k));
    const Pair p = ComputeTop(fine_oracle, x, opts.norm, &elite[e].pair, fine);
    evaluations.fetch_add(1);
    const MatrixXd jv = fine_oracle.ReferenceJv(x, p.v);
    const double value = opts.norm == NormKind::kL2 ? jv.norm() / p.v.norm()
                                                     : jv.cwiseAbs().maxCoeff() / p.v.cwiseAbs().maxCoeff();
    if (value > best.value) best = {x, p.v, value, 0, elite[e].origin};
  }
  if (opts.rigorous && best.value > 0 && CertainlyInSet(set, best.x))
    best.lower_bound = WitnessLowerBound(layer, best.x, best.v, opts.norm).value();
  result.best = best;
  result.points_evaluated = evaluations.load();
  result.best_by_origin.assign(by_origin.begin(), by_origin.end());
  result.elapsed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return result;
}

}  // namespace lipcert
