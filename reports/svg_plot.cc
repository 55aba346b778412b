// SVG plots: axes (log or linear) with ticks, a legend, bands, lines, markers, bars.
#include "reports/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "reports/report.h"

namespace lipcert::reports {
namespace {

std::string Px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}
std::string Exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// One axis: data range [lo, hi] (linear or log) onto pixels [px0, px1].
struct Axis {
  bool log = false;
  double lo = 0, hi = 1, px0 = 0, px1 = 1;
  double Map(double v) const {
    const double t = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
    return px0 + t * (px1 - px0);
  }
  bool Plottable(double v) const { return std::isfinite(v) && (!log || v > 0); }
};

double NiceStep(double span, int target) {
  const double raw = span / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

// Chooses the axis range and ticks from the data values.
Axis MakeAxis(std::vector<double> values, AxisScale scale, bool include_zero, std::vector<double>* ticks) {
  values.erase(std::remove_if(values.begin(), values.end(), [](double v) { return !std::isfinite(v); }), values.end());
  Axis a;
  double mn = values.empty() ? 0 : *std::min_element(values.begin(), values.end());
  double mx = values.empty() ? 1 : *std::max_element(values.begin(), values.end());
  const bool positive = !values.empty() && mn > 0;
  a.log = scale == AxisScale::kLog ? positive : scale == AxisScale::kAuto ? (positive && mx / mn > 10) : false;
  ticks->clear();
  if (a.log) {
    double lo = std::pow(10.0, std::floor(std::log10(mn))), hi = std::pow(10.0, std::ceil(std::log10(mx)));
    if (hi <= lo) hi = lo * 10;
    // Tighten to 1-2-5 steps inside the decades when that still covers the data.
    const double lo_base = lo, hi_base = hi / 10;
    for (double m : {2.0, 5.0})
      if (lo_base * m <= mn) lo = lo_base * m;
    for (double m : {5.0, 2.0})
      if (hi_base * m >= mx && hi_base * m > lo) hi = hi_base * m;
    a.lo = lo;
    a.hi = hi;
    const int decades = int(std::ceil(std::log10(hi / lo) - 1e-9));
    for (double d = std::pow(10.0, std::floor(std::log10(lo))); d <= hi * 1.0001; d *= 10)
      for (double m : {1.0, 2.0, 5.0}) {
        if (decades > 3 && m != 1.0) continue;
        const double t = d * m;
        if (t >= lo * 0.9999 && t <= hi * 1.0001) ticks->push_back(t);
      }
    return a;
  }
  if (include_zero) mn = std::min(mn, 0.0);
  if (mx - mn <= 0) {
    const double pad = mx == 0 ? 1 : std::fabs(mx) * 0.1;
    mn -= pad;
    mx += pad;
  }
  const double step = NiceStep(mx - mn, 5);
  a.lo = std::floor(mn / step) * step;
  a.hi = std::ceil(mx / step) * step;
  for (double t = a.lo; t <= a.hi + step * 1e-6; t += step) ticks->push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  return a;
}

const char* Dash(LineStyle s) {
  switch (s) {
    case LineStyle::kDashed: return " stroke-dasharray=\"7 4\"";
    case LineStyle::kDotted: return " stroke-dasharray=\"2 3\"";
    default: return "";
  }
}

struct Frame {
  int width, height, left = 78, right = 20, top = 40, bottom = 58;
  int legend_rows = 0;
  int PlotBottom() const { return height - bottom - legend_rows * 18; }
};

void OpenSvg(std::ostringstream& os, const Frame& f, const Axis& x, const Axis& y, const std::string& kind,
             const std::string& title) {
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"lipcert-plot\" data-plot=\"" << kind << "\" width=\""
     << f.width << "\" height=\"" << f.height << "\" viewBox=\"0 0 " << f.width << " " << f.height << "\""
     << " data-x-scale=\"" << (x.log ? "log" : "linear") << "\" data-x-min=\"" << Exact(x.lo) << "\" data-x-max=\""
     << Exact(x.hi) << "\" data-px-x0=\"" << Px(x.px0) << "\" data-px-x1=\"" << Px(x.px1) << "\""
     << " data-y-scale=\"" << (y.log ? "log" : "linear") << "\" data-y-min=\"" << Exact(y.lo) << "\" data-y-max=\""
     << Exact(y.hi) << "\" data-px-y0=\"" << Px(y.px0) << "\" data-px-y1=\"" << Px(y.px1) << "\""
     << " font-family=\"sans-serif\" font-size=\"12\">\n";
  os << "<title>" << XmlEscape(title) << "</title>\n";
  os << "<rect x=\"0\" y=\"0\" width=\"" << f.width << "\" height=\"" << f.height << "\" fill=\"#ffffff\"/>\n";
  os << "<text x=\"" << f.width / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">"
     << XmlEscape(title) << "</text>\n";
}

void DrawYAxis(std::ostringstream& os, const Frame& f, const Axis& y, const std::vector<double>& ticks,
               const std::string& label) {
  for (double t : ticks) {
    const double py = y.Map(t);
    os << "<line x1=\"" << f.left << "\" x2=\"" << f.width - f.right << "\" y1=\"" << Px(py) << "\" y2=\"" << Px(py)
       << "\" stroke=\"#e4e4e4\"/>\n";
    os << "<line x1=\"" << f.left - 5 << "\" x2=\"" << f.left << "\" y1=\"" << Px(py) << "\" y2=\"" << Px(py)
       << "\" stroke=\"#333\"/>\n";
    os << "<text x=\"" << f.left - 8 << "\" y=\"" << Px(py + 4) << "\" text-anchor=\"end\">" << FormatNumber(t, 3)
       << "</text>\n";
  }
  const int mid = (f.top + f.PlotBottom()) / 2;
  os << "<text x=\"16\" y=\"" << mid << "\" text-anchor=\"middle\" transform=\"rotate(-90 16 " << mid << ")\">"
     << XmlEscape(label) << (y.log ? " (log scale)" : "") << "</text>\n";
}

void DrawFrameBox(std::ostringstream& os, const Frame& f) {
  os << "<rect x=\"" << f.left << "\" y=\"" << f.top << "\" width=\"" << f.width - f.left - f.right << "\" height=\""
     << f.PlotBottom() - f.top << "\" fill=\"none\" stroke=\"#333\"/>\n";
}

struct LegendEntry {
  std::string label, color;
  LineStyle style = LineStyle::kSolid;
  bool swatch = false;  // a filled box (bands, bars) instead of a line
};

void DrawLegend(std::ostringstream& os, const Frame& f, const std::vector<LegendEntry>& entries) {
  const int cols = 2, colw = (f.width - f.left - f.right) / cols;
  for (size_t i = 0; i < entries.size(); ++i) {
    const int x = f.left + int(i % cols) * colw, y = f.PlotBottom() + 44 + int(i / cols) * 18;
    const LegendEntry& e = entries[i];
    if (e.swatch)
      os << "<rect x=\"" << x << "\" y=\"" << y - 5 << "\" width=\"22\" height=\"10\" fill=\"" << e.color
         << "\" fill-opacity=\"0.25\" stroke=\"" << e.color << "\"/>\n";
    else
      os << "<line x1=\"" << x << "\" x2=\"" << x + 22 << "\" y1=\"" << y << "\" y2=\"" << y << "\" stroke=\"" << e.color
         << "\" stroke-width=\"2\"" << Dash(e.style) << "/>\n";
    os << "<text x=\"" << x + 28 << "\" y=\"" << y + 4 << "\">" << XmlEscape(e.label) << "</text>\n";
  }
}

}  // namespace

const std::string& PaletteColor(int i) {
  static const std::vector<std::string> colors = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                                   "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
  return colors[((i % int(colors.size())) + int(colors.size())) % int(colors.size())];
}

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string RenderLinePlot(const LinePlot& p) {
  std::vector<double> xs, ys;
  for (const Series& s : p.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) xs.push_back(s.x[i]), ys.push_back(s.y[i]);
  for (const Band& b : p.bands)
    for (size_t i = 0; i < b.x.size(); ++i)
      if (std::isfinite(b.lo[i]) && std::isfinite(b.hi[i])) ys.push_back(b.lo[i]), ys.push_back(b.hi[i]);
  // On a log y axis, zero values (a lower bound of 0) are not drawn; keep the range positive.
  std::vector<double> ys_pos;
  for (double v : ys)
    if (v > 0) ys_pos.push_back(v);
  std::vector<LegendEntry> legend;
  for (const Band& b : p.bands) legend.push_back({b.label, b.color, LineStyle::kSolid, true});
  for (const Series& s : p.series) legend.push_back({s.label, s.color, s.style, false});
  Frame f{p.width, p.height};
  f.legend_rows = int((legend.size() + 1) / 2);
  f.height += f.legend_rows * 18;
  std::vector<double> xt, yt;
  Axis x = MakeAxis(xs, p.x_scale, false, &xt);
  const bool y_log_wanted = p.y_scale == AxisScale::kLog ||
                            (p.y_scale == AxisScale::kAuto && !ys_pos.empty() &&
                             *std::max_element(ys_pos.begin(), ys_pos.end()) / *std::min_element(ys_pos.begin(), ys_pos.end()) > 10);
  Axis y = MakeAxis(y_log_wanted ? ys_pos : ys, y_log_wanted ? AxisScale::kLog : AxisScale::kLinear, !y_log_wanted, &yt);
  x.px0 = f.left + 10;
  x.px1 = f.width - f.right - 10;
  y.px0 = f.PlotBottom();
  y.px1 = f.top;
  std::ostringstream os;
  OpenSvg(os, f, x, y, "line", p.title);
  DrawYAxis(os, f, y, yt, p.y_label);
  for (double t : xt) {
    const double px = x.Map(t);
    os << "<line x1=\"" << Px(px) << "\" x2=\"" << Px(px) << "\" y1=\"" << f.top << "\" y2=\"" << f.PlotBottom()
       << "\" stroke=\"#eeeeee\"/>\n";
    os << "<line x1=\"" << Px(px) << "\" x2=\"" << Px(px) << "\" y1=\"" << f.PlotBottom() << "\" y2=\""
       << f.PlotBottom() + 5 << "\" stroke=\"#333\"/>\n";
    os << "<text x=\"" << Px(px) << "\" y=\"" << f.PlotBottom() + 18 << "\" text-anchor=\"middle\">"
       << FormatNumber(t, 3) << "</text>\n";
  }
  os << "<text x=\"" << (f.left + f.width - f.right) / 2 << "\" y=\"" << f.PlotBottom() + 34
     << "\" text-anchor=\"middle\">" << XmlEscape(p.x_label) << (x.log ? " (log scale)" : "") << "</text>\n";
  for (const Band& b : p.bands) {
    std::string upper, lower;
    for (size_t i = 0; i < b.x.size(); ++i) {
      if (!x.Plottable(b.x[i]) || !y.Plottable(b.hi[i])) continue;
      const double lo = y.Plottable(b.lo[i]) ? std::max(b.lo[i], y.lo) : y.lo;
      upper += Px(x.Map(b.x[i])) + "," + Px(y.Map(b.hi[i])) + " ";
      lower = Px(x.Map(b.x[i])) + "," + Px(y.Map(lo)) + " " + lower;
    }
    if (!upper.empty())
      os << "<polygon class=\"band\" points=\"" << upper << lower << "\" fill=\"" << b.color
         << "\" fill-opacity=\"0.18\" stroke=\"none\"/>\n";
  }
  for (const Series& s : p.series) {
    std::string pts;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (x.Plottable(s.x[i]) && y.Plottable(s.y[i])) pts += Px(x.Map(s.x[i])) + "," + Px(y.Map(s.y[i])) + " ";
    if (!pts.empty())
      os << "<polyline points=\"" << pts << "\" fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"2\""
         << Dash(s.style) << "/>\n";
    if (!s.markers) continue;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!x.Plottable(s.x[i]) || !y.Plottable(s.y[i])) continue;
      os << "<circle class=\"pt\" cx=\"" << Px(x.Map(s.x[i])) << "\" cy=\"" << Px(y.Map(s.y[i])) << "\" r=\"3.5\" fill=\""
         << s.color << "\" data-series=\"" << XmlEscape(s.id) << "\" data-label=\"" << XmlEscape(s.label)
         << "\" data-x=\"" << Exact(s.x[i]) << "\" data-y=\"" << Exact(s.y[i]) << "\"><title>" << XmlEscape(s.label)
         << ": x = " << FormatNumber(s.x[i], 6) << ", y = " << FormatNumber(s.y[i], 8) << "</title></circle>\n";
    }
  }
  DrawFrameBox(os, f);
  DrawLegend(os, f, legend);
  os << "</svg>\n";
  return os.str();
}

