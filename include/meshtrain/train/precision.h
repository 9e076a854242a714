#pragma once
// Mixed precision: with model_dtype "bfloat16" on CUDA, forward passes run
// under autocast (matmuls and attention in bf16) while parameters, gradients
// and AdamW state stay fp32 (the master weights). On CPU everything is fp32.
// The meta device (the performance model) has no autocast: there the layers
// cast their matmul operands themselves (model/matmul_dtype.h).
#include <ATen/core/TensorBody.h>

#include <optional>

#include "meshtrain/config/config.h"
#include "meshtrain/model/matmul_dtype.h"

namespace meshtrain {

class AutocastGuard {
 public:
  AutocastGuard(const Config& cfg, const at::Device& device);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<MatmulDtypeGuard> meta_;
  bool active_ = false;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kFloat;
};

}  // namespace meshtrain
