#pragma once
// Every rank writes its checkpoint shards into the run dir and rank 0 commits
// them there, so the run dir must be one folder seen by every host (an NFS or
// Lustre path mounted alike everywhere). A local path on several hosts gives
// each host its own folder, and the first checkpoint, a whole interval into
// training, fails with a missing file. Checked at start-up instead: rank 0
// writes a probe file with a random token and every rank must read it back.
#include <string>

#include "meshtrain/dist/comm.h"

namespace meshtrain {

// Collective over `world`. Throws on every rank, naming the hosts (and ranks)
// that cannot see rank 0's probe and saying the run dir needs shared storage;
// the probe is removed either way. Readers retry for a few seconds, so a
// network file system's attribute cache does not fail a shared folder.
void check_run_dir_shared(const std::string& run_dir, Communicator& world);

}  // namespace meshtrain
