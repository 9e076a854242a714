#pragma once
// Which files a run reads, from data_config: its own data_dir (meshtrain
// shards or nanoGPT's train.bin/val.bin) or a weighted blend of datasets
// (training) with data_dir's validation shards. A missing folder fails here,
// before the model is built, naming the key that points at it.
#include <memory>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/data/data_tokenizer.h"
#include "meshtrain/data/loader.h"

namespace meshtrain {

// Every dataset the run reads with its shard files, for the tokenizer check
// (data/data_tokenizer.h): the training data (data_dir or each blend member)
// and the validation data (data_dir).
std::vector<DatasetFiles> run_datasets(const Config& cfg);

struct RunLoaders {
  std::unique_ptr<DataLoader> train, val;
};
// This dp rank's training and validation loaders.
RunLoaders make_loaders(const Config& cfg, int dp_rank, int dp);

// The end-of-text token id of the data in data_dir (document masking's
// boundary): manifest.json's "eot" (prepare-data writes it), else the eot of
// its tokenizer.json; neither is an error naming data_config.eot_token.
int64_t data_eot_token(const DataConfig& data);

}  // namespace meshtrain
