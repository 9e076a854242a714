// meshtrain plan and bench: what a config costs, on paper (plan, plan
// --search: perf/) or timed (bench, bench --device meta: bench/).
#include <algorithm>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "meshtrain/bench/bench.h"
#include "meshtrain/bench/meta_bench.h"
#include "meshtrain/core/check.h"
#include "meshtrain/perf/plan.h"
#include "meshtrain/perf/plan_search.h"
#include "meshtrain/perf/step_model.h"
#include "cli_command.h"

namespace meshtrain {

namespace {

// The hardware `plan` prices a step on: a preset (--gpu, h100-sxm when only
// other hardware flags are given), any part of it overridden by a flag.
struct HardwareFlags {
  std::string gpu;
  int64_t gpus_per_node = 0;
  double intra = 0, inter = 0, peak = 0, hbm = 0;
  std::vector<CLI::Option*> options;

  void add_to(CLI::App* sub) {
    options = {
        sub->add_option("--gpu", gpu, "price a step on this GPU: h100-sxm, h200, a100-80, a100-40, v100-32"),
        sub->add_option("--gpus-per-node", gpus_per_node, "GPUs a node (default 8)")->check(integer_at_least(1)),
        sub->add_option("--intra-node-gbps", intra, "GB/s a GPU inside a node, one direction (NVLink)")
            ->check(number_at_least(0.001)),
        sub->add_option("--inter-node-gbps", inter, "GB/s a GPU between nodes, one direction (its NIC)")
            ->check(number_at_least(0.001)),
        sub->add_option("--peak-tflops", peak, "dense bf16 TFLOP/s a GPU (default: the preset's)")
            ->check(number_at_least(0.001)),
        sub->add_option("--hbm-tbps", hbm, "memory bandwidth a GPU, TB/s (default: the preset's)")
            ->check(number_at_least(0.001))};
  }
  bool given() const {
    return std::any_of(options.begin(), options.end(), [](CLI::Option* o) { return o->count() > 0; });
  }
  // device_gib: --device-memory-gb, when given, is the GPU's memory.
  Hardware hardware(double device_gib) const {
    Hardware h = hardware_preset(gpu.empty() ? "h100-sxm" : gpu);
    bool changed = device_gib > 0;
    const auto set = [&changed](auto& field, auto value) {
      if (value > 0) field = value, changed = true;
    };
    set(h.gpus_per_node, gpus_per_node);
    set(h.intra_node_gbps, intra);
    set(h.inter_node_gbps, inter);
    set(h.peak_tflops, peak);
    set(h.hbm_tbps, hbm);
    if (device_gib > 0) h.memory_gib = device_gib;
    if (changed) h.name += " (with the flags' values)";
    return h;
  }
};

struct PlanCommand : Command {
  ConfigFlags flags;
  HardwareFlags hw;
  double device_gib = 0, usable = 0.9;
  bool json = false, search = false, tp_across_nodes = false;
  int64_t gpus = 0, top = 10;
  std::vector<int64_t> zero_stages;
  std::vector<std::string> recompute;
  std::vector<CLI::Option*> search_only;
  CLI::Option* gpus_opt = nullptr;
  std::string device;

  void add_to(CLI::App& app) override {
    sub = app.add_subcommand("plan", "parameters (total/active), memory per rank, FLOPs per token; with a GPU: the "
                                     "step time; --search: every mesh of --gpus N GPUs that fits, ranked");
    flags.add_to(sub);
    sub->add_option("--device-memory-gb", device_gib, "device memory in GiB: say whether the run fits")
        ->check(number_at_least(0));
    sub->add_option("--device", device, "plan for cpu or cuda (default: the config's device, auto: this machine)")
        ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    sub->add_flag("--json", json, "print one JSON object instead of the report");
    hw.add_to(sub);
    sub->add_flag("--search", search, "rank every mesh of --gpus N GPUs that the config allows and the memory fits");
    gpus_opt = sub->add_option("--gpus", gpus, "GPUs in the cluster (--search; else it must be the mesh's size)")
                   ->check(integer_at_least(1));
    search_only = {
        sub->add_option("--zero-stages", zero_stages, "--search: zero_stage values to try (default 0,1,2,3)")
            ->delimiter(',')
            ->check(CLI::Range(0, 3)),
        sub->add_option("--recompute", recompute, "--search: activation_checkpointing modes to try (default "
                                                  "none,selective,full)")
            ->delimiter(',')
            ->check(CLI::IsMember({"none", "selective", "full"})),
        sub->add_flag("--tp-across-nodes", tp_across_nodes, "--search: let tp span nodes"),
        sub->add_option("--top", top, "--search: rows of the table (default 10)")->check(integer_at_least(1))};
    sub->add_option("--usable-memory", usable, "fraction of the device memory a run may plan to use (default 0.9)")
        ->check(CLI::Range(0.01, 1.0));
  }

