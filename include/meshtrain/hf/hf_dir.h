#pragma once
// Hugging Face model directories: `meshtrain checkpoint export --format hf`
// writes one; `meshtrain train --init-from-hf` reads one.
//
//   config.json                    LlamaForCausalLM or DeepseekV3ForCausalLM (hf_model.h)
//   model.safetensors              or, above max_shard_bytes, model-0000i-of-0000n.safetensors
//                                  + model.safetensors.index.json (as save_pretrained does)
//   generation_config.json         bos / eos = the tokenizer's end-of-text
//   tokenizer.json                 the run's tokenizer in the tokenizers library's format
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/config/config.h"

namespace meshtrain {

struct HfExportOptions {
  int64_t max_shard_bytes = 5'000'000'000;  // save_pretrained's default "5GB"
  std::string tokenizer;                     // tokenizer file; "": the run's data_dir/tokenizer.json
};

// Model tensors of the checkpoint (no optimizer state) as a stock model in
// out_dir, which must not exist or be empty. Refuses, listing every reason,
// a model without an exact stock equivalent. Written into a temporary
// directory renamed at the end, so a failure leaves nothing behind.
void export_hf(const std::string& ckpt_dir, const std::string& out_dir, const HfExportOptions& opts = {});

// "5GB", "500MB", "10KB" (powers of 1000, as transformers) or plain bytes.
int64_t parse_shard_size(const std::string& text);

// An HF model directory opened for reading (config.json plus one safetensors
// file or an index of shards).
class HfCheckpoint {
 public:
  explicit HfCheckpoint(const std::string& dir);
  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  bool has(const std::string& name) const { return file_of_.count(name) > 0; }
  at::Tensor tensor(const std::string& name) const;  // throws naming the directory when missing
  // Accounts for every tensor of the files against model m (from its
  // config.json): a tensor m does not have (e.g. a layer past
  // num_hidden_layers), one m needs that is missing, a shape other than m's
  // (HF's unpadded vocabulary rows), an integer or bool dtype, a tensor in a
  // shard that the index does not list there, a *.safetensors file the index
  // does not name -- each is an error naming the tensor and its file, all
  // listed in one message. Headers only: no weights are read (except
  // lm_head.weight of a tied model, which must equal the embedding).
  void check_tensors(const ModelConfig& m) const;

 private:
  std::string dir_;
  nlohmann::json config_;
  std::map<std::string, std::string> file_of_;          // tensor -> file name
  std::map<std::string, SafetensorsFile> files_;
};

// cfg with its model_config derived from dir/config.json (model_config_from_hf:
// architecture keys from the file, T / dropout / capacity / init / dtype kept),
// validated again.
Config with_hf_model(Config cfg, const std::string& dir);

// A run started with --init-from-hf has the HF model's model_config, not its
// config file's: its checkpoints say so ("init_from_hf" in trainer_state.json).
// When the checkpoint a run would load (`checkpoint`, or the newest of the run
// directory when empty) carries it, returns cfg with that checkpoint's
// model_config (T / dropout / capacity / init / dtype kept, as with_hf_model),
// sets *hf_dir and *from to the HF directory and the checkpoint; else returns cfg.
Config with_checkpoint_hf_model(Config cfg, const std::string& checkpoint, std::string* hf_dir, std::string* from);

// The model's parameters by meshtrain global name (full tensors, fp32) read
// from an HF directory, for model m (from model_config_from_hf).
std::map<std::string, at::Tensor> load_hf_model(const std::string& dir, const ModelConfig& m);

}  // namespace meshtrain
