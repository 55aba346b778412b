#include "models/loader.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "models/safetensors.h"
#include "models/sha256.h"

namespace lipcert {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Parses "<digits>" (at most 9 of them) into *out.
bool ParseIndex(const std::string& s, int* out) {
  if (s.empty() || s.size() > 9) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

// Splits "<prefix><stem><index>" where the prefix is empty or ends with '.', e.g.
// ("transformer.h.3", "h.") -> ("transformer.", 3).
bool SplitIndexed(const std::string& rest, const std::string& stem, std::string* prefix, int* index) {
  const size_t pos = rest.rfind(stem);
  if (pos == std::string::npos || (pos > 0 && rest[pos - 1] != '.')) return false;
  if (!ParseIndex(rest.substr(pos + stem.size()), index)) return false;
  *prefix = rest.substr(0, pos);
  return true;
}

// One attention layer found in the names: its checkpoint index and the prefix of its tensors.
struct Site {
  int index = 0;
  std::string prefix;  // everything before the preset's per-layer names ("transformer.h.3.")
};

// A layer of an indexed preset: "<prefix><stem><index><suffix>" (bert, gpt2), e.g.
// "transformer.h.3.attn.c_attn.weight" with stem "h." and suffix ".attn.c_attn.weight" ->
// index 3, prefix "transformer.h.3.".
bool IndexedSite(const std::string& name, const std::string& stem, const std::string& suffix, Site* site) {
  if (!EndsWith(name, suffix)) return false;
  const std::string rest = name.substr(0, name.size() - suffix.size());
  std::string outer;
  if (!SplitIndexed(rest, stem, &outer, &site->index)) return false;
  site->prefix = rest + ".";
  return true;
}

constexpr const char* kMhaIn = "in_proj_weight";

bool NativeSite(const std::string& name, Site*) { return name == "q.weight"; }
bool TorchMhaSite(const std::string& name, Site* site) {
  if (name != kMhaIn && !EndsWith(name, std::string(".") + kMhaIn)) return false;
  site->prefix = name.substr(0, name.size() - std::string(kMhaIn).size());
  return true;
}
bool BertSite(const std::string& name, Site* site) {
  return IndexedSite(name, "encoder.layer.", ".attention.self.query.weight", site);
}
bool Gpt2Site(const std::string& name, Site* site) { return IndexedSite(name, "h.", ".attn.c_attn.weight", site); }

// Lists a few tensor names for error messages.
std::string SomeNames(const std::vector<std::string>& names) {
  std::string s;
  const size_t shown = std::min<size_t>(names.size(), 8);
  for (size_t i = 0; i < shown; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > shown) s += ", ... (" + std::to_string(names.size()) + " in all)";
  if (names.empty()) s = "none";
  return s;
}

// Reads tensors lazily from one checkpoint.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path) : path_(path), header_(ReadSafetensorsHeader(path)) {}

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  bool Has(const std::string& name) const { return header_.tensors.count(name) > 0; }

  Eigen::MatrixXd Matrix(const std::string& name) const {
    return TensorAsMatrix(ReadSafetensorsTensor(path_, header_, name), path_, name);
  }
  Eigen::VectorXd Vector(const std::string& name) const {
    return TensorAsVector(ReadSafetensorsTensor(path_, header_, name), path_, name);
  }
  // An absent optional bias is the empty vector.
  Eigen::VectorXd OptionalVector(const std::string& name) const {
    return Has(name) ? Vector(name) : Eigen::VectorXd();
  }
  const std::string* Metadata(const std::string& key) const {
    const auto it = header_.metadata.find(key);
    return it == header_.metadata.end() ? nullptr : &it->second;
  }

 private:
  std::string path_;
  SafetensorsHeader header_;
};

// config.json beside the checkpoint, read on first use.
class Config {
 public:
  explicit Config(const std::string& checkpoint_path)
      : path_((fs::path(checkpoint_path).parent_path() / "config.json").string()) {}

