// A random attention layer of a given structure: the weights of `lipcert bench` and of the
// tests' layers.
#pragma once

#include <random>

#include "models/attention_layer.h"

namespace lipcert {

struct RandomLayerSpec {
  AttentionKind kind = AttentionKind::kDot;
  bool causal = false;
  bool biases = false;      // dot: all four; l2: bv and bo (its query and key are tied)
  bool layer_norm = false;  // X + MHA(LN(X))
  int d = 4, heads = 1, dk = 2;  // dk: query/key and value width per head
  double qk_scale = 1.0;    // Wq, Wk ~ N(0, qk_scale^2 / d); Wv ~ N(0, 1/d); Wo ~ N(0, 1/(heads dk))
  double bias_scale = 0.3;  // biases ~ N(0, bias_scale^2)
  double ln_scale = 0.2;    // gamma = 1 + N(0, ln_scale^2), beta ~ N(0, ln_scale^2)
};

// Draws Wq, Wk (dot only), Wv, Wo, then the biases, then gamma and beta, from `rng`.
AttentionLayer RandomAttentionLayer(const RandomLayerSpec& spec, std::mt19937_64& rng);

}  // namespace lipcert
