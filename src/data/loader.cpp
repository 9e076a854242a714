#include "meshtrain/data/loader.h"

#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>

#include "meshtrain/core/check.h"

namespace fs = std::filesystem;

namespace meshtrain {

void to_json(nlohmann::json& j, const Cursor& c) {
  j = nlohmann::json{{"epoch", c.epoch}, {"shard", c.shard}, {"position", c.position}};
  if (!c.parts.empty()) {
    j["parts"] = c.parts;
    j["drawn"] = c.drawn;
  }
}

void from_json(const nlohmann::json& j, Cursor& c) {
  try {
    c.epoch = j.at("epoch").get<int64_t>();
    c.shard = j.at("shard").get<int64_t>();
    c.position = j.at("position").get<int64_t>();
    c.parts = j.contains("parts") ? j.at("parts").get<std::vector<Cursor>>() : std::vector<Cursor>{};
    c.drawn = j.contains("drawn") ? j.at("drawn").get<std::vector<int64_t>>() : std::vector<int64_t>{};
  } catch (const nlohmann::json::exception& e) {
    MT_FAIL("data cursor ", j.dump(), " is malformed (expected epoch, shard, position): ", e.what());
  }
}

DataLoader::DataLoader(const std::string& folder, int64_t T, int64_t global_batch, int dp_rank, int dp_size,
                       int64_t vocab_size)
    : DataLoader(list_shards(folder), ShardFormat::kLlmc, T, global_batch, dp_rank, dp_size, vocab_size) {}

DataLoader::DataLoader(std::vector<std::string> files, ShardFormat format, int64_t T, int64_t global_batch,
                       int dp_rank, int dp_size, int64_t vocab_size)
    : paths_(std::move(files)),
      T_(T),
      global_batch_(global_batch),
      dp_rank_(dp_rank),
      dp_size_(dp_size),
      vocab_size_(vocab_size),
      format_(format) {
  MT_CHECK(!paths_.empty(), "data loader: no token files given");
  const std::string folder = fs::path(paths_.front()).parent_path().string();
  MT_CHECK(T > 0 && global_batch > 0, "data loader for ", folder, ": T (", T, ") and batch size (", global_batch,
           ") must be positive");
  MT_CHECK(dp_size > 0 && dp_rank >= 0 && dp_rank < dp_size, "data loader: dp rank ", dp_rank,
           " is outside dp size ", dp_size);
  MT_CHECK(global_batch % dp_size == 0, "data loader for ", folder, ": batch size ", global_batch,
           " is not divisible by dp = ", dp_size);
  const int64_t need = global_batch * T + 1;
  int64_t largest = 0;
  for (const auto& p : paths_) {
    readers_.emplace_back(p, vocab_size, format_);
    sizes_.push_back(readers_.back().size());
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

DataLoader::DataLoader(std::vector<DataSource> sources, int64_t T, int64_t global_batch, int dp_rank, int dp_size,
                       int64_t vocab_size)
    : T_(T), global_batch_(global_batch), dp_rank_(dp_rank), dp_size_(dp_size), vocab_size_(vocab_size) {
  MT_CHECK(!sources.empty(), "data loader: no datasets given");
  if (sources.size() == 1) {
    *this = DataLoader(sources[0].files, sources[0].format, T, global_batch, dp_rank, dp_size, vocab_size);
    return;
  }
  MT_CHECK(T > 0 && global_batch > 0, "data blend: T (", T, ") and batch size (", global_batch,
           ") must be positive");
  MT_CHECK(dp_size > 0 && dp_rank >= 0 && dp_rank < dp_size, "data loader: dp rank ", dp_rank,
           " is outside dp size ", dp_size);
  MT_CHECK(global_batch % dp_size == 0, "data blend: batch size ", global_batch, " is not divisible by dp = ",
           dp_size);
  double total = 0;
  for (const auto& s : sources) total += s.weight;
  for (size_t d = 0; d < sources.size(); ++d) {
    const auto& src = sources[d];
    MT_CHECK(!src.files.empty() && src.weight > 0, "data blend: dataset ", d, " has no files or a weight <= 0");
    Part part{src.files, {}, src.format, src.weight / total};
    for (const auto& p : part.paths) {
      part.readers.emplace_back(p, vocab_size, src.format);
      part.sizes.push_back(part.readers.back().size());
      MT_CHECK(part.sizes.back() >= T + 1, "shard ", p, " holds ", part.sizes.back(),
               " tokens, fewer than one sequence of T + 1 = ", T + 1);
    }
    parts_.push_back(std::move(part));
  }
  cursor_ = Cursor{};
  cursor_.parts.assign(parts_.size(), Cursor{});
  cursor_.drawn.assign(parts_.size(), 0);
}

int64_t DataLoader::total_tokens() const {
  int64_t total = 0;
  for (int64_t s : sizes_) total += s;
  for (const auto& p : parts_) total = std::accumulate(p.sizes.begin(), p.sizes.end(), total);
  return total;
}

int64_t DataLoader::num_shards() const {
  auto n = static_cast<int64_t>(paths_.size());
  for (const auto& p : parts_) n += static_cast<int64_t>(p.paths.size());
  return n;
}

Batch DataLoader::next_blended(int64_t global_batch) {
  const int64_t b = global_batch / dp_size_;
  std::vector<int32_t> rows(static_cast<size_t>(b * (T_ + 1)));
  for (int64_t s = 0; s < global_batch; ++s) {
    // Every rank walks the whole global batch so the cursors stay identical;
    // only its own share of the sequences is read.
    const auto next_sample = static_cast<double>(std::accumulate(cursor_.drawn.begin(), cursor_.drawn.end(), int64_t{0}) + 1);
    size_t d = 0;
    double best = -1e300;
    for (size_t k = 0; k < parts_.size(); ++k) {
      double lag = parts_[k].weight * next_sample - static_cast<double>(cursor_.drawn[k]);
      if (lag > best) {
        best = lag;
        d = k;
      }
    }
    Part& part = parts_[d];
    Cursor& c = cursor_.parts[d];
    if (c.position + T_ + 1 > part.sizes[static_cast<size_t>(c.shard)]) {
      c.position = 0;
      if (++c.shard == static_cast<int64_t>(part.paths.size())) {
        c.shard = 0;
        ++c.epoch;
      }
    }
    const int64_t row = s - dp_rank_ * b;
    if (row >= 0 && row < b) {
      auto tokens = part.readers[static_cast<size_t>(c.shard)].read(c.position, T_ + 1);
      std::copy(tokens.begin(), tokens.end(), rows.begin() + row * (T_ + 1));
    }
    c.position += T_;
    ++cursor_.drawn[d];
  }
  auto all = torch::from_blob(rows.data(), {b, T_ + 1}, torch::kInt32).to(torch::kInt64);
  return {all.slice(1, 0, T_).contiguous(), all.slice(1, 1, T_ + 1).contiguous()};
}

Batch DataLoader::next(int64_t global_batch) {
  MT_CHECK(global_batch > 0 && global_batch <= global_batch_ && global_batch % dp_size_ == 0, "data loader: batch of ",
           global_batch, " sequences asked, expected a multiple of dp = ", dp_size_, " up to ", global_batch_);
  if (!parts_.empty()) return next_blended(global_batch);
  const int64_t need = global_batch * T_ + 1;
  if (cursor_.position + need > sizes_[static_cast<size_t>(cursor_.shard)]) {
    cursor_.position = 0;
    if (++cursor_.shard == static_cast<int64_t>(paths_.size())) {
      cursor_.shard = 0;
      ++cursor_.epoch;
    }
  }
  // Only this rank's share is read: sequences [rank*B/dp, (rank+1)*B/dp).
  const int64_t b = global_batch / dp_size_;
  const int64_t begin = cursor_.position + dp_rank_ * b * T_;
  std::vector<int32_t> tokens = readers_[static_cast<size_t>(cursor_.shard)].read(begin, b * T_ + 1);
  cursor_.position += global_batch * T_;
  auto window = torch::from_blob(tokens.data(), {static_cast<int64_t>(tokens.size())}, torch::kInt32)
                    .to(torch::kInt64);
  return {window.slice(0, 0, b * T_).view({b, T_}), window.slice(0, 1, b * T_ + 1).view({b, T_})};
}

void DataLoader::restore(const Cursor& c) {
  if (!parts_.empty()) {
    MT_CHECK(c.parts.size() == parts_.size() && c.drawn.size() == parts_.size(), "data cursor holds ",
             c.parts.size(), " dataset cursors, the blend has ", parts_.size(),
             " datasets (data_config.datasets changed since the checkpoint?)");
    for (size_t d = 0; d < parts_.size(); ++d) {
      const Cursor& p = c.parts[d];
      MT_CHECK(p.shard >= 0 && p.shard < static_cast<int64_t>(parts_[d].paths.size()) && p.position >= 0 &&
                   p.position <= parts_[d].sizes[static_cast<size_t>(p.shard)] && c.drawn[d] >= 0,
               "data cursor of blend dataset ", d, " (shard ", p.shard, ", position ", p.position,
               ") does not fit its data (data changed since the checkpoint?)");
    }
    cursor_ = c;
    return;
  }
  MT_CHECK(c.parts.empty(), "data cursor is a blend's, but data_config.datasets is not set");
  MT_CHECK(c.epoch >= 0 && c.shard >= 0 && c.shard < static_cast<int64_t>(paths_.size()), "data cursor (epoch ",
           c.epoch, ", shard ", c.shard, ") does not fit the ", paths_.size(), " shards of this data (data changed since the checkpoint?)");
  MT_CHECK(c.position >= 0 && c.position <= sizes_[static_cast<size_t>(c.shard)], "data cursor position ",
           c.position, " is past the end of shard ", paths_[static_cast<size_t>(c.shard)], " (",
           sizes_[static_cast<size_t>(c.shard)], " tokens; data changed since the checkpoint?)");
  cursor_ = c;
}

}  // namespace meshtrain
