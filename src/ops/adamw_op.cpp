// meshtrain::adamw_ (ops/adamw.h): its schema, argument checks, meta kernel,
// the aten composite (reference and CUDA builds without nvcc) and the call
// through the dispatcher (what the performance model's observer counts).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "kernels.h"
#include "meshtrain/core/check.h"
#include "meshtrain/ops/adamw.h"

namespace meshtrain::ops {

namespace impl {

void check_adamw(at::TensorList params, at::TensorList grads, at::TensorList exp_avg, at::TensorList exp_avg_sq,
                 const at::Tensor& step, const Opt& grad_scale, const Opt& found_inf, at::TensorList casts,
                 const Opt& lr_tensor) {
  const size_t n = params.size();
  MT_ASSERT(casts.empty() || casts.size() == n, "adamw_: ", casts.size(), " casts for ", n, " parameters");
  MT_ASSERT(grads.size() == n && exp_avg.size() == n && exp_avg_sq.size() == n, "adamw_: lists of ", n, ", ",
            grads.size(), ", ", exp_avg.size(), " and ", exp_avg_sq.size(), " tensors");
  MT_ASSERT(step.defined() && step.numel() == 1 && step.scalar_type() == at::kFloat, "adamw_: step must be one fp32");
  for (const Opt* s : {&grad_scale, &found_inf, &lr_tensor})
    MT_ASSERT(!*s || ((*s)->numel() == 1 && (*s)->scalar_type() == at::kFloat),
              "adamw_: grad_scale, found_inf and lr_tensor must be one fp32 each");
  if (n == 0) return;
  const at::ScalarType moments = exp_avg[0].scalar_type();
  MT_ASSERT(moments == at::kFloat || moments == at::kBFloat16, "adamw_: moments must be fp32 or bf16, got ", moments);
  const at::Device device = params[0].device();
  for (size_t k = 0; k < n; ++k) {
    const int64_t numel = params[k].numel();
    for (const at::Tensor* t : {&params[k], &grads[k], &exp_avg[k], &exp_avg_sq[k]}) {
      MT_ASSERT(t->numel() == numel && t->is_contiguous() && t->device() == device, "adamw_: tensor ", k,
                " differs from its parameter (", t->sizes(), " vs ", params[k].sizes(), ") or is not contiguous");
    }
    MT_ASSERT(params[k].scalar_type() == at::kFloat && grads[k].scalar_type() == at::kFloat, "adamw_: parameter ", k,
              " and its gradient must be fp32, got ", params[k].scalar_type(), " and ", grads[k].scalar_type());
    MT_ASSERT(exp_avg[k].scalar_type() == moments && exp_avg_sq[k].scalar_type() == moments, "adamw_: moments of ",
              k, " are not all ", moments);
    if (!casts.empty())
      MT_ASSERT(casts[k].numel() == numel && casts[k].is_contiguous() && casts[k].device() == device &&
                    casts[k].scalar_type() == at::kBFloat16,
                "adamw_: cast ", k, " must be a contiguous bf16 tensor of ", numel, " elements on ", device, ", got ",
                casts[k].scalar_type(), " ", casts[k].sizes());
  }
}

// The moments widened to fp32 copies, at::_fused_adamw_ over them, the result
// rounded back (fp32 moments are updated in place).
void adamw_ref(at::TensorList params, at::TensorList grads, at::TensorList exp_avg, at::TensorList exp_avg_sq,
               const at::Tensor& step, double lr, double beta1, double beta2, double weight_decay, double eps,
               const Opt& grad_scale, const Opt& found_inf, const Opt& lr_tensor, at::TensorList casts) {
  check_adamw(params, grads, exp_avg, exp_avg_sq, step, grad_scale, found_inf, casts, lr_tensor);
  if (params.empty()) return;
  std::vector<at::Tensor> g, m, v;
  for (size_t k = 0; k < params.size(); ++k) {
    // aten writes the unscaled gradient back: ours stays as it was.
    g.push_back(grad_scale ? grads[k].clone() : grads[k]);
    m.push_back(exp_avg[k].to(at::kFloat));
    v.push_back(exp_avg_sq[k].to(at::kFloat));
  }
  const std::vector<at::Tensor> steps(params.size(), step);
  if (lr_tensor)
    at::_fused_adamw_(params, g, m, v, /*max_exp_avg_sqs=*/{}, steps, *lr_tensor, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false, grad_scale, found_inf);
  else
    at::_fused_adamw_(params, g, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false, grad_scale, found_inf);
  for (size_t k = 0; k < params.size(); ++k)
    if (exp_avg[k].scalar_type() != at::kFloat) {
      exp_avg[k].copy_(m[k]);
      exp_avg_sq[k].copy_(v[k]);
    }
  // Skipped updates leave the weights, so their casts stay right as they are.
  for (size_t k = 0; k < casts.size(); ++k) {
    const at::Tensor fresh = params[k].to(at::kBFloat16).view(casts[k].sizes());
    casts[k].copy_(found_inf ? at::where(*found_inf != 0, casts[k], fresh) : fresh);
  }
}

}  // namespace impl

namespace {

void adamw_meta(at::TensorList params, at::TensorList grads, at::TensorList exp_avg, at::TensorList exp_avg_sq,
                const at::Tensor& step, double, double, double, double, double, const impl::Opt& grad_scale,
                const impl::Opt& found_inf, const impl::Opt& lr_tensor, at::TensorList casts) {
  impl::check_adamw(params, grads, exp_avg, exp_avg_sq, step, grad_scale, found_inf, casts, lr_tensor);
}

std::vector<at::Tensor> detached(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) out.push_back(t.detach());
  return out;
}

}  // namespace

