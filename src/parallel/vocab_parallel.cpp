#include "vocab_parallel.h"

#include <torch/torch.h>


#include "meshtrain/core/check.h"
#include "meshtrain/model/cross_entropy.h"
#include "meshtrain/model/mixed_matmul.h"
#include "meshtrain/model/mixed_precision.h"
#include "meshtrain/ops/fused.h"
#include "meshtrain/parallel/mappings.h"

namespace meshtrain {

namespace {

// The head GEMM and the cross-entropy over vocabulary shards, fused like
// the single-device head (model/cross_entropy.h): this rank's logits [N,
// local] are made in the matmul dtype, one kernel reads them for the row
// statistics, two all-reduces of N floats combine them over tp, and one
// kernel overwrites them with their gradient; the backward is the two GEMMs.
class VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h, const at::Tensor& w,
                            const at::Tensor& targets, int64_t comm, int64_t start, int64_t real,
                            int64_t precision) {
    auto& tp = *reinterpret_cast<Communicator*>(comm);
    auto& mp = *reinterpret_cast<MixedPrecision*>(precision);
    const bool grad = h.requires_grad() || w.requires_grad();
    // The local rows padded as the single-device head pads the vocabulary
    // (model/cross_entropy.h): the kernels read the first `real` columns and
    // zero the gradient of the rest.
    const at::Tensor hc = mp.operand(h), wc = mp.operand_detached(w, padded_vocab(w.size(0)));
    at::Tensor z = at::mm(hc, wc.t());  // [N, padded local]
    // Targets in other shards become -1: no picked logit, no one-hot here.
    const at::Tensor local_target =
        at::where((targets >= start) & (targets < start + real), targets - start, at::full({}, -1, targets.options()));
    const at::Tensor st = ops::softmax_stats(z, local_target, real);  // max, sum of exp(z - max), picked

    // log-sum-exp over the whole vocabulary: the global max first, then each
    // shard's sum rescaled to it (a shard with no real column has max -inf
    // and sum 0, and adds 0). The max has no gradient: it cancels.
    at::Tensor max = st[0].clone();
    tp.all_reduce(max, ReduceOp::Max);
    at::Tensor sums = at::stack({st[1] * (st[0] - max).exp(), st[2]});  // one collective for both sums
    tp.all_reduce(sums);
    const at::Tensor lse = max + sums[0].log();
    if (grad) {
      ops::softmax_grad_(z, local_target, lse, real);
      ctx->save_for_backward({hc, wc, z});
      ctx->saved_data["h_dtype"] = h.scalar_type();
      ctx->saved_data["w_dtype"] = w.scalar_type();
      ctx->saved_data["local"] = w.size(0);
    }
    return lse - sums[1];
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &h = saved[0], &w = saved[1], &d = saved[2];
    const at::Tensor g = grads[0].unsqueeze(1).to(d.scalar_type());
    // This rank's part of dh (its vocabulary columns); entering the tp
    // region sums the parts.
    const at::Tensor dh = (at::mm(d, w) * g).to(ctx->saved_data["h_dtype"].toScalarType());
    const at::Tensor dw = weight_grad(d, h * g, ctx->saved_data["w_dtype"].toScalarType())
                              .narrow(0, 0, ctx->saved_data["local"].toInt());
    return {dh, dw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class VocabParallelEmbedding : public Embedding {
 public:
  VocabParallelEmbedding(at::Tensor w, VocabRange r, LayerFactory* factory)
      : weight_(register_parameter("weight", std::move(w))), r_(r), factory_(factory) {}

  at::Tensor forward(const at::Tensor& tokens) override {
    // Tokens outside this rank's rows look up row 0 and are zeroed, so the
    // exit's sum over tp leaves exactly the owner's row.
    const at::Tensor outside = (tokens < r_.start) | (tokens >= r_.start + r_.local);
    const at::Tensor local = (tokens - r_.start).masked_fill(outside, 0);
    // In the matmul dtype, as the single-device embedding (model/layers.cpp),
    // from the padded cast a tied head shares.
    const at::Tensor out =
        embedding_rows(weight_, local, *factory_->precision(), padded_vocab(r_.local)).masked_fill(outside.unsqueeze(-1), 0.0);
    return factory_->exit_tp(out);
  }
  at::Tensor weight() const override { return weight_; }

 private:
  at::Tensor weight_;
  VocabRange r_;
  LayerFactory* factory_;
};

class VocabParallelHead : public LMHead {
 public:
  VocabParallelHead(at::Tensor w, std::shared_ptr<Embedding> tied, VocabRange r, LayerFactory* factory,
                    Communicator* tp)
      : tied_(std::move(tied)), r_(r), factory_(factory), tp_(tp) {
    if (w.defined()) weight_ = register_parameter("weight", std::move(w));
  }

  at::Tensor token_losses(const at::Tensor& h, const at::Tensor& targets) override {
    const at::Tensor x = factory_->enter_tp(h);
    const at::Tensor t = targets.reshape({-1}).to(at::kLong);
    MT_CHECK(x.numel() / x.size(-1) == t.numel(), "head: ", t.numel(), " targets for hidden states of shape ",
             h.sizes(), " (after the tp entry: ", x.sizes(), ")");
    return vocab_parallel_cross_entropy(x.reshape({t.numel(), x.size(-1)}), tied_ ? tied_->weight() : weight_, t,
                                        *tp_, r_, *factory_->precision())
        .view(targets.sizes());
  }

  at::Tensor logits(const at::Tensor& h) override {
    return gather_from_tp(local_logits(h), *tp_, -1).narrow(-1, 0, r_.vocab);
  }

 private:
  at::Tensor local_logits(const at::Tensor& h) {
    return factory_->precision()->linear(factory_->enter_tp(h), tied_ ? tied_->weight() : weight_);
  }

  at::Tensor weight_;
  std::shared_ptr<Embedding> tied_;
  VocabRange r_;
  LayerFactory* factory_;
  Communicator* tp_;
};

}  // namespace

VocabRange vocab_range(int64_t vocab, int64_t tp_size, int64_t tp_rank) {
  MT_CHECK(vocab > 0, "model_config.vocab_size must be > 0, got ", vocab);
  VocabRange r;
  r.vocab = vocab;
  r.padded = (vocab + tp_size - 1) / tp_size * tp_size;
  r.local = r.padded / tp_size;
  r.start = tp_rank * r.local;
  r.real = std::clamp<int64_t>(vocab - r.start, 0, r.local);
  return r;
}

at::Tensor vocab_shard(uint64_t seed, const std::string& name, int64_t d, double std, const VocabRange& r) {
  const at::Tensor full = init_normal(seed, name, {r.vocab, d}, std);
  at::Tensor shard = at::zeros({r.local, d}, full.options());
  if (r.real > 0) shard.narrow(0, 0, r.real).copy_(full.narrow(0, r.start, r.real));
  return shard;
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& h, const at::Tensor& weight_local, const at::Tensor& targets,
                                        Communicator& tp, const VocabRange& r, MixedPrecision& precision) {
  MT_ASSERT(h.dim() == 2 && weight_local.dim() == 2 && weight_local.size(0) == r.local &&
                h.size(1) == weight_local.size(1),
            "vocab-parallel CE wants h [N, d] and this rank's [", r.local, ", d] weight, got ", h.sizes(), " and ",
            weight_local.sizes());
  return VocabParallelCrossEntropy::apply(h, weight_local, targets.to(at::kLong), reinterpret_cast<int64_t>(&tp),
                                          r.start, r.real, reinterpret_cast<int64_t>(&precision));
}

std::shared_ptr<Embedding> make_vocab_parallel_embedding(at::Tensor weight_local, VocabRange r, LayerFactory* factory) {
  return std::make_shared<VocabParallelEmbedding>(std::move(weight_local), r, factory);
}

std::shared_ptr<LMHead> make_vocab_parallel_head(at::Tensor weight_local, std::shared_ptr<Embedding> tied,
                                                 VocabRange r, LayerFactory* factory, Communicator* tp) {
  return std::make_shared<VocabParallelHead>(std::move(weight_local), std::move(tied), r, factory, tp);
}

}  // namespace meshtrain
