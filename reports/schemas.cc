// The certificate and sweep handlers: checks, plots and tables; and the provenance section.
#include "reports/schemas.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>

#include "reports/svg_plot.h"

#ifndef LIPCERT_VERSION
#define LIPCERT_VERSION "unknown"
#endif

namespace lipcert::reports {

const char* LipcertVersion() { return LIPCERT_VERSION; }

std::string UtcNow() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

namespace {

using nlohmann::json;

enum class Want { kString, kNumber, kNumberOrNull, kInteger, kBool, kObject, kArray };

const char* WantName(Want w) {
  switch (w) {
    case Want::kString: return "a string";
    case Want::kNumber: return "a number";
    case Want::kNumberOrNull: return "a number or null";
    case Want::kInteger: return "an integer";
    case Want::kBool: return "true or false";
    case Want::kObject: return "an object";
    default: return "an array";
  }
}

bool Is(const json& v, Want w) {
  switch (w) {
    case Want::kString: return v.is_string();
    case Want::kNumber: return v.is_number();
    case Want::kNumberOrNull: return v.is_number() || v.is_null();
    case Want::kInteger: return v.is_number_integer();
    case Want::kBool: return v.is_boolean();
    case Want::kObject: return v.is_object();
    default: return v.is_array();
  }
}

// "" or "prefix.a.b: missing" / "...: expected a number".
std::string Need(const json& root, const std::string& prefix, const std::string& dotted, Want w) {
  const json* v = &root;
  size_t start = 0;
  while (true) {
    const size_t dot = dotted.find('.', start);
    const std::string key = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!v->is_object() || !v->contains(key)) return prefix + dotted + ": missing";
    v = &(*v)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (!Is(*v, w)) return prefix + dotted + ": expected " + WantName(w);
  return "";
}

std::string ModelLabel(const json& cert) {
  std::string stem = std::filesystem::path(cert["model"]["path"].get<std::string>()).stem().string();
  if (stem == "model") stem = std::filesystem::path(cert["model"]["path"].get<std::string>()).parent_path().filename().string();
  return stem;
}

std::string ClosedFormsText(const json& cert) {
  std::string s;
  for (const auto& [name, v] : ClosedForms(cert))
    s += (s.empty() ? "" : ", ") + name.substr(std::string("closed_form/").size()) + " " + FormatNumber(v, 6);
  return s.empty() ? "—" : s;
}

// The probabilistic bound beside the certificate (not certified), with its confidence.
std::string ProbabilisticText(const json& c) {
  if (!c.contains("probabilistic") || !c["probabilistic"]["probable_upper"].is_number()) return "—";
  const json& p = c["probabilistic"];
  return FormatNumber(p["probable_upper"].get<double>(), 6) + " (p ≥ " +
         FormatNumber(p["confidence"].get<double>(), 7) + ")";
}

std::vector<std::string> CertRow(const json& c) {
  return {ModelLabel(c),
          std::to_string(c["model"]["layer"].get<int>()),
          c["layer"]["kind"].get<std::string>(),
          c["set"]["kind"].get<std::string>(),
          std::to_string(c["set"]["tokens"].get<int>()),
          FormatNumber(c["set"]["radius"].get<double>(), 6),
          FormatJsonNumber(c["upper_bound"], 8),
          FormatJsonNumber(c["lower_bound"], 8),
          FormatJsonNumber(c["gap"], 5),
          WinningEngine(c),
          c["status"].get<std::string>(),
          FormatNumber(c["elapsed_s"].get<double>(), 3),
          ClosedFormsText(c),
          ProbabilisticText(c)};
}

const std::vector<std::string> kCertHeader = {"model", "layer", "kind", "set", "N", "radius", "certified upper",
                                              "witnessed lower", "gap", "winning engine", "status", "seconds",
                                              "closed forms", "probabilistic (not certified)"};

// ---- certificates ----

std::vector<Section> RenderCertificates(const std::vector<const ReportInput*>& inputs) {
  Section s;
  s.title = inputs.size() == 1 ? "Certificate" : "Certificates";
  s.blocks.push_back(Paragraph{"Certified upper bounds (sup of the Jacobian's norm over the set, proven) and witnessed "
                               "lower bounds (a point of the set where the Jacobian is at least this large, evaluated "
                               "in interval arithmetic), one row per certificate."});
  BarPlot bp;
  bp.title = "Certified and witnessed bounds per certificate";
  bp.y_label = "Lipschitz bound";
  bp.bar_labels = {"certified upper", "witnessed lower"};
  bp.bar_ids = {"upper", "lower"};
  bp.colors = {"#1f77b4", "#d62728"};
  Table t;
  t.caption = "Certificates";
  t.header = kCertHeader;
  t.header.insert(t.header.begin(), "file");
  int i = 0;
  for (const ReportInput* in : inputs) {
    const json& c = in->doc;
    std::vector<std::string> row = CertRow(c);
    row.insert(row.begin(), std::filesystem::path(in->path).filename().string());
    t.rows.push_back(row);
    bp.groups.push_back({"#" + std::to_string(++i) + " " + ModelLabel(c), {UpperOf(c), LowerOf(c)}});
  }
  s.blocks.push_back(Figure{"certificates", RenderBarPlot(bp), "Bars numbered as the rows of the table below."});
  s.blocks.push_back(t);
  return {s};
}

// ---- sweeps ----

struct PointView {
  const json* p;
  std::string series;  // model label + layer
  double x_radius;     // requested radius (absolute or relative)
  int tokens;
  const json& cert() const { return (*p)["certificate"]; }
};

std::string RadiusLabel(const json& sweep) {
  return sweep["radius_kind"].get<std::string>() == "relative" ? "radius / ||X0||_F" : "radius R";
}

// The plot of upper/lower/band/closed forms against x for several series.
LinePlot BoundsPlot(const std::string& title, const std::string& x_label,
                    const std::vector<std::pair<std::string, std::vector<const PointView*>>>& series,
                    std::function<double(const PointView&)> xof, Table* table, const std::string& x_col) {
  LinePlot lp;
  lp.title = title;
  lp.x_label = x_label;
  lp.y_label = "local Lipschitz constant";
  table->header = {"series", x_col, "certified upper", "witnessed lower", "gap", "winning engine", "status", "seconds",
                   "closed forms", "probabilistic (not certified)"};
  int k = 0;
  for (const auto& [name, pts] : series) {
    const std::string col = PaletteColor(k++);
    Series up{name + ": certified upper", "upper", {}, {}, col, LineStyle::kSolid, true};
    Series lo{name + ": witnessed lower", "lower", {}, {}, col, LineStyle::kDashed, true};
    Band band{name + ": certified band", {}, {}, {}, col};
    std::map<std::string, Series> cf;
    for (const PointView* v : pts) {
      const json& c = v->cert();
      const double x = xof(*v);
      up.x.push_back(x), up.y.push_back(UpperOf(c));
      lo.x.push_back(x), lo.y.push_back(LowerOf(c));
      band.x.push_back(x), band.lo.push_back(LowerOf(c)), band.hi.push_back(UpperOf(c));
      for (const auto& [engine, value] : ClosedForms(c)) {
        Series& s = cf[engine];
        if (s.id.empty()) s = Series{name + ": " + engine, engine, {}, {}, col, LineStyle::kDotted, true};
        s.x.push_back(x), s.y.push_back(value);
      }
      table->rows.push_back({name, FormatNumber(x, 6), FormatJsonNumber(c["upper_bound"], 8),
                             FormatJsonNumber(c["lower_bound"], 8), FormatJsonNumber(c["gap"], 5), WinningEngine(c),
                             c["status"].get<std::string>(), FormatNumber(c["elapsed_s"].get<double>(), 3),
                             ClosedFormsText(c), ProbabilisticText(c)});
    }
    lp.bands.push_back(band);
    lp.series.push_back(up);
    lp.series.push_back(lo);
    for (auto& [engine, s] : cf) lp.series.push_back(s);
  }
  return lp;
}

// A sweep's points grouped for plotting: one series per checkpoint (and per layer, when a
// checkpoint has several), in the order the series first appear in the sweep.
struct SweepPoints {
  using Groups = std::vector<std::pair<std::string, std::vector<const PointView*>>>;
  std::vector<PointView> views;
  std::map<std::string, std::set<int>> layers_of;  // model label -> its layers in the sweep
  std::set<double> radii;
  std::set<int> tokens;
  std::vector<std::string> series_order;
  bool many_layers = false;  // some checkpoint has several layers in the sweep

