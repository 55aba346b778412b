#include "interval/interval_matrix.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "interval/fp_environment.h"
#include "interval/parallel.h"

namespace lipcert {

namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "lipcert: interval_matrix: %s\n", what);
  std::abort();
}

void CheckInner(Eigen::Index a_cols, Eigen::Index b_rows) {
  if (a_cols != b_rows) Die("Mul: inner dimensions differ");
}

// Entries whose midpoint is not finite or whose radius is NaN become (0, +inf), the
// entire real line; keeps NaN out of every enclosure.
void Sanitize(IntervalMatrix* c) {
  const Eigen::Index n = c->mid.size();
  double* m = c->mid.data();
  double* r = c->rad.data();
  for (Eigen::Index i = 0; i < n; ++i) {
    if (!std::isfinite(m[i]) || r[i] != r[i]) {
      m[i] = 0.0;
      r[i] = kInf;
    }
  }
}

// out = a * b in floating point, the columns of b split over threads when the product is
// large. Every column is still one ordinary dot-product GEMM, so the error bounds below
// (which hold for any summation order) are unchanged.
void Product(const Eigen::MatrixXd& a, const Eigen::MatrixXd& b, Eigen::MatrixXd* out) {
  out->resize(a.rows(), b.cols());
  const double work = double(a.rows()) * double(a.cols()) * double(b.cols());
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  const int workers = work < 3e7 ? 1 : int(std::min<Eigen::Index>(std::min(hw, 8), b.cols()));
  if (workers <= 1) {
    out->noalias() = a * b;
    return;
  }
  const Eigen::Index chunk = (b.cols() + workers - 1) / workers;
  // ParallelFor runs every part under the rounding model's environment.
  ParallelFor(workers, workers, [&](int w, int) {
    const Eigen::Index c0 = w * chunk, width = std::min(chunk, b.cols() - c0);
    if (width > 0) out->middleCols(c0, width).noalias() = a * b.middleCols(c0, width);
  });
}

// The radius term of docs/rounding-model.md, eq. (R):
//   rad >= (G1 + G2 + 2 k eta) / (1 - gamma_k) + k eta
// where G1 = fl(|Am| Q'), Q' >= gamma_k |Bm| + Br, and G2 = fl(Ar V), V >= |Bm| + Br.
// am: midpoint of A; ar: radius of A or nullptr (point); likewise bm, br.
IntervalMatrix MulCore(const Eigen::MatrixXd& am, const Eigen::MatrixXd* ar,
                       const Eigen::MatrixXd& bm, const Eigen::MatrixXd* br) {
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  CheckInner(am.cols(), bm.rows());
  const Eigen::Index k = am.cols();
  const double gamma = GammaUp(static_cast<double>(k));
  if (!(gamma < 1.0)) Die("Mul: inner dimension too large for gamma_k");
  const double keta = static_cast<double>(k) * kEta;  // exact for k < 2^52
  const double two_keta = 2.0 * keta;
  const double one_minus_gamma = SubDown(1.0, gamma);

  IntervalMatrix c;
  Product(am, bm, &c.mid);

  // Q' = up(gamma |Bm| + Br)
  Eigen::MatrixXd q(bm.rows(), bm.cols());
  {
    const Eigen::Index n = bm.size();
    const double* pb = bm.data();
    const double* pr = br ? br->data() : nullptr;
    double* pq = q.data();
    for (Eigen::Index i = 0; i < n; ++i) {
      const double t = MulUpLoose(gamma, std::fabs(pb[i]));
      pq[i] = pr ? AddUpLoose(t, pr[i]) : t;
    }
  }
  Eigen::MatrixXd g;
  Product(am.cwiseAbs(), q, &g);
  if (ar) {
    Eigen::MatrixXd v(bm.rows(), bm.cols());
    const Eigen::Index n = bm.size();
    const double* pb = bm.data();
    const double* pr = br ? br->data() : nullptr;
    double* pv = v.data();
    for (Eigen::Index i = 0; i < n; ++i) pv[i] = pr ? AddUpLoose(std::fabs(pb[i]), pr[i]) : std::fabs(pb[i]);
    Eigen::MatrixXd g2;
    Product(*ar, v, &g2);
    const Eigen::Index m = g.size();
    double* pg = g.data();
    const double* pg2 = g2.data();
    for (Eigen::Index i = 0; i < m; ++i) pg[i] = AddUpLoose(pg[i], pg2[i]);
  }
  c.rad.resize(g.rows(), g.cols());
  {
    const Eigen::Index m = g.size();
    const double* pg = g.data();
    double* pr = c.rad.data();
    // 1/(1 - gamma_k), rounded up once; then three loose upward steps per entry.
    const double inv = DivUp(1.0, one_minus_gamma);
    for (Eigen::Index i = 0; i < m; ++i)
      pr[i] = AddUpLoose(MulUpLoose(AddUpLoose(pg[i], two_keta), inv), keta);
  }
  Sanitize(&c);
  return c;
}

}  // namespace

