#include "certify/search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>

#include "certify/run_control.h"
#include "certify/search_ascent.h"
#include "certify/search_candidates.h"
#include "certify/search_oracle.h"
#include "certify/witness_eval.h"
#include "interval/parallel.h"

namespace lipcert {
namespace {

using Eigen::MatrixXd;
using search_parts::AscentResult;
using search_parts::Candidate;
using search_parts::ComputeTop;
using search_parts::Oracle;
using search_parts::Pair;
using search_parts::TopParams;

bool NearDuplicate(const MatrixXd& a, const MatrixXd& b, double scale) {
  return (a - b).norm() <= 1e-9 * (1 + scale);
}

// Throws std::invalid_argument naming the bad field.
void ValidateSearchInputs(const AttentionLayer& layer, const InputSet& set, const SearchOptions& opts) {
  if (std::string e = ValidateSearchOptions(opts); !e.empty()) throw std::invalid_argument("search options: " + e);
  if (std::string e = ValidateLayer(layer); !e.empty()) throw std::invalid_argument("layer: " + e);
  if (set.width() != layer.d_model || set.tokens() < 1)
    throw std::invalid_argument("input set: centre must be N x " + std::to_string(layer.d_model));
  if (!(set.radius >= 0) || !std::isfinite(set.radius))
    throw std::invalid_argument("input set: radius must be finite and >= 0");
  if (opts.centre_inf_row >= long(set.center.size()))
    throw std::invalid_argument("search options: centre_inf_row: must be < N*D = " + std::to_string(set.center.size()));
}

// The best distinct points seen, by floating value, and the best value per origin.
class Elite {
 public:
  Elite(size_t size, double scale) : size_(size), scale_(scale) {}

  void Record(const MatrixXd& x, const std::string& origin, const Pair& p) {
    double& b = by_origin_.try_emplace(origin, -1.0).first->second;
    b = std::max(b, p.value);
    for (auto& e : points_)
      if (NearDuplicate(e.x, x, scale_)) {
        if (p.value > e.pair.value) e = {x, origin, p};
        return;
      }
    points_.push_back({x, origin, p});
    std::stable_sort(points_.begin(), points_.end(),
                     [](const Candidate& a, const Candidate& b) { return a.pair.value > b.pair.value; });
    if (points_.size() > size_) points_.pop_back();
  }
  const std::vector<Candidate>& points() const { return points_; }
  const std::map<std::string, double>& by_origin() const { return by_origin_; }

 private:
  size_t size_;
  double scale_;
  std::vector<Candidate> points_;  // best first
  std::map<std::string, double> by_origin_;
};

// One search: the stages SearchLowerBound runs, over shared state (the oracles, the
// generator, the elite, the counters).
class Search {
 public:
  Search(const AttentionLayer& layer, const InputSet& set, const SearchOptions& opts, Clock::time_point t0)
      : layer_(layer),
        set_(set),
        opts_(opts),
        t0_(t0),
        deadline_(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts.time_limit_s))),
        threads_(opts.threads > 0 ? opts.threads : std::max(1u, std::thread::hardware_concurrency())),
        scale_(search_parts::SetScale(set)),
        rng_(search_parts::SplitMix(opts.seed)),
        elite_(std::max(4, opts.starts), scale_),
        fine_oracle_(layer, set.tokens(), search_parts::kFineTol, search_parts::kFineIters) {
    // One oracle per worker for screening and ascent (cheap stopping rule).
    for (int t = 0; t < threads_; ++t)
      oracles_.push_back(std::make_unique<Oracle>(layer, set.tokens(), search_parts::kCheapTol,
                                                  search_parts::kCheapIters));
  }

