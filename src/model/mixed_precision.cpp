#include "meshtrain/model/mixed_precision.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <vector>

#include "meshtrain/core/check.h"

namespace meshtrain {

PrecisionPolicy PrecisionPolicy::from_model_dtype(ModelDtype model_dtype) {
  PrecisionPolicy p;
  p.compute = model_dtype == ModelDtype::Bfloat16 ? at::kBFloat16 : at::kFloat;
  return p;
}

std::string PrecisionPolicy::describe() const {
  if (!mixed()) return "fp32 compute, fp32 weights/grads/optimizer";
  return "bf16 compute (matmuls, attention, activations between layers and stages), fp32 master "
         "weights/grads/optimizer, fp32 norm/softmax/cross-entropy statistics and router";
}

at::Tensor MixedPrecision::operand(const at::Tensor& t) {
  if (!policy_.mixed() || !t.defined() || !t.is_floating_point() || t.scalar_type() == policy_.compute) return t;
  if (!(t.is_leaf() && t.requires_grad())) return t.to(policy_.compute);
  // A cast made without grad mode (inside a custom autograd function) has no
  // history: cached, it would cut the gradient of a later use outside one.
  const bool cache = at::GradMode::is_enabled();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(t.unsafeGetTensorImpl());
  if (it != cache_.end()) return it->second.second;
  if (depth_ == 0 || !cache) return t.to(policy_.compute);
  return cache_.emplace(t.unsafeGetTensorImpl(), std::make_pair(t, t.to(policy_.compute))).first->second.second;
}

at::Tensor MixedPrecision::operand_detached(const at::Tensor& t, int64_t rows) {
  MT_ASSERT(t.defined() && t.dim() >= 1 && t.is_floating_point(), "operand_detached wants a floating parameter");
  const int64_t want = std::max(rows, t.size(0));
  std::lock_guard<std::mutex> lock(mu_);
  // A cast FSDP gathered in the compute dtype is the source: the fp32
  // parameter holds no memory then.
  at::Tensor source = t;
  if (auto p = provided_.find(t.unsafeGetTensorImpl()); p != provided_.end()) {
    if (p->second.size(0) == want) return p->second;
    source = p->second;
  }
  const bool pad = want > source.size(0);
  if (!pad && (!policy_.mixed() || source.scalar_type() == policy_.compute)) return source.detach();
  const auto make = [&] {
    at::NoGradGuard no_grad;
    if (!pad) return source.to(policy_.compute);
    std::vector<int64_t> shape = source.sizes().vec();
    shape[0] = want;
    const auto dtype = policy_.mixed() ? policy_.compute : source.scalar_type();
    at::Tensor out = at::empty(shape, source.options().dtype(dtype));
    out.narrow(0, 0, source.size(0)).copy_(source);
    out.narrow(0, source.size(0), want - source.size(0)).zero_();
    return out;
  };
  if (depth_ == 0) return make();
  auto it = detached_.find(t.unsafeGetTensorImpl());
  if (it != detached_.end() && it->second.second.size(0) == want) return it->second.second;
  auto& entry = detached_[t.unsafeGetTensorImpl()];
  entry = {t, make()};
  return entry.second;
}

at::Tensor MixedPrecision::linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (!b.defined()) return at::linear(operand(x), operand(w));
  return at::linear(operand(x), operand(w), operand(b));
}

void MixedPrecision::forget(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(mu_);
  cache_.erase(param.unsafeGetTensorImpl());
  detached_.erase(param.unsafeGetTensorImpl());
  provided_.erase(param.unsafeGetTensorImpl());
}

void MixedPrecision::provide(const at::Tensor& param, at::Tensor cast) {
  std::lock_guard<std::mutex> lock(mu_);
  provided_[param.unsafeGetTensorImpl()] = cast.detach();  // operand_detached's source
  cache_[param.unsafeGetTensorImpl()] = std::make_pair(param, std::move(cast));
}

size_t MixedPrecision::cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_.size() + detached_.size();
}

void MixedPrecision::open() {
  std::lock_guard<std::mutex> lock(mu_);
  ++depth_;
}

void MixedPrecision::close() {
  std::lock_guard<std::mutex> lock(mu_);
  MT_ASSERT(depth_ > 0, "CastScope closed more often than opened");
  if (--depth_ == 0) {
    cache_.clear();
    detached_.clear();
    provided_.clear();
  }
}

}  // namespace meshtrain
