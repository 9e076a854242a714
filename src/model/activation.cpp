// The MLP activations (see activation.h).
#include "meshtrain/model/activation.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"

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

}  // namespace meshtrain
