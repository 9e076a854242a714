#pragma once
// The MLP activations (model_config.mlp_activation), one formula each, used by
// the dense MLP, the routed experts and the shared experts alike. Adding one:
// its name (and whether it is gated) in config/choices.h, its formula here,
// and, to export it, its Hugging Face name in hf/hf_config.cpp.
#include <ATen/core/Tensor.h>

#include "meshtrain/config/choices.h"

namespace meshtrain {

class Linear;
class MixedPrecision;

// The hidden activation of `in` (w_in x); gated activations also take
// `gate` (w_gate x, defined exactly when is_gated(a)).
at::Tensor apply_activation(MlpActivation a, const at::Tensor& in, const at::Tensor& gate);

// The MLP w_out(act(w_in x [, w_gate x])), plus residual where it is defined
// (w_out's forward_residual). GELU without a gate runs through
// model/gelu_matmul.h: the activation inside w_in's GEMM and, backward,
// inside w_out's (w_in must compute matmul(input(x), weight()^T) + bias(),
// as column and unsharded layers do).
at::Tensor mlp_forward(MlpActivation a, Linear& w_in, Linear* w_gate, Linear& w_out, const at::Tensor& x,
                       const at::Tensor& residual, MixedPrecision& precision);

}  // namespace meshtrain
