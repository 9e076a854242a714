#include "vocab_parallel.h"

#include <torch/torch.h>

#include <limits>

#include "meshtrain/core/check.h"
#include "meshtrain/model/matmul_dtype.h"
#include "meshtrain/parallel/mappings.h"

namespace meshtrain {

namespace {

class VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            int64_t comm, int64_t start, int64_t real) {
    auto& tp = *reinterpret_cast<Communicator*>(comm);
    at::Tensor z = logits.clone(at::MemoryFormat::Contiguous);
    const int64_t local = z.size(1);
    if (real < local) z.narrow(1, real, local - real).fill_(-std::numeric_limits<float>::infinity());

    // Subtracting the global max keeps exp() finite; the max has no gradient
    // (it cancels in log-sum-exp), so it needs no backward collective.
    at::Tensor max = std::get<0>(z.max(1));
    tp.all_reduce(max, ReduceOp::Max);
    z.sub_(max.unsqueeze(1));

    const at::Tensor in_range = (targets >= start) & (targets < start + real);
    const at::Tensor local_target = (targets - start).masked_fill(~in_range, 0);
    at::Tensor picked = z.gather(1, local_target.unsqueeze(1)).squeeze(1).masked_fill(~in_range, 0.0);

    at::Tensor exp = z.exp_();
    at::Tensor sum_exp = exp.sum(1);
    // One collective for the two sums: they are independent.
    at::Tensor sums = at::stack({sum_exp, picked});
    tp.all_reduce(sums);
    sum_exp = sums[0];
    picked = sums[1];

    exp.div_(sum_exp.unsqueeze(1));  // softmax over the local columns
    ctx->save_for_backward({exp, local_target, in_range});
    return sum_exp.log() - picked;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor g = saved[0].clone();
    const at::Tensor& local_target = saved[1];
    const at::Tensor& in_range = saved[2];
    g.scatter_add_(1, local_target.unsqueeze(1), -in_range.to(g.scalar_type()).unsqueeze(1));
    g.mul_(grads[0].unsqueeze(1));
    return {g, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
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
    const at::Tensor out = at::embedding(weight_, local).masked_fill(outside.unsqueeze(-1), 0.0);
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
    const at::Tensor z = local_logits(h).to(at::kFloat);
    const at::Tensor t = targets.reshape({-1}).to(at::kLong);
    MT_CHECK(z.size(0) * z.size(1) == t.numel(), "head: ", t.numel(), " targets for hidden states of shape ",
             h.sizes(), " (after the tp entry: ", z.sizes(), ")");
    return vocab_parallel_cross_entropy(z.reshape({t.numel(), r_.local}), t, *tp_, r_).view(targets.sizes());
  }

  at::Tensor logits(const at::Tensor& h) override {
    return gather_from_tp(local_logits(h), *tp_, -1).narrow(-1, 0, r_.vocab);
  }

 private:
  at::Tensor local_logits(const at::Tensor& h) {
    return mp_linear(factory_->enter_tp(h), tied_ ? tied_->weight() : weight_);
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

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits_local, const at::Tensor& targets, Communicator& tp,
                                        const VocabRange& r) {
  MT_ASSERT(logits_local.dim() == 2 && logits_local.size(1) == r.local, "vocab-parallel CE wants [N, ", r.local,
            "] logits, got ", logits_local.sizes());
  return VocabParallelCrossEntropy::apply(logits_local, targets.to(at::kLong), reinterpret_cast<int64_t>(&tp),
                                          r.start, r.real);
}

std::shared_ptr<Embedding> make_vocab_parallel_embedding(at::Tensor weight_local, VocabRange r, LayerFactory* factory) {
  return std::make_shared<VocabParallelEmbedding>(std::move(weight_local), r, factory);
}

std::shared_ptr<LMHead> make_vocab_parallel_head(at::Tensor weight_local, std::shared_ptr<Embedding> tied,
                                                 VocabRange r, LayerFactory* factory, Communicator* tp) {
  return std::make_shared<VocabParallelHead>(std::move(weight_local), std::move(tied), r, factory, tp);
}

}  // namespace meshtrain