IntervalMatrix::IntervalMatrix(Eigen::MatrixXd mid_, Eigen::MatrixXd rad_)
    : mid(std::move(mid_)), rad(std::move(rad_)) {
  if (mid.rows() != rad.rows() || mid.cols() != rad.cols()) Die("mid and rad shapes differ");
  const Eigen::Index n = rad.size();
  for (Eigen::Index i = 0; i < n; ++i)
    if (!(rad.data()[i] >= 0)) Die("negative or NaN radius");
}

IntervalMatrix IntervalMatrix::Point(const Eigen::MatrixXd& m) {
  return IntervalMatrix(m, Eigen::MatrixXd::Zero(m.rows(), m.cols()));
}

IntervalMatrix IntervalMatrix::FromBounds(const Eigen::MatrixXd& lo, const Eigen::MatrixXd& hi) {
  if (lo.rows() != hi.rows() || lo.cols() != hi.cols()) Die("FromBounds: shapes differ");
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  IntervalMatrix c;
  c.mid.resize(lo.rows(), lo.cols());
  c.rad.resize(lo.rows(), lo.cols());
  const Eigen::Index n = lo.size();
  for (Eigen::Index i = 0; i < n; ++i) {
    const double l = lo.data()[i], h = hi.data()[i];
    if (!(l <= h)) Die("FromBounds: lo > hi (or NaN)");
    double m = 0.5 * l + 0.5 * h;  // no overflow; any point of [l, h] will do
    if (!std::isfinite(m)) m = 0.0;
    if (m < l) m = l;
    if (m > h) m = h;
    c.mid.data()[i] = m;
    c.rad.data()[i] = std::max(SubUp(h, m), SubUp(m, l));
  }
  Sanitize(&c);
  return c;
}

IntervalMatrix IntervalMatrix::Ball(const Eigen::MatrixXd& m, double r) {
  if (!(r >= 0)) Die("Ball: negative or NaN radius");
  return IntervalMatrix(m, Eigen::MatrixXd::Constant(m.rows(), m.cols(), r));
}

Eigen::MatrixXd IntervalMatrix::Lower() const {
  return mid.binaryExpr(rad, [](double m, double r) { return SubDown(m, r); });
}
Eigen::MatrixXd IntervalMatrix::Upper() const {
  return mid.binaryExpr(rad, [](double m, double r) { return AddUp(m, r); });
}

Interval IntervalMatrix::operator()(Eigen::Index i, Eigen::Index j) const {
  return Interval::Unchecked(SubDown(mid(i, j), rad(i, j)), AddUp(mid(i, j), rad(i, j)));
}

bool IntervalMatrix::Contains(const Eigen::MatrixXd& x) const {
  if (x.rows() != rows() || x.cols() != cols()) return false;
  for (Eigen::Index j = 0; j < cols(); ++j)
    for (Eigen::Index i = 0; i < rows(); ++i)
      if (!(*this)(i, j).Contains(x(i, j))) return false;
  return true;
}

double IntervalMatrix::MaxRadius() const { return rad.size() ? rad.maxCoeff() : 0.0; }

IntervalMatrix Mul(const IntervalMatrix& a, const IntervalMatrix& b) {
  return MulCore(a.mid, &a.rad, b.mid, &b.rad);
}
IntervalMatrix Mul(const Eigen::MatrixXd& a, const IntervalMatrix& b) {
  return MulCore(a, nullptr, b.mid, &b.rad);
}
IntervalMatrix Mul(const IntervalMatrix& a, const Eigen::MatrixXd& b) {
  return MulCore(a.mid, &a.rad, b, nullptr);
}
IntervalMatrix Mul(const Eigen::MatrixXd& a, const Eigen::MatrixXd& b) {
  return MulCore(a, nullptr, b, nullptr);
}

