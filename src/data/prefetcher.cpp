#include "meshtrain/data/prefetcher.h"

#include <torch/torch.h>

#include <utility>

namespace meshtrain {

BatchPrefetcher::BatchPrefetcher(DataLoader& loader, bool pin) : loader_(loader), ahead_(loader), pin_(pin) {}

BatchPrefetcher::~BatchPrefetcher() {
  if (!pending_.valid()) return;
  try {
    pending_.get();
  } catch (...) {  // a read nobody consumed; the error is not this destructor's to raise
  }
}

Batch BatchPrefetcher::pinned(Batch b) const {
  if (!pin_) return b;
  return {b.inputs.pin_memory(), b.targets.pin_memory()};
}

Batch BatchPrefetcher::next(int64_t global_batch, int64_t following) {
  Batch batch;
  bool hit = false;
  if (pending_.valid()) {
    // A read error surfaces here, when its batch is asked for.
    Ahead a = pending_.get();
    if (a.size == global_batch && a.from == loader_.cursor()) {
      loader_.restore(a.after);
      batch = std::move(a.batch);
      hit = true;
      ++hits_;
    }
  }
  if (!hit) batch = pinned(loader_.next(global_batch));
  if (following > 0) {
    // The copy starts where the loader now stands; the thread alone touches
    // it until the next get().
    ahead_.restore(loader_.cursor());
    pending_ = std::async(std::launch::async, [this, following] {
      Ahead a;
      a.from = ahead_.cursor();
      a.size = following;
      a.batch = pinned(ahead_.next(following));
      a.after = ahead_.cursor();
      return a;
    });
  }
  return batch;
}

}  // namespace meshtrain
