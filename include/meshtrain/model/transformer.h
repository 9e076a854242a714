#pragma once
// The decoder-only transformer, written once for one device. A pipeline stage
// builds only its range of layers (plus the embedding on the first stage and
// the final norm + head on the last); tensor parallelism enters through the
// LayerFactory. Forward is split into embed / forward_layers / token_losses so
// the pipeline can run the pieces a stage owns.
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/model/layer_hooks.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/model/mtp.h"
#include "meshtrain/model/token_layout.h"

namespace meshtrain {

// Layers [first, end) of the model.
struct LayerSpan {
  int64_t first = 0, end = 0;
};

struct StageRange {
  int64_t first_layer = 0;
  int64_t end_layer = -1;  // exclusive; -1: all layers
  bool has_embedding = true;
  bool has_head = true;
  // The interleaved pipeline's further chunks (virtual stages) of this rank,
  // in the order the data visits them; [first_layer, end_layer) is chunk 0.
  // Empty: one chunk.
  std::vector<LayerSpan> later_chunks;
  // The zbv schedule's V: this rank's chunk 1 is virtual stage 2pp - 1 -
  // stage (stage 0 then holds both the embedding and the head), not the
  // interleaved chunk * pp + stage (parallel/pipeline_plan.h).
  bool v_shape = false;

  // Every chunk, chunk 0 first (end_layer resolved: on a built model's range()).
  std::vector<LayerSpan> chunks() const;
  // The global indices of every layer of the stage, chunk by chunk.
  std::vector<int64_t> layers() const;
};

// What the layers of one forward add up besides the hidden state.
struct ForwardAux {
  at::Tensor aux_loss;                    // scalar: sum over MoE layers of E*sum(f_i*P_i), mean over sequences
  at::Tensor z_loss;                      // scalar: router z-loss, same reduction
  std::vector<at::Tensor> expert_tokens;  // per MoE layer [E]: token-assignments routed (detached, before capacity)
  // Per multi-token prediction module j (layer n_layers + j): its [E] as
  // above, undefined for a dense module (Transformer::mtp_token_losses).
  std::vector<at::Tensor> mtp_expert_tokens;
  at::Tensor dropped;                     // scalar: token-assignments dropped by capacity (detached)
  at::Tensor assigned;                    // scalar: token-assignments made (detached)
  void add_aux(const at::Tensor& a);
  void add_z(const at::Tensor& z);
};

// Per-layer cache for incremental decoding. MHA stores k and v per head;
// MLA stores only the latent and the shared rope key (that is the point of MLA).
struct LayerCache {
  at::Tensor a;  // MHA: k [B, H, t, hd]; MLA: latent [B, t, latent_dim]
  at::Tensor b;  // MHA: v [B, H, t, hd]; MLA: rope key [B, t, dhR] (undefined when dhR = 0)
};
struct KVCache {
  std::vector<LayerCache> layers;  // one per layer of this stage
  int64_t length = 0;              // tokens already cached
  int64_t bytes() const;
  // Keeps the first `length` positions (0 <= length <= this->length):
  // speculative decoding drops the keys of its rejected drafts. The time axis
  // is dim 2 of MHA's [B, H, t, hd] and dim 1 of MLA's [B, t, *].
  void truncate(int64_t length);
};

class Block;  // one transformer layer (defined in src/model)

// Std of the projections that write into the residual stream (attention wo,
// MLP w_out): init_std / sqrt(2 * n_layers), as GPT-2.
double residual_std(const ModelConfig& cfg);

// named_parameters() of a stage (i: global layer index; "4" for layer 4 even
// on a stage that starts there):
//   embed.weight                                  [vocab, d]  first stage
//   layers.i.attn_norm.weight, layers.i.mlp_norm.weight   [d]
//   layers.i.attn.{wq,wk,wv,wo}.weight            MHA
//   layers.i.attn.{w_dkv,w_dq,w_uq,w_uk,w_uv,wo}.weight (+ w_qr, w_kr when the
//                                                 layer's dhR > 0)   MLA
//   layers.i.mlp.{w_in,w_out}.weight              dense FFN
//   layers.i.moe.*                                MoE (see moe.h), in the layers
//                                                 is_moe_layer() picks
//   final_norm.weight                             last stage
//   mtp.j.{enorm,hnorm,head_norm}.weight, mtp.j.eh_proj.weight, mtp.j.block.*
//                                                 last stage, j < mtp_depth (model/mtp.h)
// With model_config.linear_bias every linear above also has ".bias" (not the
// embedding/head), with norm_bias every norm.
//   head.weight                                   last stage, untied only
// Tied embeddings on a last stage without the embedding: its head owns a copy
// registered as embed.weight (drawn from the same name and seed), so both
// copies share one name for checkpoints and the pipeline's gradient sync.
// Every parameter is drawn from init_normal(seed, its name above, global shape).
class Transformer : public torch::nn::Module {
 public:
  Transformer(const ModelConfig& cfg, LayerFactory& factory, StageRange range = {});

