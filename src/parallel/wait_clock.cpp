#include "wait_clock.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include "meshtrain/core/check.h"

namespace meshtrain {

WaitClock::WaitClock(const at::Device& device) {
  if (device.is_cuda()) cuda_ = device;
}

void WaitClock::begin() {
  if (!cuda_) {
    t0_ = std::chrono::steady_clock::now();
    return;
  }
  // BACKEND_DEFAULT: a CUDA event with timing enabled (PyTorch's default has none).
  events_.emplace_back(cuda_->type(), c10::EventFlag::BACKEND_DEFAULT);
  events_.back().record(c10::impl::VirtualGuardImpl(cuda_->type()).getStream(*cuda_));
}

void WaitClock::end() {
  if (!cuda_) {
    host_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    return;
  }
  MT_ASSERT(events_.size() % 2 == 1, "WaitClock::end() without begin()");
  events_.emplace_back(cuda_->type(), c10::EventFlag::BACKEND_DEFAULT);
  events_.back().record(c10::impl::VirtualGuardImpl(cuda_->type()).getStream(*cuda_));
}

double WaitClock::seconds() const {
  if (!cuda_ || events_.empty()) return host_seconds_;
  events_.back().synchronize();  // the stream records events in order: all are done
  double ms = 0;
  for (size_t i = 0; i + 1 < events_.size(); i += 2) ms += events_[i].elapsedTime(events_[i + 1]);
  return ms / 1000.0;
}

}  // namespace meshtrain