  // The points that `keep` accepts, per series, each series sorted by `key`; empty series left out.
  Groups Collect(std::function<bool(const PointView&)> keep, std::function<double(const PointView&)> key) const {
    Groups groups;
    for (const std::string& name : series_order) {
      std::vector<const PointView*> pts;
      for (const PointView& v : views)
        if (v.series == name && keep(v)) pts.push_back(&v);
      std::sort(pts.begin(), pts.end(), [&](auto* a, auto* b) { return key(*a) < key(*b); });
      if (!pts.empty()) groups.push_back({name, pts});
    }
    return groups;
  }
};

SweepPoints GroupPoints(const json& sw) {
  SweepPoints g;
  for (const json& p : sw["points"]) {
    const json& c = p["certificate"];
    g.layers_of[ModelLabel(c)].insert(p["layer"].get<int>());
  }
  for (const json& p : sw["points"]) {
    const json& c = p["certificate"];
    const std::string m = ModelLabel(c);
    const std::string series = g.layers_of[m].size() > 1 ? m + " layer " + std::to_string(p["layer"].get<int>()) : m;
    g.views.push_back({&p, series, p["radius_request"].get<double>(), p["tokens"].get<int>()});
  }
  for (const PointView& v : g.views) {
    g.radii.insert(v.x_radius), g.tokens.insert(v.tokens);
    if (std::find(g.series_order.begin(), g.series_order.end(), v.series) == g.series_order.end())
      g.series_order.push_back(v.series);
  }
  g.many_layers = std::any_of(g.layers_of.begin(), g.layers_of.end(), [](auto& e) { return e.second.size() > 1; });
  return g;
}

// The section's title and its opening: how many points are certified, and the command that made them.
Section SweepIntro(const ReportInput& in, bool several_sweeps) {
  const json& sw = in.doc;
  Section s;
  s.title = "Sweep: " + sw["set"].get<std::string>() + " sets, norm " + sw["norm"].get<std::string>() +
            (several_sweeps ? " (" + std::filesystem::path(in.path).filename().string() + ")" : "");
  const size_t done = sw["points"].size();
  const int total = sw["total_points"].get<int>();
  s.blocks.push_back(Paragraph{std::to_string(done) + " of " + std::to_string(total) + " points certified" +
                               (sw["complete"].get<bool>() ? "." : " (incomplete: rerun the command to finish it).") +
                               " Made by:"});
  s.blocks.push_back(Paragraph{sw["command_line"].get<std::string>(), true});
  return s;
}

// The gap (certified / witnessed) of each series against the radius, at N = n: a figure and its table.
void AddGapAgainstRadius(const SweepPoints::Groups& groups, int n, const std::string& rlabel, const std::string& tag,
                         Section* s) {
  LinePlot gp;
  gp.title = "Gap (certified / witnessed) against the radius, N = " + std::to_string(n);
  gp.x_label = rlabel;
  gp.y_label = "upper / lower";
  Table gt;
  gt.caption = "Gap against the radius, N = " + std::to_string(n);
  gt.header = {"series", rlabel, "gap", "certified upper", "witnessed lower", "status"};
  int k = 0;
  for (const auto& [name, pts] : groups) {
    Series g{name, "gap", {}, {}, PaletteColor(k++), LineStyle::kSolid, true};
    for (const PointView* v : pts) {
      const json& c = v->cert();
      const double gap = c["gap"].is_number() ? c["gap"].get<double>() : INFINITY;
      g.x.push_back(v->x_radius), g.y.push_back(gap);
      gt.rows.push_back({name, FormatNumber(v->x_radius, 6), FormatNumber(gap, 5), FormatJsonNumber(c["upper_bound"], 8),
                         FormatJsonNumber(c["lower_bound"], 8), c["status"].get<std::string>()});
    }
    gp.series.push_back(g);
  }
  s->blocks.push_back(Figure{tag + "gap-N" + std::to_string(n), RenderLinePlot(gp),
                             "How far the certificate is from tight: 1 means the certified bound is attained."});
  s->blocks.push_back(gt);
}

// Against the radius, one plot of the bounds and one of the gap per N.
void AddRadiusFigures(const json& sw, const SweepPoints& pts, const std::string& tag, Section* s) {
  const std::string rlabel = RadiusLabel(sw);
  for (int n : pts.tokens) {
    const auto groups = pts.Collect([&](const PointView& v) { return v.tokens == n; },
                                    [](const PointView& v) { return v.x_radius; });
    Table t;
    t.caption = "Bounds against the radius, N = " + std::to_string(n);
    const std::string title = "Certified and witnessed bounds against the radius (" + sw["set"].get<std::string>() +
                              " sets, N = " + std::to_string(n) + ")";
    const LinePlot lp = BoundsPlot(title, rlabel, groups, [](const PointView& v) { return v.x_radius; }, &t, rlabel);
    s->blocks.push_back(Figure{tag + "radius-N" + std::to_string(n), RenderLinePlot(lp),
                               "Solid: certified upper bound; dashed: witnessed lower bound; shaded: the band "
                               "between them, which holds the true local Lipschitz constant; dotted: published "
                               "closed-form bounds evaluated by lipcert."});
    s->blocks.push_back(t);
    AddGapAgainstRadius(groups, n, rlabel, tag, s);
  }
}

// The smallest and the largest radius of the sweep (every radius when there are at most two).
std::vector<double> EndRadii(const std::set<double>& radii) {
  std::vector<double> rs(radii.begin(), radii.end());
  if (rs.size() > 2) rs = {rs.front(), rs.back()};
  return rs;
}

// Against N, one plot per radius (at most the smallest and the largest).
void AddTokenFigures(const json& sw, const SweepPoints& pts, const std::string& tag, Section* s) {
  const std::string rlabel = RadiusLabel(sw);
  for (double r : EndRadii(pts.radii)) {
    const auto groups = pts.Collect([&](const PointView& v) { return v.x_radius == r; },
                                    [](const PointView& v) { return double(v.tokens); });
    Table t;
    t.caption = "Bounds against N, " + rlabel + " = " + FormatNumber(r, 6);
    const LinePlot lp = BoundsPlot("Bounds against the number of tokens N (" + rlabel + " = " + FormatNumber(r, 6) + ")",
                                   "tokens N", groups, [](const PointView& v) { return double(v.tokens); }, &t, "N");
    s->blocks.push_back(Figure{tag + "tokens-r" + FormatNumber(r, 6), RenderLinePlot(lp),
                               "Solid: certified; dashed: witnessed; dotted: closed forms."});
    s->blocks.push_back(t);
  }
}

// One checkpoint's layers at radius r and N = n: a bar group per layer (certified, witnessed,
// then the closed forms any of them has) and a table row per layer.
void AddLayerBars(const json& sw, const SweepPoints& pts, const std::string& model, const std::set<int>& layers,
                  double r, int n, const std::string& tag, Section* s) {
  const std::string rlabel = RadiusLabel(sw);
  BarPlot bp;
  bp.title = model + ": every layer (" + rlabel + " = " + FormatNumber(r, 6) + ", N = " + std::to_string(n) + ")";
  bp.y_label = "local Lipschitz constant";
  bp.bar_labels = {"certified upper", "witnessed lower"};
  bp.bar_ids = {"upper", "lower"};
  bp.colors = {"#1f77b4", "#d62728"};
  Table t;
  t.caption = model + ": per layer, " + rlabel + " = " + FormatNumber(r, 6) + ", N = " + std::to_string(n);
  t.header = kCertHeader;
  std::set<std::string> cf_names;
  for (const PointView& v : pts.views)
    if (ModelLabel(v.cert()) == model && v.x_radius == r && v.tokens == n)
      for (const auto& [e, val] : ClosedForms(v.cert())) cf_names.insert(e);
  for (const std::string& e : cf_names) bp.bar_labels.push_back(e), bp.bar_ids.push_back(e), bp.colors.push_back("#7f7f7f");
  for (int layer : layers)
    for (const PointView& v : pts.views) {
      const json& c = v.cert();
      if (ModelLabel(c) != model || v.x_radius != r || v.tokens != n || (*v.p)["layer"].get<int>() != layer) continue;
      BarGroup g{"layer " + std::to_string(layer), {UpperOf(c), LowerOf(c)}};
      const auto cfs = ClosedForms(c);
      for (const std::string& e : cf_names) {
        double val = INFINITY;
        for (const auto& [name, x] : cfs)
          if (name == e) val = x;
        g.values.push_back(val);
      }
      bp.groups.push_back(g);
      t.rows.push_back(CertRow(c));
    }
  s->blocks.push_back(Figure{tag + "layers-" + model + "-r" + FormatNumber(r, 6), RenderBarPlot(bp),
                             "One group per layer of the checkpoint."});
  s->blocks.push_back(t);
}

// One bar group per layer, for checkpoints with several, at the largest N and at most two radii.
void AddLayerFigures(const json& sw, const SweepPoints& pts, const std::string& tag, Section* s) {
  const std::vector<double> rs = EndRadii(pts.radii);
  for (const auto& [model, layers] : pts.layers_of) {
    if (layers.size() < 2) continue;
    for (double r : rs) AddLayerBars(sw, pts, model, layers, r, *pts.tokens.rbegin(), tag, s);
  }
}

// Every point, whatever was plotted.
Table EveryPointTable(const SweepPoints& pts) {
  Table all;
  all.caption = "Every point of the sweep";
  all.header = kCertHeader;
  for (const PointView& v : pts.views) all.rows.push_back(CertRow(v.cert()));
  return all;
}

std::vector<Section> RenderSweeps(const std::vector<const ReportInput*>& inputs) {
  std::vector<Section> out;
  int sweep_no = 0;
  for (const ReportInput* in : inputs) {
    const json& sw = in->doc;
    ++sweep_no;
    const std::string tag = inputs.size() > 1 ? "sweep" + std::to_string(sweep_no) + "-" : "";
    Section s = SweepIntro(*in, inputs.size() > 1);
    const SweepPoints pts = GroupPoints(sw);
    // Against the radius when there are several radii (and not too many layer series to read).
    if (pts.radii.size() > 1 && (!pts.many_layers || pts.series_order.size() <= 6)) AddRadiusFigures(sw, pts, tag, &s);
    if (pts.tokens.size() > 1) AddTokenFigures(sw, pts, tag, &s);
    if (pts.many_layers) AddLayerFigures(sw, pts, tag, &s);
    s.blocks.push_back(EveryPointTable(pts));
    out.push_back(std::move(s));
  }
  return out;
}

std::string CheckSweep(const json& sw) {
  for (const auto& [field, want] : std::vector<std::pair<std::string, Want>>{
           {"lipcert_version", Want::kString}, {"command_line", Want::kString}, {"set", Want::kString},
           {"norm", Want::kString}, {"radius_kind", Want::kString}, {"total_points", Want::kInteger},
           {"complete", Want::kBool}, {"threads", Want::kInteger}, {"models", Want::kArray}, {"points", Want::kArray}})
    if (std::string e = Need(sw, "", field, want); !e.empty()) return e;
  const std::string rk = sw["radius_kind"].get<std::string>();
  if (rk != "absolute" && rk != "relative") return "radius_kind: expected \"absolute\" or \"relative\"";
  for (size_t i = 0; i < sw["models"].size(); ++i) {
    const std::string pre = "models[" + std::to_string(i) + "].";
    for (const char* f : {"path", "sha256"})
      if (std::string e = Need(sw["models"][i], pre, f, Want::kString); !e.empty()) return e;
  }
  for (size_t i = 0; i < sw["points"].size(); ++i) {
    const json& p = sw["points"][i];
    const std::string pre = "points[" + std::to_string(i) + "].";
    for (const auto& [field, want] : std::vector<std::pair<std::string, Want>>{
             {"key", Want::kString}, {"layer", Want::kInteger}, {"radius_request", Want::kNumber},
             {"tokens", Want::kInteger}, {"certificate", Want::kObject}})
      if (std::string e = Need(p, pre, field, want); !e.empty()) return e;
    if (std::string e = CheckCertificateJson(p["certificate"], pre + "certificate."); !e.empty()) return e;
  }
  return "";
}

}  // namespace

std::string CheckCertificateJson(const json& c, const std::string& prefix) {
  if (!c.is_object()) return prefix + "(certificate): expected an object";
  if (std::string e = Need(c, prefix, "schema", Want::kString); !e.empty()) return e;
  if (c["schema"].get<std::string>() != "lipcert.certificate/1")
    return prefix + "schema: expected \"lipcert.certificate/1\"";
  for (const auto& [field, want] : std::vector<std::pair<std::string, Want>>{
           {"model.path", Want::kString}, {"model.sha256", Want::kString}, {"model.layer", Want::kInteger},
           {"layer.kind", Want::kString}, {"set.kind", Want::kString}, {"set.radius", Want::kNumber},
           {"set.tokens", Want::kInteger}, {"norm", Want::kString}, {"upper_bound", Want::kNumberOrNull},
           {"lower_bound", Want::kNumber}, {"gap", Want::kNumberOrNull}, {"engines", Want::kObject},
           {"status", Want::kString}, {"elapsed_s", Want::kNumber}, {"numerics.rounding_model", Want::kString},
           {"numerics.exp_backend", Want::kString}})
    if (std::string e = Need(c, prefix, field, want); !e.empty()) return e;
  for (const auto& [name, v] : c["engines"].items())
    if (!v.is_number() && !v.is_null()) return prefix + "engines." + name + ": expected a number or null";
  return "";
}

double UpperOf(const json& c) { return c["upper_bound"].is_number() ? c["upper_bound"].get<double>() : INFINITY; }
double LowerOf(const json& c) { return c["lower_bound"].get<double>(); }

std::string WinningEngine(const json& c) {
  std::string best = "—";
  double v = INFINITY;
  for (const auto& [name, b] : c["engines"].items())
    if (b.is_number() && b.get<double>() < v) v = b.get<double>(), best = name;
  return best;
}

std::vector<std::pair<std::string, double>> ClosedForms(const json& c) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, b] : c["engines"].items())
    if (name.rfind("closed_form/", 0) == 0 && b.is_number() && std::isfinite(b.get<double>()))
      out.push_back({name, b.get<double>()});
  return out;
}

