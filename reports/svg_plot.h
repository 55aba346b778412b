// A small SVG plot writer for the reports: line plots (log or linear axes, ticks, legend,
// a shaded band between two curves) and grouped bar charts. The output is one standalone
// <svg> element (no external files, no script). Every plotted point is a marker carrying
// its values (data-x, data-y, data-series) and the root carries the axis mapping
// (data-x-scale, data-x-min, data-x-max, data-px-x0, data-px-x1, and the same for y), so a
// test can map each marker's pixel position back to the numbers it plots.
#pragma once

#include <string>
#include <vector>

namespace lipcert::reports {

enum class LineStyle { kSolid, kDashed, kDotted };

struct Series {
  std::string label;           // legend text
  std::string id;              // data-series value ("upper", "lower", "closed_form/castin", ...)
  std::vector<double> x, y;    // same length; non-finite or (on a log axis) non-positive y skipped
  std::string color = "#1f77b4";
  LineStyle style = LineStyle::kSolid;
  bool markers = true;
};

struct Band {                  // shaded region lo(x) <= y <= hi(x)
  std::string label;
  std::vector<double> x, lo, hi;
  std::string color = "#1f77b4";
};

enum class AxisScale { kAuto, kLinear, kLog };  // auto: log when positive data spans more than a decade

struct LinePlot {
  std::string title, x_label, y_label;
  AxisScale x_scale = AxisScale::kAuto, y_scale = AxisScale::kAuto;
  std::vector<Band> bands;
  std::vector<Series> series;
  int width = 720, height = 440;
};

struct BarGroup {
  std::string label;           // x-axis label of the group ("layer 3")
  std::vector<double> values;  // one per bar label; non-finite: no bar (drawn as "n/a")
};

struct BarPlot {
  std::string title, y_label;
  std::vector<std::string> bar_labels;  // legend, one per bar in each group
  std::vector<std::string> bar_ids;     // data-series values, one per bar label
  std::vector<std::string> colors;      // one per bar label (cycled from a palette when empty)
  std::vector<BarGroup> groups;
  AxisScale y_scale = AxisScale::kAuto;
  int width = 720, height = 440;
};

std::string RenderLinePlot(const LinePlot& plot);
std::string RenderBarPlot(const BarPlot& plot);

// A palette of distinguishable colours (cycled).
const std::string& PaletteColor(int i);
// Escapes &, <, >, " for XML/HTML text and attributes.
std::string XmlEscape(const std::string& s);

}  // namespace lipcert::reports
