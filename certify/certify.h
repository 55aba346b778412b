// lipcert's certification, in one function a reader can follow (Certify below):
//   closed-form baselines -> structured bound engines on the whole set -> witnessed lower
//   bound (search, with the time the later stages cannot use) -> branch and bound ->
//   residual invertibility -> certificate.
// certify/pipeline.h puts loading and the input set in front of it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "certify/certificate.h"
#include "certify/run_control.h"
#include "certify/search.h"
#include "models/attention_layer.h"

namespace lipcert {

// The lower-bound search stage.
struct SearchStageOptions {
  double share = 0.3;           // the least share of the time limit the search gets (it also
                                // gets the time branch and bound cannot use)
  int max_rounds = 0;           // rounds of (candidates -> ascent); 0: until its time is up
  std::string IsValid() const;  // "" or a message naming the field
};

// The structured bound engines (block-norm, centred) on the whole set.
struct EngineStageOptions {
  int dense_limit = kDefaultDenseLimit;  // the largest N*D enclosed densely (certify/
                                // engine_bound.h): centre_norm certifies J(X0) with one dense
                                // certificate up to it (if its predicted time fits), token
                                // super-blocks above; 0: no centre_norm engine
  int deflation_vectors = 1000; // above dense_limit (no LayerNorm): deflate the super-blocks
                                // with up to this many Lanczos vectors, as many as the time
                                // left fits (not anytime; 0: off)
  std::string IsValid() const;
};

// Beside the certificate, never in it: a probabilistic bound (norm 2; certify/probable_norm.h).
struct ProbabilisticStageOptions {
  bool enabled = true;
  double share = 0.1;                 // of the time limit (taken from the bound engines')
  double failure_probability = 1e-6;  // the bound may fail for this share of random starts
  uint64_t seed = 0;                  // the random start's; 0: drawn from the OS (recorded)
  std::string IsValid() const;        // "" or a message naming the field
};

// Branch and bound with the time that is left.
struct BranchStageOptions {
  int max_pieces = 100000;      // pieces bounded, at most (a work budget)
  std::string IsValid() const;
};

struct CertifyOptions {
  NormKind norm = NormKind::kL2;
  double time_limit_s = 30;     // the whole run, wall clock; every stage checks it (not
                                // read when budget is enabled)
  // Work instead of the wall clock (certify/run_control.h): search rounds, branch-and-bound
  // pieces, and the engines' choices by size alone; the run repeats bit for bit. Its seeds
  // are fixed too (probabilistic.seed 0 becomes seed + 1). Status work_budget when the
  // pieces ran out before the tolerance.
  WorkBudget budget;
  // When it points to true, every stage ends at its next check as at the time limit, and
  // the certificate so far is returned with status interrupted (every bound in it holds).
  // Owned by the caller, who may set it from any thread (a signal handler, a Python
  // KeyboardInterrupt).
  const std::atomic<bool>* stop = nullptr;
  double tolerance = 0.01;      // stop when upper <= (1 + tolerance) * lower
  uint64_t seed = 1;            // the search's randomness
  int threads = 0;              // worker threads for every stage; 0: all cores
  bool progress = false;        // progress lines on stderr
  SearchStageOptions search;
  EngineStageOptions engines;
  BranchStageOptions branch_and_bound;
  ProbabilisticStageOptions probabilistic;
  // Called with every improved certificate, status in_progress (anytime: the CLI writes
  // it atomically, so a run killed at any moment leaves its best certificate so far).
  std::function<void(const Certificate&)> on_improvement;
  // "" when valid, else a message naming the bad field ("search.share: ...").
  std::string IsValid() const;
};

// Returns "" when valid, else a message naming the bad field (CertifyOptions::IsValid).
std::string ValidateCertifyOptions(const CertifyOptions& opts);

// Certifies sup_{X in set} ||J_layer(X)||; the certificate's witness holds X* and v. Throws std::invalid_argument on invalid options
// or a set that does not match the layer.
Certificate Certify(const AttentionLayer& layer, const InputSet& set, const CertifyOptions& opts,
                    const Provenance& provenance);

}  // namespace lipcert
