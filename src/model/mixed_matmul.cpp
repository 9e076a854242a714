// Products with fp32 master parameters in the compute dtype (see mixed_matmul.h).
#include "meshtrain/model/mixed_matmul.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/model/fp8_linear.h"
#include "meshtrain/model/mixed_precision.h"

namespace meshtrain {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool mixed_grad(const at::Tensor& a, at::ScalarType param_dtype) {
  return a.scalar_type() != param_dtype && param_dtype == at::kFloat &&
         (a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kHalf);
}

class BatchedLinear : public torch::autograd::Function<BatchedLinear> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, int64_t precision) {
    auto& mp = *reinterpret_cast<MixedPrecision*>(precision);
    const at::Tensor xc = mp.operand(x), wc = mp.operand_detached(w);
    ctx->save_for_backward({xc, wc});
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->saved_data["w"] = w;  // the parameter: its gradient may be accumulated in the GEMM
    ctx->saved_data["precision"] = precision;
    return at::bmm(xc, wc.transpose(1, 2));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const at::Tensor g = grads[0].to(x.scalar_type());
    const at::Tensor dx = at::bmm(g, w).to(ctx->saved_data["x_dtype"].toScalarType());
    auto* mp = reinterpret_cast<MixedPrecision*>(ctx->saved_data["precision"].toInt());
    return {dx, param_weight_grad(ctx->saved_data["w"].toTensor(), g, x, /*batched=*/true, mp), at::Tensor()};
  }
};

// mixed_linear: one GEMM each way over the weights' casts concatenated by
// rows; the weights' gradients are row blocks of one weight_grad GEMM (fp32
// out), so neither autograd's bf16 weight gradient nor its cast up exists.
class MixedLinear : public torch::autograd::Function<MixedLinear> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights, at::TensorList biases,
                            const std::optional<at::Tensor>& residual, int64_t precision) {
    auto& mp = *reinterpret_cast<MixedPrecision*>(precision);
    const auto join = [&](at::TensorList ts) {
      std::vector<at::Tensor> casts;
      for (const at::Tensor& t : ts) casts.push_back(mp.operand_detached(t));
      return casts.size() == 1 ? casts[0] : at::cat(casts, 0);
    };
    const at::Tensor xc = mp.operand(x), wc = join(weights);
    std::vector<int64_t> rows;
    for (const at::Tensor& w : weights) rows.push_back(w.size(0));
    ctx->save_for_backward({xc, wc});
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->saved_data["w_dtype"] = weights[0].scalar_type();
    ctx->saved_data["weights"] = weights.vec();  // the parameters: their gradients may be accumulated in the GEMMs
    ctx->saved_data["biases"] = !biases.empty();
    ctx->saved_data["residual"] = residual.has_value();
    ctx->saved_data["precision"] = precision;
    if (residual) {
      at::Tensor y = at::empty_like(*residual);  // not a view of the GEMM's result: this function's own output
      at::Tensor y2 = y.view({-1, wc.size(0)});
      at::addmm_out(y2, residual->view({-1, wc.size(0)}), xc.reshape({-1, xc.size(-1)}), wc.t());
      return y;
    }
    return biases.empty() ? at::linear(xc, wc) : at::linear(xc, wc, join(biases));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const at::Tensor g = grads[0].to(x.scalar_type());
    const at::Tensor g2 = g.reshape({-1, w.size(0)});
    const at::ScalarType w_dtype = ctx->saved_data["w_dtype"].toScalarType();
    variable_list out{ctx->needs_input_grad(0)
                          ? at::mm(g2, w).view(x.sizes()).to(ctx->saved_data["x_dtype"].toScalarType())
                          : at::Tensor()};
    const auto split = [&](const at::Tensor& whole) {
      int64_t at_row = 0;
      for (int64_t r : ctx->saved_data["rows"].toIntVector()) {
        out.push_back(whole.narrow(0, at_row, r));
        at_row += r;
      }
    };
    // Accumulated in the GEMMs only if every weight's can be (one GEMM per
    // weight then, over its columns of g), or deferred (a zero-bubble B
    // pass: each weight's product queued); else one GEMM, split by rows.
    const std::vector<at::Tensor> params = ctx->saved_data["weights"].toTensorVector();
    auto* mp = reinterpret_cast<MixedPrecision*>(ctx->saved_data["precision"].toInt());
    bool in_gemm = true;
    for (const at::Tensor& p : params) in_gemm = in_gemm && grad_accumulates_in_gemm(p, g);
    if (in_gemm || mp->deferred_weight_grads()) {
      int64_t at_col = 0;
      for (const at::Tensor& p : params) {
        out.push_back(param_weight_grad(p, g2.narrow(1, at_col, p.size(0)), x, /*batched=*/false, mp));
        at_col += p.size(0);
      }
    } else {
      split(weight_grad(g, x, w_dtype));
    }
    if (ctx->saved_data["biases"].toBool()) split(at::sum(g2, {0}, false, w_dtype));
    out.push_back(ctx->saved_data["residual"].toBool() ? grads[0] : at::Tensor());
    out.push_back(at::Tensor());
    return out;
  }
};

