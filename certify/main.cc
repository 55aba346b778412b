// lipcert command-line interface.
//
//   lipcert inspect MODEL [--preset P] [--layer I] [--heads H] [--json]
//   lipcert certify --model M [--preset P] [--layer I] --center SPEC [--tokens N]
//                   --set ball|tokens|box --radius R [--norm 2|inf] [--time-limit S]
//                   [--json OUT.json] [--witness OUT.safetensors]
//   lipcert search  (the options of certify): the witnessed lower bound alone, for
//                   --time-limit seconds
//   lipcert zoo     [--dir models/zoo] [--time-limit S]   (the bundled default models)
//   lipcert bench   --n N --d D --heads H --batch B [--kind dot|l2] [--device cpu|cuda]
//                   [--dtype f32|f64] [--threads T]
//
// Exit status: 0 success, 2 bad input (one line naming the file and the field, no output
// file written), 1 internal error. Nothing below main() exits.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "certify/certify.h"
#include "certify/search.h"
#include "kernels/bench.h"
#include "models/centre.h"
#include "models/errors.h"
#include "models/inspect.h"
#include "models/loader.h"
#include "models/safetensors.h"

namespace lipcert {
namespace {

// A user error in an option (not in a file): reported like InputError, exit 2.
struct OptionError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ModelArgs {
  std::string path, preset = "auto";
  int layer = -1, heads = 0;
};

void AddModelArgs(CLI::App* app, ModelArgs* m, bool positional) {
  if (positional)
    app->add_option("model", m->path, "safetensors checkpoint (or a folder holding model.safetensors)")->required();
  else
    app->add_option("--model", m->path, "safetensors checkpoint (or a folder holding model.safetensors)")->required();
  app->add_option("--preset", m->preset, "tensor naming: auto, native, torch-mha, bert, gpt2");
  app->add_option("--layer", m->layer, "layer index in the checkpoint (bert, gpt2)");
  app->add_option("--heads", m->heads, "number of heads when the checkpoint does not say");
}

LoadedModel Load(const ModelArgs& m) {
  LoadOptions o;
  o.preset = m.preset;
  o.layer = m.layer;
  o.heads = m.heads;
  return LoadModel(m.path, o);
}

// The one layer a certificate is about.
int SelectLayer(const LoadedModel& model, const ModelArgs& m) {
  if (model.layers.size() == 1) return 0;
  if (m.layer < 0)
    throw OptionError("--layer: " + model.path + " holds " + std::to_string(model.layers.size()) +
                      " attention layers; choose one with --layer");
  for (size_t i = 0; i < model.layer_indices.size(); ++i)
    if (model.layer_indices[i] == m.layer) return int(i);
  throw OptionError("--layer: " + model.path + " has no attention layer " + std::to_string(m.layer));
}

int RunInspect(const ModelArgs& m, bool json) {
  const LoadedModel model = Load(m);
  if (json)
    std::cout << InspectJson(model).dump(2) << "\n";
  else
    std::cout << InspectText(model);
  return 0;
}

struct CertifyArgs {
  ModelArgs model;
  std::string center, set = "ball", norm = "2", json_out, witness_out;
  int tokens = 0;
  double radius = -1, relative_radius = -1, time_limit = 30, tolerance = 0.01, search_share = 0.3;
  uint64_t seed = 1;
  bool quiet = false;
  bool attention_only = false;
};

void AddCertifyArgs(CLI::App* app, CertifyArgs* a) {
  AddModelArgs(app, &a->model, false);
  app->add_option("--center,--centre", a->center, "centre X0: zero, FILE.npy or FILE.safetensors:TENSOR")->required();
  app->add_option("--tokens", a->tokens, "number of tokens N (with --center zero)");
  app->add_option("--set", a->set, "ball (||X-X0||_F <= R), tokens (every token within R), box (|X-X0|_max <= R)");
  app->add_option("--radius", a->radius, "radius R");
  app->add_option("--relative-radius", a->relative_radius, "radius as a fraction of ||X0||_F");
  app->add_option("--norm", a->norm, "2 (Frobenius, spectral norm of J) or inf");
  app->add_option("--time-limit", a->time_limit, "seconds for the whole run");
  app->add_option("--tolerance", a->tolerance, "stop when upper <= (1 + tolerance) lower");
  app->add_option("--search-share", a->search_share, "share of the time spent on the lower-bound search");
  app->add_option("--seed", a->seed, "seed of the lower-bound search");
  app->add_option("--json", a->json_out, "write the certificate here (atomically, updated as it improves)");
  app->add_option("--witness", a->witness_out, "write the witness input x and direction v here (safetensors)");
  app->add_flag("--quiet", a->quiet, "no progress lines on stderr");
  app->add_flag("--attention-only", a->attention_only,
                "for a sublayer X + MHA(LN(X)): certify MHA alone (the centre is then its input)");
}

// Everything a certify run needs, validated before any output is written.
struct Job {
  LoadedModel model;
  int layer = 0;
  InputSet set;
  CertifyOptions options;
  Provenance provenance;
};

Job Prepare(const CertifyArgs& a) {
  Job job;
  if (!StringToSetKind(a.set, &job.set.kind)) throw OptionError("--set: expected ball, tokens or box, got '" + a.set + "'");
  if (!StringToNormKind(a.norm, &job.options.norm)) throw OptionError("--norm: expected 2 or inf, got '" + a.norm + "'");
  if ((a.radius >= 0) == (a.relative_radius >= 0)) throw OptionError("--radius: give exactly one of --radius and --relative-radius (>= 0)");
  job.model = Load(a.model);
  job.layer = SelectLayer(job.model, a.model);
  if (a.attention_only) job.model.layers[job.layer].layer_norm.reset();
  const AttentionLayer& L = job.model.layers[job.layer];
  job.set.center = LoadCentre(a.center, a.tokens, L.d_model);
  job.set.radius = a.radius >= 0 ? a.radius : a.relative_radius * job.set.center.norm();
  if (!std::isfinite(job.set.radius)) throw OptionError("--radius: must be finite");
  job.options.time_limit_s = a.time_limit;
  job.options.tolerance = a.tolerance;
  job.options.search_share = a.search_share;
  job.options.seed = a.seed;
  job.options.progress = !a.quiet;
  if (const std::string e = ValidateCertifyOptions(job.options); !e.empty()) throw OptionError("--" + e);
  job.provenance = {job.model.path, job.model.sha256, job.model.preset, job.model.layer_indices[job.layer], a.center};
  // Output folders must exist before the run starts, so that nothing fails at the end.
  for (const std::string& out : {a.json_out, a.witness_out}) {
    if (out.empty()) continue;
    const std::filesystem::path dir = std::filesystem::absolute(out).parent_path();
    if (!std::filesystem::is_directory(dir)) throw OptionError(out + ": output folder does not exist");
  }
  return job;
}

void WriteWitness(const std::string& path, const Eigen::MatrixXd& x, const Eigen::MatrixXd& v, double lower) {
  auto tensor = [](const Eigen::MatrixXd& m) {
    Tensor t;
    t.dtype = "F64";
    t.shape = {m.rows(), m.cols()};
    for (Eigen::Index i = 0; i < m.rows(); ++i)
      for (Eigen::Index j = 0; j < m.cols(); ++j) t.values.push_back(m(i, j));
    return t;
  };
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", lower);
  WriteSafetensors(path, {{"x", tensor(x)}, {"v", tensor(v)}}, {{"lower_bound", buf}});
}

// The lower-bound search alone, with the whole time limit: the witness, its floating value
// and its rigorous lower bound.
int RunSearch(const CertifyArgs& a) {
  const Job job = Prepare(a);
  if (!a.json_out.empty()) throw OptionError("--json: search writes no certificate; use --witness");
  SearchOptions so;
  so.norm = job.options.norm;
  so.seed = a.seed;
  so.time_limit_s = a.time_limit;
  so.verbose = !a.quiet;
  const SearchResult r = SearchLowerBound(job.model.layers[job.layer], job.set, so);
  if (!a.witness_out.empty()) WriteWitness(a.witness_out, r.best.x, r.best.v, r.best.lower_bound.value());
  std::printf("witnessed lower bound %.17g (floating %.9g, origin %s)\n", r.best.lower_bound.value(), r.best.value,
              r.best.origin.c_str());
  std::printf("%d points, %d ascent steps, %d rounds, %.1f s\n", r.points_evaluated, r.ascent_steps, r.rounds,
              r.elapsed_s);
  return 0;
}

int RunCertify(const CertifyArgs& a) {
  Job job = Prepare(a);
  if (!a.json_out.empty()) {
    job.options.on_improvement = [&](const Certificate& c) {
      nlohmann::json j = ToJson(c);
      j["status"] = "in_progress";  // a later write replaces it; a kill leaves this one
      WriteFileAtomic(a.json_out, j.dump(2) + "\n");
    };
  }
  WitnessData w;
  const Certificate c = Certify(job.model.layers[job.layer], job.set, job.options, job.provenance, &w);
  if (!a.witness_out.empty()) WriteWitness(a.witness_out, w.x, w.v, c.lower_bound.value());
  if (!a.json_out.empty()) WriteFileAtomic(a.json_out, ToJson(c).dump(2) + "\n");
  std::cout << Summary(c);
  return 0;
}

struct ZooArgs {
  std::string dir = "models/zoo";
  double time_limit = 10;
  std::string json_dir;
};

// The main job on the bundled default models: each layer's first real centre, balls of
// 0.1% and 1% of ||X0||_F, norm 2.
int RunZoo(const ZooArgs& a) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(a.dir)) throw OptionError("--dir: " + a.dir + " is not a folder");
  std::vector<std::string> models;
  for (const auto& e : fs::directory_iterator(a.dir)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() == ".safetensors" && name.find("centres") == std::string::npos) models.push_back(e.path().string());
  }
  std::sort(models.begin(), models.end());
  if (models.empty()) throw OptionError("--dir: no checkpoints in " + a.dir);
  std::printf("%-24s %-6s %8s %14s %14s %10s %8s\n", "model", "set", "radius", "upper", "lower", "gap", "seconds");
  for (const std::string& path : models) {
    const std::string centres = path.substr(0, path.size() - std::string(".safetensors").size()) + "-centres.safetensors";
    if (!fs::exists(centres)) continue;
    for (double rel : {0.001, 0.01}) {
      CertifyArgs c;
      c.model.path = path;
      c.center = centres + ":x0";
      c.relative_radius = rel;
      c.time_limit = a.time_limit;
      c.quiet = true;
      Job job = Prepare(c);
      const Certificate cert = Certify(job.model.layers[job.layer], job.set, job.options, job.provenance);
      std::printf("%-24s %-6s %8.4g %14.8g %14.8g %10.6g %8.2f\n", fs::path(path).filename().string().c_str(),
                  SetKindToString(job.set.kind), job.set.radius, cert.upper_bound.value(), cert.lower_bound.value(),
                  cert.gap(), cert.elapsed_s);
      if (!a.json_dir.empty()) {
        char name[64];
        std::snprintf(name, sizeof name, "-r%g.json", rel);
        WriteFileAtomic((fs::path(a.json_dir) / (fs::path(path).stem().string() + name)).string(), ToJson(cert).dump(2) + "\n");
      }
    }
  }
  return 0;
}

