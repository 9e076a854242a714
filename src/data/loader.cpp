#include "meshtrain/data/loader.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "meshtrain/core/check.h"

namespace meshtrain {

void to_json(nlohmann::json& j, const Cursor& c) {
  j = nlohmann::json{{"epoch", c.epoch}, {"shard", c.shard}, {"position", c.position}};
}

void from_json(const nlohmann::json& j, Cursor& c) {
  try {
    c.epoch = j.at("epoch").get<int64_t>();
    c.shard = j.at("shard").get<int64_t>();
    c.position = j.at("position").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    MT_FAIL("data cursor ", j.dump(), " is malformed (expected epoch, shard, position): ", e.what());
  }
}

DataLoader::DataLoader(const std::string& folder, int64_t T, int64_t global_batch, int dp_rank, int dp_size,
                       int64_t vocab_size)
    : paths_(list_shards(folder)),
      T_(T),
      global_batch_(global_batch),
      dp_rank_(dp_rank),
      dp_size_(dp_size),
      vocab_size_(vocab_size) {
  MT_CHECK(T > 0 && global_batch > 0, "data loader for ", folder, ": T (", T, ") and batch size (", global_batch,
           ") must be positive");
  MT_CHECK(dp_size > 0 && dp_rank >= 0 && dp_rank < dp_size, "data loader: dp rank ", dp_rank,
           " is outside dp size ", dp_size);
  MT_CHECK(global_batch % dp_size == 0, "data loader for ", folder, ": batch size ", global_batch,
           " is not divisible by dp = ", dp_size);
  const int64_t need = global_batch * T + 1;
  int64_t largest = 0;
  for (const auto& p : paths_) {
    sizes_.push_back(ShardReader(p, vocab_size).size());
    largest = std::max(largest, sizes_.back());
  }
  MT_CHECK(largest >= need, "data in ", folder, " is too small for batch ", global_batch, " x T ", T,
           ": a batch needs ", need, " tokens, the largest shard holds ", largest,
           " (lower the batch size or T, or prepare more data)");
  for (size_t i = 0; i < paths_.size(); ++i) {
    MT_CHECK(sizes_[i] >= need, "shard ", paths_[i], " holds ", sizes_[i], " tokens, fewer than one batch of ",
             global_batch, " x T ", T, " + 1 = ", need, " (remove it or re-prepare with larger shards)");
  }
}

int64_t DataLoader::total_tokens() const {
  int64_t total = 0;
  for (int64_t s : sizes_) total += s;
  return total;
}

const ShardReader& DataLoader::shard(int64_t index) {
  const auto& path = paths_[static_cast<size_t>(index)];
  if (!current_ || current_->path() != path) current_.emplace(path, vocab_size_);
  return *current_;
}

Batch DataLoader::next(int64_t global_batch) {
  MT_CHECK(global_batch > 0 && global_batch <= global_batch_ && global_batch % dp_size_ == 0, "data loader: batch of ",
           global_batch, " sequences asked, expected a multiple of dp = ", dp_size_, " up to ", global_batch_);
  const int64_t need = global_batch * T_ + 1;
  if (cursor_.position + need > sizes_[static_cast<size_t>(cursor_.shard)]) {
    cursor_.position = 0;
    if (++cursor_.shard == num_shards()) {
      cursor_.shard = 0;
      ++cursor_.epoch;
    }
  }
  // Only this rank's share is read: sequences [rank*B/dp, (rank+1)*B/dp).
  const int64_t b = global_batch / dp_size_;
  const int64_t begin = cursor_.position + dp_rank_ * b * T_;
  std::vector<int32_t> tokens = shard(cursor_.shard).read(begin, b * T_ + 1);
  cursor_.position += global_batch * T_;
  auto window = torch::from_blob(tokens.data(), {static_cast<int64_t>(tokens.size())}, torch::kInt32)
                    .to(torch::kInt64);
  return {window.slice(0, 0, b * T_).view({b, T_}), window.slice(0, 1, b * T_ + 1).view({b, T_})};
}

void DataLoader::restore(const Cursor& c) {
  MT_CHECK(c.epoch >= 0 && c.shard >= 0 && c.shard < num_shards(), "data cursor (epoch ", c.epoch, ", shard ",
           c.shard, ") does not fit the ", num_shards(), " shards of this data (data changed since the checkpoint?)");
  MT_CHECK(c.position >= 0 && c.position <= sizes_[static_cast<size_t>(c.shard)], "data cursor position ",
           c.position, " is past the end of shard ", paths_[static_cast<size_t>(c.shard)], " (",
           sizes_[static_cast<size_t>(c.shard)], " tokens; data changed since the checkpoint?)");
  cursor_ = c;
}

}  // namespace meshtrain
