#pragma once
// Time a pipeline stage spends blocked on a neighbour (the bubble metric,
// RoundSums::wait_seconds). On the CPU the MPI call blocks the host, so the
// host's wall-clock measures it. On CUDA the NCCL call only enqueues and the
// stream does the waiting (the host's time reads ~0), so events are recorded
// on the current stream around each transfer and their elapsed times summed
// when the round ends: one wait for the round's last event, which the
// stream reaches just before the round's end. The zero-bubble executor times
// its forward, B and W passes with the same clocks.
#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <chrono>
#include <optional>
#include <vector>

namespace meshtrain {

class WaitClock {
 public:
  explicit WaitClock(const at::Device& device);
  at::Device device() const { return cuda_ ? *cuda_ : at::Device(at::kCPU); }
  void begin();
  void end();
  // Seconds between every begin() and its end(); on CUDA waits for the last end().
  double seconds() const;

 private:
  std::optional<at::Device> cuda_;
  std::chrono::steady_clock::time_point t0_;
  double host_seconds_ = 0;
  std::vector<c10::Event> events_;  // CUDA: begin, end, begin, end, ...
};

}  // namespace meshtrain
