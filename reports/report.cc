// The schema table, reading and checking inputs, and assembling sections.
#include "reports/report.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "models/errors.h"
#include "reports/schemas.h"
#include "reports/validation.h"

namespace lipcert::reports {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, SchemaHandler> handlers;
};

Registry& TheRegistry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    for (const SchemaHandler& h : {CertificateSchema(), SweepSchema()}) reg->handlers[h.schema] = h;
    return reg;
  }();
  return *r;
}

bool FindHandler(const std::string& schema, SchemaHandler* out) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.handlers.find(schema);
  if (it == r.handlers.end()) return false;
  *out = it->second;
  return true;
}

std::string JoinSchemas() {
  std::string s;
  for (const std::string& name : RegisteredSchemas()) s += (s.empty() ? "" : ", ") + name;
  return s;
}

}  // namespace

void RegisterSchema(const SchemaHandler& handler) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.handlers[handler.schema] = handler;
}

std::vector<std::string> RegisteredSchemas() {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> out;
  for (const auto& [name, h] : r.handlers) out.push_back(name);
  return out;
}

void CheckReportInput(const ReportInput& in) {
  if (!in.doc.is_object()) throw InputError(in.path, "(top level)", "expected a JSON object");
  if (!in.doc.contains("schema")) throw InputError(in.path, "schema", "missing (expected one of " + JoinSchemas() + ")");
  if (!in.doc["schema"].is_string()) throw InputError(in.path, "schema", "expected a string");
  const std::string schema = in.doc["schema"].get<std::string>();
  SchemaHandler h;
  if (!FindHandler(schema, &h))
    throw InputError(in.path, "schema", "unknown schema '" + schema + "' (expected one of " + JoinSchemas() + ")");
  const std::string problem = h.check(in.doc);
  if (!problem.empty()) {
    const size_t colon = problem.find(": ");
    if (colon == std::string::npos) throw InputError(in.path, "(document)", problem);
    throw InputError(in.path, problem.substr(0, colon), problem.substr(colon + 2));
  }
}

std::vector<ReportInput> ReadReportInputs(const std::vector<std::string>& paths) {
  if (paths.empty()) throw OptionError("inputs: give at least one JSON file");
  std::vector<ReportInput> inputs;
  for (const std::string& path : paths) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw InputError(path, "(file)", "cannot open for reading");
    std::stringstream ss;
    ss << f.rdbuf();
    ReportInput in{path, nlohmann::json()};
    try {
      in.doc = nlohmann::json::parse(ss.str());
    } catch (const nlohmann::json::parse_error& e) {
      throw InputError(path, "(json)", std::string("malformed JSON: ") + e.what());
    }
    CheckReportInput(in);
    inputs.push_back(std::move(in));
  }
  return inputs;
}

std::vector<Section> BuildSections(const std::vector<ReportInput>& inputs, const ReportOptions& options) {
  std::vector<std::string> order;  // schemas in order of first appearance
  std::map<std::string, std::vector<const ReportInput*>> by_schema;
  for (const ReportInput& in : inputs) {
    const std::string schema = in.doc.at("schema").get<std::string>();
    if (!by_schema.count(schema)) order.push_back(schema);
    by_schema[schema].push_back(&in);
  }
  std::vector<Section> sections;
  for (const std::string& schema : order) {
    SchemaHandler h;
    if (!FindHandler(schema, &h)) throw InputError(by_schema[schema].front()->path, "schema", "unknown schema '" + schema + "'");
    for (Section& s : h.render(by_schema[schema])) sections.push_back(std::move(s));
  }
  if (options.validate) {
    ValidationOptions v;
    v.time_limit_s = options.validation_time_limit_s;
    v.threads = options.threads;
    for (Section& s : ValidationSections(RunValidation(v))) sections.push_back(std::move(s));
  }
  sections.push_back(ReportProvenanceSection(inputs, options));
  return sections;
}

std::string RenderHtml(const std::vector<ReportInput>& inputs, const ReportOptions& options) {
  return RenderHtml(BuildSections(inputs, options), options);
}

std::string RenderMarkdown(const std::vector<ReportInput>& inputs, const ReportOptions& options,
                           const std::string& svg_dir, const std::string& svg_link_prefix) {
  return RenderMarkdown(BuildSections(inputs, options), options, svg_dir, svg_link_prefix);
}

std::string FormatNumber(double v, int digits) {
  if (std::isnan(v)) return "—";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string FormatJsonNumber(const nlohmann::json& v, int digits) {
  if (v.is_null()) return "inf";
  if (!v.is_number()) return "—";
  return FormatNumber(v.get<double>(), digits);
}

}  // namespace lipcert::reports

namespace lipcert::reports {

std::string ProcessCommandLine() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string raw = ss.str();
  std::string out, arg;
  auto flush = [&] {
    const bool plain = !arg.empty() && arg.find_first_not_of(
                           "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == std::string::npos;
    std::string q = plain ? arg : "'";
    if (!plain) {
      for (char c : arg) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      q += "'";
    }
    out += (out.empty() ? "" : " ") + q;
    arg.clear();
  };
  for (char c : raw) {
    if (c == '\0') flush();
    else arg += c;
  }
  if (!arg.empty()) flush();
  // Name the program by its file name, not this machine's path to it.
  const size_t space = out.find(' ');
  const std::string prog = out.substr(0, space);
  const size_t slash = prog.rfind('/');
  if (slash != std::string::npos) out = prog.substr(slash + 1) + (space == std::string::npos ? "" : out.substr(space));
  return out;
}

}  // namespace lipcert::reports
