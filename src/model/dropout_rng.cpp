// Per-call generator forks for dropout in tp-sharded regions; see
// meshtrain/model/dropout_rng.h.
#include "meshtrain/model/dropout_rng.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <mutex>

#include "meshtrain/core/splitmix.h"

namespace meshtrain {
at::Tensor with_forked_generator(const c10::Device& device, uint64_t salt, const std::function<at::Tensor()>& draw) {
  if (!device.is_cpu() && !device.is_cuda()) return draw();
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  uint64_t base = 0;
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    base = at::check_generator<at::CPUGeneratorImpl>(cpu)->random64();
  }
  at::Generator gen = device.is_cpu() ? cpu : at::globalContext().defaultGenerator(device);
  at::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    saved = gen.get_state();
    gen.set_current_seed(splitmix64(base ^ splitmix64(salt)));
  }
  // The default stream continues where it was, also when draw throws.
  struct Restore {
    at::Generator& gen;
    const at::Tensor& state;
    ~Restore() {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
  } restore{gen, saved};
  return draw();
}

}  // namespace meshtrain
