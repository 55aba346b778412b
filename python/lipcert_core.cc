// lipcert._core: the C++ core as a Python extension module (nanobind). The Python package
// (python/lipcert/) checks and converts arguments and adds progress, Ctrl-C handling and the
// Certificate object; this file only exposes the C++ types and calls:
//
//   Layer        one AttentionLayer (from arrays or a checkpoint) with its provenance,
//                its float64 forward pass and a writer in the native safetensors naming
//   Job          a prepared certify or search job (certify/pipeline.h PrepareJob, as the
//                CLI builds it), run with the GIL released, stoppable from another thread
//   Certificate  the C++ Certificate: its bounds, witness arrays, ToJson and Summary
//   run_sweep, render_report   reports/sweep.h and reports/report.h
//
// User errors (InputError, OptionError, std::invalid_argument) become ValueError with the
// C++ message, which names the file and the field.
#include <nanobind/eigen/dense.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "certify/certificate.h"
#include "certify/pipeline.h"
#include "certify/run_control.h"
#include "certify/search.h"
#include "models/centre.h"
#include "models/errors.h"
#include "models/forward.h"
#include "models/loader.h"
#include "models/npy.h"
#include "models/safetensors.h"
#include "models/sha256.h"
#include "reports/report.h"
#include "reports/sweep.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace lipcert::python {
namespace {

using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// ---- Layer ----

// One attention layer and where it came from, as a LoadedModel of exactly one layer (the
// form PrepareJob takes, so that a Python certificate is built as the CLI's).
struct Layer {
  LoadedModel model;
  std::string note;  // set when attention_only was asked of a layer without LayerNorm

