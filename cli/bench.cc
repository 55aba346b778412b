// lipcert bench --n N --d D --heads H --batch B [--kind dot|l2] [--device cpu|cuda]
//               [--dtype f32|f64] [--threads T] [--tol T]: throughput of the batched
// Jacobian-norm evaluator (kernels/), uncertified.
#include <iostream>

#include "cli/commands.h"
#include "kernels/bench.h"
#include "models/errors.h"

namespace lipcert::cli {

Command AddBenchCommand(CLI::App& parent) {
  struct Args {
    BenchOptions o;
    std::string kind = "dot", device, dtype = "f32";
  };
  auto a = std::make_shared<Args>();
  CLI::App* app = parent.add_subcommand("bench", "throughput of the batched Jacobian-norm evaluator");
  app->add_option("--n", a->o.n, "tokens");
  app->add_option("--d", a->o.d, "model width");
  app->add_option("--heads", a->o.heads, "heads");
  app->add_option("--batch", a->o.batch, "points per call");
  app->add_option("--kind", a->kind, "dot or l2");
  app->add_option("--device", a->device, "cpu or cuda (default: cuda when built and present)");
  app->add_option("--dtype", a->dtype, "f32 or f64");
  app->add_option("--threads", a->o.threads, "CPU threads");
  app->add_option("--tol", a->o.rel_tol, "relative tolerance on sigma_1");
  return {app, [a] {
            BenchOptions o = a->o;
            if (!StringToAttentionKind(a->kind, &o.kind)) throw OptionError("--kind: expected dot or l2");
            if (!a->device.empty() && !StringToDevice(a->device, &o.device))
              throw OptionError("--device: expected cpu or cuda");
            if (!StringToDType(a->dtype, &o.dtype)) throw OptionError("--dtype: expected f32 or f64");
            std::cout << RunEvaluatorBench(o);
            return 0;
          }};
}

}  // namespace lipcert::cli
