#include "audit/run.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "audit/report.h"
#include "models/errors.h"
#include "models/safetensors.h"

namespace lipcert::audit {

namespace fs = std::filesystem;
using nlohmann::json;

std::string ValidateRunOptions(const RunOptions& o) {
  if (o.out_dir.empty()) return "out: must not be empty";
  if (o.jobs < 1 || o.jobs > 4096) return "jobs: must be in [1, 4096]";
  if (o.threads < 0) return "threads: must be >= 0";
  if (o.shards < 1) return "shard: N must be >= 1";
  if (o.shard < 0 || o.shard >= o.shards) return "shard: I must be in [0, N)";
  return "";
}

const char* VerdictToString(Verdict v) {
  switch (v) {
    case Verdict::kPass: return "pass";
    case Verdict::kNoThreshold: return "-";
    case Verdict::kViolated: return "VIOLATED";
    case Verdict::kUnproven: return "UNPROVEN";
    case Verdict::kMissing: return "MISSING";
  }
  return "?";
}

namespace {

double Value(const json& j, const char* name, double if_null) {
  return j.contains(name) && j[name].is_number() ? j[name].get<double>() : if_null;
}

std::string Fmt(double v, const char* f = "%.6g") {
  if (!std::isfinite(v)) return "inf";
  char buf[48];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

JobVerdict Judge(const Thresholds& t, const json& c) {
  const double upper = Value(c, "upper_bound", INFINITY), lower = Value(c, "lower_bound", 0);
  const double gap = lower > 0 ? upper / lower : INFINITY;
  JobVerdict v;
  if (t.empty()) return {Verdict::kNoThreshold, ""};
  bool violated = false, unproven = false;
  std::vector<std::string> why;
  if (t.max_upper && !(upper <= *t.max_upper)) {
    if (lower > *t.max_upper) {
      violated = true;
      why.push_back("lower bound " + Fmt(lower) + " > max_upper " + Fmt(*t.max_upper) + " (witnessed)");
    } else {
      unproven = true;
      why.push_back("upper bound " + Fmt(upper) + " > max_upper " + Fmt(*t.max_upper) + " (not certified within the limit)");
    }
  }
  if (t.max_gap && !(gap <= *t.max_gap)) {
    unproven = true;
    why.push_back("gap " + Fmt(gap) + " > max_gap " + Fmt(*t.max_gap));
  }
  if (t.min_lower && !(lower >= *t.min_lower)) {
    if (upper < *t.min_lower) {
      violated = true;
      why.push_back("upper bound " + Fmt(upper) + " < min_lower " + Fmt(*t.min_lower) + " (certified)");
    } else {
      unproven = true;
      why.push_back("lower bound " + Fmt(lower) + " < min_lower " + Fmt(*t.min_lower) + " (no witness found)");
    }
  }
  v.verdict = violated ? Verdict::kViolated : unproven ? Verdict::kUnproven : Verdict::kPass;
  for (const std::string& w : why) v.reason += (v.reason.empty() ? "" : "; ") + w;
  return v;
}

JournalEntry RunAuditJob(const AuditJob& job, int threads, const std::string& partial_path) {
  CertifyRequest r = job.request;
  r.options.threads = threads;
  r.options.progress = false;
  PreparedJob prepared = PrepareJob(r);
  // The journal names files as the audit file does (relative to it), not as this process
  // reached them.
  auto portable = [&job](json c) {
    c["model"]["path"] = job.spec["path"];
    c["set"]["centre"] = job.spec["centre"];
    return c;
  };
  if (!partial_path.empty())
    prepared.options.on_improvement = [&](const Certificate& c) {
      WriteFileAtomic(partial_path, portable(ToJson(c)).dump(2) + "\n");
    };
  // The key names the checkpoint as it was validated; a file replaced since then would
  // journal a certificate under the wrong key.
  if (prepared.model.sha256 != job.checkpoint_sha256)
    throw InputError(job.request.model.path, "sha256", "the checkpoint changed after the audit file was validated; rerun");
  const CertifyOutcome out = RunJob(prepared);
  return {job.key, job.spec, portable(ToJson(out.certificate))};
}

json ShardPlan(const AuditPlan& plan, int shard, int shards) {
  json p = plan.ToJson();
  json kept = json::array();
  for (size_t i = 0; i < p["jobs"].size(); ++i)
    if (int(i % size_t(shards)) == shard) kept.push_back(p["jobs"][i]);
  p["jobs"] = kept;
  p["shard"] = {shard, shards};
  return p;
}

JournalContents OutputFolder::Prepare(const json& plan_json) const {
  const fs::path parent = fs::absolute(dir).parent_path();
  if (!fs::is_directory(parent)) throw OptionError("out: the folder above " + dir + " does not exist");
  fs::create_directories(fs::path(dir) / "partial");
  WriteFileAtomic(dir + "/plan.json", plan_json.dump(2) + "\n");
  JournalContents c = ReadJournal(journal());
  if (c.dropped > 0)
    std::fprintf(stderr, "lipcert audit: %s: dropped %d torn or corrupted line(s); their jobs run again\n",
                 journal().c_str(), c.dropped);
  return c;
}

int RunAudit(const AuditPlan& plan, const RunOptions& o) {
  if (const std::string e = ValidateRunOptions(o); !e.empty()) throw OptionError(e);
  const OutputFolder out{o.out_dir};
  const json plan_json = ShardPlan(plan, o.shard, o.shards);
  JournalContents journal = out.Prepare(plan_json);
  std::set<std::string> done;
  for (const JournalEntry& e : journal.entries) done.insert(e.key);

  std::vector<const AuditJob*> todo;
  for (size_t i = 0; i < plan.jobs.size(); ++i)
    if (int(i % size_t(o.shards)) == o.shard && !done.count(plan.jobs[i].key)) todo.push_back(&plan.jobs[i]);
  const size_t in_shard = plan_json["jobs"].size();
  if (o.progress)
    std::fprintf(stderr, "lipcert audit: %zu jobs, %zu already in %s, %zu to run\n", in_shard, in_shard - todo.size(),
                 out.journal().c_str(), todo.size());

  const int workers = std::max(1, std::min<int>(o.jobs, int(todo.size())));
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  const int threads = o.threads > 0 ? o.threads : std::max(1, cores / workers);
  JournalWriter writer(out.journal());
  std::mutex mutex;  // guards new_entries, failures and stderr
  std::vector<JournalEntry> new_entries;
  std::map<std::string, std::string> failures;
  std::atomic<size_t> next{0};
  size_t finished = 0;
  auto work = [&] {
    for (size_t i = next++; i < todo.size(); i = next++) {
      const AuditJob& job = *todo[i];
      const std::string partial = out.partial(job.key);
      try {
        JournalEntry e = RunAuditJob(job, threads, partial);
        writer.Append(JournalLine(e));
        std::error_code ec;
        fs::remove(partial, ec);
        std::lock_guard<std::mutex> lock(mutex);
        ++finished;
        if (o.progress)
          std::fprintf(stderr, "[audit %zu/%zu] %s layer %d %s %s norm %s%s: upper %s lower %s (%s, %.1f s)\n", finished,
                       todo.size(), job.checkpoint_name.c_str(), job.spec["layer"].get<int>(),
                       job.spec["set"].get<std::string>().c_str(), job.spec["radius"].get<std::string>().c_str(),
                       job.spec["norm"].get<std::string>().c_str(), job.spec["attention_only"].get<bool>() ? " attention" : "",
                       Fmt(Value(e.certificate, "upper_bound", INFINITY)).c_str(),
                       Fmt(Value(e.certificate, "lower_bound", 0)).c_str(),
                       e.certificate["status"].get<std::string>().c_str(), Value(e.certificate, "elapsed_s", 0));
        new_entries.push_back(std::move(e));
      } catch (const std::exception& ex) {
        std::lock_guard<std::mutex> lock(mutex);
        ++finished;
        failures[job.key] = ex.what();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();

  for (JournalEntry& e : new_entries) journal.entries.push_back(std::move(e));
  int status = Summarise(plan_json, journal.entries, o.out_dir);
  for (const auto& [key, what] : failures) {
    std::fprintf(stderr, "lipcert audit: job %s failed: %s\n", key.substr(0, 12).c_str(), what.c_str());
    status = 1;
  }
  return status;
}

namespace {

// One job's line of the summary: its cells (under kSummaryHeader), verdict, and who it is.
struct SummaryRow {
  std::vector<std::string> cells;
  JobVerdict verdict;
  std::string who;
};
const std::vector<std::string> kSummaryHeader = {"checkpoint", "layer", "centre", "set", "radius", "norm", "part",
                                                 "upper", "lower", "gap", "status", "verdict"};

// The row of planned job pj, judged by its journal entry (missing where there is none).
SummaryRow SummaryRowOf(const json& pj, const std::map<std::string, const JournalEntry*>& by_key) {
  const json& s = pj["spec"];
  const std::string key = pj["key"];
  SummaryRow row;
  const std::string centre = s["centre"].get<std::string>();
  const size_t colon = centre.rfind(':');
  row.cells = {pj["checkpoint_name"].get<std::string>(), std::to_string(s["layer"].get<int>()),
               colon == std::string::npos ? fs::path(centre).filename().string() : centre.substr(colon + 1),
               s["set"].get<std::string>(), s["radius"].get<std::string>(), s["norm"].get<std::string>(),
               s["attention_only"].get<bool>() ? "attention" : "layer"};
  auto it = by_key.find(key);
  if (it == by_key.end()) {
    row.verdict = {Verdict::kMissing, "not in the journal (not run, failed, or killed)"};
    for (int k = 0; k < 4; ++k) row.cells.push_back("-");
  } else {
    const json& c = it->second->certificate;
    const double upper = Value(c, "upper_bound", INFINITY), lower = Value(c, "lower_bound", 0);
    row.cells.push_back(Fmt(upper, "%.6g"));
    row.cells.push_back(Fmt(lower, "%.6g"));
    row.cells.push_back(Fmt(lower > 0 ? upper / lower : INFINITY, "%.4g"));
    // A job that stopped at its work budget says so (status work_budget).
    const std::string status = c["status"].get<std::string>();
    row.cells.push_back(status == "work_budget" ? "budget" : status);
    row.verdict = Judge(Thresholds::FromJson(pj["thresholds"]), c);
  }
  row.cells.push_back(VerdictToString(row.verdict.verdict));
  row.who = row.cells[0] + " layer " + row.cells[1] + " centre " + row.cells[2] + " " + row.cells[3] + " radius " +
            row.cells[4] + " norm " + row.cells[5] + " " + row.cells[6] + " (key " + key.substr(0, 12) + ")";
  return row;
}

// The table on stdout, its columns aligned (numbers to the right).
void PrintSummaryTable(const std::vector<SummaryRow>& rows) {
  const std::vector<std::string>& header = kSummaryHeader;
  std::vector<size_t> width(header.size());
  for (size_t k = 0; k < header.size(); ++k) {
    width[k] = header[k].size();
    for (const SummaryRow& r : rows) width[k] = std::max(width[k], r.cells[k].size());
  }
  auto print = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t k = 0; k < cells.size(); ++k) {
      const bool numeric = k == 1 || (k >= 7 && k <= 9);
      const std::string pad(width[k] - cells[k].size(), ' ');
      line += (k ? "  " : "") + (numeric ? pad + cells[k] : cells[k] + (k + 1 < cells.size() ? pad : ""));
    }
    std::cout << line << "\n";
  };
  print(header);
  for (const SummaryRow& r : rows) print(r.cells);
  std::cout.flush();
}

}  // namespace

int Summarise(const json& plan_json, const std::vector<JournalEntry>& entries, const std::string& out_dir) {
  std::map<std::string, const JournalEntry*> by_key;
  for (const JournalEntry& e : entries) by_key.emplace(e.key, &e);
  const std::vector<std::string>& header = kSummaryHeader;
  std::vector<SummaryRow> rows;
  for (const json& pj : plan_json["jobs"]) rows.push_back(SummaryRowOf(pj, by_key));
  PrintSummaryTable(rows);

  // CSV beside the journal, and the report (reports/: report.html, report.md, audit.json).
  std::ostringstream csv;
  for (size_t k = 0; k < header.size(); ++k) csv << (k ? "," : "") << header[k];
  csv << ",reason,key\n";
  json doc = {{"schema", "lipcert.audit/1"}, {"audit_file", plan_json["audit_file"]}, {"jobs", json::array()}};
  size_t i = 0;
  for (const json& pj : plan_json["jobs"]) {
    const SummaryRow& r = rows[i++];
    auto quote = [](const std::string& s) {
      if (s.find_first_of(",\"\n") == std::string::npos) return s;
      std::string q = "\"";
      for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
      return q + "\"";
    };
    for (size_t k = 0; k < r.cells.size(); ++k) csv << (k ? "," : "") << quote(r.cells[k]);
    csv << "," << quote(r.verdict.reason) << "," << pj["key"].get<std::string>() << "\n";
    auto it = by_key.find(pj["key"].get<std::string>());
    doc["jobs"].push_back({{"key", pj["key"]},
                           {"checkpoint_name", pj["checkpoint_name"]},
                           {"spec", pj["spec"]},
                           {"thresholds", pj["thresholds"]},
                           {"verdict", VerdictToString(r.verdict.verdict)},
                           {"reason", r.verdict.reason},
                           {"certificate", it == by_key.end() ? json(nullptr) : it->second->certificate}});
  }
  WriteFileAtomic(out_dir + "/summary.csv", csv.str());
  WriteAuditReport(doc, out_dir);

  int status = 0;
  for (const SummaryRow& r : rows)
    if (r.verdict.verdict == Verdict::kViolated || r.verdict.verdict == Verdict::kUnproven ||
        r.verdict.verdict == Verdict::kMissing) {
      std::cerr << "lipcert audit: " << VerdictToString(r.verdict.verdict) << ": " << r.who << ": " << r.verdict.reason
                << "\n";
      status = 1;
    }
  return status;
}

int MergeAudits(const std::vector<std::string>& dirs, const std::string& out_dir) {
  if (dirs.empty()) throw OptionError("merge: give the output folders to merge");
  json merged;
  std::vector<JournalEntry> entries;
  std::set<std::string> seen, planned;
  for (const std::string& d : dirs) {
    const std::string plan_path = d + "/plan.json";
    if (!fs::is_regular_file(plan_path)) throw InputError(plan_path, "plan", "not found (not an audit output folder)");
    json p;
    try {
      p = json::parse(ReadWholeFile(plan_path));
    } catch (const std::exception& e) {
      throw InputError(plan_path, "plan", std::string("unreadable: ") + e.what());
    }
    if (!p.is_object() || p.value("schema", "") != "lipcert.audit-plan/1" || !p["jobs"].is_array())
      throw InputError(plan_path, "schema", "expected lipcert.audit-plan/1");
    if (merged.is_null()) {
      merged = p;
      merged["jobs"] = json::array();
    } else if (p["audit_file"] != merged["audit_file"]) {
      throw InputError(plan_path, "audit_file", "a shard of " + p["audit_file"].dump() + ", not of " + merged["audit_file"].dump());
    }
    for (const json& j : p["jobs"])
      if (planned.insert(j["key"].get<std::string>()).second) merged["jobs"].push_back(j);
    JournalContents c = ReadJournal(d + "/journal.jsonl");
    if (c.dropped > 0) std::fprintf(stderr, "lipcert audit merge: %s: dropped %d torn line(s)\n", d.c_str(), c.dropped);
    for (JournalEntry& e : c.entries)
      if (seen.insert(e.key).second) entries.push_back(std::move(e));
  }
  merged["shard"] = {0, 1};
  // Jobs in the order of the audit file (each shard holds every N-th job).
  std::stable_sort(merged["jobs"].begin(), merged["jobs"].end(),
                   [](const json& a, const json& b) { return a["index"].get<size_t>() < b["index"].get<size_t>(); });
  const OutputFolder out{out_dir};
  (void)out.Prepare(merged);
  // The merged journal, written whole and atomically (it replaces any earlier merge).
  std::string text;
  for (const JournalEntry& e : entries)
    if (planned.count(e.key)) text += JournalLine(e);
  WriteFileAtomic(out.journal(), text);
  return Summarise(merged, entries, out_dir);
}

}  // namespace lipcert::audit
