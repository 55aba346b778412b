// The validation section: lipcert's own engines reproduce the published results the tool
// stands on (see the project's notes on attention mathematics), on small layers built in
// code (D = H = 1, unit weights), each number beside the published figure.
//
//   Kim et al. (ICML 2021)
//     - dot-product MHA is not globally Lipschitz: on the tokens set of radius R around 0,
//       x_1 = 0 with the other tokens at +-R gives J_11 = 1/N + Var(x), unbounded in R;
//       the L2 layer's certified bound stays below Kim's radius-free bound;
//     - Kim's bound against N and its tightness construction: x_1 = 0 with (N-1)/2 tokens
//       at +-sqrt(1 + w), w = W0((N-1)/e), attains ||J||_inf = 4 w + (2 - y)/y, y = 1 + w.
//   Castin et al. (ICML 2024)
//     - on B_R^N the closed-form DP bound grows like R^2, witnessed values much faster;
//     - unbalanced mass: x_1 = R, x_2..x_N = R/2 with N - 1 = exp(R^2/4) gives
//       ||J||_2 >= (sqrt(N-1)/2)(1 + log(N-1)/2); and mass splitting at 2N tokens, the same
//       R: every token duplicated (the heavy one too) against one heavy token among 2N - 1.
// Every witness is evaluated rigorously (certify/witness_eval.h); every certified bound
// comes from Certify (certify/certify.h) on the set the witness lies in.
#pragma once

#include <Eigen/Dense>
#include <vector>

#include "certify/input_set.h"
#include "interval/rounding.h"
#include "models/attention_layer.h"
#include "reports/report.h"

namespace lipcert::reports {

struct ValidationOptions {
  double time_limit_s = 2;                 // per certificate
  int threads = 0;                         // 0: all cores
  int growth_tokens = 8;                   // N of the radius sweeps
  std::vector<double> growth_radii = {0.5, 1, 2, 3, 4};
  std::vector<int> kim_tokens = {2, 3, 10, 11, 100, 101, 1000, 1001};
  int kim_certify_max_tokens = 101;        // certify at the construction only up to this N
  std::vector<int> castin_light_tokens = {4, 16, 64};  // N - 1 of the unbalanced construction
};

// One radius of the "DP is not Lipschitz / L2 is" sweep (tokens set around 0, N tokens).
struct GrowthRow {
  double radius = 0;
  // Dot layer.
  double dot_upper = 0, dot_lower = 0, castin = 0;  // certified, witnessed (search), closed form
  double variance_formula = 0;                      // 1/N + Var(x) at x_1 = 0, x_j = +-R
  LowerBound variance_witness{0};                   // rigorous ||J e_1|| there
  // L2 layer.
  double l2_upper = 0, l2_lower = 0, kim = 0;       // kim: radius-free
};

// One N of Kim's bound and its tightness construction (norm inf; Kim's 2-norm bound beside).
struct KimRow {
  int tokens = 0;
  double w = 0;                       // W0((N-1)/e)
  double kim_inf_bound = 0;           // 4 w + 1 (D = H = 1, unit weights)
  double published_bound = 0;         // Kim et al.'s figure (0 when not published)
  double published_ascent = 0;        // their numerical ascent (0 when not published)
  double construction_formula = 0;    // 4 w + (2 - y)/y
  LowerBound construction_witness{0}; // rigorous ||J||_inf lower bound at the construction
  double certified_upper = 0;         // lipcert, norm inf, at the construction (radius 0); 0: not run
  double kim_l2_bound = 0;            // closed_form/kim (norm 2)
};

// One N of Castin's unbalanced-mass construction on B_R^N, R = 2 sqrt(log(N-1)).
struct CastinRow {
  int tokens = 0;
  double radius = 0;
  double formula = 0;                 // (sqrt(N-1)/2)(1 + log(N-1)/2)
  LowerBound moving_witness{0};       // rigorous ||J e_1|| at the construction
  LowerBound best_witness{0};         // rigorous, top singular direction at the construction
  double certified_upper = 0, castin = 0;  // lipcert and the closed form on B_R^N
  // Mass splitting at 2N tokens, the same R: one heavy token vs the heavy token duplicated.
  int split_tokens = 0;
  LowerBound one_heavy_witness{0}, split_witness{0};
  double split_certified_upper = 0;   // lipcert on B_R^{2N}
};

struct ValidationResult {
  int growth_tokens = 0;
  std::vector<GrowthRow> growth;
  std::vector<KimRow> kim;
  std::vector<CastinRow> castin;
  double seconds = 0;
};

ValidationResult RunValidation(const ValidationOptions& options);
std::vector<Section> ValidationSections(const ValidationResult& result);

// Constructions that sit on the boundary of B_R^N (a token of norm exactly R) are built at
// radius kInside * R, so that they are certainly in the set after upward rounding of their
// norms (certify/witness_eval.h CertainlyInSet); the formulas move by O(1e-12) relative.
constexpr double kInside = 1 - 1e-12;

// The building blocks (also used by the tests).
AttentionLayer UnitLayer(AttentionKind kind);              // D = H = dk = 1, all weights 1
double LambertW0(double x);                                // to double accuracy (Newton)
Eigen::MatrixXd KimTightnessInput(int tokens);             // (N, 1)
double KimTightnessFormula(int tokens);                    // 4 w + (2 - y)/y
Eigen::MatrixXd VarianceInput(int tokens, double radius);  // x_1 = 0, x_j = +-R alternating
double VarianceFormula(int tokens, double radius);         // 1/N + Var
Eigen::MatrixXd UnbalancedInput(int heavy, int light, double radius);  // heavy at R, light at R/2
double CastinMassFormula(int tokens);
// Rigorous lower bound at x along the best direction the dense Jacobian shows: the top right
// singular vector (norm 2) or the sign pattern of the largest row (norm inf).
LowerBound BestDirectionWitness(const AttentionLayer& layer, const Eigen::MatrixXd& x, NormKind norm);

}  // namespace lipcert::reports