  // The rounds end early enough for the polish and the witness's rigorous value to finish
  // by the deadline: they take 2.5-4 screening evaluations (MiniLM N = 16-128), and the
  // rounds' last evaluation can start just before their end, so six of the slowest
  // screening evaluation seen are kept.
  Clock::time_point RoundsDeadline() const {
    return deadline_ - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(6.0 * slowest_top_s_.load()));
  }
  double Seconds() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  bool PastDeadline() const { return StopRequested(opts_.stop) || Clock::now() >= RoundsDeadline(); }
  // The best floating value so far is at least `target`: nothing left for the search to gain.
  bool Reached(double target) const {
    return !elite_.points().empty() && elite_.points().front().pair.value >= target;
  }

  // The round's points; for kLinf (with exact_inf_centre) the centre, round 0's first,
  // comes with its exact largest row, so that no witness falls below ||J(X0)||_inf.
  std::vector<Candidate> Candidates(int round) {
    std::vector<Candidate> cands = search_parts::RoundCandidates(layer_, set_, opts_, round, elite_.points(), rng_);
    if (round == 0 && opts_.norm == NormKind::kL2) {
      std::vector<Candidate> steps = CentrePairSteps();
      cands.insert(cands.begin() + 1, std::make_move_iterator(steps.begin()), std::make_move_iterator(steps.end()));
    }
    if (round == 0 && opts_.norm == NormKind::kLinf && opts_.centre_inf_row >= 0) {
      // The largest row is known (the centre_norm engine's certified row sums): one VJP.
      centre_exact_ = {set_.center, "centre", search_parts::InfRowPair(*oracles_.front(), set_.center, opts_.centre_inf_row)};
      evaluations_.fetch_add(1);
      cands.front().pair = centre_exact_.pair;
      if (opts_.verbose)
        std::fprintf(stderr, "search: [%.2f s] l_inf norm at the centre %.9g (row %d, given)\n", Seconds(), centre_exact_.pair.value,
                     centre_exact_.pair.row);
    } else if (round == 0 && opts_.norm == NormKind::kLinf && opts_.exact_inf_centre) {
      const auto t = Clock::now();
      // At most half the search's time: past a few thousand N*D the rows cost more
      // than the ascent can use, and the rows seen by then still bound it from below.
      bool complete = false;
      centre_exact_ = {set_.center, "centre",
                       search_parts::ExactInfTop(oracles_, set_.center, t0_ + (deadline_ - t0_) / 2, &complete,
                                                 opts_.stop)};
      evaluations_.fetch_add(1);
      cands.front().pair = centre_exact_.pair;
      if (opts_.verbose)
        std::fprintf(stderr, "search: [%.2f s] %s l_inf norm at the centre %.9g (row %d of %d, %.2f s)\n", Seconds(),
                     complete ? "exact" : "rows within the time:", centre_exact_.pair.value,
                     centre_exact_.pair.row, int(set_.center.size()),
                     std::chrono::duration<double>(Clock::now() - t).count());
    }
    return cands;
  }

  // kL2: the centre's top opts_.centre_pairs singular triples (u_k, v_k) by deflated
  // Lanczos and, for each, the first-order ascent steps X0 + t R g_k / ||g_k||, t = 1, 1/2,
  // g_k = grad_X <u_k, J(X0) v_k> (LinearStep per set kind). Singular values of trained
  // layers cluster (sigma_2 / sigma_1 about 0.97 on MiniLM), so over a set the maximum may
  // follow the second or third. Stops at half the rounds' time.
  std::vector<Candidate> CentrePairSteps() {
    std::vector<Candidate> out;
    if (!(set_.radius > 0) || opts_.centre_pairs == 0) return out;
    const Clock::time_point half = t0_ + (RoundsDeadline() - t0_) / 2;
    std::vector<MatrixXd> found;
    const Oracle& o = *oracles_.front();
    for (int k = 0; k < opts_.centre_pairs && k < int(set_.center.size()); ++k) {
      if (k > 0 && (StopRequested(opts_.stop) || Clock::now() >= half)) break;
      Pair p;
      o.NextSingular(set_.center, found, &p.value, &p.u, &p.v);
      evaluations_.fetch_add(1);
      if (!(p.value > 0) || !p.v.allFinite()) break;
      found.push_back(p.v);
      const MatrixXd g = search_parts::PairGradient(o, set_.center, p);
      if (!g.allFinite() || !(g.norm() > 0)) continue;
      for (double t : {1.0, 0.5}) out.push_back({search_parts::LinearStep(set_, g, t), "centre-pair", {}});
      if (opts_.verbose)
        std::fprintf(stderr, "search: [%.2f s] centre singular value %d: %.9g\n", Seconds(), k + 1, p.value);
    }
    return out;
  }

  // The top direction at every candidate that has none yet (the first always, the rest
  // until the deadline), recorded in the elite.
  void Screen(int round, std::vector<Candidate>& cands) {
    TopParams screen;
    screen.iters = 12;
    // Round 0 screens its many starts with at most 30% of the rounds' time, best-placed
    // first (the centre, its pair steps): on trained layers the ascent from those gains more
    // than screening the rest (MiniLM, 0.1-1% balls: samples and structured starts never win).
    const Clock::time_point screen_until =
        round == 0 ? t0_ + std::chrono::duration_cast<Clock::duration>(0.3 * (RoundsDeadline() - t0_)) : RoundsDeadline();
    ParallelFor(int(cands.size()), threads_, [&](int i, int worker) {
      if (cands[i].pair.value >= 0 || (i > 0 && (PastDeadline() || Clock::now() >= screen_until))) return;
      const auto t = Clock::now();
      cands[i].pair = ComputeTop(*oracles_[worker], cands[i].x, opts_.norm, nullptr, screen);
      const double seconds = std::chrono::duration<double>(Clock::now() - t).count();
      for (double seen = slowest_top_s_.load(); seconds > seen && !slowest_top_s_.compare_exchange_weak(seen, seconds);) {
      }
      evaluations_.fetch_add(1);
    });
    for (const auto& c : cands)
      if (c.pair.value >= 0) elite_.Record(c.x, c.origin, c.pair);
    if (opts_.verbose)
      std::fprintf(stderr, "search: [%.2f s] round %d screened %zu points, best %.6g\n", Seconds(), round, cands.size(),
                   elite_.points().empty() ? 0.0 : elite_.points().front().pair.value);
  }

  // Up to `starts` distinct ascent starts from the screened candidates and the elite:
  // the best of each origin first, then by value.
  std::vector<Candidate> PickStarts(const std::vector<Candidate>& cands) const {
    std::vector<const Candidate*> pool;
    for (const auto& c : cands)
      if (c.pair.value >= 0) pool.push_back(&c);
    for (const auto& e : elite_.points()) pool.push_back(&e);
    std::stable_sort(pool.begin(), pool.end(),
                     [](const Candidate* a, const Candidate* b) { return a->pair.value > b->pair.value; });
    std::vector<Candidate> starts;
    std::map<std::string, int> seen;
    auto take = [&](const Candidate* c) {
      for (const auto& s : starts)
        if (NearDuplicate(s.x, c->x, scale_)) return;
      starts.push_back(*c);
    };
    for (const Candidate* c : pool)
      if (int(starts.size()) < opts_.starts && seen[c->origin]++ == 0) take(c);
    for (const Candidate* c : pool)
      if (int(starts.size()) < opts_.starts) take(c);
    return starts;
  }

  // Gradient ascent from every start in parallel; improved points go to the elite as
  // "ascent:<origin>".
  void AscendAll(int round, const std::vector<Candidate>& starts) {
    std::vector<AscentResult> asc(starts.size());
    ParallelFor(int(starts.size()), threads_, [&](int i, int worker) {
      asc[i] = search_parts::Ascend(*oracles_[worker], set_, starts[i], opts_.norm, opts_.max_steps, RoundsDeadline(),
                                    opts_.stop);
    });
    for (size_t i = 0; i < asc.size(); ++i) {
      evaluations_.fetch_add(asc[i].evaluations);
      result_.ascent_steps += asc[i].steps;
      const std::string origin =
          starts[i].origin.rfind("ascent:", 0) == 0 ? starts[i].origin : "ascent:" + starts[i].origin;
      if (asc[i].steps > 0) elite_.Record(asc[i].x, origin, asc[i].pair);
    }
    result_.rounds = round + 1;
    if (opts_.verbose)
      std::fprintf(stderr, "search: [%.2f s] round %d ascended %zu starts, best %.6g (%s)\n", Seconds(), round, starts.size(),
                   elite_.points().front().pair.value, elite_.points().front().origin.c_str());
  }

  // The top few elite points (and for kLinf the centre with its exact row), each moved
  // certainly into the set, with an accurate top direction and its reference value; the
  // best of them.
  Witness Polish() {
    TopParams fine;
    fine.exact_up_to = 256;
    fine.iters = 30;
    Witness best;
    best.value = -1;
    std::vector<Candidate> elite(elite_.points().begin(),
                                 elite_.points().begin() + std::min<size_t>(3, elite_.points().size()));
    if (centre_exact_.pair.value >= 0) elite.push_back(centre_exact_);
    for (size_t e = 0; e < elite.size(); ++e) {
      MatrixXd x = elite[e].x;
      // The final point must be inside the set, not merely within rounding of it.
      for (int k = 0; k < 40 && !CertainlyInSet(set_, x); ++k)
        x = set_.center + (x - set_.center) * (1 - std::ldexp(1.0, -48 + k));
      const Pair p = ComputeTop(fine_oracle_, x, opts_.norm, &elite[e].pair, fine);
      evaluations_.fetch_add(1);
      const MatrixXd jv = fine_oracle_.ReferenceJv(x, p.v);
      const double value = opts_.norm == NormKind::kL2 ? jv.norm() / p.v.norm()
                                                       : jv.cwiseAbs().maxCoeff() / p.v.cwiseAbs().maxCoeff();
      if (value > best.value) best = {x, p.v, value, LowerBound(0), elite[e].origin};
    }
    return best;
  }

  // The rigorous value of the witness (when asked for and certainly in the set) and the
  // result's summaries.
  SearchResult Finish(Witness best) {
    if (opts_.rigorous && best.value > 0 && CertainlyInSet(set_, best.x))
      best.lower_bound = WitnessLowerBound(layer_, best.x, best.v, opts_.norm);
    result_.best = std::move(best);
    result_.points_evaluated = evaluations_.load();
    result_.best_by_origin.assign(elite_.by_origin().begin(), elite_.by_origin().end());
    result_.elapsed_s = std::chrono::duration<double>(Clock::now() - t0_).count();
    return result_;
  }

 private:
  const AttentionLayer& layer_;
  const InputSet& set_;
  const SearchOptions& opts_;
  Clock::time_point t0_, deadline_;
  int threads_;
  double scale_;
  std::mt19937_64 rng_;
  Elite elite_;
  std::vector<std::unique_ptr<Oracle>> oracles_;
  Oracle fine_oracle_;
  Candidate centre_exact_;  // kLinf: the centre with its exact largest row (else unset)
  std::atomic<double> slowest_top_s_{0};  // the slowest screening evaluation so far
  std::atomic<int> evaluations_{0};
  SearchResult result_;
};

}  // namespace

