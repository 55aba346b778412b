#include "models/attention_layer.h"

#include <sstream>

namespace lipcert {

const char* AttentionKindToString(AttentionKind kind) {
  return kind == AttentionKind::kDot ? "dot" : "l2";
}

bool StringToAttentionKind(const std::string& s, AttentionKind* kind) {
  if (s == "dot") *kind = AttentionKind::kDot;
  else if (s == "l2") *kind = AttentionKind::kL2;
  else return false;
  return true;
}

namespace {

std::string CheckShape(const char* name, const Eigen::MatrixXd& m, long rows, long cols) {
  if (m.rows() == rows && m.cols() == cols) {
    if (!m.allFinite()) return std::string(name) + ": contains NaN or Inf";
    return "";
  }
  std::ostringstream os;
  os << name << ": expected " << rows << " x " << cols << ", got " << m.rows() << " x " << m.cols();
  return os.str();
}

std::string CheckBias(const char* name, const Eigen::VectorXd& b, long size) {
  if (b.size() == 0) return "";
  if (b.size() != size) {
    std::ostringstream os;
    os << name << ": expected length " << size << ", got " << b.size();
    return os.str();
  }
  if (!b.allFinite()) return std::string(name) + ": contains NaN or Inf";
  return "";
}

std::string CheckLayerNorm(const std::string& name, const LayerNormParams& ln, long d) {
  if (ln.gamma.size() != d) return name + ".weight: expected length " + std::to_string(d);
  if (ln.beta.size() != d) return name + ".bias: expected length " + std::to_string(d);
  if (!ln.gamma.allFinite() || !ln.beta.allFinite()) return name + ": contains NaN or Inf";
  if (!(ln.eps > 0) || !std::isfinite(ln.eps)) return name + ".eps: must be positive and finite";
  return "";
}

}  // namespace

std::string ValidateLayer(const AttentionLayer& L) {
  if (L.d_model <= 0) return "d_model: must be positive";
  if (L.heads <= 0) return "heads: must be positive";
  if (L.head_dim_qk <= 0 || L.head_dim_v <= 0) return "head widths: must be positive";
  const long hq = long(L.heads) * L.head_dim_qk, hv = long(L.heads) * L.head_dim_v;
  for (const std::string& e :
       {CheckShape("wq", L.wq, hq, L.d_model), CheckShape("wk", L.wk, hq, L.d_model),
        CheckShape("wv", L.wv, hv, L.d_model), CheckShape("wo", L.wo, L.d_model, hv),
        CheckBias("bq", L.bq, hq), CheckBias("bk", L.bk, hq), CheckBias("bv", L.bv, hv),
        CheckBias("bo", L.bo, L.d_model)})
    if (!e.empty()) return e;
  if (L.kind == AttentionKind::kL2) {
    if (L.bq.size() || L.bk.size()) return "bq/bk: l2 attention has no query/key bias";
    if (L.wk != L.wq) return "wk: l2 attention ties the key weight to the query weight";
  }
  if (L.layer_norm && L.post_layer_norm)
    return "post_ln: a layer has either a pre-LN (ln) or a post-LN (post_ln) LayerNorm, not both";
  if (L.layer_norm)
    if (std::string e = CheckLayerNorm("ln", *L.layer_norm, L.d_model); !e.empty()) return e;
  if (L.post_layer_norm)
    if (std::string e = CheckLayerNorm("post_ln", *L.post_layer_norm, L.d_model); !e.empty()) return e;
  return "";
}

}  // namespace lipcert
