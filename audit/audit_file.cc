#include "audit/audit_file.h"

#include <fnmatch.h>
#include <glob.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <toml++/toml.h>

#include "models/centre.h"
#include "models/errors.h"
#include "models/safetensors.h"
#include "models/sha256.h"

namespace lipcert::audit {

namespace fs = std::filesystem;
using nlohmann::json;

void Thresholds::Tighten(const Thresholds& o) {
  auto lo = [](std::optional<double>& a, const std::optional<double>& b) {
    if (b && (!a || *b < *a)) a = b;
  };
  auto hi = [](std::optional<double>& a, const std::optional<double>& b) {
    if (b && (!a || *b > *a)) a = b;
  };
  lo(max_upper, o.max_upper);
  lo(max_gap, o.max_gap);
  hi(min_lower, o.min_lower);
}

json Thresholds::ToJson() const {
  json j = json::object();
  if (max_upper) j["max_upper"] = *max_upper;
  if (max_gap) j["max_gap"] = *max_gap;
  if (min_lower) j["min_lower"] = *min_lower;
  return j;
}

Thresholds Thresholds::FromJson(const json& j) {
  Thresholds t;
  if (j.contains("max_upper")) t.max_upper = j["max_upper"].get<double>();
  if (j.contains("max_gap")) t.max_gap = j["max_gap"].get<double>();
  if (j.contains("min_lower")) t.min_lower = j["min_lower"].get<double>();
  return t;
}

json AuditPlan::ToJson() const {
  json jobs_json = json::array();
  for (size_t i = 0; i < jobs.size(); ++i) {
    const AuditJob& j = jobs[i];
    jobs_json.push_back({{"index", i}, {"key", j.key}, {"spec", j.spec}, {"thresholds", j.thresholds.ToJson()},
                         {"checkpoint_name", j.checkpoint_name}});
  }
  return {{"schema", "lipcert.audit-plan/1"}, {"audit_file", file}, {"jobs", jobs_json}};
}

namespace {

// A radius as the file writes it: a number is absolute, "0.1%" is relative to ||X0||_F.
struct Radius {
  bool relative = false;
  double value = 0;  // absolute R, or the fraction (0.001 for "0.1%")
  std::string text;  // as written, for the table
  bool operator==(const Radius& o) const { return relative == o.relative && value == o.value; }
};

// Everything a checkpoint entry may set or inherit from [defaults].
struct JobDefaults {
  std::vector<SetKind> sets = {SetKind::kBall};
  std::vector<Radius> radii;
  std::vector<NormKind> norms = {NormKind::kL2};
  std::vector<bool> attention_only = {false};
  double time_limit = 10;
  WorkBudget budget;  // certify/run_control.h
  double tolerance = 0.01;
  int64_t seed = 1;
  int64_t dense_limit = kDefaultDenseLimit;  // CertifyOptions' (certify/engine_bound.h)
  Thresholds thresholds;
};

// A [[threshold]] rule: the limits apply to every job that matches all its selectors.
struct Rule {
  std::optional<std::string> checkpoint;
  std::optional<int> layer;
  std::optional<SetKind> set;
  std::optional<NormKind> norm;
  std::optional<Radius> radius;
  std::optional<bool> attention_only;
  Thresholds limits;
  toml::source_region where;
  std::string at;
  bool matched = false;
};

// Reads typed values out of the TOML tree; every error names the file, line and key path.
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void Fail(const toml::source_region& where, const std::string& key, const std::string& message) const {
    throw InputError(file_ + ":" + std::to_string(where.begin.line), key, message);
  }

  // Refuses keys outside `allowed` (typos must not silently do nothing).
  void CheckKeys(const toml::table& t, const std::string& path, const std::set<std::string>& allowed) const {
    for (auto&& [k, v] : t) {
      if (!allowed.count(std::string(k.str()))) {
        std::string list;
        for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
        Fail(k.source(), Join(path, std::string(k.str())), "unknown key (expected one of " + list + ")");
      }
    }
  }

