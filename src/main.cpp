// meshtrain: the command line, and nothing else. Each subcommand parses its
// flags, loads and validates the config, then hands over to the library:
//   train                   -> train/trainer.h (the loop over a train/session.h Session)
//   eval / generate         -> a Session, then train/evaluate.h or train/sample.h
//   prepare-data            -> data/prepare.h (corpus -> tokenizer + shards)
//   checkpoint ...          -> ckpt/checkpoint.h (inspect, export)
//   plan / bench            -> train/plan.h, train/bench.h (estimates, timed steps)
// Errors are exceptions; here they become one log line and a non-zero exit,
// and with several ranks an MPI_Abort so no rank waits forever.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <torch/torch.h>

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <algorithm>
#include <iostream>
#include <map>
#include <optional>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/export_guard.h"
#include "meshtrain/hf/hf_dir.h"
#include "meshtrain/hf/init_from_hf.h"
#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/flight_compare.h"
#include "meshtrain/core/fs.h"
#include "meshtrain/core/launch_env.h"
#include "meshtrain/core/log.h"
#include "meshtrain/core/stop_signal.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/dist/device.h"
#include "meshtrain/dist/runtime.h"
#include "meshtrain/bench/bench.h"
#include "meshtrain/train/memory_check.h"
#include "meshtrain/bench/meta_bench.h"
#include "meshtrain/perf/plan.h"
#include "meshtrain/perf/plan_search.h"
#include "meshtrain/perf/step_model.h"
#include "meshtrain/train/test_hooks.h"
#include "meshtrain/train/evaluate.h"
#include "meshtrain/train/sample.h"
#include "meshtrain/train/session.h"
#include "meshtrain/train/trainer.h"
#include "cli_validators.h"

namespace {

using namespace meshtrain;

// prepare-data's progress line, redrawn in place; only on a terminal, so logs
// and pipes never fill with carriage returns.
void show_progress(const PrepareProgress& p) {
  const double mb = static_cast<double>(p.bytes_done) / 1e6, secs = std::max(p.seconds, 1e-3);
  const double rate = mb / secs;
  const double left = static_cast<double>(p.bytes_total - p.bytes_done) / 1e6;
  const double pct = p.bytes_total > 0 ? 100.0 * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total) : 100;
  std::fprintf(stderr, "\rprepare-data: %5.1f%%  %.1f/%.1f MB  %.1f MB/s  %lld docs  %lld tokens  ETA %.0f s   ", pct,
               mb, static_cast<double>(p.bytes_total) / 1e6, rate, static_cast<long long>(p.documents),
               static_cast<long long>(p.tokens), rate > 0 ? left / rate : 0.0);
  std::fflush(stderr);
}

// CLI11 reports a mistyped subcommand as an unexpected argument without its
// name: name it, and list the valid ones. "" when argv is fine so far.
std::string unknown_subcommand(CLI::App& app, int argc, char** argv) {
  CLI::App* level = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.empty() || arg[0] == '-') {
      if (level != &app || arg == "--") return "";  // a subcommand's own flags: CLI11 checks them
      continue;                                    // -v, --help
    }
    const auto subs = level->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) return "";
    std::string names;
    for (auto* sub : subs) {
      if (sub->get_name() == arg) {
        level = sub;
        names.clear();
        break;
      }
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!names.empty())
      return "unknown " + std::string(level == &app ? "subcommand" : "'" + level->get_name() + "' subcommand") +
             " '" + arg + "'; valid: " + names;
  }
  return "";
}

// A run started with --init-from-hf keeps the HF model's model_config in its
// checkpoints: train, eval and generate with the run's own config file load
// it from there instead of refusing it as "a different model".
Config model_of_hf_run(Config cfg, const std::string& checkpoint, SessionOptions& o) {
  std::string from;
  cfg = with_checkpoint_hf_model(cfg, checkpoint, &o.init_from_hf, &from);
  if (!from.empty())
    spdlog::info("{} was initialised from the Hugging Face model {}: model_config comes from the checkpoint, not "
                 "the config file", from, o.init_from_hf);
  return cfg;
}

// Before a Session allocates what the config sizes: a model or batch that
// cannot fit is refused naming its keys (train/memory_check.h).
void check_memory(const Config& cfg, const Runtime& rt) {
  const PlanDevice device = plan_device(cfg);
  check_memory_fits(cfg, device, rank_memory_budget(device, rt.local_size(), visible_cuda_devices()));
}

