#pragma once
// Causal self-attention: standard multi-head (MHA) and Multi-head Latent
// Attention (MLA, DeepSeek-V2 / Jaxformer). Both take x [B, T, d] at positions
// offset..offset+T and, with a LayerCache, attend to the cached past too and
// append the new positions to it. Heads per rank are derived from the
// projection outputs, so the same code runs with tensor-parallel shards.
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/model/token_layout.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {

class Attention : public torch::nn::Module {
 public:
  // cache may be nullptr (training); offset is the position of x's first token.
  // With a residual (defined), returns residual + attention(x), the add
  // folded into the output projection (Linear::forward_residual). With a
  // layout (training only: packed documents, context parallelism), each
  // token's position and keys come from it instead (model/token_layout.h).
  virtual at::Tensor forward(const at::Tensor& x, LayerCache* cache, int64_t offset,
                             const at::Tensor& residual = {}, const TokenLayout* layout = nullptr) = 0;
};

// Parameters under prefix ("layers.3.attn"): wq (column d -> n_head*hd), wk,
// wv (d -> n_kv_head*hd), wo (row). Grouped-query attention: query head i reads
// kv head i / (n_head / n_kv_head). wk/wv come from LayerFactory::kv_heads,
// which decides how they are sharded (column-split over tp when tp divides
// n_kv_head; else replicated, each rank keeping the kv head its query heads read).
// Cache: a = k [B, KV, t, hd], b = v [B, KV, t, hd] (this rank's kv heads, rope
// already applied to k): GQA's point is the smaller cache.
class MHA : public Attention {
 public:
  MHA(const ModelConfig& cfg, LayerFactory& factory, const std::string& prefix);
  at::Tensor forward(const at::Tensor& x, LayerCache* cache, int64_t offset, const at::Tensor& residual = {},
                     const TokenLayout* layout = nullptr) override;

 private:
  ModelConfig cfg_;
  Rotary rope_;
  LayerFactory* factory_;
  std::shared_ptr<DropoutRng> dropout_;  // attention dropout: on this rank's heads
  std::shared_ptr<Linear> wq_, wk_, wv_, wo_;
};

// Parameters under prefix: w_dkv, w_dq (replicated d -> latent), w_uq, w_uk,
// w_uv (column latent -> n_head*hd), and when dhR > 0: w_qr (column latent ->
// n_head*dhR), w_kr (replicated d -> dhR: one rope key shared by all heads);
// wo (row n_head*hd -> d). Scores over hd + dhR dims. With mla_rope_input
// "joint_latent" (Jaxformer) w_qr and w_kr read [c_kv, c_q] (2*latent) instead.
// Every layer has a ".bias" too when model_config.linear_bias.
// With cfg.mla_latent_norm, RMSNorms q_norm / kv_norm (DeepSeek-V3's
// q_a_layernorm / kv_a_layernorm) normalise the two latents before their
// up-projections (the rope key is computed from x and is not normed).
// Cache: a = latent c [B, t, latent_dim] (after kv_norm), b = rotated rope key [B, t, dhR]
// (undefined when dhR = 0); keys and values are re-expanded from c each step.
// Under context parallelism the latent and the rope key cross the cp group,
// not the keys and values: latent_dim + dhR numbers per token instead of
// 2 * n_head * head_dim.
class MLA : public Attention {
 public:
  MLA(const ModelConfig& cfg, LayerFactory& factory, const std::string& prefix, int64_t dhR);
  at::Tensor forward(const at::Tensor& x, LayerCache* cache, int64_t offset, const at::Tensor& residual = {},
                     const TokenLayout* layout = nullptr) override;
  int64_t dhR() const { return dhR_; }

 private:
  ModelConfig cfg_;
  LayerFactory* factory_;  // the shared rope key enters the tp region through it
  std::shared_ptr<DropoutRng> dropout_;  // attention dropout: on this rank's heads
  int64_t dhR_;
  Rotary rope_;
  std::shared_ptr<Linear> w_dkv_, w_dq_, w_uq_, w_uk_, w_uv_, w_qr_, w_kr_, wo_;
  std::shared_ptr<RMSNorm> q_norm_, kv_norm_;

  // value_width_for(q, k, v, dropout), asked of torch once per shape.
  int64_t value_width(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout);
  std::mutex widths_mu_;  // the forward and a recomputation (the autograd thread) may ask at once
  std::map<std::vector<int64_t>, int64_t> widths_;
};

// Input widths of the rope projections w_qr (q) and w_kr (k) for the
// config's mla_rope_input.
struct MlaRopeInputs {
  int64_t q = 0, k = 0;
};
MlaRopeInputs mla_rope_inputs(const ModelConfig& cfg);

// Attention of queries q [B, H, Tq, *] that are the last Tq of the Tk key
// positions (Tq == Tk: training; Tq < Tk: decoding with a cache).
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout);
// The same with values narrower than queries and keys (MLA's decoupled rope:
// q/k heads hd + dhR, v's hd): v zero-padded to `width` columns (0: q's
// size; flash kernels want one head size) and the output cut back to v's.
at::Tensor causal_attention_padded_v(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout,
                                     int64_t width = 0);
// The narrowest width, from v's own up to q's, that v may be padded to and
// still get the kernel sdpa picks at q's width: choose(w) is sdpa's choice
// with v padded to w. Flash kernels want one head size for q, k and v;
// cuDNN's take narrower values, which then need fewer zero columns (bytes
// and FLOPs for nothing) or none. Widths tried: v's, the multiples of 64
// between, q's.
int64_t narrowest_value_width(int64_t v_width, int64_t qk_width, const std::function<int64_t(int64_t)>& choose);
// causal_attention_padded_v's width on this device: v's own on the CPU
// (its kernels take unequal sizes), q's on the meta device (the performance
// model prices flash), on CUDA narrowest_value_width over torch's own
// choice (at::_fused_sdp_choice for a v of each width).
int64_t value_width_for(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout);

// Which kernel CUDA's sdpa may pick, process-wide (torch's context): auto is
// torch's own choice, which on an H200 runs cuDNN's kernels for GPT-2's and
// moe1B's attention (the profile's kernel names; in isolation cuDNN's
// forward + backward took 0.81 ms for GPT-2's shape against flash's 1.21,
// scripts/dev/sdpa-backends.py); cudnn allows cuDNN's and math only, flash
// leaves cuDNN's out, efficient also flash's, math every fused one.
void prefer_attention_backend(AttentionBackend first);
// The kernel sdpa runs for causal attention of q, k, v [B, H, T, D] as
// given ("flash", "cudnn", "efficient", "math"; "none" if it refuses them).
std::string attention_backend_for(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// dhR of global layer i: 0 in each block's last layer when
// cfg.mla_last_layer_no_rope (Jaxformer), cfg.dhR otherwise.
int64_t mla_layer_dhR(const ModelConfig& cfg, int64_t layer);

}  // namespace meshtrain
