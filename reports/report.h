// Reports: what `lipcert report` and `lipcert sweep` render from JSON documents
// (certificates, sweeps, and whatever else registers a schema), without recomputing.
//
//   files --ReadReportInputs--> ReportInput (path + parsed JSON, schema checked)
//         --schema handler----> Section (text, figures as inline SVG, tables)
//         --RenderHtml / RenderMarkdown--> one self-contained HTML file / Markdown + SVGs
//
// Each schema ("lipcert.certificate/1", "lipcert.sweep/1", ...) has one handler in a small
// table: Check() names the first bad field of a document, Render() turns every input of
// that schema into sections. A front end adds its schema with RegisterSchema (the audit
// helper registers "lipcert.audit/1" this way) before it calls ReadReportInputs.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

namespace lipcert::reports {

struct ReportInput {
  std::string path;     // the file it came from (named in errors)
  nlohmann::json doc;   // its parsed content; doc["schema"] has a registered handler
};

// The blocks a section is made of, in order.
struct Paragraph {
  std::string text;     // plain text (escaped by the renderers); `code` marks it as a command
  bool code = false;
};
struct Figure {
  std::string name;     // file stem for the Markdown twin's SVG ("headline" -> headline.svg)
  std::string svg;      // a complete <svg> element (reports/svg_plot.h)
  std::string caption;
};
struct Table {
  std::string caption;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;  // each row as many cells as the header
};
using Block = std::variant<Paragraph, Figure, Table>;

struct Section {
  std::string title;
  std::vector<Block> blocks;
};

struct ReportOptions {
  std::string title = "lipcert report";
  std::string command_line;   // how this report was made (shown in the provenance)
  bool validate = false;      // append the validation section (reports/validation.h)
  double validation_time_limit_s = 2;  // per certificate in the validation section
  int threads = 0;            // for the validation section's certificates (0: all cores)
};

// One schema's handler. Check returns "" or "FIELD: message" for the first bad field
// (FIELD as a JSON path, e.g. "points[3].certificate.upper_bound"); Render gets every
// input of this schema, in command-line order, already checked.
struct SchemaHandler {
  std::string schema;
  std::function<std::string(const nlohmann::json& doc)> check;
  std::function<std::vector<Section>(const std::vector<const ReportInput*>& inputs)> render;
};

// Adds (or replaces) the handler of handler.schema. Built in: lipcert.certificate/1 and
// lipcert.sweep/1.
void RegisterSchema(const SchemaHandler& handler);
// The registered schemas, for error messages and --help.
std::vector<std::string> RegisteredSchemas();

// Reads and checks every file before anything is rendered. Throws InputError (models/errors.h)
// naming the file and the field: unreadable file, malformed JSON, missing or unknown
// "schema", or the handler's Check failing.
std::vector<ReportInput> ReadReportInputs(const std::vector<std::string>& paths);
// The same check on a document already in memory (throws InputError naming `path`).
void CheckReportInput(const ReportInput& input);

// The sections of a report: each schema's sections (in the order the schemas first appear
// among the inputs), then the validation section when options.validate, then provenance.
std::vector<Section> BuildSections(const std::vector<ReportInput>& inputs, const ReportOptions& options);

// One self-contained HTML file: inline CSS and SVG, a few lines of script for hover values
// only (the report reads fully without it). No network, no external files.
std::string RenderHtml(const std::vector<Section>& sections, const ReportOptions& options);
std::string RenderHtml(const std::vector<ReportInput>& inputs, const ReportOptions& options);

// The Markdown twin: the same tables; each figure written as svg_dir/<name>.svg and linked
// by the relative path svg_link_prefix + <name>.svg. Figures are written atomically.
std::string RenderMarkdown(const std::vector<Section>& sections, const ReportOptions& options,
                           const std::string& svg_dir, const std::string& svg_link_prefix);
std::string RenderMarkdown(const std::vector<ReportInput>& inputs, const ReportOptions& options,
                           const std::string& svg_dir, const std::string& svg_link_prefix);

// Helpers shared by the handlers.
std::string FormatNumber(double v, int digits = 6);  // "1.2345", "3.1e+07", "inf", "—" for NaN
std::string FormatJsonNumber(const nlohmann::json& v, int digits = 6);  // null -> "inf"

}  // namespace lipcert::reports

namespace lipcert::reports {
// This process's command line as a shell would read it back (from /proc/self/cmdline;
// arguments quoted where needed), for the provenance of sweeps and reports.
std::string ProcessCommandLine();
}  // namespace lipcert::reports