// Flags shared by every subcommand that takes --config (docs/ARCHITECTURE.md, "Command line").
struct ConfigFlags {
  std::string config;
  std::vector<std::string> sets;
  std::vector<int64_t> n_device_axis;
  std::string name, output_dir;
  int64_t train_batch_size = 0, checkpoint_steps = 0, eval_steps = 0, training_steps = 0;
  uint64_t seed = 0;
  std::map<std::string, CLI::Option*> given;

  void add_to(CLI::App* app) {
    app->add_option("--config", config, "JSON config file")->required()->check(CLI::ExistingFile);
    app->add_option("--set", sets, "override a config key: --set model_config.n_head=4 (repeatable)");
    app->add_option("--n_device_axis", n_device_axis, "mesh DP PP TP")->expected(3)->check(integer_at_least(1));
    // A flag given twice keeps its last value, like a --set given twice.
    const auto last = CLI::MultiOptionPolicy::TakeLast;
    given["name"] = app->add_option("--name", name, "run name (run dir = output_dir/name), taken literally")
                        ->multi_option_policy(last)
                        ->check(non_empty());
    given["output_dir"] = app->add_option("--output_dir", output_dir, "where runs live, taken literally")
                              ->multi_option_policy(last)
                              ->check(non_empty());
    given["data_config.train_batch_size"] =
        app->add_option("--train_batch_size", train_batch_size, "sequences per accumulation round")
            ->multi_option_policy(last)
            ->check(integer_at_least(1));
    given["checkpoint_steps"] = app->add_option("--checkpoint_steps", checkpoint_steps,
                                                "evaluate + checkpoint every N steps")
                                    ->multi_option_policy(last)
                                    ->check(integer_at_least(1));
    given["eval_steps"] = app->add_option("--eval_steps", eval_steps, "validation batches per evaluation")
                              ->multi_option_policy(last)
                              ->check(integer_at_least(0));
    given["training_steps"] = app->add_option("--training_steps", training_steps, "total optimizer steps")
                                  ->multi_option_policy(last)
                                  ->check(integer_at_least(0));
    given["seed"] = app->add_option("--seed", seed, "random seed")->multi_option_policy(last)->check(integer_at_least(0));
  }

  // The Jaxformer flags are --set overrides of the keys they name; strings go
  // in as JSON string literals, so their text is taken exactly as given.
  LoadedConfig load() const {
    std::vector<std::string> all = sets;
    if (!n_device_axis.empty())
      all.push_back("device_config.n_device_axis=[" + std::to_string(n_device_axis[0]) + "," +
                    std::to_string(n_device_axis[1]) + "," + std::to_string(n_device_axis[2]) + "]");
    const auto add = [&](const std::string& key, const nlohmann::json& value) {
      if (given.at(key)->count() > 0) all.push_back(key + "=" + value.dump());
    };
    add("name", name);
    add("output_dir", output_dir);
    add("data_config.train_batch_size", train_batch_size);
    add("checkpoint_steps", checkpoint_steps);
    add("eval_steps", eval_steps);
    add("training_steps", training_steps);
    add("seed", seed);
    LoadedConfig lc = load_config(config, all);
    for (const auto& w : lc.warnings) spdlog::warn("{}", w);
    return lc;
  }
};

// The process's MPI world and the watchdog armed before it (main owns both,
// so the watchdog outlives MPI_Finalize and watches it too).
struct Started {
  std::unique_ptr<Watchdog> watchdog;
  std::unique_ptr<Runtime> runtime;
};

// MPI_Init waits for every rank of the job, so a rank that never starts (or
// stops before joining) would hang the others there forever: with a config
// (train, eval, generate) the watchdog is armed first, with the rank the
// launcher gave this process, and names that rank by host and pid.
Runtime& start_mpi(Started& s, const Config* cfg, const LaunchEnv& launch, int* argc, char*** argv, bool verbose) {
  const auto arm = [&](int rank, int size) {
    s.watchdog.reset();  // one writer per heartbeat file
    s.watchdog = std::make_unique<Watchdog>(cfg->watchdog_seconds, rank, size,
                                            size > 1 ? cfg->run_dir() + "/heartbeats" : "", launch.job);
  };
  // Open MPI writes session files under the file-size limit and, past it,
  // fails in its own words (PMIX, orte_init): say first what the limit is.
  if (const int64_t limit = file_size_limit(); limit > 0 && launch.rank == 0)
    spdlog::warn("the file-size limit (ulimit -f) is {} bytes: a file meshtrain or MPI writes past it fails (if MPI "
                 "start-up fails below, this limit is the likely cause)", limit);
  if (cfg) {
    arm(launch.rank, launch.size);
    TestHooks::from_environment().before_mpi_init(launch.rank);
    s.watchdog->beat("start-up: MPI initialisation (waits for every rank to start)");
  }
  try {
    s.runtime = std::make_unique<Runtime>(argc, argv);
  } catch (const std::exception& e) {
    MT_FAIL("cannot initialise MPI: ", e.what());
  }
  Runtime& rt = *s.runtime;
  if (rt.rank() != launch.rank || rt.size() != launch.size) {
    // A launcher whose variables launch_env.h does not know: MPI's word counts.
    setup_logging(rt.rank(), rt.size(), verbose);
    if (cfg) arm(rt.rank(), rt.size());
  }
  if (s.watchdog) s.watchdog->beat("start-up: MPI initialised");
  install_stop_signal_handlers();
  return rt;
}

