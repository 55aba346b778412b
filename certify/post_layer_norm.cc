#include "certify/post_layer_norm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "certify/post_ln_y_cover.h"
#include "certify/layer_norm_cover.h"
#include "certify/engine_bound.h"
#include "certify/centre_norm.h"
#include "certify/dense_jacobian.h"
#include "certify/post_ln_variation.h"
#include "certify/probable_norm.h"
#include "certify/search.h"
#include "certify/stages.h"
#include "certify/time_model.h"
#include "certify/witness_eval.h"
#include "interval/norms.h"
#include "models/forward.h"

namespace lipcert {

namespace {

bool SameBits(const Eigen::MatrixXd& a, const Eigen::MatrixXd& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         (a.size() == 0 || std::memcmp(a.data(), b.data(), sizeof(double) * size_t(a.size())) == 0);
}
bool SameBits(const Eigen::VectorXd& a, const Eigen::VectorXd& b) {
  return a.size() == b.size() && (a.size() == 0 || std::memcmp(a.data(), b.data(), sizeof(double) * size_t(a.size())) == 0);
}
bool SameLayerNorm(const std::optional<LayerNormParams>& a, const std::optional<LayerNormParams>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || (SameBits(a->gamma, b->gamma) && SameBits(a->beta, b->beta) &&
                std::memcmp(&a->eps, &b->eps, sizeof(double)) == 0);
}
// Whether MHA's forward is the same map in both (every field it reads, bit for bit).
bool SameForward(const AttentionLayer& a, const AttentionLayer& b) {
  return a.kind == b.kind && a.d_model == b.d_model && a.heads == b.heads && a.head_dim_qk == b.head_dim_qk &&
         a.head_dim_v == b.head_dim_v && a.causal == b.causal && SameBits(a.wq, b.wq) && SameBits(a.wk, b.wk) &&
         SameBits(a.wv, b.wv) && SameBits(a.wo, b.wo) && SameBits(a.bq, b.bq) && SameBits(a.bk, b.bk) &&
         SameBits(a.bv, b.bv) && SameBits(a.bo, b.bo) && SameLayerNorm(a.layer_norm, b.layer_norm);
}

// The last enclosures of Y0: one post-LN run asks for the same one from the composition, the
// covers of Y and the centres about ten times, each an interval forward pass (0.8 s at MiniLM
// N = 16). Kept by the full inputs, compared bit for bit.
struct YMemo {
  AttentionLayer mha;
  Eigen::MatrixXd x0;
  ExpBackend backend;
  YEnclosure y;
};
std::mutex y_memo_mutex;
std::deque<YMemo> y_memo;
constexpr size_t kYMemoSize = 2;

YEnclosure EncloseYUncached(const AttentionLayer& mha, const Eigen::MatrixXd& x0, ExpBackend exp_backend);

}  // namespace

YEnclosure EncloseY(const AttentionLayer& L, const Eigen::MatrixXd& x0, ExpBackend exp_backend) {
  AttentionLayer mha = L.post_ln() ? L.WithoutPostLayerNorm() : L;
  mha.tensor_names.clear();
  {
    const std::lock_guard<std::mutex> lock(y_memo_mutex);
    for (const YMemo& m : y_memo)
      if (m.backend == exp_backend && SameBits(m.x0, x0) && SameForward(m.mha, mha)) return m.y;
  }
  YEnclosure y = EncloseYUncached(mha, x0, exp_backend);
  const std::lock_guard<std::mutex> lock(y_memo_mutex);
  y_memo.push_front({std::move(mha), x0, exp_backend, y});
  if (y_memo.size() > kYMemoSize) y_memo.pop_back();
  return y;
}

namespace {

YEnclosure EncloseYUncached(const AttentionLayer& mha, const Eigen::MatrixXd& x0, ExpBackend exp_backend) {
  const Eigen::Index n = x0.rows(), d = x0.cols();
  Eigen::MatrixXd lo, hi;
  EncloseForward(mha, x0, exp_backend, &lo, &hi);
  YEnclosure y;
  y.centre.resize(n, d);
  y.err.resize(n);
  y.finite = true;
  double all2 = 0;
  for (Eigen::Index i = 0; i < n; ++i) {
    double err2 = 0;
    bool row_finite = true;
    for (Eigen::Index a = 0; a < d; ++a) {
      const double x = x0(i, a);
      const double ylo = AddDown(x, lo(i, a)), yhi = AddUp(x, hi(i, a));
      const double mid = 0.5 * ylo + 0.5 * yhi;  // exact unless it underflows: then still inside [ylo, yhi]
      if (!std::isfinite(mid)) {
        row_finite = false;
        break;
      }
      y.centre(i, a) = mid;
      const double e = std::max(SubUp(yhi, mid), SubUp(mid, ylo));
      err2 = AddUp(err2, MulUp(e, e));
    }
    if (!row_finite) {
      y.finite = false;
      y.centre.row(i).setConstant(kInf);
      y.err(i) = kInf;
      all2 = kInf;
      continue;
    }
    y.err(i) = SqrtUp(err2);
    all2 = AddUp(all2, err2);
  }
  y.err_frobenius = SqrtUp(all2);
  return y;
}

}  // namespace

PostLayerNormBound ComposePostLayerNorm(const AttentionLayer& L, const TokenCover& cover, UpperBound mha_l2,
                                        UpperBound mha_p, NormKind p, ExpBackend exp_backend) {
  if (!L.post_ln()) throw std::invalid_argument("post_ln: the layer has no post-LN LayerNorm");
  PostLayerNormBound out;
  if (!std::isfinite(mha_l2.value()) || !std::isfinite(mha_p.value())) return out;
  const Eigen::Index n = cover.center.rows();
  // Y0 = X0 + MHA(X0), enclosed; the cover's centre is the midpoint, the half-width folded in.
  if (!EncloseY(L, cover.center, exp_backend).finite) return out;
  // ||MHA_i(X) - MHA_i(X0)|| <= ||MHA(X) - MHA(X0)||_F <= U2 ||X - X0||_F (PostLnYCover also takes
  // the attention's own displacement bound, token by token).
  const double moved = MulUp(mha_l2.value(), JointRadiusUp(cover).value());
  out.y_cover = PostLnYCover(L, cover, Eigen::VectorXd::Constant(n, moved), exp_backend, UpperBound(moved));
  const TokenCover& yc = out.y_cover;
  // sup ||J_LN(y_i)||_p per token over its ball.
  const MhaInput in = PostLnFactorsOver(L, yc, p);
  out.ln_upper = UpperBound(in.ell.maxCoeff());  // J_LN(Y) is block-diagonal: its norm is the largest block's
  out.upper = UpperBound(MulUp(out.ln_upper.value(), AddUp(1.0, mha_p.value())));
  return out;
}

// The post-LN centre's cap on dense_limit, for memory: two (ND)^2 interval enclosures
// (4 (ND)^2 doubles) at N*D = 8192 are 2 GiB.
constexpr int kPostLnDenseLimit = 8192;
// The inf centre holds one (ND)^2 enclosure (2 GiB at N*D = 12288) and token-row products.
constexpr long kPostLnInfDenseLimit = 12288;
namespace {
// Whether post_ln_centre encloses J_f densely at this N*D (else: deflated super-blocks).
bool PostLnDense(long nd, long dense_limit) { return nd <= std::min<long>(kPostLnDenseLimit, dense_limit); }
}  // namespace

namespace {

// Above the dense size: J_LN(Yc) (I + J_MHA(X0)) by deflated super-blocks (docs/engines.md,
// "Deflation"), with as many Lanczos vectors of J_f itself as fit before the deadline; the
// enclosure of Y0 adds max_j ||J_LN(y_j) - J_LN(yc_j)|| (1 + ||J_MHA||_F) as in the dense route.
EngineBound PostLnDeflatedCentreBound(const AttentionLayer& L, const Eigen::MatrixXd& x0, const TokenCover& cover,
                                      const BoundOptions& opts) {
  constexpr const char* kName = "post_ln_centre";
  const AttentionLayer mha = L.WithoutPostLayerNorm();
  const int n = int(x0.rows()), d = int(x0.cols());
  CentreNormOptions co;
  co.mha_only = true;
  co.threads = opts.threads;
  co.deadline = opts.deadline;
  co.stop = opts.stop;
  co.dense_limit = 0;
  co.deflation_vectors = opts.deflation_vectors;
  // J_LN into every block (certify/time_model.h); under a work budget the vectors asked for.
  const int k = opts.by_work ? std::min<int>(opts.deflation_vectors, n * d)
                             : DeflationVectorsThatFit(mha, n, co, PostLnComposeSeconds(n, d));
  if (k == 0) {
    EngineBound out = TimedOutBound(kName);
    out.note = opts.deflation_vectors > 0 ? "deflated super-blocks: fewer than 32 vectors fit before the deadline (not started)"
                                          : "above the dense size and deflation is off";
    return out;
  }
  const PostLayerNormBound y = ComposePostLayerNorm(L, cover, UpperBound(0), UpperBound(0), NormKind::kL2);
  if (!std::isfinite(y.upper.value())) return TimedOutBound(kName);
  const MhaInput lin = PostLnFactorsOver(L, y.y_cover, NormKind::kL2);
  // Half of the window for the basis, and all the columns it gets: the block pass's
  // certificates are anytime, and the alternative, the composition, is far looser. (Its
  // products go through the model's own JVP and VJP, slower than the evaluator's, which the
  // attention route's idle-time cap and load check would misread.)
  const DeflationBasis basis = DeflationBasisOf(L, x0, k, opts.threads, BasisDeadline(opts.deadline, kInf), nullptr, opts.stop);
  CentreNormReport rep;
  UpperBound jm_frobenius(kInf);
  const UpperBound centre = DeflatedPostLnCentreNormUpperBound(mha, x0, lin.ln_jac, basis.v, basis.y, co, &rep, &jm_frobenius);
  if (rep.timed_out || !std::isfinite(centre.value()) || DeadlinePassed(opts)) return TimedOutBound(kName);
  const double moved = MulUp(lin.delta_ln.maxCoeff(), AddUp(1.0, jm_frobenius.value()));
  EngineBound out;
  out.upper = UpperBound(AddUp(centre.value(), moved));
  out.terms.push_back({"||J_LN(Yc) (I + J_MHA(X0))||, " + std::to_string(rep.groups) + " x " + std::to_string(rep.groups) +
                           " token super-blocks deflated by " + std::to_string(rep.deflation_vectors) +
                           " Lanczos vectors of J_f",
                       centre});
  out.terms.push_back({"enclosure of Y0: max_j ||J_LN(y_j) - J_LN(yc_j)|| (1 + ||J_MHA||_F)", UpperBound(moved)});
  return out;
}

}  // namespace

EngineBound PostLnCentreBound(const AttentionLayer& L, const Eigen::MatrixXd& x0, const BoundOptions& opts) {
  constexpr const char* kName = "post_ln_centre";
  if (!L.post_ln()) throw std::invalid_argument("post_ln: the layer has no post-LN LayerNorm");
  const AttentionLayer mha = L.WithoutPostLayerNorm();
  if (mha.layer_norm) throw std::invalid_argument("post_ln_centre: a layer with both LayerNorms");
  const int n = int(x0.rows()), d = int(x0.cols());
  InputSet point;
  point.kind = SetKind::kBall;
  point.center = x0;
  point.radius = 0;
  const TokenCover cover = CoverOf(point);
  if (!PostLnDense(long(n) * d, opts.dense_limit)) return PostLnDeflatedCentreBound(L, x0, cover, opts);
  // J_MHA(X0), enclosed densely (the centre_norm engine's assembly, GEMMs for dot attention),
  // held transposed: the norm of (blockdiag(L_j) (I + J_MHA))^T = (I + J_MHA)^T blockdiag(L_j^T)
  // is the same, and so is the crude bound sqrt(||.||_1 ||.||_inf) of J_MHA.
  CentreNormOptions co;
  co.mha_only = true;
  co.threads = opts.threads;
  co.deadline = opts.deadline;
  co.stop = opts.stop;
  co.dense_limit = long(n) * d;
  if (opts.deadline != std::chrono::steady_clock::time_point::max()) {
    const double left = std::chrono::duration<double>(opts.deadline - std::chrono::steady_clock::now()).count();
    const double predicted = CentreNormSecondsEstimate(mha, n, co);
    if (predicted > left) {
      EngineBound out = TimedOutBound(kName);
      out.note = "predicted " + std::to_string(predicted) + " s, above the " + std::to_string(left) + " s left (not started)";
      return out;
    }
  }
  IntervalMatrix at = CentreJacobianEnclosure(mha, x0, co).transpose();
  if (DeadlinePassed(opts)) return TimedOutBound(kName);
  const double jm_crude = NormL2UpperCrude(at).value();
  for (Eigen::Index i = 0; i < at.rows(); ++i) {  // + I, the rounding of mid + 1 into the radius
    const Interval e = Interval(at.mid(i, i)) + Interval(1.0);
    const double mid = 0.5 * e.lo + 0.5 * e.hi;
    at.rad(i, i) = AddUp(at.rad(i, i), std::max(SubUp(e.hi, mid), SubUp(mid, e.lo)));
    at.mid(i, i) = mid;
  }
  // Y0 = X0 + MHA(X0) within balls around exact centres yc_j; J_LN at yc_j enclosed, and
  // sup ||J_LN(y) - J_LN(yc_j)|| over each ball (delta_ln).
  const PostLayerNormBound y = ComposePostLayerNorm(L, cover, UpperBound(0), UpperBound(0), NormKind::kL2);
  if (!std::isfinite(y.upper.value())) return TimedOutBound(kName);
  const MhaInput lin = PostLnFactorsOver(L, y.y_cover, NormKind::kL2);
  std::vector<IntervalMatrix> ln_t;
  for (const IntervalMatrix& m : lin.ln_jac) ln_t.push_back(m.transpose());
  bool timed_out = false;
  IntervalMatrix jf_t = ComposeWithLayerNorm(at, ln_t, opts.threads, n, d, false, opts.deadline, &timed_out);
  at = IntervalMatrix();  // memory: two (ND)^2 enclosures at most at once
  if (timed_out || DeadlinePassed(opts)) return TimedOutBound(kName);
  const double centre =
      NormL2UpperGram(jf_t, opts.threads, nullptr, opts.deadline, nullptr, nullptr, GramPrecision::kDouble, opts.stop)
          .value();
  if (!std::isfinite(centre)) return TimedOutBound(kName);
  const double moved = MulUp(lin.delta_ln.maxCoeff(), AddUp(1.0, jm_crude));
  EngineBound out;
  out.upper = UpperBound(AddUp(centre, moved));
  out.terms.push_back({"||J_LN(Yc) (I + J_MHA(X0))||, dense", UpperBound(centre)});
  out.terms.push_back({"enclosure of Y0: max_j ||J_LN(y_j) - J_LN(yc_j)|| (1 + ||J_MHA||)", UpperBound(moved)});
  return out;
}

namespace {

// A few power iterations of J_f^T J_f at x from v (norm 2): a direction to re-evaluate.
Eigen::MatrixXd PowerDirection(const AttentionLayer& L, const Eigen::MatrixXd& x, Eigen::MatrixXd v, int steps,
                               Clock::time_point until, const std::atomic<bool>* stop) {
  const LayerState<double> s = Evaluate<double>(L, x);
  for (int k = 0; k < steps && Clock::now() < until && !StopRequested(stop); ++k) {
    const Eigen::MatrixXd w = Vjp<double>(L, s, Jvp<double>(L, s, v));
    const double nw = w.norm();
    if (!(nw > 0) || !std::isfinite(nw)) break;
    v = w / nw;
  }
  return v;
}

// The l_inf direction of the largest row sum of |J_f(x)| among the rows of the token with
// the largest output change along v (rows r of J_f: J_f^T e_r by one VJP each).
Eigen::MatrixXd InfDirection(const AttentionLayer& L, const Eigen::MatrixXd& x, const Eigen::MatrixXd& v) {
  const LayerState<double> s = Evaluate<double>(L, x);
  const Eigen::MatrixXd jv = Jvp<double>(L, s, v);
  Eigen::Index ti = 0, ta = 0;
  jv.cwiseAbs().maxCoeff(&ti, &ta);
  Eigen::MatrixXd best = v;
  double best_sum = -1;
  for (Eigen::Index a = 0; a < x.cols(); ++a) {
    Eigen::MatrixXd e = Eigen::MatrixXd::Zero(x.rows(), x.cols());
    e(ti, a) = 1;
    const Eigen::MatrixXd row = Vjp<double>(L, s, e);
    const double sum = row.cwiseAbs().sum();
    if (sum > best_sum) {
      best_sum = sum;
      best = row.unaryExpr([](double t) { return t >= 0 ? 1.0 : -1.0; });
    }
  }
  return best;
}

// The top right singular vector of J_f(x) by Lanczos on J_f^T J_f (full reorthogonalisation,
// at most `steps` JVP/VJP pairs, from v): converges far faster than power steps where the
// top singular values cluster (sigma_2 / sigma_1 about 0.97 on MiniLM).
Eigen::MatrixXd LanczosDirection(const AttentionLayer& L, const Eigen::MatrixXd& x, const Eigen::MatrixXd& v, int steps,
                                 Clock::time_point until, const std::atomic<bool>* stop) {
  const LayerState<double> s = Evaluate<double>(L, x);
  const Eigen::Index n = v.size();
  steps = int(std::min<Eigen::Index>(steps, n));
  Eigen::MatrixXd q(n, steps);
  std::vector<double> alpha, beta;
  Eigen::VectorXd w = Eigen::Map<const Eigen::VectorXd>(v.data(), n);
  if (!(w.norm() > 0)) return v;
  w /= w.norm();
  int k = 0;
  for (; k < steps && Clock::now() < until && !StopRequested(stop); ++k) {
    q.col(k) = w;
    const Eigen::MatrixXd wm = Eigen::Map<const Eigen::MatrixXd>(w.data(), v.rows(), v.cols());
    const Eigen::MatrixXd aw = Vjp<double>(L, s, Jvp<double>(L, s, wm));
    Eigen::VectorXd r = Eigen::Map<const Eigen::VectorXd>(aw.data(), n);
    alpha.push_back(w.dot(r));
    for (int pass = 0; pass < 2; ++pass) r -= q.leftCols(k + 1) * (q.leftCols(k + 1).transpose() * r);
    const double b = r.norm();
    if (!(b > 1e-12 * std::fabs(alpha.back())) || !std::isfinite(b)) {
      ++k;
      break;
    }
    beta.push_back(b);
    w = r / b;
  }
  if (k == 0) return v;
  Eigen::MatrixXd t = Eigen::MatrixXd::Zero(k, k);
  for (int i = 0; i < k; ++i) {
    t(i, i) = alpha[size_t(i)];
    if (i + 1 < k) t(i, i + 1) = t(i + 1, i) = beta[size_t(i)];
  }
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(t);
  const Eigen::VectorXd top = q.leftCols(k) * es.eigenvectors().col(k - 1);
  return Eigen::Map<const Eigen::MatrixXd>(top.data(), v.rows(), v.cols());
}

// The signs of row r (flattening i*D + a) of J_f(x): the l_inf direction that attains the row's
// absolute sum (one VJP).
Eigen::MatrixXd RowSigns(const AttentionLayer& L, const Eigen::MatrixXd& x, int r) {
  const LayerState<double> s = Evaluate<double>(L, x);
  Eigen::MatrixXd e = Eigen::MatrixXd::Zero(x.rows(), x.cols());
  e(r / x.cols(), r % x.cols()) = 1;
  return Vjp<double>(L, s, e).unaryExpr([](double t) { return t >= 0 ? 1.0 : -1.0; });
}

}  // namespace

// ---- The post-LN stages of Certify (certify/stages.h). ----

namespace {

// post_ln_centre runs: norm 2, no pre-LN as well, and dense or (with deflation on) deflated.
bool DenseCentre(const CertifyRun& run) {
  const CertifyOptions& o = run.opts;
  const bool deflated = !PostLnDense(long(run.set.center.size()), o.engines.dense_limit);
  return o.norm == NormKind::kL2 && !run.layer.layer_norm && (!deflated || o.engines.deflation_vectors > 0);
}
bool Deflated(const CertifyRun& run) { return !PostLnDense(long(run.set.center.size()), run.opts.engines.dense_limit); }
// The seconds from now to `fraction` of the time limit.
double Until(const CertifyRun& run, double fraction) { return fraction * run.opts.time_limit_s - run.clock.Elapsed(); }

// The certificate's engines: the composition, then post_ln_centre where it runs (or, in a
// certificate in progress, where it has a bound).
void SetEngines(CertifyRun& run, const EngineResult& composition, bool final_list) {
  Certificate& c = run.cert;
  c.engines = {composition};
  c.upper_bound = composition.upper;
  EngineResult centre = run.post_ln.centre;
  if (!final_list && !centre.applied) return;
  if (!DenseCentre(run)) return;
  if (centre.note.empty() && !centre.applied) centre.note = "did not run";
  c.engines.push_back(centre);
  if (centre.upper.value() < c.upper_bound.value()) c.upper_bound = centre.upper;
}

// The composed bound from MHA's bounds so far (norm 2 for the cover of Y, norm p for the
// factor), into the certificate in progress when it improves it.
// Returns the composition's seconds.
double ComposeSoFar(CertifyRun& run, UpperBound mha_l2, UpperBound mha_p) {
  const auto [b, seconds] = Timed([&] { return ComposePostLayerNorm(run.layer, run.cover, mha_l2, mha_p, run.opts.norm); });
  if (!(b.upper.value() < run.cert.upper_bound.value())) return seconds;
  SetEngines(run, {EngineId::kPostLnComposition, b.upper, seconds, "in progress: MHA's certificate so far", true, {}, {}},
             false);
  run.Improved("post_ln_composition");
  return seconds;
}

}  // namespace

// In norm 2, J_f(X0) itself is certified densely up to the dense size, by deflated
// super-blocks above it (PostLnCentreBound). At a point it runs first (until 70% of the
// limit; 85% for the deflated route, whose vectors are what the time buys); over a set
// after MHA's certificate (whose centre_norm variation it needs), until 70%.
bool PostLnCentreAtPointApplies(const CertifyRun& run) { return DenseCentre(run) && run.set.radius == 0; }
double PostLnCentreAtPointSeconds(const CertifyRun& run) { return Until(run, Deflated(run) ? 0.85 : 0.7); }
bool PostLnCentreOverSetApplies(const CertifyRun& run) { return DenseCentre(run) && run.set.radius != 0; }
// The dense centre until 75% of the limit, the deflated one until 62%: the variation after
// it needs the centre and time for its own variations of MHA (the heads' and two row-weighted
// passes), which the search's half share (to 85%) and whatever the centre leaves give it.
// MiniLM N = 16 at 40 s after MHA's 25%: the dense centre takes 9.5-13 s on a 2-core Xeon and
// 14.8-18.7 s on a 2-core EPYC, whose GEMMs are slower; at 62% it did not finish there, and
// the variation (10 s) then bounded layer 0 by 37.6 where the certified centre gives 21.2.
double PostLnCentreOverSetSeconds(const CertifyRun& run) { return Until(run, Deflated(run) ? 0.62 : 0.75); }

void RunPostLnCentre(CertifyRun& run, double seconds) {
  BoundOptions bo = BoundOptionsOf(run.opts, After(Clock::now(), seconds));
  bo.norm = NormKind::kL2;
  const auto [e, s] = Timed([&] { return PostLnCentreBound(run.layer, run.set.center, bo); });
  EngineResult& centre = run.post_ln.centre;
  centre = {EngineId::kPostLnCentre, e.upper, s, "", !e.timed_out, e.terms, {}};
  if (e.timed_out) centre.note = e.note.empty() ? "did not finish before its deadline" : e.note;
  if (centre.applied && !e.terms.empty()) run.post_ln.centre_at_x0 = e.terms.front().value;
  if (run.set.radius == 0 && centre.applied && centre.upper.value() < run.cert.upper_bound.value()) {
    run.cert.engines = {centre};
    run.cert.upper_bound = centre.upper;
    run.Improved("post_ln_centre");
  }
}

// MHA's certificates (the time of both): 80% of the limit in norm 2 (it sizes the cover of
// Y; over a set 30%, which leaves post_ln_centre and post_ln_variation the time for the
// centre and their own variations of MHA: at N = 32 on MiniLM, 60 s, 80% left the variation
// 13 s and none of its weighted passes finished),
// split with the norm asked for when that is inf (two thirds to norm 2); 30% for the two
// where the sublayer's own inf centre (post_ln_variation) runs after them. At a point where post_ln_centre ran first,
// 40% of the limit or half of what is left, whichever is less (10% once J_f(X0) is
// certified: the composed bound can only be looser). Over a set, 25% before the dense
// post_ln_centre and 30% before the deflated one, which rarely starts within a minute: there
// MHA's own centre bounds the variation's centre from the LayerNorm's rows and gets the time
// (MiniLM layer 0, N = 32, 120 s: 25.6 at 30%, 43.4 at 25%). The composition stays a usable
// fallback when the centre does not finish; post_ln_variation, which needs MHA's variation
// only, computes it where the certificate has none.
double MhaSeconds(const CertifyRun& run) {
  const double limit = run.opts.time_limit_s;
  if (run.opts.norm != NormKind::kL2 && !run.layer.layer_norm && long(run.set.center.size()) <= kPostLnInfDenseLimit)
    return 2 * 0.15 * limit;
  if (!DenseCentre(run)) return run.set.radius != 0 && !run.layer.layer_norm ? 0.3 * limit : 0.8 * limit;
  if (run.set.radius != 0) return (Deflated(run) ? 0.3 : 0.25) * limit;
  const bool centred = run.post_ln.centre.applied && run.post_ln.centre.id == EngineId::kPostLnCentre;
  return std::max(0.05, std::min((centred ? 0.1 : 0.4) * limit, 0.5 * (limit - run.clock.Elapsed())));
}

// MHA alone through the stages of a layer without post-LN, its improvements composed into
// the sublayer's certificate in progress (anytime, like the rest). The composition runs
// inside MHA's time (the cover of Y with the attention's displacement: about 2 s at MiniLM
// N = 16), so after the first one only while it costs under 2% of MHA's window.
void RunMhaCertificates(CertifyRun& run, double seconds) {
  const AttentionLayer mha = run.layer.WithoutPostLayerNorm();
  const bool two = run.opts.norm != NormKind::kL2;
  CertifyOptions mo = run.opts;
  mo.progress = false;  // its figures are MHA's, not f's
  mo.norm = NormKind::kL2;
  // With two norms, norm 2 takes two thirds: it sizes the cover of Y, and its second-order
  // variation refines with time, where the inf certificate's first-order routes do not.
  mo.time_limit_s = run.by_work() ? run.opts.time_limit_s : seconds * (two ? 2.0 / 3 : 1.0);
  double compose_s = -1;  // the last composition's seconds (-1: none yet)
  mo.on_improvement = [&](const Certificate& m) {
    if (compose_s > 0.02 * mo.time_limit_s && !run.by_work()) return;
    if (!two) compose_s = ComposeSoFar(run, m.upper_bound, m.upper_bound);
    else if (run.post_ln.mha_l2) compose_s = ComposeSoFar(run, run.post_ln.mha_l2->upper_bound, m.upper_bound);
  };
  run.post_ln.mha_l2 = Certify(mha, run.set, mo, run.provenance);
  if (two) {
    mo.norm = run.opts.norm;
    if (!run.by_work()) mo.time_limit_s = seconds / 3;
    run.post_ln.mha_p = Certify(mha, run.set, mo, run.provenance);
  }
  const Certificate& cp = two ? *run.post_ln.mha_p : *run.post_ln.mha_l2;
  ComposeSoFar(run, run.post_ln.mha_l2->upper_bound, cp.upper_bound);
}

namespace {

// Over the set, with yc the centre of the cover of Y (the same as the centre route's: both
// enclose X0 + MHA(X0) alike) and J_LN(Y) = J_LN(yc) + Delta, ||Delta|| <= delta_ln:
//   J_f(X) = J_LN(yc)(I + J_M(X0)) + J_LN(yc)(J_M(X) - J_M(X0)) + Delta (I + J_M(X)),
//   sup_S ||J_f|| <= ||J_LN(yc)(I + J_M(X0))|| + ln_upper V_M + delta_ln (1 + U_M),
// V_M the centre_norm engine's certified variation of MHA, U_M MHA's certified bound.
void AddVariationToCentre(const CertifyRun& run, const PostLayerNormBound& b, EngineResult* centre) {
  const AttentionLayer& L = run.layer;
  const Certificate& c2 = *run.post_ln.mha_l2;
  const EngineResult* cn = nullptr;
  for (const EngineResult& e : c2.engines)
    if (e.id == EngineId::kCentreNorm && e.applied && e.centre_norm && std::isfinite(e.upper.value())) cn = &e;
  const auto same_centre = [&] {  // the cover of Y at radius 0 has b's centre
    return ComposePostLayerNorm(L, CoverOf(InputSet{run.set.kind, run.set.center, 0.0}), UpperBound(0), UpperBound(0),
                                NormKind::kL2).y_cover.center == b.y_cover.center;
  };
  if (!cn || !std::isfinite(b.upper.value()) || !same_centre()) {
    centre->applied = false;
    centre->upper = UpperBound(kInf);
    centre->note = !cn ? "MHA's certificate has no centre_norm variation to add to the centre" : "no cover of Y";
    return;
  }
  const double variation = cn->centre_norm->variation.value();
  const double delta_ln = PostLnFactorsOver(L, b.y_cover, NormKind::kL2).delta_ln.maxCoeff();
  const UpperBound at_centre = centre->terms.at(0).value;
  const UpperBound through_mha(MulUp(b.ln_upper.value(), variation));
  const UpperBound through_ln(MulUp(delta_ln, AddUp(1.0, c2.upper_bound.value())));
  centre->terms = {{centre->terms.at(0).name, at_centre},
                   {"ln_upper x MHA variation (centre_norm)", through_mha},
                   {"sup ||J_LN(Y) - J_LN(Yc)|| x (1 + mha_upper)", through_ln}};
  centre->upper = UpperBound(AddUp(AddUp(at_centre.value(), through_mha.value()), through_ln.value()));
}

// The engine of MHA's certificate whose bound is the certificate's ("" when none).
std::string WinnerName(const Certificate& m) {
  for (const EngineResult& e : m.engines)
    if (e.applied && e.upper.value() == m.upper_bound.value()) return e.name();
  return "";
}

}  // namespace

// sup ||J_LN|| (1 + MHA's bound) over the cover of Y, and over a set post_ln_centre with
// MHA's variation added; the certificate's bound is the smaller.
void RunPostLnComposition(CertifyRun& run, double) {
  const Certificate& c2 = *run.post_ln.mha_l2;
  const Certificate& cp = run.post_ln.mha_p ? *run.post_ln.mha_p : c2;
  const auto [b, compose_s] =
      Timed([&] { return ComposePostLayerNorm(run.layer, run.cover, c2.upper_bound, cp.upper_bound, run.opts.norm); });
  if (DenseCentre(run) && run.set.radius != 0 && run.post_ln.centre.applied)
    AddVariationToCentre(run, b, &run.post_ln.centre);
  std::string note = "ln_upper " + std::to_string(b.ln_upper.value()) + " * (1 + mha_upper " +
                     std::to_string(cp.upper_bound.value()) + " [" + WinnerName(cp) + "])";
  if (run.opts.norm != NormKind::kL2) note += "; cover from mha_upper(l2) " + std::to_string(c2.upper_bound.value());
  SetEngines(run, {EngineId::kPostLnComposition, b.upper, compose_s, note, true, {}, {}}, true);
  run.post_ln.y_centre = b.y_cover.center;
  run.cert.pieces_explored = cp.pieces_explored;  // MHA's branch and bound
  run.cert.open_pieces = cp.open_pieces;
  run.Improved("post_ln_composition");
}

// The sublayer's own centre norm plus its variation over a per-token cover of Y
// (certify/post_ln_variation.h; in the inf norm its centre is certified here, densely),
// until 90% of the limit. In the inf norm it gives the centre's largest row for the witness.
bool PostLnVariationApplies(const CertifyRun& run) { return !run.layer.layer_norm; }
// The variation refines until half of the search's share is left: the witness stage and the
// search, which follows the sublayer's own Jacobian, get the rest (with 0.9, at load 10 on
// 2 cores, the search never ran and the witness stayed below PyTorch's ascent).
double PostLnVariationSeconds(const CertifyRun& run) { return Until(run, 1 - 0.5 * run.opts.search.share); }
void RunPostLnVariation(CertifyRun& run, double seconds) {
  const Certificate& c2 = *run.post_ln.mha_l2;
  const Certificate& cp = run.post_ln.mha_p ? *run.post_ln.mha_p : c2;
  const Clock::time_point deadline = run.by_work() ? kNoDeadline : After(Clock::now(), seconds);
  const EngineResult v =
      PostLnVariationCandidate(run.layer, run.set, run.opts.norm, c2, cp, run.post_ln.centre_at_x0, run.post_ln.y_centre,
                               run.opts.threads, deadline, kPostLnInfDenseLimit, &run.centre_inf_row);
  run.cert.engines.push_back(v);
  if (v.applied && v.upper.value() < run.cert.upper_bound.value()) {
    run.cert.upper_bound = v.upper;
    run.Improved("post_ln_variation");
  }
}

// Beside the certificate: at a point (radius 0), ||J_f(X0)||_2 by randomized Lanczos on f
// itself. Over a set there is no certified variation of J_f to add it to, so none.
bool PostLnProbabilisticApplies(const CertifyRun& run) {
  return run.opts.probabilistic.enabled && run.opts.norm == NormKind::kL2 && run.set.radius == 0;
}
double PostLnProbabilisticSeconds(const CertifyRun& run) {
  return std::max(0.05, run.opts.probabilistic.share * run.opts.time_limit_s);
}
void RunPostLnProbabilistic(CertifyRun& run, double seconds) {
  const ProbableNormOptions po = ProbableNormOptionsOf(run.opts, seconds);
  ProbabilisticBound p;
  p.centre = ProbableJacobianNormUpper(run.layer, run.set.center, po);
  p.failure_probability = po.failure_probability;
  p.value = p.centre.value;
  p.route = "the centre: randomized Lanczos on LN(X + MHA(X))";
  run.cert.probabilistic = p;
}

// The witness on f: the centre and MHA's witnesses, each with MHA's direction and with a
// few power iterations of J_f^T J_f from it (norm 2; in the inf norm the largest row's
// signs), every candidate re-evaluated rigorously at a point certainly in the set.
void RunPostLnWitness(CertifyRun& run, double seconds) {
  const AttentionLayer& L = run.layer;
  const InputSet& set = run.set;
  const NormKind norm = run.opts.norm;
  Certificate& c = run.cert;
  const auto consider = [&](const Eigen::MatrixXd& x, const Eigen::MatrixXd& v, const std::string& origin) {
    if (!x.allFinite() || !v.allFinite() || v.cwiseAbs().maxCoeff() == 0 || !CertainlyInSet(set, x)) return;
    const LowerBound lb = WitnessLowerBound(L, x, v, norm);
    if (lb.value() > c.lower_bound.value()) {
      c.lower_bound = lb;
      c.witness = Witness{x, v, lb.value(), lb, origin};
    }
  };
  const Certificate& c2 = *run.post_ln.mha_l2;
  const Certificate& cp = run.post_ln.mha_p ? *run.post_ln.mha_p : c2;
  std::vector<std::pair<Eigen::MatrixXd, std::string>> points = {{set.center, "centre"}};
  if (cp.witness.x.size()) points.push_back({cp.witness.x, "mha:" + cp.witness.origin});
  if (c2.witness.x.size() && norm != NormKind::kL2) points.push_back({c2.witness.x, "mha:" + c2.witness.origin});
  if (run.centre_inf_row >= 0) consider(set.center, RowSigns(L, set.center, run.centre_inf_row), "centre:inf-row");
  // A quarter of what is left: the search's first centre pair is sigma_1 of f already.
  const Clock::time_point until = run.by_work() ? kNoDeadline : After(Clock::now(), 0.25 * seconds);
  for (const auto& [x, origin] : points) {
    const Eigen::MatrixXd v0 = cp.witness.v.size() ? cp.witness.v : Eigen::MatrixXd::Ones(x.rows(), x.cols());
    consider(x, v0, origin);
    if (run.stopped()) break;
    // The centre's top singular vector by Lanczos (converges where power steps crawl: sigma_2
    // / sigma_1 about 0.97 on MiniLM), always, past the limit by a tenth of it at most: on a
    // set containing X0 the witness is never below ||J_f(X0)||. Elsewhere power steps, a
    // point set getting more of them.
    const bool centre = origin == "centre";
    if (!centre && Clock::now() > until) break;
    const Clock::time_point centre_until =
        run.by_work() ? kNoDeadline : std::max(until, After(Clock::now(), 0.1 * run.opts.time_limit_s));
    const Eigen::MatrixXd v2 =
        centre ? LanczosDirection(L, x, v0, 120, centre_until, run.opts.stop)
               : PowerDirection(L, x, v0 / v0.norm(), set.radius == 0 ? 200 : 30, until, run.opts.stop);
    if (norm == NormKind::kL2)
      consider(x, v2, "power:" + origin);
    else
      consider(x, InfDirection(L, x, v2), "row:" + origin);
  }
  run.Improved("witness");
}

// The search on f itself with 90% of what is left; its oracle follows the sublayer's own
// Jacobian (the LayerNorm composed with the kernels' MHA products).
bool PostLnSearchApplies(const CertifyRun& run) {
  return !run.ToleranceMet() && (run.by_work() || PostLnSearchSeconds(run) > 0.05);
}
double PostLnSearchSeconds(const CertifyRun& run) { return 0.9 * (run.opts.time_limit_s - run.clock.Elapsed()); }
void RunPostLnSearch(CertifyRun& run, double seconds) {
  SearchOptions so = SearchOptionsOf(run.opts, seconds);
  so.stop_at = run.cert.upper_bound.value() / (1 + run.opts.tolerance);
  so.centre_inf_row = run.centre_inf_row;
  const Witness w = SearchLowerBound(run.layer, run.set, so).best;
  if (w.lower_bound.value() > run.cert.lower_bound.value()) {
    run.cert.lower_bound = w.lower_bound;
    run.cert.witness = w;
    run.cert.witness.origin = "search:" + w.origin;
    run.Improved("search");
  }
}

}  // namespace lipcert
