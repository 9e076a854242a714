#pragma once
// The arithmetic of meshtrain::adamw_ (ops/adamw.h), one element at a time,
// compiled for the CPU kernel (cpu_kernels.cpp) and the CUDA one
// (cuda_kernels.cu) alike. The order of operations is at::_fused_adamw_'s
// (ATen's fused_adam_utils.cuh, ADAMW mode): decay the weight, update the
// moments, step by the bias-corrected ratio.
#include "row_math.h"

namespace meshtrain::ops::adamw {

struct Hyper {
  float lr, beta1, beta2, weight_decay, eps;
};

// What every element of one update shares, from the step number t.
struct StepConsts {
  float lr_decay;   // lr * weight_decay: the decoupled decay's factor
  float beta1, beta2, eps;
  float step_size;  // lr / (1 - beta1^t)
  float bc2_sqrt;   // sqrt(1 - beta2^t)
};

// Bias corrections in double, as aten computes them (t reaches 1e5 and more).
MT_HD StepConsts step_consts(const Hyper& h, float t) {
  StepConsts c;
  c.lr_decay = h.lr * h.weight_decay;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.eps = h.eps;
  c.step_size = static_cast<float>(static_cast<double>(h.lr) / (1.0 - pow(static_cast<double>(h.beta1), static_cast<double>(t))));
  c.bc2_sqrt = static_cast<float>(sqrt(1.0 - pow(static_cast<double>(h.beta2), static_cast<double>(t))));
  return c;
}

// p (fp32) updated from g (fp32; divided by *grad_scale when given) with its
// moments m, v of storage type M, read as fp32 and stored rounded to M. The
// step uses the fp32 moments before rounding.
template <class M>
MT_HD void element(float& p, float g, M& m, M& v, const StepConsts& c, const float* grad_scale) {
  if (grad_scale) g = g / *grad_scale;
  float w = p;
  w -= c.lr_decay * w;
  const float mm = c.beta1 * rows::ld(m) + (1.0f - c.beta1) * g;
  const float vv = c.beta2 * rows::ld(v) + (1.0f - c.beta2) * g * g;
  m = rows::st<M>(mm);
  v = rows::st<M>(vv);
  const float denom = sqrtf(vv) / c.bc2_sqrt + c.eps;
  p = w - c.step_size * mm / denom;
}

}  // namespace meshtrain::ops::adamw
