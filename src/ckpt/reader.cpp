#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <filesystem>

#include "file_io.h"
#include "manifest_format.h"
#include "meshtrain/core/text.h"
#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/checkpoint_steps.h"
#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/check.h"
#include "meshtrain/core/json_read.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

nlohmann::json parse_json_file(const fs::path& p) {
  MT_CHECK(fs::exists(p), "missing ", p.string());
  return parse_json_text(ckpt_io::read_file(p.string()), "checkpoint file", p.string());
}

// Along dim d, the half-open range of the global tensor a spec covers.
std::pair<int64_t, int64_t> covered(const ShardSpec& s, int64_t d) {
  const int64_t size = s.global_shape[d];
  if (s.split_dim == d) return {s.shard * (size / s.num_shards), (s.shard + 1) * (size / s.num_shards)};
  if (s.outer_dim == d) {
    const int64_t chunk = size / s.outer_shards;
    return {s.outer_shard * chunk, (s.outer_shard + 1) * chunk};
  }
  return {0, size};
}

// A tensor's saved layout from its manifest entry (outer split optional:
// checkpoints without expert parallelism have none).
ShardSpec saved_spec(const nlohmann::json& t) {
  ShardSpec spec{t.at("global_shape").get<std::vector<int64_t>>(), t.at("split_dim").get<int64_t>(), 0,
                 t.at("num_shards").get<int64_t>()};
  spec.outer_dim = t.value("outer_dim", int64_t{-1});
  spec.outer_shards = t.value("outer_shards", int64_t{1});
  return spec;
}

// Shard number i of the manifest -> (outer_shard, shard).
void set_index(ShardSpec& spec, int64_t i) {
  spec.shard = i % spec.num_shards;
  spec.outer_shard = i / spec.num_shards;
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& ckpt_dir) : dir_(ckpt_dir) {
  const fs::path dir(ckpt_dir);
  MT_CHECK(fs::is_directory(dir), "checkpoint ", ckpt_dir, " does not exist or is not a directory");
  manifest_ = parse_json_file(dir / ckpt_format::kManifest);
  const std::string where = "checkpoint " + ckpt_dir + ": ";
  try {
    MT_CHECK(manifest_.at("format").get<std::string>() == ckpt_format::kFormat, "not a meshtrain checkpoint");
    const int version = manifest_.at("version").get<int>();
    MT_CHECK(version <= ckpt_format::kVersion, "format version ", version,
             " is newer than this meshtrain reads (", ckpt_format::kVersion, ")");
    step_ = manifest_.at("step").get<int64_t>();
    world_size_ = manifest_.at("world_size").get<int64_t>();
    MT_CHECK(manifest_.at("tensors").is_object() && manifest_.at("files").is_object(), "bad tensors/files");
  } catch (const nlohmann::json::exception& e) {
    MT_FAIL(where, "bad manifest.json: ", e.what());
  }
  const auto named_step = parse_checkpoint_dir_name(dir.filename().string());
  MT_CHECK(!named_step || *named_step == step_, where, "manifest says step ", step_, " but the directory name says ",
           *named_step);
  trainer_state_ = parse_json_file(dir / ckpt_format::kTrainerState);

  for (const auto& [file, info] : manifest_.at("files").items())
    if (file != ckpt_format::kTrainerState) files_.emplace(file, read_safetensors((dir / file).string()));

  // Cross-check the manifest with the file headers now, so read() can trust both.
  for (const auto& [name, t] : manifest_.at("tensors").items()) {
    try {
      ShardSpec spec = saved_spec(t);
      MT_CHECK(spec.num_shards >= 1 && spec.outer_shards >= 1, "bad shard counts");
      const auto dtype = safetensors_dtype(t.at("dtype").get<std::string>());
      const auto& shards = t.at("shards");
      MT_CHECK(static_cast<int64_t>(shards.size()) == spec.total_shards(), "lists ", shards.size(), " shards of ",
               spec.total_shards());
      for (const auto& s : shards) {
        const int64_t index = s.at("index").get<int64_t>();
        MT_CHECK(index >= 0 && index < spec.total_shards(), "shard index ", index, " is out of range");
        set_index(spec, index);
        const auto file = s.at("file").get<std::string>();
        const auto key = s.at("key").get<std::string>();
        auto it = files_.find(file);
        MT_CHECK(it != files_.end(), "shard ", spec.shard, " is in ", file, ", which the manifest doesn't list");
        MT_CHECK(it->second.has(key), "shard ", spec.shard, ": no key ", key, " in ", file);
        MT_CHECK(it->second.shape(key) == shard_shape(spec, name) && it->second.dtype(key) == dtype, "shard ",
                 spec.shard, " in ", file, " has shape ", shape_str(it->second.shape(key)), " and dtype ",
                 safetensors_dtype_name(it->second.dtype(key)), ", the manifest expects ",
                 shape_str(shard_shape(spec, name)), " and ", safetensors_dtype_name(dtype));
      }
    } catch (const std::exception& e) {
      MT_FAIL(where, "tensor \"", name, "\": ", e.what());
    }
  }
}

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : manifest_.at("tensors").items()) out.push_back(name);
  return out;
}

