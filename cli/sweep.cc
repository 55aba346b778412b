// lipcert sweep --model M [--model M2 ...] [--preset P] [--layer I|all]
//               (--center FILE[:TENSOR] | --center zero --tokens N) --set ball|tokens|box
//               (--radii R1,R2,... | --relative-radii F1,F2,...) [--tokens-list 4,8,16,32]
//               [--norm 2|inf] [--attention-only] [--time-limit-per-point S | --budget STEPS[,ROUNDS]] [--out DIR]
//               [--validate] [--quiet]
// Certifies every (model, layer, tokens, radius) point; writes DIR/sweep.json (resumable
// journal), DIR/sweep.csv, DIR/report.html and DIR/report.md (reports/sweep.h).
#include <iostream>

#include "cli/commands.h"
#include "models/errors.h"
#include "reports/sweep.h"

namespace lipcert::cli {
namespace {

struct SweepArgs {
  reports::SweepOptions options;
  std::string set = "ball", norm = "2", budget;
  bool quiet = false;
};

}  // namespace

Command AddSweepCommand(CLI::App& parent) {
  auto a = std::make_shared<SweepArgs>();
  reports::SweepOptions& o = a->options;
  o.out_dir = "lipcert-sweep";
  CLI::App* app = parent.add_subcommand("sweep", "certify a grid of radii (and N, layers, models) and write a report");
  app->add_option("--model", o.models, "checkpoint (repeat for several models on one plot)")->required();
  app->add_option("--preset", o.preset, "tensor naming: auto, native, torch-mha, bert, gpt2");
  app->add_option("--layer", o.layer, "layer index, or 'all' for every layer of the checkpoint");
  app->add_option("--heads", o.heads, "number of heads when the checkpoint does not say");
  app->add_option("--center,--centre", o.centres, "centre X0: zero, FILE.npy or FILE.safetensors:TENSOR (one, or one per --model)")
      ->required();
  app->add_option("--tokens", o.tokens, "number of tokens N (with --center zero)");
  app->add_option("--tokens-list", o.tokens_list, "several N, comma separated (with --center zero)")->delimiter(',');
  app->add_option("--set", a->set, "ball, tokens or box");
  app->add_option("--radii", o.radii, "absolute radii, comma separated")->delimiter(',');
  app->add_option("--relative-radii", o.relative_radii, "radii as fractions of ||X0||_F, comma separated")->delimiter(',');
  app->add_option("--norm", a->norm, "2 or inf");
  app->add_flag("--attention-only", o.attention_only, "for a sublayer X + MHA(LN(X)): certify MHA alone");
  app->add_option("--time-limit-per-point", o.time_limit_per_point_s, "seconds per point");
  app->add_option("--budget", a->budget,
                  "STEPS[,ROUNDS]: bound each point by work instead of the clock (branch-and-bound pieces, search "
                  "rounds): the same certificates on any machine");
  app->add_option("--threads", o.threads, "worker threads (0: all cores)");
  app->add_option("--out", o.out_dir, "output folder (created; rerun the same command to resume)");
  app->add_flag("--validate", o.validate, "add the validation section (published results recomputed)");
  app->add_option("--validation-time-limit", o.validation_time_limit_s, "seconds per validation certificate");
  app->add_flag("--quiet", a->quiet, "no progress on stderr");
  return {app, [a] {
            reports::SweepOptions o = a->options;
            if (!StringToSetKind(a->set, &o.set)) throw OptionError("--set: expected ball, tokens or box, got '" + a->set + "'");
            if (!StringToNormKind(a->norm, &o.norm)) throw OptionError("--norm: expected 2 or inf, got '" + a->norm + "'");
            if (!a->budget.empty())
              if (const std::string e = ParseWorkBudget(a->budget, &o.budget); !e.empty()) throw OptionError("--" + e);
            o.progress = !a->quiet;
            o.command_line = reports::ProcessCommandLine();
            const reports::SweepSummary s = reports::RunSweep(o);
            std::cout << "sweep: " << s.total << " points (" << s.computed << " certified now, " << s.resumed
                      << " from the journal) in " << s.seconds << " s\n"
                      << "  " << s.json_path << "\n  " << s.csv_path << "\n  " << s.html_path << "\n  "
                      << s.markdown_path << "\n";
            return 0;
          }};
}

}  // namespace lipcert::cli
