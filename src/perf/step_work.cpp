// One rank's compute for the step model (step_work.h). FLOPs follow from the
// layer shapes exactly as the meta device's observer counts them
// (perf/op_observer.cpp). The other kernels' bytes and the kernel counts
// are per-layer formulas whose constants were fitted to that observer's
// totals (`bench --device meta`, 2026-11-28) over variants of
// configs/gpt2-124m.json (12 to 24 layers, d 768 and 1536, 1 and 4
// microbatches, GELU and SwiGLU, grouped-query heads, dropout, MLA with and
// without latent norms, MoE with 8 and 16 experts, k 2 and 4, capacity 1.25
// and 2, with and without a shared expert, each checkpointing mode) and
// configs/jaxformer/moe1B.json (biases, MLA rope, 1 to 6 layers a block);
// plan_search_test compares the sums with meta steps. They are bf16 bytes
// (fp32 activations double them).
#include "step_work.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/model/attention.h"
#include "meshtrain/model/moe.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {

namespace {

// Other kernels' bytes per token, forward + backward, in bf16.
constexpr double kNormBytes = 12;        // per element of an RMSNorm (4 forward, 8 backward)
constexpr double kRopeBytes = 8;         // per rotated element (q and k, forward and backward)
constexpr double kAttentionMisc = 4;     // per query element: head layout copies around sdpa (MHA)
constexpr double kGqaBytes = 13;         // per query element: kv heads repeated for each query group
constexpr double kGatedBytes = 24;       // per hidden unit of a gated MLP (silu(gate) * up, both ways)
constexpr double kBiasBytes = 5.6;       // per biased output feature (the bias gradient's reduction)
constexpr double kDropoutBytes = 24;     // per model dimension: two residual dropouts and the add
constexpr double kLatentNormBytes = 28;  // per latent unit: MLA's q and kv latent norms
constexpr double kSlotBytes = 10;        // per model dimension and expert slot: dispatch and combine
constexpr double kRouterBytes = 29;      // per model dimension: routing, gates, the experts' sum
constexpr double kSharedBytes = 6;       // per model dimension: adding the shared expert's output
constexpr double kEmbeddingBytes = 12;   // per model dimension: lookup and its gradient (first stage)
constexpr double kHeadBytes = 24;        // per model dimension: final norm (last stage)
constexpr double kLossBytes = 4;         // per vocabulary entry: cross-entropy reads bf16 logits, writes their grad
constexpr double kEmbeddingDropout = 8;  // per model dimension
// Kernels per layer and microbatch, forward + backward.
constexpr double kMhaKernels = 12, kGqaKernels = 12, kMlaKernels = 19, kMlaRopeKernels = 9, kLatentNormKernels = 6;
constexpr double kMlpKernels = 11, kGatedKernels = 8, kMoeKernels = 84, kSharedMlpKernels = 7, kSharedLinearKernels = 4;
constexpr double kGatedExpertKernels = 16, kDropoutKernels = 5, kBiasKernels = 3, kNormBiasKernels = 2;
constexpr double kMicrobatchKernels = 70;  // embedding, final norm, head, loss
constexpr double kMtpKernels = 76;  // per MTP module beyond its layer: shifted tokens, norms, eh_proj, head, masked loss
constexpr double kStepKernels = 21;        // gradient norm, clipping, AdamW
// The forward's share of a layer's other-kernel bytes and kernels (full
// recomputation runs it again); selective recomputation reruns the
// feed-forward: a dense MLP's 6 d bytes (+ 8 per gated hidden unit) and 7
// kernels, an MoE layer's routing at 0.4 of its bytes and 40 kernels.
constexpr double kForwardBytes = 0.37, kForwardKernels = 0.57;
constexpr double kMlpForwardBytes = 6, kGatedForwardBytes = 8, kMlpForwardKernels = 7;
constexpr double kMoeForwardShare = 0.4, kMoeForwardKernels = 40;
// AdamW's fused update and the gradient norm per parameter it owns (fp32
// p, g, m, v read, p, m, v and the bf16 cast written); bf16 moments: 8 less.
constexpr double kAdamBytes = 34, kAdamBf16MomentBytes = 26;
constexpr double kAccumulateBytes = 4.5;   // per parameter and microbatch after the first

// One token through one layer on one rank: what it multiplies, attends and
// moves. `split` bytes are already this tp rank's; `replicated` ones are
// every tp rank's unless sequence parallelism splits them.
struct LayerCost {
  double gemm = 0, ffn_gemm = 0;       // parameters multiplied (2 FLOPs each forward, 4 backward)
  double attn_fwd = 0, attn_bwd = 0;   // FLOPs
  double split = 0, replicated = 0;    // bytes, forward + backward
  double ffn_forward_bytes = 0;        // the feed-forward's forward (split, replicated mixed)
  double kernels = 0, ffn_kernels = 0; // per microbatch
};

void attention_cost(const ModelConfig& m, int64_t i, double tp, LayerCost& c) {
  const double d = static_cast<double>(m.model_dimension), H = static_cast<double>(m.n_head);
  const double hd = static_cast<double>(m.head_dim()), T = static_cast<double>(m.T);
  const double b = m.linear_bias ? 1 : 0;
  double r = 0, dv = hd;
  if (m.attention == AttentionKind::Mla) {
    const double Lt = static_cast<double>(m.latent_dim);
    r = static_cast<double>(mla_layer_dhR(m, i));
    const MlaRopeInputs in = mla_rope_inputs(m);
    c.gemm += 2 * d * Lt + 3 * Lt * H * hd / tp + H * hd * d / tp;  // w_dkv, w_dq; w_uq, w_uk, w_uv; wo
    if (r > 0) c.gemm += static_cast<double>(in.k) * r + static_cast<double>(in.q) * H * r / tp;
    if (r > 0) dv = hd + r;  // flash pads the value head to the query's (the meta device prices it)
    c.split += kRopeBytes * H * r / tp + b * kBiasBytes * (3 * H * hd + H * r) / tp;
    c.replicated += kRopeBytes * r + b * kBiasBytes * (2 * Lt + r + d);
    if (m.mla_latent_norm) c.replicated += kLatentNormBytes * Lt;
    c.kernels += (r > 0 ? kMlaKernels : kMlaKernels - kMlaRopeKernels) + (m.mla_latent_norm ? kLatentNormKernels : 0);
    c.kernels += b * kBiasKernels * (r > 0 ? 8 : 6);
  } else {
    const double kv = static_cast<double>(m.kv_heads());
    c.gemm += (2 * d * H * hd + 2 * d * kv * hd) / tp;  // wq, wo; wk, wv
    c.split += (kRopeBytes * (H + kv) * hd + kAttentionMisc * H * hd) / tp +
               b * kBiasBytes * (H + 2 * kv) * hd / tp;
    c.replicated += b * kBiasBytes * d;
    if (kv < H) c.split += kGqaBytes * H * hd / tp;
    c.kernels += kMhaKernels + (kv < H ? kGqaKernels : 0) + b * kBiasKernels * 4;
  }
  // Causal attention computes half the score tiles: forward QK^T and PV,
  // backward QK^T again and dV, dP, dQ, dK (op_observer.cpp).
  const double dqk = hd + r, Hl = H / tp;
  c.attn_fwd = Hl * T * (dqk + dv);
  c.attn_bwd = Hl * T * (3 * dqk + 2 * dv);
}

void ffn_cost(const ModelConfig& m, int64_t i, double tp, LayerCost& c) {
  const double d = static_cast<double>(m.model_dimension), b = m.linear_bias ? 1 : 0;
  const double mats = m.gated_mlp() ? 3 : 2;
  if (!is_moe_layer(m, i)) {
    const double dh = static_cast<double>(m.dense_hidden_dim());
    c.ffn_gemm = mats * d * dh / tp;
    c.split += (m.gated_mlp() ? kGatedBytes * dh : 0) / tp + b * kBiasBytes * dh / tp;
    c.replicated += b * kBiasBytes * d;
    c.ffn_forward_bytes = kMlpForwardBytes * d + (m.gated_mlp() ? kGatedForwardBytes * dh / tp : 0);
    c.ffn_kernels = kMlpForwardKernels;
    c.kernels += kMlpKernels + (m.gated_mlp() ? kGatedKernels : 0) + b * kBiasKernels * 2;
  } else {
    const double h = static_cast<double>(m.hidden_dim()), E = static_cast<double>(m.n_experts);
    const double slots = expert_slots(m), ns = static_cast<double>(m.n_shared);
    const bool shared_mlp = ns > 0 && m.shared_expert == SharedExpert::Mlp;
    const double mlp_rows = slots + (shared_mlp ? ns : 0);  // rows through an MLP of h hidden units
    c.ffn_gemm = d * E + mlp_rows * mats * d * h / tp + (ns > 0 && !shared_mlp ? ns * d * d : 0);
    c.split += (m.gated_mlp() ? kGatedBytes * h * mlp_rows : 0) / tp + b * kBiasBytes * h * mlp_rows / tp;
    const double routing = (kSlotBytes * slots + kRouterBytes + (ns > 0 ? kSharedBytes : 0)) * d;
    c.replicated += routing + b * kBiasBytes * (E + d * (slots + 1));
    c.ffn_forward_bytes = kMoeForwardShare * routing;
    c.ffn_kernels = kMoeForwardKernels;
    c.kernels += kMoeKernels + (shared_mlp ? kSharedMlpKernels : ns > 0 ? kSharedLinearKernels : 0) +
                 (m.gated_mlp() ? kGatedExpertKernels : 0) + b * kBiasKernels * (3 + (ns > 0 ? 1 : 0));
  }
  c.gemm += c.ffn_gemm;
}

LayerCost layer_cost(const ModelConfig& m, int64_t i, double tp) {
  LayerCost c;
  attention_cost(m, i, tp, c);
  ffn_cost(m, i, tp, c);
  const double d = static_cast<double>(m.model_dimension);
  c.replicated += 2 * kNormBytes * d;  // attention and MLP norms
  if (m.dropout_rate > 0) {
    c.replicated += kDropoutBytes * d;
    c.kernels += kDropoutKernels;
  }
  if (m.norm_bias) c.kernels += kNormBiasKernels;
  return c;
}

}  // namespace

