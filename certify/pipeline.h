// The certification pipeline behind one call, as the CLI, the sweeps, the audits and the
// tests use it:
//
//   CertifyRequest --PrepareJob--> PreparedJob --RunJob--> CertifyOutcome
//   (what to load)   load checkpoint, select      Certify(): closed forms, search,
//                    layer, read centre, build     structured engines, branch and
//                    the set, validate options     bound -> certificate + witness
//
// PrepareJob validates everything before any work or output: a bad file or field throws
// InputError (file and field named), a bad option OptionError (field named).
#pragma once

#include <string>

#include "certify/certify.h"
#include "models/loader.h"

namespace lipcert {

// Which layer of which checkpoint.
struct ModelSpec {
  std::string path;               // .safetensors file, or a folder holding model.safetensors
  std::string preset = "auto";    // tensor naming: auto, native, torch-mha, bert, gpt2
  int layer = -1;                 // checkpoint layer index; -1: the checkpoint's only layer
  int heads = 0;                  // heads when the checkpoint does not say (0: from the file)
  bool attention_only = false;    // certify MHA alone (drop the LayerNorm sublayer)
};

// The input set around a centre.
struct SetSpec {
  SetKind kind = SetKind::kBall;
  std::string centre;             // "zero", FILE.npy or FILE.safetensors[:TENSOR]
  int tokens = 0;                 // N, with centre "zero" (else taken from the file)
  double radius = -1;             // absolute radius R >= 0, or
  double relative_radius = -1;    // R as a fraction of ||X0||_F (exactly one of the two)
};

struct CertifyRequest {
  ModelSpec model;
  SetSpec set;
  CertifyOptions options;
};

// Everything a run needs, loaded and validated.
struct PreparedJob {
  LoadedModel model;
  int layer = 0;                  // index into model.layers
  InputSet set;
  CertifyOptions options;
  Provenance provenance;
  // Set when ModelSpec::attention_only was asked of a layer that has no LayerNorm
  // sublayer (the request is then the layer itself): says so instead of ignoring it.
  std::string note;
  const AttentionLayer& Layer() const { return model.layers[layer]; }
};

// The index into model.layers of checkpoint layer `layer` (-1: the only one). Throws
// OptionError naming the field when there is none or the choice is ambiguous.
int SelectLayer(const LoadedModel& model, int layer);

// Drops the LayerNorm sublayer of a pre-LN or post-LN layer (ModelSpec::attention_only):
// MHA alone remains. Returns "" when it did, else the note that the layer has none (the
// request is then the layer itself).
std::string DropLayerNormSublayer(AttentionLayer* layer);

// Loads the checkpoint and the centre and validates the request.
PreparedJob PrepareJob(const CertifyRequest& request);
// The same with a checkpoint already loaded (sweeps and audits certify many sets of one
// checkpoint); `model` must be LoadModel's result for request.model.
PreparedJob PrepareJob(const CertifyRequest& request, LoadedModel model);
// The same with the centre X0 in memory (the Python API): request.set.centre only names it
// in the provenance. `centre` must be (N, d_model) and finite (OptionError "centre: ...").
PreparedJob PrepareJob(const CertifyRequest& request, LoadedModel model, const Eigen::MatrixXd& centre);

struct CertifyOutcome {
  Certificate certificate;   // certificate.witness holds the witness X* and v
};

// Runs the engines on a prepared job.
CertifyOutcome RunJob(const PreparedJob& job);

// The options of the lower-bound search alone (`lipcert search`, lipcert.search): the job's
// norm, seed and threads, with the whole time limit.
SearchOptions SearchOnlyOptions(const PreparedJob& job);

// PrepareJob then RunJob: the whole pipeline in one call.
CertifyOutcome CertifyCheckpoint(const CertifyRequest& request);

}  // namespace lipcert