bool CheckpointReader::has(const std::string& name) const { return manifest_.at("tensors").contains(name); }

const nlohmann::json& CheckpointReader::tensor_entry(const std::string& name) const {
  const auto& tensors = manifest_.at("tensors");
  auto it = tensors.find(name);
  MT_CHECK(it != tensors.end(), "tensor \"", name, "\" is not in checkpoint ", dir_);
  return *it;
}

std::vector<int64_t> CheckpointReader::global_shape(const std::string& name) const {
  return tensor_entry(name).at("global_shape").get<std::vector<int64_t>>();
}

at::ScalarType CheckpointReader::dtype(const std::string& name) const {
  return safetensors_dtype(tensor_entry(name).at("dtype").get<std::string>());
}

at::Tensor CheckpointReader::read(const std::string& name) const { return read(name, ShardSpec{global_shape(name)}); }

at::Tensor CheckpointReader::read(const std::string& name, const ShardSpec& want) const {
  const auto& t = tensor_entry(name);
  const auto global = t.at("global_shape").get<std::vector<int64_t>>();
  MT_CHECK(want.global_shape == global, "tensor \"", name, "\": expected global shape ", shape_str(want.global_shape),
           " but checkpoint ", dir_, " has ", shape_str(global));
  at::Tensor out = at::empty(shard_shape(want, name), at::TensorOptions().dtype(dtype(name)));
  if (out.numel() == 0) return out;

  ShardSpec saved = saved_spec(t);
  int64_t copied = 0;
  for (const auto& s : t.at("shards")) {
    set_index(saved, s.at("index").get<int64_t>());
    // The saved shard and the wanted chunk are boxes that differ only in
    // their split dims; copy their intersection.
    std::vector<int64_t> dims;
    for (int64_t d : {saved.split_dim, saved.outer_dim, want.split_dim, want.outer_dim})
      if (d >= 0 && std::find(dims.begin(), dims.end(), d) == dims.end()) dims.push_back(d);
    bool overlap = true;
    std::vector<std::array<int64_t, 3>> cuts;  // dim, start, length in global coordinates
    for (int64_t d : dims) {
      const auto [s0, s1] = covered(saved, d);
      const auto [w0, w1] = covered(want, d);
      const int64_t lo = std::max(s0, w0), hi = std::min(s1, w1);
      if (lo >= hi) overlap = false;
      cuts.push_back({d, lo, hi - lo});
    }
    if (!overlap) continue;
    at::Tensor src = files_.at(s.at("file").get<std::string>()).get(s.at("key").get<std::string>());
    at::Tensor dst = out;
    for (const auto& [d, lo, len] : cuts) {
      src = src.narrow(d, lo - covered(saved, d).first, len);
      dst = dst.narrow(d, lo - covered(want, d).first, len);
    }
    dst.copy_(src);
    copied += src.numel();
  }
  MT_ASSERT(copied == out.numel(), "tensor ", name, ": shards of ", dir_, " covered ", copied, " of ", out.numel(),
            " elements");
  check_finite(name, out);
  return out;
}

void CheckpointReader::check_finite(const std::string& name, const at::Tensor& t) const {
  // NaN or inf weights (a diverged run, a damaged file whose checksum was
  // redone) would train as a run of skipped steps and be saved again: named
  // here, where the tensor and the folder are known.
  if (!at::isFloatingType(t.scalar_type()) || t.numel() == 0 || at::isfinite(t).all().item<bool>()) return;
  const int64_t bad = t.numel() - at::isfinite(t).sum().item<int64_t>();
  const bool weights = name.rfind("model.", 0) == 0;
  MT_FAIL(weights ? "the weights of checkpoint " : "the saved state of checkpoint ", dir_, weights ? " hold" : " holds",
          " NaN or inf: tensor '", name, "' has ", bad, " non-finite value(s) of ", t.numel(),
          " (a diverged run, or a damaged file): use an earlier checkpoint");
}

void CheckpointReader::verify() const {
  for (const auto& [file, info] : manifest_.at("files").items()) {
    const fs::path p = fs::path(dir_) / file;
    std::error_code ec;
    const auto size = static_cast<int64_t>(fs::file_size(p, ec));
    MT_CHECK(!ec, "checkpoint ", dir_, ": cannot read ", p.string(), ": ", ec.message());
    const auto bytes = info.at("bytes").get<int64_t>();
    MT_CHECK(size == bytes, "checkpoint ", dir_, ": ", p.string(), " has ", size, " bytes, the manifest says ", bytes,
             " (truncated or overwritten)");
    const std::string sum = crc32c_string(crc32c_file(p.string()));
    const auto want = info.at("checksum").get<std::string>();
    MT_CHECK(sum == want, "checkpoint ", dir_, ": ", p.string(), " is corrupt: checksum ", sum, ", the manifest says ",
             want);
  }
}

}  // namespace meshtrain