void adamw_(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
            const std::vector<at::Tensor>& exp_avg, const std::vector<at::Tensor>& exp_avg_sq, const at::Tensor& step,
            const AdamwHyper& h, const at::Tensor& grad_scale, const at::Tensor& found_inf,
            const std::vector<at::Tensor>& casts, const at::Tensor& lr_tensor) {
  using Opt = impl::Opt;
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("meshtrain::adamw_", "")
                             .typed<void(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                                         const at::Tensor&, double, double, double, double, double, const Opt&,
                                         const Opt&, const Opt&, at::TensorList)>();
  // Detached views: the same storage, updated in place without autograd
  // (the parameters are leaves that require grad).
  std::vector<at::Tensor> g;
  g.reserve(grads.size());
  for (const at::Tensor& t : grads) g.push_back(t.detach().contiguous());
  op.call(detached(params), g, detached(exp_avg), detached(exp_avg_sq), step, h.lr, h.beta1, h.beta2,
          h.weight_decay, h.eps, grad_scale.defined() ? Opt(grad_scale) : std::nullopt,
          found_inf.defined() ? Opt(found_inf) : std::nullopt, lr_tensor.defined() ? Opt(lr_tensor) : std::nullopt,
          detached(casts));
  // A custom op's in-place writes do not bump version counters (no
  // ADInplaceOrView kernel): bump them, so a cast cached before this update
  // reads as stale (model/mixed_precision.h).
  for (const at::Tensor& p : params) p.unsafeGetTensorImpl()->bump_version();
}

// Mutable lists are read and written (the observer counts both; casts are
// written only, so the performance model counts them once); grads, step and
// the scalars are read.
TORCH_LIBRARY_FRAGMENT(meshtrain, m) {
  m.def("adamw_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avg, Tensor(c!)[] exp_avg_sq, Tensor step, "
        "float lr, float beta1, float beta2, float weight_decay, float eps, Tensor? grad_scale=None, "
        "Tensor? found_inf=None, Tensor? lr_tensor=None, *, Tensor(d!)[] casts) -> ()");
}

TORCH_LIBRARY_IMPL(meshtrain, CPU, m) { m.impl("adamw_", TORCH_FN(impl::adamw_cpu)); }
TORCH_LIBRARY_IMPL(meshtrain, Meta, m) { m.impl("adamw_", TORCH_FN(adamw_meta)); }
#ifdef MESHTRAIN_CUDA_KERNELS
TORCH_LIBRARY_IMPL(meshtrain, CUDA, m) { m.impl("adamw_", TORCH_FN(impl::adamw_cuda)); }
#else
TORCH_LIBRARY_IMPL(meshtrain, CUDA, m) { m.impl("adamw_", TORCH_FN(impl::adamw_ref)); }
#endif

}  // namespace meshtrain::ops
