#include "meshtrain/parallel/tensor_parallel.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/mappings.h"
#include "vocab_parallel.h"

namespace meshtrain {

namespace {

// Output features (rows of W, and of the bias) split over tp; the input
// enters the tp region.
class ColumnParallelLinear : public Linear {
 public:
  ColumnParallelLinear(at::Tensor w, at::Tensor b, LayerFactory* factory)
      : weight_(register_parameter("weight", std::move(w))), factory_(factory) {
    if (b.defined()) bias_ = register_parameter("bias", std::move(b));
  }
  at::Tensor forward(const at::Tensor& x) override {
    return factory_->precision()->linear(input(x), weight_, bias_);
  }
  at::Tensor input(const at::Tensor& x) override { return factory_->enter_tp(x); }
  const at::Tensor& weight() const override { return weight_; }
  at::Tensor bias() const override { return bias_; }

 private:
  at::Tensor weight_, bias_;
  LayerFactory* factory_;
};

// Input features (columns of W) split over tp; the partial outputs are summed
// (or reduce-scattered along the sequence) on the way out. The bias is
// replicated and added once, after the sum (under sequence parallelism to the
// sequence shard, so its gradient is summed over tp like a norm's).
class RowParallelLinear : public Linear {
 public:
  RowParallelLinear(at::Tensor w, at::Tensor b, LayerFactory* factory)
      : weight_(register_parameter("weight", std::move(w))), factory_(factory) {
    if (b.defined()) bias_ = register_parameter("bias", std::move(b));
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor y = factory_->exit_tp(factory_->precision()->linear(x, weight_));
    return bias_.defined() ? y + bias_.to(y.scalar_type()) : y;
  }
  at::Tensor forward_gelu(const GeluPre& a, const at::Tensor& residual) override {
    at::Tensor y = factory_->exit_tp(gelu_linear(a, weight_, {}, {}, *factory_->precision()));
    if (bias_.defined()) y = y + bias_.to(y.scalar_type());
    return residual.defined() ? residual + y : y;
  }
  // Not fusable: the output leaves the tp region.
  const at::Tensor& weight() const override { return weight_; }

 private:
  at::Tensor weight_, bias_;
  LayerFactory* factory_;
};

// A k/v projection replicated over tp (more tp ranks than kv heads) of which
// this rank keeps the one head its query heads read. Entering the tp region
// sums the gradient of the whole projection over the ranks (each reads one
// head of it), so the replicated weight gets the full gradient everywhere;
// under sequence parallelism the entry gathers the sequence.
class ReplicatedKvHead : public Linear {
 public:
  ReplicatedKvHead(at::Tensor w, at::Tensor b, int64_t head_dim, int64_t head, LayerFactory* factory)
      : weight_(register_parameter("weight", std::move(w))), head_dim_(head_dim), head_(head), factory_(factory) {
    if (b.defined()) bias_ = register_parameter("bias", std::move(b));
  }
  at::Tensor forward(const at::Tensor& x) override {
    const at::Tensor all = factory_->enter_tp(factory_->precision()->linear(x, weight_, bias_));  // [B, T, KV*hd]
    return all.view({all.size(0), all.size(1), -1, head_dim_}).narrow(2, head_, 1).flatten(2);
  }
  // Not fusable: the output is narrowed after the region entry.
  const at::Tensor& weight() const override { return weight_; }
  at::Tensor bias() const override { return bias_; }

 private:
  at::Tensor weight_, bias_;
  int64_t head_dim_, head_;
  LayerFactory* factory_;
};

at::Tensor tp_chunk(const at::Tensor& full, int64_t dim, int64_t tp, int64_t rank, const std::string& name) {
  MT_CHECK(full.size(dim) % tp == 0, "parameter ", name, ": dim ", dim, " of shape ", full.sizes(),
           " does not split over tp = ", tp, " (check model_config against device_config.n_device_axis)");
  const int64_t n = full.size(dim) / tp;
  return full.narrow(dim, rank * n, n).clone();
}

class TensorParallelFactory : public LayerFactory {
 public:
  TensorParallelFactory(Communicator& tp, bool sequence_parallel) : tp_(tp), sp_(sequence_parallel) {}

  int64_t tp_size() const { return tp_.size(); }
  int64_t tp_rank() const { return tp_.rank(); }
  bool sequence_parallel() const override { return sp_; }
  std::shared_ptr<DropoutRng> dropout_rng() const override {
    return std::make_shared<TensorParallelDropoutRng>(tp_.rank(), sp_);
  }

  std::shared_ptr<Linear> column(const std::string& name, int64_t in, int64_t out, double std,
                                 bool bias) override {
    const std::string w = name + ".weight", b = name + ".bias";
    record_layout(w, {{out, in}, 0, w});
    set_compute_cast(w, true);
    if (bias) record_layout(b, {{out}, 0, b});
    at::Tensor weight = tp_chunk(draw(w, {out, in}, std), 0, tp_size(), tp_rank(), w);
    mark_fp8(weight, Fp8Shard::Out, false);
    return std::make_shared<ColumnParallelLinear>(
        weight, bias ? tp_chunk(draw(b, {out}, 0.0), 0, tp_size(), tp_rank(), b) : at::Tensor(), this);
  }

  std::shared_ptr<Linear> row(const std::string& name, int64_t in, int64_t out, double std, bool bias) override {
    const std::string w = name + ".weight", b = name + ".bias";
    record_layout(w, {{out, in}, 1, w});
    set_compute_cast(w, true);
    if (bias) record_row_bias(b, out);
    at::Tensor weight = tp_chunk(draw(w, {out, in}, std), 1, tp_size(), tp_rank(), w);
    mark_fp8(weight, Fp8Shard::In, false);
    return std::make_shared<RowParallelLinear>(weight, bias ? draw(b, {out}, 0.0) : at::Tensor(), this);
  }

