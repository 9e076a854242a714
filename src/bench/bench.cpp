// `meshtrain bench`: timed training steps (see bench.h).
#include "meshtrain/bench/bench.h"

#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#ifdef MESHTRAIN_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "meshtrain/core/check.h"
#include "meshtrain/model/attention.h"
#include "meshtrain/ops/fused.h"
#include "meshtrain/optim/schedule.h"
#include "meshtrain/parallel/data_parallel.h"
#include "meshtrain/perf/plan.h"
#include "meshtrain/train/session.h"
#include "meshtrain/train/step.h"
#include "meshtrain/train/step_graph.h"
#include "temp_dir.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

std::string device_name(const at::Device& dev) {
  if (!dev.is_cuda()) return "cpu";
#ifdef MESHTRAIN_CUDA
  return at::cuda::getCurrentDeviceProperties()->name;
#else
  return "cuda";
#endif
}

// Peak bytes this process held: the CUDA caching allocator's peak of allocated
// bytes on GPUs; on CPU the peak resident set size (the whole process: the
// binary, libtorch and the data too, so an upper bound on tensor memory).
double peak_memory(const at::Device& dev, std::string& kind) {
#ifdef MESHTRAIN_CUDA
  if (dev.is_cuda()) {
    kind = "cuda_allocator_peak";
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index() < 0 ? 0 : dev.index());
    return static_cast<double>(stats.allocated_bytes[0].peak);  // [0]: aggregate over pools
  }
#endif
  kind = dev.is_cuda() ? "unknown" : "cpu_peak_rss";
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) * 1024.0;  // Linux reports KiB
}

}  // namespace

double peak_tflops_for(const std::string& name) {
  // Dense bf16 tensor-core peaks from the vendors' data sheets (SXM parts).
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989.0;
  if (name.find("A100") != std::string::npos) return 312.0;
  return 0.0;
}

namespace {

// The steps bench times, as train() runs them: a step's statistics are read
// (its one host read) once the next step is enqueued; drain() reads the last.
class BenchSteps {
 public:
  BenchSteps(Session& session, const Config& cfg) : session_(session), cfg_(cfg) {
    // device_config.cuda_graphs: the graph is captured during the warm-up,
    // so the timed steps are replays.
    if (cfg.device.cuda_graphs) graph_ = std::make_unique<StepGraph>(session);
  }
  int64_t warmup(int64_t asked) const { return graph_ ? std::max<int64_t>(asked, kGraphEagerSteps + 1) : asked; }
  bool graphed() const { return graph_ != nullptr; }
  std::string graph_mode() const { return graph_ ? graph_->last_mode() : ""; }
  double last_loss() const { return last_loss_; }

  void run(int64_t n) {
    for (int64_t i = 0; i < n; ++i) one();
    drain();
  }

 private:
  void one() {
    session_.stop_point("bench");  // a signal ends the bench between steps, on every rank alike
    const double lr = learning_rate(cfg_.lr, step_++);
    StepStats s;
    if (graph_) {
      s = graph_->step(lr);
    } else {
      s = train_step(session_);
      // Norm, clipping, the update and the MoE balancing exactly as train() does them.
      apply_update(session_, s, lr);
      update_score_bias(session_, s);
    }
    s.start_read();  // queued behind this step: the previous one's read waits for nothing later
    drain();
    unread_ = std::move(s);
  }
  void drain() {
    if (!unread_) return;
    unread_->read();
    last_loss_ = unread_->loss;
    unread_.reset();
  }