std::string ValidateSearchOptions(const SearchOptions& o) {
  if (!(o.time_limit_s >= 0) || !std::isfinite(o.time_limit_s)) return "time_limit_s: must be finite and >= 0";
  if (o.starts < 1) return "starts: must be >= 1";
  if (o.max_steps < 0) return "max_steps: must be >= 0";
  if (o.max_rounds < 0) return "max_rounds: must be >= 0";
  if (o.threads < 0) return "threads: must be >= 0";
  if (o.centre_inf_row < -1) return "centre_inf_row: must be >= -1";
  if (o.centre_pairs < 0) return "centre_pairs: must be >= 0";
  if (!(o.stop_at > 0)) return "stop_at: must be > 0 (kInf: never stop early)";
  return "";
}

TopDirection TopDirectionAt(const AttentionLayer& layer, const MatrixXd& x, NormKind norm, int exact_up_to) {
  if (std::string e = ValidateLayer(layer); !e.empty()) throw std::invalid_argument("layer: " + e);
  if (x.cols() != layer.d_model || x.rows() < 1)
    throw std::invalid_argument("x: must be N x " + std::to_string(layer.d_model));
  const Oracle o(layer, int(x.rows()), search_parts::kFineTol, search_parts::kFineIters);
  TopParams tp;
  tp.exact_up_to = exact_up_to;
  tp.iters = 30;
  const Pair p = ComputeTop(o, x, norm, nullptr, tp);
  return {p.value, p.u, p.v};
}