Work& Work::operator+=(const Work& o) {
  gemm_flop += o.gemm_flop;
  attention_flop += o.attention_flop;
  bytes += o.bytes;
  kernels += o.kernels;
  return *this;
}

Work scaled(const Work& w, double factor) {
  return {w.gemm_flop * factor, w.attention_flop * factor, w.bytes * factor, w.kernels * factor};
}

double expert_slots(const ModelConfig& m) {
  const double k = static_cast<double>(m.k), E = static_cast<double>(m.n_experts), s = static_cast<double>(m.T);
  if (m.capacity_factor <= 0) return k;
  return E * std::ceil(m.capacity_factor * s * k / E) / s;
}

MicrobatchWork stage_microbatch_work(const Config& cfg, const std::vector<int64_t>& layers, bool first, bool last) {
  const ModelConfig& m = cfg.model;
  const double tp = static_cast<double>(cfg.device.tp()), d = static_cast<double>(m.model_dimension);
  const double rep_div = cfg.sequence_parallel ? tp : 1.0;
  const double e = m.model_dtype == ModelDtype::Bfloat16 ? 1.0 : 2.0;  // the fits are bf16 bytes
  const int64_t share = cfg.data.train_batch_size / cfg.device.dp();
  const int64_t mbs = cfg.data.micro_batch_size > 0 ? std::min(cfg.data.micro_batch_size, share) : share;
  const double tokens = static_cast<double>(mbs * m.T / cfg.device.cp());
  const auto ckpt = cfg.activation_checkpointing;
  MicrobatchWork w;
  // The multi-token prediction modules (model/mtp.h) run on the last stage:
  // each a layer of layer n_layers + j's kind, plus its replicated eh_proj
  // [d, 2d] and one more pass of the head (below).
  std::vector<int64_t> run = layers;
  for (int64_t j = 0; last && j < m.mtp_depth; ++j) run.push_back(m.n_layers() + j);
  for (int64_t i : run) {
    LayerCost c = layer_cost(m, i, tp);
    if (i >= m.n_layers()) c.gemm += 2 * d * d;
    const double bytes = tokens * e * (c.split + c.replicated / rep_div);
    const Work fwd{2 * tokens * c.gemm, tokens * c.attn_fwd, kForwardBytes * bytes, kForwardKernels * c.kernels};
    Work bwd{4 * tokens * c.gemm, tokens * c.attn_bwd, (1 - kForwardBytes) * bytes, (1 - kForwardKernels) * c.kernels};
    if (ckpt == ActivationCheckpointing::Full) bwd += fwd;
    if (ckpt == ActivationCheckpointing::Selective)
      bwd += Work{2 * tokens * c.ffn_gemm, 0, tokens * e * c.ffn_forward_bytes / rep_div, c.ffn_kernels};
    w.forward += fwd;
    w.backward += bwd;
  }
  // Outside the layers: the embedding (first stage); the final norm, the
  // vocab-parallel head and the loss (last stage); their kernels once a microbatch.
  double bytes = 0, head = 0;
  if (first) bytes += (kEmbeddingBytes + (m.dropout_rate > 0 ? kEmbeddingDropout : 0)) * d / rep_div;
  if (last) {
    const double vocab_local = std::ceil(static_cast<double>(m.vocab_size) / tp);
    const double heads = 1 + static_cast<double>(m.mtp_depth);  // the model's and each MTP depth's
    bytes += heads * (kHeadBytes * d / rep_div + kLossBytes * vocab_local);
    head = heads * d * vocab_local;
  }
  const double kernels =
      (first || last ? kMicrobatchKernels : 0) + (last ? kMtpKernels * static_cast<double>(m.mtp_depth) : 0);
  w.forward += Work{2 * tokens * head, 0, tokens * e * bytes * kForwardBytes, kernels * kForwardKernels};
  w.backward += Work{4 * tokens * head, 0, tokens * e * bytes * (1 - kForwardBytes), kernels * (1 - kForwardKernels)};
  return w;
}

Work optimizer_work(const Config& cfg, double owned, double local, int64_t microbatches) {
  const double adam = cfg.optimizer_state_dtype == ModelDtype::Bfloat16 ? kAdamBf16MomentBytes : kAdamBytes;
  const double accumulate = kAccumulateBytes * local * static_cast<double>(std::max<int64_t>(0, microbatches - 1));
  return Work{0, 0, adam * owned + accumulate, kStepKernels};
}

}  // namespace meshtrain