  Session& session_;
  const Config& cfg_;
  std::unique_ptr<StepGraph> graph_;
  std::optional<StepStats> unread_;
  double last_loss_ = 0;
  int64_t step_ = 0;
};

// CUDA: the kernel sdpa runs for one layer's query, key and value as the
// model shapes them (MLA: the rope dims in q and k, v padded as far as the
// kernel needs, and how far).
std::string attention_backend(const Config& cfg, const at::Device& dev) {
  const ModelConfig& m = cfg.model;
  const int64_t hd = m.head_dim(), D = hd + (m.attention == AttentionKind::Mla ? m.dhR : 0);
  const auto opts = at::TensorOptions()
                        .dtype(m.model_dtype == ModelDtype::Bfloat16 ? at::kBFloat16 : at::kFloat)
                        .device(dev)
                        .requires_grad(true);
  const auto heads = [&](int64_t width) { return at::empty({1, m.n_head, cfg.data.T, width}, opts); };
  const at::Tensor q = heads(D);
  const int64_t width = D == hd ? D : value_width_for(q, q, heads(hd), m.dropout_rate);
  std::string name = attention_backend_for(q, q, heads(width));
  if (width != D) name += " (v " + std::to_string(width) + " of " + std::to_string(D) + " columns)";
  return name;
}

// The timed seconds, peak memory and every axis's communication, each the
// max over ranks (one host all-reduce, the same entries on every rank).
void reduce_over_ranks(BenchResult& r, Mesh& mesh, double secs, int64_t steps) {
  double a2a = 0;
  for (const auto& [op, s] : mesh.ep().seconds_by_op())
    if (op.rfind("all_to_all", 0) == 0) a2a += s;
  std::vector<std::pair<std::string, Communicator*>> axes = {
      {"dp", &mesh.dp()}, {"pp", &mesh.pp()}, {"tp", &mesh.tp()}, {"ep", &mesh.ep()}};
  if (mesh.shape().ep > 1) axes.emplace_back("expert_dp", &mesh.expert_dp());
  if (mesh.shape().cp > 1) axes.emplace_back("cp", &mesh.cp());
  std::vector<double> maxed = {secs, r.peak_memory_bytes, a2a};
  for (const auto& [axis, comm] : axes) maxed.push_back(static_cast<double>(comm->bytes_moved()));
  // By dtype: a fixed list, so every rank reduces the same entries.
  const std::vector<std::pair<std::string, std::string>> dtypes = {
      {"Float", "float32"}, {"BFloat16", "bfloat16"}, {"Half", "float16"},
      {"Double", "float64"}, {"Long", "int64"},        {"Int", "int32"}};
  for (const auto& [axis, comm] : axes)
    for (const auto& [c10_name, name] : dtypes) {
      const auto it = comm->bytes_by_dtype().find(c10_name);
      maxed.push_back(it == comm->bytes_by_dtype().end() ? 0.0 : static_cast<double>(it->second));
    }
  // Context parallelism's exchanges (wall time on CPU ranks, enqueue time on NCCL), last.
  double cpx = 0;
  for (const auto& [op, s] : mesh.cp().seconds_by_op()) cpx += s;
  maxed.push_back(cpx);
  at::Tensor t = at::tensor(maxed, at::kDouble);
  mesh.cpu_world().all_reduce(t, ReduceOp::Max);
  const double per_step = 1.0 / static_cast<double>(steps);
  r.seconds = t[0].item<double>();
  r.peak_memory_bytes = t[1].item<double>();
  r.all_to_all_seconds = t[2].item<double>();
  r.cp_exchange_seconds = t[t.size(0) - 1].item<double>();
  for (size_t i = 0; i < axes.size(); ++i)
    r.comm_bytes_per_step[axes[i].first] = t[static_cast<int64_t>(3 + i)].item<double>() * per_step;
  for (size_t i = 0; i < axes.size(); ++i) {
    std::map<std::string, double>& by = r.comm_bytes_by_dtype[axes[i].first];
    for (size_t k = 0; k < dtypes.size(); ++k) {
      const auto at = static_cast<int64_t>(3 + axes.size() + i * dtypes.size() + k);
      const double b = t[at].item<double>() * per_step;
      if (b > 0) by[dtypes[k].second] = b;
    }
  }
}

// profile_steps more steps under the profiler (after the timed ones, so
// their timing stays clean); each rank writes its trace into the folder.
void profile_steps(BenchResult& r, BenchSteps& steps, Session& session, const BenchOptions& opts, int rank,
                   bool cuda) {
  MT_CHECK(opts.profile_steps >= 1, "bench --profile-steps must be >= 1, got ", opts.profile_steps);
  fs::create_directories(opts.profile_dir);
  char file[32];
  std::snprintf(file, sizeof file, "trace_rank_%05d.json", rank);
  session.mesh().cpu_world().barrier();
  StepProfiler profiler(cuda);
  const auto p0 = std::chrono::steady_clock::now();
  steps.run(opts.profile_steps);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
  r.profile = profiler.stop(opts.profile_steps, wall, (fs::path(opts.profile_dir) / file).string(), opts.profile_top);
  r.profiled = true;
}

}  // namespace

