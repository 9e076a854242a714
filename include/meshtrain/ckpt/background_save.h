#pragma once
// A checkpoint save whose file writing runs on a thread of its own
// (async_checkpoint), so training goes on while the shards are written,
// fsync'ed and checksummed. The save is the synchronous one cut in three
// (ckpt/checkpoint_steps.h): the training thread stages it (collective) and
// hands a snapshot of the tensors to a BackgroundSave; its thread runs
// try_write_rank_shards, exactly what a synchronous save runs; the training
// thread later commits it (collective: manifest, rename, `latest`) once every
// rank's thread is done. No collective ever runs on the writer thread.
//
// A kill -9 while the thread writes leaves a staging dir (step_X.tmp-*) that
// no resume reads and the next commit removes: the previous checkpoint stays
// the newest.
#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/ckpt/checkpoint_steps.h"

namespace meshtrain {

// Makes every tensor a rank writes its own: a tensor another object still
// refers to (on CPU a parameter or a moment the optimizer updates in place)
// is cloned; one only `tensors` refers to (a host copy made for the save, a
// pinned copy from the GPU) is kept as it is. Returns the bytes cloned.
int64_t own_tensors(std::vector<NamedTensor>& tensors);

class BackgroundSave {
 public:
  struct Job {
    std::string staging_dir;  // from stage_checkpoint
    int64_t step = 0;
    int rank = 0;
    std::vector<NamedTensor> tensors;  // owned (own_tensors): nothing else writes them
    nlohmann::json trainer_state;      // for the commit
    // A test hook (MESHTRAIN_TEST_CKPT_WRITE_DELAY, train/test_hooks.h): the
    // thread sleeps this long before writing, so tests can stop or kill a run
    // while a save is in flight, and training changes the live tensors first.
    double delay_seconds = 0;
  };

  explicit BackgroundSave(Job job);  // starts the writer thread
  // Joins the thread (an error path: the save stays uncommitted, a staging dir).
  ~BackgroundSave();
  BackgroundSave(const BackgroundSave&) = delete;
  BackgroundSave& operator=(const BackgroundSave&) = delete;

  // Whether the thread is done (its record is final); never blocks.
  bool written() const { return done_.load(std::memory_order_acquire); }
  // Waits for the thread; returns this rank's record (an error in it when the write failed).
  const RankShards& wait();

  const Job& job() const { return job_; }

 private:
  Job job_;
  RankShards record_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace meshtrain
