// lipcert zoo [--dir models/zoo] [--time-limit S] [--json-dir DIR]: the main job on the
// bundled default models: each layer's first real centre, balls of 0.1% and 1% of
// ||X0||_F, norm 2.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "models/errors.h"

namespace lipcert::cli {
namespace {

namespace fs = std::filesystem;

struct ZooArgs {
  std::string dir = "models/zoo";
  double time_limit = 10;
  std::string json_dir;
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
  return 0;
}

}  // namespace

Command AddZooCommand(CLI::App& parent) {
  auto a = std::make_shared<ZooArgs>();
  CLI::App* app = parent.add_subcommand("zoo", "certify the bundled default models");
  app->add_option("--dir", a->dir, "folder of bundled checkpoints");
  app->add_option("--time-limit", a->time_limit, "seconds per certificate");
  app->add_option("--json-dir", a->json_dir, "also write each certificate here");
  return {app, [a] { return RunZoo(*a); }};
}

}  // namespace lipcert::cli
