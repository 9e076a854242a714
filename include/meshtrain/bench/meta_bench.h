#pragma once
// `meshtrain bench --device meta`: the performance model. Runs one full-size
// training step of a config (forward, backward, gradient norm, clipping and
// the optimizer update, as Trainer::train_step + apply_update do them) on the
// meta device, where tensors have shapes but no data, under an OpObserver, and
// estimates the step time on a GPU from what it dispatched:
//   est_step_ms = gemm_tflop / (efficiency * peak_tflops)
//               + fp8_gemm_tflop / (efficiency * fp8_peak_tflops)   (model_config.fp8_recipe)
//               + attention_tflop / (attention_efficiency * peak_tflops)
//               + non_gemm_gb / (memory_efficiency * bandwidth_tbps)
//               + kernels * kernel_gap_us   (graph_kernel_gap_us with cuda_graphs)
// nothing overlapped. The defaults are fitted to a measured H100 step
// (GPT-2 124M, bf16, `bench --profile`, 2026-11-25: GEMMs at 0.75 of the
// 989 TFLOP/s dense bf16 peak, attention at 0.25, the memory-bound kernels at
// 0.40 of 3.35 TB/s, 7.7 us between kernels); scripts/gpu/gpu-check.sh fits them
// again from each profile it takes. Unaligned GEMMs (an odd vocabulary) run
// slower than the fit says.
//
// The model is one unsharded rank: n_device_axis is taken as [1, 1, 1] and the
// whole train_batch_size * grad_step runs on it. The measured step is the
// second one (the first warms caches such as RoPE tables) and is a step that
// logs nothing, so host_syncs must be 0 for a step that never waits on the GPU.
#include <cstdint>
#include <string>

#include "meshtrain/config/config.h"
#include "meshtrain/dist/runtime.h"
#include "meshtrain/perf/op_observer.h"

namespace meshtrain {

struct MetaBenchOptions {
  double peak_tflops = 989.0;          // dense bf16 per device
  double fp8_peak_tflops = 1979.0;     // dense FP8 per device (the FP8 GEMMs of model_config.fp8_recipe)
  double bandwidth_tbps = 3.35;        // device memory bandwidth
  double efficiency = 0.75;            // fraction of peak_tflops the GEMMs reach
  double attention_efficiency = 0.25;  // fraction of peak_tflops attention reaches
  double memory_efficiency = 0.40;     // fraction of bandwidth_tbps the memory-bound kernels reach
  double kernel_gap_us = 7.7;          // idle device time per kernel (launches, dependencies)
  // The same with device_config.cuda_graphs (a replayed graph launches its
  // kernels from the device: no host launch time; an assumption until a GPU
  // profile of a replayed step fits it).
  double graph_kernel_gap_us = 1.0;
  std::string peak_name = "H100";
  int64_t top_ops = 15;                // rows in the readable table
};

struct MetaBenchResult {
  OpTotals totals;
  int64_t tokens_per_step = 0;
  double est_step_ms = 0;
  double est_tokens_per_sec = 0;
  MetaBenchOptions opts;
  bool cuda_graphs = false;  // the config's device_config.cuda_graphs
  double host_ms_per_step = 0;  // the median of 3 unobserved steps' wall time (host work only)
  double kernel_gap_us() const { return cuda_graphs ? opts.graph_kernel_gap_us : opts.kernel_gap_us; }
};

MetaBenchResult run_meta_bench(const Config& cfg, Runtime& runtime, const MetaBenchOptions& opts);

// The readable table (top operators by bytes, totals) and the one-line JSON:
// {"gemm_tflop","fp8_gemm_tflop","attention_tflop","non_gemm_gb","kernels","host_syncs","host_ms_per_step",
//  "est_step_ms","est_tokens_per_sec","peak","assumed":{...the options}}.
std::string to_string(const MetaBenchResult& r);
std::string to_json(const MetaBenchResult& r);

}  // namespace meshtrain
