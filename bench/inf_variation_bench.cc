// The inf norm's per-token ingredients of the post-LN variation on one checkpoint layer and
// centre (docs/engines.md, "Per output token in the inf norm" and "The LayerNorm's variation
// in the inf norm"):
//   - MHA's inf-norm variation over the ball and its per-token entries row_variation(i), and
//     the MHA term max_i ||D_i(yc_i)||_inf row_variation(i) against max_i ||D_i(yc_i)||_inf V_M;
//   - LayerNormVariationInfUp against sqrt(D) LayerNormVariationUp on the rows of
//     Y0 = X0 + MHA(X0), for radii rho = R (1 + k), one line per k.
//
//   build/bench/inf_variation_bench MODEL LAYER CENTRE RELATIVE_RADIUS [K ...]
//
// MODEL and CENTRE as for `lipcert certify` (preset bert: the layer must have a post-LN).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "bench/bench_ball.h"
#include "certify/centred_engine.h"
#include "certify/layer_norm_cover.h"
#include "certify/layer_norm_enclosure.h"
#include "certify/post_ln_variation.h"
#include "certify/token_cover.h"
#include "interval/norms.h"
#include "interval/rounding.h"
#include "models/forward.h"

int main(int argc, char** argv) {
  using namespace lipcert;
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s MODEL LAYER CENTRE RELATIVE_RADIUS [K ...]\n", argv[0]);
    return 2;
  }
  try {
    const BenchBall ball = LoadBenchBall(argv);
    const AttentionLayer& L = ball.layer;
    const InputSet& set = ball.set;
    if (!L.post_layer_norm) throw std::invalid_argument("the layer has no post-LN LayerNorm");
    const LayerNormParams& ln = *L.post_layer_norm;
    const AttentionLayer mha = L.WithoutPostLayerNorm();
    const int n = int(set.center.rows()), d = L.d_model;
    BoundOptions o;
    o.norm = NormKind::kLinf;
    const CentredVariation v = CentredVariationBound(mha, CoverOf(set), o);
    std::printf("layer %s N=%d D=%d R=%.4g: inf variation V_M %.5g (%s)\n", argv[2], n, d, set.radius,
                v.variation.value(), v.route);
    std::printf("  row_variation: max %.5g min %.5g mean %.5g\n  rows:", v.row_variation.maxCoeff(),
                v.row_variation.minCoeff(), v.row_variation.mean());
    for (int i = 0; i < n; ++i) std::printf(" %.4g", v.row_variation(i));
    std::printf("\n");
    // ||D_i(y0_i)||_inf at the rows of Y0 (Y0 in double: a measurement, not the engine's enclosure).
    const Eigen::MatrixXd y0 = set.center + Forward<double>(mha, set.center);
    double d_max = 0, per_row = 0;
    for (int i = 0; i < n; ++i) {
      const LayerNormRowEnclosure r = EncloseLayerNormRow(ln, y0.row(i));
      const double di = NormInfUpper(LayerNormJacobianEnclosure(ln.gamma, r.xhat, Interval(1.0) / r.sigma,
                                                                Interval(1.0) / Interval(double(d))))
                            .value();
      d_max = std::max(d_max, di);
      per_row = std::max(per_row, MulUp(di, v.row_variation(i)));
    }
    const double whole = MulUp(d_max, v.variation.value());
    std::printf("MHA term: max_i ||D_i||_inf V_M = %.5g x %.5g = %.5g; max_i ||D_i||_inf row_variation(i) = %.5g (%.3f of it)\n",
                d_max, v.variation.value(), whole, per_row, per_row / whole);
    for (int a = 5; a < argc; ++a) {
      const double k = std::atof(argv[a]), rho = set.radius * (1 + k);
      double max_inf = 0, max_two = 0, lo_ratio = kInf, hi_ratio = 0;
      for (int i = 0; i < n; ++i) {
        const double inf = LayerNormVariationInfUp(ln, y0.row(i), rho);
        const double two = MulUp(SqrtUp(double(d)), LayerNormVariationUp(ln, y0.row(i), rho));
        max_inf = std::max(max_inf, inf), max_two = std::max(max_two, two);
        lo_ratio = std::min(lo_ratio, inf / two), hi_ratio = std::max(hi_ratio, inf / two);
      }
      std::printf("rho = R (1 + %g) = %.4g: max_i LayerNormVariationInfUp %.5g, max_i sqrt(D) LayerNormVariationUp %.5g "
                  "(%.3f; per token %.3f-%.3f)\n",
                  k, rho, max_inf, max_two, max_inf / max_two, lo_ratio, hi_ratio);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