// One subcommand: its flags, the config it trains on (watched from before
// MPI_Init), and what it does once MPI is up.
struct Command {
  virtual ~Command() = default;
  virtual void add_to(CLI::App& app) = 0;
  // train / eval / generate: the config, loaded before MPI_Init so the
  // watchdog (its watchdog_seconds, the run dir's heartbeats) is armed first.
  virtual std::optional<Config> config_to_watch() { return std::nullopt; }
  virtual void run(Runtime& runtime, Watchdog* watchdog) = 0;
  bool chosen() const { return sub != nullptr && sub->parsed(); }
  CLI::App* sub = nullptr;
};

struct TrainCommand : Command {
  ConfigFlags flags;
  SessionOptions opts;
  std::string init_from_hf;
  std::optional<Config> cfg;

  void add_to(CLI::App& app) override {
    sub = app.add_subcommand("train", "train (resumes from the newest checkpoint of the run dir)");
    flags.add_to(sub);
    auto* fresh = sub->add_flag("--fresh", opts.fresh, "start over, ignoring existing checkpoints");
    // Resuming from further back: newer checkpoints of the run are set aside
    // (*.superseded) at its first save, and metrics.jsonl drops the rows after it.
    sub->add_option("--checkpoint", opts.checkpoint,
                    "resume from this checkpoint dir (a step_XXXXXXXX folder) instead of the newest")
        ->check(CLI::ExistingDirectory)
        ->excludes(fresh);
    sub->add_flag("--allow-tokenizer-change", opts.allow_tokenizer_change,
                  "resume a checkpoint on data made by another tokenizer (a warning instead of the refusal)");
    sub->add_option("--init-from-hf", init_from_hf,
                    "start from a Hugging Face Llama / DeepSeek-V3 directory (model_config from its config.json)")
        ->check(CLI::ExistingDirectory);
  }
  std::optional<Config> config_to_watch() override {
    cfg = flags.load().config;
    if (!init_from_hf.empty()) cfg = with_hf_model(*cfg, init_from_hf);
    // Before MPI_Init: under a small limit MPI's start-up fails too, in Open MPI's words only.
    check_checkpoint_file_limit(*cfg, file_size_limit());
    return cfg;
  }
  void run(Runtime& runtime, Watchdog* watchdog) override {
    Config c = *cfg;
    if (!init_from_hf.empty()) {
      opts.init_from_hf = std::filesystem::absolute(init_from_hf).lexically_normal().string();
    } else if (!opts.fresh) {
      c = model_of_hf_run(c, "", opts);
    }
    opts.watchdog = watchdog;
    opts.check_shared_run_dir = true;
    check_memory(c, runtime);
    Trainer trainer(c, runtime, opts);
    // A run that resumed its own checkpoint continues from it, not from the HF weights again.
    if (!init_from_hf.empty() && trainer.step() == 0) load_hf_weights(trainer.model(), trainer.mesh(), init_from_hf);
    trainer.train();
  }
};

// eval and generate: a checkpoint of a run (the newest by default).
struct CheckpointUse {
  ConfigFlags flags;
  std::string checkpoint;
  bool random_weights = false;

  void add_to(CLI::App* sub, const std::string& untrained_use) {
    flags.add_to(sub);
    sub->add_option("--checkpoint", checkpoint, "checkpoint dir (default: newest of the run)")
        ->check(CLI::ExistingDirectory);
    sub->add_flag("--random_weights", random_weights, untrained_use + " the untrained model when the run has no checkpoint");
  }
  SessionOptions options(Watchdog* watchdog) const {
    SessionOptions o;
    o.checkpoint = checkpoint;
    o.require_checkpoint = !random_weights;
    o.watchdog = watchdog;
    return o;
  }
};

