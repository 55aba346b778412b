#include "certify/pipeline.h"

#include <cmath>

#include "models/centre.h"
#include "models/errors.h"

namespace lipcert {

int SelectLayer(const LoadedModel& model, int layer) {
  if (model.layers.size() == 1) return 0;  // the loader read only the layer asked for
  if (layer < 0) {
    throw OptionError("layer: " + model.path + " holds " + std::to_string(model.layers.size()) +
                      " attention layers; choose one");
  }
  for (size_t i = 0; i < model.layer_indices.size(); ++i)
    if (model.layer_indices[i] == layer) return int(i);
  throw OptionError("layer: " + model.path + " has no attention layer " + std::to_string(layer));
}

PreparedJob PrepareJob(const CertifyRequest& r) {
  LoadOptions o;
  o.preset = r.model.preset;
  o.layer = r.model.layer;
  o.heads = r.model.heads;
  return PrepareJob(r, LoadModel(r.model.path, o));
}

PreparedJob PrepareJob(const CertifyRequest& r, LoadedModel model) {
  if ((r.set.radius >= 0) == (r.set.relative_radius >= 0))
    throw OptionError("radius: give exactly one of radius and relative radius (>= 0)");
  if (const std::string e = ValidateCertifyOptions(r.options); !e.empty()) throw OptionError(e);
  PreparedJob job;
  job.model = std::move(model);
  job.layer = SelectLayer(job.model, r.model.layer);
  if (r.model.attention_only) {
    AttentionLayer& sel = job.model.layers[job.layer];
    if (sel.residual() || sel.post_ln()) {  // MHA alone for both LayerNorm placements
      sel.layer_norm.reset();
      sel.post_layer_norm.reset();
    } else
      job.note = "attention_only: the layer has no LayerNorm sublayer; certifying the layer itself";
  }
  const AttentionLayer& L = job.Layer();
  job.set.kind = r.set.kind;
  job.set.center = LoadCentre(r.set.centre, r.set.tokens, L.d_model);
  job.set.radius = r.set.radius >= 0 ? r.set.radius : r.set.relative_radius * job.set.center.norm();
  if (!std::isfinite(job.set.radius)) throw OptionError("radius: must be finite");
  job.options = r.options;
  job.provenance = {job.model.path, job.model.sha256, job.model.preset, job.model.layer_indices[job.layer],
                    r.set.centre};
  return job;
}

CertifyOutcome RunJob(const PreparedJob& job) {
  CertifyOutcome out;
  CertifyOptions options = job.options;
  if (!job.note.empty() && options.on_improvement) {
    // Intermediate certificates carry the note too.
    options.on_improvement = [&job, inner = options.on_improvement](const Certificate& c) {
      Certificate with_note = c;
      with_note.notes.push_back(job.note);
      inner(with_note);
    };
  }
  out.certificate = Certify(job.Layer(), job.set, options, job.provenance);
  if (!job.note.empty()) out.certificate.notes.push_back(job.note);
  return out;
}

CertifyOutcome CertifyCheckpoint(const CertifyRequest& request) { return RunJob(PrepareJob(request)); }

}  // namespace lipcert