BenchResult run_bench(const Config& cfg_in, Runtime& runtime, const BenchOptions& opts) {
  MT_CHECK(opts.steps >= 1, "bench --steps must be >= 1, got ", opts.steps);
  MT_CHECK(opts.warmup >= 0, "bench --warmup must be >= 0, got ", opts.warmup);
  TempDir tmp;
  Config cfg = cfg_in;
  cfg.output_dir = tmp.path();
  cfg.name = "bench";
  // No loop runs, so nothing is ever evaluated or saved; the step count only
  // keeps the config valid and the schedule's lr meaningful.
  cfg.training_steps = std::max<int64_t>(cfg.training_steps, opts.warmup + opts.steps);
  SessionOptions so;
  so.fresh = true;
  Session session(cfg, runtime, so);
  ParallelModel& pm = session.model();
  const at::Device dev = pm.params.empty() ? at::Device(at::kCPU) : pm.params.front().tensor.device();

  BenchSteps steps(session, cfg);
  BenchResult r;
  // Which path each fused operator took: over the timed steps, or with a
  // graph over every step that ran the host's code (a replay runs none).
  std::optional<PathCounter> paths;
  if (steps.graphed()) paths.emplace();
  steps.run(steps.warmup(opts.warmup));
  session.mesh().cpu_world().barrier();
  session.mesh().reset_bytes();  // and the per-op timers: only the timed steps count
  if (!paths) paths.emplace();
  const auto t0 = std::chrono::steady_clock::now();
  steps.run(opts.steps);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.paths = paths->counts();
  paths.reset();
  r.cuda_graphs = steps.graph_mode();

  r.device = device_name(dev);
  r.fused_kernels = dev.is_cuda() ? ops::have_cuda_kernels() : true;
  if (dev.is_cuda()) r.attention_backend = attention_backend(cfg, dev);
  r.peak_memory_bytes = peak_memory(dev, r.peak_memory_kind);
  reduce_over_ranks(r, session.mesh(), secs, opts.steps);
  r.expert_parallel = cfg.device.expert_parallel;
  r.context_parallel = cfg.device.cp();
  if (!opts.profile_dir.empty()) profile_steps(r, steps, session, opts, runtime.rank(), dev.is_cuda());

  r.world = cfg.device.world();
  r.steps = opts.steps;
  r.tokens_per_step = cfg.data.train_batch_size * cfg.grad_step * cfg.data.T;
  r.tokens_per_sec = static_cast<double>(r.tokens_per_step * r.steps) / r.seconds;
  r.flops_per_token = flops_per_token(cfg.model);
  r.tflops_per_device = r.flops_per_token * r.tokens_per_sec / static_cast<double>(r.world) / 1e12;
  r.peak_tflops = opts.peak_tflops > 0 ? opts.peak_tflops : peak_tflops_for(r.device);
  if (r.peak_tflops > 0) r.mfu = r.tflops_per_device / r.peak_tflops;
  r.last_loss = steps.last_loss();
  return r;
}

