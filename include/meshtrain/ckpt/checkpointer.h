#pragma once
// The checkpointer loops over the run's components (ckpt/stateful.h): a save
// asks each for its state and writes one checkpoint; a resume picks the newest
// checkpoint that is complete, verifies its checksums, lets the caller refuse
// it (a changed model), and has every component restore itself on every rank.
//
// What is never lost: a checkpoint that cannot be read (corrupt, incomplete)
// is skipped with a warning, and it is never deleted or overwritten by later
// saves of this run; when checkpoints exist but none can be read, the run
// refuses to start instead of silently starting over.
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/ckpt/background_save.h"
#include "meshtrain/ckpt/stateful.h"
#include "meshtrain/dist/comm.h"

namespace meshtrain {

class Checkpointer {
 public:
  // Called with a candidate's trainer state before any component loads it;
  // throwing refuses the checkpoint and stops the run (no fallback: the user
  // asked for something the checkpoint cannot give, e.g. another model).
  using Check = std::function<void(const std::string& dir, const nlohmann::json& trainer_state)>;

  Checkpointer(std::string run_dir, Communicator& world, int64_t max_to_keep);
  // A save still in flight is waited for (joined), not committed: destruction
  // is an error path, where a collective could wait on a rank that is gone.
  ~Checkpointer();

  // Components save and load in the order they were added; names are the
  // tensor prefixes and the keys of trainer_state.json's "components".
  void add(const std::string& name, Stateful& component);

  // Every component's state as checkpoint `step`; `header` (step, config, ...)
  // goes into trainer_state.json beside the components' values. Collective.
  void save(int64_t step, nlohmann::json header);

  // The same save in the background (ckpt/background_save.h): the state is
  // gathered (collective) and made this save's own now, the staging dir made,
  // and a thread writes this rank's shards; commit_if_written or
  // finish_background commits it. A save already in flight is finished first
  // (at most one in flight). Collective. delay_seconds: a test hook.
  void start_background(int64_t step, nlohmann::json header, double delay_seconds = 0);
  // The step of the save in flight, or -1.
  int64_t in_flight_step() const { return background_ ? background_->job().step : -1; }
  // When every rank's writer is done, commits the save in flight and returns
  // true; otherwise returns false at once. Collective (one small all-reduce)
  // when a save is in flight, nothing otherwise: every rank must call it at
  // the same points.
  bool commit_if_written();
  // Waits for this rank's writer, then commits. Collective; nothing when no
  // save is in flight. Throws on every rank when any rank's write failed.
  void finish_background();

  // Loads checkpoint `dir` (verified first) on every rank; throws on any
  // problem. Returns its trainer state. Collective.
  nlohmann::json load(const std::string& dir, const Check& check);

  // Loads the newest checkpoint of the run dir (by step, whatever `latest`
  // says) that verifies and that every component loads on every rank; older
  // ones are tried in turn. nullopt when the run has no checkpoint; throws when
  // it has some but none loads (say --fresh to start over). Collective.
  std::optional<std::pair<std::string, nlohmann::json>> load_newest(const Check& check);

  // Checkpoints this run found unreadable: kept out of pruning and re-saves.
  const std::vector<std::string>& unreadable() const { return unreadable_; }
  // Marks every checkpoint already in the run dir that fails to verify as
  // unreadable (for --fresh runs, which load nothing but must not destroy them).
  void protect_unreadable();

 private:
  // Every component's tensors (prefixed with its name) and, into header, its values. Collective.
  std::vector<NamedTensor> gather_state(nlohmann::json& header);
  void committed(int64_t step);
  // Empty when dir loaded on every rank, else this rank's reason (or that another rank failed).
  std::string try_load(const std::string& dir, const Check& check, nlohmann::json& state);

  std::string run_dir_;
  Communicator& world_;
  int64_t max_to_keep_;
  std::vector<std::pair<std::string, Stateful*>> components_;
  std::vector<std::string> unreadable_;  // checkpoint directory names (step_XXXXXXXX)
  std::unique_ptr<BackgroundSave> background_;  // the save in flight, if any
};

}  // namespace meshtrain
