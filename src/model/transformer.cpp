// The decoder-only transformer over a stage's range of layers.
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "block.h"
#include "meshtrain/core/check.h"
#include "meshtrain/model/attention.h"
#include "meshtrain/model/moe.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {

namespace {

// The tied embedding's layout says so (ParamLayout::tied_embedding): the
// first stage's table, or (copy) the last stage's replica of it, saved once.
void mark_tied_embedding(LayerFactory& factory, bool copy) {
  const auto it = factory.layouts().find("embed.weight");
  MT_ASSERT(it != factory.layouts().end(), "the tied embedding's layout was not recorded");
  ParamLayout layout = it->second;
  layout.tied_embedding = true;
  layout.tied_copy = copy;
  factory.record_layout("embed.weight", layout);
}

at::Tensor accumulate(const at::Tensor& sum, const at::Tensor& x) { return sum.defined() ? sum + x : x; }

}  // namespace

void ForwardAux::add_aux(const at::Tensor& a) { aux_loss = accumulate(aux_loss, a); }
void ForwardAux::add_z(const at::Tensor& z) { z_loss = accumulate(z_loss, z); }

int64_t KVCache::bytes() const {
  int64_t n = 0;
  for (const auto& l : layers) {
    if (l.a.defined()) n += static_cast<int64_t>(l.a.nbytes());
    if (l.b.defined()) n += static_cast<int64_t>(l.b.nbytes());
  }
  return n;
}

void KVCache::truncate(int64_t keep) {
  MT_CHECK(keep >= 0 && keep <= length, "KV cache: cannot keep ", keep, " of its ", length, " positions");
  const auto cut = [keep](at::Tensor& t) {
    if (t.defined()) t = t.narrow(t.dim() == 4 ? 2 : 1, 0, keep);
  };
  for (LayerCache& l : layers) {
    cut(l.a);
    cut(l.b);
  }
  length = keep;
}

double residual_std(const ModelConfig& cfg) {
  return cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.n_layers()));
}

std::vector<LayerSpan> StageRange::chunks() const {
  std::vector<LayerSpan> out = {{first_layer, end_layer}};
  out.insert(out.end(), later_chunks.begin(), later_chunks.end());
  return out;
}

std::vector<int64_t> StageRange::layers() const {
  std::vector<int64_t> out;
  for (const LayerSpan& c : chunks())
    for (int64_t i = c.first; i < c.end; ++i) out.push_back(i);
  return out;
}

