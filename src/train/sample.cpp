// Sampling from a session's model (see sample.h).
#include "meshtrain/train/sample.h"

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "meshtrain/core/log.h"
#include "meshtrain/parallel/pipeline_generate.h"
#include "meshtrain/sampling/generate.h"
#include "meshtrain/sampling/speculative.h"

namespace meshtrain {

namespace {

// Where the weights come from, for messages: trained in this process, a
// checkpoint, or the untrained model.
std::string weights_source(const Session& s) {
  const int64_t step = s.progress().step;
  if (step > s.loaded_step()) {
    char name[32];
    std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
    return "the model trained to step " + std::to_string(step) + " (checkpoint " + s.config().run_dir() +
           "/checkpoints/" + name + ")";
  }
  return s.weights_from().empty() ? std::string("the untrained model (--random_weights)")
                                  : "checkpoint " + s.weights_from();
}

}  // namespace

std::string sample_unavailable(const Config& cfg) {
  const std::string tok = (std::filesystem::path(cfg.data.data_dir) / "tokenizer.json").string();
  if (!std::filesystem::exists(tok))
    return "there is no tokenizer to encode the prompt and decode the sample: " + tok + " is missing (prepare-data " +
           "writes it beside the shards; data_config.data_dir names the folder)";
  if (cfg.sequence_parallel && cfg.device.tp() > 1)
    return "sampling with sequence_parallel over tp > 1 is not supported yet (set sequence_parallel false to sample)";
  return "";
}

std::string sample(Session& s) {
  const Config& cfg = s.config();
  const Tokenizer* tokenizer = s.tokenizer();
  if (const std::string why = sample_unavailable(cfg); !why.empty() || !tokenizer) {
    spdlog::warn("skipping the sample: {}", why.empty() ? "the data has no tokenizer" : why);
    return {};
  }
  SampleOptions so;
  so.max_tokens = cfg.inference.max_tokens;
  so.top_k = cfg.inference.top_k;
  so.temperature = cfg.inference.temperature;
  so.use_cache = cfg.inference.use_cache;
  so.seed = cfg.seed + static_cast<uint64_t>(s.progress().step);
  so.vocab_limit = tokenizer->vocab_size();
  if (cfg.inference.stop_at_eot) so.stop_token = tokenizer->eot();
  so.min_tokens = cfg.inference.min_tokens;
  so.check_stop = [&s] {
    s.watchdog().beat("sampling");
    s.stop_point("sampling");
  };
  std::vector<int32_t> prompt = tokenizer->encode(cfg.inference.prompt);
  if (prompt.empty()) prompt.push_back(tokenizer->eot());
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(cfg.inference.batch_size), prompt);
  std::vector<std::vector<int32_t>> out;
  ParallelModel& pm = s.model();
  CastScope casts(pm.model->precision());
  try {
    if (cfg.inference.speculative) {
      SpeculativeStats st;
      out = generate_speculative(*pm.model, prompts, so, &st);
      spdlog::info("speculative decoding: {} of {} drafts accepted ({:.3f}), {} forwards of the model", st.accepted,
                   st.drafted, st.acceptance(), st.forwards);
    } else if (s.mesh().shape().pp == 1) {
      out = generate(*pm.model, prompts, so);
    } else {
      pm.model->eval();
      out = generate(cfg.model, s.device(), pipeline_forward(pm, s.mesh()), pipeline_share(pm, s.mesh()), prompts,
                     so);
    }
  } catch (const NonFiniteLogits& e) {
    pm.model->train();
    throw NonFiniteLogits(std::string(e.what()) + ": the weights of " + weights_source(s) +
                          " hold NaN or inf (a diverged run? evaluate it, or sample an earlier checkpoint)");
  } catch (...) {
    pm.model->train();  // a stop throws out of the sampling loop
    throw;
  }
  pm.model->train();
  // The caller shows it: train() in its log, `generate` once on stdout.
  return cfg.inference.prompt + tokenizer->decode_text(out.at(0));
}

}  // namespace meshtrain
