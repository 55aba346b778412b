// Options shared by the certify and search subcommands.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "models/errors.h"
#include "models/safetensors.h"

namespace lipcert::cli {

void AddModelOptions(CLI::App* app, ModelSpec* m, bool positional) {
  const char* help = "safetensors checkpoint (or a folder holding model.safetensors)";
  if (positional)
    app->add_option("model", m->path, help)->required();
  else
    app->add_option("--model", m->path, help)->required();
  app->add_option("--preset", m->preset, "tensor naming: auto, native, torch-mha, bert, gpt2");
  app->add_option("--layer", m->layer, "layer index in the checkpoint (bert, gpt2)");
  app->add_option("--heads", m->heads, "number of heads when the checkpoint does not say");
}

void AddCertifyOptions(CLI::App* app, CertifyArgs* a) {
  CertifyRequest& r = a->request;
  AddModelOptions(app, &r.model, false);
  app->add_option("--center,--centre", r.set.centre, "centre X0: zero, FILE.npy or FILE.safetensors:TENSOR")->required();
  app->add_option("--tokens", r.set.tokens, "number of tokens N (with --center zero)");
  app->add_option("--set", a->set, "ball (||X-X0||_F <= R), tokens (every token within R), box (|X-X0|_max <= R)");
  app->add_option("--radius", r.set.radius, "radius R");
  app->add_option("--relative-radius", r.set.relative_radius, "radius as a fraction of ||X0||_F");
  app->add_option("--norm", a->norm, "2 (Frobenius, spectral norm of J) or inf");
  app->add_option("--time-limit", r.options.time_limit_s, "seconds for the whole run");
  app->add_option("--budget", a->budget,
                  "STEPS[,ROUNDS]: bound the run by work instead of the clock (branch-and-bound pieces, search "
                  "rounds, default 2; the engines choose by size alone): the same certificate on any machine");
  app->add_option("--tolerance", r.options.tolerance, "stop when upper <= (1 + tolerance) lower");
  app->add_option("--search-share", r.options.search.share, "least share of the time limit for the lower-bound search");
  app->add_option("--seed", r.options.seed, "seed of the lower-bound search");
  app->add_option("--threads", r.options.threads, "worker threads for every stage (0: all cores)");
  app->add_option("--probabilistic-failure", r.options.probabilistic.failure_probability,
                  "failure probability of the probabilistic (not certified) bound beside the certificate");
  app->add_option("--probabilistic-seed", r.options.probabilistic.seed,
                  "seed of its random start (default: drawn from the OS and recorded)");
  app->add_flag("--no-probabilistic", a->no_probabilistic, "no probabilistic bound beside the certificate");
  app->add_option("--deflate", r.options.engines.deflation_vectors,
                  "above the dense size: deflate the centre norm's super-blocks with up to K Lanczos vectors, as "
                  "many as the time left fits (tighter; 0: off)");
  app->add_option("--json", a->json_out, "write the certificate here (atomically, updated as it improves)");
  app->add_option("--witness", a->witness_out, "write the witness input x and direction v here (safetensors)");
  app->add_flag("--quiet", a->quiet, "no progress lines on stderr");
  app->add_flag("--attention-only", r.model.attention_only,
                "for a sublayer X + MHA(LN(X)): certify MHA alone (the centre is then its input)");
}

CertifyRequest ToRequest(const CertifyArgs& a) {
  CertifyRequest r = a.request;
  if (!StringToSetKind(a.set, &r.set.kind)) throw OptionError("--set: expected ball, tokens or box, got '" + a.set + "'");
  if (!StringToNormKind(a.norm, &r.options.norm)) throw OptionError("--norm: expected 2 or inf, got '" + a.norm + "'");
  if ((r.set.radius >= 0) == (r.set.relative_radius >= 0))
    throw OptionError("--radius: give exactly one of --radius and --relative-radius (>= 0)");
  if (!a.budget.empty())
    if (const std::string e = ParseWorkBudget(a.budget, &r.options.budget); !e.empty()) throw OptionError("--" + e);
  r.options.progress = !a.quiet;
  if (a.no_probabilistic) r.options.probabilistic.enabled = false;
  for (const std::string& out : {a.json_out, a.witness_out}) {
    if (out.empty()) continue;
    const std::filesystem::path dir = std::filesystem::absolute(out).parent_path();
    if (!std::filesystem::is_directory(dir)) throw OptionError(out + ": output folder does not exist");
  }
  return r;
}

void WriteWitness(const std::string& path, const Witness& w) {
  auto tensor = [](const Eigen::MatrixXd& m) {
    Tensor t;
    t.dtype = "F64";
    t.shape = {m.rows(), m.cols()};
    for (Eigen::Index i = 0; i < m.rows(); ++i)
      for (Eigen::Index j = 0; j < m.cols(); ++j) t.values.push_back(m(i, j));
    return t;
  };
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", w.lower_bound.value());
  WriteSafetensors(path, {{"x", tensor(w.x)}, {"v", tensor(w.v)}}, {{"lower_bound", buf}});
}

}  // namespace lipcert::cli
