#pragma once
// The safetensors format (huggingface/safetensors), so checkpoints and exports
// open in Python: 8-byte little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": {str: str}}
// padded with spaces to a multiple of 8, then the raw little-endian tensor bytes,
// packed in header order with no gaps.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain {

// "F32", "BF16", "I64", ... <-> at::ScalarType; unknown names/types throw.
std::string safetensors_dtype_name(at::ScalarType t);
at::ScalarType safetensors_dtype(const std::string& name);

struct SafetensorsDigest {
  int64_t bytes = 0;
  uint32_t crc32c = 0;  // of the whole file, computed while writing
};

// Tensors may live on any device and be non-contiguous: each is copied to a
// contiguous CPU buffer as it is written. The file is fsync'ed before return.
SafetensorsDigest write_safetensors(const std::string& path,
                                    const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                    const std::map<std::string, std::string>& metadata = {});

// An opened file: the header is parsed and checked against the file size up
// front; tensor bytes are read from disk only by get().
class SafetensorsFile {
 public:
  struct Entry {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    int64_t begin = 0;  // absolute file offsets
    int64_t end = 0;
  };

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // in file order
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  at::ScalarType dtype(const std::string& name) const { return entry(name).dtype; }
  const std::vector<int64_t>& shape(const std::string& name) const { return entry(name).shape; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  at::Tensor get(const std::string& name) const;  // a CPU tensor owning its memory

 private:
  friend SafetensorsFile read_safetensors(const std::string& path);
  const Entry& entry(const std::string& name) const;

  std::string path_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Truncated file, bad header, overlapping or out-of-range offsets -> error naming the file.
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace meshtrain