TopDirection ExactInfDirectionAt(const AttentionLayer& layer, const MatrixXd& x, int threads) {
  if (std::string e = ValidateLayer(layer); !e.empty()) throw std::invalid_argument("layer: " + e);
  if (x.cols() != layer.d_model || x.rows() < 1)
    throw std::invalid_argument("x: must be N x " + std::to_string(layer.d_model));
  std::vector<std::unique_ptr<Oracle>> oracles;
  for (int t = 0; t < WorkerCount(threads, int(x.size())); ++t)
    oracles.push_back(std::make_unique<Oracle>(layer, int(x.rows()), search_parts::kFineTol, search_parts::kFineIters));
  const Pair p = search_parts::ExactInfTop(oracles, x);
  return {p.value, p.u, p.v};
}

SearchResult SearchLowerBound(const AttentionLayer& layer, const InputSet& set, const SearchOptions& opts) {
  const auto t0 = Clock::now();
  ValidateSearchInputs(layer, set, opts);
  Search search(layer, set, opts, t0);
  for (int round = 0; opts.max_rounds == 0 || round < opts.max_rounds; ++round) {
    if (round > 0 && (search.PastDeadline() || search.Reached(opts.stop_at))) break;
    std::vector<Candidate> cands = search.Candidates(round);
    search.Screen(round, cands);
    if (search.Reached(opts.stop_at)) break;
    search.AscendAll(round, search.PickStarts(cands));
  }
  return search.Finish(search.Polish());
}

}  // namespace lipcert
