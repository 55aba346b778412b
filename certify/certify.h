// lipcert's main job, in one function a reader can follow:
//   closed-form baselines -> witnessed lower bound (search) -> structured engines
//   -> branch and bound -> certificate.
#pragma once

#include <functional>

#include "certify/certificate.h"
#include "models/attention_layer.h"

namespace lipcert {

struct CertifyOptions {
  NormKind norm = NormKind::kL2;
  double time_limit_s = 30;     // the whole run, wall clock
  double search_share = 0.3;    // share of the time limit spent on the lower-bound search
  double tolerance = 0.01;      // stop when upper <= (1 + tolerance) * lower
  int dense_limit = 4096;       // centred engine on layers with N*D up to this
  uint64_t seed = 1;            // the search's randomness
  int threads = 0;              // 0: all cores
  bool progress = false;        // progress lines on stderr
  // A work budget (reproducible certificates, e.g. audits' budget = { steps, rounds }):
  // search rounds at most (0: as many as its share of the time limit allows) and
  // branch-and-bound pieces at most. With a time limit that never binds, the certificate
  // is the same on every machine, thread count and schedule.
  int search_rounds = 0;
  int max_pieces = 100000;
  // Called with every improved certificate (anytime: the CLI writes it atomically).
  std::function<void(const Certificate&)> on_improvement;
};

// Returns "" when valid, else a message naming the bad field.
std::string ValidateCertifyOptions(const CertifyOptions& opts);

// The witness of the lower bound (the input X* and the direction v).
struct WitnessData {
  Eigen::MatrixXd x, v;
};

// Certifies sup_{X in set} ||J_layer(X)||. Throws std::invalid_argument on invalid options
// or a set that does not match the layer.
Certificate Certify(const AttentionLayer& layer, const InputSet& set, const CertifyOptions& opts,
                    const Provenance& provenance, WitnessData* witness = nullptr);

}  // namespace lipcert