IntervalMatrix GramEnclosure(const Eigen::MatrixXd& a) {
  return SymmetrizeEnclosure(MulCore(a.transpose(), nullptr, a, nullptr));
}
IntervalMatrix GramEnclosure(const IntervalMatrix& a) {
  const Eigen::MatrixXd mt = a.mid.transpose(), rt = a.rad.transpose();
  return SymmetrizeEnclosure(MulCore(mt, &rt, a.mid, &a.rad));
}

namespace {
IntervalMatrix AddSub(const IntervalMatrix& a, const IntervalMatrix& b, double sign) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) Die("operator+/-: shapes differ");
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  IntervalMatrix c;
  c.mid.resize(a.rows(), a.cols());
  c.rad.resize(a.rows(), a.cols());
  const Eigen::Index n = a.mid.size();
  for (Eigen::Index i = 0; i < n; ++i) {
    const double x = a.mid.data()[i], y = sign * b.mid.data()[i];
    const double s = x + y;
    // |x + y - s| <= max(AddUp(x,y) - s, s - AddDown(x,y)), computed upward.
    const double err = std::max(SubUp(AddUp(x, y), s), SubUp(s, AddDown(x, y)));
    c.mid.data()[i] = s;
    c.rad.data()[i] = AddUp(AddUp(a.rad.data()[i], b.rad.data()[i]), err);
  }
  Sanitize(&c);
  return c;
}
}  // namespace

IntervalMatrix operator+(const IntervalMatrix& a, const IntervalMatrix& b) { return AddSub(a, b, 1.0); }
IntervalMatrix operator-(const IntervalMatrix& a, const IntervalMatrix& b) { return AddSub(a, b, -1.0); }

IntervalMatrix Scale(const Interval& s, const IntervalMatrix& a) {
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  Eigen::MatrixXd lo(a.rows(), a.cols()), hi(a.rows(), a.cols());
  for (Eigen::Index j = 0; j < a.cols(); ++j)
    for (Eigen::Index i = 0; i < a.rows(); ++i) {
      const Interval e = s * a(i, j);
      lo(i, j) = e.lo;
      hi(i, j) = e.hi;
    }
  return IntervalMatrix::FromBounds(lo, hi);
}

Interval Dot(const IntervalMatrix& x, const IntervalMatrix& y) {
  if (x.cols() != 1 || y.cols() != 1 || x.rows() != y.rows()) Die("Dot: needs two n x 1 vectors");
  const IntervalMatrix c = Mul(x.transpose(), y);
  return c(0, 0);
}

IntervalMatrix SymmetrizeEnclosure(const IntervalMatrix& b) {
  if (b.rows() != b.cols()) Die("SymmetrizeEnclosure: not square");
  const ScopedSoundFpEnvironment fp_guard;  // docs/rounding-model.md, run-time environment
  IntervalMatrix c = b;
  const Eigen::Index n = b.rows();
  for (Eigen::Index j = 0; j < n; ++j)
    for (Eigen::Index i = j + 1; i < n; ++i) {
      const double mij = b.mid(i, j), mji = b.mid(j, i);
      if (mij == mji && b.rad(i, j) == b.rad(j, i)) continue;
      // X_ij = X_ji lies in both enclosures; centre at c = (mij + mji)/2 (rounded) and
      // take the smaller radius that still covers one of them.
      double m = 0.5 * mij + 0.5 * mji;
      if (!std::isfinite(m)) m = 0.0;
      const double r1 = AddUp(b.rad(i, j), std::max(SubUp(m, mij), SubUp(mij, m)));
      const double r2 = AddUp(b.rad(j, i), std::max(SubUp(m, mji), SubUp(mji, m)));
      const double r = std::min(r1, r2);
      c.mid(i, j) = c.mid(j, i) = m;
      c.rad(i, j) = c.rad(j, i) = r;
    }
  return c;
}

}  // namespace lipcert
