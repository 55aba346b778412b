// The sweep driver: plan the points, resume from the journal, certify the rest, write.
#include "reports/sweep.h"

#include "models/sha256.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "certify/pipeline.h"
#include "models/errors.h"
#include "models/loader.h"
#include "reports/schemas.h"

namespace lipcert::reports {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

struct PlannedPoint {
  int model = 0;        // index into options.models
  int layer = 0;        // checkpoint layer index
  int tokens = 0;       // requested N (0: from the centre file)
  double radius = 0;    // requested radius (absolute or relative)
  std::string key;
};

// Live progress on stderr: one rewritten line on a terminal, else a line per point.
class Progress {
 public:
  Progress(bool enabled, int total) : enabled_(enabled), tty_(isatty(2)), total_(total) {}
  void Start(const std::string& what) {
    current_ = what;
    if (tty_) Line("certifying");
  }
  void Improved(const Certificate& c) {
    if (!tty_) return;
    char buf[96];
    std::snprintf(buf, sizeof buf, "upper %.6g  lower %.6g", c.upper_bound.value(), c.lower_bound.value());
    Line(buf);
  }
  void Done(const Certificate& c) {
    ++done_;
    if (!enabled_) return;
    char buf[160];
    std::snprintf(buf, sizeof buf, "upper %.6g  lower %.6g  gap %.4g  %s  %.1f s", c.upper_bound.value(),
                  c.lower_bound.value(), c.gap(), CertificateStatusToString(c.status), c.elapsed_s);
    if (tty_) {
      Line(buf);
    } else {
      std::fprintf(stderr, "sweep: [%d/%d] %s: %s\n", done_ + skipped_, total_, current_.c_str(), buf);
    }
  }
  void Skipped(int n) { skipped_ = n; }
  void Finish() {
    if (enabled_ && tty_) std::fprintf(stderr, "\n");
  }

 private:
  using Clock = std::chrono::steady_clock;
  static std::string Clockface(double s) {
    char buf[32];
    const int t = int(s + 0.5);
    std::snprintf(buf, sizeof buf, "%d:%02d", t / 60, t % 60);
    return buf;
  }
  void Line(const std::string& bounds) {
    if (!enabled_) return;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    const int left = total_ - done_ - skipped_;
    const double per = done_ > 0 ? elapsed / done_ : 0;
    const std::string eta = done_ > 0 ? Clockface(per * left) : "?";
    std::fprintf(stderr, "\r\033[Ksweep: %d/%d done, %s elapsed, ~%s left | %s: %s", done_ + skipped_, total_,
                 Clockface(elapsed).c_str(), eta.c_str(), current_.c_str(), bounds.c_str());
    std::fflush(stderr);
  }
  bool enabled_, tty_;
  int total_, done_ = 0, skipped_ = 0;
  std::string current_;
  Clock::time_point start_ = Clock::now();
};

// The existing journal in out_dir, or an empty object.
json ReadJournal(const std::string& path) {
  if (!fs::exists(path)) return json();
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  ReportInput in{path, json()};
  try {
    in.doc = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    throw InputError(path, "(json)", std::string("malformed journal: ") + e.what() + " (remove it to start over)");
  }
  CheckReportInput(in);
  if (in.doc["schema"] != "lipcert.sweep/1") throw InputError(path, "schema", "not a sweep journal");
  return in.doc;
}

std::string ModelStem(const std::string& path) {
  const fs::path p(path);
  return p.extension() == ".safetensors" && p.stem() != "model" ? p.stem().string() : p.filename().string();
}

}  // namespace