  const std::string& path() const { return path_; }

  const json* Get(const std::string& key) {
    Load();
    if (!json_.is_object() || !json_.contains(key)) return nullptr;
    return &json_[key];
  }

  std::optional<int> PositiveInt(const std::string& key) {
    const json* v = Get(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer() || v->get<int64_t>() <= 0 || v->get<int64_t>() > INT_MAX)
      throw InputError(path_, key, "must be a positive integer");
    return int(v->get<int64_t>());
  }

  std::optional<double> PositiveDouble(const std::string& key) {
    const json* v = Get(key);
    if (!v) return std::nullopt;
    if (!v->is_number() || !(v->get<double>() > 0) || !std::isfinite(v->get<double>()))
      throw InputError(path_, key, "must be a positive number");
    return v->get<double>();
  }

  std::optional<bool> Bool(const std::string& key) {
    const json* v = Get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw InputError(path_, key, "must be true or false");
    return v->get<bool>();
  }

  std::optional<std::string> String(const std::string& key) {
    const json* v = Get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw InputError(path_, key, "must be a string");
    return v->get<std::string>();
  }

 private:
  void Load() {
    if (loaded_) return;
    loaded_ = true;
    std::error_code ec;
    if (!fs::exists(path_, ec)) return;
    try {
      json_ = json::parse(ReadWholeFile(path_));
    } catch (const json::exception& e) {
      throw InputError(path_, "json", std::string("invalid JSON: ") + e.what());
    }
    if (!json_.is_object()) throw InputError(path_, "json", "config.json is not a JSON object");
  }

  std::string path_;
  bool loaded_ = false;
  json json_;
};

int ParsePositiveIntText(const std::string& text, const std::string& file, const std::string& field) {
  int v = 0;
  if (!ParseIndex(text, &v) || v <= 0) throw InputError(file, field, "'" + text + "' is not a positive integer");
  return v;
}

double ParsePositiveDoubleText(const std::string& text, const std::string& file, const std::string& field) {
  double v = 0;  // from_chars: independent of the C locale
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !(v > 0) || !std::isfinite(v))
    throw InputError(file, field, "'" + text + "' is not a positive finite number");
  return v;
}

bool ParseBoolText(const std::string& text, const std::string& file, const std::string& field) {
  if (text == "true") return true;
  if (text == "false") return false;
  throw InputError(file, field, "'" + text + "' is not \"true\" or \"false\"");
}

// Resolves the number of heads from the options, the metadata and config.json; sources that
// are present must agree.
int ResolveHeads(const Checkpoint& ck, Config& cfg, const LoadOptions& opts,
                 const std::vector<std::string>& config_keys, std::string* source) {
  struct Found {
    int heads;
    std::string source;
  };
  std::vector<Found> found;
  if (opts.heads > 0) found.push_back({opts.heads, "--heads"});
  if (const std::string* m = ck.Metadata("heads"))
    found.push_back({ParsePositiveIntText(*m, ck.path(), "__metadata__.heads"), "__metadata__.heads"});
  for (const std::string& key : config_keys)
    if (const auto v = cfg.PositiveInt(key)) {
      found.push_back({*v, cfg.path() + " " + key});
      break;
    }
  if (found.empty()) {
    std::string keys;
    for (const std::string& k : config_keys) keys += (keys.empty() ? "" : " or ") + k;
    throw InputError(ck.path(), "heads",
                     "the number of heads is unknown: pass --heads, or set 'heads' in __metadata__" +
                         (keys.empty() ? std::string() : " or " + keys + " in config.json beside the checkpoint"));
  }
  for (const Found& f : found)
    if (f.heads != found[0].heads)
      throw InputError(ck.path(), "heads", found[0].source + " says " + std::to_string(found[0].heads) + " heads but " +
                                               f.source + " says " + std::to_string(f.heads));
  *source = found[0].source;
  return found[0].heads;
}