  void run(Runtime& runtime, Watchdog*) override {
    const Config cfg = flags.load().config;
    for (const CLI::Option* o : search_only)
      MT_CHECK(search || o->count() == 0, "plan: ", o->get_name(), " applies to --search only");
    if (search) return run_search(cfg, runtime);
    MT_CHECK(gpus_opt->count() == 0 || gpus == cfg.device.world(), "plan --gpus ", gpus, " without --search must be ",
             "the mesh's ", cfg.device.world(), " ranks (device_config.n_device_axis x context_parallel); add --search ",
             "to try every mesh of ", gpus, " GPUs");
    const std::string report = plan_report(cfg, plan_device(cfg, device), device_gib, json);
    if (!hw.given()) {
      if (runtime.rank() == 0) std::cout << report << std::endl;
      return;
    }
    // One mesh on a described GPU: the step-time estimate and the fit under it.
    StepAssumptions a;
    a.usable_memory = usable;
    const Hardware h = hw.hardware(device_gib);
    const StepEstimate e = estimate_step(cfg, h, a);
    const double gib = plan_memory(cfg, PlanDevice::Cuda).total_bytes() / (1024.0 * 1024.0 * 1024.0);
    const bool fits = gib <= h.memory_gib * usable;
    if (runtime.rank() != 0) return;
    if (json) {
      nlohmann::json j = nlohmann::json::parse(report);
      j["estimate"] = nlohmann::json::parse(estimate_json(e, h, a));
      j["estimate"]["memory_gib"] = gib;
      j["estimate"]["fits"] = fits;
      std::cout << j.dump() << std::endl;
      return;
    }
    std::cout << report << "\n" << step_assumptions_text(h, a) << step_estimate_text(e, h) << "  memory on "
              << h.name << ": " << gib << " GiB a rank (the CUDA plan), " << (fits ? "fits" : "does NOT fit")
              << " in " << h.memory_gib * usable << " GiB usable" << std::endl;
  }

  void run_search(const Config& cfg, Runtime& runtime) {
    MT_CHECK(gpus_opt->count() > 0, "plan --search needs --gpus N, the cluster's GPU count");
    SearchOptions o;
    o.gpus = gpus;
    o.hardware = hw.hardware(device_gib);
    o.assumptions.usable_memory = usable;
    o.tp_across_nodes = tp_across_nodes;
    if (!zero_stages.empty()) o.zero_stages = zero_stages;
    if (!recompute.empty()) {
      o.recompute.clear();
      for (const auto& r : recompute) o.recompute.push_back(*parse_choice<ActivationCheckpointing>(r));
    }
    const SearchResult r = search_meshes(cfg, o);
    if (runtime.rank() == 0) std::cout << (json ? search_json(cfg, o, r) : search_text(cfg, o, r, top)) << std::endl;
    // The families' reasons are the refusal's: the first few here, all of them above.
    std::string why;
    for (size_t i = 0; i < r.rejected.size() && i < 3; ++i)
      why += "; tp " + std::to_string(r.rejected[i].tp) + " x pp " + std::to_string(r.rejected[i].pp) + ": " +
             r.rejected[i].why;
    MT_CHECK(!r.candidates.empty(), "plan --search: no mesh of ", gpus, " GPUs fits (", o.hardware.name, ", ",
             o.hardware.memory_gib * usable, " GiB usable)", why,
             r.rejected.size() > 3 ? "; ... (every family above)" : "");
  }
};

struct BenchCommand : Command {
  ConfigFlags flags;
  BenchOptions opts;
  MetaBenchOptions meta;
  std::string device;