class EmbeddingRows : public torch::autograd::Function<EmbeddingRows> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& w, const at::Tensor& index, int64_t precision,
                            int64_t rows, int64_t tied) {
    auto& mp = *reinterpret_cast<MixedPrecision*>(precision);
    ctx->save_for_backward({index});
    ctx->saved_data["tied"] = tied;
    ctx->saved_data["vocab"] = w.size(0);
    ctx->saved_data["w_dtype"] = w.scalar_type();
    return at::embedding(mp.operand_detached(w, rows), index);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor index = ctx->get_saved_variables()[0];
    // The rows' gradients summed in the parameter's dtype (fp32), not in bf16.
    const at::Tensor g = grads[0].to(ctx->saved_data["w_dtype"].toScalarType());
    if (auto* tied = reinterpret_cast<TiedGrad*>(ctx->saved_data["tied"].toInt())) {
      at::Tensor head;
      {
        std::lock_guard<std::mutex> lock(tied->mu);
        head = std::move(tied->head);
        tied->head = at::Tensor();
      }
      if (head.defined()) {
        // Row by row into the head's gradient (in place: it is this pass's own buffer).
        head.index_add_(0, index.reshape({-1}), g.reshape({-1, g.size(-1)}));
        return {head, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
      }
    }
    const at::Tensor dw = at::embedding_dense_backward(g, index, ctx->saved_data["vocab"].toInt(), -1, false);
    return {dw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

namespace {

// dy^T x summed in fp32 where param_dtype is fp32 and the operands bf16/fp16:
// a GEMM with an fp32 output where the backend has one (CUDA, meta), else
// (CPU) over the exact fp32 upcast of the operands. With `into` defined, the
// product is added into it in place (beta 1) and nothing is returned.
at::Tensor wgrad_gemm(const at::Tensor& dy, const at::Tensor& x, at::ScalarType param_dtype, bool batched,
                      at::Tensor into) {
  MT_ASSERT(!batched || (dy.dim() == 3 && x.dim() == 3), "batched weight gradient wants [E, S, .] operands, got ",
            dy.sizes(), " and ", x.sizes());
  const at::Tensor a = batched ? dy.transpose(1, 2) : dy.reshape({-1, dy.size(-1)}).t();
  const at::Tensor b = batched ? x : x.reshape({-1, x.size(-1)});
  const bool fp32_out = mixed_grad(a, param_dtype) && (a.is_cuda() || a.is_meta());
  // bf16 -> fp32 is exact, so the upcast sums the same products in fp32.
  const bool upcast = mixed_grad(a, param_dtype) && !fp32_out;
  const at::Tensor l = upcast ? a.to(at::kFloat) : a, r = upcast ? b.to(at::kFloat) : b;
  if (into.defined()) {
    at::NoGradGuard no_grad;
    if (fp32_out)
      batched ? at::baddbmm_out(into, into, l, r, at::kFloat) : at::addmm_out(into, into, l, r, at::kFloat);
    else
      batched ? into.baddbmm_(l, r) : into.addmm_(l, r);
    return {};
  }
  if (fp32_out) return batched ? at::bmm(l, r, at::kFloat) : at::mm(l, r, at::kFloat);
  return (batched ? at::bmm(l, r) : at::mm(l, r)).to(param_dtype);
}

}  // namespace

at::Tensor weight_grad(const at::Tensor& dy, const at::Tensor& x, at::ScalarType param_dtype, bool batched) {
  return wgrad_gemm(dy, x, param_dtype, batched, {});
}

bool grad_accumulates_in_gemm(const at::Tensor& param, const at::Tensor& dy) {
  if (!param.defined() || !param.requires_grad() || at::GradMode::is_enabled()) return false;
  const at::Tensor& g = param.grad();
  return g.defined() && !g.requires_grad() && g.sizes() == param.sizes() && g.scalar_type() == param.scalar_type() &&
         g.is_contiguous() && g.device() == dy.device() && (g.dim() == 2 || g.dim() == 3) &&
         (dy.scalar_type() == g.scalar_type() || mixed_grad(dy, g.scalar_type()));
}

at::Tensor param_weight_grad(const at::Tensor& param, const at::Tensor& dy, const at::Tensor& x, bool batched,
                             MixedPrecision* precision) {
  if (precision && precision->deferred_weight_grads()) {
    precision->deferred_weight_grads()->push(param, dy, x, batched);
    return {};
  }
  // The parameter's post-accumulate hook (the dp buckets' readiness) still
  // runs once this pass when the product was added here: libtorch's engine
  // runs it when the parameter's AccumulateGrad node runs, even for no
  // gradient (weight_grad_test holds it to that).
  return wgrad_gemm(dy, x, param.scalar_type(), batched,
                    grad_accumulates_in_gemm(param, dy) ? param.grad() : at::Tensor());
}

at::Tensor param_weight_grad(const at::Tensor& param, std::function<at::Tensor()> dw, MixedPrecision* precision) {
  if (precision && precision->deferred_weight_grads()) {
    precision->deferred_weight_grads()->push(param, std::move(dw));
    return {};
  }
  return dw();
}

void WeightGradQueue::push(const at::Tensor& param, const at::Tensor& dy, const at::Tensor& x, bool batched) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back({param, dy, x, batched, {}});
}

void WeightGradQueue::push(const at::Tensor& param, std::function<at::Tensor()> dw) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back({param, {}, {}, false, std::move(dw)});
}

void WeightGradQueue::after_run(std::function<void()> f) {
  std::lock_guard<std::mutex> lock(mu_);
  after_.push_back(std::move(f));
}

size_t WeightGradQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size() + after_.size();
}

