#pragma once
// AdamW as one meshtrain operator (meshtrain::adamw_): fp32 master weights and
// gradients, moments kept in bf16 (or fp32), the update computed in fp32 --
// each moment read and widened, updated, rounded back to its storage dtype
// (round to nearest even). It is what at::_fused_adamw_ does, except that
// aten's wants one dtype for every list; optim/adamw.h calls it when the
// moments are bf16 (optimizer_state_dtype "bfloat16", DeepSeek-V3's
// choice): 12 bytes of state traffic per parameter and step instead of 20
// (plus 8 for the weight, 4 for the gradient, read only here).
//
// Rounding is to nearest, not stochastic: every element's update depends on
// its own values only, never on where it sits in a list or a flat slice, so
// zero_stage 0, 1, 2 and 3 stay bit-identical (the dp parity tests).
//
// CPU, meta and CUDA kernels (multi-tensor launches, planned on the host by
// src/ops/adamw_math.h with the element function both kernels share); a CUDA
// build without nvcc runs the aten composite (fp32 copies of the moments
// through at::_fused_adamw_).
#include <ATen/core/Tensor.h>

#include <vector>

namespace meshtrain::ops {

struct AdamwHyper {
  double lr = 0, beta1 = 0.9, beta2 = 0.95, weight_decay = 0, eps = 1e-8;
};

// One AdamW update, in place, of params (fp32, contiguous) from grads (fp32,
// contiguous, read only) with moments exp_avg / exp_avg_sq (contiguous, all
// fp32 or all bf16), lists of equal length and element counts. step: 0-dim
// fp32 holding the step number t (1 for the first update; bias corrections
// 1 - beta^t). grad_scale (0-dim fp32, optional): gradients divided by it as
// they are read (clipping). found_inf (0-dim fp32, optional): nothing changes
// where it is non-zero. No host read of any device tensor.
//
// casts (empty, or one per parameter): bf16 tensors with the parameter's
// element count, contiguous, written with the updated weight rounded to
// nearest even -- the bits at::Tensor::to(kBFloat16) gives -- in the same
// pass, so a bf16 model's next forward reads its weights' casts without a
// pass of its own over the fp32 weights (model/mixed_precision.h). Where the
// update is skipped (found_inf) they are left as they are, like the weights.
// Every parameter's version counter is bumped (the update is an in-place
// write that a cached cast must see).
//
// lr_tensor (0-dim fp32 on the parameters' device, optional): the learning
// rate read on the device instead of h.lr, so a captured CUDA graph replays
// each step with the value written there before it (train/step_graph.h).
void adamw_(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
            const std::vector<at::Tensor>& exp_avg, const std::vector<at::Tensor>& exp_avg_sq, const at::Tensor& step,
            const AdamwHyper& h, const at::Tensor& grad_scale = {}, const at::Tensor& found_inf = {},
            const std::vector<at::Tensor>& casts = {}, const at::Tensor& lr_tensor = {});

}  // namespace meshtrain::ops