std::string SweepOptions::IsValid() const {
  if (models.empty()) return "models: give at least one --model";
  if (centres.empty()) return "center: give --center (zero or FILE[:TENSOR])";
  if (centres.size() != 1 && centres.size() != models.size())
    return "center: give one --center for all models or one per --model (" + std::to_string(models.size()) + ")";
  if (radii.empty() == relative_radii.empty()) return "radii: give exactly one of --radii and --relative-radii";
  for (double r : radii)
    if (!(r >= 0) || !std::isfinite(r)) return "radii: every radius must be finite and >= 0";
  for (double r : relative_radii)
    if (!(r >= 0) || !std::isfinite(r)) return "relative_radii: every fraction must be finite and >= 0";
  for (int n : tokens_list)
    if (n < 1) return "tokens_list: every N must be >= 1";
  const bool any_zero = std::any_of(centres.begin(), centres.end(), [](const std::string& c) { return c == "zero"; });
  if (!tokens_list.empty() && !std::all_of(centres.begin(), centres.end(), [](const std::string& c) { return c == "zero"; }))
    return "tokens_list: needs --center zero (a centre file fixes N)";
  if (any_zero && tokens < 1 && tokens_list.empty()) return "tokens: --center zero needs --tokens N or --tokens-list";
  if (any_zero && !relative_radii.empty()) return "relative_radii: ||X0||_F is 0 for --center zero; use --radii";
  if (!layer.empty() && layer != "all") {
    char* end = nullptr;
    const long v = std::strtol(layer.c_str(), &end, 10);
    if (*end != '\0' || v < 0) return "layer: expected a layer index >= 0 or 'all', got '" + layer + "'";
  }
  if (!(time_limit_per_point_s > 0)) return "time_limit_per_point: must be positive";
  if (const std::string e = budget.IsValid(); !e.empty()) return e;
  if (out_dir.empty()) return "out: give an output folder";
  return "";
}

std::string PointKey(const std::string& sha, int layer, SetKind set, bool relative, double radius, int tokens,
                     NormKind norm, bool attention_only, const std::string& centre) {
  return sha + "|layer=" + std::to_string(layer) + "|set=" + SetKindToString(set) + "|" +
         (relative ? "relative_radius=" : "radius=") + Exact(radius) + "|tokens=" + std::to_string(tokens) +
         "|norm=" + NormKindToString(norm) + "|attention_only=" + (attention_only ? "true" : "false") +
         "|centre=" + centre;
}

