// Single-device layers and the default (unsharded) LayerFactory.
#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/model/layers.h"

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

  at::Tensor logits(const at::Tensor& h) override { return at::linear(h, weight()); }

  at::Tensor token_losses(const at::Tensor& h, const at::Tensor& targets) override {
    const auto z = logits(h).to(at::kFloat);
    const auto losses = at::cross_entropy_loss(z.reshape({-1, z.size(-1)}), targets.reshape({-1}).to(at::kLong),
                                               {}, at::Reduction::None);
    return losses.view(targets.sizes());
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

at::Tensor PlainLinear::forward(const at::Tensor& x) { return at::linear(x, weight_, bias_); }

RMSNorm::RMSNorm(int64_t d, double eps, bool bias)
    : weight_(register_parameter("weight", torch::ones({d}))), eps_(eps) {
  if (bias) bias_ = register_parameter("bias", torch::zeros({d}));
}

at::Tensor RMSNorm::forward(const at::Tensor& x) {
  // fp32 statistics: a bf16 mean of squares loses too many bits at large d.
  const auto xf = x.to(at::kFloat);
  auto y = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_) * weight_.to(at::kFloat);
  if (bias_.defined()) y = y + bias_.to(at::kFloat);
  return y.to(x.scalar_type());
}

at::Tensor apply_rope(const at::Tensor& x, int64_t offset, double theta) {
  const int64_t dim = x.size(-1);
  const int64_t T = x.size(-2);
  MT_CHECK(dim % 2 == 0, "rope needs an even number of dims, got ", dim, " (hint: head_dim and dhR must be even)");
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(x.device());
  const auto inv_freq = at::pow(theta, -at::arange(0, dim, 2, f32) / static_cast<double>(dim));  // [dim/2]
  const auto pos = at::arange(offset, offset + T, f32);
  const auto angle = at::outer(pos, inv_freq);  // [T, dim/2]
  const auto cos = at::cat({angle.cos(), angle.cos()}, -1);
  const auto sin = at::cat({angle.sin(), angle.sin()}, -1);
  const auto xf = x.to(at::kFloat);
  const auto halves = xf.chunk(2, -1);
  const auto rotated = at::cat({-halves[1], halves[0]}, -1);
  return (xf * cos + rotated * sin).to(x.scalar_type());
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

}  // namespace meshtrain
