#pragma once
// `meshtrain train --init-from-hf DIR`: the weights of a Hugging Face Llama /
// DeepSeek-V3 directory copied into a built model, on any mesh (each rank
// reads the full tensors it owns and keeps its tp shard, as a checkpoint read).
#include <string>

#include "meshtrain/dist/mesh.h"
#include "meshtrain/parallel/parallelize.h"

namespace meshtrain {

// pm's config must be the one with_hf_model derived from dir (hf_dir.h).
void load_hf_weights(ParallelModel& pm, Mesh& mesh, const std::string& dir);

}  // namespace meshtrain
