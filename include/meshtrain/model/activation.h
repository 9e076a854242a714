#pragma once
// The MLP activations (model_config.mlp_activation), one formula each, used by
// the dense MLP, the routed experts and the shared experts alike. Adding one:
// its name (and whether it is gated) in config/choices.h, its formula here,
// and, to export it, its Hugging Face name in hf/hf_config.cpp.
#include <ATen/core/Tensor.h>

#include "meshtrain/config/choices.h"

namespace meshtrain {

// The hidden activation of `in` (w_in x); gated activations also take
// `gate` (w_gate x, defined exactly when is_gated(a)).
at::Tensor apply_activation(MlpActivation a, const at::Tensor& in, const at::Tensor& gate);

}  // namespace meshtrain