  // Replicated layers see whatever their caller passes (the MoE router gets
  // the gathered sequence, `input` says which); their gradient is the same on
  // every tp rank once the sequence-shard ones are summed (parallelize.cpp).
  std::shared_ptr<Linear> replicated(const std::string& name, int64_t in, int64_t out, double std, bool bias,
                                     SequenceInput input) override {
    const std::string w = name + ".weight", b = name + ".bias";
    record_replicated(name, in, out, bias, input);
    at::Tensor weight = draw(w, {out, in}, std);
    mark_fp8(weight, Fp8Shard::None, input == SequenceInput::Shard);
    return std::make_shared<PlainLinear>(weight, bias ? draw(b, {out}, 0.0) : at::Tensor(), precision());
  }

  std::shared_ptr<Linear> kv_heads(const std::string& name, int64_t in, int64_t n_heads, int64_t head_dim,
                                   double std, bool bias) override {
    MT_CHECK(n_heads % tp_size() == 0 || tp_size() % n_heads == 0, "model_config.n_kv_head (", n_heads,
             ") and tp = ", tp_size(), ": one must divide the other");
    if (n_heads % tp_size() == 0) return column(name, in, n_heads * head_dim, std, bias);
    const int64_t out = n_heads * head_dim, ranks_per_head = tp_size() / n_heads;
    record_replicated(name, in, out, bias, SequenceInput::Shard);
    at::Tensor weight = draw(name + ".weight", {out, in}, std);
    mark_fp8(weight, Fp8Shard::None, true);  // reads the sequence shard
    return std::make_shared<ReplicatedKvHead>(weight,
                                              bias ? draw(name + ".bias", {out}, 0.0) : at::Tensor(), head_dim,
                                              tp_rank() / ranks_per_head, this);
  }

  // The layout's global shape is the padded vocabulary, so checkpoint shards
  // are equal chunks; it equals vocab_size whenever tp divides it.
  std::shared_ptr<Embedding> embedding(const std::string& name, int64_t vocab, int64_t d, double std) override {
    const std::string w = name + ".weight";
    const VocabRange r = vocab_range(vocab, tp_size(), tp_rank());
    ParamLayout l{{r.padded, d}, 0, w};
    l.vocab_rows = true;
    record_layout(w, l);
    return make_vocab_parallel_embedding(vocab_shard(seed(), w, d, std, r), r, this);
  }

  // The model records the tied copy's tied_copy flag itself (transformer.cpp),
  // on top of the layout recorded here.
  std::shared_ptr<LMHead> head(const std::string& name, int64_t d, int64_t vocab, double std,
                               std::shared_ptr<Embedding> tied) override {
    const VocabRange r = vocab_range(vocab, tp_size(), tp_rank());
    if (tied) return make_vocab_parallel_head(at::Tensor(), std::move(tied), r, this, &tp_);
    const std::string w = name + ".weight";
    ParamLayout l{{r.padded, d}, 0, w};
    l.vocab_rows = true;
    record_layout(w, l);
    return make_vocab_parallel_head(vocab_shard(seed(), w, d, std, r), nullptr, r, this, &tp_);
  }

  at::Tensor param(const std::string& name, std::vector<int64_t> global_shape, int64_t split_dim,
                   double std) override {
    MT_ASSERT(split_dim >= -1 && split_dim < static_cast<int64_t>(global_shape.size()), "split_dim ", split_dim,
              " out of range for ", name);
    record_layout(name, {global_shape, split_dim, name});
    at::Tensor full = draw(name, global_shape, std);
    return split_dim < 0 ? full : tp_chunk(full, split_dim, tp_size(), tp_rank(), name);
  }

  // Column layers reading the same tensor (wq/wk/wv, MLA's w_uk/w_uv, the MoE
  // experts and shared experts) share one entry, so its gradient is reduced
  // once, as with Megatron's fused QKV, and under sequence parallelism it is
  // gathered once. The input is held (not just its address) so a freed
  // tensor's address can never match a new one.
  at::Tensor enter_tp(const at::Tensor& x) override {
    const bool grad = at::GradMode::is_enabled();
    if (entry_in_.defined() && entry_in_.is_same(x) && entry_version_ == x._version() && entry_grad_ == grad)
      return entry_out_;
    entry_out_ = sp_ ? gather_from_sequence(x, tp_) : copy_to_tp(x, tp_);
    entry_in_ = x;
    entry_version_ = x._version();
    entry_grad_ = grad;
    return entry_out_;
  }

  at::Tensor exit_tp(const at::Tensor& x) override {
    return sp_ ? reduce_scatter_to_sequence(x, tp_) : reduce_from_tp(x, tp_);
  }
  at::Tensor gather_sequence(const at::Tensor& x) override {
    return sp_ ? gather_sequence_replicated(x, tp_) : x;
  }
  at::Tensor scatter_sequence(const at::Tensor& x) override {
    return sp_ ? meshtrain::scatter_sequence(x, tp_) : x;
  }
  AmaxReduce tp_amax_max() override {
    Communicator* tp = &tp_;
    return [tp](at::Tensor& amax) { tp->all_reduce(amax, ReduceOp::Max); };
  }

 private:
  Communicator& tp_;
  bool sp_;
  at::Tensor entry_in_, entry_out_;
  int64_t entry_version_ = 0;
  bool entry_grad_ = false;
};

}  // namespace

std::unique_ptr<LayerFactory> make_layer_factory(const Config& cfg, Mesh& mesh) {
  if (mesh.shape().tp == 1) return std::make_unique<LayerFactory>();
  return std::make_unique<TensorParallelFactory>(mesh.tp(), cfg.sequence_parallel);
}

}  // namespace meshtrain
