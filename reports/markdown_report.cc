// The Markdown twin: the same sections, tables as pipe tables, figures as SVG files beside it.
#include <filesystem>
#include <sstream>

#include "certify/certificate.h"
#include "reports/report.h"

namespace lipcert::reports {
namespace {

std::string Cell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

}  // namespace

std::string RenderMarkdown(const std::vector<Section>& sections, const ReportOptions& options,
                           const std::string& svg_dir, const std::string& svg_link_prefix) {
  std::ostringstream os;
  os << "# " << options.title << "\n\n";
  for (const Section& s : sections) {
    os << "## " << s.title << "\n\n";
    for (const Block& b : s.blocks) {
      if (const auto* p = std::get_if<Paragraph>(&b)) {
        if (p->code)
          os << "```\n" << p->text << "\n```\n\n";
        else
          os << p->text << "\n\n";
      } else if (const auto* f = std::get_if<Figure>(&b)) {
        const std::string file = f->name + ".svg";
        if (!svg_dir.empty()) WriteFileAtomic((std::filesystem::path(svg_dir) / file).string(), f->svg);
        os << "![" << Cell(f->caption.empty() ? f->name : f->caption) << "](" << svg_link_prefix << file << ")\n\n";
        if (!f->caption.empty()) os << "*" << f->caption << "*\n\n";
      } else if (const auto* t = std::get_if<Table>(&b)) {
        if (!t->caption.empty()) os << "**" << t->caption << "**\n\n";
        os << "|";
        for (const std::string& h : t->header) os << " " << Cell(h) << " |";
        os << "\n|";
        for (size_t i = 0; i < t->header.size(); ++i) os << (i == 0 ? " --- |" : " ---: |");
        os << "\n";
        for (const auto& row : t->rows) {
          os << "|";
          for (const std::string& c : row) os << " " << Cell(c) << " |";
          os << "\n";
        }
        os << "\n";
      }
    }
  }
  return os.str();
}

}  // namespace lipcert::reports