  static std::string Join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  std::string String(const toml::node& n, const std::string& key) const {
    if (!n.is_string()) Fail(n.source(), key, "expected a string, got " + TypeName(n));
    return *n.value<std::string>();
  }
  double Number(const toml::node& n, const std::string& key) const {
    if (!n.is_number()) Fail(n.source(), key, "expected a number, got " + TypeName(n));
    const double v = *n.value<double>();
    if (!std::isfinite(v)) Fail(n.source(), key, "must be finite");
    return v;
  }
  int64_t Integer(const toml::node& n, const std::string& key) const {
    if (!n.is_integer()) Fail(n.source(), key, "expected an integer, got " + TypeName(n));
    return *n.value<int64_t>();
  }
  bool Bool(const toml::node& n, const std::string& key) const {
    if (!n.is_boolean()) Fail(n.source(), key, "expected true or false, got " + TypeName(n));
    return *n.value<bool>();
  }
  const toml::table& Table(const toml::node& n, const std::string& key) const {
    if (!n.is_table()) Fail(n.source(), key, "expected a table, got " + TypeName(n));
    return *n.as_table();
  }
  // A value or an array of values, each read by `one`.
  template <class T, class F>
  std::vector<T> List(const toml::node& n, const std::string& key, F one) const {
    std::vector<T> out;
    if (const toml::array* a = n.as_array()) {
      if (a->empty()) Fail(n.source(), key, "must not be empty");
      for (size_t i = 0; i < a->size(); ++i) out.push_back(one((*a)[i], key + "[" + std::to_string(i) + "]"));
    } else {
      out.push_back(one(n, key));
    }
    return out;
  }

