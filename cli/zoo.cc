// lipcert zoo [--dir models/zoo] [--time-limit S] [--json-dir DIR] [--report DIR]: the main
// job on the bundled default models: each layer's first real centre, balls of 0.1% and 1% of
// ||X0||_F, norm 2; then the sweep report (reports/sweep.h) in DIR: the dot and L2 block-0
// layers on tokens sets around zero (attention alone, several radii: the headline plot) and
// on balls around their real centres, with the validation section (reports/validation.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "models/errors.h"
#include "reports/report.h"
#include "reports/sweep.h"

namespace lipcert::cli {
namespace {

namespace fs = std::filesystem;

struct ZooArgs {
  std::string dir = "models/zoo";
  double time_limit = 10;
  std::string json_dir;
  std::string report_dir = "lipcert-report";  // "" or "none": no sweep report
  double sweep_time_limit = 4;               // seconds per sweep point
  double validation_time_limit = 1;          // seconds per validation certificate
  int threads = 0;
};

// The bundled checkpoints that have a centres file beside them.
std::vector<std::string> ZooModels(const std::string& dir) {
  if (!fs::is_directory(dir)) throw OptionError("--dir: " + dir + " is not a folder");
  std::vector<std::string> models;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() == ".safetensors" && name.find("centres") == std::string::npos)
      models.push_back(e.path().string());
  }
  std::sort(models.begin(), models.end());
  if (models.empty()) throw OptionError("--dir: no checkpoints in " + dir);
  return models;
}

// The zoo's sweep report: two sweeps (each in its own folder, resumable) and one combined
// report with the validation section.
void WriteZooReport(const ZooArgs& a) {
  const fs::path out(a.report_dir);
  const std::string dot = (fs::path(a.dir) / "dot-layer0.safetensors").string();
  const std::string l2 = (fs::path(a.dir) / "l2-layer0.safetensors").string();
  const std::string command = reports::ProcessCommandLine();
  std::printf("\nsweep report in %s/ (dot vs L2; %g s per point)\n", a.report_dir.c_str(), a.sweep_time_limit);
  std::fflush(stdout);
  reports::SweepOptions tokens;
  tokens.models = {dot, l2};
  tokens.centres = {"zero"};
  tokens.tokens = 8;
  tokens.set = SetKind::kTokens;
  tokens.attention_only = true;
  tokens.radii = {0.25, 0.5, 1, 2, 4};
  tokens.time_limit_per_point_s = a.sweep_time_limit;
  tokens.threads = a.threads;
  tokens.out_dir = (out / "tokens-around-zero").string();
  tokens.command_line = command + "  # sweep 1: lipcert sweep --model " + dot + " --model " + l2 +
                        " --attention-only --center zero --tokens 8 --set tokens --radii 0.25,0.5,1,2,4";
  const reports::SweepSummary s1 = reports::RunSweep(tokens);
  reports::SweepOptions balls;
  balls.models = {dot, l2};
  balls.centres = {(fs::path(a.dir) / "dot-layer0-centres.safetensors").string() + ":x0",
                   (fs::path(a.dir) / "l2-layer0-centres.safetensors").string() + ":x0"};
  balls.set = SetKind::kBall;
  balls.relative_radii = {0.001, 0.01, 0.1};
  balls.time_limit_per_point_s = a.sweep_time_limit;
  balls.threads = a.threads;
  balls.out_dir = (out / "balls-around-centres").string();
  balls.command_line = command + "  # sweep 2: lipcert sweep --model " + dot + " --model " + l2 + " --center " +
                       balls.centres[0] + " --center " + balls.centres[1] + " --set ball --relative-radii 0.001,0.01,0.1";
  const reports::SweepSummary s2 = reports::RunSweep(balls);
  reports::ReportOptions ro;
  ro.title = "lipcert: the bundled zoo";
  ro.command_line = command;
  ro.validate = true;
  ro.validation_time_limit_s = a.validation_time_limit;
  ro.threads = a.threads;
  const std::vector<reports::ReportInput> inputs = reports::ReadReportInputs({s1.json_path, s2.json_path});
  const std::vector<reports::Section> sections = reports::BuildSections(inputs, ro);
  const std::string html = (out / "report.html").string(), md = (out / "report.md").string();
  WriteFileAtomic(html, reports::RenderHtml(sections, ro));
  WriteFileAtomic(md, reports::RenderMarkdown(sections, ro, out.string(), ""));
  std::printf("report: %s\n        %s (SVGs beside it)\n        sweeps: %s, %s\n", html.c_str(), md.c_str(),
              s1.json_path.c_str(), s2.json_path.c_str());
}

int RunZoo(const ZooArgs& a) {
  std::printf("%-24s %-6s %8s %14s %14s %10s %8s\n", "model", "set", "radius", "upper", "lower", "gap", "seconds");
  for (const std::string& path : ZooModels(a.dir)) {
    const std::string centres = path.substr(0, path.size() - std::string(".safetensors").size()) + "-centres.safetensors";
    if (!fs::exists(centres)) continue;
    for (double rel : {0.001, 0.01}) {
      CertifyRequest r;
      r.model.path = path;
      r.set.centre = centres + ":x0";
      r.set.relative_radius = rel;
      r.options.time_limit_s = a.time_limit;
      r.options.threads = a.threads;
      const Certificate cert = CertifyCheckpoint(r).certificate;
      std::printf("%-24s %-6s %8.4g %14.8g %14.8g %10.6g %8.2f\n", fs::path(path).filename().string().c_str(),
                  SetKindToString(cert.set), cert.radius, cert.upper_bound.value(), cert.lower_bound.value(),
                  cert.gap(), cert.elapsed_s);
      if (!a.json_dir.empty()) {
        char name[64];
        std::snprintf(name, sizeof name, "-r%g.json", rel);
        WriteFileAtomic((fs::path(a.json_dir) / (fs::path(path).stem().string() + name)).string(),
                        ToJson(cert).dump(2) + "\n");
      }
    }
  }
  if (!a.report_dir.empty() && a.report_dir != "none") WriteZooReport(a);
  return 0;
}

}  // namespace

Command AddZooCommand(CLI::App& parent) {
  auto a = std::make_shared<ZooArgs>();
  CLI::App* app = parent.add_subcommand("zoo", "certify the bundled default models");
  app->add_option("--dir", a->dir, "folder of bundled checkpoints");
  app->add_option("--time-limit", a->time_limit, "seconds per certificate");
  app->add_option("--json-dir", a->json_dir, "also write each certificate here");
  app->add_option("--report", a->report_dir, "write the sweep report (and its sweeps) here; 'none': skip it");
  app->add_option("--sweep-time-limit", a->sweep_time_limit, "seconds per sweep point");
  app->add_option("--validation-time-limit", a->validation_time_limit, "seconds per validation certificate");
  app->add_option("--threads", a->threads, "worker threads (0: all cores)");
  return {app, [a] { return RunZoo(*a); }};
}

}  // namespace lipcert::cli
