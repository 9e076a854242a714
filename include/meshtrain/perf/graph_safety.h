#pragma once
// Whether a training step can be captured as a CUDA graph and replayed
// (device_config.cuda_graphs), checked on any device by running it. A graph
// replays one step's kernels with the addresses and sizes of its capture, so
// a step may neither read device memory on the host (a sync is illegal while
// capturing, and a decision the host made from device data would be frozen
// into every replay) nor allocate otherwise than the step before it (the
// capture's memory pool replays one allocation pattern). The CPU runs the
// same check (train/step_graph.h), so the CPU tests guard what a GPU captures.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain {

// What one step did that a graph cares about.
struct StepFootprint {
  int64_t host_reads = 0;
  std::vector<std::string> host_read_ops;  // operator names, once each, in order of first read
  std::vector<int64_t> allocations;        // bytes of each allocation, in order
};

// Records a step's footprint on `device` from construction to finish(), on
// this thread and the autograd threads its backward passes run on.
class StepFootprintRecorder {
 public:
  explicit StepFootprintRecorder(at::Device device);
  ~StepFootprintRecorder();
  StepFootprintRecorder(const StepFootprintRecorder&) = delete;
  StepFootprintRecorder& operator=(const StepFootprintRecorder&) = delete;
  StepFootprint finish();

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// Empty when a step with footprint `next` replays in a graph captured from
// one like `prev`; else why not, in words that name the operator or the
// allocation.
std::string graph_unsafe_reason(const StepFootprint& prev, const StepFootprint& next);

}  // namespace meshtrain