struct EvalCommand : Command {
  CheckpointUse use;
  std::optional<Config> cfg;

  void add_to(CLI::App& app) override {
    sub = app.add_subcommand("eval", "validation loss of a checkpoint");
    use.add_to(sub, "evaluate");
  }
  std::optional<Config> config_to_watch() override { return cfg = use.flags.load().config; }
  void run(Runtime& runtime, Watchdog* watchdog) override {
    SessionOptions o = use.options(watchdog);
    const Config c = model_of_hf_run(*cfg, use.checkpoint, o);
    check_memory(c, runtime);
    Session session(c, runtime, o);
    const double v = evaluate(session);
    spdlog::info("step {}: val_loss {:.4f}", session.progress().step, v);
    if (runtime.rank() == 0) std::cout << "val_loss " << v << std::endl;
  }
};

struct GenerateCommand : Command {
  CheckpointUse use;
  std::string prompt;
  int64_t max_tokens = 0, top_k = 0;
  double temperature = 0;
  CLI::Option *prompt_opt = nullptr, *max_tokens_opt = nullptr, *top_k_opt = nullptr, *temperature_opt = nullptr;
  std::optional<Config> cfg;

  void add_to(CLI::App& app) override {
    sub = app.add_subcommand("generate", "sample text from a checkpoint");
    use.add_to(sub, "sample from");
    prompt_opt = sub->add_option("--prompt", prompt, "prompt text");
    max_tokens_opt = sub->add_option("--max_tokens", max_tokens, "tokens to sample")->check(integer_at_least(0));
    top_k_opt = sub->add_option("--top_k", top_k, "sample among the k most likely (0: all)")->check(integer_at_least(0));
    temperature_opt =
        sub->add_option("--temperature", temperature, "softmax temperature (0: greedy)")->check(number_at_least(0));
  }
  std::optional<Config> config_to_watch() override {
    Config c = use.flags.load().config;
    if (prompt_opt->count()) c.inference.prompt = prompt;
    if (max_tokens_opt->count()) c.inference.max_tokens = max_tokens;
    if (top_k_opt->count()) c.inference.top_k = top_k;
    if (temperature_opt->count()) c.inference.temperature = temperature;
    validate(c);  // the flags above bypassed load_config's checks (max_tokens bound)
    // Printing nothing and exiting 0 would look like an empty sample.
    const std::string why = sample_unavailable(c);
    MT_CHECK(why.empty(), "generate: ", why);
    return cfg = c;
  }
  void run(Runtime& runtime, Watchdog* watchdog) override {
    SessionOptions o = use.options(watchdog);
    const Config c = model_of_hf_run(*cfg, use.checkpoint, o);
    check_memory(c, runtime);
    Session session(c, runtime, o);
    const std::string text = sample(session);
    if (runtime.rank() == 0) std::cout << text << std::endl;
  }
};

struct PrepareCommand : Command {
  PrepareOptions prep;
  bool verbose = false;
  const bool* global_verbose = nullptr;

