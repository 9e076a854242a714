#pragma once
// Mixed precision: with model_dtype "bfloat16" on CUDA (and on the meta device
// that models it), the layers run matmuls, attention and the residual stream
// in bf16 while parameters, gradients and AdamW state stay fp32 (the master
// weights): model/matmul_dtype.h. On CPU everything is fp32.
#include <ATen/core/TensorBody.h>

#include <optional>

#include "meshtrain/config/config.h"
#include "meshtrain/model/matmul_dtype.h"

namespace meshtrain {

class AutocastGuard {
 public:
  AutocastGuard(const Config& cfg, const at::Device& device);
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<MatmulDtypeGuard> guard_;
};

}  // namespace meshtrain
