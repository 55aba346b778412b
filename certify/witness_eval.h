// Rigorous re-evaluation of a witnessed lower bound: given a point x and a direction v
// (both plain doubles, taken as exact), encloses J_f(x) v in interval arithmetic
// (models/forward.h instantiated with the interval scalar of interval/) and returns a
// value that is provably <= ||J_f(x) v|| / ||v||:
//   NormKind::kL2    Frobenius norms (the spectral-norm witness): sqrt(sum mig(Y_ij)^2) / ||v||_F
//   NormKind::kLinf  max-abs norms (the l_inf operator-norm witness): max mig(Y_ij) / max |v_ij|
// with every rounding directed downwards in the numerator and upwards in the denominator.
// Since ||J(x)|| >= ||J(x) v|| / ||v||, the result is a proven lower bound on the local
// Lipschitz constant over any convex set that certainly contains x (CertainlyInSet).
#pragma once

#include <Eigen/Dense>

#include "certify/input_set.h"
#include "interval/elementary.h"
#include "interval/rounding.h"
#include "models/attention_layer.h"

namespace lipcert {

// Throws std::invalid_argument when shapes disagree, x or v is not finite, or v == 0.
LowerBound WitnessLowerBound(const AttentionLayer& layer, const Eigen::MatrixXd& x,
                             const Eigen::MatrixXd& v, NormKind norm,
                             ExpBackend exp_backend = DefaultExpBackend());

// The enclosure of J(x) v itself, as (lo, hi) matrices (lo <= J(x) v <= hi entrywise):
// interval GEMMs for every matrix product, scalar intervals for the elementwise steps.
void EncloseJvp(const AttentionLayer& layer, const Eigen::MatrixXd& x, const Eigen::MatrixXd& v,
                ExpBackend exp_backend, Eigen::MatrixXd* lo, Eigen::MatrixXd* hi);

// The same enclosure with models/forward.h run on scalar intervals (slow on wide layers;
// kept as an independent cross-check in the tests).
void EncloseJvpScalar(const AttentionLayer& layer, const Eigen::MatrixXd& x, const Eigen::MatrixXd& v,
                      ExpBackend exp_backend, Eigen::MatrixXd* lo, Eigen::MatrixXd* hi);

// An enclosure of f(x) itself (models/forward.h Evaluate on scalar intervals; slow on wide
// layers, meant for one point such as a cover's centre): lo <= f(x) <= hi entrywise.
void EncloseForward(const AttentionLayer& layer, const Eigen::MatrixXd& x, ExpBackend exp_backend,
                    Eigen::MatrixXd* lo, Eigen::MatrixXd* hi);

// True only when x is certainly in the set (norms of x - X0 rounded upwards).
bool CertainlyInSet(const InputSet& set, const Eigen::MatrixXd& x);

}  // namespace lipcert
