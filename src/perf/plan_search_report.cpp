// What `plan --search` and `plan` with hardware flags print (plan_search.h).
#include <algorithm>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "meshtrain/model/transformer.h"
#include "meshtrain/perf/plan_search.h"

namespace meshtrain {

namespace {

nlohmann::json parts_json(const StepParts& p) {
  return {{"compute_s", p.compute}, {"tp_s", p.tp},     {"cp_s", p.cp}, {"ep_s", p.ep},
          {"fsdp_s", p.fsdp},       {"bubble_s", p.bubble}, {"pp_s", p.pp}, {"dp_s", p.dp},
          {"optimizer_s", p.optimizer}};
}

nlohmann::json links_json(const AxisLinks& l) {
  auto w = [](bool intra) { return intra ? "nvlink" : "network"; };
  return {{"tp", w(l.tp)}, {"cp", w(l.cp)}, {"ep", w(l.ep)}, {"dp", w(l.dp)}, {"pp", w(l.pp)}};
}

nlohmann::json hardware_json(const Hardware& h) {
  return {{"name", h.name},
          {"peak_tflops", h.peak_tflops},
          {"hbm_tbps", h.hbm_tbps},
          {"memory_gib", h.memory_gib},
          {"gpus_per_node", h.gpus_per_node},
          {"intra_node_gbps", h.intra_node_gbps},
          {"inter_node_gbps", h.inter_node_gbps}};
}

nlohmann::json assumptions_json(const StepAssumptions& a) {
  return {{"gemm_efficiency", a.gemm_efficiency},
          {"attention_efficiency", a.attention_efficiency},
          {"memory_efficiency", a.memory_efficiency},
          {"kernel_gap_us", a.kernel_gap_us},
          {"ring_efficiency", a.ring_efficiency},
          {"all_to_all_efficiency", a.all_to_all_efficiency},
          {"p2p_efficiency", a.p2p_efficiency},
          {"intra_node_latency_us", a.intra_node_latency_us},
          {"inter_node_latency_us", a.inter_node_latency_us},
          {"usable_memory", a.usable_memory}};
}

nlohmann::json estimate_fields(const StepEstimate& e) {
  return {{"tokens_per_sec", e.tokens_per_sec},
          {"tokens_per_sec_per_gpu", e.tokens_per_sec / static_cast<double>(e.world)},
          {"mfu", e.mfu},
          {"step_s", e.step_s},
          {"tokens_per_step", e.tokens_per_step},
          {"n_microbatches", e.n_microbatches},
          {"bubble_fraction", e.bubble_fraction},
          {"slowest_stage", e.slowest_stage},
          {"parts", parts_json(e.parts)},
          {"links", links_json(e.links)},
          {"microbatch", {{"gemm_tflop", e.gemm_tflop}, {"attention_tflop", e.attention_tflop},
                          {"other_gb", e.other_gb}, {"kernels", e.kernels}}}};
}

nlohmann::json candidate_json(const Candidate& c) {
  nlohmann::json j = {{"dp", c.dp},
                      {"pp", c.pp},
                      {"tp", c.tp},
                      {"cp", c.cp},
                      {"ep", c.ep},
                      {"zero_stage", c.zero_stage},
                      {"virtual_stages", c.virtual_stages},
                      {"micro_batch_size", c.micro_batch_size},
                      {"recompute", choice_name(c.recompute)},
                      {"sequence_parallel", c.sequence_parallel},
                      {"memory_gib", c.memory_gib}};
  j.update(estimate_fields(c.estimate));
  return j;
}

std::string searched_text(const Config& cfg, const SearchOptions& o) {
  std::ostringstream s;
  s << "searched: tp " << (o.tp_across_nodes ? "any divisor" : "within a node (" +
                               std::to_string(o.hardware.gpus_per_node) + " GPUs)")
    << ", pp up to the " << cfg.model.n_layers() << " layers (1f1b; interleaved with 2-" << o.max_virtual_stages
    << " virtual stages), cp and dp the rest" << (cfg.model.ffn == FfnKind::Moe ? ", ep dividing dp x cp" : "")
    << ", zero_stage";
  for (int64_t z : o.zero_stages) s << " " << z;
  s << ", recomputation";
  for (auto m : o.recompute) s << " " << choice_name(m);
  s << ", micro_batch_size dividing the dp share of train_batch_size " << cfg.data.train_batch_size
    << ", sequence parallelism with tp > 1; each candidate's config validated as a run's\n";
  return s.str();
}

void table_text(std::ostream& o, const SearchResult& r, int64_t top) {
  o << "  #    dp   pp  tp  cp  ep zero  v  mbs recompute  sp    GiB    tokens/s   a GPU   MFU    step ms    compute"
       "     comm    bubble\n";
  const size_t n = std::min(r.candidates.size(), static_cast<size_t>(std::max<int64_t>(0, top)));
  for (size_t i = 0; i < n; ++i) {
    const Candidate& c = r.candidates[i];
    const StepEstimate& e = c.estimate;
    const StepParts& p = e.parts;
    const double comm = p.tp + p.cp + p.ep + p.fsdp + p.pp + p.dp;
    o << std::right << "  " << std::setw(2) << i + 1 << std::setw(6) << c.dp << std::setw(5) << c.pp << std::setw(4)
      << c.tp << std::setw(4) << c.cp << std::setw(4) << c.ep << std::setw(5) << c.zero_stage << std::setw(3)
      << c.virtual_stages << std::setw(5) << c.micro_batch_size << " " << std::left << std::setw(10)
      << choice_name(c.recompute) << std::right << std::setw(4) << (c.sequence_parallel ? "yes" : "no")
      << std::fixed << std::setprecision(1) << std::setw(7) << c.memory_gib << std::setprecision(0)
      << std::setw(12) << e.tokens_per_sec << std::setw(8) << e.tokens_per_sec / static_cast<double>(e.world)
      << std::setprecision(1) << std::setw(6) << e.mfu * 100 << " " << std::setw(10) << e.step_s * 1e3 << " "
      << std::setw(10) << p.compute * 1e3 << " " << std::setw(8) << comm * 1e3 << " " << std::setw(9)
      << p.bubble * 1e3 << "\n";
  }
}

// The smallest pp with a fitting mesh at each tp (the seed's question: how
// few pipeline stages does a model need).
void smallest_pp_text(std::ostream& o, const SearchResult& r) {
  std::map<int64_t, const Candidate*> best;
  for (const Candidate& c : r.candidates) {
    auto& b = best[c.tp];
    if (b == nullptr || c.pp < b->pp) b = &c;  // candidates are ranked: the first at a pp is its best
  }
  o << "smallest pp that fits, by tp:";
  bool any = false;
  for (const auto& [tp, c] : best) {
    o << (any ? "; " : " ") << "tp " << tp << ": pp " << c->pp << " (dp " << c->dp << " cp " << c->cp << ", zero_stage "
      << c->zero_stage << ", " << choice_name(c->recompute) << " recomputation, micro_batch_size "
      << c->micro_batch_size << ", " << std::fixed << std::setprecision(1) << c->memory_gib << " GiB, "
      << std::setprecision(0) << c->estimate.tokens_per_sec << " tokens/s)";
    any = true;
  }
  o << (any ? "\n" : " none\n");
}

}  // namespace

std::string search_text(const Config& cfg, const SearchOptions& o, const SearchResult& r, int64_t top) {
  std::ostringstream s;
  const Hardware& hw = o.hardware;
  const ParamCount pc = count_params(cfg.model);
  s << "plan --search: " << o.gpus << " x " << hw.name << " (" << o.gpus / hw.gpus_per_node << " node"
    << (o.gpus / hw.gpus_per_node > 1 ? "s" : "") << " of " << hw.gpus_per_node << "), " << pc.total / 1e9
    << "B parameters (" << pc.active / 1e9 << "B active), " << cfg.data.train_batch_size * cfg.grad_step
    << " sequences of " << cfg.model.T << " tokens a step\n";
  s << step_assumptions_text(hw, o.assumptions) << searched_text(cfg, o);
  s << std::fixed << std::setprecision(1);
  s << r.evaluated << " meshes planned: " << r.candidates.size() << " fit, " << r.too_big << " need more than "
    << hw.memory_gib * o.assumptions.usable_memory << " GiB; " << r.invalid << " refused by the config's rules; "
    << std::setprecision(2) << r.seconds << " s\n";
  if (!r.candidates.empty()) {
    s << "best " << std::min<int64_t>(top, static_cast<int64_t>(r.candidates.size()))
      << " by estimated tokens/s (GiB: the most loaded rank; comm: exposed collectives, ms):\n";
    table_text(s, r, top);
    smallest_pp_text(s, r);
  }
  if (!r.rejected.empty()) {
    s << "families with no mesh that fits (tp x pp: why):\n";
    for (const RejectedFamily& f : r.rejected) s << "  tp " << f.tp << " x pp " << f.pp << ": " << f.why << "\n";
  }
  return s.str();
}

std::string search_json(const Config& cfg, const SearchOptions& o, const SearchResult& r) {
  nlohmann::json j;
  j["gpus"] = o.gpus;
  j["hardware"] = hardware_json(o.hardware);
  j["assumptions"] = assumptions_json(o.assumptions);
  j["usable_memory_gib"] = o.hardware.memory_gib * o.assumptions.usable_memory;
  j["tokens_per_step"] = cfg.data.train_batch_size * cfg.grad_step * cfg.model.T;
  j["evaluated"] = r.evaluated;
  j["invalid"] = r.invalid;
  j["too_big"] = r.too_big;
  j["seconds"] = r.seconds;
  j["candidates"] = nlohmann::json::array();
  for (const Candidate& c : r.candidates) j["candidates"].push_back(candidate_json(c));
  j["rejected"] = nlohmann::json::array();
  for (const RejectedFamily& f : r.rejected) j["rejected"].push_back({{"tp", f.tp}, {"pp", f.pp}, {"why", f.why}});
  return j.dump();
}

std::string estimate_json(const StepEstimate& e, const Hardware& hw, const StepAssumptions& a) {
  nlohmann::json j = estimate_fields(e);
  j["world"] = e.world;
  j["hardware"] = hardware_json(hw);
  j["assumptions"] = assumptions_json(a);
  return j.dump();
}

}  // namespace meshtrain
