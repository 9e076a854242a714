#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/core/check.h"

namespace meshtrain {

std::vector<int64_t> shard_shape(const ShardSpec& spec, const std::string& name) {
  const auto ndim = static_cast<int64_t>(spec.global_shape.size());
  std::vector<int64_t> shape = spec.global_shape;
  if (spec.outer_dim != -1) {
    MT_CHECK(spec.outer_dim >= 0 && spec.outer_dim < ndim && spec.outer_dim != spec.split_dim, "tensor \"", name,
             "\": outer split dim ", spec.outer_dim, " is out of range for a ", ndim,
             "-d tensor or equals its split_dim ", spec.split_dim);
    MT_CHECK(spec.outer_shards >= 1 && spec.outer_shard >= 0 && spec.outer_shard < spec.outer_shards, "tensor \"",
             name, "\": outer shard ", spec.outer_shard, " of ", spec.outer_shards, " is out of range");
    const int64_t size = spec.global_shape[spec.outer_dim];
    MT_CHECK(size % spec.outer_shards == 0, "tensor \"", name, "\": dim ", spec.outer_dim, " of size ", size,
             " does not split into ", spec.outer_shards, " equal shards");
    shape[spec.outer_dim] = size / spec.outer_shards;
  } else {
    MT_CHECK(spec.outer_shards == 1 && spec.outer_shard == 0, "tensor \"", name, "\" has no outer split but ",
             spec.outer_shards, " outer shards");
  }
  if (spec.split_dim == -1) {
    MT_CHECK(spec.num_shards == 1 && spec.shard == 0, "tensor \"", name,
             "\" is not split (split_dim -1) but has num_shards ", spec.num_shards, ", shard ", spec.shard);
    return shape;
  }
  MT_CHECK(spec.split_dim >= 0 && spec.split_dim < ndim, "tensor \"", name, "\": split_dim ", spec.split_dim,
           " is out of range for a ", ndim, "-d tensor");
  MT_CHECK(spec.num_shards >= 1 && spec.shard >= 0 && spec.shard < spec.num_shards, "tensor \"", name,
           "\": shard ", spec.shard, " of ", spec.num_shards, " is out of range");
  const int64_t size = spec.global_shape[spec.split_dim];
  MT_CHECK(size % spec.num_shards == 0, "tensor \"", name, "\": dim ", spec.split_dim, " of size ", size,
           " does not split into ", spec.num_shards, " equal shards");
  shape[spec.split_dim] = size / spec.num_shards;
  return shape;
}

}  // namespace meshtrain
