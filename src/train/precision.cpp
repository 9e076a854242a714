#include "meshtrain/train/precision.h"

namespace meshtrain {

// The meta device models the CUDA step, so both get the same casts.
AutocastGuard::AutocastGuard(const Config& cfg, const at::Device& device) {
  if ((device.is_cuda() || device.is_meta()) && cfg.model.model_dtype == "bfloat16") guard_.emplace(at::kBFloat16);
}

}  // namespace meshtrain