  void add_to(CLI::App& app) override {
    sub = app.add_subcommand("prepare-data", "text files -> tokenizer + token shards");
    sub->add_option("--input", prep.inputs, "text files or folders")->required()->check(non_empty());
    sub->add_option("--output", prep.output_dir, "output data dir")->required()->check(non_empty());
    auto* vs = sub->add_option("--vocab-size", prep.vocab_size, "train a byte-level BPE of this size")
                   ->check(integer_at_least(257));
    auto* tk = sub->add_option("--tokenizer", prep.tokenizer_file,
                               "*.tiktoken vocabulary, or tokenizer.json (meshtrain's or Hugging Face byte-level BPE)")
                   ->check(non_empty());
    vs->excludes(tk);
    sub->add_option("--pattern", prep.pattern,
                    "pre-tokenizer regex or gpt2|cl100k|o200k (default: the vocabulary's own; gpt2 when training)")
        ->check(non_empty());
    sub->add_option("--val-fraction", prep.val_fraction, "fraction of documents for validation (default 0.05)")
        ->check(number_at_least(0));
    sub->add_option("--seed", prep.seed, "seed of the train/val document split")->check(integer_at_least(0));
    sub->add_option("--text-key", prep.text_key, "JSON Lines / JSON / Parquet field with the text (default text)")
        ->check(non_empty());
    sub->add_option("--text-split", prep.text_split,
                    "plain text documents: paragraph (blank lines; fortune files at %), line or file")
        ->check(CLI::IsMember({"paragraph", "line", "file"}));
    sub->add_option("--workers", prep.workers, "tokenizing threads (default 0: all cores)")->check(integer_at_least(0));
    sub->add_option("--shard-tokens", prep.shard_tokens, "tokens per shard (default 10000000)")
        ->check(integer_at_least(1));
    sub->add_flag("-v,--verbose", verbose, "list every skipped input (default: one line per reason)");
  }
  void run(Runtime& runtime, Watchdog*) override {
    if (runtime.rank() != 0) return;
    const bool tty = ::isatty(STDERR_FILENO) != 0;
    if (tty) prep.progress = show_progress;
    const PrepareSummary s = prepare_data(prep);
    if (tty) std::fprintf(stderr, "\n");
    for (const auto& r : s.removed_leftovers)
      spdlog::info("prepare-data: removed {}, the leftover of a prepare-data run that was killed", r);
    // A folder of a few real inputs among many index files or links would
    // bury the result under one line each: per reason by default.
    if (verbose || (global_verbose && *global_verbose))
      for (const auto& [file, reason] : s.skipped) spdlog::info("prepare-data: skipped {}: {}", file, reason);
    else
      for (const auto& line : skipped_summary(s)) spdlog::info("{}", line);
    spdlog::info("{}", to_string(s));
  }
};

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
    sub->add_option("--bandwidth-tbps", meta.bandwidth_tbps,
                    "--device meta: memory bandwidth in TB/s (default 3.35, an H100 SXM)");
    sub->add_option("--top-ops", meta.top_ops, "--device meta: operators listed in the table (default 15)")
        ->check(integer_at_least(0));
  }
  void run(Runtime& runtime, Watchdog*) override {
    if (device == "meta") {
      if (opts.peak_tflops > 0) meta.peak_tflops = opts.peak_tflops, meta.peak_name = "custom";
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

struct InspectCommand : Command {
  std::string dir;
  void add_to(CLI::App& ckpt) override {
    sub = ckpt.add_subcommand("inspect", "list tensors, shapes and trainer state");
    sub->add_option("dir", dir, "checkpoint dir")->required()->check(CLI::ExistingDirectory);
  }
  void run(Runtime& runtime, Watchdog*) override {
    if (runtime.rank() == 0) std::cout << inspect_checkpoint(dir);
  }
};

struct ExportCommand : Command {
  std::string dir, out, format = "safetensors", shard_size = "5GB";
  HfExportOptions hf_opts;
  CLI::Option *shard_size_opt = nullptr, *tokenizer_opt = nullptr;

  void add_to(CLI::App& ckpt) override {
    sub = ckpt.add_subcommand("export", "write one unsharded safetensors file, or a Hugging Face model dir");
    sub->add_option("dir", dir, "checkpoint dir")->required()->check(CLI::ExistingDirectory);
    sub->add_option("--output", out, "output .safetensors file (--format hf: output directory)")
        ->required()
        ->check(non_empty());
    sub->add_option("--format", format, "safetensors (every tensor, one file) or hf (stock Llama / DeepSeek-V3)")
        ->check(CLI::IsMember({"safetensors", "hf"}));
    shard_size_opt = sub->add_option("--max-shard-size", shard_size, "--format hf: largest weights file (e.g. 5GB, 500MB)");
    tokenizer_opt =
        sub->add_option("--tokenizer", hf_opts.tokenizer, "--format hf: tokenizer file (default: the run's data_dir)")
            ->check(CLI::ExistingFile);
  }
  void run(Runtime& runtime, Watchdog*) override {
    const bool hf = format == "hf";
    // A plain export is one file with every tensor: these would be ignored.
    for (const auto* o : {shard_size_opt, tokenizer_opt})
      MT_CHECK(hf || o->count() == 0, "checkpoint export: ", o->get_name(), " applies to --format hf only (a plain ",
               "export is one safetensors file of every tensor); drop it or add --format hf");
    if (hf) hf_opts.max_shard_bytes = parse_shard_size(shard_size);
    if (runtime.rank() != 0) return;
    for (const auto& r : remove_export_leftovers(out, hf))
      spdlog::info("removed {}, the leftover of an export that was killed", r);
    if (hf) export_hf(dir, out, hf_opts);
    else export_checkpoint(dir, out);
  }
};

// `meshtrain flight RUN_DIR`: the ranks' flight records compared (core/flight_compare.h).
struct FlightCommand : Command {
  std::string dir;
  void add_to(CLI::App& app) override {
    sub = app.add_subcommand("flight", "compare the ranks' collective flight records of a run (RUN_DIR/flight)");
    sub->add_option("run_dir", dir, "run dir (output_dir/name)")->required()->check(CLI::ExistingDirectory);
  }
  void run(Runtime& runtime, Watchdog*) override {
    const auto ranks = read_flights(dir, -1);
    MT_CHECK(!ranks.empty(), "no flight records in ", dir, "/flight nor heartbeats in ", dir, "/heartbeats");
    if (runtime.rank() == 0) std::cout << compare_flights(ranks);
    // A record that cannot be read is an error, not a rank without a lag.
    std::string unreadable;
    for (const auto& r : ranks)
      if (!r.problem.empty()) unreadable += "\n  " + r.problem;
    MT_CHECK(unreadable.empty(), "meshtrain flight: the comparison above leaves out what could not be read:",
             unreadable);
    bool any = false;
    for (const auto& r : ranks) any = any || r.known;
    MT_CHECK(any, "meshtrain flight: no rank's record in ", dir, "/flight or ", dir, "/heartbeats can be read");
  }
};

int run(int argc, char** argv, Started& started) {
  CLI::App app{"meshtrain: train transformer language models over a dp x pp x tp mesh"};
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "debug logging");
  TrainCommand train;
  EvalCommand eval;
  GenerateCommand generate;
  PrepareCommand prepare;
  prepare.global_verbose = &verbose;
  PlanCommand plan;
  BenchCommand bench;
  InspectCommand inspect;
  ExportCommand exp;
  FlightCommand flight;
  for (Command* c : std::initializer_list<Command*>{&train, &eval, &generate, &prepare, &plan, &bench, &flight})
    c->add_to(app);
  auto* ckpt = app.add_subcommand("checkpoint", "inspect or export a checkpoint");
  ckpt->require_subcommand(1);
  inspect.add_to(*ckpt);
  exp.add_to(*ckpt);

  const LaunchEnv launch = launch_from_environment();
  if (const std::string why = unknown_subcommand(app, argc, argv); !why.empty()) {
    if (launch.rank == 0) std::cerr << "meshtrain: " << why << "\nRun with --help for more information." << std::endl;
    return static_cast<int>(CLI::ExitCodes::ExtrasError);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Usage errors: every rank parses the same argv, so every rank exits alike.
    return launch.rank == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 2);
  }
  setup_logging(launch.rank, launch.size, verbose);
  Command* chosen = nullptr;
  for (Command* c : std::initializer_list<Command*>{&train, &eval, &generate, &prepare, &plan, &bench, &inspect, &exp,
                                                   &flight})
    if (c->chosen()) chosen = c;
  MT_ASSERT(chosen, "no subcommand parsed");
  const std::optional<Config> watched = chosen->config_to_watch();
  Runtime& runtime = start_mpi(started, watched ? &*watched : nullptr, launch, &argc, &argv, verbose);
  chosen->run(runtime, started.watchdog.get());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Nothing touches MPI before start_mpi (in run): a usage or config error
  // ends every rank alike before MPI_Init, and mpirun ends the job.
  meshtrain::ignore_file_size_signal();  // a write past `ulimit -f` fails with a message instead
  Started started;
  try {
    const int rc = run(argc, argv, started);
    if (started.watchdog) started.watchdog->beat("shutting down (MPI_Finalize waits for every rank)");
    started.runtime.reset();
    return rc;
  } catch (const meshtrain::Stopped& e) {
    // Every rank agreed to stop (or only one process works): no abort needed.
    if (spdlog::default_logger()) spdlog::warn("{}", e.what());
    return 128 + e.signal_number();
  } catch (const std::exception& e) {
    // libtorch appends its C++ stack trace to its messages (also when a
    // message of ours wraps one): the reader needs the first line, not frames.
    std::string msg = e.what();
    if (const auto at = msg.find("\nException raised from "); at != std::string::npos) msg.resize(at);
    if (spdlog::default_logger()) spdlog::error("{}", msg);
    else std::cerr << "meshtrain: " << msg << std::endl;
    std::cerr.flush();
    if (started.runtime && started.runtime->size() > 1) started.runtime->abort(1);
    return 1;
  }
}
