// lipcert audit AUDIT.toml [--out DIR] [--jobs K] [--threads T] [--shard I/N] [--dry-run] [--quiet]
// lipcert audit merge DIR... --out DIR
// mpirun -np K lipcert audit AUDIT.toml [--out DIR]
//
// Batch audits (docs/audit.md): the audit file is validated in full before any job runs
// (exit 2 on bad input, nothing written); the jobs not yet in OUT/journal.jsonl run; the
// table goes to stdout. Exit 0 when every threshold holds, 1 when one is violated or could
// not be certified (each named on stderr), 2 on bad input.
#include <cstdio>
#include <iostream>

#include "audit/audit_file.h"
#include "audit/mpi_run.h"
#include "audit/run.h"
#include "cli/commands.h"
#include "models/errors.h"

namespace lipcert::cli {
namespace {

struct AuditArgs {
  std::string file, shard = "0/1";
  audit::RunOptions run;
  bool dry_run = false, quiet = false;
  std::vector<std::string> merge_dirs;
  std::string merge_out;
};

void ParseShard(const std::string& s, audit::RunOptions* o) {
  const size_t slash = s.find('/');
  try {
    size_t a = 0, b = 0;
    if (slash == std::string::npos) throw std::invalid_argument("");
    o->shard = std::stoi(s.substr(0, slash), &a);
    o->shards = std::stoi(s.substr(slash + 1), &b);
    if (a != slash || b != s.size() - slash - 1) throw std::invalid_argument("");
  } catch (const std::exception&) {
    throw OptionError("shard: expected I/N (0 <= I < N), got '" + s + "'");
  }
}

// MPI is finalised on every way out of the command.
struct MpiGuard {
  audit::MpiContext mpi;
  ~MpiGuard() { audit::StopMpi(mpi); }
};

int RunAuditCommand(const AuditArgs& a) {
  MpiGuard guard{audit::StartMpi()};
  const bool speaker = guard.mpi.rank == 0;
  audit::RunOptions o = a.run;
  o.progress = !a.quiet && speaker;
  ParseShard(a.shard, &o);
  if (const std::string e = audit::ValidateRunOptions(o); !e.empty()) throw OptionError(e);
  audit::AuditPlan plan;
  try {
    plan = audit::ReadAuditFile(a.file);
  } catch (const InputError& e) {
    if (!speaker) return 2;  // rank 0 says it
    throw;
  }
  if (a.dry_run) {
    if (!speaker) return 0;
    for (size_t i = 0; i < plan.jobs.size(); ++i)
      if (int(i % size_t(o.shards)) == o.shard)
        std::cout << plan.jobs[i].key.substr(0, 12) << "  " << plan.jobs[i].spec.dump() << "  thresholds "
                  << plan.jobs[i].thresholds.ToJson().dump() << "\n";
    return 0;
  }
  return audit::RunAuditMpi(plan, o, guard.mpi);
}

}  // namespace

Command AddAuditCommand(CLI::App& parent) {
  auto a = std::make_shared<AuditArgs>();
  CLI::App* app = parent.add_subcommand(
      "audit", std::string("audit checkpoints against thresholds from an audit file (docs/audit.md); MPI: ") +
                   (audit::MpiBuilt() ? "yes" : "no"));
  app->add_option("audit_file", a->file, "the audit file (TOML)");
  app->add_option("--out", a->run.out_dir, "output folder: journal, plan, summary.csv, report.md (resumable)");
  app->add_option("--jobs", a->run.jobs, "jobs run concurrently on this machine");
  app->add_option("--threads", a->run.threads, "threads per job (0: the cores split between the jobs)");
  app->add_option("--shard", a->shard, "run only shard I of N (jobs with index % N == I), for array schedulers");
  app->add_flag("--dry-run", a->dry_run, "validate and list the jobs (key, spec, thresholds); run nothing");
  app->add_flag("--quiet", a->quiet, "no progress lines on stderr");
  CLI::App* merge = app->add_subcommand("merge", "merge the output folders of shards (or interrupted runs) into one");
  merge->add_option("dirs", a->merge_dirs, "output folders to merge")->required();
  merge->add_option("--out", a->merge_out, "the merged output folder")->required();
  return {app, [a, merge] {
            if (merge->parsed()) return audit::MergeAudits(a->merge_dirs, a->merge_out);
            if (a->file.empty()) throw OptionError("audit_file: give the audit file (lipcert audit --help)");
            return RunAuditCommand(*a);
          }};
}

}  // namespace lipcert::cli
