// Running an audit plan: the jobs not yet in the journal, concurrently on this machine
// (--jobs K), one shard of an array job (--shard I/N), or handed out by MPI rank 0; then the
// verdicts, the table on stdout, summary.csv and the report in the output folder.
//
//   OUT/plan.json        the jobs (keys, specs, thresholds) of this run or shard
//   OUT/journal.jsonl    one certificate per finished job (audit/journal.h)
//   OUT/partial/KEY.json the best certificate so far of a job in flight (removed when done)
//   OUT/summary.csv      one row per job
//   OUT/audit.json       lipcert.audit/1: plan, verdicts, certificates (audit/report.h)
//   OUT/report.html      the report (reports/), and its Markdown twin report.md
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "audit/audit_file.h"
#include "audit/journal.h"

namespace lipcert::audit {

struct RunOptions {
  std::string out_dir = "audit-out";
  int jobs = 1;         // jobs run concurrently on this machine
  int threads = 0;      // threads per job; 0: the cores split between the concurrent jobs
  int shard = 0;        // this process runs the jobs with index % shards == shard
  int shards = 1;
  bool progress = true; // a line per finished job on stderr
};
// Returns "" when valid, else a message naming the bad field.
std::string ValidateRunOptions(const RunOptions& o);

enum class Verdict { kPass, kNoThreshold, kViolated, kUnproven, kMissing };
const char* VerdictToString(Verdict v);  // pass | - | VIOLATED | UNPROVEN | MISSING

struct JobVerdict {
  Verdict verdict = Verdict::kMissing;
  std::string reason;  // why not pass (empty when pass)
};
// The job's certificate against its thresholds: violated when the witnessed lower bound
// (or certified upper bound) proves a limit broken, unproven when the certificate could
// not show it held (upper above max_upper within the limit, gap too wide, ...).
JobVerdict Judge(const Thresholds& t, const nlohmann::json& certificate);

// Runs what is left of the plan in this process (and its shard) and summarises; the exit
// status: 0 every threshold holds, 1 a threshold is violated or unproven, or a job failed.
int RunAudit(const AuditPlan& plan, const RunOptions& o);

// The table, CSV and report for the jobs of `plan_json` from `entries`; prints the table on
// stdout and names each failing job on stderr. Returns the exit status (0 or 1).
int Summarise(const nlohmann::json& plan_json, const std::vector<JournalEntry>& entries, const std::string& out_dir);

// Unions the journals of shard (or interrupted) output folders into `out`: each job once,
// the plans must be shards of one audit. Returns the exit status as Summarise.
int MergeAudits(const std::vector<std::string>& dirs, const std::string& out);

// One job, prepared and certified: its journal entry. `partial_path` (when not empty) gets
// every improved certificate atomically while the job runs.
JournalEntry RunAuditJob(const AuditJob& job, int threads, const std::string& partial_path);

// Plan, journal and bookkeeping of an output folder (used by the local and MPI runners).
struct OutputFolder {
  std::string dir;
  std::string journal() const { return dir + "/journal.jsonl"; }
  std::string partial(const std::string& key) const { return dir + "/partial/" + key + ".json"; }
  // Creates the folder (its parent must exist) and writes the plan; returns the journal read.
  JournalContents Prepare(const nlohmann::json& plan_json) const;
};

// The plan as written in an output folder for shard I of N (all of it for 0 of 1).
nlohmann::json ShardPlan(const AuditPlan& plan, int shard, int shards);

}  // namespace lipcert::audit
