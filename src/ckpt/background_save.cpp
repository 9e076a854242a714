#include "meshtrain/ckpt/background_save.h"

#include <torch/torch.h>

#include <chrono>

#include "meshtrain/core/log.h"

namespace meshtrain {

int64_t own_tensors(std::vector<NamedTensor>& tensors) {
  int64_t cloned = 0;
  for (auto& t : tensors) {
    if (!t.write || !t.tensor.defined()) continue;
    // One handle and one storage user: ours alone, nobody can write it.
    const bool sole = t.tensor.use_count() == 1 && t.tensor.storage().use_count() == 1;
    if (sole) continue;
    t.tensor = t.tensor.detach().clone(at::MemoryFormat::Contiguous);
    cloned += static_cast<int64_t>(t.tensor.nbytes());
  }
  return cloned;
}

BackgroundSave::BackgroundSave(Job job) : job_(std::move(job)) {
  thread_ = std::thread([this] {
    // Before writing: training changes the live tensors meanwhile, so a
    // snapshot that aliased them would be caught (tests/dist/async_ckpt_test.cpp).
    if (job_.delay_seconds > 0) {
      spdlog::warn("test hook: the background write of checkpoint step {} sleeps {} s", job_.step, job_.delay_seconds);
      std::this_thread::sleep_for(std::chrono::duration<double>(job_.delay_seconds));
    }
    record_ = try_write_rank_shards(job_.staging_dir, job_.rank, job_.tensors);
    job_.tensors.clear();  // the host copies are no longer needed
    done_.store(true, std::memory_order_release);
  });
}

BackgroundSave::~BackgroundSave() {
  if (thread_.joinable()) thread_.join();
}

const RankShards& BackgroundSave::wait() {
  if (thread_.joinable()) thread_.join();
  return record_;
}

}  // namespace meshtrain
