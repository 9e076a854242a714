#include "meshtrain/model/mixed_precision.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/model/fp8_linear.h"
#include "meshtrain/model/mixed_matmul.h"

namespace meshtrain {

namespace {

// A kept cast read as the parameter's cast: the forward is the cast itself
// (no kernel), the backward what Tensor::to's is -- the gradient converted
// to the parameter's dtype.
class KeptCast : public torch::autograd::Function<KeptCast> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& param, const at::Tensor& cast) {
    ctx->saved_data["dtype"] = param.scalar_type();
    return cast.view_as(cast);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {grads[0].to(ctx->saved_data["dtype"].toScalarType()), at::Tensor()};
  }
};

}  // namespace

PrecisionPolicy PrecisionPolicy::from_model_dtype(ModelDtype model_dtype, Fp8Recipe fp8) {
  PrecisionPolicy p;
  p.compute = model_dtype == ModelDtype::Bfloat16 ? at::kBFloat16 : at::kFloat;
  MT_ASSERT(fp8 == Fp8Recipe::None || p.mixed(), "an FP8 recipe on an fp32 policy (config validation refuses it)");
  p.fp8 = fp8;
  return p;
}

std::string PrecisionPolicy::describe() const {
  if (!mixed()) return "fp32 compute, fp32 weights/grads/optimizer";
  std::string fp8_line;
  switch (fp8) {
    case Fp8Recipe::None: break;
    case Fp8Recipe::Tensorwise:
      fp8_line = "; FP8 tensorwise linear GEMMs (e4m3 inputs and weights, e5m2 gradients, one scale per tensor)";
      break;
    case Fp8Recipe::Rowwise: fp8_line = "; FP8 rowwise linear GEMMs (e4m3, a scale per row of each operand)"; break;
    case Fp8Recipe::Blockwise:
      fp8_line = "; FP8 blockwise linear GEMMs (e4m3: 1x128 tiles of activations and gradients, 128x128 weight blocks)";
      break;
  }
  return "bf16 compute (matmuls, attention, activations between layers and stages), fp32 master "
         "weights/grads/optimizer, fp32 norm/softmax/cross-entropy statistics and router" +
         fp8_line;
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
  if (const at::Tensor k = kept(t, 0); k.defined()) {
    const at::Tensor c = k.size(0) == t.size(0) ? k : k.narrow(0, 0, t.size(0));
    if (!cache) return c;
    const at::Tensor out = KeptCast::apply(t, c);
    if (depth_ > 0) cache_.emplace(t.unsafeGetTensorImpl(), std::make_pair(t, out));
    return out;
  }
  ++casts_made_;
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
  if (source.is_same(t)) {
    if (const at::Tensor k = kept(t, want); k.defined()) return k.size(0) == want ? k : k.narrow(0, 0, want);
  }
  const auto make = [&] {
    ++casts_made_;
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
  if (!b.defined()) return fused_linear(x, w);
  return fused_linear(x, w, b);
}

at::Tensor MixedPrecision::fused_linear(const at::Tensor& x, at::TensorList weights, at::TensorList biases,
                                        const at::Tensor& residual) {
  MT_ASSERT(!weights.empty() && (biases.empty() || biases.size() == weights.size()) &&
                !(residual.defined() && !biases.empty()),
            "fused_linear: ", weights.size(), " weights, ", biases.size(), " biases",
            residual.defined() ? " and a residual" : "");
  if (const Fp8Split* split = fp8_split(weights[0])) {
    for (const at::Tensor& w : weights)
      MT_ASSERT(fp8_split(w) == split, "fused_linear: FP8 weights fused with others split otherwise");
    return fp8_linear(x, weights, biases, residual, *this, *split);
  }
  std::vector<at::Tensor> params(weights.begin(), weights.end());
  params.insert(params.end(), biases.begin(), biases.end());
  if (grads_in_fp32(params)) return mixed_linear(x, weights, biases, residual, *this);
  // Cast before concatenating: the casts of the weights are cached per round.
  const auto join = [&](at::TensorList ts) {
    std::vector<at::Tensor> casts;
    for (const at::Tensor& t : ts) casts.push_back(operand(t));
    return casts.size() == 1 ? casts[0] : at::cat(casts, 0);
  };
  const at::Tensor xc = operand(x), w = join(weights);
  if (residual.defined())
    return at::addmm(residual.view({-1, w.size(0)}), xc.reshape({-1, xc.size(-1)}), w.t()).view(residual.sizes());
  return biases.empty() ? at::linear(xc, w) : at::linear(xc, w, join(biases));
}

bool MixedPrecision::grads_in_fp32(at::TensorList params) {
  // FSDP's gathered casts qualify too: operand_detached reads them, and the
  // gradient goes to the fp32 parameter as through their own backward.
  if (!(policy_.mixed() || split_backward_) || !at::GradMode::is_enabled()) return false;
  for (const at::Tensor& p : params)
    if (!p.defined() || p.scalar_type() != at::kFloat || !p.is_leaf() || !p.requires_grad()) return false;
  return true;
}

void MixedPrecision::forget(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(mu_);
  cache_.erase(param.unsafeGetTensorImpl());
  detached_.erase(param.unsafeGetTensorImpl());
  provided_.erase(param.unsafeGetTensorImpl());
  for (auto& c : fp8_cache_) c.erase(param.unsafeGetTensorImpl());
}

void MixedPrecision::mark_fp8(const at::Tensor& param, std::shared_ptr<const Fp8Split> split) {
  std::lock_guard<std::mutex> lock(mu_);
  MT_ASSERT(fp8() && split, "mark_fp8: no FP8 recipe, or no split");
  fp8_marked_[param.unsafeGetTensorImpl()] = std::move(split);
}

void MixedPrecision::unmark_fp8(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(mu_);
  fp8_marked_.erase(param.unsafeGetTensorImpl());
}

const Fp8Split* MixedPrecision::fp8_split(const at::Tensor& param) const {
  if (!fp8() || !param.defined()) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = fp8_marked_.find(param.unsafeGetTensorImpl());
  return it == fp8_marked_.end() ? nullptr : it->second.get();
}

ops::Fp8Tensor MixedPrecision::fp8_weight(const at::Tensor& param, bool transposed) {
  const Fp8Split* split = fp8_split(param);
  MT_ASSERT(split != nullptr, "fp8_weight: ", param.sizes(), " is not a marked FP8 weight");
  const c10::TensorImpl* key = param.unsafeGetTensorImpl();
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = fp8_cache_[transposed].find(key);
    if (it != fp8_cache_[transposed].end()) return it->second.second;
  }
  // Quantized outside the lock: the tp reductions are collectives.
  const Fp8Operand op = Fp8Plan::of(policy_.fp8).w;
  const bool symmetric = op.granularity == ops::Fp8Granularity::kTensor ||
                         op.granularity == ops::Fp8Granularity::kBlock;
  ops::Fp8Tensor q;
  if (!transposed) {
    q = fp8_quantize(operand_detached(param), op, split->out, split->in);
  } else if (symmetric) {
    q = fp8_weight(param, false).transposed();
    q.data = q.data.contiguous();  // row-major, as _scaled_mm takes it
    q.scale = q.scale.contiguous();
  } else {
    q = fp8_quantize(operand_detached(param).transpose(-2, -1), op, split->in, split->out);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (depth_ > 0) fp8_cache_[transposed][key] = {param, q};
  return q;
}

void MixedPrecision::provide(const at::Tensor& param, at::Tensor cast) {
  std::lock_guard<std::mutex> lock(mu_);
  provided_[param.unsafeGetTensorImpl()] = cast.detach();  // operand_detached's source
  cache_[param.unsafeGetTensorImpl()] = std::make_pair(param, std::move(cast));
}

at::Tensor MixedPrecision::kept(const at::Tensor& t, int64_t rows) {
  if (!policy_.mixed() || t.scalar_type() == policy_.compute || !keep_.count(t.unsafeGetTensorImpl())) return {};
  const int64_t want = std::max(rows, t.size(0));
  Kept& k = kept_[t.unsafeGetTensorImpl()];
  at::NoGradGuard no_grad;
  if (!k.cast.defined() || k.cast.size(0) < want) {
    // Made once (or once more, wider, for a padded reader): padding rows stay zero.
    std::vector<int64_t> shape = t.sizes().vec();
    shape[0] = want;
    k.param = t;
    k.cast = at::zeros(shape, t.options().dtype(policy_.compute).requires_grad(false));
    k.version = -1;
  }
  const void* data = t.storage().data();
  if (k.version != t._version() || k.data != data) {
    ++casts_made_;
    k.cast.narrow(0, 0, t.size(0)).copy_(t);
    k.version = t._version();
    k.data = data;
  }
  return k.cast;
}

void MixedPrecision::keep_casts(const std::vector<at::Tensor>& params) {
  std::lock_guard<std::mutex> lock(mu_);
  MT_ASSERT(policy_.mixed(), "keep_casts: an fp32 policy casts nothing");
  for (const at::Tensor& p : params) keep_.insert(p.unsafeGetTensorImpl());
}

at::Tensor MixedPrecision::cast_to_write(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = kept_.find(param.unsafeGetTensorImpl());
  if (it == kept_.end() || !it->second.cast.defined()) return {};
  const at::Tensor& c = it->second.cast;
  return c.size(0) == param.size(0) ? c : c.narrow(0, 0, param.size(0));
}

void MixedPrecision::casts_written(const std::vector<at::Tensor>& params) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const at::Tensor& p : params) {
    auto it = kept_.find(p.unsafeGetTensorImpl());
    MT_ASSERT(it != kept_.end(), "casts_written: a parameter without a kept cast");
    it->second.version = p._version();
    it->second.data = p.storage().data();
  }
}

int64_t MixedPrecision::casts_made() const {
  std::lock_guard<std::mutex> lock(mu_);
  return casts_made_;
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
    for (auto& c : fp8_cache_) c.clear();
  }
}

}  // namespace meshtrain
