// Candidate points of the witnessed lower-bound search (internal to certify/search.cc):
// samples uniform in the set and on its boundary, the structured starts the theory calls
// dangerous (docs/search.md), and the perturbations of the best points in later rounds.
// Everything random draws from one generator in a fixed order, so a seed fixes the points.
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "certify/input_set.h"
#include "certify/search.h"
#include "certify/search_oracle.h"
#include "models/attention_layer.h"

namespace lipcert::search_parts {

struct Candidate {
  Eigen::MatrixXd x;
  std::string origin;  // see Witness::origin
  Pair pair;           // the top direction at x (value -1 until screened)
};

uint64_t SplitMix(uint64_t x);
Eigen::MatrixXd Gaussian(int rows, int cols, std::mt19937_64& rng);

// A point uniform in the set, and one on its boundary (a vertex for a box).
Eigen::MatrixXd UniformIn(const InputSet& set, std::mt19937_64& rng);
Eigen::MatrixXd OnBoundary(const InputSet& set, std::mt19937_64& rng);

// The point of the set that maximises <g, X - X0> (the first-order ascent from the centre
// along g), scaled by t in (0, 1] towards the centre: X0 + t R g / ||g||_F (ball),
// row by row with each token's radius (tokens), X0 + t r sign(g) (box).
Eigen::MatrixXd LinearStep(const InputSet& set, const Eigen::MatrixXd& g, double t);

// A typical length of a move inside the set (Frobenius).
double SetScale(const InputSet& set);

// x := x_k duplicated onto token j, then nudged by eps along w.
Eigen::MatrixXd MassSplit(const Eigen::MatrixXd& base, int k, int j, const Eigen::RowVectorXd& w, double eps);

// The theory's structured starts: split attention, unbalanced mass, mass splitting.
std::vector<Candidate> StructuredStarts(const AttentionLayer& layer, const InputSet& set, std::mt19937_64& rng);

// The points screened in a round: round 0 the centre, `starts` samples and boundary
// points and (opts.structured) up to 6 * starts structured starts; later rounds samples,
// boundary points, perturbations of the elite (best first) and mass splits of the best.
std::vector<Candidate> RoundCandidates(const AttentionLayer& layer, const InputSet& set, const SearchOptions& opts,
                                       int round, const std::vector<Candidate>& elite, std::mt19937_64& rng);

}  // namespace lipcert::search_parts
