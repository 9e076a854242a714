#pragma once
// `meshtrain prepare-data`: text files -> tokenizer + train/val token shards.
// Layout of output_dir: tokenizer.json, manifest.json, train/train_000000.bin ...,
// val/val_000000.bin ... Built in a temporary folder beside output_dir and
// renamed at the end, so a failure leaves nothing half-written.
#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or folders (recursive)
  std::string output_dir;
  int64_t vocab_size = 0;           // > 0: train a BPE tokenizer of this size ...
  std::string tokenizer_file;       // ... or use this *.tiktoken / tokenizer.json (exactly one of the two)
  std::string pattern;              // pre-tokenizer: gpt2, cl100k, o200k or a regex ("": the vocabulary's)
  double val_fraction = 0.05;       // share of documents held out (at least one)
  int64_t shard_tokens = 10'000'000;
  uint64_t seed = 0;                // document shuffle
};

// Documents: fortune-format files split at lines holding a single "%"; any
// other text file is one document. Skipped: *.dat index files, binary files,
// and links to files already listed (fortune's *.u8 links).
std::vector<std::string> collect_input_files(const std::vector<std::string>& inputs);
std::vector<std::string> split_documents(const std::string& text);

struct PrepareSummary {
  int64_t files = 0, skipped_binary_files = 0;
  int64_t train_documents = 0, val_documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  int64_t vocab_size = 0;
  double seconds = 0;
  std::string output_dir;
};
// One line for the log: documents, tokens, vocabulary, time.
std::string to_string(const PrepareSummary& s);

// Returns what it did rather than logging it: spdlog's fmt clashes with the
// fmt bundled in libtorch's include folder, so data/ does not include spdlog.
PrepareSummary prepare_data(const PrepareOptions& options);

}  // namespace meshtrain
