#pragma once
// Context parallelism (device_config.context_parallel = C) and packed
// documents (data_config.document_masking): what a round's microbatches need
// beyond their tokens.
//
// Under cp, the C ranks of a cp group (mesh.h: consecutive dp ranks) read the
// same sequences; each cuts them into 2C chunks and keeps chunks r and
// 2C-1-r (equal causal work per rank). Everything outside attention is per
// token and runs on the local chunks; attention gathers the whole sequence's
// keys and values (MLA: its latent and rope key) from the group, forward an
// all-gather and backward a reduce-scatter, so gradients are exact. The cp
// ranks are dp ranks for gradients and optimizer state: each rank's loss is
// its tokens' share of the global mean, and the dp sum adds them up.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/parallel/microbatch.h"

namespace meshtrain {

// The whole sequence along dim from the cp group's local chunks [.., 2c, ..]
// (this rank's two chunks), in sequence order: [.., 2Cc, ..].
at::Tensor gather_context(const at::Tensor& x, int64_t dim, Communicator& cp);

// Whether this run's microbatches carry token layouts (cp > 1 or document masking).
bool uses_token_layouts(const Config& cfg, const Mesh& mesh);

// Gives each microbatch its layout, built from its whole sequences' tokens on
// the host (Microbatch::host_inputs, split with its rows), and keeps this cp
// rank's chunks of its inputs and targets.
void lay_out_tokens(std::vector<Microbatch>& mbs, const Config& cfg, Mesh& mesh);

}  // namespace meshtrain
