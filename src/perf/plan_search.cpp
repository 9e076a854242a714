// `plan --search` (perf/plan_search.h): enumerate the meshes of N GPUs, keep
// those the config's rules accept and the memory model fits, rank them.
#include "meshtrain/perf/plan_search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>

#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"
#include "meshtrain/perf/plan.h"

namespace meshtrain {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i) d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

// Why a (tp, pp) family has no candidate: the first rule its meshes break
// (when none passes validation) or the least memory a valid one needs.
struct Family {
  bool fits = false, valid = false;
  std::string rule;
  double least_gib = std::numeric_limits<double>::infinity();
  std::string least;  // the mesh that needs least_gib
};

// One search's shared state.
struct Search {
  const Config& cfg;
  const SearchOptions& o;
  SearchResult& r;
  BubbleCache bubbles;
  double usable_bytes = 0;
};

// The first line of a refusal (validate's messages carry no stack, but be safe).
std::string first_line(const std::exception& e) {
  std::string s = e.what();
  if (const auto at = s.find('\n'); at != std::string::npos) s.resize(at);
  if (const auto at = s.find(" ["); at != std::string::npos && s.back() == ']') s.resize(at);  // MT_CHECK's [file:line]
  return s;
}

std::string describe(const Candidate& c) {
  std::ostringstream o;
  o << "dp " << c.dp << " cp " << c.cp << " ep " << c.ep << ", zero_stage " << c.zero_stage << ", "
    << choice_name(c.recompute) << " recomputation, micro_batch_size " << c.micro_batch_size;
  if (c.virtual_stages > 1) o << ", " << c.virtual_stages << " virtual stages";
  return o.str();
}

// Memory, then the estimate, of one candidate whose config validated. Returns
// whether it fits.
bool try_candidate(Search& s, Candidate c, Family& fam) {
  const Config cc = candidate_config(s.cfg, c);
  ++s.r.evaluated;
  const double bytes = plan_memory(cc, PlanDevice::Cuda).total_bytes();
  c.memory_gib = bytes / kGiB;
  if (bytes > s.usable_bytes) {
    ++s.r.too_big;
    if (c.memory_gib < fam.least_gib) {
      fam.least_gib = c.memory_gib;
      fam.least = describe(c);
    }
    return false;
  }
  c.estimate = estimate_step(cc, s.o.hardware, s.o.assumptions, &s.bubbles);
  fam.fits = true;
  s.r.candidates.push_back(c);
  return true;
}

// Validates a candidate's config; a refusal counts as invalid and is kept as
// the family's reason when no mesh of it validates.
bool validates(Search& s, const Candidate& c, Family& fam) {
  try {
    validate(candidate_config(s.cfg, c));
    fam.valid = true;
    return true;
  } catch (const std::exception& e) {
    ++s.r.invalid;
    if (fam.rule.empty()) fam.rule = first_line(e);
    return false;
  }
}

// The checkpointing modes from the least memory up, and microbatch sizes
// from the smallest up: once one does not fit, larger ones cannot.
void search_batches(Search& s, Candidate c, Family& fam) {
  const int64_t share = s.cfg.data.train_batch_size / c.dp;
  std::vector<ActivationCheckpointing> modes;
  for (auto m : {ActivationCheckpointing::Full, ActivationCheckpointing::Selective, ActivationCheckpointing::None})
    if (std::find(s.o.recompute.begin(), s.o.recompute.end(), m) != s.o.recompute.end()) modes.push_back(m);
  for (ActivationCheckpointing mode : modes) {
    c.recompute = mode;
    bool tried = false, smallest_too_big = false;
    for (int64_t mbs : divisors(share)) {
      c.micro_batch_size = mbs;
      if (!validates(s, c, fam)) continue;
      const bool fits = try_candidate(s, c, fam);
      smallest_too_big = smallest_too_big || (!tried && !fits);
      tried = true;
      if (!fits) break;
    }
    // Keeping more activations cannot fit where recomputing them did not.
    if (smallest_too_big) break;
  }
}

