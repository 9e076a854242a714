// Context parallelism and token layouts of a round (see context_parallel.h).
#include "meshtrain/parallel/context_parallel.h"

#include <torch/torch.h>

#include <memory>

#include "meshtrain/core/check.h"
#include "meshtrain/model/token_layout.h"
#include "meshtrain/parallel/mappings.h"

namespace meshtrain {

at::Tensor gather_context(const at::Tensor& x, int64_t dim, Communicator& cp) {
  const int64_t C = cp.size();
  if (C == 1) return x;
  if (dim < 0) dim += x.dim();
  const int64_t local = x.size(dim);
  MT_ASSERT(local % 2 == 0, "context parallelism: a rank holds two equal chunks, got ", local, " tokens");
  // Rank order: rank r's chunks r and 2C-1-r at 2r and 2r+1.
  const at::Tensor all = gather_from_group(x.unflatten(dim, {2, local / 2}), cp, dim);
  std::vector<int64_t> order(static_cast<size_t>(2 * C));
  for (int64_t g = 0; g < 2 * C; ++g) order[static_cast<size_t>(g)] = g < C ? 2 * g : 2 * (2 * C - 1 - g) + 1;
  const at::Tensor index = at::tensor(order, at::TensorOptions().dtype(at::kLong)).to(x.device());
  return all.index_select(dim, index).flatten(dim, dim + 1);
}

bool uses_token_layouts(const Config& cfg, const Mesh& mesh) {
  return mesh.shape().cp > 1 || cfg.data.document_masking;
}

void lay_out_tokens(std::vector<Microbatch>& mbs, const Config& cfg, Mesh& mesh) {
  const int64_t cp = mesh.shape().cp, rank = mesh.cp_rank();
  // The meta device's synthetic batches come without the data's eot: one document per row.
  const int64_t eot = cfg.data.document_masking ? cfg.data.eot_token : -1;
  Communicator* group = &mesh.cp();
  for (Microbatch& m : mbs) {
    MT_ASSERT(m.host_inputs.defined(), "token layouts need the microbatch's inputs on the host");
    const at::Device device = m.inputs.device();
    auto layout = std::make_shared<TokenLayout>(
        make_token_layout(m.host_inputs, eot, rank, cp, device, /*varlen=*/device.is_cuda()));
    if (cp > 1) layout->gather = [group](const at::Tensor& x, int64_t dim) { return gather_context(x, dim, *group); };
    m.layout = std::move(layout);
    m.inputs = context_chunks(m.inputs, 1, rank, cp);
    m.targets = context_chunks(m.targets, 1, rank, cp);
    for (auto* v : {&m.mtp.tokens, &m.mtp.targets, &m.mtp.mask})
      for (at::Tensor& t : *v) t = context_chunks(t, 1, rank, cp);
  }
}

}  // namespace meshtrain
