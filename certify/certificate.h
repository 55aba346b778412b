// The certificate: what lipcert proves about one layer over one input set, and how.
// Serialised as JSON with schema "lipcert.certificate/1" (docs/certificate.md).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "certify/engine_bound.h"
#include "certify/input_set.h"
#include "certify/probable_norm.h"
#include "certify/run_control.h"
#include "certify/calibration.h"
#include "certify/witness.h"
#include "interval/rounding.h"
#include "models/attention_layer.h"

namespace lipcert {

enum class CertificateStatus {
  kTolerance,  // upper <= (1 + tolerance) lower: done
  kTimeLimit,  // stopped by the time limit with open pieces left
  kExhausted,  // every piece bounded, tolerance not reached (engines at their limit)
  kInProgress, // an intermediate (anytime) certificate: the run has not ended
  kInterrupted,  // stopped by CertifyOptions::stop: the certificate so far (every bound in it holds)
  kWorkBudget,   // stopped by CertifyOptions::budget (work, not wall clock) with open pieces left
};
const char* CertificateStatusToString(CertificateStatus s);
// The status whose ToString is `name`; false when none is.
bool StringToCertificateStatus(const std::string& name, CertificateStatus* s);

// Where the numbers came from (everything a reader needs to reproduce the run).
struct Provenance {
  std::string model_path;
  std::string model_sha256;
  std::string preset;
  int layer_index = 0;        // index of the layer in the checkpoint
  std::string centre_source;  // "zero", "file.npy", "file.safetensors:x0"
};

// The engines a certificate names; ToString is the JSON's name.
enum class EngineId {
  kClosedFormCastin,   // "closed_form/castin"
  kClosedFormKim,      // "closed_form/kim"
  kClosedFormKimInf,   // "closed_form/kim_inf"
  kBlockNorm,          // "block_norm"
  kCentred,            // "centred" (branch and bound's pieces)
  kCentreNorm,         // "centre_norm"
  kBranchAndBound,     // "branch_and_bound"
  kPostLnComposition,  // "post_ln_composition"
  kPostLnCentre,       // "post_ln_centre"
  kPostLnVariation,    // "post_ln_variation"
  kTaylor,             // "taylor" (certify/taylor.h)
};
const char* EngineIdToString(EngineId id);
// The id whose ToString is `name`; false when none is.
bool StringToEngineId(const std::string& name, EngineId* id);

struct EngineResult {
  EngineId id = EngineId::kBlockNorm;
  UpperBound upper{kInf};     // certified (+inf when the engine does not apply)
  double seconds = 0;
  std::string note;           // why it did not apply, or pieces explored
  bool applied = true;        // false: refused (norm, size), `note` says why
  // The summands of `upper` (certify/engine_bound.h): which term dominates.
  std::vector<BoundTerm> terms;
  // The centre_norm engine's split of `upper` (certify/engine_bound.h); unset otherwise.
  std::optional<CentreNormTerms> centre_norm;
  const char* name() const { return EngineIdToString(id); }
};

// For the sublayer X + g(X): certified invertible on the set when Lip(g) < 1.
struct Invertibility {
  UpperBound lip_g_upper{kInf};   // certified upper bound on Lip(g | S)
  bool certified = false;         // lip_g_upper < 1
  LowerBound bi_lipschitz_lower{0};  // 1 - lip_g_upper when certified
  UpperBound bi_lipschitz_upper{kInf};  // min(1 + lip_g_upper, upper_bound)
};

// Beside the certificate, never as it: sup_S ||J||_2 <= value with probability at least
// 1 - failure_probability over the random start of the Lanczos run (certify/probable_norm.h).
struct ProbabilisticBound {
  double value = kInf;
  double failure_probability = 1;
  ProbableUpperBound centre;  // ||J(X0)||_2, randomized Lanczos
  std::string route;          // how value was formed
};

// What a rerun needs besides the model and the set (the JSON's "run"): with the same
// budget, seeds and build, a run under a work budget repeats bit for bit; under a time
// limit, the calibration says how this machine read against the time model's reference.
struct RunSettings {
  double time_limit_s = 0;          // not read under a budget
  WorkBudget budget;                // steps 0: none
  double tolerance = 0;
  uint64_t seed = 0;                // the search's
  int threads = 0;                  // worker threads the stages used
  std::optional<MachineCalibration> calibration;  // the time model's (none under a budget)
};

struct Certificate {
  Provenance provenance;
  RunSettings run;
  // The layer.
  AttentionKind kind = AttentionKind::kDot;
  int d_model = 0, heads = 0, head_dim_qk = 0, head_dim_v = 0, tokens = 0;
  bool causal = false, layer_norm = false, biases = false;
  bool post_layer_norm = false;  // the post-LN (BERT) sublayer LN(X + MHA(X)); layer_norm is the pre-LN one
  // The set and the norm.
  SetKind set = SetKind::kBall;
  double radius = 0;
  double centre_frobenius_norm = 0;
  NormKind norm = NormKind::kL2;
  // The result.
  UpperBound upper_bound{kInf};   // certified: sup_S ||J|| <= upper_bound
  LowerBound lower_bound{0};      // witnessed and rigorously evaluated
  std::vector<EngineResult> engines;
  Witness witness;           // of lower_bound (the point and direction too)
  std::optional<Invertibility> invertibility;
  // Not certified: with probability >= 1 - failure_probability (norm 2; see the struct).
  std::optional<ProbabilisticBound> probabilistic;
  std::string rounding_model, exp_backend;
  // The floating-point environment (rounding mode, FTZ/DAZ) was not the rounding model's
  // when the run started or in a worker, and was restored before any certified arithmetic
  // (interval/fp_environment.h). The numbers stand either way; this says it happened.
  bool fp_environment_repaired = false;
  CertificateStatus status = CertificateStatus::kTimeLimit;
  double elapsed_s = 0;
  int pieces_explored = 0, open_pieces = 0;
  // What a reader should know about how the request was read (e.g. an option that did
  // not apply to this layer); empty when nothing.
  std::vector<std::string> notes;

  // upper / lower (+inf when the lower bound is 0).
  double gap() const;
  // The engine whose bound is the certificate's (nullptr when none is finite).
  const EngineResult* Winner() const;
};

nlohmann::json ToJson(const Certificate& c);
// A short human summary (a few lines).
std::string Summary(const Certificate& c);
// Writes `text` to `path` atomically (temporary file in the same folder, then rename):
// a reader never sees a partial file. Throws std::runtime_error on failure.
void WriteFileAtomic(const std::string& path, const std::string& text);

}  // namespace lipcert