Transformer::Transformer(const ModelConfig& cfg, LayerFactory& factory, StageRange range)
    : cfg_(cfg), range_(std::move(range)), dropout_(factory.dropout_rng()), precision_(factory.precision()) {
  const int64_t L = cfg.n_layers();
  if (range_.end_layer < 0) range_.end_layer = L;
  for (const LayerSpan& c : range_.chunks())
    MT_CHECK(0 <= c.first && c.first <= c.end && c.end <= L, "stage layer range [", c.first, ", ", c.end,
             ") is outside the model's ", L, " layers");
  MT_CHECK(cfg.n_head > 0 && cfg.model_dimension % cfg.n_head == 0, "model_config.model_dimension (",
           cfg.model_dimension, ") must be a multiple of n_head (", cfg.n_head, ")");
  const int64_t d = cfg.model_dimension, V = cfg.vocab_size;

  // Multi-token prediction reads Emb(t_{i+k}) on the last stage: a last
  // stage without the embedding holds a copy of it (as a tied head does).
  const bool mtp_copy = cfg.mtp_depth > 0 && range_.has_head && !range_.has_embedding;
  if (range_.has_embedding) {
    embedding_ = register_module("embed", factory.embedding("embed", V, d, cfg.init_std));
    if (cfg.tie_embeddings || (cfg.mtp_depth > 0 && !range_.has_head)) mark_tied_embedding(factory, /*copy=*/false);
  }

  // A child "layers" with children "<i>" gives the dotted global names
  // ("layers.4.attn.wq.weight"); torch forbids dots in one module name.
  auto layers = register_module("layers", std::make_shared<torch::nn::Module>());
  chunk_blocks_.push_back(0);
  for (const LayerSpan& c : range_.chunks()) {
    for (int64_t i = c.first; i < c.end; ++i)
      blocks_.push_back(layers->register_module(std::to_string(i), std::make_shared<Block>(cfg, factory, i)));
    chunk_blocks_.push_back(blocks_.size());
  }

  if (range_.has_head) {
    final_norm_ = register_module("final_norm", factory.norm("final_norm", d, cfg.norm_bias));
    if (mtp_copy) {
      // Same name, same draw as the first stage's table; saved once (from
      // the first stage), its gradient summed with the first stage's over pp.
      embedding_ = register_module("embed", factory.embedding("embed", V, d, cfg.init_std));
      mark_tied_embedding(factory, /*copy=*/true);
    }
    if (!cfg.tie_embeddings) {
      head_ = register_module("head", factory.head("head", d, V, cfg.init_std, nullptr));
    } else if (embedding_) {
      head_ = register_module("head", factory.head("head", d, V, cfg.init_std, embedding_));
    } else {
      // The last stage's copy of the tied weight: same name, same draw as the
      // first stage's embedding; saved once (from the first stage).
      head_ = register_module("embed", factory.head("embed", d, V, cfg.init_std, nullptr));
      mark_tied_embedding(factory, /*copy=*/true);
    }
    if (cfg.mtp_depth > 0) {
      MT_ASSERT(embedding_, "model_config.mtp_depth = ", cfg.mtp_depth, ": the last stage has no embedding copy");
      auto mtp = register_module("mtp", std::make_shared<torch::nn::Module>());
      for (int64_t j = 0; j < cfg.mtp_depth; ++j)
        mtp_.push_back(mtp->register_module(std::to_string(j), std::make_shared<MtpModule>(cfg, factory, j)));
    }
  }
}

void Transformer::set_activation_checkpointing(ActivationCheckpointing mode) {
  for (auto& b : blocks_) b->set_checkpointing(mode);
  for (auto& m : mtp_) m->block().set_checkpointing(mode);
}

at::Tensor Transformer::embed(const at::Tensor& tokens) {
  MT_CHECK(embedding_, "embed() called on a pipeline stage without the embedding (layers ", range_.first_layer,
           "..", range_.end_layer, ")");
  MT_CHECK(tokens.dim() == 2, "tokens must be [B, T], got ", tokens.sizes());
  if (hooks_) hooks_->before_root();
  const double p = is_training() ? cfg_.dropout_rate : 0.0;
  const at::Tensor e = embedding_->forward(tokens);
  if (p == 0) return e;
  return dropout_->stream(e.device(), [&] { return at::dropout(e, p, true); });
}

at::Tensor Transformer::forward_layers(at::Tensor h, ForwardAux* aux, KVCache* cache, const TokenLayout* layout) {
  MT_CHECK(n_chunks() == 1, "forward_layers() runs one chunk of layers but this stage has ", n_chunks(),
           " (interleaved pipeline): run them with forward_chunk()");
  return forward_chunk(0, std::move(h), aux, cache, layout);
}

at::Tensor Transformer::forward_chunk(int64_t chunk, at::Tensor h, ForwardAux* aux, KVCache* cache,
                                      const TokenLayout* layout) {
  MT_CHECK(!(cache && layout), "a token layout (packed documents, context parallelism) is for training, not for "
           "decoding with a KV cache");
  MT_CHECK(chunk >= 0 && chunk < n_chunks(), "layer chunk ", chunk, " is outside this stage's 0..", n_chunks() - 1);
  MT_CHECK(h.dim() == 3, "hidden state must be [B, T, d], got ", h.sizes());
  const int64_t offset = cache ? cache->length : 0;
  if (cache) {
    if (cache->layers.empty()) cache->layers.resize(blocks_.size());
    MT_CHECK(cache->layers.size() == blocks_.size(), "KV cache has ", cache->layers.size(),
             " layers but this stage runs ", blocks_.size(), " (hint: one KVCache per stage)");
    MT_CHECK(offset + h.size(1) <= cfg_.T, "KV cache would hold ", offset + h.size(1),
             " positions, more than the context length T=", cfg_.T);
  }
  const size_t begin = chunk_blocks_[static_cast<size_t>(chunk)], end = chunk_blocks_[static_cast<size_t>(chunk) + 1];
  for (size_t j = begin; j < end; ++j) {
    if (hooks_) hooks_->before_layer(j);
    h = blocks_[j]->forward(h, aux, cache ? &cache->layers[j] : nullptr, offset, layout);
    if (hooks_) h = hooks_->after_layer(j, std::move(h));
  }
  if (cache && chunk + 1 == n_chunks()) cache->length += h.size(1);
  return h;
}

