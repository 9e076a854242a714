#pragma once
// The residency seam of the model: where a stage's parameters must be present.
// The model is single-device code and calls these around the pieces it runs;
// by default nothing happens (every parameter is always whole on the rank).
// FSDP (parallel/fsdp.h) supplies hooks that gather a layer's parameters from
// their dp shards just before it runs and free them after, and that watch the
// layer's output to gather again for its backward and reduce-scatter its
// gradients once that backward is done.
#include <ATen/core/Tensor.h>

#include <cstddef>

namespace meshtrain {

class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  // Before local block `block` (an index into this stage's blocks) runs.
  virtual void before_layer(size_t block) = 0;
  // After it ran, with its output; returns the tensor the model goes on with.
  virtual at::Tensor after_layer(size_t block, at::Tensor out) = 0;
  // Before the embedding, the final norm or the head (the stage's parameters
  // outside its layers) are used.
  virtual void before_root() = 0;
};

}  // namespace meshtrain
