// meshtrain: the command line, and nothing else (what the subcommands share:
// cli_command.h). Each subcommand parses its flags, loads and validates the
// config, then hands over to the library:
//   train                   -> train/trainer.h (the loop over a train/session.h Session)
//   eval / generate         -> a Session, then train/evaluate.h or train/sample.h
//   prepare-data            -> data/prepare.h (corpus -> tokenizer + shards)
//   checkpoint ...          -> ckpt/checkpoint.h (inspect, export)
//   plan / bench            -> estimate_commands.cpp: perf/plan.h, bench/bench.h (estimates, timed steps)
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
#include "meshtrain/train/memory_check.h"
#include "meshtrain/perf/plan.h"
#include "meshtrain/train/test_hooks.h"
#include "meshtrain/train/evaluate.h"
#include "meshtrain/train/sample.h"
#include "meshtrain/train/session.h"
#include "meshtrain/train/trainer.h"
#include "cli_command.h"
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
    const Evaluation e = evaluate(session);
    const double v = e.loss;
    spdlog::info("step {}: val_loss {:.4f}", session.progress().step, v);
    for (size_t k = 0; k < e.mtp_loss.size(); ++k) spdlog::info("val_mtp_loss depth {}: {:.4f}", k + 1, e.mtp_loss[k]);
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
  const std::unique_ptr<Command> plan_owned = make_plan_command(), bench_owned = make_bench_command();
  Command& plan = *plan_owned;
  Command& bench = *bench_owned;
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

namespace meshtrain {

void check_memory(const Config& cfg, const Runtime& rt) {
  const PlanDevice device = plan_device(cfg);
  check_memory_fits(cfg, device, rank_memory_budget(device, rt.local_size(), visible_cuda_devices()));
}

}  // namespace meshtrain

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
