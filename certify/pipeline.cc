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

std::string DropLayerNormSublayer(AttentionLayer* layer) {
  if (!layer->residual() && !layer->post_ln())
    return "attention_only: the layer has no LayerNorm sublayer; certifying the layer itself";
  layer->layer_norm.reset();  // MHA alone for both LayerNorm placements
  layer->post_layer_norm.reset();
  return "";
}

namespace {

// PrepareJob with the centre read from request.set.centre (centre == nullptr) or given.
PreparedJob Prepare(const CertifyRequest& r, LoadedModel model, const Eigen::MatrixXd* centre) {
  if ((r.set.radius >= 0) == (r.set.relative_radius >= 0))
    throw OptionError("radius: give exactly one of radius and relative radius (>= 0)");
  if (const std::string e = ValidateCertifyOptions(r.options); !e.empty()) throw OptionError(e);
  PreparedJob job;
  job.model = std::move(model);
  job.layer = SelectLayer(job.model, r.model.layer);
  if (r.model.attention_only) job.note = DropLayerNormSublayer(&job.model.layers[job.layer]);
  const AttentionLayer& L = job.Layer();
  job.set.kind = r.set.kind;
  if (centre) {
    if (centre->rows() < 1 || centre->cols() != L.d_model)
      throw OptionError("centre: expected (N, " + std::to_string(L.d_model) + ") with N >= 1, got (" +
                        std::to_string(centre->rows()) + ", " + std::to_string(centre->cols()) + ")");
    if (!centre->allFinite()) throw OptionError("centre: holds NaN or infinity");
    job.set.center = *centre;
  } else {
    job.set.center = LoadCentre(r.set.centre, r.set.tokens, L.d_model);
  }
  job.set.radius = r.set.radius >= 0 ? r.set.radius : r.set.relative_radius * job.set.center.norm();
  if (!std::isfinite(job.set.radius)) throw OptionError("radius: must be finite");
  job.options = r.options;
  job.provenance = {job.model.path, job.model.sha256, job.model.preset, job.model.layer_indices[job.layer],
                    r.set.centre};
  return job;
}

}  // namespace

PreparedJob PrepareJob(const CertifyRequest& r, LoadedModel model) { return Prepare(r, std::move(model), nullptr); }

PreparedJob PrepareJob(const CertifyRequest& r, LoadedModel model, const Eigen::MatrixXd& centre) {
  return Prepare(r, std::move(model), &centre);
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

SearchOptions SearchOnlyOptions(const PreparedJob& job) {
  SearchOptions so;
  so.norm = job.options.norm;
  so.seed = job.options.seed;
  so.threads = job.options.threads;
  so.time_limit_s = job.options.time_limit_s;
  so.verbose = job.options.progress;
  return so;
}

CertifyOutcome CertifyCheckpoint(const CertifyRequest& request) { return RunJob(PrepareJob(request)); }

}  // namespace lipcert
