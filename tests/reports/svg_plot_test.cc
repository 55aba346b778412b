// The plot writer: axis choice, and every marker's pixel position maps back to its numbers.
#include "reports/svg_plot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <regex>
#include <string>

namespace lipcert::reports {
namespace {

std::string Attr(const std::string& tag, const std::string& name) {
  const std::regex re(" " + name + "=\"([^\"]*)\"");
  std::smatch m;
  return std::regex_search(tag, m, re) ? m[1].str() : "";
}

double Map(const std::string& svg_tag, char axis, double v) {
  const std::string a(1, axis);
  const bool log = Attr(svg_tag, "data-" + a + "-scale") == "log";
  const double lo = std::stod(Attr(svg_tag, "data-" + a + "-min")), hi = std::stod(Attr(svg_tag, "data-" + a + "-max"));
  const double p0 = std::stod(Attr(svg_tag, "data-px-" + a + "0")), p1 = std::stod(Attr(svg_tag, "data-px-" + a + "1"));
  const double t = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
  return p0 + t * (p1 - p0);
}

// Checks every <circle class="pt"> against the root's mapping; returns how many.
int CheckMarkers(const std::string& svg) {
  const std::string root = svg.substr(0, svg.find('>'));
  const std::regex circle("<circle class=\"pt\"[^>]*>");
  int n = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), circle); it != std::sregex_iterator(); ++it) {
    const std::string tag = it->str();
    const double x = std::stod(Attr(tag, "data-x")), y = std::stod(Attr(tag, "data-y"));
    EXPECT_NEAR(std::stod(Attr(tag, "cx")), Map(root, 'x', x), 0.01) << tag;
    EXPECT_NEAR(std::stod(Attr(tag, "cy")), Map(root, 'y', y), 0.01) << tag;
    ++n;
  }
  return n;
}

TEST(SvgPlot, LogAxesWhenDataSpansDecadesAndMarkersMapBack) {
  LinePlot p;
  p.title = "t";
  p.x_label = "radius";
  p.y_label = "bound";
  p.series.push_back({"upper", "upper", {0.01, 0.1, 1, 10}, {1, 10, 1e3, 1e6}});
  p.series.push_back({"lower", "lower", {0.01, 0.1, 1, 10}, {0.5, 0, 500, INFINITY}});  // 0 and inf not drawn
  p.bands.push_back({"band", {0.01, 0.1, 1, 10}, {0.5, 0, 500, 1}, {1, 10, 1e3, 1e6}});
  const std::string svg = RenderLinePlot(p);
  EXPECT_NE(svg.find("data-x-scale=\"log\""), std::string::npos);
  EXPECT_NE(svg.find("data-y-scale=\"log\""), std::string::npos);
  EXPECT_NE(svg.find("(log scale)"), std::string::npos);
  EXPECT_EQ(CheckMarkers(svg), 6);
  EXPECT_NE(svg.find("<polygon class=\"band\""), std::string::npos);
}

TEST(SvgPlot, LinearAxesForNarrowData) {
  LinePlot p;
  p.series.push_back({"a", "a", {1, 2, 3}, {1.5, 1.7, 2.0}});
  const std::string svg = RenderLinePlot(p);
  EXPECT_NE(svg.find("data-x-scale=\"linear\""), std::string::npos);
  EXPECT_NE(svg.find("data-y-scale=\"linear\""), std::string::npos);
  EXPECT_EQ(CheckMarkers(svg), 3);
}

TEST(SvgPlot, BarsCarryTheirValues) {
  BarPlot b;
  b.title = "layers";
  b.bar_labels = {"upper", "lower"};
  b.groups = {{"layer 0", {3, 2}}, {"layer 1", {5, INFINITY}}};
  const std::string svg = RenderBarPlot(b);
  const std::regex rect("<rect class=\"pt\"[^>]*>");
  int n = 0;
  const std::string root = svg.substr(0, svg.find('>'));
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), rect); it != std::sregex_iterator(); ++it, ++n) {
    const std::string tag = it->str();
    const double v = std::stod(Attr(tag, "data-y"));
    EXPECT_NEAR(std::stod(Attr(tag, "y")), Map(root, 'y', v), 0.01) << tag;
  }
  EXPECT_EQ(n, 3);
  EXPECT_NE(svg.find("n/a"), std::string::npos);
}

TEST(SvgPlot, EscapesText) {
  LinePlot p;
  p.title = "a < b & \"c\"";
  p.series.push_back({"<s>", "s", {1}, {1}});
  const std::string svg = RenderLinePlot(p);
  EXPECT_EQ(svg.find("a < b"), std::string::npos);
  EXPECT_NE(svg.find("a &lt; b &amp; &quot;c&quot;"), std::string::npos);
}

}  // namespace
}  // namespace lipcert::reports
