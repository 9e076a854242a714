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
// step uses the fp32 moments before rounding. cast (optional): the new p
// rounded to C (the compute dtype's copy of the weight).
template <class M, class C = float>
MT_HD void element(float& p, float g, M& m, M& v, const StepConsts& c, const float* grad_scale, C* cast = nullptr) {
  if (grad_scale) g = g / *grad_scale;
  float w = p;
  w -= c.lr_decay * w;
  const float mm = c.beta1 * rows::ld(m) + (1.0f - c.beta1) * g;
  const float vv = c.beta2 * rows::ld(v) + (1.0f - c.beta2) * g * g;
  m = rows::st<M>(mm);
  v = rows::st<M>(vv);
  const float denom = sqrtf(vv) / c.bc2_sqrt + c.eps;
  p = w - c.step_size * mm / denom;
  if (cast) *cast = rows::st<C>(p);
}

// ---- the CUDA kernel's multi-tensor launches (cuda_kernels.cu), planned on
// the host (so the CPU tests check the packing) -------------------------------
// Tensors are cut into chunks of kChunk elements, a thread block per chunk;
// a launch takes at most kTensors tensors and kBlocks chunks (its table is
// the kernel's argument, under CUDA's 4 KiB limit, as aten's
// multi_tensor_apply does). A tensor whose chunks do not fit goes on in the
// next launch.
constexpr int kTensors = 36;
constexpr int kBlocks = 320;
constexpr int64_t kChunk = 65536;

struct LaunchPlan {
  int tensors = 0, blocks = 0;
  int64_t tensor[kTensors];          // index into the caller's lists
  unsigned char tensor_of[kBlocks];  // block b updates chunk chunk_of[b] of entry tensor_of[b]
  int chunk_of[kBlocks];
};

// Calls launch(const LaunchPlan&) for each launch covering n[0..count)
// (empty tensors skipped), every chunk exactly once, in order.
template <class F>
void plan_launches(int64_t count, const int64_t* n, F&& launch) {
  LaunchPlan p;
  const auto flush = [&] {
    if (p.blocks > 0) launch(p);
    p.tensors = 0;
    p.blocks = 0;
  };
  for (int64_t k = 0; k < count; ++k) {
    const int64_t chunks = (n[k] + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      if (p.blocks == kBlocks) flush();
      if (p.tensors == 0 || p.tensor[p.tensors - 1] != k) {
        if (p.tensors == kTensors) flush();
        p.tensor[p.tensors++] = k;
      }
      p.tensor_of[p.blocks] = static_cast<unsigned char>(p.tensors - 1);
      p.chunk_of[p.blocks++] = static_cast<int>(c);
    }
  }
  flush();
}

}  // namespace meshtrain::ops::adamw