void SetHeadWidths(AttentionLayer& L, const std::string& file, const std::string& wq_name,
                   const std::string& wv_name) {
  if (L.heads <= 0 || L.wq.rows() % L.heads != 0)
    throw InputError(file, wq_name, std::to_string(L.wq.rows()) + " rows do not split into " +
                                        std::to_string(L.heads) + " heads");
  if (L.wv.rows() % L.heads != 0)
    throw InputError(file, wv_name, std::to_string(L.wv.rows()) + " rows do not split into " +
                                        std::to_string(L.heads) + " heads");
  L.d_model = int(L.wq.cols());
  L.head_dim_qk = int(L.wq.rows() / L.heads);
  L.head_dim_v = int(L.wv.rows() / L.heads);
}

std::string Require(const Checkpoint& ck, const std::string& name, const std::string& preset) {
  if (!ck.Has(name)) throw InputError(ck.path(), name, "missing tensor (preset " + preset + ")");
  return name;
}

AttentionLayer LoadNative(const Checkpoint& ck, Config& cfg, const LoadOptions& opts, const Site&) {
  AttentionLayer L;
  const std::string& file = ck.path();
  const std::string* kind = ck.Metadata("kind");
  if (!kind) throw InputError(file, "__metadata__.kind", "missing (expected \"dot\" or \"l2\")");
  if (!StringToAttentionKind(*kind, &L.kind))
    throw InputError(file, "__metadata__.kind", "'" + *kind + "' is not \"dot\" or \"l2\"");
  if (const std::string* c = ck.Metadata("causal")) L.causal = ParseBoolText(*c, file, "__metadata__.causal");
  L.tensor_names["kind"] = "__metadata__.kind";
  L.tensor_names["causal"] = ck.Metadata("causal") ? "__metadata__.causal" : "default (false)";
  L.heads = ResolveHeads(ck, cfg, opts, {}, &L.tensor_names["heads"]);

  L.wq = ck.Matrix(Require(ck, "q.weight", "native"));
  L.wv = ck.Matrix(Require(ck, "v.weight", "native"));
  L.wo = ck.Matrix(Require(ck, "o.weight", "native"));
  L.tensor_names["wq"] = "q.weight";
  L.tensor_names["wv"] = "v.weight";
  L.tensor_names["wo"] = "o.weight";
  if (ck.Has("k.weight")) {
    L.wk = ck.Matrix("k.weight");
    L.tensor_names["wk"] = "k.weight";
  } else if (L.kind == AttentionKind::kL2) {
    L.wk = L.wq;
    L.tensor_names["wk"] = "q.weight (tied)";
  } else {
    throw InputError(file, "k.weight", "missing tensor (dot attention needs it; only l2 ties it to q.weight)");
  }
  for (const char* b : {"q", "k", "v", "o"}) {
    const std::string name = std::string(b) + ".bias";
    if (!ck.Has(name)) continue;
    if (L.kind == AttentionKind::kL2 && (b[0] == 'q' || b[0] == 'k'))
      throw InputError(file, name, "l2 attention has no query/key bias");
    Eigen::VectorXd v = ck.Vector(name);
    L.tensor_names[std::string("b") + b] = name;
    (b[0] == 'q' ? L.bq : b[0] == 'k' ? L.bk : b[0] == 'v' ? L.bv : L.bo) = std::move(v);
  }
  if (L.kind == AttentionKind::kL2 && L.wk.rows() == L.wq.rows() && L.wk.cols() == L.wq.cols() && L.wk != L.wq)
    throw InputError(file, "k.weight", "l2 attention ties keys to queries, but k.weight differs from q.weight");
  SetHeadWidths(L, file, "q.weight", "v.weight");
  if (const std::string* m = ck.Metadata("head_dim_qk"))
    if (ParsePositiveIntText(*m, file, "__metadata__.head_dim_qk") != L.head_dim_qk)
      throw InputError(file, "__metadata__.head_dim_qk",
                       *m + " disagrees with q.weight's rows / heads = " + std::to_string(L.head_dim_qk));
  if (const std::string* m = ck.Metadata("head_dim_v"))
    if (ParsePositiveIntText(*m, file, "__metadata__.head_dim_v") != L.head_dim_v)
      throw InputError(file, "__metadata__.head_dim_v",
                       *m + " disagrees with v.weight's rows / heads = " + std::to_string(L.head_dim_v));

  if (ck.Has("ln.weight") || ck.Has("ln.bias")) {
    LayerNormParams ln;
    ln.gamma = ck.Vector(Require(ck, "ln.weight", "native"));
    ln.beta = ck.Vector(Require(ck, "ln.bias", "native"));
    if (const std::string* e = ck.Metadata("ln_eps")) ln.eps = ParsePositiveDoubleText(*e, file, "__metadata__.ln_eps");
    L.layer_norm = ln;
    L.tensor_names["ln.weight"] = "ln.weight";
    L.tensor_names["ln.bias"] = "ln.bias";
    L.tensor_names["ln.eps"] = ck.Metadata("ln_eps") ? "__metadata__.ln_eps" : "default (1e-5)";
  } else if (ck.Metadata("ln_eps")) {
    throw InputError(file, "__metadata__.ln_eps", "given, but the file has no ln.weight / ln.bias");
  }
  if (ck.Has("post_ln.weight") || ck.Has("post_ln.bias")) {  // the post-LN sublayer LN(X + MHA(X))
    LayerNormParams ln;
    ln.gamma = ck.Vector(Require(ck, "post_ln.weight", "native"));
    ln.beta = ck.Vector(Require(ck, "post_ln.bias", "native"));
    if (const std::string* e = ck.Metadata("post_ln_eps"))
      ln.eps = ParsePositiveDoubleText(*e, file, "__metadata__.post_ln_eps");
    L.post_layer_norm = ln;
    L.tensor_names["post_ln.weight"] = "post_ln.weight";
    L.tensor_names["post_ln.bias"] = "post_ln.bias";
    L.tensor_names["post_ln.eps"] = ck.Metadata("post_ln_eps") ? "__metadata__.post_ln_eps" : "default (1e-5)";
  } else if (ck.Metadata("post_ln_eps")) {
    throw InputError(file, "__metadata__.post_ln_eps", "given, but the file has no post_ln.weight / post_ln.bias");
  }
  return L;
}

