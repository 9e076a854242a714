#pragma once
// One pre-norm transformer layer (private to src/model):
//   h = h + dropout(attn(attn_norm(h)));  h = h + dropout(ffn(mlp_norm(h)))
// with ffn the dense GELU MLP ("mlp") or MoE ("moe"; only in the layers
// is_moe_layer() picks, the others keep the dense MLP).
#include <torch/nn/module.h>

#include <memory>
#include <string>

#include "meshtrain/config/config.h"
#include "meshtrain/model/attention.h"
#include "meshtrain/model/recompute.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/model/moe.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {

// w_in (column d -> hidden), gelu(tanh), w_out (row hidden -> d), the GELU
// inside the GEMMs (model/gelu_matmul.h); with
// mlp_activation swiglu also w_gate (column d -> hidden): silu(w_gate x) * w_in x.
// The gate and w_in split alike over tp, so the product stays local.
class DenseMLP : public torch::nn::Module {
 public:
  DenseMLP(const ModelConfig& cfg, LayerFactory& factory, const std::string& prefix);
  // With a residual (defined): residual + mlp(x), the add folded into w_out.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& residual = {});

 private:
  MlpActivation activation_;
  std::shared_ptr<Linear> w_in_, w_gate_, w_out_;
  std::shared_ptr<MixedPrecision> precision_;
};

class Block : public torch::nn::Module {
 public:
  // layer: the global layer index, which names the parameters ("layers.<layer>.")
  // and picks the layer's kind (MoE or dense, MLA rope); a multi-token
  // prediction module's block (model/mtp.h) is layer n_layers + j named by `prefix`.
  Block(const ModelConfig& cfg, LayerFactory& factory, int64_t layer, const std::string& prefix = "");
  // layout: packed documents / context parallelism (model/token_layout.h), or nullptr.
  at::Tensor forward(at::Tensor h, ForwardAux* aux, LayerCache* cache, int64_t offset,
                     const TokenLayout* layout = nullptr);
  // Takes effect in training forwards without a KV cache.
  void set_checkpointing(ActivationCheckpointing mode) { checkpointing_ = mode; }

 private:
  at::Tensor layer(at::Tensor h, ForwardAux* aux, LayerCache* cache, int64_t offset, bool recompute_ffn,
                   const TokenLayout* layout);

  ModelConfig cfg_;
  std::shared_ptr<DropoutRng> dropout_;  // residual dropout: on the stream
  ActivationCheckpointing checkpointing_ = ActivationCheckpointing::None;
  std::shared_ptr<RMSNorm> attn_norm_, mlp_norm_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<DenseMLP> mlp_;
  std::shared_ptr<MoE> moe_;
};

}  // namespace meshtrain