  void add_to(CLI::App& app) override {
    sub = app.add_subcommand("bench", "time training steps: tokens/s, MFU, peak memory");
    flags.add_to(sub);
    sub->add_option("--steps", opts.steps, "timed steps")->check(integer_at_least(1));
    sub->add_option("--warmup", opts.warmup, "untimed warm-up steps")->check(integer_at_least(0));
    sub->add_option("--peak-tflops", opts.peak_tflops,
                    "device peak TFLOP/s for MFU (default: known GPUs; with --device meta: 989, an H100's dense bf16)")
        ->check(number_at_least(0));
    sub->add_option("--profile", opts.profile_dir,
                    "profile --profile-steps more steps: time per kernel category, gaps, largest kernels; each "
                    "rank's Chrome trace goes into this folder");
    sub->add_option("--profile-steps", opts.profile_steps, "steps under the profiler (default 3)")
        ->check(integer_at_least(1));
    sub->add_option("--device", device,
                    "meta: the performance model, no GPU needed: one full-size step of one unsharded rank on the "
                    "meta device, its FLOPs, bytes, kernels and host syncs priced by the efficiencies below")
        ->check(CLI::IsMember({"meta"}));
    sub->add_option("--efficiency", meta.efficiency, "--device meta: GEMMs' fraction of the peak (default 0.75)");
    sub->add_option("--attention-efficiency", meta.attention_efficiency,
                    "--device meta: attention's fraction of the peak (default 0.25)");
    sub->add_option("--memory-efficiency", meta.memory_efficiency,
                    "--device meta: fraction of the bandwidth the memory-bound kernels reach (default 0.40)");
    sub->add_option("--kernel-gap-us", meta.kernel_gap_us,
                    "--device meta: idle device time per kernel in microseconds (default 7.7)");
    sub->add_option("--graph-kernel-gap-us", meta.graph_kernel_gap_us,
                    "--device meta: the same with device_config.cuda_graphs, a replayed graph (default 1.0)");
    sub->add_option("--fp8-peak-tflops", meta.fp8_peak_tflops,
                    "--device meta: dense FP8 TFLOP/s, the FP8 GEMMs' peak under model_config.fp8_recipe (default "
                    "1979, an H100 SXM; with --peak-tflops alone: twice that)")
        ->check(number_at_least(0));
    sub->add_option("--bandwidth-tbps", meta.bandwidth_tbps,
                    "--device meta: memory bandwidth in TB/s (default 3.35, an H100 SXM)");
    sub->add_option("--top-ops", meta.top_ops, "--device meta: operators listed in the table (default 15)")
        ->check(integer_at_least(0));
  }
  void run(Runtime& runtime, Watchdog*) override {
    if (device == "meta") {
      if (opts.peak_tflops > 0) {
        // A custom bf16 peak without an FP8 one: FP8 tensor cores run twice as fast (Hopper, Blackwell).
        if (sub->count("--fp8-peak-tflops") == 0) meta.fp8_peak_tflops = 2 * opts.peak_tflops;
        meta.peak_tflops = opts.peak_tflops, meta.peak_name = "custom";
      }
      const MetaBenchResult r = run_meta_bench(flags.load().config, runtime, meta);
      if (runtime.rank() == 0) std::cout << to_string(r) << to_json(r) << std::endl;
      return;
    }
    const Config c = flags.load().config;
    check_memory(c, runtime);
    const BenchResult r = run_bench(c, runtime, opts);
    if (runtime.rank() == 0) std::cout << to_string(r) << to_json(r) << std::endl;
  }
};

}  // namespace

std::unique_ptr<Command> make_plan_command() { return std::make_unique<PlanCommand>(); }
std::unique_ptr<Command> make_bench_command() { return std::make_unique<BenchCommand>(); }

}  // namespace meshtrain
