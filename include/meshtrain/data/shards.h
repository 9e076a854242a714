#pragma once
// Token shards in llm.c's formats (docs/ARCHITECTURE.md, "Files"): a header of 256 int32
// (magic, version, token count) then the tokens: uint16 with magic 20240520
// version 1 (GPT-2), uint32 with magic 20240801 version 7 (llm.c's Llama-3
// format). meshtrain's older uint32 files (magic 20240520 version 2) are still
// read. Also read: .npy arrays of any integer dtype with shape (N,) or (N, 1),
// and nanoGPT's headerless uint16 train.bin / val.bin (ShardFormat::kNanoGpt).
//
// meshtrain's own shards also carry the fingerprint of the tokenizer that
// made them (tokenizer_fingerprint.h) in header slots llm.c leaves zero:
// header[3] = kShardFingerprintTag, header[4..5] = the 64 bits, low word
// first. llm.c's readers (llmc/dataloader.h, the Python loaders beside it)
// check only header[0..2] and the file size, so they read these files as before.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace meshtrain {

constexpr int32_t kShardMagic = 20240520;     // uint16 (version 1); legacy uint32 (version 2)
constexpr int32_t kShardMagicU32 = 20240801;  // uint32 (version 7)
constexpr int kShardVersionU16 = 1;
constexpr int kShardVersionU32 = 7;
constexpr int64_t kShardHeaderInts = 256;
constexpr int32_t kShardFingerprintTag = 0x4d544650;  // "MTFP" read as a number: header[4..5] hold a fingerprint

// How a *.bin file is laid out: llm.c's header, or nanoGPT's raw uint16.
enum class ShardFormat { kLlmc, kNanoGpt };

// version: 1 (uint16), 7 (uint32), or 0 to pick the smallest that holds every
// token. Written under a temporary name and renamed, so readers never see a
// half-written shard. tokenizer_fingerprint: "" or 16 hex digits, stored in the header.
void write_shard(const std::string& path, const std::vector<int32_t>& tokens, int version = 0,
                 const std::string& tokenizer_fingerprint = "");

// One shard file opened for reading: the header is parsed and checked against
// the file size on construction; read() fetches any token range, so a big
// shard never has to sit in memory whole. Every read() first checks that the
// file is still the one opened (device, inode, size, modification time): a
// shard replaced under a running train -- prepare-data run again over its
// data_dir -- stops it with an error naming the file instead of feeding it
// other tokens. A file rewritten in place with its size and time kept passes
// that check, so the bytes are checked too: the first read() checksums the
// whole file in blocks of kShardCheckBlock bytes (CRC-32C), and every read()
// reads whole blocks and compares them with those sums. Copies of a reader
// (the prefetcher's loader) share the sums.
constexpr int64_t kShardCheckBlock = int64_t{1} << 20;

class ShardReader {
 public:
  // vocab_size > 0: read() refuses token ids >= vocab_size.
  explicit ShardReader(std::string path, int64_t vocab_size = 0, ShardFormat format = ShardFormat::kLlmc);

  const std::string& path() const { return path_; }
  int64_t size() const { return num_tokens_; }
  // The header's tokenizer fingerprint; "" when it has none (llm.c's own
  // files, older meshtrain shards, .npy, nanoGPT).
  const std::string& tokenizer_fingerprint() const { return fingerprint_; }
  std::vector<int32_t> read(int64_t begin, int64_t count) const;
  std::vector<int32_t> read_all() const { return read(0, num_tokens_); }

 private:
  std::string path_;
  int64_t vocab_size_ = 0;
  int64_t num_tokens_ = 0;
  int64_t data_offset_ = 0;  // bytes before the first token
  int item_size_ = 2;        // bytes per token: 1, 2, 4 or 8 (little-endian)
  bool item_signed_ = false;
  std::string fingerprint_;
  // What the file was when opened (stat): read() refuses a file that changed.
  struct Stamp {
    uint64_t device = 0, inode = 0;
    int64_t size = 0, mtime_ns = 0;
    bool operator==(const Stamp& o) const {
      return device == o.device && inode == o.inode && size == o.size && mtime_ns == o.mtime_ns;
    }
  };
  Stamp stamp_;
  // out.size() bytes of fd from offset (tokens [begin, begin + count) name
  // the read in errors).
  void pread_all(int fd, int64_t offset, std::vector<char>& out, int64_t begin, int64_t count) const;
  // Checks bytes (whole blocks of fd from offset) against the sums, taking
  // them from the whole file on the first call.
  void check_blocks(int fd, int64_t offset, const std::vector<char>& bytes) const;
  // The file's block checksums as the first read() found them (empty until
  // then); shared by copies, filled and compared under the mutex.
  struct BlockSums {
    std::mutex mu;
    std::vector<uint32_t> crcs;
  };
  std::shared_ptr<BlockSums> sums_ = std::make_shared<BlockSums>();
};

std::vector<int32_t> read_shard(const std::string& path, int64_t vocab_size = 0,
                                ShardFormat format = ShardFormat::kLlmc);

// The *.bin and *.npy files in folder, sorted by name; a missing folder or one
// without shards is an error naming it.
std::vector<std::string> list_shards(const std::string& folder);

}  // namespace meshtrain