// Splits the rows [part * d, (part + 1) * d) of a stacked (3D, D) matrix.
Eigen::MatrixXd Third(const Eigen::MatrixXd& m, int part) {
  const Eigen::Index d = m.rows() / 3;
  return m.middleRows(part * d, d);
}

std::string RowRange(const std::string& name, int part, Eigen::Index d) {
  return name + "[" + std::to_string(part * d) + ":" + std::to_string((part + 1) * d) + "]";
}

AttentionLayer LoadTorchMha(const Checkpoint& ck, Config& cfg, const LoadOptions& opts, const Site& site) {
  AttentionLayer L;
  const std::string& file = ck.path();
  const std::string& p = site.prefix;
  L.kind = AttentionKind::kDot;
  if (const std::string* c = ck.Metadata("causal")) L.causal = ParseBoolText(*c, file, "__metadata__.causal");
  L.tensor_names["causal"] = ck.Metadata("causal") ? "__metadata__.causal" : "default (false)";
  for (const char* extra : {"bias_k", "bias_v", "q_proj_weight"})
    if (ck.Has(p + extra))
      throw InputError(file, p + extra, "unsupported nn.MultiheadAttention variant (add_bias_kv or kdim/vdim)");
  L.heads = ResolveHeads(ck, cfg, opts, {"num_heads", "num_attention_heads", "n_head"}, &L.tensor_names["heads"]);

  const std::string in_w = p + "in_proj_weight", in_b = p + "in_proj_bias";
  const Eigen::MatrixXd w = ck.Matrix(in_w);
  if (w.rows() != 3 * w.cols())
    throw InputError(file, in_w, "expected shape (3D, D), got (" + std::to_string(w.rows()) + ", " +
                                     std::to_string(w.cols()) + ")");
  const Eigen::Index d = w.cols();
  L.wq = Third(w, 0);
  L.wk = Third(w, 1);
  L.wv = Third(w, 2);
  L.tensor_names["wq"] = RowRange(in_w, 0, d);
  L.tensor_names["wk"] = RowRange(in_w, 1, d);
  L.tensor_names["wv"] = RowRange(in_w, 2, d);
  if (ck.Has(in_b)) {
    const Eigen::VectorXd b = ck.Vector(in_b);
    if (b.size() != 3 * d)
      throw InputError(file, in_b, "expected length " + std::to_string(3 * d) + ", got " + std::to_string(b.size()));
    L.bq = b.segment(0, d);
    L.bk = b.segment(d, d);
    L.bv = b.segment(2 * d, d);
    L.tensor_names["bq"] = RowRange(in_b, 0, d);
    L.tensor_names["bk"] = RowRange(in_b, 1, d);
    L.tensor_names["bv"] = RowRange(in_b, 2, d);
  }
  L.wo = ck.Matrix(Require(ck, p + "out_proj.weight", "torch-mha"));
  L.tensor_names["wo"] = p + "out_proj.weight";
  if (ck.Has(p + "out_proj.bias")) {
    L.bo = ck.Vector(p + "out_proj.bias");
    L.tensor_names["bo"] = p + "out_proj.bias";
  }
  SetHeadWidths(L, file, in_w, in_w);
  return L;
}

