// Single-device layers and the default (unsharded) LayerFactory.
#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/model/cross_entropy.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/model/matmul_dtype.h"

namespace meshtrain {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

class PlainEmbedding : public Embedding {
 public:
  explicit PlainEmbedding(at::Tensor w) : weight_(register_parameter("weight", std::move(w))) {}
  at::Tensor forward(const at::Tensor& tokens) override { return at::embedding(weight_, tokens); }
  at::Tensor weight() const override { return weight_; }

 private:
  at::Tensor weight_;
};

// Either owns its weight or reads the tied embedding's at every call, so the
// two stay one tensor (one gradient) without registering it twice.
class PlainHead : public LMHead {
 public:
  explicit PlainHead(at::Tensor w) : weight_(register_parameter("weight", std::move(w))) {}
  explicit PlainHead(std::shared_ptr<Embedding> tied) : tied_(std::move(tied)) {}

  at::Tensor logits(const at::Tensor& h) override { return mp_linear(h, weight()); }

  at::Tensor token_losses(const at::Tensor& h, const at::Tensor& targets) override {
    // Chunked: never the whole batch's fp32 logits (model/cross_entropy.h).
    return chunked_cross_entropy(h.reshape({-1, h.size(-1)}), weight(), targets).view(targets.sizes());
  }

 private:
  at::Tensor weight() const { return tied_ ? tied_->weight() : weight_; }

  at::Tensor weight_;
  std::shared_ptr<Embedding> tied_;
};

}  // namespace

uint64_t param_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ULL;  // FNV-1a offset basis
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001B3ULL;
  }
  return splitmix64(splitmix64(seed) ^ h);
}

at::Tensor init_normal(uint64_t seed, const std::string& name, at::IntArrayRef global_shape, double std) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(param_seed(seed, name));
  return at::normal(0.0, std, global_shape, gen, at::TensorOptions().dtype(at::kFloat));
}

PlainLinear::PlainLinear(at::Tensor w, at::Tensor b) : weight_(register_parameter("weight", std::move(w))) {
  if (b.defined()) bias_ = register_parameter("bias", std::move(b));
}

at::Tensor PlainLinear::forward(const at::Tensor& x) { return mp_linear(x, weight_, bias_); }

RMSNorm::RMSNorm(int64_t d, double eps, bool bias, at::Device device)
    : weight_(register_parameter("weight", torch::ones({d}, at::TensorOptions().device(device)))), eps_(eps) {
  if (bias) bias_ = register_parameter("bias", torch::zeros({d}, at::TensorOptions().device(device)));
}

at::Tensor RMSNorm::forward(const at::Tensor& x) {
  // One fused kernel forward and one backward on CUDA (fp32 statistics inside
  // even for bf16 inputs). It needs the weight in x's dtype; otherwise it is
  // libtorch's composite, the same fp32 chain as on CPU.
  const at::Tensor y = at::rms_norm(x, {x.size(-1)}, weight_.to(x.scalar_type()), eps_);
  return bias_.defined() ? y + bias_.to(x.scalar_type()) : y;
}