namespace {

// Every model loaded (into *models, their journal entries into *models_json) and every point
// planned, before anything is certified.
std::vector<PlannedPoint> PlanSweep(const SweepOptions& o, std::vector<LoadedModel>* models, json* models_json) {
  const bool relative = !o.relative_radii.empty();
  const std::vector<double>& radii = relative ? o.relative_radii : o.radii;
  const std::vector<int> tokens_list = o.tokens_list.empty() ? std::vector<int>{o.tokens} : o.tokens_list;
  std::vector<PlannedPoint> plan;
  for (size_t m = 0; m < o.models.size(); ++m) {
    LoadOptions lo;
    lo.preset = o.preset;
    lo.heads = o.heads;
    lo.layer = (o.layer.empty() || o.layer == "all") ? -1 : std::stoi(o.layer);
    models->push_back(LoadModel(o.models[m], lo));
    const LoadedModel& lm = models->back();
    std::vector<int> layers;
    if (o.layer == "all") {
      layers = lm.layer_indices;
    } else {
      layers = {lm.layer_indices[SelectLayer(lm, o.layer.empty() ? -1 : std::stoi(o.layer))]};
    }
    const std::string centre = o.centres.size() == 1 ? o.centres[0] : o.centres[m];
    models_json->push_back({{"path", o.models[m]}, {"sha256", lm.sha256}, {"preset", lm.preset}, {"layers", layers},
                            {"centre", centre}});
    for (int layer : layers)
      for (int n : tokens_list)
        for (double r : radii) {
          const int tokens = centre == "zero" ? n : 0;
          plan.push_back({int(m), layer, tokens, r,
                          PointKey(lm.sha256, layer, o.set, relative, r, tokens, o.norm, o.attention_only, centre)});
        }
  }
  return plan;
}

// The request of one planned point.
CertifyRequest RequestOf(const SweepOptions& o, const PlannedPoint& p) {
  const bool relative = !o.relative_radii.empty();
  CertifyRequest r;
  r.model = {o.models[p.model], o.preset, p.layer, o.heads, o.attention_only};
  r.set.kind = o.set;
  r.set.centre = o.centres.size() == 1 ? o.centres[0] : o.centres[p.model];
  r.set.tokens = p.tokens;
  (relative ? r.set.relative_radius : r.set.radius) = p.radius;
  r.options.norm = o.norm;
  r.options.time_limit_s = o.time_limit_per_point_s;
  r.options.budget = o.budget;
  r.options.threads = o.threads;
  r.options.progress = false;
  return r;
}

// Validates one request per (model, layer, tokens) now (centre file, shapes), not at its first point.
void ValidatePlan(const SweepOptions& o, const std::vector<PlannedPoint>& plan, const std::vector<LoadedModel>& models) {
  std::map<std::string, bool> checked;
  for (const PlannedPoint& p : plan) {
    const std::string mk = std::to_string(p.model) + "/" + std::to_string(p.layer) + "/" + std::to_string(p.tokens);
    if (checked[mk]) continue;
    checked[mk] = true;
    (void)PrepareJob(RequestOf(o, p), models[p.model]);
  }
}

// Resume: the journal's points that this sweep plans are kept, by key; others mean another
// sweep. *journal is the journal read, or empty where there is none or another build of
// lipcert wrote it (its points are certified again and the journal rewritten).
std::map<std::string, json> JournalledPoints(const SweepOptions& o, const std::string& journal_path,
                                             const std::vector<PlannedPoint>& plan, json* journal) {
  std::set<std::string> planned;
  for (const PlannedPoint& p : plan) planned.insert(p.key);
  *journal = ReadJournal(journal_path);
  std::map<std::string, json> done;
  if (journal->is_object() && journal->value("lipcert_build", std::string()) != ExecutableSha256()) {
    if (o.progress)
      std::fprintf(stderr, "sweep: %s was written by another build of lipcert: its points are certified again\n",
                   journal_path.c_str());
    *journal = json();
  }
  if (journal->is_object()) {
    for (const json& p : (*journal)["points"]) {
      const std::string key = p["key"].get<std::string>();
      if (!planned.count(key))
        throw OptionError("out: " + journal_path + " holds a different sweep (point " + key +
                          " is not in this one); use another --out folder");
      done[key] = p;
    }
  }
  return done;
}

// The sweep document before its points: what was asked, by which build, since when.
json SweepHeader(const SweepOptions& o, const json& journal, const json& models_json, int total_points) {
  const bool relative = !o.relative_radii.empty();
  const std::vector<double>& radii = relative ? o.relative_radii : o.radii;
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  return {{"schema", "lipcert.sweep/1"},
          {"lipcert_version", LipcertVersion()},
          {"lipcert_build", ExecutableSha256()},
          {"command_line", o.command_line},
          {"started", journal.is_object() ? journal.value("started", UtcNow()) : UtcNow()},
          {"updated", UtcNow()},
          {"threads", threads},
          {"set", SetKindToString(o.set)},
          {"norm", NormKindToString(o.norm)},
          {"attention_only", o.attention_only},
          {"radius_kind", relative ? "relative" : "absolute"},
          {"radii", radii},
          {"tokens_list", o.tokens_list.empty() ? json::array() : json(o.tokens_list)},
          {"time_limit_per_point_s", o.time_limit_per_point_s},
          {"budget", o.budget.enabled() ? json(WorkBudgetToString(o.budget)) : json(nullptr)},
          {"layer", o.layer.empty() ? json("only") : json(o.layer)},
          {"models", models_json},
          {"total_points", total_points},
          {"complete", false},
          {"points", json::array()}};
}

// Certifies one planned point; its journal entry.
json CertifyPoint(const SweepOptions& o, const PlannedPoint& p, const LoadedModel& model, Progress* progress) {
  const bool relative = !o.relative_radii.empty();
  const CertifyRequest r = RequestOf(o, p);
  PreparedJob job = PrepareJob(r, model);
  job.options.on_improvement = [progress](const Certificate& c) { progress->Improved(c); };
  char what[256];
  std::snprintf(what, sizeof what, "%s layer %d N=%d %s=%g", ModelStem(o.models[p.model]).c_str(), p.layer,
                job.set.tokens(), relative ? "rel" : "R", p.radius);
  progress->Start(what);
  const CertifyOutcome out = RunJob(job);
  progress->Done(out.certificate);
  return {{"key", p.key},
          {"model", {{"path", o.models[p.model]}, {"sha256", model.sha256}}},
          {"layer", p.layer},
          {"set", SetKindToString(o.set)},
          {"radius_kind", relative ? "relative" : "absolute"},
          {"radius_request", p.radius},
          {"radius", job.set.radius},
          {"tokens", job.set.tokens()},
          {"norm", NormKindToString(o.norm)},
          {"attention_only", o.attention_only},
          {"centre", r.set.centre},
          {"finished", UtcNow()},
          {"certificate", ToJson(out.certificate)}};
}

}  // namespace