AttentionLayer LoadBert(const Checkpoint& ck, Config& cfg, const LoadOptions& opts, const Site& site) {
  AttentionLayer L;
  const std::string& file = ck.path();
  const std::string& p = site.prefix;  // "...encoder.layer.3."
  L.kind = AttentionKind::kDot;
  if (const auto pe = cfg.String("position_embedding_type"); pe && *pe != "absolute")
    throw InputError(cfg.path(), "position_embedding_type",
                     "'" + *pe + "' changes the attention logits; only \"absolute\" is supported");
  if (ck.Has(p + "attention.self.distance_embedding.weight"))
    throw InputError(file, p + "attention.self.distance_embedding.weight",
                     "relative position embeddings change the attention logits; not supported");
  L.causal = cfg.Bool("is_decoder").value_or(false);
  L.tensor_names["causal"] = cfg.Get("is_decoder") ? cfg.path() + " is_decoder" : "default (false)";
  L.heads = ResolveHeads(ck, cfg, opts, {"num_attention_heads"}, &L.tensor_names["heads"]);
  struct Part {
    const char* name;
    Eigen::MatrixXd* w;
    Eigen::VectorXd* b;
    const char* wkey;
    const char* bkey;
  };
  const Part parts[] = {{"attention.self.query", &L.wq, &L.bq, "wq", "bq"},
                        {"attention.self.key", &L.wk, &L.bk, "wk", "bk"},
                        {"attention.self.value", &L.wv, &L.bv, "wv", "bv"},
                        {"attention.output.dense", &L.wo, &L.bo, "wo", "bo"}};
  for (const Part& part : parts) {
    const std::string w = p + part.name + ".weight", b = p + part.name + ".bias";
    *part.w = ck.Matrix(Require(ck, w, "bert"));
    L.tensor_names[part.wkey] = w;
    if (ck.Has(b)) {
      *part.b = ck.Vector(b);
      L.tensor_names[part.bkey] = b;
    }
  }
  SetHeadWidths(L, file, p + "attention.self.query.weight", p + "attention.self.value.weight");
  // The post-LN sublayer LN(X + MHA(X)) (BertSelfOutput; its dropout is the identity at inference).
  const std::string lnw = p + "attention.output.LayerNorm.weight", lnb = p + "attention.output.LayerNorm.bias";
  if (ck.Has(lnw) || ck.Has(lnb)) {
    LayerNormParams ln;
    ln.gamma = ck.Vector(Require(ck, lnw, "bert"));
    ln.beta = ck.Vector(Require(ck, lnb, "bert"));
    ln.eps = cfg.PositiveDouble("layer_norm_eps").value_or(1e-12);
    L.post_layer_norm = ln;
    L.tensor_names["post_ln.weight"] = lnw;
    L.tensor_names["post_ln.bias"] = lnb;
    L.tensor_names["post_ln.eps"] = cfg.Get("layer_norm_eps") ? cfg.path() + " layer_norm_eps" : "default (1e-12)";
  }
  if (const auto hidden = cfg.PositiveInt("hidden_size"); hidden && *hidden != L.d_model)
    throw InputError(cfg.path(), "hidden_size", std::to_string(*hidden) + " disagrees with the checkpoint's D = " +
                                                    std::to_string(L.d_model));
  return L;
}

