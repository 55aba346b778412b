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
  const fs::path base = fs::path(path).parent_path();
  auto resolve = [&](const std::string& rel) { return fs::path(rel).is_absolute() ? fs::path(rel) : base / rel; };

  rd.CheckKeys(root, "", {"defaults", "checkpoint", "threshold"});
  JobDefaults defaults;
  if (const toml::node* n = root.get("defaults")) {
    const toml::table& t = rd.Table(*n, "defaults");
    rd.CheckKeys(t, "defaults", Reader::JobKeys());
    rd.ReadJobKeys(t, "defaults", &defaults);
  }

  std::vector<Rule> rules;
  if (const toml::node* n = root.get("threshold")) {
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
  }

  const toml::node* cps = root.get("checkpoint");
  if (!cps || !cps->as_array() || cps->as_array()->empty())
    throw InputError(path + ":1", "checkpoint", "no [[checkpoint]] entries");
  AuditPlan plan;
  plan.file = path;
  std::map<std::string, std::string> sha_of_file;
  auto sha_of = [&](const fs::path& p) -> const std::string& {
    auto [it, fresh] = sha_of_file.try_emplace(p.string());
    if (fresh) it->second = Sha256HexOfFile(p.string());
    return it->second;
  };
  std::set<std::string> names_seen;
  const toml::array& cp_array = *cps->as_array();
  for (size_t ci = 0; ci < cp_array.size(); ++ci) {
    const std::string at = "checkpoint[" + std::to_string(ci) + "]";
    const toml::table& t = rd.Table(cp_array[ci], at);
    std::set<std::string> keys = Reader::JobKeys();
    keys.insert({"path", "name", "preset", "layers", "heads", "centres"});
    rd.CheckKeys(t, at, keys);
    JobDefaults d = defaults;
    rd.ReadJobKeys(t, at, &d);
    if (d.radii.empty()) rd.Fail(t.source(), at + ".radii", "no radii (set radii here or in [defaults])");
    const toml::node* path_node = t.get("path");
    if (!path_node) rd.Fail(t.source(), at + ".path", "missing (a checkpoint file, folder or glob)");
    const std::string pattern = rd.String(*path_node, at + ".path");
    const std::string preset = t.get("preset") ? rd.String(*t.get("preset"), at + ".preset") : "auto";
    if (preset != "auto" && std::find(KnownPresets().begin(), KnownPresets().end(), preset) == KnownPresets().end())
      rd.Fail(t.get("preset")->source(), at + ".preset", "unknown preset '" + preset + "'");
    const int heads = t.get("heads") ? int(rd.Integer(*t.get("heads"), at + ".heads")) : 0;
    if (heads < 0) rd.Fail(t.get("heads")->source(), at + ".heads", "must be >= 0");

    // The checkpoints: one path, or every match of a glob (sorted).
    std::vector<std::string> rel_paths;
    if (IsPattern(pattern)) {
      glob_t g{};
      const std::string full = resolve(pattern).string();
      if (glob(full.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) {
          const std::string m = g.gl_pathv[i];
          if (m.find("centres") != std::string::npos) continue;  // centres files beside the checkpoints
          rel_paths.push_back(fs::path(pattern).is_absolute() ? m : fs::path(m).lexically_relative(base).string());
        }
      globfree(&g);
      if (rel_paths.empty()) rd.Fail(path_node->source(), at + ".path", "no checkpoint matches '" + pattern + "'");
    } else {
      if (!fs::exists(resolve(pattern))) rd.Fail(path_node->source(), at + ".path", "'" + pattern + "' not found");
      rel_paths.push_back(pattern);
    }

    // Centres: a file per checkpoint and layer ({stem}, {layer}, {name}), tensors listed,
    // matched by patterns, or "all".
    const toml::node* cn = t.get("centres");
    if (!cn) rd.Fail(t.source(), at + ".centres", "missing (centres = { file = ..., tensors = ... })");
    const toml::table& ct = rd.Table(*cn, at + ".centres");
    rd.CheckKeys(ct, at + ".centres", {"file", "tensors"});
    const toml::node* cfile = ct.get("file");
    if (!cfile) rd.Fail(ct.source(), at + ".centres.file", "missing");
    const std::string centre_pattern = rd.String(*cfile, at + ".centres.file");
    std::vector<std::string> tensor_patterns;  // empty: all
    const toml::node* ctensors = ct.get("tensors");
    if (ctensors && !(ctensors->is_string() && *ctensors->value<std::string>() == "all"))
      tensor_patterns = rd.List<std::string>(*ctensors, at + ".centres.tensors",
                                             [&](const auto& x, const auto& k) { return rd.String(x, k); });
    const toml::source_region centre_where = ctensors ? ctensors->source() : cfile->source();

    const std::string base_name = t.get("name") ? rd.String(*t.get("name"), at + ".name") : "";
    for (const std::string& rel : rel_paths) {
      const fs::path ck_path = resolve(rel);
      const std::string name = base_name.empty() ? Stem(ck_path) : rel_paths.size() == 1 ? base_name : base_name + ":" + Stem(ck_path);
      if (!names_seen.insert(name).second)
        rd.Fail(path_node->source(), at + ".name", "checkpoint name '" + name + "' used twice (set name = ...)");
      LoadOptions lo;
      lo.preset = preset;
      lo.heads = heads;
      LoadedModel model;
      try {
        model = LoadModel(ck_path.string(), lo);
      } catch (const std::exception& e) {
        rd.Fail(path_node->source(), at + ".path", e.what());
      }
      // The layers.
      std::vector<int> layers;
      const toml::node* ln = t.get("layers");
      if (!ln || (ln->is_string() && *ln->value<std::string>() == "all")) {
        layers = model.layer_indices;
      } else {
        const toml::array* la = ln->as_array();
        if (!la || la->empty()) rd.Fail(ln->source(), at + ".layers", "expected \"all\" or a list of layer indices");
        for (size_t i = 0; i < la->size(); ++i) {
          const int l = int(rd.Integer((*la)[i], at + ".layers[" + std::to_string(i) + "]"));
          if (std::find(model.layer_indices.begin(), model.layer_indices.end(), l) == model.layer_indices.end())
            rd.Fail((*la)[i].source(), at + ".layers[" + std::to_string(i) + "]",
                    rel + " has no attention layer " + std::to_string(l));
          layers.push_back(l);
        }
      }
      for (int layer : layers) {
        const int li = int(std::find(model.layer_indices.begin(), model.layer_indices.end(), layer) - model.layer_indices.begin());
        const AttentionLayer& L = model.layers[li];
        const std::map<std::string, std::string> vars = {
            {"stem", Stem(ck_path)}, {"layer", std::to_string(layer)}, {"name", name},
            {"dir", fs::path(rel).parent_path().string().empty() ? "." : fs::path(rel).parent_path().string()}};
        const std::string centre_rel = Substitute(centre_pattern, vars);
        const fs::path centre_path = resolve(centre_rel);
        if (!fs::is_regular_file(centre_path))
          rd.Fail(cfile->source(), at + ".centres.file", "'" + centre_rel + "' not found (for " + name + " layer " + std::to_string(layer) + ")");
        std::vector<std::string> tensors;  // "" for an .npy file
        if (centre_path.extension() == ".npy") {
          if (!tensor_patterns.empty()) rd.Fail(centre_where, at + ".centres.tensors", "an .npy file holds one centre; omit tensors");
          tensors.push_back("");
        } else {
          SafetensorsHeader h;
          try {
            h = ReadSafetensorsHeader(centre_path.string());
          } catch (const std::exception& e) {
            rd.Fail(cfile->source(), at + ".centres.file", e.what());
          }
          if (tensor_patterns.empty()) {
            for (const auto& [tn, info] : h.tensors) tensors.push_back(tn);
          } else {
            for (const std::string& p0 : tensor_patterns) {
              const std::string p = Substitute(p0, vars);
              size_t found = 0;
              for (const auto& [tn, info] : h.tensors)
                if (IsPattern(p) ? fnmatch(p.c_str(), tn.c_str(), 0) == 0 : tn == p) {
                  tensors.push_back(tn);
                  ++found;
                }
              if (found == 0) rd.Fail(centre_where, at + ".centres.tensors", "no tensor '" + p + "' in " + centre_rel);
            }
          }
          if (tensors.empty()) rd.Fail(cfile->source(), at + ".centres.file", centre_rel + " holds no tensors");
        }
        const std::string& centre_sha = sha_of(centre_path);
        for (const std::string& tensor : tensors) {
          const std::string spec_abs = centre_path.string() + (tensor.empty() ? "" : ":" + tensor);
          const std::string spec_rel = centre_rel + (tensor.empty() ? "" : ":" + tensor);
          try {
            (void)LoadCentre(spec_abs, 0, L.d_model);
          } catch (const std::exception& e) {
            rd.Fail(centre_where, at + ".centres", e.what());
          }
          for (SetKind set : d.sets)
            for (const Radius& radius : d.radii)
              for (NormKind norm : d.norms)
                for (bool attn : d.attention_only) {
                  AuditJob job;
                  job.checkpoint_name = name;
                  job.checkpoint_sha256 = model.sha256;
                  job.centre_sha256 = centre_sha;
                  CertifyRequest& r = job.request;
                  r.model.path = ck_path.string();
                  r.model.preset = model.preset;
                  r.model.layer = layer;
                  r.model.heads = heads;
                  r.model.attention_only = attn;
                  r.set.kind = set;
                  r.set.centre = spec_abs;
                  (radius.relative ? r.set.relative_radius : r.set.radius) = radius.value;
                  r.options.norm = norm;
                  r.options.tolerance = d.tolerance;
                  r.options.seed = uint64_t(d.seed);
                  r.options.engines.dense_limit = int(d.dense_limit);
                  json spec = {{"checkpoint", name},
                               {"path", rel},
                               {"preset", model.preset},
                               {"layer", layer},
                               {"heads", heads},
                               {"centre", spec_rel},
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
                  for (Rule& rule : rules) {
                    const bool match = (!rule.checkpoint || *rule.checkpoint == name) && (!rule.layer || *rule.layer == layer) &&
                                       (!rule.set || *rule.set == set) && (!rule.norm || *rule.norm == norm) &&
                                       (!rule.radius || *rule.radius == radius) &&
                                       (!rule.attention_only || *rule.attention_only == attn);
                    if (match) job.thresholds.Tighten(rule.limits);
                    rule.matched = rule.matched || match;
                  }
                  job.key = Sha256Hex(spec.dump() + "\n" + job.checkpoint_sha256 + "\n" + job.centre_sha256 + "\n" +
                                      ExecutableSha256());
                  plan.jobs.push_back(std::move(job));
                }
        }
      }
    }
  }
  // A rule that matches nothing is almost certainly a typo.
  for (const Rule& rule : rules)
    if (!rule.matched) rd.Fail(rule.where, rule.at, "matches no job");
  std::set<std::string> keys;
  for (const AuditJob& j : plan.jobs)
    if (!keys.insert(j.key).second)
      throw InputError(path, "checkpoint", "job listed twice: " + j.spec.dump());
  return plan;
}

}  // namespace lipcert::audit
