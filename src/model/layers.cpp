// Single-device layers and the default (unsharded) LayerFactory.
#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/core/splitmix.h"
#include "meshtrain/model/cross_entropy.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/model/mixed_matmul.h"

namespace meshtrain {

namespace {

class PlainEmbedding : public Embedding {
 public:
  PlainEmbedding(at::Tensor w, std::shared_ptr<MixedPrecision> p)
      : weight_(register_parameter("weight", std::move(w))), precision_(std::move(p)) {}
  // In the compute dtype: the residual stream is bf16 under mixed precision
  // (the padded cast is the one the tied head makes anyway).
  at::Tensor forward(const at::Tensor& tokens) override {
    return embedding_rows(weight_, tokens, *precision_, padded_vocab(weight_.size(0)), tied_grad_.get());
  }
  at::Tensor weight() const override { return weight_; }
  // A head on this stage reads this table: its weight gradient comes here
  // (mixed precision only: the fp32 lookup is aten's).
  TiedGrad* tie() {
    if (precision_->policy().mixed() && !tied_grad_) tied_grad_ = std::make_shared<TiedGrad>();
    return tied_grad_.get();
  }

 private:
  at::Tensor weight_;
  std::shared_ptr<MixedPrecision> precision_;
  std::shared_ptr<TiedGrad> tied_grad_;
};

// Either owns its weight or reads the tied embedding's at every call, so the
// two stay one tensor (one gradient) without registering it twice.
class PlainHead : public LMHead {
 public:
  PlainHead(at::Tensor w, std::shared_ptr<MixedPrecision> p)
      : weight_(register_parameter("weight", std::move(w))), precision_(std::move(p)) {}
  PlainHead(std::shared_ptr<Embedding> tied, std::shared_ptr<MixedPrecision> p)
      : tied_(std::move(tied)), precision_(std::move(p)) {
    if (auto* e = dynamic_cast<PlainEmbedding*>(tied_.get())) tied_grad_ = e->tie();
  }

  at::Tensor logits(const at::Tensor& h) override { return precision_->linear(h, weight()); }

  at::Tensor token_losses(const at::Tensor& h, const at::Tensor& targets) override {
    // Chunked: never the whole batch's fp32 logits (model/cross_entropy.h).
    return chunked_cross_entropy(h.reshape({-1, h.size(-1)}), weight(), targets, 0, precision_.get(), tied_grad_)
        .view(targets.sizes());
  }

 private:
  at::Tensor weight() const { return tied_ ? tied_->weight() : weight_; }

