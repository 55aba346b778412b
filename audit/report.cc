#include "audit/report.h"

#include <cmath>
#include <map>

#include "certify/certificate.h"
#include "reports/report.h"
#include "reports/svg_plot.h"

namespace lipcert::audit {

using nlohmann::json;
namespace rp = lipcert::reports;

namespace {

std::string CheckAudit(const json& doc) {
  if (!doc.contains("audit_file") || !doc["audit_file"].is_string()) return "audit_file: expected a string";
  if (!doc.contains("jobs") || !doc["jobs"].is_array()) return "jobs: expected an array";
  for (size_t i = 0; i < doc["jobs"].size(); ++i) {
    const json& j = doc["jobs"][i];
    const std::string at = "jobs[" + std::to_string(i) + "]";
    for (const char* k : {"key", "checkpoint_name", "verdict"})
      if (!j.contains(k) || !j[k].is_string()) return at + "." + k + ": expected a string";
    if (!j.contains("spec") || !j["spec"].is_object()) return at + ".spec: expected an object";
    for (const char* k : {"layer", "set", "radius", "norm", "attention_only", "centre"})
      if (!j["spec"].contains(k)) return at + ".spec." + k + ": missing";
    if (!j.contains("certificate") || !(j["certificate"].is_null() || j["certificate"].is_object()))
      return at + ".certificate: expected an object or null";
  }
  return "";
}

double Num(const json& c, const char* k, double if_null) {
  return c.is_object() && c.contains(k) && c[k].is_number() ? c[k].get<double>() : if_null;
}

// "max_upper 1000, max_gap 10" ("-" when none).
std::string ThresholdsText(const json& t) {
  std::string out;
  for (const char* k : {"max_upper", "max_gap", "min_lower"})
    if (t.contains(k) && t[k].is_number()) out += (out.empty() ? "" : ", ") + std::string(k) + " " + rp::FormatNumber(t[k].get<double>());
  return out.empty() ? "-" : out;
}

std::vector<rp::Section> RenderAudits(const std::vector<const rp::ReportInput*>& inputs) {
  std::vector<rp::Section> out;
  for (const rp::ReportInput* in : inputs) {
    const json& doc = in->doc;
    rp::Section s;
    s.title = "Audit " + doc["audit_file"].get<std::string>();
    std::map<std::string, int> counts;
    for (const json& j : doc["jobs"]) ++counts[j["verdict"].get<std::string>()];
    std::string tally;
    for (const auto& [v, n] : counts) tally += (tally.empty() ? "" : ", ") + std::to_string(n) + " " + v;
    s.blocks.push_back(rp::Paragraph{std::to_string(doc["jobs"].size()) + " jobs: " + tally +
                                     ". Certified upper bounds are proven over each set; witnessed lower bounds are "
                                     "attained at a point of the set (interval arithmetic). A verdict is VIOLATED when "
                                     "a bound proves a threshold broken, UNPROVEN when the job could not show that it "
                                     "holds within its limit."});
    rp::BarPlot bp;
    bp.title = "Certified and witnessed bounds per job";
    bp.y_label = "Lipschitz bound";
    bp.bar_labels = {"certified upper", "witnessed lower"};
    bp.bar_ids = {"upper", "lower"};
    bp.colors = {"#1f77b4", "#d62728"};
    rp::Table t;
    t.caption = "One row per job";
    t.header = {"#", "checkpoint", "layer", "centre", "set", "radius", "norm", "part", "certified upper",
                "witnessed lower", "gap", "status", "seconds", "thresholds", "verdict", "reason"};
    int i = 0;
    for (const json& j : doc["jobs"]) {
      const json& sp = j["spec"];
      const json& c = j["certificate"];
      const double upper = Num(c, "upper_bound", INFINITY), lower = Num(c, "lower_bound", 0);
      const std::string centre = sp["centre"].get<std::string>();
      const size_t colon = centre.rfind(':');
      ++i;
      t.rows.push_back({std::to_string(i), j["checkpoint_name"].get<std::string>(), std::to_string(sp["layer"].get<int>()),
                        colon == std::string::npos ? centre : centre.substr(colon + 1), sp["set"].get<std::string>(),
                        sp["radius"].get<std::string>(), sp["norm"].get<std::string>(),
                        sp["attention_only"].get<bool>() ? "attention" : "layer",
                        c.is_null() ? "-" : rp::FormatNumber(upper), c.is_null() ? "-" : rp::FormatNumber(lower),
                        c.is_null() ? "-" : rp::FormatNumber(lower > 0 ? upper / lower : INFINITY, 4),
                        c.is_null() ? "missing" : c.value("status", "?"),
                        c.is_null() ? "-" : rp::FormatNumber(Num(c, "elapsed_s", 0), 3),
                        ThresholdsText(j.value("thresholds", json::object())), j["verdict"].get<std::string>(),
                        j.value("reason", "")});
      if (!c.is_null()) bp.groups.push_back({"#" + std::to_string(i), {upper, lower}});
    }
    if (!bp.groups.empty())
      s.blocks.push_back(rp::Figure{"audit", rp::RenderBarPlot(bp), "Bars numbered as the rows of the table."});
    s.blocks.push_back(t);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

void RegisterAuditSchema() { rp::RegisterSchema({"lipcert.audit/1", CheckAudit, RenderAudits}); }

namespace {
// Registered when the audit library is linked in, so that `lipcert report OUT/audit.json`
// reads audit documents too.
const bool kRegistered = (RegisterAuditSchema(), true);
}  // namespace

void WriteAuditReport(const json& doc, const std::string& out_dir) {
  RegisterAuditSchema();
  const std::string path = out_dir + "/audit.json";
  WriteFileAtomic(path, doc.dump(1) + "\n");
  const std::vector<rp::ReportInput> inputs = {{path, doc}};
  rp::CheckReportInput(inputs[0]);
  rp::ReportOptions o;
  o.title = "lipcert audit: " + doc["audit_file"].get<std::string>();
  o.command_line = rp::ProcessCommandLine();
  const std::vector<rp::Section> sections = rp::BuildSections(inputs, o);
  WriteFileAtomic(out_dir + "/report.html", rp::RenderHtml(sections, o));
  WriteFileAtomic(out_dir + "/report.md", rp::RenderMarkdown(sections, o, out_dir, ""));
}

}  // namespace lipcert::audit
