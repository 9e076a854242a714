// meshtrain: the command line, and nothing else. Each subcommand parses its
// flags, loads and validates the config, then hands over to the library:
//   train / eval / generate -> train/trainer.h (the loop, evaluation, sampling)
//   prepare-data            -> data/prepare.h (corpus -> tokenizer + shards)
//   checkpoint ...          -> ckpt/checkpoint.h (inspect, export)
//   plan / bench            -> train/plan.h, train/bench.h (estimates, timed steps)
// Errors are exceptions; here they become one log line and a non-zero exit,
// and with several ranks an MPI_Abort so no rank waits forever.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/export_guard.h"
#include "meshtrain/hf/hf_dir.h"
#include "meshtrain/hf/init_from_hf.h"
#include "meshtrain/config/load.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/launch_env.h"
#include "meshtrain/core/log.h"
#include "meshtrain/core/stop_signal.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/dist/runtime.h"
#include "meshtrain/train/bench.h"
#include "meshtrain/train/meta_bench.h"
#include "meshtrain/train/plan.h"
#include "meshtrain/train/test_hooks.h"
#include "meshtrain/train/trainer.h"

namespace {

using namespace meshtrain;

// Integers as written: every character a digit (after an optional sign), the
// value fits int64 (CLI11 alone would saturate 99999999999999999999 to
// INT64_MAX) and is >= lo. CLI11 puts the flag's name before the message.
CLI::Validator integer_at_least(int64_t lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [p, ec] = std::from_chars(text.data() + (text.size() > 1 && text[0] == '+'), end, v);
        if (ec == std::errc::result_out_of_range) return "value " + text + " does not fit a 64-bit integer";
        if (ec != std::errc() || p != end || text.empty()) return "value '" + text + "' is not an integer";
        if (v < lo) return "value " + text + " must be >= " + std::to_string(lo);
        return "";
      },
      "INT>=" + std::to_string(lo));
}

// A finite number >= lo.
CLI::Validator number_at_least(double lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0') return "value '" + text + "' is not a number";
        if (errno == ERANGE || !std::isfinite(v)) return "value " + text + " is out of range";
        if (v < lo) return "value " + text + " must be >= " + std::to_string(lo);
        return "";
      },
      "NUMBER>=" + std::to_string(lo));
}

