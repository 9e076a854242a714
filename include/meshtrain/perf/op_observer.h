#pragma once
// Counts what a piece of code dispatches, through at::RecordFunction callbacks
// on aten operators (this thread and the autograd threads it starts): GEMM and
// attention FLOPs from input shapes, bytes read + written by every other
// kernel, kernels launched and host synchronisations. Made for the meta device
// (`meshtrain bench --device meta`), where ops carry shapes and dtypes only.
//
// What counts as one kernel: an operator that does work on the observed device
// and calls no other kernel (composite wrappers such as linear, matmul,
// reshape, to, dropout(p=0) only forward to others); views, allocations and
// metadata ops are no kernels. Ops that are one fused kernel on a GPU (foreach
// ops, fused AdamW, fused RMSNorm, flash attention, grouped GEMM) count once,
// whatever they decompose to on the meta device. Host syncs are device-to-host
// reads: item / _local_scalar_dense, nonzero, unique, masked_select, a copy to
// the CPU, bincount without a static size.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace meshtrain {

struct OpRow {
  int64_t calls = 0;
  double flop = 0;
  double bytes = 0;
};

struct OpTotals {
  double gemm_flop = 0, attention_flop = 0;
  double gemm_bytes = 0, attention_bytes = 0;
  // FP8 GEMMs (meshtrain::fp8_mm, model_config.fp8_recipe), apart from the
  // others: they run at the FP8 peak. A quantization (meshtrain::fp8_quantize)
  // is one memory-bound kernel, in other_bytes.
  double fp8_gemm_flop = 0, fp8_gemm_bytes = 0;
  double other_bytes = 0;  // every other kernel: the non-GEMM traffic
  int64_t kernels = 0;     // all kernels, GEMM and attention included
  int64_t host_syncs = 0;
  std::map<std::string, OpRow> by_op;  // kernels and syncs per operator name
};

class OpObserver {
 public:
  // Observes ops touching tensors on `device` from construction to destruction.
  explicit OpObserver(at::Device device);
  ~OpObserver();
  OpObserver(const OpObserver&) = delete;
  OpObserver& operator=(const OpObserver&) = delete;

  const OpTotals& totals() const;
  void reset();

  struct State;  // the callbacks' view (defined in op_observer.cpp)

 private:
  std::unique_ptr<State> state_;
};

}  // namespace meshtrain
