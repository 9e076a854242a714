#include "meshtrain/parallel/pipeline_generate.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"

namespace meshtrain {

ForwardFn pipeline_forward(ParallelModel& pm, Mesh& mesh) {
  return [&pm, &mesh](const at::Tensor& context, KVCache* cache) -> at::Tensor {
    Transformer& model = *pm.model;
    const int stage = mesh.coord().pp, pp = mesh.shape().pp;
    // Chunk by chunk (one unless interleaved): the last stage's chunk c feeds
    // the first stage's chunk c + 1, so the hidden state goes round the ring.
    const int64_t chunks = model.n_chunks();
    at::Tensor h;
    for (int64_t c = 0; c < chunks; ++c) {
      if (stage == 0 && c == 0) {
        h = model.embed(context);
      } else {
        // Every stage knows the context length (the tokens are shared), so the
        // shape of the incoming hidden state is known up front.
        // In the policy's activation dtype, as the sender's hidden state is
        // (a buffer of another size would mismatch the message).
        h = at::empty({context.size(0), context.size(1), model.config().model_dimension},
                      pm.params.front().tensor.options().dtype(model.precision().activation_dtype()));
        mesh.pp().recv(h, (stage + pp - 1) % pp);
      }
      h = model.forward_chunk(c, h, nullptr, cache);
      if (stage == pp - 1 && c == chunks - 1) break;
      MT_ASSERT(h.scalar_type() == model.precision().activation_dtype(), "pipeline stage ", stage, " produced ",
                h.scalar_type(), " activations but the policy sends ", model.precision().activation_dtype());
      mesh.pp().send(h.contiguous(), (stage + 1) % pp);
      h = at::Tensor();
    }
    if (!h.defined()) return at::Tensor();
    return model.logits(h.narrow(1, h.size(1) - 1, 1)).view({-1});
  };
}

ShareFn pipeline_share(ParallelModel& pm, Mesh& mesh) {
  return [&pm, &mesh](int32_t token) {
    // The pp communicator's rank is the stage: the last stage sampled.
    at::Tensor t = at::full({1}, static_cast<int64_t>(token), pm.params.front().tensor.options().dtype(at::kLong));
    mesh.pp().broadcast(t, mesh.shape().pp - 1);
    return static_cast<int32_t>(t.item<int64_t>());
  };
}

}  // namespace meshtrain
