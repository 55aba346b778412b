// An attention layer as a trained checkpoint describes it.
//
// Row convention (see docs/math.md): an input is X in R^{N x D}, token i is row x_i.
// Weights follow nn.Linear: Wq, Wk are (H*dk, D), Wv is (H*dv, D), Wo is (D, H*dv).
//
//   dot: P^h = softmax_row((X Wq_h^T + bq_h)(X Wk_h^T + bk_h)^T / sqrt(dk))  (+ causal mask j <= i)
//        head_h = P^h (X Wv_h^T + bv_h)
//   l2:  P^h_ij ∝ exp(-||x_i Wq_h^T - x_j Wq_h^T||^2 / sqrt(dk)),  A_h = Wq_h^T Wq_h / sqrt(dk)
//        head_h = P^h X A_h Wv_h^T (+ bv_h)         (tied query/key: wk == wq, no bq/bk)
//   MHA(X) = [head_1 .. head_H] Wo^T + bo
//   optional sublayers (mutually exclusive), LayerNorm row-wise with gamma, beta, eps:
//     pre-LN  (GPT-2):  f(X) = X + MHA(LayerNorm(X))      layer_norm
//     post-LN (BERT):   f(X) = LayerNorm(X + MHA(X))      post_layer_norm
#pragma once

#include <Eigen/Dense>
#include <map>
#include <optional>
#include <string>

namespace lipcert {

enum class AttentionKind { kDot, kL2 };

const char* AttentionKindToString(AttentionKind kind);  // "dot" / "l2"
// Returns false (and leaves *kind alone) for anything but "dot" or "l2".
bool StringToAttentionKind(const std::string& s, AttentionKind* kind);

struct LayerNormParams {
  Eigen::VectorXd gamma;  // (D)
  Eigen::VectorXd beta;   // (D)
  double eps = 1e-5;
};

struct AttentionLayer {
  AttentionKind kind = AttentionKind::kDot;
  int d_model = 0;     // D
  int heads = 0;       // H
  int head_dim_qk = 0; // dk
  int head_dim_v = 0;  // dv
  bool causal = false;

  Eigen::MatrixXd wq;  // (H*dk, D)
  Eigen::MatrixXd wk;  // (H*dk, D); equal to wq for kL2
  Eigen::MatrixXd wv;  // (H*dv, D)
  Eigen::MatrixXd wo;  // (D, H*dv)
  // Biases; size 0 means absent (zero). kL2 has no bq, bk.
  Eigen::VectorXd bq, bk, bv, bo;

  // Present: the layer is the pre-LN sublayer X + MHA(LayerNorm(X)).
  std::optional<LayerNormParams> layer_norm;
  // Present: the layer is the post-LN (BERT) sublayer LayerNorm(X + MHA(X)). Never
  // together with layer_norm (ValidateLayer refuses both).
  std::optional<LayerNormParams> post_layer_norm;

  // Where each parameter came from in the checkpoint ("wq" -> "h.0.attn.c_attn.weight[:, 0:64]^T").
  std::map<std::string, std::string> tensor_names;

  bool has_bias() const { return bq.size() || bk.size() || bv.size() || bo.size(); }
  // The pre-LN sublayer X + MHA(LN(X)) (the post-LN one is not "residual" in this sense:
  // its output is normalised, so the invertibility argument of X + g(X) does not apply).
  bool residual() const { return layer_norm.has_value(); }
  bool post_ln() const { return post_layer_norm.has_value(); }
  // The same layer without its post-LN: MHA alone when layer_norm is absent.
  AttentionLayer WithoutPostLayerNorm() const {
    AttentionLayer m = *this;
    m.post_layer_norm.reset();
    return m;
  }

  // Rows [h*dk, (h+1)*dk) of wq etc.
  auto wq_head(int h) const { return wq.middleRows(h * head_dim_qk, head_dim_qk); }
  auto wk_head(int h) const { return wk.middleRows(h * head_dim_qk, head_dim_qk); }
  auto wv_head(int h) const { return wv.middleRows(h * head_dim_v, head_dim_v); }
  auto wo_head(int h) const { return wo.middleCols(h * head_dim_v, head_dim_v); }
};

// Checks shapes, the kind's constraints and finiteness. Returns "" when valid, else a
// message naming the offending field ("wq: expected 128 x 64, got 64 x 64").
std::string ValidateLayer(const AttentionLayer& layer);

}  // namespace lipcert
