#pragma once
// `meshtrain plan --search --gpus N`: every mesh of N GPUs a config can run
// on -- dp x pp x tp x cp, expert parallelism inside dp, zero_stage,
// virtual stages, micro_batch_size, activation checkpointing -- that the
// config's own rules accept (config/load.h validate(), run on each
// candidate's config) and that fits the device memory (plan_memory, plan.h,
// within StepAssumptions::usable_memory), ranked by the step model's tokens/s
// (perf/step_model.h). tp stays inside a node unless asked; sequence
// parallelism is on whenever tp > 1 and T allows it (it moves the same bytes
// and keeps less); a pipeline of one chunk a rank runs 1f1b, of more the
// interleaved schedule. Families (tp x pp) with no candidate are listed
// with the reason: the rule every mesh of them breaks, or the least memory
// any of them needs.
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/perf/step_model.h"

namespace meshtrain {

struct SearchOptions {
  int64_t gpus = 0;
  Hardware hardware;
  StepAssumptions assumptions;
  std::vector<int64_t> zero_stages{0, 1, 2, 3};
  std::vector<ActivationCheckpointing> recompute{ActivationCheckpointing::None, ActivationCheckpointing::Selective,
                                                 ActivationCheckpointing::Full};
  int64_t max_virtual_stages = 8;
  bool tp_across_nodes = false;
};

struct Candidate {
  int64_t dp = 1, pp = 1, tp = 1, cp = 1, ep = 1, zero_stage = 0, virtual_stages = 1, micro_batch_size = 1;
  ActivationCheckpointing recompute = ActivationCheckpointing::None;
  bool sequence_parallel = false;
  double memory_gib = 0;  // the most loaded rank (plan_memory)
  StepEstimate estimate;
};

struct RejectedFamily {
  int64_t tp = 1, pp = 1;
  std::string why;
};

struct SearchResult {
  std::vector<Candidate> candidates;     // every mesh that fits, best first
  std::vector<RejectedFamily> rejected;  // tp x pp families with none, by tp then pp
  int64_t evaluated = 0, invalid = 0, too_big = 0;
  double seconds = 0;                    // the search's wall time
};

// Refuses (naming the flag) N < 1, N not a multiple of the GPUs a node, an
// empty list of zero stages or recomputation modes. A search that finds
// nothing returns no candidates; the caller refuses it with the families.
SearchResult search_meshes(const Config& cfg, const SearchOptions& o);

// The config a candidate runs: cfg with its mesh, schedule and keys set.
Config candidate_config(const Config& cfg, const Candidate& c);

// The ranked table (top `top` rows), the smallest pp that fits at each tp,
// the rejected families and every assumption, as text; or everything as one
// JSON object whose `candidates` lists all of them, best first.
std::string search_text(const Config& cfg, const SearchOptions& o, const SearchResult& r, int64_t top);
std::string search_json(const Config& cfg, const SearchOptions& o, const SearchResult& r);

// One estimate as a JSON object's text (tokens/s, MFU, the step's parts, links).
std::string estimate_json(const StepEstimate& e, const Hardware& hw, const StepAssumptions& a);

}  // namespace meshtrain
