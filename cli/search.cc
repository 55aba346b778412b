// lipcert search (the options of certify but --json): the witnessed lower-bound search
// alone, with the whole time limit.
#include <cstdio>

#include "certify/search.h"
#include "cli/commands.h"
#include "models/errors.h"

namespace lipcert::cli {

Command AddSearchCommand(CLI::App& parent) {
  auto a = std::make_shared<CertifyArgs>();
  CLI::App* app = parent.add_subcommand("search", "the witnessed lower bound alone (the whole time limit)");
  AddCertifyOptions(app, a.get());
  return {app, [a] {
            if (!a->json_out.empty()) throw OptionError("--json: search writes no certificate; use --witness");
            const PreparedJob job = PrepareJob(ToRequest(*a));
            const SearchResult r = SearchLowerBound(job.Layer(), job.set, SearchOnlyOptions(job));
            if (!a->witness_out.empty()) WriteWitness(a->witness_out, r.best);
            std::printf("witnessed lower bound %.17g (floating %.9g, origin %s)\n", r.best.lower_bound.value(), r.best.value,
                        r.best.origin.c_str());
            std::printf("%d points, %d ascent steps, %d rounds, %.1f s\n", r.points_evaluated, r.ascent_steps,
                        r.rounds, r.elapsed_s);
            return 0;
          }};
}

}  // namespace lipcert::cli