  const AttentionLayer& L() const { return model.layers[0]; }
};

// The layer in the native naming (models/loader.h): tensors and metadata. Biases and
// LayerNorms only when present; an l2 layer's tied key is not stored.
void NativeTensors(const AttentionLayer& L, std::map<std::string, Tensor>* tensors,
                   std::map<std::string, std::string>* metadata) {
  auto number = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  auto& t = *tensors;
  t["q.weight"] = MatrixTensor(L.wq);
  if (L.kind == AttentionKind::kDot) t["k.weight"] = MatrixTensor(L.wk);
  t["v.weight"] = MatrixTensor(L.wv);
  t["o.weight"] = MatrixTensor(L.wo);
  const std::pair<const char*, const Eigen::VectorXd*> biases[] = {
      {"q.bias", &L.bq}, {"k.bias", &L.bk}, {"v.bias", &L.bv}, {"o.bias", &L.bo}};
  for (const auto& [name, b] : biases)
    if (b->size()) t[name] = VectorTensor(*b);
  auto& m = *metadata;
  m["kind"] = AttentionKindToString(L.kind);
  m["heads"] = std::to_string(L.heads);
  m["causal"] = L.causal ? "true" : "false";
  m["head_dim_qk"] = std::to_string(L.head_dim_qk);
  m["head_dim_v"] = std::to_string(L.head_dim_v);
  if (L.layer_norm) {
    t["ln.weight"] = VectorTensor(L.layer_norm->gamma);
    t["ln.bias"] = VectorTensor(L.layer_norm->beta);
    m["ln_eps"] = number(L.layer_norm->eps);
  }
  if (L.post_layer_norm) {
    t["post_ln.weight"] = VectorTensor(L.post_layer_norm->gamma);
    t["post_ln.bias"] = VectorTensor(L.post_layer_norm->beta);
    m["post_ln_eps"] = number(L.post_layer_norm->eps);
  }
}

std::string NativeBytes(const AttentionLayer& L) {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  NativeTensors(L, &tensors, &metadata);
  return EncodeSafetensors(tensors, metadata);
}

Eigen::VectorXd VectorOr(const std::optional<Eigen::VectorXd>& v) { return v ? *v : Eigen::VectorXd(); }

std::optional<LayerNormParams> LayerNormOf(const std::optional<Eigen::VectorXd>& gamma,
                                           const std::optional<Eigen::VectorXd>& beta, double eps,
                                           const char* field) {
  if (!gamma && !beta) return std::nullopt;
  if (!gamma || !beta) throw OptionError(std::string(field) + ": give both gamma and beta");
  return LayerNormParams{*gamma, *beta, eps};
}

// The layer from float64 arrays (the Python side converts and checks dtypes). Its sha256
// is that of its native encoding, so that Layer.save's file has the same fingerprint.
Layer FromArrays(const std::string& kind, int heads, const RowMatrix& wq, const std::optional<RowMatrix>& wk,
                 const RowMatrix& wv, const RowMatrix& wo, const std::optional<Eigen::VectorXd>& bq,
                 const std::optional<Eigen::VectorXd>& bk, const std::optional<Eigen::VectorXd>& bv,
                 const std::optional<Eigen::VectorXd>& bo, bool causal,
                 const std::optional<Eigen::VectorXd>& ln_gamma, const std::optional<Eigen::VectorXd>& ln_beta,
                 double ln_eps, const std::optional<Eigen::VectorXd>& post_ln_gamma,
                 const std::optional<Eigen::VectorXd>& post_ln_beta, double post_ln_eps,
                 const std::map<std::string, std::string>& names, const std::string& source, int layer_index) {
  AttentionLayer L;
  if (!StringToAttentionKind(kind, &L.kind)) throw OptionError("kind: expected \"dot\" or \"l2\", got '" + kind + "'");
  if (heads < 1) throw OptionError("heads: must be >= 1, got " + std::to_string(heads));
  if (wq.rows() % heads != 0)
    throw OptionError("heads: wq has " + std::to_string(wq.rows()) + " rows, not a multiple of heads = " +
                      std::to_string(heads));
  if (wv.rows() % heads != 0)
    throw OptionError("heads: wv has " + std::to_string(wv.rows()) + " rows, not a multiple of heads = " +
                      std::to_string(heads));
  L.heads = heads;
  L.d_model = int(wq.cols());
  L.head_dim_qk = int(wq.rows() / heads);
  L.head_dim_v = int(wv.rows() / heads);
  L.causal = causal;
  L.wq = wq;
  if (wk) {
    L.wk = *wk;
  } else if (L.kind == AttentionKind::kL2) {
    L.wk = L.wq;  // tied
  } else {
    throw OptionError("wk: dot attention needs wk (only l2 ties it to wq)");
  }
  if (L.kind == AttentionKind::kL2 && wk && (wk->rows() != wq.rows() || wk->cols() != wq.cols() || L.wk != L.wq))
    throw OptionError("wk: l2 attention ties keys to queries; wk must equal wq (or be None)");
  L.wv = wv;
  L.wo = wo;
  L.bq = VectorOr(bq);
  L.bk = VectorOr(bk);
  L.bv = VectorOr(bv);
  L.bo = VectorOr(bo);
  L.layer_norm = LayerNormOf(ln_gamma, ln_beta, ln_eps, "layer_norm");
  L.post_layer_norm = LayerNormOf(post_ln_gamma, post_ln_beta, post_ln_eps, "post_layer_norm");
  if (const std::string e = ValidateLayer(L); !e.empty()) throw OptionError(e);
  L.tensor_names = names;
  Layer out;
  out.model.path = source;
  out.model.preset = "arrays";
  out.model.sha256 = Sha256Hex(NativeBytes(L));
  out.model.layers.push_back(std::move(L));
  out.model.layer_indices.push_back(layer_index);
  return out;
}

Layer FromCheckpoint(const std::string& path, const std::string& preset, int layer, int heads, bool attention_only) {
  LoadOptions o;
  o.preset = preset;
  o.layer = layer;
  o.heads = heads;
  LoadedModel all = LoadModel(path, o);
  const int i = SelectLayer(all, layer);
  Layer out;
  out.model.path = all.path;
  out.model.preset = all.preset;
  out.model.sha256 = all.sha256;
  out.model.layers.push_back(std::move(all.layers[i]));
  out.model.layer_indices.push_back(all.layer_indices[i]);
  if (attention_only) out.note = DropLayerNormSublayer(&out.model.layers[0]);
  return out;
}

void SaveLayer(const Layer& layer, const std::string& path) {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  NativeTensors(layer.L(), &tensors, &metadata);
  WriteSafetensors(path, tensors, metadata);
}

Eigen::MatrixXd LayerForward(const Layer& layer, const Eigen::MatrixXd& x) {
  const AttentionLayer& L = layer.L();
  if (x.cols() != L.d_model || x.rows() < 1)
    throw OptionError("x: expected (N, " + std::to_string(L.d_model) + ") with N >= 1, got (" +
                      std::to_string(x.rows()) + ", " + std::to_string(x.cols()) + ")");
  nb::gil_scoped_release release;
  return lipcert::Forward<double>(L, x);
}

std::optional<std::tuple<Eigen::VectorXd, Eigen::VectorXd, double>> LayerNormTuple(
    const std::optional<LayerNormParams>& ln) {
  if (!ln) return std::nullopt;
  return std::make_tuple(ln->gamma, ln->beta, ln->eps);
}

std::optional<Eigen::VectorXd> OptionalVector(const Eigen::VectorXd& v) {
  if (v.size() == 0) return std::nullopt;
  return v;
}

// ---- Job: one certify or search job ----

struct JobSettings {
  std::string set = "ball", norm = "2", centre_name = "array";
  double radius = -1, relative_radius = -1;
  double time_limit = 30, tolerance = 0.01, search_share = 0.3;
  uint64_t seed = 1;
  int threads = 0;
  std::string budget;  // "" or STEPS[,ROUNDS], read by the CLI's ParseWorkBudget
  bool probabilistic = true;
  double probabilistic_failure = 1e-6;
  uint64_t probabilistic_seed = 0;
  int deflation_vectors = 1000;
  std::vector<std::string> notes;  // added to the certificate (e.g. dtype conversions)
};

struct Progress {
  int improvements = 0;
  double upper = kInf, lower = 0;
  std::string status;
};

class Job {
 public:
  Job(const Layer& layer, const Eigen::MatrixXd& centre, const JobSettings& s) {
    CertifyRequest r;
    if (!StringToSetKind(s.set, &r.set.kind))
      throw OptionError("set: expected \"ball\", \"tokens\" or \"box\", got '" + s.set + "'");
    if (!StringToNormKind(s.norm, &r.options.norm))
      throw OptionError("norm: expected 2 or \"inf\", got '" + s.norm + "'");
    r.set.centre = s.centre_name;
    r.set.radius = s.radius;
    r.set.relative_radius = s.relative_radius;
    r.options.time_limit_s = s.time_limit;
    r.options.tolerance = s.tolerance;
    r.options.search.share = s.search_share;
    r.options.seed = s.seed;
    r.options.threads = s.threads;
    r.options.progress = false;  // the Python side shows progress
    r.options.probabilistic.enabled = s.probabilistic;
    r.options.probabilistic.failure_probability = s.probabilistic_failure;
    r.options.probabilistic.seed = s.probabilistic_seed;
    r.options.engines.deflation_vectors = s.deflation_vectors;
    if (!s.budget.empty())
      if (const std::string e = ParseWorkBudget(s.budget, &r.options.budget); !e.empty()) throw OptionError(e);
    r.options.stop = &stop_;
    job_ = PrepareJob(r, layer.model, centre);
    if (!layer.note.empty()) job_.note = layer.note;
    notes_ = s.notes;
  }

