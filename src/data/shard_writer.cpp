#include "meshtrain/data/shard_writer.h"

#include <cstdint>
#include <filesystem>

#include "meshtrain/core/check.h"
#include "meshtrain/data/shards.h"

namespace fs = std::filesystem;

namespace meshtrain {

ShardWriter::ShardWriter(std::string folder, std::string prefix, int64_t shard_tokens, bool uint32,
                         std::string tokenizer_fingerprint)
    : folder_(std::move(folder)),
      prefix_(std::move(prefix)),
      shard_tokens_(shard_tokens),
      uint32_(uint32),
      fingerprint_(std::move(tokenizer_fingerprint)) {
  MT_CHECK(shard_tokens_ > 0, "shard size must be positive, got ", shard_tokens_);
  fs::create_directories(folder_);
}

std::string ShardWriter::name(size_t index) const {
  char file[64];
  std::snprintf(file, sizeof(file), "_%06zu.bin", index);
  return prefix_ + file;
}

void ShardWriter::flush_shard() {
  names_.push_back(name(names_.size()));
  write_shard((fs::path(folder_) / names_.back()).string(), buffer_, uint32_ ? kShardVersionU32 : kShardVersionU16,
              fingerprint_);
  written_ += static_cast<int64_t>(buffer_.size());
  buffer_.clear();
}

void ShardWriter::append(const std::vector<int32_t>& tokens) {
  size_t at = 0;
  while (at < tokens.size()) {
    size_t take = std::min(tokens.size() - at, static_cast<size_t>(shard_tokens_) - buffer_.size());
    buffer_.insert(buffer_.end(), tokens.begin() + static_cast<std::ptrdiff_t>(at),
                   tokens.begin() + static_cast<std::ptrdiff_t>(at + take));
    at += take;
    if (static_cast<int64_t>(buffer_.size()) == shard_tokens_) flush_shard();
  }
}

std::vector<std::string> ShardWriter::finish() {
  if (!buffer_.empty() && !names_.empty() && static_cast<int64_t>(buffer_.size()) * 2 < shard_tokens_) {
    const std::string last = (fs::path(folder_) / names_.back()).string();
    std::vector<int32_t> merged = read_shard(last);
    written_ -= static_cast<int64_t>(merged.size());
    merged.insert(merged.end(), buffer_.begin(), buffer_.end());
    buffer_ = std::move(merged);
    names_.pop_back();
  }
  if (!buffer_.empty() || names_.empty()) flush_shard();
  return names_;
}

}  // namespace meshtrain
