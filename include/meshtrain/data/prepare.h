#pragma once
// `meshtrain prepare-data`: corpus files -> tokenizer + train/val token shards.
// Layout of output_dir: tokenizer.json, manifest.json, train/train_000000.bin ...,
// val/val_000000.bin ... Built in a temporary folder beside output_dir and
// renamed at the end, so a failure leaves nothing half-written.
//
// Streaming: one thread reads and decompresses the inputs in order and cuts
// them into documents, --workers threads tokenize batches of documents, and
// one thread writes the tokens in input order to shards of shard_tokens
// tokens as they fill. Memory is bounded by the batches in flight and one
// shard per split, not by the corpus; the output does not depend on the
// number of workers.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain {

struct PrepareProgress {
  int64_t bytes_done = 0, bytes_total = 0;  // input bytes on disk (compressed)
  int64_t documents = 0, tokens = 0;
  double seconds = 0;
};

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or folders (recursive)
  std::string output_dir;
  int64_t vocab_size = 0;           // > 0: train a BPE tokenizer of this size ...
  std::string tokenizer_file;       // ... or use this *.tiktoken / tokenizer.json (exactly one of the two)
  std::string pattern;              // pre-tokenizer: gpt2, cl100k, o200k or a regex ("": the vocabulary's)
  double val_fraction = 0.05;       // share of documents held out, in (0, 1) (at least one)
  int64_t shard_tokens = 10'000'000;
  uint64_t seed = 0;                // which documents go to validation
  std::string text_key = "text";    // JSON Lines / JSON / Parquet field holding the text
  std::string text_split = "paragraph";  // plain text documents: paragraph, line or file
  int workers = 0;                  // tokenizing threads; 0: all cores
  // Training a tokenizer reads the train documents up to this many bytes.
  int64_t tokenizer_train_bytes = int64_t{256} << 20;
  // Called about twice a second from the reading thread (may be empty).
  std::function<void(const PrepareProgress&)> progress;
};

struct PrepareSummary {
  int64_t files = 0;
  std::vector<std::pair<std::string, std::string>> skipped;  // file, reason
  int64_t train_documents = 0, val_documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  int64_t input_bytes = 0;
  int64_t vocab_size = 0;
  int workers = 0;
  double seconds = 0;
  std::string output_dir;
  // OUT.tmp-PID folders of killed runs that this run removed (for the log).
  std::vector<std::string> removed_leftovers;
};
// One line for the log: files, documents, tokens, vocabulary, time.
std::string to_string(const PrepareSummary& s);
// The skipped inputs in one line per reason: how many, one example, and where
// the full list is (output_dir/manifest.json). Duplicates (the same file
// reached twice, or a link to a file already read) are one reason whatever
// file they duplicate. Empty when nothing was skipped.
std::vector<std::string> skipped_summary(const PrepareSummary& s);

// Returns what it did rather than logging it: spdlog's fmt clashes with the
// fmt bundled in libtorch's include folder, so data/ does not include spdlog.
PrepareSummary prepare_data(const PrepareOptions& options);

}  // namespace meshtrain