AttentionLayer LoadGpt2(const Checkpoint& ck, Config& cfg, const LoadOptions& opts, const Site& site) {
  AttentionLayer L;
  const std::string& file = ck.path();
  const std::string& p = site.prefix;  // "...h.3."
  L.kind = AttentionKind::kDot;
  L.causal = true;
  L.tensor_names["causal"] = "gpt2 (always causal)";
  if (cfg.Bool("scale_attn_weights").value_or(true) == false)
    throw InputError(cfg.path(), "scale_attn_weights", "false is not supported (logits must be scaled by 1/sqrt(dk))");
  if (cfg.Bool("scale_attn_by_inverse_layer_idx").value_or(false))
    throw InputError(cfg.path(), "scale_attn_by_inverse_layer_idx", "true is not supported");
  L.heads = ResolveHeads(ck, cfg, opts, {"n_head"}, &L.tensor_names["heads"]);

  // Conv1D computes x W + b with W of shape (in, out): the nn.Linear weight is W^T.
  const std::string aw = p + "attn.c_attn.weight", ab = p + "attn.c_attn.bias";
  const std::string pw = p + "attn.c_proj.weight", pb = p + "attn.c_proj.bias";
  const Eigen::MatrixXd w = ck.Matrix(aw);
  if (w.cols() != 3 * w.rows())
    throw InputError(file, aw, "expected Conv1D shape (D, 3D), got (" + std::to_string(w.rows()) + ", " +
                                   std::to_string(w.cols()) + ")");
  const Eigen::Index d = w.rows();
  L.wq = w.middleCols(0, d).transpose();
  L.wk = w.middleCols(d, d).transpose();
  L.wv = w.middleCols(2 * d, d).transpose();
  const char* keys[] = {"wq", "wk", "wv"};
  for (int i = 0; i < 3; ++i)
    L.tensor_names[keys[i]] =
        aw + "[:, " + std::to_string(i * d) + ":" + std::to_string((i + 1) * d) + "]^T";
  if (ck.Has(ab)) {
    const Eigen::VectorXd b = ck.Vector(ab);
    if (b.size() != 3 * d)
      throw InputError(file, ab, "expected length " + std::to_string(3 * d) + ", got " + std::to_string(b.size()));
    L.bq = b.segment(0, d);
    L.bk = b.segment(d, d);
    L.bv = b.segment(2 * d, d);
    L.tensor_names["bq"] = RowRange(ab, 0, d);
    L.tensor_names["bk"] = RowRange(ab, 1, d);
    L.tensor_names["bv"] = RowRange(ab, 2, d);
  }
  L.wo = ck.Matrix(Require(ck, pw, "gpt2")).transpose();
  L.tensor_names["wo"] = pw + "^T";
  if (ck.Has(pb)) {
    L.bo = ck.Vector(pb);
    L.tensor_names["bo"] = pb;
  }
  LayerNormParams ln;
  ln.gamma = ck.Vector(Require(ck, p + "ln_1.weight", "gpt2"));
  ln.beta = ck.Vector(Require(ck, p + "ln_1.bias", "gpt2"));
  ln.eps = cfg.PositiveDouble("layer_norm_epsilon").value_or(1e-5);
  L.layer_norm = ln;
  L.tensor_names["ln.weight"] = p + "ln_1.weight";
  L.tensor_names["ln.bias"] = p + "ln_1.bias";
  L.tensor_names["ln.eps"] = cfg.Get("layer_norm_epsilon") ? cfg.path() + " layer_norm_epsilon" : "default (1e-5)";
  SetHeadWidths(L, file, aw, aw);
  if (const auto n = cfg.PositiveInt("n_embd"); n && *n != L.d_model)
    throw InputError(cfg.path(), "n_embd",
                     std::to_string(*n) + " disagrees with the checkpoint's D = " + std::to_string(L.d_model));
  return L;
}

