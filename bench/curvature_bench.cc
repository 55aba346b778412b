// The certified curvature at the centre against the tensor power method's estimate
// (docs/engines.md, "Certified curvature at the centre"): MHA alone (LayerNorm dropped).
//
//   build/bench/curvature_bench MODEL LAYER CENTRE [--preset P] [--threads T] [--starts S]
//                               [--max-gram-size M] [--relative-radius r] [--cover-radius r]
//                               [--cover-only] [--third r]
//
// MODEL and CENTRE as for `lipcert certify` (CENTRE is FILE:TENSOR). Prints the certified
// C(X0) >= sup_{||U||_F = 1} ||D^2 f(X0)[U, U]||_F, its floating value, the tensor power
// method's best value over S starts (a lower estimate), their ratio and the seconds of each.
// With --relative-radius r (repeatable; ball of radius r ||X0||_F): the Taylor model's terms (centre =
// CentreJacobianNormUpperBound, curvature, remainder) and their sum.
// With --cover-radius r (repeatable; ball of radius R = r ||X0||_F): the certified sup of the
// curvature over the ball's token cover (CoverCurvatureUpperBound), its seconds, and the
// variation bound ||J(X0)|| + R sup_cover C (CurvatureVariationBound, centre =
// CentreJacobianNormUpperBound). --cover-only skips C(X0) and the tensor power method.
// With --third r (repeatable): the third-derivative bounds over the ball of radius r ||X0||_F
// against the power method's estimate of sup ||D^3 f(X0)[U, U, U]|| at the centre.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "certify/centre_norm.h"
#include "certify/curvature.h"
#include "certify/taylor.h"
#include "models/centre.h"
#include "models/loader.h"

int main(int argc, char** argv) {
  using namespace lipcert;
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: %s MODEL LAYER CENTRE [--preset P] [--threads T] [--starts S] [--max-gram-size M]\n",
                 argv[0]);
    return 2;
  }
  try {
    LoadOptions lo;
    lo.preset = "bert";
    lo.layer = std::atoi(argv[2]);
    CurvatureOptions co;
    int starts = 8;
    std::vector<double> radii;  // relative radii of the Taylor model's balls
    std::vector<double> cover_radii;  // relative radii of the covers' balls
    bool cover_only = false;
    std::vector<double> third_radii;  // relative radii at which to bound the third derivative
    for (int i = 4; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--preset" && i + 1 < argc) lo.preset = argv[++i];
      else if (a == "--threads" && i + 1 < argc) co.threads = std::atoi(argv[++i]);
      else if (a == "--starts" && i + 1 < argc) starts = std::atoi(argv[++i]);
      else if (a == "--max-gram-size" && i + 1 < argc) co.max_gram_size = std::atol(argv[++i]);
      else if (a == "--relative-radius" && i + 1 < argc) radii.push_back(std::atof(argv[++i]));
      else if (a == "--cover-radius" && i + 1 < argc) cover_radii.push_back(std::atof(argv[++i]));
      else if (a == "--cover-only") cover_only = true;
      else if (a == "--third" && i + 1 < argc) third_radii.push_back(std::atof(argv[++i]));
      else throw std::invalid_argument("unknown option " + a);
    }
    LoadedModel m = LoadModel(argv[1], lo);
    AttentionLayer L = m.layers.at(0);
    L.layer_norm.reset();
    L.post_layer_norm.reset();
    const Eigen::MatrixXd x0 = LoadCentre(argv[3], 0, L.d_model);
    CurvatureBound c;
    if (!cover_only) {
      const auto t0 = std::chrono::steady_clock::now();
      const double estimate = CurvatureLowerEstimate(L, x0, starts, 60, 1);
      const double est_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      c = CentreCurvatureUpperBound(L, x0, co);
      if (!c.message.empty()) std::printf("refused: %s\n", c.message.c_str());
      std::printf("N=%d D=%d H=%d  certified %.6g (floating %.6g, %.1f s)  tensor power %.6g (%d starts, %.1f s)  "
                  "ratio %.3f\n",
                  int(x0.rows()), L.d_model, L.heads, c.upper.value(), c.estimate, c.seconds, estimate, starts, est_s,
                  c.upper.value() / estimate);
    }
    for (const double rel : third_radii) {
      const auto t0 = std::chrono::steady_clock::now();
      const UpperBound crude = ThirdDerivativeUpperBound(L, x0, rel * x0.norm());
      const UpperBound structured =
          StructuredThirdDerivativeUpperBound(L, CoverOf(InputSet{SetKind::kBall, x0, rel * x0.norm()}));
      const double crude_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const auto t1 = std::chrono::steady_clock::now();
      const double est = ThirdDerivativeLowerEstimate(L, x0, starts, 20, 1);
      const double est_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      std::printf("third derivative, ball %.4g of ||X0||: crude %.6g  structured %.6g (%.2f s)  power estimate at X0 "
                  "%.6g (%.1f s)  ratio %.3g\n",
                  rel, crude.value(), structured.value(), crude_s, est, est_s, structured.value() / est);
    }
    const UpperBound centre =
        radii.empty() && cover_radii.empty() ? UpperBound(kInf) : CentreJacobianNormUpperBound(L, x0);
    for (const double rel : cover_radii) {
      const InputSet set{SetKind::kBall, x0, rel * x0.norm()};
      const TokenCover cover = CoverOf(set);
      const CurvatureBound cc = CoverCurvatureUpperBound(L, cover, co);
      if (!cc.message.empty()) std::printf("refused: %s\n", cc.message.c_str());
      const EngineBound v = CurvatureVariationBound(centre, cover, cc);
      std::printf("cover R=%.6g (%.4g of ||X0||)  sup_cover C %.6g (floating %.6g, %.1f s)%s  variation %.6g = "
                  "centre %.6g + R C %.6g\n",
                  set.radius, rel, cc.upper.value(), cc.estimate, cc.seconds,
                  cover_only ? "" : ("  / C(X0) " + std::to_string(cc.upper.value() / c.upper.value())).c_str(),
                  v.upper.value(), v.terms[0].value.value(), v.terms[1].value.value());
      std::printf("  logit radius max %.4g mean %.4g  softmax width max %.4g mean %.4g  G: radius norm %.4g, "
                  "midpoint lambda %.4g\n",
                  cc.logit_radius_max, cc.logit_radius_mean, cc.softmax_width_max, cc.softmax_width_mean,
                  cc.gram_radius_norm, cc.estimate * cc.estimate);
    }
    for (const double rel : radii) {
      const double radius = rel * x0.norm();
      const EngineBound t = TaylorVariationBound(L, centre, CoverOf(InputSet{SetKind::kBall, x0, radius}), c);
      std::printf("R=%.6g  taylor %.6g = centre %.6g + curvature %.6g + remainder %.6g\n", radius, t.upper.value(),
                  t.terms[0].value.value(), t.terms[1].value.value(), t.terms[2].value.value());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "curvature_bench: %s\n", e.what());
    return 2;
  }
}
