#pragma once
// What every meshtrain subcommand shares (src/main.cpp runs them): the flags
// that load a config, the Command interface, the memory check before a
// Session, and the subcommands defined in files of their own.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/config/load.h"
#include "meshtrain/core/watchdog.h"
#include "meshtrain/dist/runtime.h"
#include "cli_validators.h"

namespace meshtrain {

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

// Before a Session allocates what the config sizes: a model or batch that
// cannot fit is refused naming its keys (train/memory_check.h). In main.cpp.
void check_memory(const Config& cfg, const Runtime& rt);

// plan and bench: the estimates and the timed steps (estimate_commands.cpp).
std::unique_ptr<Command> make_plan_command();
std::unique_ptr<Command> make_bench_command();

}  // namespace meshtrain
