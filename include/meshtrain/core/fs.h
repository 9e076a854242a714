#pragma once
// File-system helpers shared by the checkpointer and the run directory.
#include <cstdint>
#include <string>

namespace meshtrain {

// Removes path (recursively) and never throws: a failed deletion costs only
// disk space, so it is logged as a warning with `why` instead of failing work
// that is already complete.
void remove_quietly(const std::string& path, const std::string& why);

// Why a write failed, from its errno, with what to do: "No space left on
// device (the disk is full)", "File too large (the file-size limit, ulimit
// -f, is 1048576 bytes: raise it or save less)". A write past the file-size
// limit fails with EFBIG only because main ignores SIGXFSZ
// (core/stop_signal.h), which would otherwise kill the process unannounced.
std::string write_failure(int err);

// The process's file-size limit (RLIMIT_FSIZE, `ulimit -f`) in bytes; 0 when
// there is none.
int64_t file_size_limit();

}  // namespace meshtrain