// Checkpoint layer indices for torch-mha prefixes: the last ".<n>." component when every
// prefix has a distinct one, else the position in sorted order.
void NumberTorchSites(std::vector<Site>& sites) {
  std::set<int> seen;
  bool ok = true;
  for (Site& s : sites) {
    int index = -1;
    // Look for the last component made of digits.
    std::string comp;
    size_t start = 0;
    while (start < s.prefix.size()) {
      const size_t dot = s.prefix.find('.', start);
      const std::string c = s.prefix.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      int v;
      if (ParseIndex(c, &v)) index = v;
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    s.index = index;
    ok = ok && index >= 0 && seen.insert(index).second;
  }
  if (!ok) {
    std::sort(sites.begin(), sites.end(), [](const Site& a, const Site& b) { return a.prefix < b.prefix; });
    for (size_t i = 0; i < sites.size(); ++i) sites[i].index = int(i);
  }
}

// The presets: adding one is one entry here (and its Site/Load functions above).
struct Preset {
  const char* name;
  const char* expected;  // the naming shown when a forced preset finds no layer
  const char* stem;      // per-layer stem when all layers must share one outer prefix; "" if none
  bool (*site_of)(const std::string& tensor_name, Site* site);  // detection: is it a layer's key tensor?
  void (*number)(std::vector<Site>& sites);  // assigns checkpoint indices (nullptr: from site_of)
  AttentionLayer (*load)(const Checkpoint& ck, Config& cfg, const LoadOptions& opts, const Site& site);
};

const Preset kPresets[] = {
    {"native", "q.weight", "", NativeSite, nullptr, LoadNative},
    {"torch-mha", "[prefix.]in_proj_weight", "", TorchMhaSite, NumberTorchSites, LoadTorchMha},
    {"bert", "[prefix.]encoder.layer.{i}.attention.self.query.weight", "encoder.layer.", BertSite, nullptr, LoadBert},
    {"gpt2", "[prefix.]h.{i}.attn.c_attn.weight", "h.", Gpt2Site, nullptr, LoadGpt2},
};

const Preset* FindPreset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

std::vector<Site> FindSites(const Preset& preset, const std::vector<std::string>& names) {
  std::vector<Site> sites;
  for (const std::string& n : names) {
    Site s;
    if (preset.site_of(n, &s)) sites.push_back(s);
  }
  return sites;
}

// "a, b, c" (or "a, b or c" with last_or).
std::string JoinNames(const std::vector<std::string>& names, bool last_or) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : last_or && i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

}  // namespace

const std::vector<std::string>& KnownPresets() {
  static const std::vector<std::string> presets = [] {
    std::vector<std::string> names;
    for (const Preset& p : kPresets) names.push_back(p.name);
    return names;
  }();
  return presets;
}

std::vector<std::string> MatchingPresets(const std::vector<std::string>& tensor_names) {
  std::vector<std::string> out;
  for (const Preset& p : kPresets)
    if (!FindSites(p, tensor_names).empty()) out.push_back(p.name);
  return out;
}

