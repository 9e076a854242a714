#pragma once
// Which tokenizer made the data a run reads, checked before any step: token
// ids of another tokenizer are valid numbers that mean other text, so such
// data would train without any error. The evidence, strongest first: the
// dataset's manifest.json ("tokenizer_fingerprint", written by prepare-data),
// every shard's header (shards.h), the dataset's tokenizer.json. Data with
// none of them (llm.c's or nanoGPT's files, .npy, older prepare-data output
// without a tokenizer.json) cannot be checked and is read with a note.
#include <string>
#include <vector>

#include "meshtrain/data/shards.h"

namespace meshtrain {

// One dataset folder and the shard files of it that a run reads.
struct DatasetFiles {
  std::string dir;
  std::vector<std::string> files;
  ShardFormat format = ShardFormat::kLlmc;
};

struct DataTokenizer {
  std::string fingerprint;         // "" when no dataset carries one
  std::string where;               // the dataset folder it was read from
  std::vector<std::string> notes;  // one line per dataset that cannot be (fully) checked
};

// The fingerprint dir's own files claim: manifest.json's, which its
// tokenizer.json must match (else an error naming both); without one in the
// manifest, that of its tokenizer.json; else "". source: which file said it.
std::string dataset_fingerprint(const std::string& dir, std::string* source = nullptr);

// All datasets must come from one tokenizer, and within a dataset every shard
// from its dataset's: a shard of another tokenizer, or one without a
// fingerprint among fingerprinted ones, is an error naming the shard; two
// datasets of different tokenizers (a blend) an error naming both folders.
DataTokenizer check_data_tokenizer(const std::vector<DatasetFiles>& datasets);

}  // namespace meshtrain