at::Tensor Transformer::token_losses(const at::Tensor& h, const at::Tensor& targets) {
  MT_CHECK(head_, "token_losses() called on a pipeline stage without the head");
  if (hooks_) hooks_->before_root();
  return head_->token_losses(final_norm_->forward(h), targets);
}

at::Tensor Transformer::logits(const at::Tensor& h) {
  MT_CHECK(head_, "logits() called on a pipeline stage without the head");
  if (hooks_) hooks_->before_root();
  return head_->logits(final_norm_->forward(h));
}

std::vector<at::Tensor> Transformer::mtp_token_losses(const at::Tensor& h, const MtpTargets& t, ForwardAux* aux,
                                                      const TokenLayout* layout) {
  MT_CHECK(static_cast<int64_t>(t.tokens.size()) == mtp_depth(), "multi-token prediction: targets for ",
           t.tokens.size(), " depths but the model has ", mtp_depth(), " modules (model_config.mtp_depth)");
  if (hooks_) hooks_->before_root();
  std::vector<at::Tensor> out;
  // The modules' MoE statistics apart: their expert loads are layers
  // n_layers + k's, not the stage's next layers' (aux->expert_tokens).
  ForwardAux mine;
  at::Tensor prev = h;
  if (aux) aux->mtp_expert_tokens.assign(mtp_.size(), at::Tensor());
  for (size_t k = 0; k < mtp_.size(); ++k) {
    const size_t counted = mine.expert_tokens.size();
    prev = mtp_[k]->forward(prev, embedding_->forward(t.tokens[k]), aux ? &mine : nullptr, layout);
    if (aux && mine.expert_tokens.size() > counted) aux->mtp_expert_tokens[k] = mine.expert_tokens.back();
    out.push_back(head_->token_losses(mtp_[k]->head_norm(prev), t.targets[k]) * t.mask[k]);
  }
  if (aux) {
    if (mine.aux_loss.defined()) aux->add_aux(mine.aux_loss);
    if (mine.z_loss.defined()) aux->add_z(mine.z_loss);
    // Their assignments count with the layers' (dropped_fraction).
    auto add = [](at::Tensor& sum, const at::Tensor& c) {
      if (c.defined()) sum = sum.defined() ? sum + c : c;
    };
    add(aux->dropped, mine.dropped);
    add(aux->assigned, mine.assigned);
  }
  return out;
}

at::Tensor Transformer::loss(const at::Tensor& tokens, const at::Tensor& targets, ForwardAux* aux) {
  return token_losses(forward_layers(embed(tokens), aux), targets).mean();
}

