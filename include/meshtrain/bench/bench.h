#pragma once
// `meshtrain bench`: times training steps of a config (W warm-up steps, then N
// timed ones) and reports throughput, model FLOP utilisation, peak memory and,
// under expert parallelism, the share of the step spent in all-to-alls.
// The steps are Trainer::train_step() + the global grad norm + the AdamW
// update, i.e. a training step without logging, evaluation or checkpoints; the
// run directory is a temporary folder removed at the end.
#include <cstdint>
#include <map>
#include <string>

#include "meshtrain/config/config.h"
#include "meshtrain/dist/runtime.h"
#include "meshtrain/perf/path_counter.h"
#include "meshtrain/perf/profile.h"

namespace meshtrain {

struct BenchOptions {
  int64_t steps = 10;
  int64_t warmup = 2;
  double peak_tflops = 0;  // per device; 0: from the device table (unknown on CPU: no MFU)
  // Not empty: after the timed steps, profile_steps more steps run under the
  // profiler (so the timing above stays clean); each rank writes its trace
  // into this folder and the result carries rank 0's summary.
  std::string profile_dir;
  int64_t profile_steps = 3;
  size_t profile_top = 20;
};

struct BenchResult {
  std::string device;               // "cpu" or the GPU's name
  int64_t world = 1;
  int64_t steps = 0;
  int64_t tokens_per_step = 0;      // global: train_batch_size * grad_step * T
  double seconds = 0;               // timed steps, slowest rank
  double tokens_per_sec = 0;        // global
  double flops_per_token = 0;
  double tflops_per_device = 0;     // achieved, model FLOPs (flops_per_token * tokens/s / world)
  double peak_tflops = 0;           // 0: unknown
  double mfu = -1;                  // achieved / peak; -1: unknown
  double peak_memory_bytes = 0;     // max over ranks
  std::string peak_memory_kind;     // "cuda_allocator_peak" | "cpu_peak_rss"
  double last_loss = 0;
  int64_t expert_parallel = 1;
  double all_to_all_seconds = 0;    // expert parallelism's token exchanges, slowest rank
  double all_to_all_share() const { return seconds > 0 ? all_to_all_seconds / seconds : 0; }
  int64_t context_parallel = 1;
  double cp_exchange_seconds = 0;   // the cp group's all-gathers and reduce-scatters, slowest rank
  double cp_exchange_share() const { return seconds > 0 ? cp_exchange_seconds / seconds : 0; }
  // Payload bytes per step that this rank's collectives and point-to-point
  // transfers moved, by mesh axis ("dp", "pp", "tp", "ep", and "expert_dp"
  // when ep > 1), max over ranks, over the timed steps.
  std::map<std::string, double> comm_bytes_per_step;
  // The same bytes by payload dtype ("float32", "bfloat16", "int64", "int32",
  // ...), per axis; each entry max over ranks. JSON "comm_dtypes".
  std::map<std::string, std::map<std::string, double>> comm_bytes_by_dtype;
  // CUDA: the kernel sdpa runs for the model's attention (device_config.
  // attention_backend, model/attention.h); empty on CPU.
  std::string attention_backend;
  // The paths the fused operators took in the timed steps, by operator
  // (train/path_counter.h): this rank's calls. JSON "paths".
  std::map<std::string, OpPaths> paths;
  bool fused_kernels = false;       // CUDA: meshtrain's own kernels (else aten's composites)
  // device_config.cuda_graphs: how the timed steps ran ("replayed" on a GPU,
  // "eager" on a CPU); empty without graphs. JSON "cuda_graphs".
  std::string cuda_graphs;
  bool profiled = false;
  ProfileSummary profile;           // this rank's, when profiled
};

// Dense bf16 tensor-core peak per device for known GPU names (H100 / H200 SXM
// 989, A100 312); 0 when unknown (and on CPU).
double peak_tflops_for(const std::string& device_name);

BenchResult run_bench(const Config& cfg, Runtime& runtime, const BenchOptions& opts);

std::string to_string(const BenchResult& r);
std::string to_json(const BenchResult& r);

}  // namespace meshtrain