void WeightGradQueue::run() {
  std::vector<Entry> entries;
  std::vector<std::function<void()>> after;
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries.swap(entries_);
    after.swap(after_);
  }
  at::NoGradGuard no_grad;
  for (Entry& e : entries) {
    at::Tensor& grad = e.param.mutable_grad();
    if (e.dw) {
      const at::Tensor dw = e.dw();
      if (grad.defined()) grad.add_(dw);
      else grad = dw;
    } else if (grad_accumulates_in_gemm(e.param, e.dy)) {
      wgrad_gemm(e.dy, e.x, e.param.scalar_type(), e.batched, grad);
    } else {
      const at::Tensor dw = wgrad_gemm(e.dy, e.x, e.param.scalar_type(), e.batched, {});
      if (grad.defined()) grad.add_(dw);
      else grad = dw;
    }
    e = Entry{};  // the operands go as soon as they are used
  }
  for (const auto& f : after) f();
}

at::Tensor batched_linear(const at::Tensor& x, const at::Tensor& w, MixedPrecision& precision, int64_t segments) {
  MT_ASSERT(x.dim() == 3 && w.dim() == 3 && x.size(0) == w.size(0) && x.size(2) == w.size(2),
            "batched_linear: x ", x.sizes(), " and w ", w.sizes(), " do not match");
  if (const Fp8Split* split = precision.fp8_split(w)) return fp8_batched_linear(x, w, precision, *split, segments);
  return BatchedLinear::apply(x, w, reinterpret_cast<int64_t>(&precision));
}

at::Tensor mixed_linear(const at::Tensor& x, at::TensorList weights, at::TensorList biases, const at::Tensor& residual,
                        MixedPrecision& precision) {
  MT_ASSERT(!weights.empty() && (biases.empty() || biases.size() == weights.size()) &&
                !(residual.defined() && !biases.empty()),
            "mixed_linear: ", weights.size(), " weights, ", biases.size(), " biases",
            residual.defined() ? " and a residual" : "");
  return MixedLinear::apply(x, weights, biases, residual.defined() ? std::optional<at::Tensor>(residual) : std::nullopt,
                            reinterpret_cast<int64_t>(&precision));
}

at::Tensor embedding_rows(const at::Tensor& w, const at::Tensor& index, MixedPrecision& precision, int64_t rows,
                          TiedGrad* tied) {
  MT_ASSERT(w.dim() == 2, "embedding_rows wants a [V, d] table, got ", w.sizes());
  if (!precision.policy().mixed()) return at::embedding(w, index);
  return EmbeddingRows::apply(w, index, reinterpret_cast<int64_t>(&precision), rows, reinterpret_cast<int64_t>(tied));
}

}  // namespace meshtrain
