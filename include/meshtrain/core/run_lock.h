#pragma once
// One run per run directory: two trainings in one run dir would interleave
// their metrics and remove each other's staging dirs. An advisory lock
// (flock) on <run_dir>/run.lock is held for the life of the object; the file
// names the holder (host and pid) so that a refused run can say who has it.
// The kernel drops the lock when the holder dies, even by kill -9, so a stale
// file never blocks a resume.
#include <string>

namespace meshtrain {

class RunLock {
 public:
  // Creates run_dir if needed and takes the lock, or throws naming the holder.
  explicit RunLock(const std::string& run_dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace meshtrain
