// `bench --device meta`: one observed training step on the meta device (see meta_bench.h).
#include "meshtrain/bench/meta_bench.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/optim/schedule.h"
#include "meshtrain/perf/meta_kernels.h"
#include "meshtrain/train/session.h"
#include "meshtrain/train/step.h"
#include "temp_dir.h"

namespace meshtrain {

MetaBenchResult run_meta_bench(const Config& cfg_in, Runtime& runtime, const MetaBenchOptions& opts) {
  MT_CHECK(opts.peak_tflops > 0, "bench --peak-tflops must be > 0, got ", opts.peak_tflops);
  MT_CHECK(opts.fp8_peak_tflops > 0, "bench --fp8-peak-tflops must be > 0, got ", opts.fp8_peak_tflops);
  MT_CHECK(opts.bandwidth_tbps > 0, "bench --bandwidth-tbps must be > 0, got ", opts.bandwidth_tbps);
  MT_CHECK(opts.efficiency > 0 && opts.efficiency <= 1, "bench --efficiency must be in (0, 1], got ", opts.efficiency);
  MT_CHECK(opts.attention_efficiency > 0 && opts.attention_efficiency <= 1,
           "bench --attention-efficiency must be in (0, 1], got ", opts.attention_efficiency);
  MT_CHECK(opts.memory_efficiency > 0 && opts.memory_efficiency <= 1,
           "bench --memory-efficiency must be in (0, 1], got ", opts.memory_efficiency);
  MT_CHECK(opts.kernel_gap_us >= 0, "bench --kernel-gap-us must be >= 0, got ", opts.kernel_gap_us);
  MT_CHECK(opts.graph_kernel_gap_us >= 0, "bench --graph-kernel-gap-us must be >= 0, got ",
           opts.graph_kernel_gap_us);
  install_meta_kernels();
  TempDir tmp;
  Config cfg = cfg_in;
  cfg.output_dir = tmp.path();
  cfg.name = "bench-meta";
  cfg.device.n_device_axis = {1, 1, 1};
  cfg.training_steps = std::max<int64_t>(cfg.training_steps, 2);
  SessionOptions so;
  so.fresh = true;
  so.meta = true;
  Session session(cfg, runtime, so);

  auto one_step = [&](int64_t step) {
    StepStats s = train_step(session);
    apply_update(session, s, learning_rate(cfg.lr, step));
    // Not read: the measured step is one that logs nothing.
  };
  one_step(0);  // warm-up: caches fill on the first step
  MetaBenchResult r;
  {
    OpObserver observer(at::Device(at::kMeta));
    one_step(1);
    r.totals = observer.totals();
  }
  // The host's own time to issue a step: on meta tensors every operator is
  // dispatched, autograd and the allocator run, but no kernel computes.
  std::vector<double> host_ms;
  for (int64_t i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    one_step(2 + i);
    host_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(host_ms.begin(), host_ms.end());
  r.host_ms_per_step = host_ms[1];
  r.opts = opts;
  r.cuda_graphs = cfg.device.cuda_graphs;
  r.tokens_per_step = cfg.data.train_batch_size * cfg.grad_step * cfg.data.T;
  const double peak = opts.peak_tflops * 1e12;
  const double step_s = r.totals.gemm_flop / (opts.efficiency * peak) +
                        r.totals.fp8_gemm_flop / (opts.efficiency * opts.fp8_peak_tflops * 1e12) +
                        r.totals.attention_flop / (opts.attention_efficiency * peak) +
                        r.totals.other_bytes / (opts.memory_efficiency * opts.bandwidth_tbps * 1e12) +
                        static_cast<double>(r.totals.kernels) * r.kernel_gap_us() * 1e-6;
  r.est_step_ms = step_s * 1e3;
  r.est_tokens_per_sec = static_cast<double>(r.tokens_per_step) / step_s;
  return r;
}

std::string to_string(const MetaBenchResult& r) {
  std::vector<std::pair<std::string, OpRow>> rows(r.totals.by_op.begin(), r.totals.by_op.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.second.bytes != b.second.bytes ? a.second.bytes > b.second.bytes : a.second.calls > b.second.calls;
  });
  std::ostringstream o;
  o << std::fixed;
  const MetaBenchOptions& a = r.opts;
  o << std::setprecision(2);
  o << "bench --device meta: one training step, " << r.tokens_per_step << " tokens, modelled on " << a.peak_name
    << " (" << a.peak_tflops << " TFLOP/s" << (r.totals.fp8_gemm_flop > 0 ? ", FP8 " : "")
    << (r.totals.fp8_gemm_flop > 0 ? std::to_string(static_cast<int64_t>(a.fp8_peak_tflops)) + " TFLOP/s" : "")
    << ", " << a.bandwidth_tbps << " TB/s)\n";
  o << "  assumed: GEMMs at " << a.efficiency << " of peak, attention at " << a.attention_efficiency
    << ", memory-bound kernels at " << a.memory_efficiency << " of the bandwidth, " << r.kernel_gap_us()
    << " us between kernels" << (r.cuda_graphs ? " (a replayed CUDA graph, device_config.cuda_graphs)" : "")
    << ", nothing overlapped\n";
  o << "  " << std::left << std::setw(52) << "operator" << std::right << std::setw(8) << "calls" << std::setw(12)
    << "GB" << std::setw(12) << "TFLOP" << "\n";
  const size_t n = std::min(rows.size(), static_cast<size_t>(std::max<int64_t>(0, r.opts.top_ops)));
  for (size_t i = 0; i < n; ++i) {
    const auto& [name, row] = rows[i];
    o << "  " << std::left << std::setw(52) << name << std::right << std::setw(8) << row.calls << std::setprecision(3)
      << std::setw(12) << row.bytes / 1e9 << std::setw(12) << row.flop / 1e12 << "\n";
  }
  if (rows.size() > n) o << "  ... " << rows.size() - n << " more operators\n";
  const OpTotals& t = r.totals;
  o << std::setprecision(3);
  o << "  GEMM        " << t.gemm_flop / 1e12 << " TFLOP (" << t.gemm_bytes / 1e9 << " GB)\n";
  if (t.fp8_gemm_flop > 0)
    o << "  FP8 GEMM    " << t.fp8_gemm_flop / 1e12 << " TFLOP (" << t.fp8_gemm_bytes / 1e9
      << " GB), at the FP8 peak\n";
  o << "  attention   " << t.attention_flop / 1e12 << " TFLOP (" << t.attention_bytes / 1e9 << " GB)\n";
  o << "  non-GEMM    " << t.other_bytes / 1e9 << " GB\n";
  o << "  kernels     " << t.kernels << "\n";
  o << "  host syncs  " << t.host_syncs << "\n";
  o << std::setprecision(1) << "  host        " << r.host_ms_per_step << " ms to issue a step here ("
    << std::setprecision(2) << r.host_ms_per_step * 1e3 / std::max<int64_t>(1, t.kernels) << " us a kernel)\n";
  o << std::setprecision(1);
  o << "  estimate    " << r.est_step_ms << " ms per step, " << std::setprecision(0) << r.est_tokens_per_sec
    << " tokens/s\n";
  return o.str();
}

std::string to_json(const MetaBenchResult& r) {
  nlohmann::json j;
  j["gemm_tflop"] = r.totals.gemm_flop / 1e12;
  j["fp8_gemm_tflop"] = r.totals.fp8_gemm_flop / 1e12;
  j["attention_tflop"] = r.totals.attention_flop / 1e12;
  j["non_gemm_gb"] = r.totals.other_bytes / 1e9;
  j["kernels"] = r.totals.kernels;
  j["host_syncs"] = r.totals.host_syncs;
  j["host_ms_per_step"] = r.host_ms_per_step;
  j["est_step_ms"] = r.est_step_ms;
  j["est_tokens_per_sec"] = r.est_tokens_per_sec;
  j["peak"] = r.opts.peak_name;
  j["assumed"] = {{"peak_tflops", r.opts.peak_tflops},
                  {"fp8_peak_tflops", r.opts.fp8_peak_tflops},
                  {"bandwidth_tbps", r.opts.bandwidth_tbps},
                  {"gemm_efficiency", r.opts.efficiency},
                  {"attention_efficiency", r.opts.attention_efficiency},
                  {"memory_efficiency", r.opts.memory_efficiency},
                  {"kernel_gap_us", r.kernel_gap_us()}};
  j["cuda_graphs"] = r.cuda_graphs;
  return j.dump();
}

}  // namespace meshtrain