SchemaHandler CertificateSchema() {
  return {"lipcert.certificate/1", [](const json& d) { return CheckCertificateJson(d, ""); }, RenderCertificates};
}

SchemaHandler SweepSchema() { return {"lipcert.sweep/1", CheckSweep, RenderSweeps}; }

Section ReportProvenanceSection(const std::vector<ReportInput>& inputs, const ReportOptions& options) {
  Section s;
  s.title = "Provenance";
  s.blocks.push_back(Paragraph{"Report rendered by lipcert " + std::string(LipcertVersion()) + " on " + UtcNow() +
                               (options.command_line.empty() ? "." : " with:")});
  if (!options.command_line.empty()) s.blocks.push_back(Paragraph{options.command_line, true});
  Table t;
  t.caption = "Inputs";
  t.header = {"input", "schema", "made by", "lipcert version", "threads", "date", "models (SHA-256)",
              "rounding model", "exp back end"};
  for (const ReportInput& in : inputs) {
    const json& d = in.doc;
    const std::string schema = d["schema"].get<std::string>();
    std::vector<std::string> row = {in.path, schema, "", "", "", "", "", "", ""};
    auto numerics = [&](const json& c) {
      row[7] = c["numerics"]["rounding_model"].get<std::string>();
      row[8] = c["numerics"]["exp_backend"].get<std::string>();
    };
    if (schema == "lipcert.certificate/1") {
      row[6] = d["model"]["path"].get<std::string>() + " (" + d["model"]["sha256"].get<std::string>() + ")";
      numerics(d);
    } else if (schema == "lipcert.sweep/1") {
      row[2] = d["command_line"].get<std::string>();
      row[3] = d["lipcert_version"].get<std::string>();
      row[4] = std::to_string(d["threads"].get<int>());
      row[5] = d.value("updated", d.value("started", std::string()));
      for (const json& m : d["models"])
        row[6] += (row[6].empty() ? "" : "; ") + m["path"].get<std::string>() + " (" + m["sha256"].get<std::string>() + ")";
      if (!d["points"].empty()) numerics(d["points"][0]["certificate"]);
    } else {
      row[2] = d.value("command_line", std::string());
      row[3] = d.value("lipcert_version", std::string());
    }
    t.rows.push_back(row);
  }
  if (!t.rows.empty()) s.blocks.push_back(t);
  return s;
}

}  // namespace lipcert::reports
