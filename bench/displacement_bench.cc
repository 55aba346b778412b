// The post-LN cover of Y on one checkpoint layer and centre (docs/engines.md, "The cover of Y:
// displacement and the centred norm from below"): per token, the centred row's norm ||c0_i||,
// the attention's displacement bound (norm, and along the centred direction), and the centred
// norm's lower bound over the ball; with the seconds the displacement took.
//
//   build/bench/displacement_bench MODEL LAYER CENTRE RELATIVE_RADIUS
//
// MODEL and CENTRE as for `lipcert certify` (preset bert: the layer must have a post-LN).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "bench/bench_ball.h"
#include "certify/post_ln_y_cover.h"
#include "certify/token_cover.h"
#include "interval/rounding.h"

int main(int argc, char** argv) {
  using namespace lipcert;
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL LAYER CENTRE RELATIVE_RADIUS\n", argv[0]);
    return 2;
  }
  try {
    const BenchBall ball = LoadBenchBall(argv);
    const AttentionLayer& L = ball.layer;
    const InputSet& set = ball.set;
    if (!L.post_layer_norm) throw std::invalid_argument("the layer has no post-LN LayerNorm");
    const int n = int(set.center.rows());
    const auto t0 = std::chrono::steady_clock::now();
    const TokenCover y = PostLnYCover(L, CoverOf(set), Eigen::VectorXd::Constant(n, kInf));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("layer %s N=%d R=%.4g (%.3g s for the cover of Y)\n", argv[2], n, set.radius, seconds);
    std::printf("token  ||c0_i||  radius_i  centred_lo_i\n");
    double lo_min = kInf, lo_max = 0;
    for (int i = 0; i < n; ++i) {
      const Eigen::RowVectorXd c0 = y.center.row(i).array() - y.center.row(i).mean();
      std::printf("%5d  %8.4f  %8.4f  %8.4f\n", i, c0.norm(), y.radius(i), y.centred_lo(i));
      lo_min = std::min(lo_min, y.centred_lo(i)), lo_max = std::max(lo_max, y.centred_lo(i));
    }
    std::printf("centred_lo: min %.4g max %.4g (%s)\n", lo_min, lo_max,
                lo_min > 0 ? "every token keeps its variance" : "some token may lose its variance");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "displacement_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
