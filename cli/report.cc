// lipcert report INPUT.json... --html OUT.html [--markdown OUT.md] [--validate]
// Renders certificates (lipcert.certificate/1), sweeps (lipcert.sweep/1) and any other
// registered schema into one self-contained HTML file (and a Markdown twin with its SVGs
// beside it), without recomputing. Every input is read and checked before anything is
// written: a malformed or unknown input is one line naming the file and the field, exit 2.
#include <filesystem>
#include <iostream>

#include "certify/certificate.h"
#include "cli/commands.h"
#include "models/errors.h"
#include "reports/report.h"

namespace lipcert::cli {
namespace {

struct ReportArgs {
  std::vector<std::string> inputs;
  std::string html, markdown, title = "lipcert report";
  bool validate = false;
  double validation_time_limit = 2;
  int threads = 0;
};

void CheckOutputFolder(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  const std::filesystem::path dir = std::filesystem::absolute(path).parent_path();
  if (!std::filesystem::is_directory(dir)) throw OptionError(flag + ": output folder of " + path + " does not exist");
}

}  // namespace

Command AddReportCommand(CLI::App& parent) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* app = parent.add_subcommand("report", "render certificates and sweeps (JSON) as HTML and Markdown");
  app->add_option("inputs", a->inputs, "certificate or sweep JSON files")->required();
  app->add_option("--html", a->html, "write the HTML report here")->required();
  app->add_option("--markdown", a->markdown, "also write a Markdown twin here (SVGs beside it)");
  app->add_option("--title", a->title, "report title");
  app->add_flag("--validate", a->validate, "add the validation section (published results recomputed)");
  app->add_option("--validation-time-limit", a->validation_time_limit, "seconds per validation certificate");
  app->add_option("--threads", a->threads, "worker threads for the validation section (0: all cores)");
  return {app, [a] {
            CheckOutputFolder("--html", a->html);
            CheckOutputFolder("--markdown", a->markdown);
            const std::vector<reports::ReportInput> inputs = reports::ReadReportInputs(a->inputs);
            reports::ReportOptions o;
            o.title = a->title;
            o.command_line = reports::ProcessCommandLine();
            o.validate = a->validate;
            o.validation_time_limit_s = a->validation_time_limit;
            o.threads = a->threads;
            const std::vector<reports::Section> sections = reports::BuildSections(inputs, o);
            const std::string html = reports::RenderHtml(sections, o);
            if (!a->markdown.empty()) {
              const std::filesystem::path md(a->markdown);
              const std::string dir = md.parent_path().empty() ? "." : md.parent_path().string();
              WriteFileAtomic(a->markdown, reports::RenderMarkdown(sections, o, dir, ""));
              std::cout << "report: " << a->markdown << "\n";
            }
            WriteFileAtomic(a->html, html);
            std::cout << "report: " << a->html << "\n";
            return 0;
          }};
}

}  // namespace lipcert::cli