std::string RenderBarPlot(const BarPlot& p) {
  std::vector<double> ys;
  for (const BarGroup& g : p.groups)
    for (double v : g.values)
      if (std::isfinite(v) && v > 0) ys.push_back(v);
  std::vector<LegendEntry> legend;
  auto color = [&](size_t k) { return k < p.colors.size() ? p.colors[k] : PaletteColor(int(k)); };
  for (size_t k = 0; k < p.bar_labels.size(); ++k) legend.push_back({p.bar_labels[k], color(k), LineStyle::kSolid, true});
  Frame f{p.width, p.height};
  f.legend_rows = int((legend.size() + 1) / 2);
  f.height += f.legend_rows * 18;
  std::vector<double> yt, xt_unused;
  const bool y_log = p.y_scale == AxisScale::kLog ||
                     (p.y_scale == AxisScale::kAuto && !ys.empty() &&
                      *std::max_element(ys.begin(), ys.end()) / *std::min_element(ys.begin(), ys.end()) > 10);
  Axis y = MakeAxis(ys, y_log ? AxisScale::kLog : AxisScale::kLinear, !y_log, &yt);
  Axis x;  // group index: group g spans [g, g + 1)
  x.lo = 0;
  x.hi = std::max<size_t>(1, p.groups.size());
  x.px0 = f.left;
  x.px1 = f.width - f.right;
  y.px0 = f.PlotBottom();
  y.px1 = f.top;
  std::ostringstream os;
  OpenSvg(os, f, x, y, "bar", p.title);
  DrawYAxis(os, f, y, yt, p.y_label);
  const size_t nb = std::max<size_t>(1, p.bar_labels.size());
  const double gw = (x.px1 - x.px0) / x.hi, bw = gw * 0.8 / double(nb);
  for (size_t g = 0; g < p.groups.size(); ++g) {
    const BarGroup& grp = p.groups[g];
    const double gx = x.px0 + gw * double(g) + gw * 0.1;
    for (size_t k = 0; k < grp.values.size() && k < nb; ++k) {
      const double v = grp.values[k];
      const double bx = gx + bw * double(k);
      if (!y.Plottable(v)) {
        os << "<text x=\"" << Px(bx + bw / 2) << "\" y=\"" << Px(y.px0 - 4) << "\" text-anchor=\"middle\" font-size=\"9\">n/a</text>\n";
        continue;
      }
      const double top = y.Map(v), base = y.log ? y.px0 : y.Map(std::max(0.0, y.lo));
      const std::string id = k < p.bar_ids.size() ? p.bar_ids[k] : p.bar_labels[k];
      os << "<rect class=\"pt\" x=\"" << Px(bx) << "\" y=\"" << Px(std::min(top, base)) << "\" width=\"" << Px(bw * 0.92)
         << "\" height=\"" << Px(std::fabs(base - top)) << "\" fill=\"" << color(k) << "\" fill-opacity=\"0.8\""
         << " data-series=\"" << XmlEscape(id) << "\" data-label=\"" << XmlEscape(grp.label) << "\" data-group=\"" << g
         << "\" data-y=\"" << Exact(v) << "\"><title>" << XmlEscape(grp.label) << ", "
         << XmlEscape(k < p.bar_labels.size() ? p.bar_labels[k] : id) << ": " << FormatNumber(v, 8) << "</title></rect>\n";
    }
    os << "<text x=\"" << Px(x.px0 + gw * (double(g) + 0.5)) << "\" y=\"" << f.PlotBottom() + 18
       << "\" text-anchor=\"middle\">" << XmlEscape(grp.label) << "</text>\n";
  }
  DrawFrameBox(os, f);
  DrawLegend(os, f, legend);
  os << "</svg>\n";
  return os.str();
}

}  // namespace lipcert::reports
