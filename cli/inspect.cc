// lipcert inspect MODEL [--preset P] [--layer I] [--heads H] [--json]
#include <iostream>

#include "cli/commands.h"
#include "models/inspect.h"

namespace lipcert::cli {

Command AddInspectCommand(CLI::App& parent) {
  struct Args {
    ModelSpec model;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand("inspect", "list the attention layers of a checkpoint");
  AddModelOptions(app, &a->model, true);
  app->add_flag("--json", a->json, "machine-readable output");
  return {app, [a] {
            LoadOptions o;
            o.preset = a->model.preset;
            o.layer = a->model.layer;
            o.heads = a->model.heads;
            const LoadedModel model = LoadModel(a->model.path, o);
            if (a->json)
              std::cout << InspectJson(model).dump(2) << "\n";
            else
              std::cout << InspectText(model);
            return 0;
          }};
}

}  // namespace lipcert::cli
