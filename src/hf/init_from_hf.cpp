#include "meshtrain/hf/init_from_hf.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/core/log.h"
#include "meshtrain/hf/hf_dir.h"
#include "meshtrain/parallel/fsdp.h"

namespace meshtrain {

void load_hf_weights(ParallelModel& pm, Mesh& mesh, const std::string& dir) {
  at::NoGradGuard no_grad;
  const auto tensors = load_hf_model(dir, pm.model->config());
  const int64_t tp = mesh.shape().tp, tp_rank = mesh.coord().tp;
  gather_params(pm);  // zero_stage 3 keeps dp shards: written whole, then sharded again
  for (auto& p : pm.params) {
    const auto& l = p.layout;
    const auto it = tensors.find(l.global_name);
    MT_CHECK(it != tensors.end(), "Hugging Face model ", dir, " gives no tensor for meshtrain's '", l.global_name, "'");
    at::Tensor full = it->second;
    // Embedding and head rows are padded to a multiple of tp (zeros): only
    // from exactly vocab_size rows (load_hf_model checked the HF shapes), so
    // a shorter HF embedding is never padded into shape.
    if (full.dim() == 2 && l.global_shape.size() == 2 && full.size(1) == l.global_shape[1] &&
        full.size(0) == pm.model->config().vocab_size && full.size(0) < l.global_shape[0] &&
        l.vocab_rows)
      full = at::cat({full, at::zeros({l.global_shape[0] - full.size(0), full.size(1)}, full.options())}, 0);
    MT_CHECK(full.sizes().vec() == l.global_shape, "Hugging Face model ", dir, ": '", l.global_name, "' has shape ",
             full.sizes(), " but the model needs ", at::IntArrayRef(l.global_shape));
    at::Tensor local = l.split_dim < 0 ? full : full.chunk(tp, l.split_dim)[tp_rank];
    // Routed experts under expert parallelism: dim 0 also split over the ep group.
    if (l.expert_split && mesh.shape().ep > 1) local = local.chunk(mesh.shape().ep, 0)[mesh.ep_rank()];
    p.tensor.copy_(local.to(p.tensor.device(), p.tensor.scalar_type()));
  }
  release_params(pm, /*written=*/true);
  spdlog::info("initialised the model from the Hugging Face weights in {}", dir);
}

}  // namespace meshtrain
