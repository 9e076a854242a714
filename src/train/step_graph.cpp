// The captured training step (see step_graph.h).
#include "meshtrain/train/step_graph.h"

#include <torch/torch.h>

#include <optional>

#ifdef MESHTRAIN_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "meshtrain/core/check.h"
#include "meshtrain/core/log.h"
#include "meshtrain/perf/graph_safety.h"

namespace meshtrain {

struct StepGraph::Impl {
  Session& s;
  int64_t steps = 0;  // run through this object
  std::string mode = "eager";
  at::Tensor lr;  // 0-dim fp32 on the device: the learning rate AdamW reads
  StepFootprint prev;
#ifdef MESHTRAIN_CUDA
  std::optional<c10::cuda::CUDAStream> stream;  // every step's, on a GPU
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  StepBatches inputs;  // the graph's: later batches are copied in
  StepStats captured;  // the graph's statistics, rewritten by each replay
#endif

  explicit Impl(Session& session) : s(session) {
    lr = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(s.device()));
#ifdef MESHTRAIN_CUDA
    if (s.device().is_cuda()) stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, s.device().index());
#endif
  }

  StepStats device_step(const StepBatches& b, const std::function<void()>& after_update) {
    StepStats st = run_step(s, b);
    apply_update(s, st, LearningRate(lr));
    if (after_update) after_update();
    update_score_bias(s, st);  // on the device
    return st;
  }

  // An eager step whose footprint must match the one before (the first
  // checked step: only its host reads count).
  StepStats checked(const StepBatches& b, const std::function<void()>& after_update, bool first) {
    StepStats st;
    StepFootprint f;
    {
      StepFootprintRecorder recorder(s.device());
      st = device_step(b, after_update);
      f = recorder.finish();
    }
    const std::string why = graph_unsafe_reason(first ? f : prev, f);
    MT_CHECK(why.empty(), "device_config.cuda_graphs: step ", s.progress().step + 1,
             " cannot be captured as a CUDA graph: ", why, " (step ", steps,
             " of this process; set device_config.cuda_graphs false to train without)");
    prev = std::move(f);
    return st;
  }

  StepStats run(const StepBatches& b, const std::function<void()>& after_update) {
    const bool check = !s.device().is_meta();
    if (steps == 1 || !check) {
      mode = "eager";
      return device_step(b, after_update);
    }
    if (steps <= kGraphEagerSteps) {
      mode = "checked";
      StepStats st = checked(b, after_update, steps == 2);
      if (steps == kGraphEagerSteps && s.is_rank0())
        spdlog::info("cuda_graphs: steps 2 and {} were checked for graph safety{}", kGraphEagerSteps,
                     s.device().is_cuda() ? "; the next step is captured and replayed from then on"
                                          : " (a CPU has no graphs: the steps stay eager)");
      return st;
    }
#ifdef MESHTRAIN_CUDA
    if (s.device().is_cuda()) return graph ? replay(b) : capture(b);
#endif
    mode = "eager";
    return device_step(b, after_update);
  }

#ifdef MESHTRAIN_CUDA
  StepStats capture(const StepBatches& b) {
    mode = "captured";
    inputs = b;  // these buffers become the graph's inputs
    graph = std::make_unique<at::cuda::CUDAGraph>();
    // Thread-local: the data prefetcher's thread may pin host memory meanwhile.
    // The default CUDA generator (dropout) registers itself with the capture.
    graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      captured = device_step(inputs, {});
    } catch (const std::exception& e) {
      try {
        graph->capture_end();
      } catch (const std::exception&) {  // the capture is invalid anyway: the first error is the one to report
      }
      graph.reset();
      MT_FAIL("device_config.cuda_graphs: capturing step ", s.progress().step + 1, " failed: ", e.what());
    }
    graph->capture_end();
    graph->replay();  // capturing ran nothing: this is the step
    return captured;
  }

  StepStats replay(const StepBatches& b) {
    mode = "replayed";
    for (size_t r = 0; r < b.inputs.size(); ++r) {
      inputs.inputs[r].copy_(b.inputs[r], /*non_blocking=*/true);
      inputs.targets[r].copy_(b.targets[r], /*non_blocking=*/true);
    }
    graph->replay();
    return captured;  // a copy: its read state is its own
  }
#endif
};

StepGraph::StepGraph(Session& s) : impl_(std::make_unique<Impl>(s)) {
  MT_ASSERT(s.config().device.cuda_graphs, "StepGraph needs device_config.cuda_graphs");
  if (s.is_rank0())
    spdlog::info("cuda_graphs: steps 1-{} run eagerly (2-{} checked for graph safety), then {}", kGraphEagerSteps,
                 kGraphEagerSteps,
                 s.device().is_cuda() ? "one step is captured as a CUDA graph and replayed"
                                      : "eager still: this device has no graphs");
}

StepGraph::~StepGraph() = default;

const std::string& StepGraph::last_mode() const { return impl_->mode; }

StepStats StepGraph::step(double lr, const std::function<void()>& after_update) {
  Impl& g = *impl_;
  begin_step(g.s);
  ++g.steps;
#ifdef MESHTRAIN_CUDA
  if (g.stream) {
    // The step's own stream waits for the caller's work, and the caller's
    // for the step (evaluation and saving read what the step wrote).
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(g.s.device().index());
    at::cuda::CUDAEvent ready;
    ready.record(caller);
    ready.block(*g.stream);
    StepStats st;
    {
      const c10::cuda::CUDAStreamGuard guard(*g.stream);
      const StepBatches b = next_step_batches(g.s);
      g.lr.fill_(lr);
      st = g.run(b, after_update);
    }
    at::cuda::CUDAEvent done;
    done.record(*g.stream);
    done.block(caller);
    return st;
  }
#endif
  const StepBatches b = next_step_batches(g.s);
  g.lr.fill_(lr);
  return g.run(b, after_update);
}

}  // namespace meshtrain
