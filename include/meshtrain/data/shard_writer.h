#pragma once
// Token shards written while a corpus streams through prepare-data: full
// shards of shard_tokens tokens go to disk as they fill, so memory holds one
// shard whatever the corpus size. Files are named <prefix>_000000.bin ...
// in llm.c's formats (shards.h).
#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

class ShardWriter {
 public:
  // uint32: llm.c's uint32 format (magic 20240801, version 7), else uint16
  // (magic 20240520, version 1). tokenizer_fingerprint goes into every
  // shard's header (shards.h; "" for none).
  ShardWriter(std::string folder, std::string prefix, int64_t shard_tokens, bool uint32,
              std::string tokenizer_fingerprint = "");

  void append(const std::vector<int32_t>& tokens);
  // Writes what is left. A tail shorter than half a shard is appended to the
  // previous shard instead (a loader with a large batch would refuse a tiny
  // last shard). Returns the file names, in order.
  std::vector<std::string> finish();

  int64_t tokens() const { return written_ + static_cast<int64_t>(buffer_.size()); }

 private:
  void flush_shard();
  std::string name(size_t index) const;

  std::string folder_, prefix_;
  int64_t shard_tokens_;
  bool uint32_;
  std::string fingerprint_;
  std::vector<int32_t> buffer_;
  std::vector<std::string> names_;
  int64_t written_ = 0;
};

}  // namespace meshtrain
