#pragma once
// Where meshtrain may read and write: the guards prepare-data, checkpoint
// export and the config loader share so that nothing meshtrain did not make
// is ever replaced (docs/ARCHITECTURE.md, "Files").
//
// Identity: a folder is meshtrain's when its manifest.json carries a
// "format" of meshtrain's ("meshtrain-data" for prepare-data's output,
// "meshtrain-checkpoint" for a checkpoint step). Every manifest meshtrain
// ever wrote carries one, so an unmarked manifest is another tool's.
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace meshtrain {

// "" when path is a regular file (symlinks followed), else what it is:
// "missing", "a directory", "a FIFO (named pipe)", "a character device",
// "a block device", "a socket", "not a regular file".
std::string non_regular_kind(const std::string& path);

// Throws "<what> <path> is a FIFO (named pipe), not a regular file ..." unless
// path is a regular file: reading a FIFO or /dev/zero would block or never end.
void require_regular_file(const std::string& path, const std::string& what);

// Creates folder (and its parents) if needed; throws naming `what`, the path
// and why when it cannot be a writable folder (e.g. a file is in the way).
// Runs check this at start-up rather than at their first save.
void require_writable_folder(const std::string& folder, const std::string& what);

// Whether a is b or lies inside b, symlinks resolved (neither need exist).
bool is_same_or_inside(const std::string& a, const std::string& b);

// The "format" of dir/manifest.json: "" when there is none, "unmarked" when it
// has no string "format" (or is not JSON), else the value.
std::string manifest_format(const std::string& dir);

// What a meshtrain format is, in words ("a meshtrain dataset"); "" for other formats.
std::string meshtrain_format_name(const std::string& format);

// The nearest folder at or above path (path itself only when include_self)
// whose manifest.json carries a meshtrain format; "" when there is none.
std::string enclosing_meshtrain_folder(const std::string& path, bool include_self);

// Whether a process with this pid exists on this host.
bool process_alive(long pid);

// Leftovers of killed runs beside final_path: entries named
// "<final name>.tmp-<pid>" whose pid is no live process on this host and that
// `ours` recognises as this command's staging. Removes them and returns their
// paths (callers log them). A live pid's staging is another run's: untouched.
std::vector<std::string> remove_dead_staging(const std::filesystem::path& final_path,
                                             const std::function<bool(const std::filesystem::path&)>& ours);

}  // namespace meshtrain
