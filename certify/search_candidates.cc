#include "certify/search_candidates.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace lipcert::search_parts {

using Eigen::MatrixXd;

namespace {

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

}  // namespace

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

MatrixXd LinearStep(const InputSet& set, const MatrixXd& g, double t) {
  MatrixXd d = MatrixXd::Zero(g.rows(), g.cols());
  switch (set.kind) {
    case SetKind::kBall:
      if (g.norm() > 0) d = (t * set.radius / g.norm()) * g;
      break;
    case SetKind::kTokens:
      for (Eigen::Index i = 0; i < g.rows(); ++i)
        if (g.row(i).norm() > 0) d.row(i) = (t * set.radius / g.row(i).norm()) * g.row(i);
      break;
    case SetKind::kBox: d = (t * set.radius) * SignOf(g); break;
  }
  return set.Project(set.center + d);
}

// A typical length of a move inside the set (Frobenius).
double SetScale(const InputSet& set) {
  const double s = set.FrobeniusRadius();
  return s > 0 ? s : 0;
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


std::vector<Candidate> RoundCandidates(const AttentionLayer& layer, const InputSet& set, const SearchOptions& opts,
                                       int round, const std::vector<Candidate>& elite, std::mt19937_64& rng) {
  const double scale = SetScale(set);
  std::vector<Candidate> cands;
  if (round == 0) cands.push_back({set.center, "centre", {}});
  // A point set holds the centre alone: every other candidate would project onto it (at
  // BERT-base size the structured starts alone took seconds there).
  if (scale == 0) return cands;
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
  return cands;
}

}  // namespace lipcert::search_parts