LoadedModel LoadModel(const std::string& path_in, const LoadOptions& opts) {
  std::string path = path_in;
  std::error_code ec;
  if (fs::is_directory(path, ec)) path = (fs::path(path) / "model.safetensors").string();

  std::vector<std::string> accepted = {"auto"};
  for (const std::string& p : KnownPresets()) accepted.push_back(p);
  if (opts.preset != "auto" && !FindPreset(opts.preset))
    throw InputError(path, "preset", "unknown preset '" + opts.preset + "' (expected " + JoinNames(accepted, true) + ")");
  if (opts.heads < 0) throw InputError(path, "heads", "must be positive (or 0 to read it from the checkpoint)");
  if (opts.layer < -1) throw InputError(path, "layer", "must be a layer index (or -1 for all layers)");

  const Checkpoint ck(path);
  Config cfg(path);
  std::vector<std::string> names;
  for (const auto& [name, info] : ck.header().tensors) names.push_back(name);

  LoadedModel model;
  model.path = path;
  if (opts.preset == "auto") {
    const std::vector<std::string> matches = MatchingPresets(names);
    if (matches.empty())
      throw InputError(path, "preset", "no known tensor naming (" + JoinNames(KnownPresets(), false) + ") recognised; tensors: " +
                                           SomeNames(names));
    if (matches.size() > 1) {
      std::string m;
      for (const std::string& s : matches) m += (m.empty() ? "" : ", ") + s;
      throw InputError(path, "preset", "ambiguous: the tensor names match presets " + m + "; choose one with --preset");
    }
    model.preset = matches[0];
  } else {
    model.preset = opts.preset;
  }

  const Preset& preset = *FindPreset(model.preset);
  std::vector<Site> sites = FindSites(preset, names);
  if (sites.empty())
    throw InputError(path, "preset", "preset " + model.preset + " expects tensors named " + preset.expected +
                                         "; none found (tensors: " + SomeNames(names) + ")");
  if (*preset.stem) {
    // All layers must share one outer prefix ("", "bert.", "transformer.").
    std::set<std::string> outers;
    for (const Site& s : sites) outers.insert(s.prefix.substr(0, s.prefix.rfind(preset.stem)));
    if (outers.size() > 1)
      throw InputError(path, "preset", "layers found under several prefixes (" + SomeNames({outers.begin(), outers.end()}) +
                                           "); the checkpoint holds more than one model");
    std::set<int> indices;
    for (const Site& s : sites) indices.insert(s.index);
    if (indices.size() != sites.size()) throw InputError(path, "preset", "a layer index appears twice");
  }
  if (preset.number) preset.number(sites);
  std::sort(sites.begin(), sites.end(), [](const Site& a, const Site& b) { return a.index < b.index; });

  if (opts.layer >= 0) {
    const auto it = std::find_if(sites.begin(), sites.end(), [&](const Site& s) { return s.index == opts.layer; });
    if (it == sites.end()) {
      std::string have;
      for (const Site& s : sites) have += (have.empty() ? "" : ", ") + std::to_string(s.index);
      throw InputError(path, "layer", "layer " + std::to_string(opts.layer) + " not found (layers: " + have + ")");
    }
    sites = {*it};
  }

  for (const Site& site : sites) {
    AttentionLayer L = preset.load(ck, cfg, opts, site);
    const std::string problem = ValidateLayer(L);
    if (!problem.empty()) {
      const size_t colon = problem.find(": ");
      std::string field = colon == std::string::npos ? "layer" : problem.substr(0, colon);
      const std::string message = colon == std::string::npos ? problem : problem.substr(colon + 2);
      const auto named = L.tensor_names.find(field);
      if (named != L.tensor_names.end()) field = named->second;
      throw InputError(path, field, message);
    }
    model.layers.push_back(std::move(L));
    model.layer_indices.push_back(site.index);
  }
  model.sha256 = Sha256HexOfFile(path);
  return model;
}

}  // namespace lipcert