  Certificate Certify() {
    PreparedJob job = job_;
    job.options.on_improvement = [this](const Certificate& c) {
      std::lock_guard<std::mutex> lock(mu_);
      latest_ = c;
      for (const std::string& n : notes_) latest_->notes.push_back(n);
      progress_.improvements++;
      progress_.upper = c.upper_bound.value();
      progress_.lower = c.lower_bound.value();
      progress_.status = CertificateStatusToString(c.status);
    };
    nb::gil_scoped_release release;
    Certificate c = RunJob(job).certificate;
    for (const std::string& n : notes_) c.notes.push_back(n);
    std::lock_guard<std::mutex> lock(mu_);
    progress_.upper = c.upper_bound.value();
    progress_.lower = c.lower_bound.value();
    progress_.status = CertificateStatusToString(c.status);
    return c;
  }

  SearchResult Search() {
    nb::gil_scoped_release release;
    return SearchLowerBound(job_.Layer(), job_.set, SearchOnlyOptions(job_));
  }

  // Asks the run to end at its next check (CertifyOptions::stop).
  void RequestStop() { stop_.store(true); }

  Progress GetProgress() {
    std::lock_guard<std::mutex> lock(mu_);
    return progress_;
  }
  // The last improved certificate (status in_progress), if any.
  std::optional<Certificate> Latest() {
    std::lock_guard<std::mutex> lock(mu_);
    return latest_;
  }
  double Radius() const { return job_.set.radius; }
  double TimeLimit() const { return job_.options.time_limit_s; }