void search_mesh(Search& s, Candidate c, Family& fam) {
  const ModelConfig& m = s.cfg.model;
  const int64_t replicas = c.dp * c.cp;
  std::vector<int64_t> eps{1};
  if (m.ffn == FfnKind::Moe)
    for (int64_t ep : divisors(replicas))
      if (ep > 1 && m.n_experts % ep == 0) eps.push_back(ep);
  std::vector<int64_t> vs{1};
  if (c.pp > 1 && m.n_layers() % c.pp == 0)
    for (int64_t v : divisors(m.n_layers() / c.pp))
      if (v > 1 && v <= s.o.max_virtual_stages) vs.push_back(v);
  for (int64_t ep : eps)
    for (int64_t zero : s.o.zero_stages) {
      if (zero > 0 && replicas == 1) continue;  // nothing to shard: runs as zero_stage 0
      for (int64_t v : vs) {
        c.ep = ep;
        c.zero_stage = zero;
        c.virtual_stages = v;
        search_batches(s, c, fam);
      }
    }
}

// A (tp, pp) family: every cp (and so dp) of it whose mesh-level rules hold,
// with sequence parallelism where T allows it.
void search_family(Search& s, int64_t tp, int64_t pp, Family& fam) {
  const int64_t rest = s.o.gpus / tp / pp;
  for (int64_t cp : divisors(rest)) {
    Candidate c;
    c.tp = tp;
    c.pp = pp;
    c.cp = cp;
    c.dp = rest / cp;
    c.micro_batch_size = 0;  // the mesh's own rules first; each size is checked below
    bool ok = false;
    for (bool sp : {tp > 1, false}) {
      c.sequence_parallel = sp;
      if ((ok = validates(s, c, fam))) break;
      if (!sp) break;
    }
    if (ok) search_mesh(s, c, fam);
  }
}

std::string family_reason(const Search& s, const Family& f) {
  std::ostringstream o;
  o.precision(3);
  if (!f.valid) return f.rule;
  o << "needs at least " << f.least_gib << " GiB a rank (" << f.least << "), " << s.usable_bytes / kGiB
    << " GiB usable";
  return o.str();
}

}  // namespace

Config candidate_config(const Config& cfg, const Candidate& c) {
  Config x = cfg;
  x.device.n_device_axis = {c.dp, c.pp, c.tp};
  x.device.context_parallel = c.cp;
  x.device.expert_parallel = c.ep;
  x.zero_stage = c.zero_stage;
  if (c.zero_stage < 2) x.fsdp_keep_gathered = false;
  x.virtual_stages = c.virtual_stages;
  if (c.pp > 1) x.pipeline_schedule = c.virtual_stages > 1 ? PipelineSchedule::Interleaved : PipelineSchedule::OneFOneB;
  x.data.micro_batch_size = c.micro_batch_size;
  x.activation_checkpointing = c.recompute;
  x.sequence_parallel = c.sequence_parallel;
  return x;
}

SearchResult search_meshes(const Config& cfg, const SearchOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t g = o.hardware.gpus_per_node;
  MT_CHECK(o.gpus >= 1, "plan --search: --gpus must be >= 1, got ", o.gpus);
  MT_CHECK(g >= 1, "plan --gpus-per-node must be >= 1, got ", g);
  MT_CHECK(o.gpus % g == 0, "plan --search: --gpus ", o.gpus, " is not a multiple of --gpus-per-node ", g,
           " (whole nodes only: give --gpus-per-node ", o.gpus, " for a part of one node)");
  MT_CHECK(!o.zero_stages.empty() && !o.recompute.empty(), "plan --search: --zero-stages and --recompute must "
           "each name at least one value");
  SearchResult r;
  Search s{cfg, o, r, {}, o.hardware.memory_gib * kGiB * o.assumptions.usable_memory};
  for (int64_t tp : divisors(o.gpus))
    for (int64_t pp : divisors(o.gpus / tp)) {
      Family fam;
      if (tp > g && !o.tp_across_nodes) {
        fam.rule = "tp " + std::to_string(tp) + " spans nodes of " + std::to_string(g) +
                   " GPUs (tp stays on NVLink; --tp-across-nodes allows it)";
      } else if (pp > cfg.model.n_layers()) {
        fam.rule = "pp " + std::to_string(pp) + " exceeds the model's " + std::to_string(cfg.model.n_layers()) +
                   " layers";
      } else {
        search_family(s, tp, pp, fam);
      }
      if (!fam.fits) r.rejected.push_back({tp, pp, family_reason(s, fam)});
    }
  std::stable_sort(r.candidates.begin(), r.candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.estimate.tokens_per_sec != b.estimate.tokens_per_sec)
      return a.estimate.tokens_per_sec > b.estimate.tokens_per_sec;
    return a.memory_gib < b.memory_gib;
  });
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace meshtrain