SweepSummary RunSweep(const SweepOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  if (std::string e = o.IsValid(); !e.empty()) throw OptionError(e);
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (!fs::is_directory(o.out_dir)) throw OptionError("out: cannot create folder " + o.out_dir);
  const std::string journal_path = (fs::path(o.out_dir) / "sweep.json").string();

  std::vector<LoadedModel> models;
  json models_json = json::array();
  const std::vector<PlannedPoint> plan = PlanSweep(o, &models, &models_json);
  ValidatePlan(o, plan, models);
  json journal;
  std::map<std::string, json> done = JournalledPoints(o, journal_path, plan, &journal);
  json doc = SweepHeader(o, journal, models_json, int(plan.size()));
  SweepSummary summary;
  summary.total = int(plan.size());
  summary.json_path = journal_path;
  // Points in plan order: journalled ones first as they are, then the rest as they finish.
  for (const PlannedPoint& p : plan)
    if (done.count(p.key)) doc["points"].push_back(done[p.key]);
  summary.resumed = int(doc["points"].size());
  Progress progress(o.progress, summary.total);
  progress.Skipped(summary.resumed);
  if (o.progress && summary.resumed > 0)
    std::fprintf(stderr, "sweep: resuming %s: %d of %d points already done\n", journal_path.c_str(), summary.resumed,
                 summary.total);
  for (const PlannedPoint& p : plan) {
    if (done.count(p.key)) continue;
    doc["points"].push_back(CertifyPoint(o, p, models[p.model], &progress));
    doc["updated"] = UtcNow();
    WriteFileAtomic(journal_path, doc.dump(1) + "\n");
    WriteFileAtomic((fs::path(o.out_dir) / "sweep.csv").string(), SweepCsv(doc));
    ++summary.computed;
  }
  progress.Finish();
  doc["complete"] = true;
  doc["updated"] = UtcNow();
  WriteFileAtomic(journal_path, doc.dump(1) + "\n");
  ReportOptions ro;
  ro.title = "lipcert sweep report";
  ro.command_line = o.command_line;
  ro.validate = o.validate;
  ro.validation_time_limit_s = o.validation_time_limit_s;
  ro.threads = o.threads;
  WriteSweepOutputs(doc, o.out_dir, ro, &summary);
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

std::string SweepCsv(const json& sw) {
  std::ostringstream os;
  os << "model,sha256,layer,kind,set,norm,attention_only,centre,tokens,radius_request,radius,upper_bound,lower_bound,"
        "gap,winning_engine,status,seconds,closed_forms\n";
  auto q = [](const std::string& s) {
    std::string out = "\"";
    for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    return out + "\"";
  };
  for (const json& p : sw["points"]) {
    const json& c = p["certificate"];
    std::string cf;
    for (const auto& [name, v] : ClosedForms(c)) cf += (cf.empty() ? "" : ";") + name + "=" + Exact(v);
    os << q(c["model"]["path"].get<std::string>()) << "," << c["model"]["sha256"].get<std::string>() << ","
       << p["layer"].get<int>() << "," << c["layer"]["kind"].get<std::string>() << "," << c["set"]["kind"].get<std::string>()
       << "," << c["norm"].get<std::string>() << "," << (p.value("attention_only", false) ? "true" : "false") << ","
       << q(p.value("centre", std::string())) << "," << p["tokens"].get<int>() << "," << Exact(p["radius_request"].get<double>())
       << "," << Exact(c["set"]["radius"].get<double>()) << ","
       << (c["upper_bound"].is_number() ? Exact(c["upper_bound"].get<double>()) : "inf") << ","
       << Exact(c["lower_bound"].get<double>()) << ","
       << (c["gap"].is_number() ? Exact(c["gap"].get<double>()) : "inf") << "," << WinningEngine(c) << ","
       << c["status"].get<std::string>() << "," << Exact(c["elapsed_s"].get<double>()) << "," << q(cf) << "\n";
  }
  return os.str();
}

void WriteSweepOutputs(const json& sweep, const std::string& out_dir, const ReportOptions& options,
                       SweepSummary* summary) {
  const fs::path dir(out_dir);
  const std::vector<ReportInput> inputs = {{(dir / "sweep.json").string(), sweep}};
  CheckReportInput(inputs[0]);
  const std::vector<Section> sections = BuildSections(inputs, options);
  const std::string csv = (dir / "sweep.csv").string(), html = (dir / "report.html").string(),
                    md = (dir / "report.md").string();
  WriteFileAtomic(csv, SweepCsv(sweep));
  WriteFileAtomic(html, RenderHtml(sections, options));
  WriteFileAtomic(md, RenderMarkdown(sections, options, out_dir, ""));
  if (summary) summary->csv_path = csv, summary->html_path = html, summary->markdown_path = md;
}

}  // namespace lipcert::reports
