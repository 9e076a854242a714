#include "meshtrain/train/precision.h"

#include <ATen/autocast_mode.h>

namespace meshtrain {

AutocastGuard::AutocastGuard(const Config& cfg, const at::Device& device) {
  if (device.is_meta() && cfg.model.model_dtype == "bfloat16") meta_.emplace(at::kBFloat16);
  if (!device.is_cuda() || cfg.model.model_dtype != "bfloat16") return;
  active_ = true;
  was_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
  was_dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // Autocast caches the bf16 copies of the weights while enabled; they are
  // stale after the optimizer step, so the cache is dropped with the region.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(at::kCUDA, was_enabled_);
  at::autocast::set_autocast_dtype(at::kCUDA, was_dtype_);
}

}  // namespace meshtrain