  SetKind Set(const toml::node& n, const std::string& key) const {
    SetKind k;
    const std::string s = String(n, key);
    if (!StringToSetKind(s, &k)) Fail(n.source(), key, "expected ball, tokens or box, got '" + s + "'");
    return k;
  }
  NormKind Norm(const toml::node& n, const std::string& key) const {
    std::string s;
    if (n.is_integer())
      s = std::to_string(*n.value<int64_t>());
    else if (n.is_string())
      s = *n.value<std::string>();
    else
      Fail(n.source(), key, "expected 2 or \"inf\", got " + TypeName(n));
    NormKind k;
    if (!StringToNormKind(s, &k)) Fail(n.source(), key, "expected 2 or \"inf\", got '" + s + "'");
    return k;
  }
  Radius RadiusValue(const toml::node& n, const std::string& key) const {
    Radius r;
    if (n.is_number()) {
      r.value = Number(n, key);
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", r.value);
      r.text = buf;
    } else if (n.is_string()) {
      r.text = *n.value<std::string>();
      size_t used = 0;
      double pct = -1;
      try {
        pct = std::stod(r.text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used + 1 != r.text.size() || r.text.back() != '%')
        Fail(n.source(), key, "expected a number (absolute) or a percentage such as \"0.1%\", got '" + r.text + "'");
      r.relative = true;
      r.value = pct / 100;
    } else {
      Fail(n.source(), key, "expected a number (absolute) or a percentage such as \"0.1%\", got " + TypeName(n));
    }
    if (!(r.value >= 0) || !std::isfinite(r.value)) Fail(n.source(), key, "radius must be finite and >= 0");
    return r;
  }
  Thresholds Limits(const toml::table& t, const std::string& path, bool allow_selectors) const {
    std::set<std::string> keys = {"max_upper", "max_gap", "min_lower"};
    if (allow_selectors) keys.insert({"checkpoint", "layer", "set", "norm", "radius", "attention_only"});
    CheckKeys(t, path, keys);
    Thresholds th;
    auto positive = [&](const char* name, std::optional<double>* out) {
      if (const toml::node* n = t.get(name)) {
        const double v = Number(*n, Join(path, name));
        if (!(v > 0)) Fail(n->source(), Join(path, name), "must be positive");
        *out = v;
      }
    };
    positive("max_upper", &th.max_upper);
    positive("max_gap", &th.max_gap);
    positive("min_lower", &th.min_lower);
    if (th.max_gap && *th.max_gap < 1) Fail(t.get("max_gap")->source(), Join(path, "max_gap"), "must be >= 1 (gap = upper / lower)");
    return th;
  }

  // The job keys shared by [defaults] and [[checkpoint]] (a checkpoint overrides them).
  static const std::set<std::string>& JobKeys() {
    static const std::set<std::string> k = {"sets",      "radii", "norms",       "attention_only", "time_limit",
                                            "budget",    "tolerance", "seed",    "dense_limit",    "thresholds"};
    return k;
  }
  void ReadJobKeys(const toml::table& t, const std::string& path, JobDefaults* d) const {
    auto at = [&](const char* k) { return Join(path, k); };
    if (const toml::node* n = t.get("sets")) d->sets = List<SetKind>(*n, at("sets"), [&](const auto& x, const auto& k) { return Set(x, k); });
    if (const toml::node* n = t.get("radii"))
      d->radii = List<Radius>(*n, at("radii"), [&](const auto& x, const auto& k) { return RadiusValue(x, k); });
    if (const toml::node* n = t.get("norms")) d->norms = List<NormKind>(*n, at("norms"), [&](const auto& x, const auto& k) { return Norm(x, k); });
    if (const toml::node* n = t.get("attention_only"))
      d->attention_only = List<bool>(*n, at("attention_only"), [&](const auto& x, const auto& k) { return Bool(x, k); });
    if (const toml::node* n = t.get("time_limit")) {
      d->time_limit = Number(*n, at("time_limit"));
      if (!(d->time_limit > 0)) Fail(n->source(), at("time_limit"), "must be positive (seconds per job)");
    }
    if (const toml::node* n = t.get("budget")) {
      const toml::table& b = Table(*n, at("budget"));
      CheckKeys(b, at("budget"), {"steps", "rounds"});
      const toml::node* steps = b.get("steps");
      if (!steps) Fail(n->source(), at("budget.steps"), "missing (branch-and-bound pieces per job)");
      const int64_t s = Integer(*steps, at("budget.steps"));
      if (s < 1 || s > 100000000) Fail(steps->source(), at("budget.steps"), "must be in [1, 1e8]");
      d->budget.steps = int(s);
      if (const toml::node* r = b.get("rounds")) {
        const int64_t v = Integer(*r, at("budget.rounds"));
        if (v < 1 || v > 100000) Fail(r->source(), at("budget.rounds"), "must be in [1, 100000]");
        d->budget.rounds = int(v);
      }
    }
    if (const toml::node* n = t.get("tolerance")) {
      d->tolerance = Number(*n, at("tolerance"));
      if (!(d->tolerance >= 0)) Fail(n->source(), at("tolerance"), "must be >= 0");
    }
    if (const toml::node* n = t.get("seed")) {
      d->seed = Integer(*n, at("seed"));
      if (d->seed < 0) Fail(n->source(), at("seed"), "must be >= 0");
    }
    if (const toml::node* n = t.get("dense_limit")) {
      d->dense_limit = Integer(*n, at("dense_limit"));
      if (d->dense_limit < 0 || d->dense_limit > (int64_t(1) << 30)) Fail(n->source(), at("dense_limit"), "must be in [0, 2^30]");
    }
    if (const toml::node* n = t.get("thresholds")) d->thresholds.Tighten(Limits(Table(*n, at("thresholds")), at("thresholds"), false));
  }

 private:
  static std::string TypeName(const toml::node& n) {
    switch (n.type()) {
      case toml::node_type::string: return "a string";
      case toml::node_type::integer: return "an integer";
      case toml::node_type::floating_point: return "a number";
      case toml::node_type::boolean: return "a boolean";
      case toml::node_type::array: return "an array";
      case toml::node_type::table: return "a table";
      default: return "a date or time";
    }
  }
  std::string file_;
};

std::string Substitute(std::string s, const std::map<std::string, std::string>& vars) {
  for (const auto& [name, value] : vars) {
    const std::string pat = "{" + name + "}";
    for (size_t p = s.find(pat); p != std::string::npos; p = s.find(pat, p + value.size())) s.replace(p, pat.size(), value);
  }
  return s;
}

bool IsPattern(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// The checkpoint's short name: the file's stem, or the folder's name for a HuggingFace
// folder (or its model.safetensors).
std::string Stem(const fs::path& p) {
  if (fs::is_directory(p) || p.filename() == "model.safetensors") {
    const fs::path dir = fs::is_directory(p) ? p : p.parent_path();
    return fs::absolute(dir).lexically_normal().filename().string();
  }
  return p.stem().string();
}

std::string RadiusKeyText(const Radius& r) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", r.value);
  return buf;
}

fs::path Resolve(const fs::path& base, const std::string& rel) {
  return fs::path(rel).is_absolute() ? fs::path(rel) : base / rel;
}

// The [[threshold]] rules.
std::vector<Rule> ReadRules(const Reader& rd, const toml::table& root) {
  std::vector<Rule> rules;
  const toml::node* n = root.get("threshold");
  if (!n) return rules;
  const toml::array* a = n->as_array();
  if (!a) rd.Fail(n->source(), "threshold", "expected [[threshold]] tables");
  for (size_t i = 0; i < a->size(); ++i) {
    const std::string at = "threshold[" + std::to_string(i) + "]";
    const toml::table& t = rd.Table((*a)[i], at);
    Rule r;
    r.where = t.source();
    r.at = at;
    r.limits = rd.Limits(t, at, true);
    if (r.limits.empty()) rd.Fail(t.source(), at, "sets none of max_upper, max_gap, min_lower");
    if (const toml::node* x = t.get("checkpoint")) r.checkpoint = rd.String(*x, at + ".checkpoint");
    if (const toml::node* x = t.get("layer")) r.layer = int(rd.Integer(*x, at + ".layer"));
    if (const toml::node* x = t.get("set")) r.set = rd.Set(*x, at + ".set");
    if (const toml::node* x = t.get("norm")) r.norm = rd.Norm(*x, at + ".norm");
    if (const toml::node* x = t.get("radius")) r.radius = rd.RadiusValue(*x, at + ".radius");
    if (const toml::node* x = t.get("attention_only")) r.attention_only = rd.Bool(*x, at + ".attention_only");
    rules.push_back(r);
  }
  return rules;
}

// A [[checkpoint]] entry's own keys (its job keys over [defaults] in d).
struct CheckpointEntry {
  JobDefaults d;
  const toml::node* path_node = nullptr;
  std::string pattern, preset;
  int heads = 0;
};
CheckpointEntry ReadCheckpointEntry(const Reader& rd, const toml::table& t, const std::string& at,
                                    const JobDefaults& defaults) {
  std::set<std::string> keys = Reader::JobKeys();
  keys.insert({"path", "name", "preset", "layers", "heads", "centres"});
  rd.CheckKeys(t, at, keys);
  CheckpointEntry e;
  e.d = defaults;
  rd.ReadJobKeys(t, at, &e.d);
  if (e.d.radii.empty()) rd.Fail(t.source(), at + ".radii", "no radii (set radii here or in [defaults])");
  e.path_node = t.get("path");
  if (!e.path_node) rd.Fail(t.source(), at + ".path", "missing (a checkpoint file, folder or glob)");
  e.pattern = rd.String(*e.path_node, at + ".path");
  e.preset = t.get("preset") ? rd.String(*t.get("preset"), at + ".preset") : "auto";
  if (e.preset != "auto" && std::find(KnownPresets().begin(), KnownPresets().end(), e.preset) == KnownPresets().end())
    rd.Fail(t.get("preset")->source(), at + ".preset", "unknown preset '" + e.preset + "'");
  e.heads = t.get("heads") ? int(rd.Integer(*t.get("heads"), at + ".heads")) : 0;
  if (e.heads < 0) rd.Fail(t.get("heads")->source(), at + ".heads", "must be >= 0");
  return e;
}

// The checkpoints of an entry, relative to base: one path, or every match of a glob (sorted).
std::vector<std::string> CheckpointPaths(const Reader& rd, const CheckpointEntry& e, const std::string& at,
                                         const fs::path& base) {
  std::vector<std::string> rel_paths;
  if (IsPattern(e.pattern)) {
    glob_t g{};
    const std::string full = Resolve(base, e.pattern).string();
    if (glob(full.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        const std::string m = g.gl_pathv[i];
        if (m.find("centres") != std::string::npos) continue;  // centres files beside the checkpoints
        rel_paths.push_back(fs::path(e.pattern).is_absolute() ? m : fs::path(m).lexically_relative(base).string());
      }
    globfree(&g);
    if (rel_paths.empty()) rd.Fail(e.path_node->source(), at + ".path", "no checkpoint matches '" + e.pattern + "'");
  } else {
    if (!fs::exists(Resolve(base, e.pattern)))
      rd.Fail(e.path_node->source(), at + ".path", "'" + e.pattern + "' not found");
    rel_paths.push_back(e.pattern);
  }
  return rel_paths;
}

// Centres: a file per checkpoint and layer ({stem}, {layer}, {name}), tensors listed,
// matched by patterns, or "all" (tensor_patterns empty).
struct CentreSpec {
  const toml::node* file = nullptr;
  std::string pattern;
  std::vector<std::string> tensor_patterns;
  toml::source_region where;
};
CentreSpec ReadCentreSpec(const Reader& rd, const toml::table& t, const std::string& at) {
  const toml::node* cn = t.get("centres");
  if (!cn) rd.Fail(t.source(), at + ".centres", "missing (centres = { file = ..., tensors = ... })");
  const toml::table& ct = rd.Table(*cn, at + ".centres");
  rd.CheckKeys(ct, at + ".centres", {"file", "tensors"});
  CentreSpec c;
  c.file = ct.get("file");
  if (!c.file) rd.Fail(ct.source(), at + ".centres.file", "missing");
  c.pattern = rd.String(*c.file, at + ".centres.file");
  const toml::node* ctensors = ct.get("tensors");
  if (ctensors && !(ctensors->is_string() && *ctensors->value<std::string>() == "all"))
    c.tensor_patterns = rd.List<std::string>(*ctensors, at + ".centres.tensors",
                                             [&](const auto& x, const auto& k) { return rd.String(x, k); });
  c.where = ctensors ? ctensors->source() : c.file->source();
  return c;
}

// The layers an entry names in a loaded checkpoint: "all" (or none given), or a list.
std::vector<int> LayersOf(const Reader& rd, const toml::table& t, const std::string& at, const LoadedModel& model,
                          const std::string& rel) {
  std::vector<int> layers;
  const toml::node* ln = t.get("layers");
  if (!ln || (ln->is_string() && *ln->value<std::string>() == "all")) return model.layer_indices;
  const toml::array* la = ln->as_array();
  if (!la || la->empty()) rd.Fail(ln->source(), at + ".layers", "expected \"all\" or a list of layer indices");
  for (size_t i = 0; i < la->size(); ++i) {
    const int l = int(rd.Integer((*la)[i], at + ".layers[" + std::to_string(i) + "]"));
    if (std::find(model.layer_indices.begin(), model.layer_indices.end(), l) == model.layer_indices.end())
      rd.Fail((*la)[i].source(), at + ".layers[" + std::to_string(i) + "]",
              rel + " has no attention layer " + std::to_string(l));
    layers.push_back(l);
  }
  return layers;
}

// The centre tensors of one centre file ("" for an .npy file).
std::vector<std::string> CentreTensors(const Reader& rd, const CentreSpec& c, const std::string& at,
                                       const fs::path& centre_path, const std::string& centre_rel,
                                       const std::map<std::string, std::string>& vars) {
  std::vector<std::string> tensors;
  if (centre_path.extension() == ".npy") {
    if (!c.tensor_patterns.empty()) rd.Fail(c.where, at + ".centres.tensors", "an .npy file holds one centre; omit tensors");
    tensors.push_back("");
    return tensors;
  }
  SafetensorsHeader h;
  try {
    h = ReadSafetensorsHeader(centre_path.string());
  } catch (const std::exception& e) {
    rd.Fail(c.file->source(), at + ".centres.file", e.what());
  }
  if (c.tensor_patterns.empty()) {
    for (const auto& [tn, info] : h.tensors) tensors.push_back(tn);
  } else {
    for (const std::string& p0 : c.tensor_patterns) {
      const std::string p = Substitute(p0, vars);
      size_t found = 0;
      for (const auto& [tn, info] : h.tensors)
        if (IsPattern(p) ? fnmatch(p.c_str(), tn.c_str(), 0) == 0 : tn == p) {
          tensors.push_back(tn);
          ++found;
        }
      if (found == 0) rd.Fail(c.where, at + ".centres.tensors", "no tensor '" + p + "' in " + centre_rel);
    }
  }
  if (tensors.empty()) rd.Fail(c.file->source(), at + ".centres.file", centre_rel + " holds no tensors");
  return tensors;
}

// What the jobs of one (checkpoint, layer, centre) share.
struct JobSite {
  const JobDefaults& d;
  const std::string& name;
  const std::string& rel;  // the checkpoint, relative to the audit file's folder
  const fs::path& ck_path;
  const LoadedModel& model;
  int layer = 0, heads = 0;
  const std::string& centre_sha;
  std::string spec_abs, spec_rel;  // the centre spec, resolved and as written
};

// One job: its request, its spec and key, its thresholds (those of d tightened by every rule
// that matches it; the rules matched are marked).
AuditJob MakeJob(const JobSite& s, SetKind set, const Radius& radius, NormKind norm, bool attn,
                 std::vector<Rule>* rules) {
  const JobDefaults& d = s.d;
  AuditJob job;
  job.checkpoint_name = s.name;
  job.checkpoint_sha256 = s.model.sha256;
  job.centre_sha256 = s.centre_sha;
  CertifyRequest& r = job.request;
  r.model.path = s.ck_path.string();
  r.model.preset = s.model.preset;
  r.model.layer = s.layer;
  r.model.heads = s.heads;
  r.model.attention_only = attn;
  r.set.kind = set;
  r.set.centre = s.spec_abs;
  (radius.relative ? r.set.relative_radius : r.set.radius) = radius.value;
  r.options.norm = norm;
  r.options.tolerance = d.tolerance;
  r.options.seed = uint64_t(d.seed);
  r.options.engines.dense_limit = int(d.dense_limit);
  json spec = {{"checkpoint", s.name},
               {"path", s.rel},
               {"preset", s.model.preset},
               {"layer", s.layer},
               {"heads", s.heads},
               {"centre", s.spec_rel},
               {"set", SetKindToString(set)},
               {"radius", radius.text},
               {"radius_value", RadiusKeyText(radius)},
               {"relative", radius.relative},
               {"norm", NormKindToString(norm)},
               {"attention_only", attn},
               {"tolerance", d.tolerance},
               {"seed", d.seed},
               {"dense_limit", d.dense_limit}};
  if (d.budget.enabled()) {
    // No clock: the budget alone bounds every stage (the same certificate
    // everywhere; CertifyOptions::budget).
    r.options.budget = d.budget;
    r.options.probabilistic.seed = d.seed + 1;  // a fixed start: reproducible
    spec["budget"] = {{"steps", d.budget.steps}, {"rounds", d.budget.rounds}};
  } else {
    r.options.time_limit_s = d.time_limit;
    spec["time_limit"] = d.time_limit;
  }
  job.spec = spec;
  job.thresholds = d.thresholds;
  for (Rule& rule : *rules) {
    const bool match = (!rule.checkpoint || *rule.checkpoint == s.name) && (!rule.layer || *rule.layer == s.layer) &&
                       (!rule.set || *rule.set == set) && (!rule.norm || *rule.norm == norm) &&
                       (!rule.radius || *rule.radius == radius) &&
                       (!rule.attention_only || *rule.attention_only == attn);
    if (match) job.thresholds.Tighten(rule.limits);
    rule.matched = rule.matched || match;
  }
  job.key = Sha256Hex(spec.dump() + "\n" + job.checkpoint_sha256 + "\n" + job.centre_sha256 + "\n" +
                      ExecutableSha256());
  return job;
}

// Where the audit file's entries are read from, and what they share.
struct AuditContext {
  const Reader& rd;
  fs::path base;                                   // the audit file's folder
  std::map<std::string, std::string> sha_of_file;  // each centre file hashed once
  std::set<std::string> names_seen;
  std::vector<Rule> rules;
  const std::string& ShaOf(const fs::path& p) {
    auto [it, fresh] = sha_of_file.try_emplace(p.string());
    if (fresh) it->second = Sha256HexOfFile(p.string());
    return it->second;
  }
};

// The jobs of one checkpoint file's layer: every centre tensor, set, radius, norm and
// attention_only.
void AddLayerJobs(AuditContext& cx, const CheckpointEntry& e, const CentreSpec& c, const std::string& at,
                  const std::string& rel, const fs::path& ck_path, const std::string& name, const LoadedModel& model,
                  int layer, AuditPlan* plan) {
  const Reader& rd = cx.rd;
  const int li = int(std::find(model.layer_indices.begin(), model.layer_indices.end(), layer) - model.layer_indices.begin());
  const AttentionLayer& L = model.layers[li];
  const std::map<std::string, std::string> vars = {
      {"stem", Stem(ck_path)}, {"layer", std::to_string(layer)}, {"name", name},
      {"dir", fs::path(rel).parent_path().string().empty() ? "." : fs::path(rel).parent_path().string()}};
  const std::string centre_rel = Substitute(c.pattern, vars);
  const fs::path centre_path = Resolve(cx.base, centre_rel);
  if (!fs::is_regular_file(centre_path))
    rd.Fail(c.file->source(), at + ".centres.file", "'" + centre_rel + "' not found (for " + name + " layer " + std::to_string(layer) + ")");
  const std::vector<std::string> tensors = CentreTensors(rd, c, at, centre_path, centre_rel, vars);
  const std::string& centre_sha = cx.ShaOf(centre_path);
  for (const std::string& tensor : tensors) {
    const std::string suffix = tensor.empty() ? "" : ":" + tensor;
    const JobSite site{e.d, name, rel, ck_path, model, layer, e.heads, centre_sha, centre_path.string() + suffix,
                       centre_rel + suffix};
    try {
      (void)LoadCentre(site.spec_abs, 0, L.d_model);
    } catch (const std::exception& ex) {
      rd.Fail(c.where, at + ".centres", ex.what());
    }
    for (SetKind set : e.d.sets)
      for (const Radius& radius : e.d.radii)
        for (NormKind norm : e.d.norms)
          for (bool attn : e.d.attention_only) plan->jobs.push_back(MakeJob(site, set, radius, norm, attn, &cx.rules));
  }
}

// The jobs of one [[checkpoint]] entry, every checkpoint file it names.
void AddCheckpointJobs(AuditContext& cx, const toml::table& t, const std::string& at, const JobDefaults& defaults,
                       AuditPlan* plan) {
  const Reader& rd = cx.rd;
  const CheckpointEntry e = ReadCheckpointEntry(rd, t, at, defaults);
  const std::vector<std::string> rel_paths = CheckpointPaths(rd, e, at, cx.base);
  const CentreSpec c = ReadCentreSpec(rd, t, at);
  const std::string base_name = t.get("name") ? rd.String(*t.get("name"), at + ".name") : "";
  for (const std::string& rel : rel_paths) {
    const fs::path ck_path = Resolve(cx.base, rel);
    const std::string name = base_name.empty() ? Stem(ck_path) : rel_paths.size() == 1 ? base_name : base_name + ":" + Stem(ck_path);
    if (!cx.names_seen.insert(name).second)
      rd.Fail(e.path_node->source(), at + ".name", "checkpoint name '" + name + "' used twice (set name = ...)");
    LoadOptions lo;
    lo.preset = e.preset;
    lo.heads = e.heads;
    LoadedModel model;
    try {
      model = LoadModel(ck_path.string(), lo);
    } catch (const std::exception& ex) {
      rd.Fail(e.path_node->source(), at + ".path", ex.what());
    }
    for (int layer : LayersOf(rd, t, at, model, rel))
      AddLayerJobs(cx, e, c, at, rel, ck_path, name, model, layer, plan);
  }
}

}  // namespace

AuditPlan ReadAuditFile(const std::string& path) {
  const Reader rd(path);
  if (!fs::is_regular_file(path)) throw InputError(path, "audit file", "not found");
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    rd.Fail(e.source(), "toml", std::string(e.description()));
  }
  rd.CheckKeys(root, "", {"defaults", "checkpoint", "threshold"});
  JobDefaults defaults;
  if (const toml::node* n = root.get("defaults")) {
    const toml::table& t = rd.Table(*n, "defaults");
    rd.CheckKeys(t, "defaults", Reader::JobKeys());
    rd.ReadJobKeys(t, "defaults", &defaults);
  }
  AuditContext cx{rd, fs::path(path).parent_path(), {}, {}, ReadRules(rd, root)};

  const toml::node* cps = root.get("checkpoint");
  if (!cps || !cps->as_array() || cps->as_array()->empty())
    throw InputError(path + ":1", "checkpoint", "no [[checkpoint]] entries");
  AuditPlan plan;
  plan.file = path;
  const toml::array& cp_array = *cps->as_array();
  for (size_t ci = 0; ci < cp_array.size(); ++ci) {
    const std::string at = "checkpoint[" + std::to_string(ci) + "]";
    AddCheckpointJobs(cx, rd.Table(cp_array[ci], at), at, defaults, &plan);
  }
  // A rule that matches nothing is almost certainly a typo.
  for (const Rule& rule : cx.rules)
    if (!rule.matched) rd.Fail(rule.where, rule.at, "matches no job");
  std::set<std::string> keys;
  for (const AuditJob& j : plan.jobs)
    if (!keys.insert(j.key).second)
      throw InputError(path, "checkpoint", "job listed twice: " + j.spec.dump());
  return plan;
}

}  // namespace lipcert::audit