// A string flag must say something: --name "" is a mistake, not "the default".
CLI::Validator non_empty() {
  return CLI::Validator([](std::string& text) { return text.empty() ? std::string("must not be empty") : ""; }, "TEXT");
}

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
Config model_of_hf_run(Config cfg, const std::string& checkpoint, TrainOptions& o) {
  std::string from;
  cfg = with_checkpoint_hf_model(cfg, checkpoint, &o.init_from_hf, &from);
  if (!from.empty())
    spdlog::info("{} was initialised from the Hugging Face model {}: model_config comes from the checkpoint, not "
                 "the config file", from, o.init_from_hf);
  return cfg;
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

int run(int argc, char** argv, Started& started) {
  CLI::App app{"meshtrain: train transformer language models over a dp x pp x tp mesh"};
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "debug logging");

  ConfigFlags train_flags, eval_flags, gen_flags;
  TrainOptions train_opts;
  auto* train = app.add_subcommand("train", "train (resumes from the newest checkpoint of the run dir)");
  train_flags.add_to(train);
  auto* fresh_opt = train->add_flag("--fresh", train_opts.fresh, "start over, ignoring existing checkpoints");
  // Resuming from further back: newer checkpoints of the run are set aside
  // (*.superseded) at its first save, and metrics.jsonl drops the rows after it.
  train->add_option("--checkpoint", train_opts.checkpoint,
                    "resume from this checkpoint dir (a step_XXXXXXXX folder) instead of the newest")
      ->check(CLI::ExistingDirectory)
      ->excludes(fresh_opt);
  train->add_flag("--allow-tokenizer-change", train_opts.allow_tokenizer_change,
                  "resume a checkpoint on data made by another tokenizer (a warning instead of the refusal)");
  std::string init_from_hf;
  train->add_option("--init-from-hf", init_from_hf,
                    "start from a Hugging Face Llama / DeepSeek-V3 directory (model_config from its config.json)")
      ->check(CLI::ExistingDirectory);

  std::string eval_ckpt, gen_ckpt;
  bool eval_random = false, gen_random = false;
  auto* eval = app.add_subcommand("eval", "validation loss of a checkpoint");
  eval_flags.add_to(eval);
  eval->add_option("--checkpoint", eval_ckpt, "checkpoint dir (default: newest of the run)")
      ->check(CLI::ExistingDirectory);
  eval->add_flag("--random_weights", eval_random, "evaluate the untrained model when the run has no checkpoint");

  std::string prompt;
  int64_t max_tokens = 0, top_k = 0;
  double temperature = 0;
  auto* gen = app.add_subcommand("generate", "sample text from a checkpoint");
  gen_flags.add_to(gen);
  gen->add_option("--checkpoint", gen_ckpt, "checkpoint dir (default: newest of the run)")
      ->check(CLI::ExistingDirectory);
  gen->add_flag("--random_weights", gen_random, "sample from the untrained model when the run has no checkpoint");
  auto* prompt_opt = gen->add_option("--prompt", prompt, "prompt text");
  auto* max_tokens_opt = gen->add_option("--max_tokens", max_tokens, "tokens to sample")->check(integer_at_least(0));
  auto* top_k_opt =
      gen->add_option("--top_k", top_k, "sample among the k most likely (0: all)")->check(integer_at_least(0));
  auto* temperature_opt =
      gen->add_option("--temperature", temperature, "softmax temperature (0: greedy)")->check(number_at_least(0));

  PrepareOptions prep;
  auto* prepare = app.add_subcommand("prepare-data", "text files -> tokenizer + token shards");
  prepare->add_option("--input", prep.inputs, "text files or folders")->required()->check(non_empty());
  prepare->add_option("--output", prep.output_dir, "output data dir")->required()->check(non_empty());
  auto* vs = prepare->add_option("--vocab-size", prep.vocab_size, "train a byte-level BPE of this size")
                 ->check(integer_at_least(257));
  auto* tk = prepare->add_option("--tokenizer", prep.tokenizer_file,
                                 "*.tiktoken vocabulary, or tokenizer.json (meshtrain's or Hugging Face byte-level BPE)")
                 ->check(non_empty());
  vs->excludes(tk);
  prepare->add_option("--pattern", prep.pattern,
                      "pre-tokenizer regex or gpt2|cl100k|o200k (default: the vocabulary's own; gpt2 when training)")
      ->check(non_empty());
  prepare->add_option("--val-fraction", prep.val_fraction, "fraction of documents for validation (default 0.05)")
      ->check(number_at_least(0));
  prepare->add_option("--seed", prep.seed, "seed of the train/val document split")->check(integer_at_least(0));
  prepare->add_option("--text-key", prep.text_key, "JSON Lines / JSON / Parquet field with the text (default text)")
      ->check(non_empty());
  prepare->add_option("--text-split", prep.text_split,
                      "plain text documents: paragraph (blank lines; fortune files at %), line or file")
      ->check(CLI::IsMember({"paragraph", "line", "file"}));
  prepare->add_option("--workers", prep.workers, "tokenizing threads (default 0: all cores)")
      ->check(integer_at_least(0));
  prepare->add_option("--shard-tokens", prep.shard_tokens, "tokens per shard (default 10000000)")
      ->check(integer_at_least(1));
  bool prep_verbose = false;
  prepare->add_flag("-v,--verbose", prep_verbose, "list every skipped input (default: one line per reason)");

  ConfigFlags plan_flags, bench_flags;
  double device_gib = 0;
  bool plan_json = false;
  std::string plan_dev;
  auto* plan = app.add_subcommand("plan", "parameters (total/active), memory per rank, FLOPs per token");
  plan_flags.add_to(plan);
  plan->add_option("--device-memory-gb", device_gib, "device memory in GiB: say whether the run fits")
      ->check(number_at_least(0));
  plan->add_option("--device", plan_dev, "plan for cpu or cuda (default: the config's device, auto: this machine)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  plan->add_flag("--json", plan_json, "print one JSON object instead of the report");

  BenchOptions bench_opts;
  MetaBenchOptions meta_opts;
  std::string bench_device;
  auto* bench = app.add_subcommand("bench", "time training steps: tokens/s, MFU, peak memory");
  bench_flags.add_to(bench);
  bench->add_option("--steps", bench_opts.steps, "timed steps")->check(integer_at_least(1));
  bench->add_option("--warmup", bench_opts.warmup, "untimed warm-up steps")->check(integer_at_least(0));
  bench->add_option("--peak-tflops", bench_opts.peak_tflops,
                    "device peak TFLOP/s for MFU (default: known GPUs; with --device meta: 989, an H100's dense bf16)")
      ->check(number_at_least(0));
  bench->add_option("--device", bench_device,
                    "meta: the performance model, no GPU needed. Runs one full-size step on the meta device (one "
                    "unsharded rank, n_device_axis taken as [1,1,1]) and counts GEMM/attention FLOPs, bytes of every "
                    "other kernel, kernels and host syncs; est_step_ms = (GEMM+attention FLOPs) / (efficiency x peak) "
                    "+ non-GEMM bytes / bandwidth, nothing overlapped, launch latency ignored")
      ->check(CLI::IsMember({"meta"}));
  bench->add_option("--efficiency", meta_opts.efficiency,
                    "--device meta: fraction of the peak GEMMs and attention reach (default 0.6)");
  bench->add_option("--bandwidth-tbps", meta_opts.bandwidth_tbps,
                    "--device meta: memory bandwidth in TB/s (default 3.35, an H100 SXM)");
  bench->add_option("--top-ops", meta_opts.top_ops, "--device meta: operators listed in the table (default 15)")
      ->check(integer_at_least(0));

  auto* ckpt = app.add_subcommand("checkpoint", "inspect or export a checkpoint");
  ckpt->require_subcommand(1);
  std::string inspect_dir, export_dir, export_out, export_format = "safetensors", shard_size = "5GB";
  HfExportOptions hf_opts;
  auto* inspect = ckpt->add_subcommand("inspect", "list tensors, shapes and trainer state");
  inspect->add_option("dir", inspect_dir, "checkpoint dir")->required()->check(CLI::ExistingDirectory);
  auto* exp = ckpt->add_subcommand("export", "write one unsharded safetensors file, or a Hugging Face model dir");
  exp->add_option("dir", export_dir, "checkpoint dir")->required()->check(CLI::ExistingDirectory);
  exp->add_option("--output", export_out, "output .safetensors file (--format hf: output directory)")
      ->required()
      ->check(non_empty());
  exp->add_option("--format", export_format, "safetensors (every tensor, one file) or hf (stock Llama / DeepSeek-V3)")
      ->check(CLI::IsMember({"safetensors", "hf"}));
  auto* shard_size_opt =
      exp->add_option("--max-shard-size", shard_size, "--format hf: largest weights file (e.g. 5GB, 500MB)");
  auto* hf_tok_opt =
      exp->add_option("--tokenizer", hf_opts.tokenizer, "--format hf: tokenizer file (default: the run's data_dir)")
          ->check(CLI::ExistingFile);

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

  // train / eval / generate: the config first, so the watchdog (its
  // watchdog_seconds, the run dir's heartbeats) is armed before MPI_Init.
  std::optional<Config> watched;
  if (*train) {
    watched = train_flags.load().config;
    if (!init_from_hf.empty()) watched = with_hf_model(*watched, init_from_hf);
  } else if (*eval) {
    watched = eval_flags.load().config;
  } else if (*gen) {
    LoadedConfig lc = gen_flags.load();
    if (prompt_opt->count()) lc.config.inference.prompt = prompt;
    if (max_tokens_opt->count()) lc.config.inference.max_tokens = max_tokens;
    if (top_k_opt->count()) lc.config.inference.top_k = top_k;
    if (temperature_opt->count()) lc.config.inference.temperature = temperature;
    validate(lc.config);  // the flags above bypassed load_config's checks (max_tokens bound)
    watched = lc.config;
  }
  Runtime& runtime = start_mpi(started, watched ? &*watched : nullptr, launch, &argc, &argv, verbose);

  if (*train) {
    Config cfg = *watched;
    if (!init_from_hf.empty()) {
      train_opts.init_from_hf = std::filesystem::absolute(init_from_hf).lexically_normal().string();
    } else if (!train_opts.fresh) {
      cfg = model_of_hf_run(cfg, "", train_opts);
    }
    train_opts.watchdog = started.watchdog.get();
    train_opts.check_shared_run_dir = true;
    Trainer trainer(cfg, runtime, train_opts);
    // A run that resumed its own checkpoint continues from it, not from the HF weights again.
    if (!init_from_hf.empty() && trainer.step() == 0) load_hf_weights(trainer.model(), trainer.mesh(), init_from_hf);
    trainer.train();
  } else if (*eval) {
    TrainOptions o;
    o.checkpoint = eval_ckpt;
    o.require_checkpoint = !eval_random;
    o.watchdog = started.watchdog.get();
    Trainer trainer(model_of_hf_run(*watched, eval_ckpt, o), runtime, o);
    const double v = trainer.evaluate();
    spdlog::info("step {}: val_loss {:.4f}", trainer.step(), v);
    if (runtime.rank() == 0) std::cout << "val_loss " << v << std::endl;
  } else if (*gen) {
    TrainOptions o;
    o.checkpoint = gen_ckpt;
    o.require_checkpoint = !gen_random;
    o.watchdog = started.watchdog.get();
    Trainer trainer(model_of_hf_run(*watched, gen_ckpt, o), runtime, o);
    const std::string text = trainer.sample();
    if (runtime.rank() == 0) std::cout << text << std::endl;
  } else if (*prepare) {
    if (runtime.rank() == 0) {
      const bool tty = ::isatty(STDERR_FILENO) != 0;
      if (tty) prep.progress = show_progress;
      const PrepareSummary s = prepare_data(prep);
      if (tty) std::fprintf(stderr, "\n");
      for (const auto& r : s.removed_leftovers)
        spdlog::info("prepare-data: removed {}, the leftover of a prepare-data run that was killed", r);
      // A folder of a few real inputs among many index files or links would
      // bury the result under one line each: per reason by default.
      if (prep_verbose || verbose)
        for (const auto& [file, reason] : s.skipped) spdlog::info("prepare-data: skipped {}: {}", file, reason);
      else
        for (const auto& line : skipped_summary(s)) spdlog::info("{}", line);
      spdlog::info("{}", to_string(s));
    }
  } else if (*plan) {
    const Config cfg = plan_flags.load().config;
    const std::string report = plan_report(cfg, plan_device(cfg, plan_dev), device_gib, plan_json);
    if (runtime.rank() == 0) std::cout << report << std::endl;
  } else if (*bench && bench_device == "meta") {
    if (bench_opts.peak_tflops > 0) meta_opts.peak_tflops = bench_opts.peak_tflops, meta_opts.peak_name = "custom";
    const MetaBenchResult r = run_meta_bench(bench_flags.load().config, runtime, meta_opts);
    if (runtime.rank() == 0) std::cout << to_string(r) << to_json(r) << std::endl;
  } else if (*bench) {
    const BenchResult r = run_bench(bench_flags.load().config, runtime, bench_opts);
    if (runtime.rank() == 0) std::cout << to_string(r) << to_json(r) << std::endl;
  } else if (*inspect) {
    if (runtime.rank() == 0) std::cout << inspect_checkpoint(inspect_dir);
  } else if (*exp) {
    const bool hf = export_format == "hf";
    // A plain export is one file with every tensor: these would be ignored.
    for (const auto* o : {shard_size_opt, hf_tok_opt})
      MT_CHECK(hf || o->count() == 0, "checkpoint export: ", o->get_name(), " applies to --format hf only (a plain ",
               "export is one safetensors file of every tensor); drop it or add --format hf");
    if (hf) hf_opts.max_shard_bytes = parse_shard_size(shard_size);
    if (runtime.rank() == 0) {
      for (const auto& r : remove_export_leftovers(export_out, hf))
        spdlog::info("removed {}, the leftover of an export that was killed", r);
      if (hf) export_hf(export_dir, export_out, hf_opts);
      else export_checkpoint(export_dir, export_out);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Nothing touches MPI before start_mpi (in run): a usage or config error
  // ends every rank alike before MPI_Init, and mpirun ends the job.
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