struct BenchArgs {
  BenchOptions o;
  std::string kind = "dot", device, dtype = "f32";
};

int RunBench(BenchArgs a) {
  if (!StringToAttentionKind(a.kind, &a.o.kind)) throw OptionError("--kind: expected dot or l2");
  if (!a.device.empty() && !StringToDevice(a.device, &a.o.device)) throw OptionError("--device: expected cpu or cuda");
  if (!StringToDType(a.dtype, &a.o.dtype)) throw OptionError("--dtype: expected f32 or f64");
  std::cout << RunEngineBench(a.o);
  return 0;
}

int Main(int argc, char** argv) {
  CLI::App app{"lipcert: certified local Lipschitz bounds of attention layers"};
  app.require_subcommand(1);
  ModelArgs inspect_args;
  bool inspect_json = false;
  CLI::App* inspect = app.add_subcommand("inspect", "list the attention layers of a checkpoint");
  AddModelArgs(inspect, &inspect_args, true);
  inspect->add_flag("--json", inspect_json, "machine-readable output");
  CertifyArgs certify_args;
  CLI::App* certify = app.add_subcommand("certify", "certify the local Lipschitz constant of one layer over a set");
  AddCertifyArgs(certify, &certify_args);
  CertifyArgs search_args;
  CLI::App* search = app.add_subcommand("search", "the witnessed lower bound alone (the whole time limit)");
  AddCertifyArgs(search, &search_args);
  ZooArgs zoo_args;
  CLI::App* zoo = app.add_subcommand("zoo", "certify the bundled default models");
  zoo->add_option("--dir", zoo_args.dir, "folder of bundled checkpoints");
  zoo->add_option("--time-limit", zoo_args.time_limit, "seconds per certificate");
  zoo->add_option("--json-dir", zoo_args.json_dir, "also write each certificate here");
  BenchArgs bench_args;
  CLI::App* bench = app.add_subcommand("bench", "throughput of the batched Jacobian-norm engine");
  bench->add_option("--n", bench_args.o.n, "tokens");
  bench->add_option("--d", bench_args.o.d, "model width");
  bench->add_option("--heads", bench_args.o.heads, "heads");
  bench->add_option("--batch", bench_args.o.batch, "points per call");
  bench->add_option("--kind", bench_args.kind, "dot or l2");
  bench->add_option("--device", bench_args.device, "cpu or cuda (default: cuda when built and present)");
  bench->add_option("--dtype", bench_args.dtype, "f32 or f64");
  bench->add_option("--threads", bench_args.o.threads, "CPU threads");
  bench->add_option("--tol", bench_args.o.rel_tol, "relative tolerance on sigma_1");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "lipcert: " << e.what() << "\n";
    return 2;
  }
  try {
    if (*inspect) return RunInspect(inspect_args, inspect_json);
    if (*certify) return RunCertify(certify_args);
    if (*search) return RunSearch(search_args);
    if (*zoo) return RunZoo(zoo_args);
    if (*bench) return RunBench(bench_args);
  } catch (const InputError& e) {
    std::cerr << "lipcert: " << e.what() << "\n";
    return 2;
  } catch (const OptionError& e) {
    std::cerr << "lipcert: " << e.what() << "\n";
    return 2;
  } catch (const std::invalid_argument& e) {
    std::cerr << "lipcert: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "lipcert: internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace lipcert

int main(int argc, char** argv) { return lipcert::Main(argc, argv); }