  const ModelConfig& config() const { return cfg_; }
  const StageRange& range() const { return range_; }
  // The precision policy and cast cache the layers compute with (the
  // factory's, model/mixed_precision.h): activations are in its
  // activation_dtype() between layers and pipeline stages.
  MixedPrecision& precision() const { return *precision_; }

  // tokens [B, T] int64 -> h [B, T, d] (first stage only).
  at::Tensor embed(const at::Tensor& tokens);
  // Runs this stage's layers. aux may be nullptr. With `cache`, the input is the
  // next tokens' hidden states at positions cache->length.. and the cache grows:
  // each layer appends its keys, then forward_layers advances cache->length by
  // T. Each pipeline stage keeps its own KVCache for its own layers.
  // One chunk only (forward_chunk runs the chunks of an interleaved stage).
  // A layout (training: packed documents, context parallelism; model/
  // token_layout.h) places the tokens; it must outlive the backward pass.
  at::Tensor forward_layers(at::Tensor h, ForwardAux* aux, KVCache* cache = nullptr,
                            const TokenLayout* layout = nullptr);
  // Runs chunk `chunk` of range().chunks(). A cache holds every layer of the
  // stage; cache->length advances after the last chunk, so every chunk of one
  // step sees the same offset.
  at::Tensor forward_chunk(int64_t chunk, at::Tensor h, ForwardAux* aux, KVCache* cache = nullptr,
                           const TokenLayout* layout = nullptr);
  int64_t n_chunks() const { return static_cast<int64_t>(chunk_blocks_.size()) - 1; }
  // Final norm + head: per-token losses [B, T] fp32 (last stage only).
  at::Tensor token_losses(const at::Tensor& h, const at::Tensor& targets);
  // Final norm + head: full-vocabulary logits [B, T, vocab_size] (last stage only).
  at::Tensor logits(const at::Tensor& h);
  // Multi-token prediction (model/mtp.h; last stage, with the embedding):
  // h [B, T, d] the last layer's output (before the final norm) -> per depth
  // k = 1..D the per-token losses [B, T] fp32, zero where t.mask is. The
  // modules' MoE aux and z losses and assignments are added to aux, their
  // expert counts go to aux->mtp_expert_tokens (one entry per module).
  std::vector<at::Tensor> mtp_token_losses(const at::Tensor& h, const MtpTargets& t, ForwardAux* aux,
                                           const TokenLayout* layout = nullptr);
  int64_t mtp_depth() const { return static_cast<int64_t>(mtp_.size()); }

  // Whole model on one stage: mean loss over all tokens (+ aux in `aux`; the
  // caller weights and adds the aux losses).
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets, ForwardAux* aux = nullptr);

  // The embedding / head when this stage owns them (nullptr otherwise); the
  // pipeline keeps tied copies in sync through these.
  std::shared_ptr<Embedding> embedding() const { return embedding_; }
  std::shared_ptr<LMHead> head() const { return head_; }
  int64_t n_local_layers() const { return static_cast<int64_t>(blocks_.size()); }
  // "none" | "full" | "selective" (model/recompute.h): which activations
  // training forwards recompute in backward instead of keeping.
  void set_activation_checkpointing(ActivationCheckpointing mode);
  // Residency hooks (model/layer_hooks.h); nullptr: parameters always whole.
  // Local block j is global layer range().layers()[j].
  void set_layer_hooks(std::shared_ptr<LayerHooks> hooks) { hooks_ = std::move(hooks); }

 private:
  ModelConfig cfg_;
  StageRange range_;
  std::shared_ptr<Embedding> embedding_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::vector<size_t> chunk_blocks_;  // chunk c runs blocks_[chunk_blocks_[c], chunk_blocks_[c + 1])
  std::shared_ptr<RMSNorm> final_norm_;
  std::shared_ptr<LMHead> head_;
  std::vector<std::shared_ptr<MtpModule>> mtp_;  // last stage, model_config.mtp_depth
  std::shared_ptr<LayerHooks> hooks_;
  std::shared_ptr<DropoutRng> dropout_;  // embedding dropout: on the stream
  std::shared_ptr<MixedPrecision> precision_;
};

// Parameter counts of the full (unsharded) model for a config: total, and
// active per token (MoE: k routed + shared experts instead of all; with
// active_params_scope "layers", as Jaxformer counts, the layers only: no
// embedding table, head or final norm).
struct ParamCount {
  int64_t total = 0;
  int64_t active = 0;
  int64_t embedding = 0;  // token embedding (+ untied head)
};
ParamCount count_params(const ModelConfig& cfg);

// Global parameters of layer i by whether tp splits them, mirroring the
// factory calls of attention.cpp, block.cpp and moe.cpp; `routed` is the part
// (of either) that belongs to the routed experts, of which k of E are active.
struct LayerParamCount {
  int64_t split = 0, replicated = 0, routed = 0;
  int64_t total() const { return split + replicated; }
};
LayerParamCount layer_param_count(const ModelConfig& cfg, int64_t layer);

// The same counts from a built whole model's parameters (names as above), to
// check count_params() against: a model built by MetaLayerFactory costs no memory.
ParamCount count_built_params(const Transformer& model);

}  // namespace meshtrain
