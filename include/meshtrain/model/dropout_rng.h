#pragma once
// Where the model's dropout masks come from, under tensor parallelism.
//
// Every rank seeds the default generators alike (trainer: torch::manual_seed),
// which is right for dropout on activations that every tp rank holds whole
// (the residual stream without sequence parallelism): replicas must draw the
// same mask or they drift apart. It is wrong inside tp-sharded regions: the
// tp ranks would draw the same mask on different heads, or on different
// sequence shards. Megatron keeps a second, per-tp-rank generator for those
// regions (megatron/core/tensor_parallel/random.py, its model-parallel RNG
// tracker). Here the model says only which kind of activation it drops; the
// LayerFactory it was built with (layers.h) supplies the DropoutRng that
// decides, so the model stays single-device code.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>

namespace meshtrain {

class DropoutRng {
 public:
  virtual ~DropoutRng() = default;
  // Runs `draw`, which draws dropout masks on `device` from its default
  // generator, for an activation each tp rank holds a different shard of
  // (attention probabilities of this rank's heads).
  virtual at::Tensor sharded(const c10::Device& /*device*/, const std::function<at::Tensor()>& draw) {
    return draw();
  }
  // Likewise for the residual stream (embedding output, each sublayer's
  // output before its residual add): replicated over tp, or a sequence shard
  // under sequence parallelism.
  virtual at::Tensor stream(const c10::Device& /*device*/, const std::function<at::Tensor()>& draw) {
    return draw();
  }
};

// Runs `draw` with the default generator of `device` reseeded for this call
// only, then gives the generator its state back. The seed is one 64-bit draw
// from the default CPU generator, mixed with `salt` (the tp rank): so
//  - ranks with another salt draw other masks, ranks with the same salt the same;
//  - every rank's default streams advance alike (one draw), whatever the salt;
//  - it is reproducible, and replayed exactly wherever the default CPU
//    generator's state is restored: activation recomputation (recompute.h)
//    and a resumed checkpoint (the "rng" component) need nothing more.
// Meta tensors draw nothing: `draw` runs as it is.
at::Tensor with_forked_generator(const c10::Device& device, uint64_t salt, const std::function<at::Tensor()>& draw);

// The DropoutRng of tp rank `tp_rank`: sharded regions fork per rank;
// the stream forks per rank only under sequence parallelism.
class TensorParallelDropoutRng : public DropoutRng {
 public:
  TensorParallelDropoutRng(int64_t tp_rank, bool sequence_parallel) : rank_(tp_rank), sp_(sequence_parallel) {}
  at::Tensor sharded(const c10::Device& device, const std::function<at::Tensor()>& draw) override {
    return with_forked_generator(device, static_cast<uint64_t>(rank_), draw);
  }
  at::Tensor stream(const c10::Device& device, const std::function<at::Tensor()>& draw) override {
    return sp_ ? with_forked_generator(device, static_cast<uint64_t>(rank_), draw) : draw();
  }

 private:
  int64_t rank_;
  bool sp_;
};

}  // namespace meshtrain