 private:
  PreparedJob job_;
  std::vector<std::string> notes_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::optional<Certificate> latest_;
  Progress progress_;
};

// ---- sweeps and reports ----

std::map<std::string, std::string> RunSweepPy(const reports::SweepOptions& in, const std::string& set,
                                              const std::string& norm, const std::string& budget) {
  reports::SweepOptions o = in;
  if (!budget.empty())
    if (const std::string e = ParseWorkBudget(budget, &o.budget); !e.empty()) throw OptionError(e);
  if (!StringToSetKind(set, &o.set)) throw OptionError("set: expected \"ball\", \"tokens\" or \"box\", got '" + set + "'");
  if (!StringToNormKind(norm, &o.norm)) throw OptionError("norm: expected 2 or \"inf\", got '" + norm + "'");
  reports::SweepSummary s;
  {
    nb::gil_scoped_release release;
    s = reports::RunSweep(o);
  }
  return {{"json", s.json_path},
          {"csv", s.csv_path},
          {"html", s.html_path},
          {"markdown", s.markdown_path},
          {"total", std::to_string(s.total)},
          {"computed", std::to_string(s.computed)},
          {"resumed", std::to_string(s.resumed)},
          {"seconds", std::to_string(s.seconds)}};
}

// Renders files (read and checked as `lipcert report` does) and documents already in
// memory (name, JSON text) into HTML and, when markdown is given, a Markdown twin.
std::string RenderReport(const std::vector<std::string>& paths,
                         const std::vector<std::pair<std::string, std::string>>& documents,
                         const std::string& markdown, const reports::ReportOptions& options) {
  std::vector<reports::ReportInput> inputs = reports::ReadReportInputs(paths);
  for (const auto& [name, text] : documents) {
    reports::ReportInput in{name, nlohmann::json::parse(text)};
    reports::CheckReportInput(in);
    inputs.push_back(std::move(in));
  }
  nb::gil_scoped_release release;
  const std::vector<reports::Section> sections = reports::BuildSections(inputs, options);
  if (!markdown.empty()) {
    const std::filesystem::path md(markdown);
    const std::string dir = md.parent_path().empty() ? "." : md.parent_path().string();
    WriteFileAtomic(markdown, reports::RenderMarkdown(sections, options, dir, ""));
  }
  return reports::RenderHtml(sections, options);
}

}  // namespace
}  // namespace lipcert::python

