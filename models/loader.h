// Loading attention layers from safetensors checkpoints in several namings ("presets").
//
//   native     q.weight, q.bias, k.*, v.*, o.* (biases optional), optional ln.weight / ln.bias;
//              __metadata__: kind (dot|l2, required), heads, causal ("true"/"false", default
//              false), ln_eps (default 1e-5), optional head_dim_qk / head_dim_v (checked
//              against the shapes). For kind l2, k.weight may be absent (tied to q.weight).
//              Optional post_ln.weight / post_ln.bias with __metadata__ post_ln_eps (default
//              1e-5): the post-LN sublayer LN(X + MHA(X)) instead (lipcert.Layer.save writes it).
//   torch-mha  nn.MultiheadAttention state_dict, any prefix: in_proj_weight (3D, D) holding
//              q, k, v stacked, in_proj_bias, out_proj.weight, out_proj.bias. Kind dot;
//              causal from __metadata__ "causal" (default false).
//   bert       HuggingFace BERT, with or without a prefix such as "bert.":
//              encoder.layer.{i}.attention.self.{query,key,value}.{weight,bias},
//              encoder.layer.{i}.attention.output.dense.{weight,bias}. Post-LN, so each layer
//              is plain MHA; causal only when config.json says is_decoder.
//   gpt2       HuggingFace GPT-2, with or without "transformer.": h.{i}.attn.c_attn.{weight,bias}
//              (Conv1D layout (D, 3D), transposed relative to nn.Linear), h.{i}.attn.c_proj.*,
//              pre-LayerNorm h.{i}.ln_1.{weight,bias} (eps: config layer_norm_epsilon); causal;
//              the layer is the sublayer X + MHA(LN(X)).
// The number of heads comes from LoadOptions::heads, __metadata__ "heads" or config.json beside
// the checkpoint (num_attention_heads, n_head or num_heads); sources that disagree are an error.
#pragma once

#include <string>
#include <vector>

#include "models/attention_layer.h"
#include "models/errors.h"

namespace lipcert {

struct LoadOptions {
  std::string preset = "auto";  // auto | native | torch-mha | bert | gpt2
  int layer = -1;               // which layer for bert/gpt2/torch-mha (-1: all found / the only one)
  int heads = 0;                // 0: from metadata or config.json
};

struct LoadedModel {
  std::string path;    // the safetensors file read (model.safetensors when given a folder)
  std::string preset;  // the preset used (never "auto")
  std::string sha256;  // of the file's bytes
  std::vector<AttentionLayer> layers;  // each validated with ValidateLayer
  std::vector<int> layer_indices;      // checkpoint layer index of each entry
};

// The presets LoadOptions::preset accepts besides "auto".
const std::vector<std::string>& KnownPresets();

// The presets whose naming matches any of these tensor names (what "auto" chooses among).
std::vector<std::string> MatchingPresets(const std::vector<std::string>& tensor_names);

// Loads and validates the layers of a checkpoint (a .safetensors file, or a folder holding
// model.safetensors). Reads only the tensors it needs. Throws InputError naming file and field.
LoadedModel LoadModel(const std::string& path, const LoadOptions& opts = {});

}  // namespace lipcert