std::string to_string(const BenchResult& r) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(2);
  o << "bench: " << r.steps << " steps on " << r.world << " x " << r.device << " in " << r.seconds << " s, "
    << r.tokens_per_step << " tokens per step\n";
  o << "  tokens/s           " << r.tokens_per_sec << "\n";
  o.precision(4);
  o << "  TFLOP/s per device " << r.tflops_per_device << " (" << r.flops_per_token << " FLOPs per token)\n";
  if (r.mfu >= 0) {
    o << "  MFU                " << 100 * r.mfu << " % of " << r.peak_tflops << " TFLOP/s\n";
  } else {
    o << "  MFU                unknown (no peak for " << r.device << "; pass --peak-tflops)\n";
  }
  if (r.context_parallel > 1)
    o << "  cp exchange        " << r.cp_exchange_seconds << " s, " << 100 * r.cp_exchange_share()
      << " % of the step time (context_parallel " << r.context_parallel << ", slowest rank)\n";
  if (r.expert_parallel > 1)
    o << "  all-to-all         " << r.all_to_all_seconds << " s, " << 100 * r.all_to_all_share()
      << " % of the step time (expert_parallel " << r.expert_parallel << ", slowest rank)\n";
  o.precision(1);
  o << "  peak memory        " << r.peak_memory_bytes / (1024.0 * 1024.0) << " MiB (" << r.peak_memory_kind
    << ", max over ranks)\n";
  o << "  comm bytes/step   ";
  for (const auto& [axis, b] : r.comm_bytes_per_step) o << " " << axis << " " << b / (1024.0 * 1024.0) << " MiB";
  o << " (payload per rank, max over ranks)\n";
  for (const auto& [axis, by] : r.comm_bytes_by_dtype) {
    if (by.empty()) continue;
    o << "    " << axis << " by dtype:";
    for (const auto& [dtype, b] : by) o << " " << dtype << " " << b / (1024.0 * 1024.0) << " MiB";
    o << "\n";
  }
  const std::string paths = paths_text(r.paths);
  if (!paths.empty()) o << "  fused operator paths (calls in the timed steps, this rank):\n" << paths;
  if (!r.fused_kernels) o << "  fused kernels      aten composites (this CUDA build has no nvcc kernels)\n";
  if (!r.cuda_graphs.empty()) o << "  cuda_graphs        the timed steps were " << r.cuda_graphs << "\n";
  if (r.profiled) o << to_string(r.profile);
  return o.str();
}

std::string to_json(const BenchResult& r) {
  nlohmann::json j;
  j["device"] = r.device;
  if (!r.attention_backend.empty()) j["attention_backend"] = r.attention_backend;
  j["world"] = r.world;
  j["steps"] = r.steps;
  j["seconds"] = r.seconds;
  j["tokens_per_step"] = r.tokens_per_step;
  j["tokens_per_sec"] = r.tokens_per_sec;
  j["flops_per_token"] = r.flops_per_token;
  j["tflops_per_device"] = r.tflops_per_device;
  j["peak_tflops"] = r.peak_tflops > 0 ? nlohmann::json(r.peak_tflops) : nlohmann::json(nullptr);
  j["mfu"] = r.mfu >= 0 ? nlohmann::json(r.mfu) : nlohmann::json(nullptr);
  j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["peak_memory_kind"] = r.peak_memory_kind;
  j["comm_bytes"] = r.comm_bytes_per_step;
  j["comm_dtypes"] = r.comm_bytes_by_dtype;
  j["paths"] = paths_json(r.paths);
  if (!r.cuda_graphs.empty()) j["cuda_graphs"] = r.cuda_graphs;
  j["fused_kernels"] = r.fused_kernels;
  if (r.profiled) j["profile"] = to_json(r.profile);
  j["last_loss"] = r.last_loss;
  j["expert_parallel"] = r.expert_parallel;
  j["all_to_all_seconds"] = r.all_to_all_seconds;
  j["all_to_all_share"] = r.all_to_all_share();
  if (r.context_parallel > 1) {
    j["context_parallel"] = r.context_parallel;
    j["cp_exchange_seconds"] = r.cp_exchange_seconds;
    j["cp_exchange_share"] = r.cp_exchange_share();
  }
  return j.dump();
}

}  // namespace meshtrain
