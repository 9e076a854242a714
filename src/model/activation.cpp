// The MLP activations (see activation.h).
#include "meshtrain/model/activation.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/model/gelu_matmul.h"
#include "meshtrain/model/layers.h"

namespace meshtrain {

at::Tensor apply_activation(MlpActivation a, const at::Tensor& in, const at::Tensor& gate) {
  MT_ASSERT(gate.defined() == is_gated(a), "activation ", choice_name(a), ": gate ",
            gate.defined() ? "given" : "missing");
  switch (a) {
    case MlpActivation::Gelu:
      return at::gelu(in, "tanh");  // GPT-2's tanh approximation
    case MlpActivation::Swiglu:
      return at::silu(gate) * in;
  }
  MT_FAIL("unknown mlp_activation ", static_cast<int>(a));
}

at::Tensor mlp_forward(MlpActivation a, Linear& w_in, Linear* w_gate, Linear& w_out, const at::Tensor& x,
                       const at::Tensor& residual, MixedPrecision& precision) {
  // Under FP8 the GELU runs apart: its GEMMs are FP8 ones (model/fp8_linear.h).
  if (a == MlpActivation::Gelu && w_gate == nullptr && !precision.fp8())
    return w_out.forward_gelu(linear_gelu(w_in.input(x), w_in.weight(), w_in.bias(), precision), residual);
  const at::Tensor hid = apply_activation(a, w_in.forward(x), w_gate ? w_gate->forward(x) : at::Tensor());
  return residual.defined() ? w_out.forward_residual(hid, residual) : w_out.forward(hid);
}

}  // namespace meshtrain
