#pragma once
// Reads the next training batch on a background thread while the current
// one trains (one batch ahead), into pinned memory on CUDA so the trainer's
// .to(device, non_blocking) copy is asynchronous.
//
// The prefetcher reads from its own copy of the loader; the loader it was
// given is moved past a batch only when that batch is handed out. So the
// loader's cursor is always the position after the batches consumed, never
// after the one prefetched: a checkpoint saves it as it is, and a restore()
// of the loader (a resume) simply makes the prefetched batch stale. A
// prefetched batch is used only when it was read from the loader's current
// cursor with the size now asked for; otherwise the batch is read again,
// synchronously. Batches are therefore exactly those of loader.next(n).
#include <cstdint>
#include <future>

#include "meshtrain/data/loader.h"

namespace meshtrain {

class BatchPrefetcher {
 public:
  // pin: stage batches in page-locked memory (only where CUDA is present:
  // pinning needs the CUDA host allocator).
  BatchPrefetcher(DataLoader& loader, bool pin);
  // Waits for a read in flight (its errors are dropped: nobody asked for it).
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // What loader.next(global_batch) returns, advancing the loader the same
  // way; then starts reading the batch of `following` sequences (the next
  // round's size, optim/rampup.h round_batch_at; 0: none) in the background.
  Batch next(int64_t global_batch, int64_t following);

  // Batches handed out that had been read ahead (tests).
  int64_t hits() const { return hits_; }

 private:
  struct Ahead {
    Cursor from, after;  // the loader positions before and after the batch
    int64_t size = 0;
    Batch batch;
  };
  Batch pinned(Batch b) const;

  DataLoader& loader_;
  DataLoader ahead_;  // the background thread's copy, used only while a read is in flight
  bool pin_;
  std::future<Ahead> pending_;
  int64_t hits_ = 0;
};

}  // namespace meshtrain