  at::Tensor weight_;
  std::shared_ptr<Embedding> tied_;
  std::shared_ptr<MixedPrecision> precision_;
  TiedGrad* tied_grad_ = nullptr;  // the tied embedding's (it outlives the head: tied_ holds it)
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

PlainLinear::PlainLinear(at::Tensor w, at::Tensor b, std::shared_ptr<MixedPrecision> precision)
    : weight_(register_parameter("weight", std::move(w))),
      precision_(precision ? std::move(precision) : std::make_shared<MixedPrecision>()) {
  if (b.defined()) bias_ = register_parameter("bias", std::move(b));
}

at::Tensor PlainLinear::forward(const at::Tensor& x) { return precision_->linear(x, weight_, bias_); }

namespace {

// Whether addmm can take the residual of x's GEMM with w: in the GEMM's
// dtype and shape, no bias.
bool foldable(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& residual,
              const MixedPrecision& precision) {
  const at::ScalarType gemm_dtype = x.is_floating_point() ? precision.policy().compute : x.scalar_type();
  return !bias.defined() && residual.scalar_type() == gemm_dtype && residual.is_contiguous() && residual.dim() >= 1 &&
         residual.size(-1) == w.size(0);
}

}  // namespace

at::Tensor Linear::forward_gelu(const GeluPre& a, const at::Tensor& residual) {
  const at::Tensor h = a.pre.defined() ? at::gelu(a.pre, "tanh") : a.h;
  return residual.defined() ? forward_residual(h, residual) : forward(h);
}

at::Tensor PlainLinear::forward_gelu(const GeluPre& a, const at::Tensor& residual) {
  if (residual.defined() && !foldable(a.h, weight_, bias_, residual, *precision_))
    return residual + gelu_linear(a, weight_, bias_, {}, *precision_);
  return gelu_linear(a, weight_, bias_, residual, *precision_);
}

at::Tensor PlainLinear::forward_residual(const at::Tensor& x, const at::Tensor& residual) {
  // addmm wants the residual in the GEMM's dtype and shape; otherwise add.
  if (!foldable(x, weight_, bias_, residual, *precision_)) return residual + forward(x);
  MT_CHECK(residual.numel() / weight_.size(0) * x.size(-1) == x.numel(), "linear: residual ", residual.sizes(),
           " does not match input ", x.sizes());
  return precision_->fused_linear(x, weight_, {}, residual);
}

RMSNorm::RMSNorm(int64_t d, double eps, bool bias, at::Device device)
    : weight_(register_parameter("weight", torch::ones({d}, at::TensorOptions().device(device)))), eps_(eps) {
  if (bias) bias_ = register_parameter("bias", torch::zeros({d}, at::TensorOptions().device(device)));
}

at::Tensor RMSNorm::forward(const at::Tensor& x) { return ops::rms_norm(x, weight_, bias_, eps_); }

std::pair<at::Tensor, at::Tensor> RMSNorm::forward_keep(const at::Tensor& x) {
  return ops::residual_rms_norm(x, weight_, bias_, eps_);
}

std::pair<at::Tensor, at::Tensor> RMSNorm::forward_add(const at::Tensor& a, const at::Tensor& b) {
  return ops::add_rms_norm(a, b, weight_, bias_, eps_);
}

const ops::RopeTables& Rotary::tables(int64_t dim, int64_t n, const at::Device& device) {
  ops::RopeTables& t = cache_[std::to_string(dim) + "/" + device.str()];
  if (!t.cos.defined() || t.cos.size(0) < n) t = ops::rope_tables(dim, n, theta_, device);
  return t;
}

at::Tensor Rotary::apply(const at::Tensor& x, int64_t offset, int64_t seq_dim) {
  if (seq_dim < 0) seq_dim += x.dim();
  return ops::rope(x, tables(x.size(-1), offset + x.size(seq_dim), x.device()), offset, seq_dim);
}

ops::RopeTables Rotary::tables_at(int64_t dim, const at::Tensor& positions, int64_t n, const at::Device& device) {
  const ops::RopeTables& t = tables(dim, n, device);
  const at::Tensor rows = positions.reshape({-1});
  return {t.cos.index_select(0, rows), t.sin.index_select(0, rows)};
}

at::Tensor Rotary::apply_at(const at::Tensor& x, const at::Tensor& positions, int64_t n) {
  MT_ASSERT(x.dim() >= 3 && positions.dim() == 2 && x.size(0) == positions.size(0) && x.size(1) == positions.size(1),
            "rope at positions: x ", x.sizes(), " and positions ", positions.sizes(), " must agree on [B, T]");
  std::vector<int64_t> rows = x.sizes().vec();
  rows[1] *= rows[0];
  rows[0] = 1;
  return ops::rope(x.reshape(rows), tables_at(x.size(-1), positions, n, x.device()), 0, 1).view(x.sizes());
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
  set_compute_cast(name + ".weight", true);
  if (bias) record_layout(name + ".bias", {{out}, 0, name + ".bias"});
  at::Tensor w = draw(name + ".weight", {out, in}, std);
  mark_fp8(w, Fp8Shard::None, false);  // unsharded: nothing to reduce
  return std::make_shared<PlainLinear>(w, bias ? draw(name + ".bias", {out}, 0.0) : at::Tensor(), precision());
}

std::shared_ptr<Linear> LayerFactory::row(const std::string& name, int64_t in, int64_t out, double std, bool bias) {
  record_layout(name + ".weight", {{out, in}, 1, name + ".weight"});
  set_compute_cast(name + ".weight", true);
  if (bias) record_row_bias(name + ".bias", out);
  at::Tensor w = draw(name + ".weight", {out, in}, std);
  mark_fp8(w, Fp8Shard::None, false);
  return std::make_shared<PlainLinear>(w, bias ? draw(name + ".bias", {out}, 0.0) : at::Tensor(), precision());
}

std::shared_ptr<Linear> LayerFactory::replicated(const std::string& name, int64_t in, int64_t out, double std,
                                                 bool bias, SequenceInput input) {
  record_replicated(name, in, out, bias, input);
  at::Tensor w = draw(name + ".weight", {out, in}, std);
  mark_fp8(w, Fp8Shard::None, input == SequenceInput::Shard);
  return std::make_shared<PlainLinear>(w, bias ? draw(name + ".bias", {out}, 0.0) : at::Tensor(), precision());
}

void LayerFactory::mark_fp8(const at::Tensor& w, Fp8Shard shard, bool reads_sequence_shard) {
  if (!precision_->fp8()) return;
  const bool tokens = reads_sequence_shard && sequence_parallel();
  std::shared_ptr<const Fp8Split>& kind = fp8_splits_[{shard, tokens}];
  if (!kind) {
    const AmaxReduce tp = tp_amax_max();
    auto split = std::make_shared<Fp8Split>();
    if (shard == Fp8Shard::Out) split->out = tp;
    if (shard == Fp8Shard::In) split->in = tp;
    if (tokens) split->tokens = tp;
    kind = std::move(split);
  }
  precision_->mark_fp8(w, kind);
}

std::shared_ptr<Linear> LayerFactory::kv_heads(const std::string& name, int64_t in, int64_t n_heads,
                                               int64_t head_dim, double std, bool bias) {
  return column(name, in, n_heads * head_dim, std, bias);
}

void LayerFactory::record_row_bias(const std::string& path, int64_t out) {
  ParamLayout l{{out}, -1, path};
  l.reads_sequence_shard = true;  // added after the reduce(-scatter), to this rank's shard
  record_layout(path, std::move(l));
}

void LayerFactory::record_replicated(const std::string& name, int64_t in, int64_t out, bool bias,
                                     SequenceInput input) {
  ParamLayout w{{out, in}, -1, name + ".weight"};
  w.reads_sequence_shard = input == SequenceInput::Shard;
  w.compute_cast = true;  // a replicated Linear casts it (the MoE router, which does not, clears it)
  record_layout(name + ".weight", w);
  if (bias) {
    ParamLayout b{{out}, -1, name + ".bias"};
    b.compute_cast = false;
    b.reads_sequence_shard = w.reads_sequence_shard;
    record_layout(name + ".bias", std::move(b));
  }
}

std::shared_ptr<RMSNorm> LayerFactory::norm(const std::string& name, int64_t d, bool bias) {
  ParamLayout l{{d}, -1, name + ".weight"};
  l.reads_sequence_shard = true;  // replicated, applied to the residual stream's shard
  record_layout(l.global_name, l);
  if (bias) {
    l.global_name = name + ".bias";
    record_layout(l.global_name, l);
  }
  return std::make_shared<RMSNorm>(d, 1e-6, bias, param_device());
}

std::shared_ptr<Embedding> LayerFactory::embedding(const std::string& name, int64_t vocab, int64_t d, double std) {
  ParamLayout l{{vocab, d}, 0, name + ".weight"};
  l.vocab_rows = true;
  record_layout(name + ".weight", l);
  return std::make_shared<PlainEmbedding>(draw(name + ".weight", {vocab, d}, std), precision());
}

std::shared_ptr<LMHead> LayerFactory::head(const std::string& name, int64_t d, int64_t vocab, double std,
                                           std::shared_ptr<Embedding> tied) {
  if (tied) return std::make_shared<PlainHead>(std::move(tied), precision());
  ParamLayout l{{vocab, d}, 0, name + ".weight"};
  l.vocab_rows = true;
  record_layout(name + ".weight", l);
  return std::make_shared<PlainHead>(draw(name + ".weight", {vocab, d}, std), precision());
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

at::Tensor TokenDispatcher::run_experts(const at::Tensor& rows, const at::Tensor& expert, int64_t n_experts,
                                        const ExpertsFn& experts) {
  // A scatter, not bincount, which sizes its output from the data: no host sync.
  const at::Tensor counts = at::zeros({n_experts}, expert.options()).scatter_add_(0, expert, at::ones_like(expert));
  return experts(rows, counts, expert, at::zeros_like(expert));  // every row from this rank
}

}  // namespace meshtrain