namespace {

at::Tensor swap_halves(const at::Tensor& x) {
  const auto h = x.chunk(2, -1);
  return at::cat({h[1], h[0]}, -1);
}

// y = x*cos + swap(x)*sin. swap is its own transpose, so the backward is the
// same shape of computation: dx = g*cos + swap(g*sin).
class RotateFn : public torch::autograd::Function<RotateFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return x * cos + swap_halves(x) * sin;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& g = grads[0];
    return {g * saved[0] + swap_halves(g * saved[1]), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor Rotary::apply(const at::Tensor& x, int64_t offset, int64_t seq_dim) {
  const int64_t dim = x.size(-1);
  if (seq_dim < 0) seq_dim += x.dim();
  const int64_t T = x.size(seq_dim);
  MT_CHECK(dim % 2 == 0, "rope needs an even number of dims, got ", dim, " (hint: head_dim and dhR must be even)");
  const std::string key = std::to_string(dim) + "/" + x.device().str() + "/" + c10::toString(x.scalar_type());
  Tables& t = cache_[key];
  if (!t.cos.defined() || t.cos.size(0) < offset + T) {
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(x.device());
    const auto inv_freq = at::pow(theta_, -at::arange(0, dim, 2, f32) / static_cast<double>(dim));  // [dim/2]
    const auto angle = at::outer(at::arange(0, offset + T, f32), inv_freq);                       // [n, dim/2]
    const auto c = angle.cos(), s = angle.sin();
    t.cos = at::cat({c, c}, -1).to(x.scalar_type());
    t.sin = at::cat({-s, s}, -1).to(x.scalar_type());
  }
  // [T, 1, .., 1, dim]: broadcast over the dims between positions and features.
  std::vector<int64_t> shape(static_cast<size_t>(x.dim() - seq_dim), 1);
  shape.front() = T;
  shape.back() = dim;
  const at::Tensor cos = t.cos.narrow(0, offset, T).view(shape), sin = t.sin.narrow(0, offset, T).view(shape);
  return RotateFn::apply(x, cos, sin);
}

at::Tensor apply_rope(const at::Tensor& x, int64_t offset, double theta) {
  Rotary r(theta);
  return r.apply(x, offset, -2);
}

at::Tensor LayerFactory::draw(const std::string& name, at::IntArrayRef global_shape, double std) {
  if (std == 0) return at::zeros(global_shape, at::TensorOptions().dtype(at::kFloat));
  return init_normal(seed(), name, global_shape, std);
}

at::Tensor MetaLayerFactory::draw(const std::string&, at::IntArrayRef global_shape, double) {
  return at::empty(global_shape, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
}

// The default factory shards nothing, but records the split each parameter
// would have under tp, so a checkpoint's layout reads the same on every mesh.
std::shared_ptr<Linear> LayerFactory::column(const std::string& name, int64_t in, int64_t out, double std,
                                             bool bias) {
  record_layout(name + ".weight", {{out, in}, 0, name + ".weight"});
  if (bias) record_layout(name + ".bias", {{out}, 0, name + ".bias"});
  return std::make_shared<PlainLinear>(draw(name + ".weight", {out, in}, std),
                                       bias ? draw(name + ".bias", {out}, 0.0) : at::Tensor());
}

std::shared_ptr<Linear> LayerFactory::row(const std::string& name, int64_t in, int64_t out, double std, bool bias) {
  record_layout(name + ".weight", {{out, in}, 1, name + ".weight"});
  if (bias) record_layout(name + ".bias", {{out}, -1, name + ".bias"});
  return std::make_shared<PlainLinear>(draw(name + ".weight", {out, in}, std),
                                       bias ? draw(name + ".bias", {out}, 0.0) : at::Tensor());
}

std::shared_ptr<Linear> LayerFactory::replicated(const std::string& name, int64_t in, int64_t out, double std,
                                                 bool bias) {
  record_layout(name + ".weight", {{out, in}, -1, name + ".weight"});
  if (bias) record_layout(name + ".bias", {{out}, -1, name + ".bias"});
  return std::make_shared<PlainLinear>(draw(name + ".weight", {out, in}, std),
                                       bias ? draw(name + ".bias", {out}, 0.0) : at::Tensor());
}

std::shared_ptr<Embedding> LayerFactory::embedding(const std::string& name, int64_t vocab, int64_t d, double std) {
  record_layout(name + ".weight", {{vocab, d}, 0, name + ".weight"});
  return std::make_shared<PlainEmbedding>(draw(name + ".weight", {vocab, d}, std));
}

std::shared_ptr<LMHead> LayerFactory::head(const std::string& name, int64_t d, int64_t vocab, double std,
                                           std::shared_ptr<Embedding> tied) {
  if (tied) return std::make_shared<PlainHead>(std::move(tied));
  record_layout(name + ".weight", {{vocab, d}, 0, name + ".weight"});
  return std::make_shared<PlainHead>(draw(name + ".weight", {vocab, d}, std));
}

at::Tensor LayerFactory::param(const std::string& name, std::vector<int64_t> global_shape, int64_t split_dim,
                               double std) {
  MT_ASSERT(split_dim >= -1 && split_dim < static_cast<int64_t>(global_shape.size()), "split_dim ", split_dim,
            " out of range for ", name);
  record_layout(name, {global_shape, split_dim, name});
  return draw(name, global_shape, std);
}

at::Tensor LayerFactory::expert_param(const std::string& name, std::vector<int64_t> global_shape, int64_t split_dim,
                                      double std) {
  MT_ASSERT(!global_shape.empty() && split_dim != 0, "expert parameter ", name, " needs dim 0 for the experts");
  at::Tensor t = param(name, global_shape, split_dim, std);
  layouts_[name].expert_split = true;
  const int64_t ep = dispatcher_->size();
  if (ep == 1) return t;
  MT_CHECK(global_shape[0] % ep == 0, "expert parameter ", name, ": ", global_shape[0],
           " experts do not split over expert_parallel = ", ep);
  const int64_t local = global_shape[0] / ep;
  return t.narrow(0, dispatcher_->rank() * local, local).contiguous();
}

TokenDispatcher::Dispatched TokenDispatcher::dispatch(const at::Tensor& rows, const std::vector<int64_t>& counts) {
  Dispatched d;
  d.rows = rows;
  d.counts = counts;
  return d;
}

at::Tensor TokenDispatcher::combine(const at::Tensor& rows, const Dispatched&) { return rows; }

}  // namespace meshtrain
