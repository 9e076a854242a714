// Multi-token prediction modules and their targets (see mtp.h).
#include "meshtrain/model/mtp.h"

#include <torch/torch.h>

#include <string>

#include "block.h"
#include "meshtrain/core/check.h"

namespace meshtrain {

MtpTargets mtp_targets(const at::Tensor& inputs, const at::Tensor& targets, int64_t depth, int64_t eot) {
  MT_ASSERT(inputs.dim() == 2 && inputs.sizes() == targets.sizes(), "multi-token prediction: inputs ",
            inputs.sizes(), " and targets ", targets.sizes(), " must both be [B, T]");
  const int64_t B = inputs.size(0), T = inputs.size(1);
  // t_0..t_T, then D zeros so every depth's window has T entries.
  const at::Tensor ids = at::cat({inputs.to(at::kLong), targets.narrow(1, T - 1, 1).to(at::kLong),
                                  at::zeros({B, depth}, inputs.options().dtype(at::kLong))},
                                 1);
  // The document of each token: the eot tokens before it (an eot belongs to
  // the document it ends).
  at::Tensor doc;
  if (eot >= 0) {
    const at::Tensor ends = ids.eq(eot).to(at::kLong);
    doc = ends.cumsum(1) - ends;
  }
  const at::Tensor position = at::arange(T, inputs.options().dtype(at::kLong)).unsqueeze(0);
  MtpTargets out;
  for (int64_t k = 1; k <= depth; ++k) {
    out.tokens.push_back(ids.narrow(1, k, T));
    out.targets.push_back(ids.narrow(1, k + 1, T));
    // The target t_{i+k+1} exists for i < T - k.
    at::Tensor valid = position.lt(T - k).expand({B, T});
    if (doc.defined()) valid = valid & doc.narrow(1, 0, T).eq(doc.narrow(1, k + 1, T));
    out.mask.push_back(valid.to(at::kFloat));
  }
  return out;
}

MtpModule::MtpModule(const ModelConfig& cfg, LayerFactory& factory, int64_t j) {
  const std::string prefix = "mtp." + std::to_string(j);
  const int64_t d = cfg.model_dimension;
  enorm_ = register_module("enorm", factory.norm(prefix + ".enorm", d, cfg.norm_bias));
  hnorm_ = register_module("hnorm", factory.norm(prefix + ".hnorm", d, cfg.norm_bias));
  eh_proj_ = register_module(
      "eh_proj", factory.replicated(prefix + ".eh_proj", 2 * d, d, cfg.init_std, cfg.linear_bias, SequenceInput::Shard));
  // The layer after the last one: its kind (MoE or dense, MLA's rope) by the
  // config's layer rule.
  block_ = register_module("block", std::make_shared<Block>(cfg, factory, cfg.n_layers() + j, prefix + ".block"));
  head_norm_ = register_module("head_norm", factory.norm(prefix + ".head_norm", d, cfg.norm_bias));
}

at::Tensor MtpModule::block_input(const at::Tensor& h_prev, const at::Tensor& emb) {
  const at::Tensor e = enorm_->forward(emb), h = hnorm_->forward(h_prev);
  return eh_proj_->forward(at::cat({e, h.to(e.scalar_type())}, -1));
}

at::Tensor MtpModule::forward(const at::Tensor& h_prev, const at::Tensor& emb, ForwardAux* aux,
                              const TokenLayout* layout) {
  return block_->forward(block_input(h_prev, emb), aux, nullptr, 0, layout);
}

at::Tensor MtpModule::forward(const at::Tensor& h_prev, const at::Tensor& emb, LayerCache& cache, int64_t offset) {
  return block_->forward(block_input(h_prev, emb), nullptr, &cache, offset);
}

}  // namespace meshtrain
