// meshtrain::combine_rows / spread_rows (ops/slot_rows.h): schemas, meta
// kernels, the per-backend registrations, the calls through the dispatcher
// (what the performance model's observer counts) and the autograd functions
// of the MoE dispatch and combine over them.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "kernels.h"
#include "meshtrain/core/check.h"
#include "meshtrain/ops/slot_rows.h"

namespace meshtrain::ops {

namespace {

using impl::Opt;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor combine_rows_meta(const at::Tensor& src, const at::Tensor& slot, const Opt& weight) {
  impl::check_combine_rows(src, slot, weight);
  return at::empty({slot.size(0), src.size(1)}, src.options());
}

impl::Spread spread_rows_meta(const at::Tensor& src, const at::Tensor& owner, int64_t k, const Opt& weight,
                              const Opt& y) {
  impl::check_spread_rows(src, owner, k, weight, y);
  const auto f32 = src.options().dtype(at::kFloat);
  return {at::empty({owner.size(0), src.size(1)}, src.options()), at::empty({y ? src.size(0) * k : 0}, f32)};
}

at::Tensor call_combine(const at::Tensor& src, const at::Tensor& slot, const Opt& weight) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("meshtrain::combine_rows", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const Opt&)>();
  return op.call(src, slot, weight);
}

impl::Spread call_spread(const at::Tensor& src, const at::Tensor& owner, int64_t k, const Opt& weight, const Opt& y) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("meshtrain::spread_rows", "")
          .typed<impl::Spread(const at::Tensor&, const at::Tensor&, int64_t, const Opt&, const Opt&)>();
  return op.call(src, owner, k, weight, y);
}

// Token rows into the buffer; backward: each token's rows' gradients summed.
class DispatchFn : public torch::autograd::Function<DispatchFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& slot,
                            const at::Tensor& owner, int64_t k) {
    ctx->save_for_backward({slot});
    return std::get<0>(call_spread(x, owner, k, std::nullopt, std::nullopt));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    return {call_combine(grads[0].contiguous(), s[0], std::nullopt), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The weighted sum of each token's rows; backward: the output gradient
// spread to the rows times the weights, and the weights' gradient from the
// saved rows, in one kernel.
class CombineFn : public torch::autograd::Function<CombineFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, const at::Tensor& weight,
                            const at::Tensor& slot, const at::Tensor& owner, int64_t k) {
    ctx->save_for_backward({y, weight, owner});
    ctx->saved_data["k"] = k;
    return call_combine(y, slot, weight);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const bool weight_grad = ctx->needs_input_grad(1);
    auto [dy, dw] = call_spread(grads[0].contiguous(), s[2], ctx->saved_data["k"].toInt(), s[1],
                                weight_grad ? Opt(s[0]) : std::nullopt);
    return {dy, weight_grad ? dw.view(s[1].sizes()) : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

SlotMap slot_map(const at::Tensor& slot, int64_t rows) {
  MT_ASSERT(slot.dim() == 2 && slot.scalar_type() == at::kLong, "slot_map: slot must be int64 [N, k], got ",
            slot.sizes(), " ", slot.scalar_type());
  const int64_t A = slot.numel();
  const auto ids = slot.options();
  const at::Tensor flat = slot.reshape({A});
  // Assignments without a row (-1, which the floored remainder makes `rows`)
  // write the spare entry, cut off after.
  const at::Tensor owner = at::full({rows + 1}, -1, ids)
                               .index_copy_(0, flat.remainder(rows + 1), at::arange(A, ids))
                               .narrow(0, 0, rows);
  return {slot.contiguous(), owner.contiguous(), slot.size(1)};
}

at::Tensor slots_from_tokens(const at::Tensor& x, const SlotMap& m) {
  MT_ASSERT(x.dim() == 2 && x.size(0) == m.slot.size(0), "slots_from_tokens: x ", x.sizes(), " for a map of ",
            m.slot.size(0), " tokens");
  return DispatchFn::apply(x.contiguous(), m.slot, m.owner, m.k);
}

at::Tensor tokens_from_slots(const at::Tensor& y, const at::Tensor& weight, const SlotMap& m) {
  MT_ASSERT(y.dim() == 2 && y.size(0) == m.owner.size(0), "tokens_from_slots: y ", y.sizes(), " for a map of ",
            m.owner.size(0), " rows");
  MT_ASSERT(weight.numel() == m.slot.numel() && weight.scalar_type() == at::kFloat,
            "tokens_from_slots: weight must be fp32 with one value per assignment, got ", weight.sizes(), " ",
            weight.scalar_type());
  return CombineFn::apply(y.contiguous(), weight.reshape(m.slot.sizes()).contiguous(), m.slot, m.owner, m.k);
}

// The weight's gradient is an output (fp32 [N * k], [0] without y).
TORCH_LIBRARY_FRAGMENT(meshtrain, m) {
  m.def("combine_rows(Tensor src, Tensor slot, Tensor? weight) -> Tensor");
  m.def("spread_rows(Tensor src, Tensor owner, int k, Tensor? weight, Tensor? y) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(meshtrain, CPU, m) {
  m.impl("combine_rows", TORCH_FN(impl::combine_rows_cpu));
  m.impl("spread_rows", TORCH_FN(impl::spread_rows_cpu));
}
TORCH_LIBRARY_IMPL(meshtrain, Meta, m) {
  m.impl("combine_rows", TORCH_FN(combine_rows_meta));
  m.impl("spread_rows", TORCH_FN(spread_rows_meta));
}
#ifdef MESHTRAIN_CUDA_KERNELS
TORCH_LIBRARY_IMPL(meshtrain, CUDA, m) {
  m.impl("combine_rows", TORCH_FN(impl::combine_rows_cuda));
  m.impl("spread_rows", TORCH_FN(impl::spread_rows_cuda));
}
#else
TORCH_LIBRARY_IMPL(meshtrain, CUDA, m) {
  m.impl("combine_rows", TORCH_FN(impl::combine_rows_ref));
  m.impl("spread_rows", TORCH_FN(impl::spread_rows_ref));
}
#endif

}  // namespace meshtrain::ops
