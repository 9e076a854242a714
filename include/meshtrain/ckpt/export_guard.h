#pragma once
// Where `checkpoint export` may write (docs/ARCHITECTURE.md, "Files"): never
// the checkpoint it reads nor anything inside it, never inside a meshtrain
// dataset (the tokenizer's, say) or checkpoint, never over a file it reads,
// and over an existing file only when it is an earlier meshtrain export. Leftovers of
// killed exports (OUT.tmp-PID) are removed by the next export to OUT.
#include <string>
#include <vector>

namespace meshtrain {

// Throws, naming --output and why, unless writing `out` is safe. dir_output:
// --format hf, whose output is a folder (new or empty); else one file.
// `reads`: other files the export reads (the tokenizer).
void check_export_output(const std::string& ckpt_dir, const std::string& out, bool dir_output,
                         const std::vector<std::string>& reads = {});

// A safetensors file whose metadata says meshtrain exported it (meshtrain_step).
bool is_meshtrain_export(const std::string& path);

// Removes OUT.tmp-PID leftovers of killed exports (PID gone, content an
// export's) and an older build's OUT.tmp export file; returns their paths.
std::vector<std::string> remove_export_leftovers(const std::string& out, bool dir_output);

}  // namespace meshtrain
