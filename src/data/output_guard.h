#pragma once
// Where prepare-data may write its output (docs/ARCHITECTURE.md, "Files"):
// never into its own inputs, never inside a meshtrain dataset or checkpoint,
// and it replaces a folder only when that folder is an earlier prepare-data
// output holding nothing but what the manifest lists.
#include <filesystem>
#include <string>
#include <vector>

namespace meshtrain::detail {

// The names prepare-data writes directly under its output folder.
bool is_prepare_entry(const std::string& name);

// Throws, naming the folder and why, when writing `out` could destroy
// something prepare-data did not make.
void check_prepare_output(const std::filesystem::path& out, const std::vector<std::string>& inputs);

// Removes OUT.tmp-PID folders of killed prepare-data runs (PID gone, only
// prepare-data's entries inside); returns their paths.
std::vector<std::string> remove_prepare_leftovers(const std::filesystem::path& out);

}  // namespace meshtrain::detail
