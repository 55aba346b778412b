// The HTML renderer: one self-contained file (inline CSS and SVG; a few lines of script
// that show the value under the pointer, which the report does not need to be read).
#include <sstream>

#include "reports/report.h"
#include "reports/svg_plot.h"

namespace lipcert::reports {
namespace {

const char* kStyle = R"(body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
figure{margin:1.5em 0}figcaption{font-size:.9em;color:#555;max-width:720px}
table{border-collapse:collapse;font-size:.85em;margin:1em 0}th,td{border:1px solid #ccc;padding:.25em .5em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}caption{text-align:left;font-weight:bold;padding:.3em 0}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;white-space:pre-wrap}
#lipcert-hover{position:fixed;display:none;background:#fffbe6;border:1px solid #aaa;padding:2px 6px;font-size:12px;pointer-events:none}
.toc{font-size:.9em})";

// Shows the hovered marker's <title> next to the pointer. Only reads the DOM.
const char* kScript = R"((function(){var tip=document.getElementById('lipcert-hover');if(!tip)return;
document.querySelectorAll('.lipcert-plot .pt').forEach(function(el){
el.addEventListener('mouseenter',function(){var t=el.querySelector('title');tip.textContent=t?t.textContent:'';tip.style.display='block';});
el.addEventListener('mousemove',function(e){tip.style.left=(e.clientX+12)+'px';tip.style.top=(e.clientY+12)+'px';});
el.addEventListener('mouseleave',function(){tip.style.display='none';});});
document.documentElement.setAttribute('data-hover','ready');})();)";

std::string Anchor(size_t i) { return "s" + std::to_string(i + 1); }

}  // namespace

std::string RenderHtml(const std::vector<Section>& sections, const ReportOptions& options) {
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" << XmlEscape(options.title)
     << "</title>\n<style>\n" << kStyle << "\n</style>\n</head>\n<body>\n<h1>" << XmlEscape(options.title) << "</h1>\n";
  os << "<ul class=\"toc\">\n";
  for (size_t i = 0; i < sections.size(); ++i)
    os << "<li><a href=\"#" << Anchor(i) << "\">" << XmlEscape(sections[i].title) << "</a></li>\n";
  os << "</ul>\n";
  for (size_t i = 0; i < sections.size(); ++i) {
    os << "<section id=\"" << Anchor(i) << "\">\n<h2>" << XmlEscape(sections[i].title) << "</h2>\n";
    for (const Block& b : sections[i].blocks) {
      if (const auto* p = std::get_if<Paragraph>(&b)) {
        if (p->code)
          os << "<pre>" << XmlEscape(p->text) << "</pre>\n";
        else
          os << "<p>" << XmlEscape(p->text) << "</p>\n";
      } else if (const auto* f = std::get_if<Figure>(&b)) {
        os << "<figure data-figure=\"" << XmlEscape(f->name) << "\">\n" << f->svg;
        if (!f->caption.empty()) os << "<figcaption>" << XmlEscape(f->caption) << "</figcaption>\n";
        os << "</figure>\n";
      } else if (const auto* t = std::get_if<Table>(&b)) {
        os << "<table>\n";
        if (!t->caption.empty()) os << "<caption>" << XmlEscape(t->caption) << "</caption>\n";
        os << "<tr>";
        for (const std::string& h : t->header) os << "<th>" << XmlEscape(h) << "</th>";
        os << "</tr>\n";
        for (const auto& row : t->rows) {
          os << "<tr>";
          for (const std::string& c : row) os << "<td>" << XmlEscape(c) << "</td>";
          os << "</tr>\n";
        }
        os << "</table>\n";
      }
    }
    os << "</section>\n";
  }
  os << "<div id=\"lipcert-hover\"></div>\n<script>\n" << kScript << "\n</script>\n</body>\n</html>\n";
  return os.str();
}

}  // namespace lipcert::reports
