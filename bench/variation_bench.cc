// The centred form's variation bound sup_S ||J(X) - J(X0)||_2 of one checkpoint layer over a
// ball around one centre, with every candidate it compared (docs/engines.md, "How loose the
// variation bound is"): which path carries the bound.
//
//   build/bench/variation_bench MODEL LAYER CENTRE RELATIVE_RADIUS [--preset P] [--pre-ln] [--seconds S]
//
// MODEL and CENTRE as for `lipcert certify`; LayerNorm is dropped unless --pre-ln. With
// --seconds S the bound runs under a deadline S seconds away, its nodes refining up to it (as
// inside certify), prints its nodes, the cover of the MHA input and the candidates, and skips
// the diagnostics at the centre and per head (minutes at BERT-base size).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include <Eigen/SVD>

#include "bench/bench_ball.h"
#include "certify/centred_engine.h"
#include "certify/token_cover.h"

int main(int argc, char** argv) {
  using namespace lipcert;
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s MODEL LAYER CENTRE RELATIVE_RADIUS [--preset P] [--pre-ln]\n", argv[0]);
    return 2;
  }
  try {
    std::string preset = "bert";
    bool pre_ln = false;
    double seconds = 0;
    for (int i = 5; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--preset" && i + 1 < argc) preset = argv[++i];
      else if (a == "--pre-ln") pre_ln = true;
      else if (a == "--seconds" && i + 1 < argc) seconds = std::atof(argv[++i]);
      else throw std::invalid_argument("unknown option " + a);
    }
    BenchBall ball = LoadBenchBall(argv, preset);
    AttentionLayer& L = ball.layer;
    if (!pre_ln) L.layer_norm.reset();
    const InputSet& set = ball.set;
    BoundOptions bo;
    if (seconds > 0) {
      bo.threads = 2;
      bo.deadline = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
    }
    const CentredVariation v = CentredVariationBound(L, CoverOf(set), bo, bo.deadline, /*up_to_refine_until=*/seconds > 0);
    std::printf("N=%d D=%d H=%d R=%.6g variation=%.6g (%s)\n", int(set.center.rows()), L.d_model, L.heads, set.radius,
                v.variation.value(), v.route);
    for (const BoundTerm& t : v.alternatives) std::printf("  %-70s %.6g\n", t.name.c_str(), t.value.value());
    if (seconds > 0) {
      std::printf("  second-order nodes %d; MHA input cover: joint radius %.6g, LayerNorm factor max_j ell_j %.6g\n",
                  v.second_order_nodes, v.in.joint_z, v.in.ell.maxCoeff());
      return v.complete ? 0 : 1;
    }
    {
      // The second-order candidate's coefficients at the centre alone (not a bound over the
      // set): how much of it is the widening of the factor bounds over the cover.
      const Eigen::VectorXd zero = Eigen::VectorXd::Zero(set.center.rows());
      std::vector<SecondOrderHead> heads;
      std::vector<SecondOrderSplitHead> split;
      for (int h = 0; h < L.heads; ++h) {
        const HeadGeometry G = HeadGeometryAt(L, h, v.in.zc, NormKind::kL2);
        const FactorBounds F = HeadFactorBounds(G, zero, 0.0, L.causal);
        heads.push_back(SecondOrderHeadUp(G, F, zero, L.causal));
        split.push_back(SecondOrderSplitHeadUp(G, F, zero, L.causal));
      }
      std::printf("  %-70s %.6g\n", "second order with the centre's coefficients (radius x, not a bound)",
                  set.radius * SecondOrderColumnsUp(heads));
      std::printf("  %-70s %.6g\n", "  the same, pair terms apart (radius x, not a bound)",
                  set.radius * SecondOrderSplitColumnsUp(split));
    }
    // Heads apart, Wo factored out: ||sum_h (I x Wo_h) dK_h|| <= ||Wo|| sqrt(sum_h ||dK_h||^2).
    double sum2 = 0, sum_plain = 0;
    for (int h = 0; h < L.heads; ++h) {
      AttentionLayer one = L;
      one.heads = 1;
      one.wq = L.wq.middleRows(h * L.head_dim_qk, L.head_dim_qk);
      one.wk = L.wk.middleRows(h * L.head_dim_qk, L.head_dim_qk);
      one.wv = L.wv.middleRows(h * L.head_dim_v, L.head_dim_v);
      if (L.bq.size()) one.bq = L.bq.segment(h * L.head_dim_qk, L.head_dim_qk);
      if (L.bk.size()) one.bk = L.bk.segment(h * L.head_dim_qk, L.head_dim_qk);
      if (L.bv.size()) one.bv = L.bv.segment(h * L.head_dim_v, L.head_dim_v);
      one.wo = L.wo.middleCols(h * L.head_dim_v, L.head_dim_v);
      const double plain = CentredVariationBound(one, CoverOf(set), BoundOptions{}).variation.value();
      one.wo = Eigen::MatrixXd::Identity(L.d_model, L.head_dim_v);
      const double bare = CentredVariationBound(one, CoverOf(set), BoundOptions{}).variation.value();
      sum2 += bare * bare;
      sum_plain += plain;
      std::printf("  head %2d: with Wo_h %.6g, Wo_h = I %.6g, ||Wo_h|| %.4g\n", h, plain, bare,
                  Eigen::JacobiSVD<Eigen::MatrixXd>(L.wo.middleCols(h * L.head_dim_v, L.head_dim_v)).singularValues()(0));
    }
    const double wo = Eigen::JacobiSVD<Eigen::MatrixXd>(L.wo).singularValues()(0);
    std::printf("  sum over heads %.6g;  ||Wo|| %.4g x sqrt(sum bare^2) %.6g = %.6g\n", sum_plain, wo, std::sqrt(sum2),
                wo * std::sqrt(sum2));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "variation_bench: %s\n", e.what());
    return 2;
  }
}
