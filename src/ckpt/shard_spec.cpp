#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/core/check.h"

namespace meshtrain {

std::vector<int64_t> shard_shape(const ShardSpec& spec, const std::string& name) {
  const auto ndim = static_cast<int64_t>(spec.global_shape.size());
  if (spec.split_dim == -1) {
    MT_CHECK(spec.num_shards == 1 && spec.shard == 0, "tensor \"", name,
             "\" is not split (split_dim -1) but has num_shards ", spec.num_shards, ", shard ", spec.shard);
    return spec.global_shape;
  }
  MT_CHECK(spec.split_dim >= 0 && spec.split_dim < ndim, "tensor \"", name, "\": split_dim ", spec.split_dim,
           " is out of range for a ", ndim, "-d tensor");
  MT_CHECK(spec.num_shards >= 1 && spec.shard >= 0 && spec.shard < spec.num_shards, "tensor \"", name,
           "\": shard ", spec.shard, " of ", spec.num_shards, " is out of range");
  const int64_t size = spec.global_shape[spec.split_dim];
  MT_CHECK(size % spec.num_shards == 0, "tensor \"", name, "\": dim ", spec.split_dim, " of size ", size,
           " does not split into ", spec.num_shards, " equal shards");
  std::vector<int64_t> shape = spec.global_shape;
  shape[spec.split_dim] = size / spec.num_shards;
  return shape;
}

}  // namespace meshtrain
