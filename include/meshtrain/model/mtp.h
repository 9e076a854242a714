#pragma once
// DeepSeek-V3's multi-token prediction (arXiv 2412.19437, section 2.2;
// model_config.mtp_depth = D, mtp_loss_weight = lambda). Module k = 1..D
// predicts token t_{i+k+1} at position i, chained on module k - 1's hidden
// state (h^0: the main model's last layer, before the final norm):
//   h'^k_i = eh_proj [enorm(Emb(t_{i+k})); hnorm(h^{k-1}_i)]
//   h^k    = block_k(h'^k)              (a layer of the model's kind: layer n_layers + k - 1's rule)
//   P^k_i  = softmax(head(head_norm_k(h^k_i)))   (the shared embedding and head)
// The concatenation order [embedding; hidden] and the per-module norm before
// the shared head follow DeepSeek-V3's published checkpoint (layer n_layers:
// enorm, hnorm, eh_proj, shared_head.norm). Every depth runs over all T
// positions: attention is causal, so the last k positions (which have no
// target) never reach the others, and their losses are masked; the paper's
// L^k = (1/T) sum_i CE is then the masked sum over the batch's tokens.
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/model/token_layout.h"

namespace meshtrain {

struct ForwardAux;
struct LayerCache;
class Block;

// What depth k = 1..D reads at each position i, per depth [B, T] (index k - 1):
// the token k ahead, the target k + 1 ahead, and 1.0 where that target exists
// and lies in position i's document (data_config.document_masking: a
// document ends with eot), else 0 (the loss there is multiplied away; the
// missing tokens are 0).
struct MtpTargets {
  std::vector<at::Tensor> tokens, targets, mask;
  bool empty() const { return tokens.empty(); }
};

// From a microbatch's whole sequences: inputs [B, T] (t_0..t_{T-1}) and
// targets [B, T] (t_1..t_T); eot < 0: one document per row.
MtpTargets mtp_targets(const at::Tensor& inputs, const at::Tensor& targets, int64_t depth, int64_t eot);

// Module k (index j = k - 1): parameters mtp.<j>.{enorm,hnorm,head_norm}.weight,
// mtp.<j>.eh_proj.weight [d, 2d] and the block's mtp.<j>.block.* (named as a
// layer's, model/transformer.h).
class MtpModule : public torch::nn::Module {
 public:
  MtpModule(const ModelConfig& cfg, LayerFactory& factory, int64_t j);
  // h_prev [B, T, d] (h^{k-1}), emb [B, T, d] (Emb(t_{i+k})) -> h^k.
  at::Tensor forward(const at::Tensor& h_prev, const at::Tensor& emb, ForwardAux* aux, const TokenLayout* layout);
  // Decoding (self-speculative drafts, sampling/speculative.h): the same over
  // positions offset.. of the window, whose keys the block appends to
  // `cache` (holding positions 0..offset - 1); no graph, no aux losses.
  at::Tensor forward(const at::Tensor& h_prev, const at::Tensor& emb, LayerCache& cache, int64_t offset);
  // The norm before the shared head.
  at::Tensor head_norm(const at::Tensor& h) { return head_norm_->forward(h); }
  Block& block() { return *block_; }

 private:
  // eh_proj [enorm(emb); hnorm(h_prev)]: the block's input.
  at::Tensor block_input(const at::Tensor& h_prev, const at::Tensor& emb);

  std::shared_ptr<RMSNorm> enorm_, hnorm_, head_norm_;
  std::shared_ptr<Linear> eh_proj_;
  std::shared_ptr<Block> block_;
};

}  // namespace meshtrain