NB_MODULE(_core, m) {
  using namespace lipcert;
  using namespace lipcert::python;
  m.doc() = "lipcert's C++ core (use the lipcert package, not this module)";
  // After a second Ctrl-C a run may still be ending in its worker thread when the
  // interpreter exits, holding its objects: not a leak worth a warning.
  nb::set_leak_warnings(false);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const InputError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const OptionError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const nlohmann::json::exception& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  nb::class_<Layer>(m, "Layer")
      .def_static("from_arrays", &FromArrays, "kind"_a, "heads"_a, "wq"_a, "wk"_a.none(), "wv"_a, "wo"_a,
                  "bq"_a.none(), "bk"_a.none(), "bv"_a.none(), "bo"_a.none(), "causal"_a, "ln_gamma"_a.none(),
                  "ln_beta"_a.none(), "ln_eps"_a, "post_ln_gamma"_a.none(), "post_ln_beta"_a.none(),
                  "post_ln_eps"_a, "names"_a, "source"_a, "layer_index"_a)
      .def_static("from_checkpoint", &FromCheckpoint, "path"_a, "preset"_a, "layer"_a, "heads"_a,
                  "attention_only"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("forward", &LayerForward, "x"_a)
      .def("save", &SaveLayer, "path"_a)
      .def_prop_ro("kind", [](const Layer& l) { return std::string(AttentionKindToString(l.L().kind)); })
      .def_prop_ro("d_model", [](const Layer& l) { return l.L().d_model; })
      .def_prop_ro("heads", [](const Layer& l) { return l.L().heads; })
      .def_prop_ro("head_dim_qk", [](const Layer& l) { return l.L().head_dim_qk; })
      .def_prop_ro("head_dim_v", [](const Layer& l) { return l.L().head_dim_v; })
      .def_prop_ro("causal", [](const Layer& l) { return l.L().causal; })
      .def_prop_ro("wq", [](const Layer& l) { return Eigen::MatrixXd(l.L().wq); })
      .def_prop_ro("wk", [](const Layer& l) { return Eigen::MatrixXd(l.L().wk); })
      .def_prop_ro("wv", [](const Layer& l) { return Eigen::MatrixXd(l.L().wv); })
      .def_prop_ro("wo", [](const Layer& l) { return Eigen::MatrixXd(l.L().wo); })
      .def_prop_ro("bq", [](const Layer& l) { return OptionalVector(l.L().bq); })
      .def_prop_ro("bk", [](const Layer& l) { return OptionalVector(l.L().bk); })
      .def_prop_ro("bv", [](const Layer& l) { return OptionalVector(l.L().bv); })
      .def_prop_ro("bo", [](const Layer& l) { return OptionalVector(l.L().bo); })
      .def_prop_ro("layer_norm", [](const Layer& l) { return LayerNormTuple(l.L().layer_norm); })
      .def_prop_ro("post_layer_norm", [](const Layer& l) { return LayerNormTuple(l.L().post_layer_norm); })
      .def_prop_ro("tensor_names", [](const Layer& l) { return l.L().tensor_names; })
      .def_prop_ro("path", [](const Layer& l) { return l.model.path; })
      .def_prop_ro("preset", [](const Layer& l) { return l.model.preset; })
      .def_prop_ro("sha256", [](const Layer& l) { return l.model.sha256; })
      .def_prop_ro("layer_index", [](const Layer& l) { return l.model.layer_indices[0]; })
      .def_prop_ro("note", [](const Layer& l) { return l.note; });

  nb::class_<Certificate>(m, "Certificate")
      .def_prop_ro("upper_bound", [](const Certificate& c) { return c.upper_bound.value(); })
      .def_prop_ro("lower_bound", [](const Certificate& c) { return c.lower_bound.value(); })
      .def_prop_ro("gap", &Certificate::gap)
      .def_prop_ro("status", [](const Certificate& c) { return std::string(CertificateStatusToString(c.status)); })
      .def_prop_ro("witness_x", [](const Certificate& c) { return Eigen::MatrixXd(c.witness.x); })
      .def_prop_ro("witness_v", [](const Certificate& c) { return Eigen::MatrixXd(c.witness.v); })
      .def_prop_ro("elapsed_s", [](const Certificate& c) { return c.elapsed_s; })
      .def("to_json", [](const Certificate& c, int indent) { return ToJson(c).dump(indent); }, "indent"_a = 2)
      .def("summary", [](const Certificate& c) { return Summary(c); });

  nb::class_<JobSettings>(m, "RunSettings")
      .def(nb::init<>())
      .def_rw("set", &JobSettings::set)
      .def_rw("norm", &JobSettings::norm)
      .def_rw("centre_name", &JobSettings::centre_name)
      .def_rw("radius", &JobSettings::radius)
      .def_rw("relative_radius", &JobSettings::relative_radius)
      .def_rw("time_limit", &JobSettings::time_limit)
      .def_rw("tolerance", &JobSettings::tolerance)
      .def_rw("search_share", &JobSettings::search_share)
      .def_rw("seed", &JobSettings::seed)
      .def_rw("threads", &JobSettings::threads)
      .def_rw("budget", &JobSettings::budget)
      .def_rw("probabilistic", &JobSettings::probabilistic)
      .def_rw("probabilistic_failure", &JobSettings::probabilistic_failure)
      .def_rw("probabilistic_seed", &JobSettings::probabilistic_seed)
      .def_rw("deflation_vectors", &JobSettings::deflation_vectors)
      .def_rw("notes", &JobSettings::notes);

  nb::class_<SearchResult>(m, "SearchResult")
      .def_prop_ro("lower_bound", [](const SearchResult& r) { return r.best.lower_bound.value(); })
      .def_prop_ro("value", [](const SearchResult& r) { return r.best.value; })
      .def_prop_ro("origin", [](const SearchResult& r) { return r.best.origin; })
      .def_prop_ro("witness_x", [](const SearchResult& r) { return Eigen::MatrixXd(r.best.x); })
      .def_prop_ro("witness_v", [](const SearchResult& r) { return Eigen::MatrixXd(r.best.v); })
      .def_ro("points_evaluated", &SearchResult::points_evaluated)
      .def_ro("ascent_steps", &SearchResult::ascent_steps)
      .def_ro("rounds", &SearchResult::rounds)
      .def_ro("elapsed_s", &SearchResult::elapsed_s)
      .def_ro("best_by_origin", &SearchResult::best_by_origin);

  nb::class_<Job>(m, "Run")
      .def(nb::init<const Layer&, const Eigen::MatrixXd&, const JobSettings&>(), "layer"_a, "centre"_a,
           "settings"_a)
      .def("certify", &Job::Certify)
      .def("search", &Job::Search)
      .def("request_stop", &Job::RequestStop)
      .def("progress",
           [](Job& r) {
             const Progress p = r.GetProgress();
             return std::make_tuple(p.improvements, p.upper, p.lower, p.status);
           })
      .def("latest", &Job::Latest)
      .def_prop_ro("radius", &Job::Radius)
      .def_prop_ro("time_limit", &Job::TimeLimit)
      ;

  nb::class_<reports::SweepOptions>(m, "SweepOptions")
      .def(nb::init<>())
      .def_rw("models", &reports::SweepOptions::models)
      .def_rw("centres", &reports::SweepOptions::centres)
      .def_rw("preset", &reports::SweepOptions::preset)
      .def_rw("layer", &reports::SweepOptions::layer)
      .def_rw("heads", &reports::SweepOptions::heads)
      .def_rw("radii", &reports::SweepOptions::radii)
      .def_rw("relative_radii", &reports::SweepOptions::relative_radii)
      .def_rw("tokens", &reports::SweepOptions::tokens)
      .def_rw("tokens_list", &reports::SweepOptions::tokens_list)
      .def_rw("attention_only", &reports::SweepOptions::attention_only)
      .def_rw("time_limit_per_point", &reports::SweepOptions::time_limit_per_point_s)
      .def_rw("threads", &reports::SweepOptions::threads)
      .def_rw("out_dir", &reports::SweepOptions::out_dir)
      .def_rw("command_line", &reports::SweepOptions::command_line)
      .def_rw("progress", &reports::SweepOptions::progress)
      .def_rw("validate", &reports::SweepOptions::validate)
      .def_rw("validation_time_limit", &reports::SweepOptions::validation_time_limit_s);
  m.def("run_sweep", &RunSweepPy, "options"_a, "set"_a, "norm"_a, "budget"_a);

  nb::class_<reports::ReportOptions>(m, "ReportOptions")
      .def(nb::init<>())
      .def_rw("title", &reports::ReportOptions::title)
      .def_rw("command_line", &reports::ReportOptions::command_line)
      .def_rw("validate", &reports::ReportOptions::validate)
      .def_rw("validation_time_limit", &reports::ReportOptions::validation_time_limit_s)
      .def_rw("threads", &reports::ReportOptions::threads);
  m.def("render_report", &RenderReport, "paths"_a, "documents"_a, "markdown"_a, "options"_a);

  m.def("load_centre", &LoadCentre, "spec"_a, "tokens"_a, "d_model"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def("write_npy", [](const std::string& path, const Eigen::MatrixXd& a) { WriteNpy(path, MatrixTensor(a)); },
        "path"_a, "array"_a);
  m.def("write_file_atomic", &WriteFileAtomic, "path"_a, "text"_a);
  m.def("known_presets", &KnownPresets);
}