LayerParamCount layer_param_count(const ModelConfig& cfg, int64_t i) {
  const int64_t d = cfg.model_dimension, H = cfg.n_head, hd = cfg.head_dim(), h = cfg.hidden_dim();
  const int64_t b = cfg.linear_bias ? 1 : 0;  // a bias per output feature
  LayerParamCount p;
  p.replicated = 2 * d * (cfg.norm_bias ? 2 : 1);  // attn_norm, mlp_norm
  p.replicated += d * b;                            // the row-parallel attention wo's bias
  if (cfg.attention == AttentionKind::Mla) {
    const int64_t Lt = cfg.latent_dim, r = mla_layer_dhR(cfg, i);
    p.replicated += 2 * (d * Lt + Lt * b);        // w_dkv, w_dq
    p.split += 3 * (Lt * H * hd + H * hd * b);    // w_uq, w_uk, w_uv
    if (r > 0) {
      const MlaRopeInputs in = mla_rope_inputs(cfg);
      p.replicated += in.k * r + r * b;           // w_kr
      p.split += in.q * H * r + H * r * b;        // w_qr
    }
    p.split += H * hd * d;                        // wo
    if (cfg.mla_latent_norm) p.replicated += 2 * Lt;  // q_norm, kv_norm
  } else {
    // wk, wv have n_kv_head heads (counted as split: tp replicates them only
    // when it exceeds n_kv_head, which this per-layer count does not know).
    const int64_t kv = cfg.kv_heads() * hd;
    p.split += 2 * d * d + 2 * d * kv + (d + 2 * kv) * b;  // wq, wk, wv (+ biases), wo
  }
  const int64_t m = cfg.gated_mlp() ? 3 : 2;  // w_in, w_out (+ a gated activation's w_gate)
  if (is_moe_layer(cfg, i)) {
    const int64_t E = cfg.n_experts, ns = cfg.n_shared;
    p.replicated += d * E + E * b;                 // router
    if (cfg.router_bias) p.replicated += E;        // score_bias
    p.split += E * (m * d * h + h * b);            // experts w_in, w_out (+ w_gate), b_in
    p.replicated += E * d * b;                     // experts b_out
    p.routed = E * (m * d * h + h * b + d * b);
    if (ns > 0 && cfg.shared_expert == SharedExpert::Mlp) {
      p.split += ns * (m * d * h + h * b);         // shared w_in, w_out (+ w_gate), w_in's bias
      p.replicated += d * b;                       // shared w_out's bias
    } else if (ns > 0) {
      p.replicated += d * ns * d + ns * d * b;     // shared_proj
    }
  } else {
    const int64_t dh = cfg.dense_hidden_dim();
    p.split += m * d * dh + dh * b;                // mlp w_in, w_out (+ w_gate), w_in's bias
    p.replicated += d * b;                         // mlp w_out's bias
  }
  return p;
}

ParamCount count_params(const ModelConfig& cfg) {
  ParamCount c;
  c.embedding = cfg.vocab_size * cfg.model_dimension * (cfg.tie_embeddings ? 1 : 2);
  const int64_t final_norm = cfg.model_dimension * (cfg.norm_bias ? 2 : 1);
  int64_t layers = 0, inactive = 0, mtp = 0;
  for (int64_t i = 0; i < cfg.n_layers() + cfg.mtp_depth; ++i) {
    const LayerParamCount p = layer_param_count(cfg, i);
    (i < cfg.n_layers() ? layers : mtp) += p.total();
    if (p.routed > 0) inactive += p.routed / cfg.n_experts * (cfg.n_experts - cfg.k);
  }
  // Each multi-token prediction module (model/mtp.h): its layer, three norms, eh_proj.
  const int64_t d = cfg.model_dimension;
  mtp += cfg.mtp_depth * (3 * final_norm + 2 * d * d + (cfg.linear_bias ? d : 0));
  c.total = c.embedding + final_norm + layers + mtp;
  c.active = (cfg.active_params_scope == ActiveParamsScope::Layers ? layers : c.total) - inactive;
  return c;
}

ParamCount count_built_params(const Transformer& model) {
  MT_CHECK(model.range().has_embedding && model.range().has_head && model.range().first_layer == 0 &&
               model.range().end_layer == model.config().n_layers() && model.range().later_chunks.empty(),
           "count_built_params needs the whole model, not a pipeline stage");
  const ModelConfig& cfg = model.config();
  ParamCount c;
  int64_t outside_layers = 0, routed = 0;
  for (const auto& p : model.named_parameters()) {
    const int64_t n = p.value().numel();
    c.total += n;
    if (p.key().rfind("layers.", 0) != 0) outside_layers += n;
    if (p.key().rfind("embed.", 0) == 0 || p.key().rfind("head.", 0) == 0) c.embedding += n;
    if (p.key().find(".moe.experts.") != std::string::npos) routed += n;
  }
  const int64_t inactive = routed > 0 ? routed / cfg.n_experts * (cfg.n_experts - cfg.k) : 0;
  c.active = c.total - inactive - (cfg.active_params_scope == ActiveParamsScope::Layers ? outside_layers : 0);
  return c;
}

}  // namespace meshtrain
