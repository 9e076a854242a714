#include "meshtrain/parallel/pipeline_generate.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/pipeline_plan.h"

namespace meshtrain {

namespace {

// Where the data's last layers live: the interleaved layout's last stage, or
// the V's first (parallel/pipeline_plan.h).
ChunkPlace last_place(const Transformer& model, int pp) {
  const int64_t chunks = model.n_chunks();
  return place_of_virtual_stage(pp * chunks - 1, pp, chunks, model.range().v_shape);
}

}  // namespace

ForwardFn pipeline_forward(ParallelModel& pm, Mesh& mesh) {
  return [&pm, &mesh](const at::Tensor& context, KVCache* cache) -> at::Tensor {
    Transformer& model = *pm.model;
    const int stage = mesh.coord().pp, pp = mesh.shape().pp;
    const int64_t chunks = model.n_chunks();
    const bool v_shape = model.range().v_shape;
    // The virtual stages in data order, this rank running its own: the
    // hidden state goes round the ring (interleaved) or down and back up
    // (the V, whose turn stays on the last stage).
    at::Tensor h;
    for (int64_t vs = 0; vs < pp * chunks; ++vs) {
      const ChunkPlace here = place_of_virtual_stage(vs, pp, chunks, v_shape);
      if (here.stage != stage) continue;
      if (vs == 0) {
        h = model.embed(context);
      } else if (place_of_virtual_stage(vs - 1, pp, chunks, v_shape).stage != stage) {
        // Every stage knows the context length (the tokens are shared), so the
        // shape of the incoming hidden state is known up front.
        // In the policy's activation dtype, as the sender's hidden state is
        // (a buffer of another size would mismatch the message).
        h = at::empty({context.size(0), context.size(1), model.config().model_dimension},
                      pm.params.front().tensor.options().dtype(model.precision().activation_dtype()));
        mesh.pp().recv(h, place_of_virtual_stage(vs - 1, pp, chunks, v_shape).stage);
      }
      h = model.forward_chunk(here.chunk, h, nullptr, cache);
      if (vs == pp * chunks - 1) break;
      MT_ASSERT(h.scalar_type() == model.precision().activation_dtype(), "pipeline stage ", stage, " produced ",
                h.scalar_type(), " activations but the policy sends ", model.precision().activation_dtype());
      const int to = place_of_virtual_stage(vs + 1, pp, chunks, v_shape).stage;
      if (to == stage) continue;  // the V's turn: this rank runs the next chunk too
      mesh.pp().send(h.contiguous(), to);
      h = at::Tensor();
    }
    if (!h.defined()) return at::Tensor();
    return model.logits(h.narrow(1, h.size(1) - 1, 1)).view({-1});
  };
}

ShareFn pipeline_share(ParallelModel& pm, Mesh& mesh) {
  return [&pm, &mesh](int32_t token) {
    // The pp communicator's rank is the stage: the one holding the head sampled.
    at::Tensor t = at::full({1}, static_cast<int64_t>(token), pm.params.front().tensor.options().dtype(at::kLong));
    mesh.pp().broadcast(t, last_place(*pm.model, mesh.shape().pp).stage);
    return static_cast<int32_t>(t.item<int64_t>());
  };
}

}  // namespace meshtrain
